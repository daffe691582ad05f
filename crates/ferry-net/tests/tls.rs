//! Encryption, server identity and token scopes, end to end over loopback.

use crate::util;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_net::access::{self, Access};
use ferry_net::{Identity, KnownHosts, Security, ServerTrust, SessionError};
use ferry_proto::ErrorCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use util::*;

fn code_of<T: std::fmt::Debug>(r: &Result<T, SessionError>) -> Option<ErrorCode> {
    match r {
        Err(SessionError::Remote { code, .. }) => Some(*code),
        _ => None,
    }
}

/// A file whose content is easy to spot in a byte capture: a 32-byte marker repeated.
const MARKER: &[u8; 32] = b"FERRY-PLAINTEXT-MARKER-012345678";

fn marked_file(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("marked.bin");
    write(&p, &MARKER.repeat(20_000));
    p
}

/// A TCP relay in front of the server that keeps every byte the client sends, so a test can
/// look at what an observer on the path sees.
async fn tap(server: std::net::SocketAddr) -> (std::net::SocketAddr, Arc<Mutex<Vec<u8>>>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    tokio::spawn(async move {
        // Bounded: a session has at most a control and a few data connections.
        for _ in 0..16 {
            let Ok((mut client, _)) = l.accept().await else {
                return;
            };
            let seen = seen2.clone();
            tokio::spawn(async move {
                let mut upstream = tokio::net::TcpStream::connect(server).await.unwrap();
                let (mut cr, mut cw) = client.split();
                let (mut ur, mut uw) = upstream.split();
                let up = async {
                    let mut buf = vec![0u8; 64 << 10];
                    loop {
                        let n = match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        seen.lock().unwrap().extend_from_slice(&buf[..n]);
                        if uw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    let _ = uw.shutdown().await;
                };
                let down = async {
                    let _ = tokio::io::copy(&mut ur, &mut cw).await;
                    let _ = cw.shutdown().await;
                };
                tokio::join!(up, down);
            });
        }
    });
    (addr, seen)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_on_the_wire_is_encrypted_and_plaintext_is_visible() {
    let server = TestServer::start().await;
    let src = tempfile::tempdir().unwrap();
    let file = marked_file(src.path());

    let (addr, seen) = tap(server.addr).await;
    let mut cfg = server.client();
    cfg.server = addr.to_string();
    let r = ferry_net::client::put(&cfg, std::slice::from_ref(&file), "/enc.bin", reporter())
        .await
        .unwrap();
    assert!(r.is_success() && r.encrypted);
    assert_eq!(
        r.server_fingerprint.as_deref(),
        Some(server.fingerprint.unwrap().to_string().as_str())
    );
    let captured = seen.lock().unwrap().clone();
    assert!(captured.len() > 600_000, "the tap saw the transfer");
    assert!(
        !contains(&captured, MARKER),
        "file content visible on the wire"
    );
    assert!(
        !contains(&captured, TOKEN.as_bytes()),
        "token visible on the wire"
    );
    assert_eq!(
        std::fs::read(server.root.join("enc.bin")).unwrap(),
        std::fs::read(&file).unwrap()
    );

    // The same through plain TCP (both ends allowing it): the observer reads everything. This
    // is what the capture above is compared with, so it proves the capture would have shown it.
    let (addr, seen) = tap(server.addr).await;
    let mut cfg = server.client();
    cfg.server = addr.to_string();
    cfg.security = Security::Plaintext;
    let r = ferry_net::client::put(&cfg, std::slice::from_ref(&file), "/plain.bin", reporter())
        .await
        .unwrap();
    assert!(r.is_success() && !r.encrypted && r.server_fingerprint.is_none());
    let captured = seen.lock().unwrap().clone();
    assert!(contains(&captured, MARKER) && contains(&captured, TOKEN.as_bytes()));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_only_when_both_ends_allow_it() {
    // A default server (TLS, plain TCP not allowed) refuses a --no-encrypt client clearly.
    let server = TestServer::start_with(|c| c.allow_plaintext = false).await;
    let mut cfg = server.client();
    cfg.security = Security::Plaintext;
    cfg.retry_for = Duration::from_secs(30);
    let r = ferry_net::client::list(&cfg, "/", &ferry_core::NoReporter).await;
    assert_eq!(code_of(&r), Some(ErrorCode::ENCRYPTION), "{r:?}");
    let e = r.unwrap_err();
    assert!(!e.is_retryable());
    assert!(e.to_string().contains("requires TLS"), "{e}");
    server.stop().await;

    // A plain-TCP-only server: a TLS client does not fall back, it fails and says why.
    let server = TestServer::start_with(|c| {
        c.tls = None;
        c.allow_plaintext = true;
    })
    .await;
    let mut cfg = server.client();
    cfg.security = Security::Tls(ServerTrust::Pinned(
        Identity::generate().unwrap().fingerprint(),
    ));
    cfg.retry_for = Duration::from_secs(30);
    let r = ferry_net::client::list(&cfg, "/", &ferry_core::NoReporter).await;
    // The server's plain refusal is read from the bytes that failed the handshake.
    match &r {
        Err(e @ SessionError::Remote { code, message }) => {
            assert_eq!(*code, ErrorCode::ENCRYPTION);
            assert!(!e.is_retryable());
            assert!(message.contains("--no-encrypt"), "{message}");
        }
        other => panic!("expected the server's refusal: {other:?}"),
    }
    let mut cfg = server.client();
    cfg.security = Security::Plaintext;
    assert!(ferry_net::client::list(&cfg, "/", &ferry_core::NoReporter)
        .await
        .is_ok());
    server.stop().await;

    // And a server cannot be built that has neither.
    let dir = tempfile::tempdir().unwrap();
    let mut c = ferry_net::ServerConfig::new(dir.path(), TOKEN);
    c.tls = None;
    assert!(ferry_net::Server::bind("127.0.0.1:0".parse().unwrap(), c)
        .await
        .is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_pin_is_refused_before_the_token_is_sent() {
    let server = TestServer::start().await;
    let src = tempfile::tempdir().unwrap();
    let file = src.path().join("f.bin");
    write(&file, &bytes(10_000, 1));
    let mut cfg = server.client();
    let other = Identity::generate().unwrap().fingerprint();
    cfg.security = Security::Tls(ServerTrust::Pinned(other));
    cfg.retry_for = Duration::from_secs(30);
    let r = ferry_net::client::put(&cfg, std::slice::from_ref(&file), "/", reporter()).await;
    match &r {
        Err(
            e @ SessionError::ServerKeyChanged {
                expected,
                presented,
                ..
            },
        ) => {
            assert!(!e.is_retryable());
            assert_eq!(*expected, other.to_string());
            assert_eq!(*presented, server.fingerprint.unwrap().to_string());
            assert!(e.to_string().contains("--server-fingerprint"), "{e}");
        }
        other => panic!("expected a changed key: {other:?}"),
    }
    assert_eq!(names(&server.root), Vec::<String>::new());
    server.stop().await;
}

/// Records the reporter's warnings (where the first-use notice goes).
#[derive(Default)]
struct Notes(Mutex<Vec<String>>);

impl ferry_core::Reporter for Notes {
    fn on_warning(&self, msg: &str) {
        self.0.lock().unwrap().push(msg.to_owned());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn known_hosts_pins_on_first_use_and_refuses_a_changed_key() {
    let dir = tempfile::tempdir().unwrap();
    let kh = KnownHosts::new(dir.path().join("ferry/known_hosts"));
    let server = TestServer::start().await;
    let host = server.addr.to_string();
    let mut cfg = server.client();
    cfg.security = Security::Tls(ServerTrust::KnownHosts {
        file: kh.clone(),
        host: host.clone(),
    });
    let notes = Notes::default();
    ferry_net::client::list(&cfg, "/", &notes).await.unwrap();
    let text = std::fs::read_to_string(kh.path()).unwrap();
    assert_eq!(
        text,
        format!("{host} {}\n", server.fingerprint.unwrap()),
        "pinned on first use"
    );
    assert!(notes.0.lock().unwrap()[0].contains("pinned"));
    // Second contact: pinned, no new notice, no new line.
    let notes = Notes::default();
    ferry_net::client::list(&cfg, "/", &notes).await.unwrap();
    assert!(notes.0.lock().unwrap().is_empty());
    assert_eq!(std::fs::read_to_string(kh.path()).unwrap(), text);
    server.stop().await;

    // The server is reinstalled with a new key: refused, with the file and line to fix. (A new
    // server gets another port; the pin is moved to it, as if the host had kept its address.)
    let server2 = TestServer::start().await;
    std::fs::write(kh.path(), text.replace(&host, &server2.addr.to_string())).unwrap();
    let mut cfg = server2.client();
    cfg.security = Security::Tls(ServerTrust::KnownHosts {
        file: kh.clone(),
        host: server2.addr.to_string(),
    });
    let r = ferry_net::client::list(&cfg, "/", &ferry_core::NoReporter).await;
    match &r {
        Err(e @ SessionError::ServerKeyChanged { fix, .. }) => {
            assert!(
                fix.contains("line 1") && fix.contains("known_hosts"),
                "{fix}"
            );
            assert!(e.to_string().contains("CHANGED"));
        }
        other => panic!("expected a changed key: {other:?}"),
    }
    server2.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_scopes_confine_what_each_token_touches() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    let reader = access::add_token(&tokens, "reader", vec!["/pub".into()], vec![], true).unwrap();
    let writer = access::add_token(
        &tokens,
        "writer",
        vec!["/pub".into()],
        vec!["/incoming".into()],
        false,
    )
    .unwrap();
    let server = TestServer::start_with(|c| c.access = Arc::new(Access::file(&tokens))).await;
    write(&server.root.join("pub/a.txt"), b"public");
    write(&server.root.join("private/s.txt"), b"secret");
    let src = tempfile::tempdir().unwrap();
    let file = src.path().join("up.bin");
    write(&file, &bytes(50_000, 2));

    let as_token = |t: &str| {
        let mut c = server.client();
        c.token = t.to_owned();
        c
    };
    let denied = |r: &Result<ferry_net::TransferReport, SessionError>, path: &str| match r {
        Err(SessionError::Remote { code, message }) => {
            assert_eq!(*code, ErrorCode::DENIED, "{message}");
            assert!(message.contains("permission denied") && message.contains(path));
        }
        other => panic!("expected denied for {path}: {other:?}"),
    };

    // Read-only token: reads inside its prefix, nothing else.
    let out = tempfile::tempdir().unwrap();
    let r = ferry_net::client::get(&as_token(&reader), "/pub/a.txt", out.path(), reporter())
        .await
        .unwrap();
    assert!(r.is_success());
    assert_eq!(std::fs::read(out.path().join("a.txt")).unwrap(), b"public");
    let r =
        ferry_net::client::get(&as_token(&reader), "/private/s.txt", out.path(), reporter()).await;
    denied(&r, "/private/s.txt");
    assert!(!out.path().join("s.txt").exists());
    let r = ferry_net::client::put(
        &as_token(&reader),
        std::slice::from_ref(&file),
        "/pub/",
        reporter(),
    )
    .await;
    denied(&r, "/pub/");
    let r = ferry_net::client::list(&as_token(&reader), "/private", &ferry_core::NoReporter).await;
    assert_eq!(code_of(&r), Some(ErrorCode::DENIED));
    // Prefixes are whole components: /pub does not cover /public.
    write(&server.root.join("public/x"), b"x");
    let r = ferry_net::client::list(&as_token(&reader), "/public", &ferry_core::NoReporter).await;
    assert_eq!(code_of(&r), Some(ErrorCode::DENIED));

    // Writer: writes only under /incoming.
    let r = ferry_net::client::put(
        &as_token(&writer),
        std::slice::from_ref(&file),
        "/incoming/",
        reporter(),
    )
    .await
    .unwrap();
    assert!(r.is_success());
    assert_eq!(
        std::fs::read(server.root.join("incoming/up.bin")).unwrap(),
        bytes(50_000, 2)
    );
    let r = ferry_net::client::put(
        &as_token(&writer),
        std::slice::from_ref(&file),
        "/private/",
        reporter(),
    )
    .await;
    denied(&r, "/private/");
    // ".." cannot climb out of the prefix: paths are normalised before the scope check.
    let r = ferry_net::client::put(
        &as_token(&writer),
        std::slice::from_ref(&file),
        "/incoming/../private/",
        reporter(),
    )
    .await;
    assert!(r.is_err());
    let private: Vec<String> = names(&server.root.join("private"));
    assert_eq!(private, vec!["s.txt".to_owned()], "nothing touched");

    // Revoked: the next login fails, without restarting the server.
    access::revoke_token(&tokens, "writer").unwrap();
    let later = std::time::SystemTime::now() + Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(&tokens)
        .unwrap()
        .set_modified(later)
        .unwrap();
    let r = ferry_net::client::list(&as_token(&writer), "/pub", &ferry_core::NoReporter).await;
    assert_eq!(code_of(&r), Some(ErrorCode::AUTH));
    server.stop().await;
}
