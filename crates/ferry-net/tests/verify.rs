//! `ferry verify` over the wire (issue 39): the server re-reads and re-hashes what it holds,
//! marks its replicas, reports files behind ferry's back, under the read scope and its pace.

use crate::util;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_catalog::{Catalog, Location};
use ferry_core::NoReporter;
use ferry_net::access::{self, Access};
use ferry_net::catalog::{self as cat, Verified};
use ferry_net::{ClientConfig, SessionError};
use ferry_proto::{ErrorCode, Problem, ReplicaHealth};
use util::*;

const R: &NoReporter = &NoReporter;

fn memory_catalog() -> Arc<Catalog> {
    Arc::new(Catalog::open(&Location::Memory, "test").unwrap())
}

fn code<T: std::fmt::Debug>(r: Result<T, SessionError>) -> ErrorCode {
    match r {
        Err(SessionError::Remote { code, .. }) => code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Puts `tree/` (`a.dat`, `b.txt`, `sub/c.dat`) from `src` to `dest`.
async fn put_from(cfg: &ClientConfig, src: &Path, dest: &str) {
    let r = ferry_net::client::put(cfg, &[src.join("tree")], dest, reporter())
        .await
        .unwrap();
    assert!(r.is_success(), "{r:?}");
}

fn tree(src: &Path) {
    write(&src.join("tree/a.dat"), &bytes(3000, 1));
    write(&src.join("tree/b.txt"), &bytes(10, 2));
    write(&src.join("tree/sub/c.dat"), &bytes(50_000, 3));
}

async fn verify(cfg: &ClientConfig, path: &str, recursive: bool) -> Verified {
    cat::verify(cfg, path, recursive, R).await.unwrap()
}

/// Flips bytes in the middle of a file, keeping its size and mtime.
fn flip(path: &Path) {
    let mtime = std::fs::metadata(path).unwrap().modified().unwrap();
    let mut data = std::fs::read(path).unwrap();
    data[100] ^= 0xFF;
    data[101] ^= 0x0F;
    std::fs::write(path, &data).unwrap();
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(mtime).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_finds_bad_missing_and_unregistered_files() {
    let catalog = memory_catalog();
    let c2 = catalog.clone();
    let server = TestServer::start_with(move |c| c.catalog = Some(c2)).await;
    let cfg = server.client();
    let src = tempfile::tempdir().unwrap();
    tree(src.path());
    put_from(&cfg, src.path(), "/in/").await;

    // All good: every registered file read whole.
    let v = verify(&cfg, "/in", false).await;
    assert!(v.clean(), "{v:?}");
    assert_eq!((v.counts.checked, v.counts.good), (3, 3));
    assert_eq!(v.counts.bytes, 53_010);
    assert!(v.problems.is_empty() && !v.more);

    // Bytes changed behind ferry's back, size and mtime kept: bad, and marked so.
    let a = server.root.join("in/tree/a.dat");
    flip(&a);
    let v = verify(&cfg, "/in/tree", false).await;
    assert_eq!((v.counts.checked, v.counts.good, v.counts.bad), (3, 2, 1));
    assert_eq!(v.problems, [(Problem::Bad, "in/tree/a.dat".to_owned())]);
    let s = cat::stat(&cfg, "/in/tree/a.dat", R).await.unwrap();
    assert_eq!(s.replicas[0].state, ReplicaHealth::Bad);
    // A single file is verified alone.
    let v = verify(&cfg, "/in/tree/a.dat", false).await;
    assert_eq!((v.counts.checked, v.counts.bad), (1, 1));

    // A re-put (over what is there) stores the file again: good at the next verify.
    let mut over = cfg.clone();
    over.opts.existing = ferry_proto::ExistingPolicy::Overwrite;
    put_from(&over, src.path(), "/in/").await;
    assert_eq!(std::fs::read(&a).unwrap(), bytes(3000, 1));
    let v = verify(&cfg, "/in", false).await;
    assert!(v.clean(), "{v:?}");
    let s = cat::stat(&cfg, "/in/tree/a.dat", R).await.unwrap();
    assert_eq!(s.replicas[0].state, ReplicaHealth::Good);

    // Removed behind ferry's back: missing (its replica bad); a file that appeared is
    // reported only when the tree is walked; ferry's own partial files are not.
    std::fs::remove_file(server.root.join("in/tree/b.txt")).unwrap();
    write(&server.root.join("in/tree/sub/new.dat"), b"new");
    write(&server.root.join("in/tree/.ferry-0001-1.part"), b"partial");
    let v = verify(&cfg, "/in", false).await;
    assert_eq!((v.counts.missing, v.counts.unregistered), (1, 0));
    assert_eq!(v.problems, [(Problem::Missing, "in/tree/b.txt".to_owned())]);
    let s = cat::stat(&cfg, "/in/tree/b.txt", R).await.unwrap();
    assert_eq!(s.replicas[0].state, ReplicaHealth::Bad);
    let v = verify(&cfg, "/in", true).await;
    assert_eq!((v.counts.checked, v.counts.good), (3, 2));
    assert_eq!((v.counts.missing, v.counts.unregistered), (1, 1));
    assert_eq!(
        v.problems,
        [
            (Problem::Missing, "in/tree/b.txt".to_owned()),
            (Problem::Unregistered, "in/tree/sub/new.dat".to_owned()),
        ]
    );
    assert!(!v.clean());
    // Not registered: left so.
    assert!(!catalog.is_registered("in/tree/sub/new.dat").unwrap());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_needs_the_read_scope_and_a_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    let reader = access::add_token(&tokens, "reader", vec!["/pub".into()], vec![], true).unwrap();
    let admin = access::add_token(&tokens, "admin", vec![], vec![], false).unwrap();
    let catalog = memory_catalog();
    let server = TestServer::start_with(move |c| {
        c.access = Arc::new(Access::file(&tokens));
        c.catalog = Some(catalog);
    })
    .await;
    let mut cfg = server.client();
    cfg.token = admin;
    let src = tempfile::tempdir().unwrap();
    tree(src.path());
    put_from(&cfg, src.path(), "/pub/").await;
    put_from(&cfg, src.path(), "/priv/").await;
    cfg.token = reader;
    let v = verify(&cfg, "/pub", true).await;
    assert_eq!((v.counts.checked, v.counts.good), (3, 3));
    for path in ["/priv", "/", "/priv/tree/a.dat"] {
        let r = cat::verify(&cfg, path, true, R).await;
        assert_eq!(code(r), ErrorCode::DENIED, "{path}");
    }
    server.stop().await;

    let bare = TestServer::start().await;
    let r = cat::verify(&bare.client(), "/", false, R).await;
    assert_eq!(code(r), ErrorCode::BAD_REQUEST);
    bare.stop().await;
}

/// At R MiB/s, N MiB take about N/R seconds; progress frames keep a client whose idle
/// timeout is shorter than the audit waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_keeps_to_its_pace_and_reports_progress() {
    let catalog = memory_catalog();
    let server = TestServer::start_with(move |c| {
        c.catalog = Some(catalog);
        c.verify_rate = 4 << 20;
        c.idle_timeout = Duration::from_secs(1);
    })
    .await;
    let mut cfg = server.client();
    let src = tempfile::tempdir().unwrap();
    write(&src.path().join("big/one.dat"), &bytes(8 << 20, 7));
    let r = ferry_net::client::put(&cfg, &[src.path().join("big")], "/", reporter())
        .await
        .unwrap();
    assert!(r.is_success(), "{r:?}");
    cfg.idle_timeout = Duration::from_secs(1);
    let started = Instant::now();
    let v = verify(&cfg, "/big", false).await;
    let took = started.elapsed();
    assert!(v.clean(), "{v:?}");
    assert_eq!(v.counts.bytes, 8 << 20);
    // 8 MiB at 4 MiB/s: 2 s, the first MiB free.
    assert!(took >= Duration::from_millis(1500), "{took:?}");
    server.stop().await;
}

/// A verify whose client goes away ends its session (and its reading) at once, not when the
/// audit would have finished; so does one the server's shutdown ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_stops_with_its_session() {
    let catalog = memory_catalog();
    let server = TestServer::start_with(move |c| {
        c.catalog = Some(catalog);
        c.verify_rate = 1 << 20;
        c.idle_timeout = Duration::from_secs(1);
    })
    .await;
    let cfg = server.client();
    let src = tempfile::tempdir().unwrap();
    write(&src.path().join("big/one.dat"), &bytes(16 << 20, 5));
    let r = ferry_net::client::put(&cfg, &[src.path().join("big")], "/", reporter())
        .await
        .unwrap();
    assert!(r.is_success(), "{r:?}");
    // 16 s of reading at 1 MiB/s; the client leaves after half a second.
    let gone = tokio::time::timeout(
        Duration::from_millis(500),
        cat::verify(&cfg, "/big", false, R),
    );
    assert!(gone.await.is_err(), "the verify cannot be done yet");
    let started = Instant::now();
    while server.idle.idle_for() == Duration::ZERO {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the session outlived its client"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The server's shutdown ends one in flight too.
    let c2 = cfg.clone();
    let running = tokio::spawn(async move { cat::verify(&c2, "/big", false, R).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    server.stop().await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(running.await.unwrap().is_err());
}
