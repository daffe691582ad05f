//! Notifications when a job ends: the command hook gets the job's JSON on stdin and its id and
//! state in its environment (done, failed and cancelled), the webhook gets a JSON POST and is
//! retried after a 5xx, a hanging hook is killed at its time limit with what it started, and a
//! hook that hangs holds up no job.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use ferry_service::notify::{Notifications, Notifier};
use ferry_service::{NewJob, State, Store};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::util::*;

/// An executable shell script at `dir/name`.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// Waits for `path` to exist, at most `within`, and reads it.
async fn wait_file(path: &Path, within: Duration) -> String {
    let t0 = Instant::now();
    loop {
        if let Ok(t) = std::fs::read_to_string(path) {
            return t;
        }
        assert!(
            t0.elapsed() < within,
            "{} within {within:?}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_command_hook_gets_each_ended_jobs_json_and_state() {
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    make_file(&local.path().join("f"), 10_000);
    make_file(&local.path().join("big"), 4 << 20);
    let out = tempfile::tempdir().unwrap();
    // Written under a temporary name, then renamed: the test never reads half a file.
    let hook = script(
        out.path(),
        "hook.sh",
        r#"cat > "$1/$FERRY_JOB_ID.tmp" && echo "$FERRY_JOB_ID $FERRY_JOB_STATE" > "$1/$FERRY_JOB_ID.env" && mv "$1/$FERRY_JOB_ID.tmp" "$1/$FERRY_JOB_ID.json""#,
    );
    let argv = vec![hook.into_os_string(), out.path().as_os_str().to_owned()];
    let svc = TestService::start_with(&server, local.path(), |c| {
        c.notify.command = Some(argv);
        c.pace = Some(Duration::from_millis(100));
    })
    .await;
    let alice = svc.client("alice");
    let link = server.addr.to_string();
    // Shell syntax in a label reaches the hook as data, never as a command.
    let mut req = request(&["/f"], &format!("{link}:/"));
    req.label = "$(touch pwned); `touch pwned`".into();
    let done = alice.submit(&req).await.unwrap();
    // No such source: the job fails.
    let failed = alice
        .submit(&request(&["/no-such-file"], &format!("{link}:/")))
        .await
        .unwrap();
    let running = alice
        .submit(&request(&["/big"], &format!("{link}:/")))
        .await
        .unwrap();
    wait_api(&alice, running.id, Duration::from_secs(30), |j| {
        j.state == State::Running
    })
    .await;
    alice.cancel(running.id).await.unwrap();
    for (id, state) in [
        (done.id, "done"),
        (failed.id, "failed"),
        (running.id, "cancelled"),
    ] {
        let text = wait_file(
            &out.path().join(format!("{id}.json")),
            Duration::from_secs(60),
        )
        .await;
        let j: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            (j["id"].as_i64(), j["state"].as_str()),
            (Some(id), Some(state)),
            "{j}"
        );
        let env = std::fs::read_to_string(out.path().join(format!("{id}.env"))).unwrap();
        assert_eq!(env.trim(), format!("{id} {state}"));
    }
    let j: Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join(format!("{}.json", done.id))).unwrap(),
    )
    .unwrap();
    assert_eq!(j["label"], "$(touch pwned); `touch pwned`");
    assert!(!out.path().join("pwned").exists() && !Path::new("pwned").exists());
    svc.stop().await;
    server.stop().await;
}

/// A webhook receiver on loopback: answers 503 to the first `fail_first` POSTs, then 200,
/// and hands each body and content type to the test.
async fn receiver(fail_first: usize) -> (SocketAddr, mpsc::UnboundedReceiver<(String, Value)>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let seen = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
            let (tx, seen) = (tx.clone(), seen.clone());
            async move {
                let ct = headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let _ = tx.send((ct, v));
                if seen.fetch_add(1, Ordering::SeqCst) < fail_first {
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    StatusCode::OK
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_webhook_gets_the_jobs_json_and_is_retried_after_a_5xx() {
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    make_file(&local.path().join("f"), 10_000);
    let (addr, mut posts) = receiver(1).await;
    let svc = TestService::start_with(&server, local.path(), |c| {
        c.notify.webhook = Some(format!("http://{addr}/hook"));
        c.notify.webhook_backoff = Duration::from_millis(100);
    })
    .await;
    let alice = svc.client("alice");
    let j = alice
        .submit(&request(&["/f"], &format!("{}:/", server.addr)))
        .await
        .unwrap();
    for attempt in 0..2 {
        let (ct, body) = tokio::time::timeout(Duration::from_secs(30), posts.recv())
            .await
            .expect("the webhook is called")
            .unwrap();
        assert_eq!(ct, "application/json", "attempt {attempt}");
        assert_eq!(body["id"].as_i64(), Some(j.id), "{body}");
        assert_eq!(body["state"], "done", "{body}");
        assert_eq!(body["owner"], "alice");
    }
    // A 200 ends it: no third POST.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(posts.try_recv().is_err());
    svc.stop().await;
    server.stop().await;
}

fn a_job() -> ferry_service::Job {
    let store = Store::open(None).unwrap();
    store
        .submit(&NewJob {
            kind: ferry_service::Kind::Put,
            sources: vec!["/a".into()],
            dest: "h:1:/".into(),
            sync: ferry_service::SyncMode::Off,
            priority: 0,
            deadline: None,
            label: String::new(),
            owner: "alice".into(),
            server: "h:1".into(),
        })
        .unwrap()
}

/// Whether process `pid` is gone (or a zombie nobody has reaped yet).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hanging_hook_is_killed_at_its_time_limit_with_what_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let hook = script(
        dir.path(),
        "hang.sh",
        r#"sleep 30 & echo $! > "$1/pid.tmp" && mv "$1/pid.tmp" "$1/pid"; wait"#,
    );
    let n = Notifier::new(Notifications {
        command: Some(vec![
            hook.into_os_string(),
            dir.path().as_os_str().to_owned(),
        ]),
        command_limit: Duration::from_millis(700),
        ..Notifications::default()
    })
    .unwrap();
    let t0 = Instant::now();
    let e = n
        .run_command(&a_job(), b"{}")
        .await
        .unwrap_err()
        .to_string();
    let took = t0.elapsed();
    assert!(e.contains("killed"), "{e}");
    assert!(
        took >= Duration::from_millis(700) && took < Duration::from_secs(10),
        "{took:?}"
    );
    let pid: i32 = wait_file(&dir.path().join("pid"), Duration::from_secs(5))
        .await
        .trim()
        .parse()
        .unwrap();
    let t0 = Instant::now();
    while !gone(pid) {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the hook's child {pid} was killed too"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hook_that_hangs_holds_up_no_job() {
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    make_file(&local.path().join("f"), 1000);
    let dir = tempfile::tempdir().unwrap();
    let hook = script(dir.path(), "hang.sh", "exec sleep 30");
    let svc = TestService::start_with(&server, local.path(), |c| {
        c.notify.command = Some(vec![hook.into_os_string()]);
        c.notify.command_limit = Duration::from_secs(60);
        c.limits.per_server = 1;
        c.limits.total = 1;
    })
    .await;
    let alice = svc.client("alice");
    let t0 = Instant::now();
    // More jobs than hooks may run at once: the queue goes on while every slot hangs.
    for _ in 0..10 {
        let j = alice
            .submit(&request(&["/f"], &format!("{}:/", server.addr)))
            .await
            .unwrap();
        let j = wait_api(&alice, j.id, Duration::from_secs(20), |j| {
            j.state.is_final()
        })
        .await;
        assert_eq!(j.state, State::Done, "{j:?}");
    }
    assert!(t0.elapsed() < Duration::from_secs(30));
    svc.stop().await;
    server.stop().await;
}

/// An https receiver on loopback with a fresh self-signed certificate for `localhost` (its
/// PEM written to `ca`), answering 200 and handing each body to the test.
async fn tls_receiver(ca: &Path) -> (u16, mpsc::UnboundedReceiver<Value>) {
    use hyper_util::rt::TokioIo;
    use hyper_util::service::TowerToHyperService;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    std::fs::write(ca, ck.cert.pem()).unwrap();
    let cert = CertificateDer::from(ck.cert.der().to_vec());
    let key = PrivateKeyDer::try_from(ck.signing_key.serialize_der()).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let (tx, rx) = mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: axum::body::Bytes| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(serde_json::from_slice(&body).unwrap_or(Value::Null));
                StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app))
                    .await;
            });
        }
    });
    (port, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_https_webhook_is_posted_to_only_with_a_certificate_its_ca_file_trusts() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    let (port, mut posts) = tls_receiver(&ca).await;
    let url = format!("https://localhost:{port}/hook");
    let n = Notifier::new(Notifications {
        webhook: Some(url.clone()),
        webhook_ca: Some(ca),
        ..Notifications::default()
    })
    .unwrap();
    assert_eq!(n.post_with_retries(br#"{"id":7}"#).await.unwrap(), 200);
    let body = tokio::time::timeout(Duration::from_secs(10), posts.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(body["id"], 7);
    // Another CA: the handshake fails, nothing is posted.
    let other = dir.path().join("other.pem");
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    std::fs::write(&other, ck.cert.pem()).unwrap();
    let n = Notifier::new(Notifications {
        webhook: Some(url),
        webhook_ca: Some(other),
        webhook_attempts: 2,
        webhook_backoff: Duration::from_millis(50),
        ..Notifications::default()
    })
    .unwrap();
    let e = n.post_with_retries(b"{}").await.unwrap_err().to_string();
    assert!(e.contains("2 attempt") && e.contains("TLS"), "{e}");
    assert!(posts.try_recv().is_err());
}
