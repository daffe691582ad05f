//! Hostile input on both ends: path traversal in requests and in frames, a malicious server, bad
//! credentials, garbage and stalled connections, clients that vanish mid-transfer, and the
//! connection cap. Every check that "nothing escaped" looks at the file system directly.

use crate::util;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_net::SessionError;
use ferry_proto::{
    Capabilities, ErrorCode, ExistingPolicy, FileId, Frame, Role, SessionId, PROTOCOL_VERSION,
};
use util::*;

const SECRET: &[u8] = b"TOP-SECRET-outside-the-root-5f2a9c";

// ---------------------------------------------------------------------------------------------
// helpers

/// A directory next to the server's root (inside the server's own temp dir) holding a secret.
fn outside_of(server: &TestServer) -> PathBuf {
    let outside = server.root.parent().unwrap().join("outside");
    write(&outside.join("secret.txt"), SECRET);
    outside
}

/// Everything next to the root (the root's own contents excluded), to prove nothing appeared
/// beside it.
fn beside_root(server: &TestServer) -> Vec<String> {
    let base = server.root.parent().unwrap();
    names(base)
        .into_iter()
        .filter(|n| n != "root" && !n.starts_with("root/"))
        .collect()
}

fn code_of<T: std::fmt::Debug>(r: &Result<T, SessionError>) -> Option<ErrorCode> {
    match r {
        Err(SessionError::Remote { code, .. }) => Some(*code),
        _ => None,
    }
}

fn is_refusal(code: Option<ErrorCode>) -> bool {
    matches!(
        code,
        Some(ErrorCode::PERMISSION) | Some(ErrorCode::NOT_FOUND)
    )
}

/// A raw put session with one data connection, ready for frames.
async fn raw_put(server: &TestServer, dest: &str) -> (Raw, Raw, SessionId, [u8; 32]) {
    let (mut c, session, secret) = control(server).await;
    c.send(&Frame::PutRequest {
        dest: dest.into(),
        sources: 1,
        opts: raw_opts(ExistingPolicy::Fail),
    })
    .await
    .unwrap();
    match c.expect(T).await {
        Frame::Ready { streams: 1, .. } => {}
        other => panic!("expected Ready for one stream, got {other:?}"),
    }
    let mut d = Raw::connect(server.addr).await;
    d.send(&hello_data(session, secret, 0)).await.unwrap();
    assert!(matches!(d.expect(T).await, Frame::Welcome { .. }));
    (c, d, session, secret)
}

/// `.ferry-<16 hex>.part`: the stable name of a journaled partial copy.
fn is_journaled_part(name: &str) -> bool {
    name.strip_prefix(".ferry-")
        .and_then(|r| r.strip_suffix(".part"))
        .is_some_and(|k| k.len() == 16 && k.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Sets a file's mtime (nanoseconds since the epoch) with std only.
fn filetime_set(path: &Path, ns: i64) {
    let t = std::time::UNIX_EPOCH + Duration::from_nanos(ns as u64);
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(t)
        .unwrap();
}

/// Ids of files the receiver refused at offer time.
fn fail_ids(decisions: &[ferry_proto::FileDecision]) -> Vec<u64> {
    decisions
        .iter()
        .filter(|d| matches!(d.decision, ferry_proto::Decision::Fail { .. }))
        .map(|d| d.file.0)
        .collect()
}

/// Reads control frames until `Complete` (or an error); returns the failed file ids and the
/// summary.
async fn until_complete(c: &mut Raw) -> (Vec<u64>, ferry_proto::CompleteSummary) {
    let mut failed = Vec::new();
    for _ in 0..1000 {
        match c.expect(Duration::from_secs(10)).await {
            Frame::FileFailed { file, .. } => failed.push(file.0),
            Frame::Complete(s) => {
                failed.sort();
                return (failed, s);
            }
            Frame::Skipped { .. } | Frame::Resend { .. } | Frame::EntryFailed { .. } => {}
            Frame::Decisions { entries } => failed.extend(fail_ids(&entries)),
            other => panic!("unexpected frame {other:?}"),
        }
    }
    panic!("no Complete");
}

fn sent(files: u64, dirs: u64, symlinks: u64) -> Frame {
    Frame::Sent {
        files,
        dirs,
        symlinks,
        bytes: 0,
    }
}

// ---------------------------------------------------------------------------------------------
// path traversal through requests

const DOTDOT: [&str; 7] = [
    "../x",
    "/../../etc",
    "a/../../..",
    "..",
    "../",
    "./../x",
    "x/./../../y",
];

/// Symlinks inside the root that lead out of it: relative, absolute, and nested.
fn plant_escapes(server: &TestServer, outside: &Path) {
    std::os::unix::fs::symlink("../outside", server.root.join("esc")).unwrap();
    std::os::unix::fs::symlink(outside, server.root.join("abs")).unwrap();
    std::fs::create_dir(server.root.join("a")).unwrap();
    std::os::unix::fs::symlink("../../..", server.root.join("a/b")).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traversal_in_put_dest_refused() {
    let server = TestServer::start().await;
    let outside = outside_of(&server);
    plant_escapes(&server, &outside);
    let before_outside = snapshot(&outside);
    let before_beside = beside_root(&server);
    let before_root = snapshot(&server.root);
    let src = tempfile::tempdir().unwrap();
    // A name unique to this run, so that finding it anywhere is proof of an escape.
    let probe = format!("ferry-probe-{}-{:?}", std::process::id(), Instant::now());
    let probe = probe.replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "_");
    let file = src.path().join(&probe);
    write(&file, b"probe");

    let escaping_dirs = ["esc/", "abs/", "a/b/", "/esc/./", "a/b/tmp/"];
    let through_links = ["esc/sub/", "esc/newname", "abs/x/y", "a/b/c", "a/b/tmp/x"];
    for dest in DOTDOT.iter().chain(&escaping_dirs).chain(&through_links) {
        let r = ferry_net::client::put(
            &server.client(),
            std::slice::from_ref(&file),
            dest,
            reporter(),
        )
        .await;
        let refused = match &r {
            Err(_) => true,
            Ok(rep) => rep.files == 0 && rep.failed > 0,
        };
        assert!(refused, "put to {dest:?} was not refused: {r:?}");
        // Refused up front, with a code that says why and is not worth retrying.
        assert!(is_refusal(code_of(&r)), "put to {dest:?}: {r:?}");
        assert!(!r.unwrap_err().is_retryable(), "{dest:?}");
    }
    // A link used as the destination *name* is an existing entry (default policy: fail), and
    // stays a link.
    let r = ferry_net::client::put(
        &server.client(),
        std::slice::from_ref(&file),
        "esc",
        reporter(),
    )
    .await;
    assert!(r.as_ref().map_or(true, |r| r.failed == 1), "{r:?}");
    assert!(std::fs::symlink_metadata(server.root.join("esc"))
        .unwrap()
        .file_type()
        .is_symlink());

    assert_eq!(snapshot(&outside), before_outside);
    assert_eq!(beside_root(&server), before_beside);
    assert_eq!(snapshot(&server.root), before_root);
    let tmp_parent = server.root.parent().unwrap().parent().unwrap();
    assert!(!tmp_parent.join(&probe).exists());
    assert!(!outside.join(&probe).exists());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traversal_in_get_src_refused_and_links_never_followed() {
    let server = TestServer::start().await;
    let outside = outside_of(&server);
    plant_escapes(&server, &outside);
    write(&server.root.join("inside.txt"), b"inside");
    let before_outside = snapshot(&outside);
    let dest = tempfile::tempdir().unwrap();

    let through_links = [
        "esc/secret.txt",
        "/esc/secret.txt",
        "esc/./secret.txt",
        "esc//secret.txt",
        "abs/secret.txt",
        "a/b/tmp",
        "a/b/etc/passwd",
    ];
    for src in DOTDOT.iter().chain(&through_links) {
        let r = ferry_net::client::get(&server.client(), src, dest.path(), reporter()).await;
        assert!(is_refusal(code_of(&r)), "get {src:?}: {r:?}");
    }
    // The links themselves may be fetched: they arrive as links, never as what they point to.
    for link in ["esc", "esc/", "abs", "a/b"] {
        let d = dest.path().join(format!("got-{}", link.replace('/', "_")));
        let r = ferry_net::client::get(&server.client(), link, &d, reporter())
            .await
            .unwrap();
        assert!(r.is_success(), "{link}: {:?}", r.errors);
        assert!(
            std::fs::symlink_metadata(&d)
                .unwrap()
                .file_type()
                .is_symlink(),
            "{link}"
        );
    }
    // So may the whole root.
    let r = ferry_net::client::get(&server.client(), "/", &dest.path().join("all/"), reporter())
        .await
        .unwrap();
    assert!(r.is_success(), "{:?}", r.errors);
    assert_eq!(
        std::fs::read(dest.path().join("all/root/inside.txt")).unwrap(),
        b"inside"
    );
    assert!(!any_file_contains(dest.path(), SECRET));
    assert!(names(dest.path()).iter().all(|n| !n.contains("secret")));
    assert_eq!(snapshot(&outside), before_outside);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traversal_in_list_path_refused() {
    let server = TestServer::start().await;
    let outside = outside_of(&server);
    plant_escapes(&server, &outside);
    for path in
        DOTDOT
            .iter()
            .copied()
            .chain(["esc/secret.txt", "abs/secret.txt", "a/b/tmp", "esc/x/"])
    {
        let r = ferry_net::client::list(&server.client(), path, &ferry_core::NoReporter).await;
        assert!(is_refusal(code_of(&r)), "ls {path:?}: {r:?}");
    }
    // A link is described as a link, not listed through.
    for path in ["esc", "esc/", "/abs/", "a/b", "a/./b/"] {
        let entries = ferry_net::client::list(&server.client(), path, &ferry_core::NoReporter)
            .await
            .unwrap();
        assert_eq!(entries.len(), 1, "ls {path:?}: {entries:?}");
        assert_eq!(entries[0].kind, ferry_proto::EntryKind::Symlink, "{path:?}");
        assert!(!entries[0].name.contains("secret"));
    }
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// path traversal through frames: a malicious client

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_client_frames_cannot_escape_the_root() {
    let server = TestServer::start().await;
    let outside = outside_of(&server);
    let before_outside = snapshot(&outside);
    let before_beside = beside_root(&server);
    let abs_target = outside.join("evil-abs");
    let data = b"evil payload".to_vec();

    // Session 1: hostile paths of every kind, plus a symlink to the outside and one good file.
    let (mut c, mut d, _, _) = raw_put(&server, "/").await;
    let bad_files = [
        "../evil0",
        abs_target.to_str().unwrap(),
        "a/../../evil2",
        "..",
        "",
        "nul\0byte",
        "a//b",
        "./evil7",
    ];
    let mut refused = Vec::new();
    for (i, p) in bad_files.iter().enumerate() {
        let dec = send_offered(&mut c, &mut d, raw_block(i as u64, p, &data, 0, data.len())).await;
        refused.extend(fail_ids(&dec));
    }
    let good = bad_files.len() as u64;
    send_offered(
        &mut c,
        &mut d,
        raw_block(good, "ok.txt", &data, 0, data.len()),
    )
    .await;
    for p in ["../evildir", "/tmp/evildir-abs", "x/../../evildir"] {
        d.send(&Frame::Dir {
            path: p.into(),
            mode: 0o755,
            mtime_ns: 0,
        })
        .await
        .unwrap();
    }
    for (p, target) in [
        ("../evillink", "x"),
        ("lnk", outside.to_str().unwrap()),
        ("dotlnk", ".."),
    ] {
        d.send(&Frame::Symlink {
            path: p.into(),
            target: target.into(),
            mtime_ns: 0,
        })
        .await
        .unwrap();
    }
    c.send(&sent(good + 1, 3, 3)).await.unwrap();
    let (failed, summary) = until_complete(&mut c).await;
    refused.extend(failed);
    refused.sort();
    assert_eq!(refused, (0..good).collect::<Vec<_>>());
    assert_eq!(summary.files, 1);
    // 8 files, 3 directories, 1 symlink.
    assert_eq!(summary.failed, good + 3 + 1, "{summary:?}");
    drop((c, d));
    assert_eq!(std::fs::read(server.root.join("ok.txt")).unwrap(), data);

    // Session 2: write through the links planted by session 1.
    let (mut c, mut d, _, _) = raw_put(&server, "/").await;
    let mut refused2 = Vec::new();
    for (i, p) in ["lnk/evil-through", "dotlnk/evil-through", "lnk/sub/evil"]
        .iter()
        .enumerate()
    {
        let dec = send_offered(&mut c, &mut d, raw_block(i as u64, p, &data, 0, data.len())).await;
        refused2.extend(fail_ids(&dec));
    }
    for p in ["lnk/evildir", "dotlnk/evildir"] {
        d.send(&Frame::Dir {
            path: p.into(),
            mode: 0o755,
            mtime_ns: 0,
        })
        .await
        .unwrap();
    }
    d.send(&Frame::Symlink {
        path: "lnk/evillink".into(),
        target: "x".into(),
        mtime_ns: 0,
    })
    .await
    .unwrap();
    c.send(&sent(3, 2, 1)).await.unwrap();
    let (failed, summary) = until_complete(&mut c).await;
    refused2.extend(failed);
    refused2.sort();
    assert_eq!(refused2, vec![0, 1, 2]);
    assert_eq!((summary.files, summary.failed), (0, 6), "{summary:?}");
    drop((c, d));

    assert_eq!(snapshot(&outside), before_outside);
    assert_eq!(beside_root(&server), before_beside);
    let inside = names(&server.root);
    assert_eq!(inside, vec!["dotlnk", "lnk", "ok.txt"], "{inside:?}");
    assert!(!Path::new("/tmp/evildir-abs").exists());
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// a malicious server

async fn accept(l: &tokio::net::TcpListener) -> tokio::net::TcpStream {
    tokio::time::timeout(T, l.accept())
        .await
        .unwrap()
        .unwrap()
        .0
}

/// The data connection that joins as the first (the fakes grant one). The client dials its
/// data connections while it logs in, as many as it asks for, each saying `Hello` with its
/// index: the others are refused as a server does (`not_granted`), their data taken until
/// the client closes them.
async fn accept_data(l: &tokio::net::TcpListener) -> Raw {
    for _ in 0..64 {
        let mut d = Raw::from_stream(accept(l).await);
        match d.recv(T).await {
            Read::Frame(Frame::Hello {
                role: Role::Data { stream: 0, .. },
                ..
            }) => return d,
            Read::Frame(Frame::Hello {
                role: Role::Data { stream, .. },
                ..
            }) => {
                tokio::spawn(async move {
                    let refusal = Frame::Error {
                        code: ErrorCode::NOT_GRANTED,
                        message: format!("data connection {stream} not granted: the session has 1"),
                    };
                    let _ = d.send(&refusal).await;
                    d.closed_within(T).await
                });
            }
            Read::Closed => continue,
            other => panic!("expected a data Hello, got {other:?}"),
        }
    }
    panic!("no data connection joined");
}

/// A fake server's `Welcome` for the session a client's control `Hello` chose: sent on the
/// control connection and again on each data connection it accepts.
fn welcome_for(hello: &Frame) -> Frame {
    let (session, secret) = session_of(hello);
    Frame::Welcome {
        version: PROTOCOL_VERSION,
        capabilities: Capabilities::ours(),
        session,
        secret,
    }
}

/// Plays a server for one `get`: handshake, then `data` on the data connection and `sent` on
/// control; returns what the client said on control afterwards.
/// A fake server's `Ready` granting one data connection of `BLOCK`-sized blocks.
fn ready_one() -> Frame {
    Frame::Ready {
        streams: 1,
        block_size: BLOCK,
    }
}

async fn fake_get_server(
    listener: tokio::net::TcpListener,
    data: Vec<Frame>,
    sent: Frame,
) -> Vec<Frame> {
    let mut c = Raw::from_stream(accept(&listener).await);
    let hello = c.expect(T).await;
    let welcome = welcome_for(&hello);
    c.send(&welcome).await.unwrap();
    assert!(matches!(c.expect(T).await, Frame::GetRequest { .. }));
    c.send(&ready_one()).await.unwrap();
    let mut d = accept_data(&listener).await;
    d.send(&welcome).await.unwrap();
    // Like a real sender: offer every file, and send data only for files the client accepted.
    let mut got = Vec::new();
    let mut accepted = std::collections::HashSet::new();
    for f in &data {
        if let Frame::Block(_) = f {
            c.send(&offer_of(f)).await.unwrap();
            match c.expect(T).await {
                Frame::Decisions { entries } => {
                    for e in &entries {
                        if !matches!(e.decision, ferry_proto::Decision::Fail { .. }) {
                            accepted.insert(e.file);
                        }
                    }
                    got.push(Frame::Decisions { entries });
                }
                other => panic!("expected Decisions, got {other:?}"),
            }
        }
    }
    for f in &data {
        match f {
            Frame::Block(b) if !accepted.contains(&b.file.id) => {}
            f => d.send(f).await.unwrap(),
        }
    }
    c.send(&sent).await.unwrap();
    for _ in 0..1000 {
        match c.recv(Duration::from_secs(10)).await {
            Read::Frame(f) => {
                let end = matches!(f, Frame::Complete(_) | Frame::Error { .. });
                got.push(f);
                if end {
                    break;
                }
            }
            _ => break,
        }
    }
    got
}

fn failed_ids(frames: &[Frame]) -> Vec<u64> {
    let mut v: Vec<u64> = frames
        .iter()
        .flat_map(|f| match f {
            Frame::FileFailed {
                file: FileId(id), ..
            } => vec![*id],
            Frame::Decisions { entries } => fail_ids(entries),
            _ => vec![],
        })
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_server_cannot_write_outside_get_destination() {
    let base = tempfile::tempdir().unwrap();
    let outside = base.path().join("outside");
    write(&outside.join("secret.txt"), SECRET);
    let dest = base.path().join("dest");
    std::fs::create_dir(&dest).unwrap();
    let before_outside = snapshot(&outside);
    let data = b"evil payload from the server".to_vec();
    let abs = outside.join("evil-abs");

    for (dest_path, top) in [(dest.clone(), ""), (base.path().join("renamed"), "top/")] {
        let files = [
            format!("{top}../evil0"),
            format!("{top}../outside/evil1"),
            abs.to_str().unwrap().to_owned(),
            format!("{top}x/../../../evil3"),
            "../../evil4".to_owned(),
            format!("{top}lnk/evil5"),
        ];
        let mut frames = vec![
            // Created first (one writer keeps the order), then written through by evil5.
            Frame::Symlink {
                path: format!("{top}lnk"),
                target: outside.to_str().unwrap().into(),
                mtime_ns: 0,
            },
            Frame::Dir {
                path: format!("{top}../evildir"),
                mode: 0o777,
                mtime_ns: 0,
            },
        ];
        for (i, p) in files.iter().enumerate() {
            frames.push(raw_block(i as u64, p, &data, 0, data.len()));
        }
        let ok = files.len() as u64;
        frames.push(raw_block(ok, &format!("{top}ok.txt"), &data, 0, data.len()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut cfg = client_config(listener.local_addr().unwrap().to_string());
        cfg.writers = 1;
        let fake = tokio::spawn(fake_get_server(listener, frames, sent(ok + 1, 1, 1)));
        let r = tokio::time::timeout(
            Duration::from_secs(20),
            ferry_net::client::get(&cfg, "anything", &dest_path, reporter()),
        )
        .await
        .expect("client finishes");
        let said = fake.await.unwrap();
        let r = r.unwrap();
        // Offers are decided before the data connection's Symlink frame is handled, or after:
        // either `lnk` is the planted link and `lnk/evil5` is refused, or the offer made `lnk`
        // a real directory inside the destination, evil5 is stored there and the link is
        // refused. Both are safe; what must never happen is a write outside.
        let lnk = std::fs::symlink_metadata(dest_path.join("lnk")).unwrap();
        let planted = lnk.file_type().is_symlink();
        let evil5_id = ok - 1;
        let mut expect_failed: Vec<u64> = (0..ok - 1).collect();
        if planted {
            expect_failed.push(evil5_id);
        } else {
            assert!(lnk.is_dir());
            assert_eq!(std::fs::read(dest_path.join("lnk/evil5")).unwrap(), data);
        }
        assert_eq!(r.files, if planted { 1 } else { 2 }, "{r:?}");
        assert_eq!(r.failed, ok + 1, "every bad entry: {:?}", r.errors);
        assert!(!r.is_success());
        assert_eq!(failed_ids(&said), expect_failed);
        assert!(matches!(said.last(), Some(Frame::Complete(_))));
        assert_eq!(std::fs::read(dest_path.join("ok.txt")).unwrap(), data);
        assert_eq!(snapshot(&outside), before_outside);
        // Nothing but the destination appeared in the base directory.
        let beside: Vec<_> = names(base.path())
            .into_iter()
            .filter(|n| {
                !n.starts_with("outside") && !n.starts_with("dest") && !n.starts_with("renamed")
            })
            .collect();
        assert_eq!(beside, Vec::<String>::new());
        assert!(!base.path().parent().unwrap().join("evil4").exists());
        assert_eq!(temp_names(base.path()), Vec::<String>::new());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_refuses_server_of_another_version() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        let mut c = Raw::from_stream(s);
        let _ = c.expect(T).await;
        c.send(&Frame::Welcome {
            version: PROTOCOL_VERSION + 1,
            capabilities: Capabilities::ours(),
            session: SessionId(1),
            secret: [0; 32],
        })
        .await
        .unwrap();
        c.closed_within(T).await
    });
    let cfg = client_config(addr.to_string());
    let r = ferry_net::client::list(&cfg, "/", &ferry_core::NoReporter).await;
    assert_eq!(code_of(&r), Some(ErrorCode::VERSION), "{r:?}");
    assert!(fake.await.unwrap(), "client hung up");
}

/// Plays a put server up to the point where the client's first frames show their order: the
/// control `Hello` and request, a `Welcome`, then (before `Ready`) the walk's offer; `Ready` and a
/// `Send` for every offered file; the data connection's `Hello`; then `on_data` decides what the
/// data connection sees next. Ends the session with an error and returns what `on_data` found.
async fn fake_put_server<F, Fut>(listener: tokio::net::TcpListener, on_data: F) -> bool
where
    F: FnOnce(Raw, Frame) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut c = Raw::from_stream(accept(&listener).await);
    let hello = c.expect(T).await;
    assert!(matches!(c.expect(T).await, Frame::PutRequest { .. }));
    let welcome = welcome_for(&hello);
    c.send(&welcome).await.unwrap();
    // Nothing else sent yet: the offer comes without waiting for `Ready`.
    let entries = match c.expect(T).await {
        Frame::Offer { entries } => entries,
        other => panic!("expected the offer before Ready, got {other:?}"),
    };
    c.send(&ready_one()).await.unwrap();
    let decisions = entries
        .iter()
        .map(|e| ferry_proto::FileDecision {
            file: e.file,
            decision: ferry_proto::Decision::Send,
        })
        .collect();
    c.send(&Frame::Decisions { entries: decisions })
        .await
        .unwrap();
    let d = accept_data(&listener).await;
    let seen = on_data(d, welcome).await;
    let _ = c
        .send(&Frame::Error {
            code: ErrorCode::INTERNAL,
            message: "the fake server has seen enough".into(),
        })
        .await;
    c.closed_within(T).await;
    seen
}

/// Puts a file of `len` bytes against `fake_put_server` with `on_data`: the client's result
/// and what `on_data` found.
async fn put_against_fake<F, Fut>(
    len: usize,
    on_data: F,
) -> (Result<ferry_net::TransferReport, SessionError>, bool)
where
    F: FnOnce(Raw, Frame) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("put.bin");
    write(&file, &bytes(len, len as u64));
    let fake = tokio::spawn(fake_put_server(listener, on_data));
    let cfg = client_config(addr.to_string());
    let r = ferry_net::client::put(&cfg, &[file], "/put.bin", reporter()).await;
    (r, fake.await.unwrap())
}

/// A put's first frames go out as early as the protocol allows (PROTOCOL.md, "Session flow"):
/// its offers behind the request, before `Ready`, and its first block behind the data
/// connection's `Hello`, before the `Welcome`. Each waited a round trip before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_offers_before_ready_and_sends_data_before_the_welcome() {
    let (r, seen) = put_against_fake(100_000, |mut d, welcome| async move {
        // No Welcome yet on this connection, and the block is here.
        let first = d.expect(T).await;
        let _ = d.send(&welcome).await;
        // Take the rest, so that the session ends by the fake's error, not by a reset.
        tokio::spawn(async move { d.closed_within(T).await });
        matches!(first, Frame::Block(_))
    })
    .await;
    assert!(seen, "no block before the Welcome");
    // The fake ends the session; the client reports its reason.
    let e = r.unwrap_err();
    assert!(e.to_string().contains("has seen enough"), "{e}");
}

/// A get answers the server's offers while its data connections wait for their `Welcome`, so
/// the decisions are on their way before the data could flow; the file then arrives as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_decides_before_its_data_connections_are_welcomed() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let dest = tempfile::tempdir().unwrap();
    let data = b"decided before the Welcome".to_vec();
    let block = raw_block(0, "early.txt", &data, 0, data.len());
    let fake = tokio::spawn(async move {
        let mut c = Raw::from_stream(accept(&listener).await);
        let hello = c.expect(T).await;
        assert!(matches!(c.expect(T).await, Frame::GetRequest { .. }));
        let welcome = welcome_for(&hello);
        c.send(&welcome).await.unwrap();
        c.send(&ready_one()).await.unwrap();
        c.send(&offer_of(&block)).await.unwrap();
        // The data connection has said Hello and has no Welcome yet.
        let mut d = accept_data(&listener).await;
        let decided = matches!(c.expect(T).await, Frame::Decisions { .. });
        d.send(&welcome).await.unwrap();
        d.send(&block).await.unwrap();
        c.send(&sent(1, 0, 0)).await.unwrap();
        let complete = matches!(c.expect(T).await, Frame::Complete(_));
        drop(d);
        c.closed_within(T).await;
        (decided, complete)
    });
    let cfg = client_config(addr.to_string());
    let r = ferry_net::client::get(&cfg, "/early.txt", dest.path(), reporter()).await;
    let (decided, complete) = fake.await.unwrap();
    assert!(decided, "no decisions before the Welcome");
    assert!(complete, "{r:?}");
    assert!(r.unwrap().is_success());
    assert_eq!(std::fs::read(dest.path().join("early.txt")).unwrap(), data);
}

/// A data connection refused after its `Hello` (its data already on the way) ends the put with
/// the server's reason, not with the broken pipe the refusal caused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_connection_refused_after_its_hello_reports_why() {
    let (r, closed) = put_against_fake(4 << 20, |mut d, _| async move {
        let refusal = Frame::Error {
            code: ErrorCode::AUTH,
            message: "unknown session or wrong secret".into(),
        };
        d.send(&refusal).await.unwrap();
        // Like the server: take what the client sent until it closes, then close.
        d.closed_within(T).await
    })
    .await;
    assert!(closed, "the client kept the refused connection open");
    assert_eq!(code_of(&r), Some(ErrorCode::AUTH), "{r:?}");
}

// ---------------------------------------------------------------------------------------------
// authentication

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_token_refused_and_server_keeps_serving() {
    let server = TestServer::start().await;
    let src = tempfile::tempdir().unwrap();
    let file = src.path().join("f.bin");
    write(&file, &bytes(100_000, 1));
    // (An empty token is refused by the handshake parser before any login, so it does not
    // count towards the brake below.)
    let wrong = [
        "wrong".to_owned(),
        "wrong-too".to_owned(),
        String::new(),
        TOKEN[..TOKEN.len() - 1].to_owned(),
        format!("{TOKEN}x"),
        TOKEN.to_uppercase(),
    ];
    for token in &wrong {
        let mut cfg = server.client();
        cfg.token = token.clone();
        let r = ferry_net::client::list(&cfg, "/", &ferry_core::NoReporter).await;
        match &r {
            Err(SessionError::Remote { code, message }) => {
                assert_eq!(*code, ErrorCode::AUTH, "{token:?}");
                assert!(message.contains("token"), "{message}");
            }
            other => panic!("token {token:?}: {other:?}"),
        }
    }
    // Five failures from one address: the next attempts are slowed down, whatever the token,
    // and not retried automatically.
    let counted = wrong.iter().filter(|t| !t.is_empty()).count();
    assert_eq!(counted as u32, ferry_net::access::LoginBrake::FREE);
    let r = ferry_net::client::put(
        &server.client(),
        std::slice::from_ref(&file),
        "/",
        reporter(),
    )
    .await;
    match &r {
        Err(e @ SessionError::Remote { code, message }) => {
            assert_eq!(*code, ErrorCode::SLOW_DOWN, "{message}");
            assert!(message.contains("try again in"), "{message}");
            assert!(!e.is_retryable());
        }
        other => panic!("expected slow_down: {other:?}"),
    }
    // A token longer than the protocol allows is refused as malformed, not checked.
    let mut cfg = server.client();
    cfg.token = "t".repeat(300);
    let r = ferry_net::client::list(&cfg, "/", &ferry_core::NoReporter).await;
    assert!(r.is_err());
    assert_eq!(names(&server.root), Vec::<String>::new());
    // The wait is short at first: after it, the right token works again (and clears the count).
    tokio::time::sleep(Duration::from_millis(2100)).await;

    let r = ferry_net::client::put(
        &server.client(),
        std::slice::from_ref(&file),
        "/",
        reporter(),
    )
    .await
    .unwrap();
    assert!(r.is_success());
    assert_eq!(
        std::fs::read(server.root.join("f.bin")).unwrap(),
        bytes(100_000, 1)
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_connection_with_wrong_secret_refused() {
    let server = TestServer::start().await;
    let (mut c, session, secret) = control(&server).await;
    c.send(&Frame::PutRequest {
        dest: "/".into(),
        sources: 1,
        opts: raw_opts(ExistingPolicy::Fail),
    })
    .await
    .unwrap();
    assert!(matches!(c.expect(T).await, Frame::Ready { .. }));

    // A session that is not open may be about to be (a client sends its data connections'
    // Hello without waiting for its login): held until the handshake deadline, then refused.
    let addr = server.addr;
    let unknown = tokio::spawn(async move {
        let mut d = Raw::connect(addr).await;
        let other = SessionId(session.0.wrapping_add(1));
        d.send(&hello_data(other, secret, 0)).await.unwrap();
        let t0 = Instant::now();
        let refused = refusal(&mut d, T).await;
        (refused, t0.elapsed())
    });
    let mut wrong_secret = secret;
    wrong_secret[31] ^= 1;
    for (s, sec) in [(session, wrong_secret), (session, [0u8; 32])] {
        let mut d = Raw::connect(server.addr).await;
        d.send(&hello_data(s, sec, 0)).await.unwrap();
        let (code, closed) = refusal(&mut d, T).await;
        assert_eq!(code, Some(ErrorCode::AUTH));
        assert!(closed);
    }
    // Beyond the streams granted (one): refused on its own, the session goes on.
    let mut extra = Raw::connect(server.addr).await;
    extra.send(&hello_data(session, secret, 1)).await.unwrap();
    let (code, closed) = refusal(&mut extra, T).await;
    assert_eq!(code, Some(ErrorCode::NOT_GRANTED));
    assert!(closed);
    // The session is undisturbed: the right secret still joins and the transfer completes.
    let mut d = Raw::connect(server.addr).await;
    d.send(&hello_data(session, secret, 0)).await.unwrap();
    assert!(matches!(d.expect(T).await, Frame::Welcome { .. }));
    let data = b"hello".to_vec();
    send_offered(
        &mut c,
        &mut d,
        raw_block(0, "joined.txt", &data, 0, data.len()),
    )
    .await;
    c.send(&sent(1, 0, 0)).await.unwrap();
    let (failed, summary) = until_complete(&mut c).await;
    assert!(failed.is_empty());
    assert_eq!(summary.files, 1);
    drop((c, d));
    assert_eq!(std::fs::read(server.root.join("joined.txt")).unwrap(), data);
    let ((code, closed), waited) = unknown.await.unwrap();
    assert_eq!(code, Some(ErrorCode::AUTH));
    assert!(closed);
    assert!(
        waited <= Duration::from_secs(4),
        "held {waited:?}, deadline 2 s"
    );

    // Once the session is over its secret opens nothing (refused at the handshake deadline).
    let mut d = Raw::connect(server.addr).await;
    d.send(&hello_data(session, secret, 0)).await.unwrap();
    let (code, closed) = refusal(&mut d, T).await;
    assert_eq!(code, Some(ErrorCode::AUTH));
    assert!(closed);
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// garbage and silence

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_connections_dropped_while_a_transfer_succeeds() {
    let server = TestServer::start().await;
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("t");
    for i in 0..20 {
        write(&tree.join(format!("f{i}")), &bytes(i * 20_000, i as u64));
    }
    let addr = server.addr;

    let garbage = async {
        let mut hello_bad_magic = bytes::BytesMut::new();
        hello_control(TOKEN).encode(&mut hello_bad_magic);
        hello_bad_magic[5] ^= 0xff;
        let mut hello_v2 = bytes::BytesMut::new();
        Frame::Hello {
            version: PROTOCOL_VERSION + 1,
            capabilities: Capabilities::ours(),
            role: Role::Control {
                token: TOKEN.into(),
                session: SessionId(5),
                secret: [5; 32],
            },
        }
        .encode(&mut hello_v2);
        let mut oversized_hello = bytes::BytesMut::new();
        hello_control(&"t".repeat(200)).encode(&mut oversized_hello);
        oversized_hello[1..5].copy_from_slice(&2000u32.to_be_bytes());
        let cases: Vec<(&str, Vec<u8>, Option<ErrorCode>)> = vec![
            ("random 1", bytes(8192, 1), None),
            ("random 2", bytes(100, 2), None),
            ("random 3", bytes(3, 3), None),
            (
                "4 GiB hello",
                vec![0x01, 0xff, 0xff, 0xff, 0xff],
                Some(ErrorCode::PROTOCOL),
            ),
            (
                "4 GiB block",
                vec![0x20, 0xff, 0xff, 0xff, 0xff],
                Some(ErrorCode::PROTOCOL),
            ),
            (
                "large hello",
                oversized_hello.to_vec(),
                Some(ErrorCode::PROTOCOL),
            ),
            (
                "unknown type",
                vec![0x7f, 0, 0, 0, 0],
                Some(ErrorCode::PROTOCOL),
            ),
            ("http", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), None),
            (
                "bad magic",
                hello_bad_magic.to_vec(),
                Some(ErrorCode::PROTOCOL),
            ),
            ("version 2", hello_v2.to_vec(), Some(ErrorCode::VERSION)),
            (
                "request first",
                {
                    let mut b = bytes::BytesMut::new();
                    Frame::ListRequest { path: "/".into() }.encode(&mut b);
                    b.to_vec()
                },
                None,
            ),
        ];
        let mut checks = Vec::new();
        for (name, payload, want) in cases {
            checks.push(async move {
                let mut raw = Raw::connect(addr).await;
                let _ = raw.send_bytes(&payload).await;
                let (code, closed) = refusal(&mut raw, T).await;
                assert!(closed, "{name}: still open");
                if let Some(w) = want {
                    assert_eq!(code, Some(w), "{name}");
                }
            });
        }
        // Silent, and a Hello cut short: both dropped once the handshake timeout (2 s) passes.
        let silent = async {
            let t0 = Instant::now();
            let mut raw = Raw::connect(addr).await;
            let (code, closed) = refusal(&mut raw, Duration::from_secs(8)).await;
            assert!(closed && code.is_none(), "silent: {code:?} {closed}");
            t0.elapsed()
        };
        let truncated = async {
            let t0 = Instant::now();
            let mut raw = Raw::connect(addr).await;
            let mut b = bytes::BytesMut::new();
            hello_control(TOKEN).encode(&mut b);
            raw.send_bytes(&b[..b.len() - 3]).await.unwrap();
            let (_, closed) = refusal(&mut raw, Duration::from_secs(8)).await;
            assert!(closed, "truncated: still open");
            t0.elapsed()
        };
        let (_, silent, truncated) = tokio::join!(join_all(checks), silent, truncated);
        for (name, t) in [("silent", silent), ("truncated", truncated)] {
            assert!(
                t >= Duration::from_millis(1500),
                "{name}: dropped after {t:?}"
            );
            assert!(t < Duration::from_secs(6), "{name}: dropped after {t:?}");
        }
    };
    let transfer = async {
        let r = ferry_net::client::put(
            &server.client(),
            std::slice::from_ref(&tree),
            "/in/",
            reporter(),
        )
        .await
        .unwrap();
        assert!(r.is_success(), "{:?}", r.errors);
        r
    };
    let ((), r) = tokio::join!(garbage, transfer);
    assert_eq!(r.files, 20);
    assert_eq!(snapshot(&tree), snapshot(&server.root.join("in/t")));
    // And the server still serves new sessions afterwards.
    assert_eq!(
        ferry_net::client::list(&server.client(), "/in/t", &ferry_core::NoReporter)
            .await
            .unwrap()
            .len(),
        20
    );
    server.stop().await;
}

async fn join_all<F: std::future::Future<Output = ()>>(futs: Vec<F>) {
    let mut set = Vec::new();
    for f in futs {
        set.push(Box::pin(f));
    }
    for f in set {
        f.await;
    }
}

// ---------------------------------------------------------------------------------------------
// vanishing and stalled clients

/// Counts payload bytes the client has sent and says when a threshold has passed.
struct Progress {
    bytes: AtomicU64,
    threshold: u64,
    reached: tokio::sync::Notify,
}

impl ferry_core::Reporter for Progress {
    fn on_bytes(&self, n: u64) {
        if self.bytes.fetch_add(n, Ordering::Relaxed) + n >= self.threshold {
            self.reached.notify_one();
        }
    }
}

/// Files under `root` that are not temporary must equal the source file of the same name.
fn assert_no_partial_files(root: &Path, src: &Path) {
    for n in names(root) {
        let p = root.join(&n);
        let leaf = n.rsplit('/').next().unwrap();
        if leaf.starts_with(".ferry-") || !std::fs::symlink_metadata(&p).unwrap().is_file() {
            continue;
        }
        let want = std::fs::read(src.join(leaf)).unwrap();
        let got = std::fs::read(&p).unwrap();
        assert!(
            got == want,
            "{n} is incomplete: {} of {} bytes",
            got.len(),
            want.len()
        );
    }
}

/// Starts a put of a tree (small files and one large one) and aborts the client as soon as the
/// server holds a temporary file. Returns the source tree.
async fn kill_mid_put(server: &TestServer, src: &Path) -> PathBuf {
    let tree = src.join("t");
    for i in 0..6 {
        write(
            &tree.join(format!("a-small-{i}")),
            &bytes(100_000 + i, i as u64),
        );
    }
    write(&tree.join("z-large.bin"), &bytes(48 << 20, 99));
    let progress = Arc::new(Progress {
        bytes: AtomicU64::new(0),
        threshold: 2 << 20,
        reached: tokio::sync::Notify::new(),
    });
    let mut cfg = server.client();
    cfg.opts.streams = 2;
    let task = {
        let (tree, rep) = (tree.clone(), progress.clone());
        tokio::spawn(async move { ferry_net::client::put(&cfg, &[tree], "/", rep).await })
    };
    tokio::time::timeout(Duration::from_secs(10), progress.reached.notified())
        .await
        .expect("the transfer starts");
    let t0 = Instant::now();
    while temp_names(&server.root).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "no temporary file seen"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    task.abort();
    assert!(
        task.await.unwrap_err().is_cancelled(),
        "killed before the end"
    );
    tree
}

fn describe_temps(root: &Path) -> Vec<(String, u64, String)> {
    use std::os::unix::fs::PermissionsExt;
    temp_names(root)
        .into_iter()
        .map(|n| {
            let m = std::fs::metadata(root.join(&n)).unwrap();
            let mode = format!("{:o}", m.permissions().mode() & 0o777);
            (n, m.len(), mode)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_killed_mid_transfer_leaves_no_partial_file() {
    let server = TestServer::start_with(|c| c.idle_timeout = Duration::from_secs(3)).await;
    let src = tempfile::tempdir().unwrap();
    let tree = kill_mid_put(&server, src.path()).await;
    let landed = server.root.join("t");
    assert_no_partial_files(&server.root, &tree);
    assert!(!landed.join("z-large.bin").exists());

    // The server still serves, and the same tree with overwrite arrives whole; files that
    // arrived before the kill are intact and nothing ever shows up incomplete.
    let mut cfg = server.client();
    cfg.opts.existing = ExistingPolicy::Overwrite;
    let r = ferry_net::client::put(&cfg, std::slice::from_ref(&tree), "/", reporter())
        .await
        .unwrap();
    assert!(r.is_success(), "{:?}", r.errors);
    assert_no_partial_files(&server.root, &tree);
    let mut got = snapshot(&landed);
    got.retain(|k, _| !k.contains(".ferry-"));
    assert_eq!(snapshot(&tree), got);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_killed_mid_transfer_temp_files_removed() {
    let server = TestServer::start_with(|c| c.idle_timeout = Duration::from_secs(3)).await;
    let src = tempfile::tempdir().unwrap();
    let tree = kill_mid_put(&server, src.path()).await;
    // The server notices (EOF, or its idle timeout) and removes what it had started, except
    // the journaled partial copies of multi-block files (`.ferry-<key>.part` + `.journal`),
    // which a re-run resumes from.
    let session_temps = |root: &Path| -> Vec<String> {
        temp_names(root)
            .into_iter()
            .filter(|n| {
                let base = n.rsplit('/').next().unwrap_or(n);
                base.ends_with(".part") && !is_journaled_part(base)
            })
            .collect()
    };
    let t0 = Instant::now();
    while !session_temps(&server.root).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "temporary files left (name, size, mode): {:?}",
            describe_temps(&server.root)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_no_partial_files(&server.root, &tree);
    assert!(!server.root.join("t/z-large.bin").exists());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_client_times_out_and_partial_is_kept_for_resume() {
    let server = TestServer::start_with(|c| c.idle_timeout = Duration::from_secs(3)).await;
    let (mut c, mut d, _, _) = raw_put(&server, "/").await;
    let data = bytes(BLOCK as usize + 10, 5);
    // The first block of two, then silence with every connection left open.
    send_offered(
        &mut c,
        &mut d,
        raw_block(0, "stalled.bin", &data, 0, BLOCK as usize),
    )
    .await;
    let t0 = Instant::now();
    while temp_names(&server.root).is_empty() {
        assert!(t0.elapsed() < T, "no temporary file seen");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    match c.recv(Duration::from_secs(10)).await {
        Read::Frame(Frame::Error { code, .. }) => assert_eq!(code, ErrorCode::TIMEOUT),
        other => panic!("expected a timeout error, got {other:?}"),
    }
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(2500), "{waited:?}");
    assert!(c.closed_within(T).await);
    drop(d);
    // A file of two blocks is journaled: its partial copy and journal stay for a re-run, and
    // nothing appears under the final name.
    let mut left = temp_names(&server.root);
    left.sort();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(
        left[0].ends_with(".journal") && left[1].ends_with(".part"),
        "{left:?}"
    );
    assert!(!server.root.join("stalled.bin").exists());
    // The re-run resumes: only the missing block (and the last block, which carries the file
    // digest; here they are the same one) is sent.
    let src = tempfile::tempdir().unwrap();
    let file = src.path().join("stalled.bin");
    std::fs::write(&file, &data).unwrap();
    filetime_set(&file, 1_600_000_000_000_000_000);
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let r = ferry_net::client::put(
        &server.client(),
        std::slice::from_ref(&file),
        "/",
        reporter(),
    )
    .await
    .unwrap();
    assert!(r.is_success(), "{:?}", r.errors);
    let sent: u64 = r.streams.iter().map(|s| s.bytes).sum();
    // The first block may also go once, early, before the decision to resume arrives
    // (`ferry_core::send::EARLY_PER_STREAM`), never more.
    assert!(
        sent < 2 * BLOCK as u64,
        "resumed, so less than one block resent besides the early one: {sent}"
    );
    assert_eq!(
        std::fs::read(server.root.join("stalled.bin")).unwrap(),
        data
    );
    assert!(temp_names(&server.root).is_empty());
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// connection cap

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_cap_refuses_with_busy_then_recovers() {
    let server = TestServer::start_with(|c| c.max_connections = 4).await;
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(Raw::connect(server.addr).await);
    }
    let mut fifth = Raw::connect(server.addr).await;
    let (code, closed) = refusal(&mut fifth, T).await;
    assert_eq!(code, Some(ErrorCode::BUSY));
    assert!(closed);
    // Through the client as well: a clear, retryable BUSY.
    let r = ferry_net::client::list(&server.client(), "/", &ferry_core::NoReporter).await;
    assert_eq!(code_of(&r), Some(ErrorCode::BUSY), "{r:?}");
    assert!(r.unwrap_err().is_retryable());

    // Two close, two are dropped by the server's handshake timeout.
    idle.truncate(2);
    for raw in &mut idle {
        let (code, closed) = refusal(raw, Duration::from_secs(6)).await;
        assert!(closed && code.is_none());
    }
    drop(idle);
    let src = tempfile::tempdir().unwrap();
    let file = src.path().join("after.bin");
    write(&file, &bytes(200_000, 3));
    let mut cfg = server.client();
    cfg.opts.streams = 2;
    let r = put_past_busy(&cfg, &file, 20, Duration::from_millis(50))
        .await
        .unwrap();
    assert!(r.is_success(), "{:?}", r.errors);
    assert_eq!(
        std::fs::read(server.root.join("after.bin")).unwrap(),
        bytes(200_000, 3)
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_cap_counts_data_connections() {
    // Two slots: a session's control and data connection fill them; a third is refused.
    let server = TestServer::start_with(|c| c.max_connections = 2).await;
    let (_c, _d, _, _) = raw_put(&server, "/").await;
    let mut third = Raw::connect(server.addr).await;
    let (code, closed) = refusal(&mut third, T).await;
    assert_eq!(code, Some(ErrorCode::BUSY), "closed={closed}");
    server.stop().await;
}
