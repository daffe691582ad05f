//! The HTTP API over TLS: a put submitted through it ends done and identical; tokens see and
//! cancel only their own jobs (an admin all); bad bodies, missing tokens and a wrong pin get
//! clear refusals; `/metrics` speaks Prometheus' text format; a client may keep its
//! connection for many requests.

use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::Duration;

use ferry_service::{Kind, ServiceError, State};
use hyper::Method;

use crate::util::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_put_submitted_over_the_api_ends_done_with_the_files_identical() {
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    let top = make_tree(local.path(), "run42");
    let svc = TestService::start(&server, local.path()).await;
    let alice = svc.client("alice");
    let mut req = request(&["/run42"], &format!("{}:/", server.addr));
    req.label = "nightly".into();
    req.priority = 3;
    let j = alice.submit(&req).await.unwrap();
    assert_eq!(
        (j.kind, j.state, j.owner.as_str()),
        (Kind::Put, State::Queued, "alice")
    );
    assert_eq!((j.label.as_str(), j.priority), ("nightly", 3));
    let j = wait_api(&alice, j.id, Duration::from_secs(60), |j| {
        j.state.is_final()
    })
    .await;
    assert_eq!(j.state, State::Done, "{j:?}");
    assert_eq!((j.files_done, j.bytes_done), (5, j.bytes_total));
    assert_eq!(tree_bytes(&server.root.join("run42")), tree_bytes(&top));
    let listed = alice.jobs(10).await.unwrap();
    assert_eq!(listed.iter().map(|j| j.id).collect::<Vec<_>>(), vec![j.id]);
    svc.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_token_sees_and_cancels_only_its_own_jobs_and_an_admin_all() {
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    make_file(&local.path().join("f"), 1000);
    make_file(&local.path().join("big"), 2 << 20);
    // Each block waits: a job runs for a few seconds, long enough to cancel it running.
    let svc = TestService::start_with(&server, local.path(), |c| {
        c.pace = Some(Duration::from_millis(100))
    })
    .await;
    let (alice, bob, ops) = (svc.client("alice"), svc.client("bob"), svc.client("ops"));
    // A deadline already past: the job stays put (fails unstarted) while the test looks at it.
    let mut req = request(&["/f"], &format!("{}:/", server.addr));
    req.deadline = Some(1);
    let j = alice.submit(&req).await.unwrap();
    let not_found = |r: Result<ferry_service::Job, ServiceError>| match r {
        Err(ServiceError::Api { status, message }) => {
            assert_eq!(status, 404);
            assert!(message.contains("no job"), "{message}");
        }
        other => panic!("expected 404, got {other:?}"),
    };
    not_found(bob.job(j.id).await);
    not_found(bob.cancel(j.id).await);
    assert!(bob.jobs(100).await.unwrap().is_empty());
    assert_eq!(ops.job(j.id).await.unwrap().owner, "alice");
    assert_eq!(ops.jobs(100).await.unwrap().len(), 1);
    // Alice cancels a running job of hers; it stays cancelled, its file never completes.
    let k = alice
        .submit(&request(&["/big"], &format!("{}:/", server.addr)))
        .await
        .unwrap();
    wait_api(&alice, k.id, Duration::from_secs(30), |j| {
        j.state == State::Running && j.bytes_done > 0
    })
    .await;
    assert_eq!(alice.cancel(k.id).await.unwrap().state, State::Cancelled);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(alice.job(k.id).await.unwrap().state, State::Cancelled);
    assert_eq!(svc.scheduler.running(), 0);
    assert!(!server.root.join("big").exists());
    match alice.cancel(k.id).await {
        Err(ServiceError::Api { status: 409, .. }) => {}
        other => panic!("a second cancel is a conflict: {other:?}"),
    }
    svc.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_requests_get_a_clear_4xx() {
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    let svc = TestService::start(&server, local.path()).await;
    let alice = svc.client("alice");
    let post = |body: Vec<u8>, auth: bool| {
        let alice = alice.clone();
        async move {
            let a = alice
                .request(Method::POST, "/api/jobs", body, auth)
                .await
                .unwrap();
            (a.status, String::from_utf8_lossy(&a.body).into_owned())
        }
    };
    let (s, b) = post(b"{not json".to_vec(), true).await;
    assert_eq!(s, 400, "{b}");
    assert!(b.contains("bad job"), "{b}");
    let (s, b) = post(
        br#"{"sources":["/a"],"dest":"h:/","colour":1}"#.to_vec(),
        true,
    )
    .await;
    assert_eq!(s, 400, "{b}");
    assert!(b.contains("unknown field"), "{b}");
    let (s, b) = post(vec![b' '; ferry_service::api::MAX_BODY + 1], true).await;
    assert_eq!(s, 413, "{b}");
    assert!(b.contains("at most"), "{b}");
    let (s, b) = post(
        br#"{"sources":["/a/../../etc"],"dest":"h:/"}"#.to_vec(),
        true,
    )
    .await;
    assert_eq!(s, 400, "{b}");
    assert!(b.contains(".."), "{b}");
    let (s, b) = post(br#"{"sources":["/a"],"dest":"/b"}"#.to_vec(), true).await;
    assert_eq!(s, 400, "{b}");
    assert!(b.contains("both local"), "{b}");
    // A server outside the endpoints file could never be reached: refused, not queued.
    let (s, b) = post(
        br#"{"sources":["/a"],"dest":"elsewhere:7070:/"}"#.to_vec(),
        true,
    )
    .await;
    assert_eq!(s, 400, "{b}");
    assert!(b.contains("no endpoint elsewhere:7070"), "{b}");
    let (s, b) = post(
        br#"{"sources":["elsewhere:7070:/a"],"dest":"/b"}"#.to_vec(),
        true,
    )
    .await;
    assert_eq!(s, 400, "{b}");
    assert!(b.contains("no endpoint"), "{b}");
    let (s, b) = post(
        br#"{"sources":["/a"],"dest":"h:/","sync":"newest"}"#.to_vec(),
        true,
    )
    .await;
    assert_eq!(s, 400, "{b}");
    let (s, b) = post(br#"{"sources":["/a"],"dest":"h:/"}"#.to_vec(), false).await;
    assert_eq!(s, 401, "{b}");
    let mut wrong = alice.clone();
    wrong.token = "not-a-token".into();
    assert!(matches!(
        wrong.jobs(1).await,
        Err(ServiceError::Api { status: 401, .. })
    ));
    let a = alice
        .request(Method::GET, "/api/jobs/x1", vec![], true)
        .await
        .unwrap();
    assert_eq!(a.status, 400);
    let a = alice
        .request(Method::GET, "/nowhere", vec![], true)
        .await
        .unwrap();
    assert_eq!(a.status, 404);
    svc.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_pinned_to_another_key_is_refused_and_first_use_is_remembered() {
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    let svc = TestService::start(&server, local.path()).await;
    let mut c = svc.client("alice");
    c.trust = ferry_service::tls::Trust::Pinned(ferry_net::Fingerprint([7; 32]));
    let e = c.jobs(1).await.unwrap_err().to_string();
    assert!(e.contains("not the pinned"), "{e}");
    let kh = ferry_net::KnownHosts::new(local.path().join("known_hosts"));
    c.trust = ferry_service::tls::Trust::KnownHosts {
        file: kh.clone(),
        host: svc.addr.to_string(),
    };
    c.jobs(1).await.unwrap();
    match kh.lookup(&svc.addr.to_string()).unwrap() {
        ferry_net::tls::Known::Pinned { fingerprint, .. } => {
            assert_eq!(fingerprint, svc.fingerprint)
        }
        other => panic!("first use is remembered: {other:?}"),
    }
    svc.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_follow_prometheus_conventions() {
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    make_file(&local.path().join("f"), 100_000);
    let svc = TestService::start(&server, local.path()).await;
    let alice = svc.client("alice");
    let j = alice
        .submit(&request(&["/f"], &format!("{}:/", server.addr)))
        .await
        .unwrap();
    wait_api(&alice, j.id, Duration::from_secs(60), |j| {
        j.state == State::Done
    })
    .await;
    let a = alice
        .request(Method::GET, "/metrics", vec![], false)
        .await
        .unwrap();
    assert_eq!(a.status, 200);
    let text = String::from_utf8(a.body).unwrap();
    for line in [
        "# TYPE ferry_service_jobs gauge",
        "ferry_service_jobs{state=\"done\"} 1",
        "ferry_service_jobs{state=\"queued\"} 0",
        "ferry_service_queue_depth 0",
        "ferry_service_running_jobs 0",
        "# TYPE ferry_service_transferred_bytes_total counter",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} in\n{text}");
    }
    let bytes: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("ferry_service_transferred_bytes_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(bytes >= 100_000, "{text}");
    // Where the requests' time went: the one submit timed in its handler and in its store
    // call, the reads beside it; the store's lock taken by them and the scheduler.
    for line in [
        "# TYPE ferry_service_api_handler_seconds histogram",
        "ferry_service_api_handler_seconds_count{endpoint=\"POST /api/jobs\"} 1",
        "ferry_service_api_store_seconds_count{endpoint=\"POST /api/jobs\"} 1",
        "# TYPE ferry_service_store_lock_wait_seconds histogram",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} in\n{text}");
    }
    let count = |prefix: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{prefix:?} in\n{text}"))
    };
    assert!(
        count("ferry_service_api_handler_seconds_count{endpoint=\"GET /api/jobs/{id}\"} ") >= 1
    );
    let all =
        count("ferry_service_api_handler_seconds_bucket{endpoint=\"POST /api/jobs\",le=\"+Inf\"} ");
    assert_eq!(all, 1, "{text}");
    // The submit, the reads and the scheduler's writes each took the lock.
    assert!(
        count("ferry_service_store_lock_hold_seconds_count ") > 3,
        "{text}"
    );
    // Each of the client's requests came on a new connection: its handshakes are counted.
    assert!(
        text.lines()
            .any(|l| l == "# TYPE ferry_service_api_tls_handshake_seconds histogram"),
        "{text}"
    );
    assert!(
        count("ferry_service_api_tls_handshake_seconds_count ") >= 2,
        "{text}"
    );
    svc.stop().await;
    server.stop().await;
}

/// A client that keeps its connection makes its requests over one TCP and TLS connection
/// (counted by a relay in front of the service), where one that does not makes one each; when
/// the kept connection is cut, the next request goes over a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kept_connection_carries_many_requests_and_is_made_again_when_cut() {
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    make_file(&local.path().join("f"), 1000);
    let svc = TestService::start(&server, local.path()).await;
    let relay = Relay::start(svc.addr).await;
    let mut kept = svc.client("alice");
    kept.addr = relay.addr.to_string();
    kept.kept = Some(Default::default());
    let j = kept
        .submit(&request(&["/f"], &format!("{}:/", server.addr)))
        .await
        .unwrap();
    for _ in 0..4 {
        assert_eq!(kept.job(j.id).await.unwrap().id, j.id);
        assert_eq!(kept.jobs(10).await.unwrap().len(), 1);
    }
    assert_eq!(relay.accepted(), 1, "nine requests over one connection");

    let fresh = ferry_service::client::Client {
        kept: None,
        ..kept.clone()
    };
    for _ in 0..3 {
        assert_eq!(fresh.job(j.id).await.unwrap().id, j.id);
    }
    assert_eq!(relay.accepted(), 4, "a connection for each request");

    relay.cut().await;
    assert_eq!(kept.job(j.id).await.unwrap().id, j.id);
    assert_eq!(relay.accepted(), 5, "the cut connection was made again");
    svc.stop().await;
    server.stop().await;
}

/// A TCP relay on loopback to `to` that counts the connections it took, and can cut them all.
struct Relay {
    addr: std::net::SocketAddr,
    accepted: Arc<AtomicUsize>,
    /// Connections relayed now.
    open: Arc<AtomicUsize>,
    cut: tokio::sync::watch::Sender<u64>,
}

impl Relay {
    async fn start(to: std::net::SocketAddr) -> Self {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let (cut, cuts) = tokio::sync::watch::channel(0u64);
        let (n, live) = (accepted.clone(), open.clone());
        tokio::spawn(async move {
            while let Ok((mut a, _)) = l.accept().await {
                n.fetch_add(1, SeqCst);
                live.fetch_add(1, SeqCst);
                let mut cuts = cuts.clone();
                cuts.mark_unchanged();
                let live = live.clone();
                tokio::spawn(async move {
                    if let Ok(mut b) = tokio::net::TcpStream::connect(to).await {
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut a, &mut b) => {}
                            _ = cuts.changed() => {}
                        }
                    }
                    live.fetch_sub(1, SeqCst);
                });
            }
        });
        Self {
            addr,
            accepted,
            open,
            cut,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(SeqCst)
    }

    /// Closes every connection relayed so far, and waits (at most 10 s) until they are.
    async fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
        let t0 = std::time::Instant::now();
        while self.open.load(SeqCst) > 0 {
            assert!(t0.elapsed() < Duration::from_secs(10), "the relay cuts");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
