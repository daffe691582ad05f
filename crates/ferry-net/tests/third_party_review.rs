//! Review of third-party copies (issue 38): each test is one problem a hostile review found,
//! as a malicious source, a lost network or a long copy would meet it, kept as a test of its
//! fix.

use crate::util;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_net::copy::{copy, CopyConfig};
use ferry_net::ClientConfig;
use ferry_proto::{CompleteSummary, CopyRequest, ErrorCode, ExistingPolicy, Frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket};
use util::*;

fn third_party(c: &mut ferry_net::ServerConfig) {
    c.third_party = true;
}

/// The copy's configuration: the client reaches each server at `*_via`; A reaches B at
/// `b_for_a`.
fn copy_config(
    a: &TestServer,
    b: &TestServer,
    (a_via, b_via): (SocketAddr, SocketAddr),
    b_for_a: SocketAddr,
) -> CopyConfig {
    let mut source = a.client();
    source.server = a_via.to_string();
    let mut dest = b.client();
    dest.server = b_via.to_string();
    CopyConfig {
        source,
        dest,
        dest_addr: Some(b_for_a.to_string()),
    }
}

/// A TCP relay that counts what it forwards, can pace it, dial its target from another
/// loopback address, go silent towards its clients (as a network partition would: nothing
/// more arrives, nothing is closed) and cut every connection it holds while still accepting.
struct Relay {
    addr: SocketAddr,
    bytes: Arc<AtomicU64>,
    mute: Arc<AtomicBool>,
    pairs: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(target: SocketAddr, rate: Option<u64>, from: Option<IpAddr>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let bytes = Arc::new(AtomicU64::new(0));
        let mute = Arc::new(AtomicBool::new(false));
        let pairs = Arc::new(Mutex::new(Vec::new()));
        let (count, muted, held) = (bytes.clone(), mute.clone(), pairs.clone());
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let socket = TcpSocket::new_v4().unwrap();
                if let Some(ip) = from {
                    socket.bind(SocketAddr::new(ip, 0)).unwrap();
                }
                let Ok(outbound) = socket.connect(target).await else {
                    continue;
                };
                let (ri, wi) = inbound.into_split();
                let (ro, wo) = outbound.into_split();
                let up = tokio::spawn(pump(ri, wo, count.clone(), rate, None));
                let down = tokio::spawn(pump(ro, wi, count.clone(), rate, Some(muted.clone())));
                held.lock()
                    .unwrap()
                    .extend([up.abort_handle(), down.abort_handle()]);
            }
        });
        Self {
            addr,
            bytes,
            mute,
            pairs,
            task,
        }
    }

    fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// From now on nothing the target sends reaches the clients, and nothing is closed.
    fn go_silent(&self) {
        self.mute.store(true, Ordering::Relaxed);
    }

    /// Closes every connection held now; new ones are still relayed.
    fn cut(&self) {
        for h in self.pairs.lock().unwrap().drain(..) {
            h.abort();
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
        self.cut();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    count: Arc<AtomicU64>,
    rate: Option<u64>,
    mute: Option<Arc<AtomicBool>>,
) {
    let muted = || mute.as_ref().is_some_and(|m| m.load(Ordering::Relaxed));
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        count.fetch_add(n as u64, Ordering::Relaxed);
        if let Some(rate) = rate {
            tokio::time::sleep(Duration::from_secs_f64(n as f64 / rate as f64)).await;
        }
        if muted() {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    if muted() {
        // A partition: the client's side stays open and hears nothing more.
        std::future::pending::<()>().await;
    }
    let _ = to.shutdown().await;
}

/// A grant from B, minted over a raw session with the test token (kept open: closing it
/// revokes the grant).
async fn mint(b: &TestServer, dest: &str) -> (Raw, String) {
    let (mut c, _, _) = control(b).await;
    c.send(&Frame::GrantRequest {
        dest: dest.into(),
        existing: ExistingPolicy::Fail,
    })
    .await
    .unwrap();
    match c.expect(T).await {
        Frame::Granted { grant, .. } => (c, grant),
        other => panic!("expected Granted, got {other:?}"),
    }
}

/// A raw control session logged in with `token` (a grant, here).
async fn log_in(server: &TestServer, token: &str) -> Raw {
    let mut c = Raw::connect(server.addr).await;
    c.send(&hello_control(token)).await.unwrap();
    match c.expect(T).await {
        Frame::Welcome { .. } => c,
        other => panic!("expected Welcome, got {other:?}"),
    }
}

/// A raw put with `token` into `dest`, with its one data connection joined.
async fn raw_put_with(server: &TestServer, token: &str, dest: &str) -> (Raw, Raw) {
    raw_put_as(server, token, dest, ExistingPolicy::Fail).await
}

/// Like [`raw_put_with`], with the policy for files that exist.
async fn raw_put_as(
    server: &TestServer,
    token: &str,
    dest: &str,
    existing: ExistingPolicy,
) -> (Raw, Raw) {
    let hello = hello_control(token);
    let (session, secret) = session_of(&hello);
    let mut c = Raw::connect(server.addr).await;
    c.send(&hello).await.unwrap();
    assert!(matches!(c.expect(T).await, Frame::Welcome { .. }));
    c.send(&Frame::PutRequest {
        dest: dest.into(),
        sources: 1,
        opts: raw_opts(existing),
    })
    .await
    .unwrap();
    match c.expect(T).await {
        Frame::Ready { .. } => {}
        other => panic!("expected Ready, got {other:?}"),
    }
    let mut d = Raw::connect(server.addr).await;
    d.send(&hello_data(session, secret, 0)).await.unwrap();
    assert!(matches!(d.expect(T).await, Frame::Welcome { .. }));
    (c, d)
}

/// Offers one whole file at wire path `path`, sends it and says the put is over; the
/// receiver's `Complete`, or `None` if it refused or closed instead.
async fn put_one_file(
    c: &mut Raw,
    d: &mut Raw,
    path: &str,
    data: &[u8],
    symlinks: u64,
) -> Option<CompleteSummary> {
    let block = raw_block(0, path, data, 0, data.len());
    c.send(&offer_of(&block)).await.ok()?;
    match c.recv(T).await {
        Read::Frame(Frame::Decisions { .. }) => {}
        _ => return None,
    }
    d.send(&block).await.ok()?;
    c.send(&Frame::Sent {
        files: 1,
        dirs: 0,
        symlinks,
        bytes: 0,
    })
    .await
    .ok()?;
    for _ in 0..100 {
        match c.recv(Duration::from_secs(10)).await {
            Read::Frame(Frame::Complete(s)) => return Some(s),
            Read::Frame(Frame::Error { .. }) | Read::Closed | Read::TimedOut => return None,
            Read::Frame(_) => {}
        }
    }
    None
}

fn with_grant(b: &TestServer, grant: &str) -> ClientConfig {
    let mut c = b.client();
    c.token = grant.to_owned();
    c
}

/// SECURITY.md says a source "cannot ... mint grants, or keep access after the copy completes
/// or the client leaves". A session logged in with a grant asks for a grant for the same path:
/// B mints it, held by that session, so it survives the client's revocation of the first and
/// can be used again after any completion (each session with it can mint the next).
#[tokio::test]
async fn a_session_logged_in_with_a_grant_cannot_mint_another() {
    let b = TestServer::start_with(third_party).await;
    let (minting, grant) = mint(&b, "/in/x").await;
    let mut g = log_in(&b, &grant).await;
    g.send(&Frame::GrantRequest {
        dest: "/in/x".into(),
        existing: ExistingPolicy::Fail,
    })
    .await
    .unwrap();
    match g.recv(T).await {
        Read::Frame(Frame::Granted { grant: second, .. }) => {
            // The client leaves: its grant is revoked, but not the one its source minted.
            drop(minting);
            tokio::time::sleep(Duration::from_millis(300)).await;
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("x");
            write(&file, &bytes(1000, 1));
            let put =
                ferry_net::client::put(&with_grant(&b, &second), &[file], "/in/x", reporter())
                    .await;
            panic!(
                "a session with a grant minted another; after the client revoked its own, a put \
                 with the second one gave {put:?}"
            );
        }
        Read::Frame(Frame::Error { code, .. }) => assert_eq!(code, ErrorCode::DENIED),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// SECURITY.md: a grant "writes nowhere else" than its path. A put with a grant for `/in/x`
/// stores a link `in/x/l -> ../y` (links are made as sent) and then a file `l/planted`: B
/// resolves it beneath the token's scope (the root, for the test token), follows the link it
/// just made and stores `in/y/planted`, outside the granted path.
#[tokio::test]
async fn a_put_with_a_grant_cannot_write_outside_its_path_through_a_link_it_made() {
    let b = TestServer::start_with(third_party).await;
    std::fs::create_dir_all(b.root.join("in/x")).unwrap();
    std::fs::create_dir_all(b.root.join("in/y")).unwrap();
    let (_minting, grant) = mint(&b, "/in/x").await;
    let (mut c, mut d) = raw_put_with(&b, &grant, "/in/x/").await;
    d.send(&Frame::Symlink {
        path: "l".into(),
        target: "../y".into(),
        mtime_ns: 0,
    })
    .await
    .unwrap();
    // The link is made as it comes; let it be there before the file's offer.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let summary = put_one_file(&mut c, &mut d, "l/planted", &bytes(1000, 2), 1).await;
    assert!(
        !b.root.join("in/y/planted").exists(),
        "a put with a grant for /in/x stored /in/y/planted ({summary:?})"
    );
}

/// SECURITY.md: a source cannot "keep access after ... the client leaves". A session that
/// logged in with the grant before the client closed its minting session goes on and stores
/// files after the revocation (a malicious source opens it early and writes when it likes).
#[tokio::test]
async fn a_put_under_way_ends_when_its_grant_is_revoked() {
    let b = TestServer::start_with(third_party).await;
    let (minting, grant) = mint(&b, "/in/x").await;
    let (mut c, mut d) = raw_put_with(&b, &grant, "/in/x").await;
    drop(minting);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let summary = put_one_file(&mut c, &mut d, "x", &bytes(1000, 3), 0).await;
    assert!(
        !b.root.join("in/x").exists(),
        "a put with a revoked grant stored /in/x after the client left ({summary:?})"
    );
}

/// PROTOCOL.md: A "retries failures a retry can fix for as long as B keeps the grant usable"
/// (its time to live after the failed session). A's retry budget (`retry_for = grant_ttl` in
/// server/copy.rs) is counted by `client::retrying` from the start of the whole put, so a copy
/// that has run longer than the time to live (60 s by default; 2 s here) is never retried by A:
/// one dropped connection fails the copy although B would take A back.
#[tokio::test]
async fn a_source_retries_within_the_grant_ttl_after_a_long_copy_fails() {
    let ttl = |c: &mut ferry_net::ServerConfig| {
        c.third_party = true;
        c.grant_ttl = Duration::from_secs(2);
    };
    let a = TestServer::start_with(ttl).await;
    let b = TestServer::start_with(ttl).await;
    let data = bytes(24 << 20, 4);
    write(&a.root.join("big"), &data);
    // A reaches B at 1 MB/s per connection (4 of them): the copy runs about 6 s; it is cut
    // after 3, past the 2 s that A counts its retries in.
    let relay = Relay::start(b.addr, Some(1 << 20), None).await;
    let cfg = copy_config(&a, &b, (a.addr, b.addr), relay.addr);
    assert_eq!(
        cfg.source.retry_for,
        Duration::ZERO,
        "the client does not rerun"
    );
    let run = tokio::spawn(async move { copy(&cfg, "/big", "/", reporter()).await });
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        relay.bytes() > (4 << 20) && relay.bytes() < data.len() as u64,
        "the copy is under way and not done: {} bytes",
        relay.bytes()
    );
    relay.cut();
    let report = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the copy ends")
        .unwrap();
    assert!(
        report.is_ok(),
        "A gave up after one cut connection while B kept its grant usable: {report:?}"
    );
    assert_eq!(std::fs::read(b.root.join("big")).unwrap(), data);
}

/// "Every wait bounded": a source that goes silent (a network partition between the client and
/// A: no frame, no close) leaves `copy::watch` waiting for it without end, even though the
/// source's progress is due every 500 ms and the client has an idle timeout (2 s here).
#[tokio::test]
async fn a_client_gives_up_on_a_source_that_went_silent() {
    let a = TestServer::start_with(third_party).await;
    let b = TestServer::start_with(third_party).await;
    write(&a.root.join("big"), &bytes(8 << 20, 5));
    // About 2 s at 1 MB/s per connection (4 of them); the client's side of A goes silent
    // after 0.3 s.
    let paced = Relay::start(b.addr, Some(1 << 20), None).await;
    let to_a = Relay::start(a.addr, None, None).await;
    let mut cfg = copy_config(&a, &b, (to_a.addr, b.addr), paced.addr);
    cfg.source.idle_timeout = Duration::from_secs(2);
    cfg.dest.idle_timeout = Duration::from_secs(2);
    let run = tokio::spawn(async move { copy(&cfg, "/big", "/", reporter()).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    to_a.go_silent();
    let ended = tokio::time::timeout(Duration::from_secs(30), run).await;
    assert!(
        matches!(ended, Ok(Ok(Err(_)))),
        "30 s after its source went silent the client still waits (idle timeout 2 s): {ended:?}"
    );
}

/// A client with any read scope on A can lock A out of B for every user: each `CopyRequest`
/// with a made-up grant is a failed login from A's address at B, and after five B brakes A's
/// address (1, 2, 4 ... 300 s), so the next honest copy from A to B is refused `slow_down`.
/// (The honest client reaches B from 127.0.0.2, so only A's own address is braked.)
#[tokio::test]
async fn bogus_grants_sent_through_a_source_do_not_lock_it_out_of_the_destination() {
    let a = TestServer::start_with(third_party).await;
    let b = TestServer::start_with(third_party).await;
    write(&a.root.join("f"), &bytes(1000, 6));
    let forged = format!("ferry-grant:{}.{}", "1".repeat(32), "2".repeat(64));
    for _ in 0..6 {
        let (mut c, _, _) = control(&a).await;
        c.send(&Frame::CopyRequest(Box::new(CopyRequest {
            src: "/f".into(),
            dest: "/f".into(),
            peer: b.addr.to_string(),
            fingerprint: b.fingerprint.unwrap().0,
            grant: forged.clone(),
            opts: raw_opts(ExistingPolicy::Fail),
            only: false,
            stripes: Vec::new(),
            pull: false,
        })))
        .await
        .unwrap();
        let mut refused = None;
        for _ in 0..100 {
            match c.recv(Duration::from_secs(10)).await {
                Read::Frame(Frame::CopyProgress(_)) => {}
                Read::Frame(Frame::Error { code, .. }) => {
                    refused = Some(code);
                    break;
                }
                other => panic!("expected progress or an error, got {other:?}"),
            }
        }
        // `auth` for the first five, then `slow_down`: B brakes A's address.
        assert!(
            matches!(refused, Some(ErrorCode::AUTH | ErrorCode::SLOW_DOWN)),
            "B refuses the made-up grant: {refused:?}"
        );
    }
    let from_elsewhere = Relay::start(b.addr, None, Some("127.0.0.2".parse().unwrap())).await;
    let cfg = copy_config(&a, &b, (a.addr, from_elsewhere.addr), b.addr);
    let report = copy(&cfg, "/f", "/g", reporter()).await;
    assert!(
        report.is_ok(),
        "an honest copy from A to B after another client's bogus requests: {report:?}"
    );
}

/// SECURITY.md: a compromised A can "write or overwrite (if the client asked for
/// `--overwrite`) files under `/dst`". B never hears what the client asked: `GrantRequest`
/// carries only the path, and the put's own options (A's choice) decide. A source whose client
/// asked for no overwriting replaces an existing file.
#[tokio::test]
async fn a_grant_overwrites_only_if_its_client_asked_for_it() {
    let b = TestServer::start_with(third_party).await;
    std::fs::create_dir_all(b.root.join("in")).unwrap();
    let before = bytes(1000, 7);
    write(&b.root.join("in/x"), &before);
    // The client asks for the default policy (fail on existing files): nothing to say in
    // `GrantRequest`.
    let (_minting, grant) = mint(&b, "/in/x").await;
    let (mut c, mut d) = raw_put_as(&b, &grant, "/in/x", ExistingPolicy::Overwrite).await;
    let summary = put_one_file(&mut c, &mut d, "x", &bytes(1000, 8), 0).await;
    assert_eq!(
        std::fs::read(b.root.join("in/x")).unwrap(),
        before,
        "a source replaced an existing file its client did not ask to overwrite ({summary:?})"
    );
}
