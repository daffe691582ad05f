//! Third-party copies: server A puts into server B for a client that holds only a control
//! session to each. The tree arrives identical, the client's connections carry control frames
//! only, B's grant is good for one transfer into one path, and a copy cut by A's death resumes
//! when the client runs it again.

use crate::util;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use ferry_net::copy::{copy, CopyConfig};
use ferry_net::{ClientConfig, SessionError};
use ferry_proto::ExistingPolicy;
use ferry_proto::{ErrorCode, Frame};
use util::*;

fn third_party(c: &mut ferry_net::ServerConfig) {
    c.third_party = true;
}

/// The copy's configuration: the client reaches each server at `*_via` (a counting relay, or
/// the server itself); A reaches B directly.
fn copy_config(a: &TestServer, b: &TestServer, a_via: SocketAddr, b_via: SocketAddr) -> CopyConfig {
    let mut source = a.client();
    source.server = a_via.to_string();
    let mut dest = b.client();
    dest.server = b_via.to_string();
    CopyConfig {
        source,
        dest,
        dest_addr: Some(b.addr.to_string()),
    }
}

/// A tree of `files` files of `size` bytes under `root/name`, plus a subdirectory and a link.
fn tree(root: &Path, name: &str, files: usize, size: usize) -> u64 {
    let top = root.join(name);
    std::fs::create_dir_all(top.join("sub")).unwrap();
    let mut total = 0;
    for i in 0..files {
        let dir = if i % 2 == 0 {
            top.clone()
        } else {
            top.join("sub")
        };
        let data = bytes(size + i * 1000, i as u64 + 1);
        total += data.len() as u64;
        write(&dir.join(format!("f{i}")), &data);
    }
    write(&top.join("empty"), &[]);
    std::os::unix::fs::symlink("sub/f1", top.join("link")).unwrap();
    total
}

#[tokio::test]
async fn a_tree_copied_between_two_servers_is_identical_and_only_control_crosses_the_client() {
    let a = TestServer::start_with(third_party).await;
    let b = TestServer::start_with(third_party).await;
    let total = tree(&a.root, "run42", 12, 2 << 20);
    std::fs::create_dir(b.root.join("incoming")).unwrap();
    let (to_a, to_b) = (
        Relay::start(a.addr, None).await,
        Relay::start(b.addr, None).await,
    );
    let cfg = copy_config(&a, &b, to_a.addr, to_b.addr);
    let report = copy(&cfg, "/run42", "/incoming/", reporter())
        .await
        .expect("copy");
    assert!(report.is_success(), "{report:?}");
    assert_eq!(
        report.files, 13,
        "12 files and the empty one, as B counts them"
    );
    assert_eq!(report.bytes, total);
    assert_eq!(
        snapshot(&a.root.join("run42")),
        snapshot(&b.root.join("incoming/run42"))
    );
    assert!(leftovers(&b.root).is_empty());
    // The client's two connections carried the handshakes, the requests and progress: under
    // 1% of the data, which went from A to B.
    let control = to_a.bytes() + to_b.bytes();
    assert!(
        control * 100 < total,
        "the client's connections carried {control} bytes for {total} of data"
    );
    assert_eq!(report.source_report["direction"], "put");
    assert_eq!(
        report.destination_fingerprint,
        b.fingerprint.unwrap().to_string()
    );
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

/// A client of B that logs in with `grant` instead of a token.
fn with_grant(b: &TestServer, grant: &str) -> ClientConfig {
    let mut c = b.client();
    c.token = grant.to_owned();
    c
}

fn code_of(r: Result<ferry_net::TransferReport, SessionError>) -> ErrorCode {
    match r {
        Err(SessionError::Remote { code, .. }) => code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn a_grant_is_refused_when_replayed_expired_revoked_or_used_for_another_path() {
    let b = TestServer::start_with(|c| {
        c.third_party = true;
        c.grant_ttl = Duration::from_millis(400);
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("x");
    write(&file, &bytes(100_000, 7));
    let put = |cfg: ClientConfig, dest: &'static str| {
        let file = file.clone();
        async move { ferry_net::client::put(&cfg, &[file], dest, reporter()).await }
    };

    // Another path than the grant's: denied, and the grant stays good for its own.
    let (mut minting, grant) = mint(&b, "/in/x").await;
    assert_eq!(
        code_of(put(with_grant(&b, &grant), "/other").await),
        ErrorCode::DENIED
    );
    let get = ferry_net::client::get(&with_grant(&b, &grant), "/in", dir.path(), reporter()).await;
    assert_eq!(code_of(get), ErrorCode::DENIED, "a grant reads nothing");
    let report = put(with_grant(&b, &grant), "/in/x")
        .await
        .expect("its own path");
    assert_eq!(report.files, 1);
    assert_eq!(
        std::fs::read(b.root.join("in/x")).unwrap(),
        std::fs::read(&file).unwrap()
    );
    // B tells the minting session itself that the put completed.
    match minting.expect(T).await {
        Frame::Complete(summary) => assert_eq!((summary.files, summary.bytes), (1, 100_000)),
        other => panic!("expected Complete, got {other:?}"),
    }
    // Replayed after it completed: spent.
    assert_eq!(
        code_of(put(with_grant(&b, &grant), "/in/x").await),
        ErrorCode::AUTH
    );

    // Expired: not used within its time to live; the minting session is told and ends.
    let (mut minting, grant) = mint(&b, "/in/y").await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        code_of(put(with_grant(&b, &grant), "/in/y").await),
        ErrorCode::AUTH
    );
    let (refused, closed) = refusal(&mut minting, T).await;
    assert_eq!((refused, closed), (Some(ErrorCode::TIMEOUT), true));

    // Revoked: the client closed the session that minted it.
    let (minting, grant) = mint(&b, "/in/z").await;
    drop(minting);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        code_of(put(with_grant(&b, &grant), "/in/z").await),
        ErrorCode::AUTH
    );
    assert!(!b.root.join("in/y").exists() && !b.root.join("in/z").exists());

    // A grant outside the minting token's scope is never minted: a put of the wrong path
    // was refused above; a forged grant is a wrong token.
    let forged = format!("ferry-grant:{}.{}", "0".repeat(32), "0".repeat(64));
    assert_eq!(
        code_of(put(with_grant(&b, &forged), "/in/x").await),
        ErrorCode::AUTH
    );
}

#[tokio::test]
async fn servers_without_third_party_refuse_a_copy_and_say_how_to_allow_it() {
    let plain_a = TestServer::start().await;
    let b = TestServer::start_with(third_party).await;
    tree(&plain_a.root, "t", 1, 1000);
    let cfg = copy_config(&plain_a, &b, plain_a.addr, b.addr);
    let err = copy(&cfg, "/t", "/", reporter()).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("--third-party") && text.contains("source"),
        "{text}"
    );

    let a = TestServer::start_with(third_party).await;
    let plain_b = TestServer::start().await;
    tree(&a.root, "t", 1, 1000);
    let cfg = copy_config(&a, &plain_b, a.addr, plain_b.addr);
    let err = copy(&cfg, "/t", "/", reporter()).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("--third-party") && text.contains("destination"),
        "{text}"
    );
    assert!(!plain_b.root.join("t").exists());
}

/// Which party of a copy dies mid-way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dies {
    Source,
    Destination,
    Client,
}

/// A server over `root` (kept across its restarts) that takes part in third-party copies.
async fn start_over(root: &Path) -> TestServer {
    let root = root.to_path_buf();
    TestServer::start_in(tempfile::tempdir().unwrap(), |c| {
        c.root = root;
        c.third_party = true;
    })
    .await
}

/// Cuts a copy by killing `who` once the destination holds a third of the file (its tasks
/// end at once, as in a kill -9 of its process; for the client, the copy's future is dropped
/// with its connections), restarts it, and runs the copy again: it must complete, identical,
/// carrying well under the whole file between the servers.
async fn cut_and_resume(who: Dies) {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a_root, b_root) = (dirs.0.path().to_path_buf(), dirs.1.path().to_path_buf());
    let data = bytes(24 << 20, 42);
    write(&a_root.join("big"), &data);
    let (mut a, mut b) = (start_over(&a_root).await, start_over(&b_root).await);
    // A reaches B through a relay paced to 8 MB/s, so that the copy is under way when the
    // cut comes.
    let paced = Relay::start(b.addr, Some(8 << 20)).await;
    let mut cfg = copy_config(&a, &b, a.addr, b.addr);
    cfg.dest_addr = Some(paced.addr.to_string());
    let first = tokio::spawn(async move { copy(&cfg, "/big", "/", reporter()).await });
    for _ in 0..200 {
        if paced.bytes() > (8 << 20) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(paced.bytes() > (8 << 20), "the copy got under way");
    match who {
        Dies::Source => a.kill(),
        Dies::Destination => b.kill(),
        Dies::Client => first.abort(),
    }
    if who == Dies::Client {
        // The source notices on its next progress tick and drops its put; both servers
        // go idle.
        let idle = |s: &TestServer| s.idle.idle_for() > Duration::ZERO;
        for _ in 0..100 {
            if idle(&a) && idle(&b) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            idle(&a) && idle(&b),
            "a copy whose client left ends on both servers"
        );
    } else {
        let first = tokio::time::timeout(Duration::from_secs(20), first)
            .await
            .expect("the client notices")
            .unwrap();
        assert!(first.is_err(), "the first run fails when {who:?} dies");
    }
    assert!(
        !b_root.join("big").exists(),
        "nothing under the final name yet"
    );
    match who {
        Dies::Source => a = start_over(&a_root).await,
        Dies::Destination => b = start_over(&b_root).await,
        Dies::Client => {}
    }
    let counted = Relay::start(b.addr, None).await;
    let mut cfg = copy_config(&a, &b, a.addr, b.addr);
    cfg.dest_addr = Some(counted.addr.to_string());
    let report = copy(&cfg, "/big", "/", reporter()).await.expect("rerun");
    assert!(report.is_success(), "{report:?}");
    assert_eq!(std::fs::read(b_root.join("big")).unwrap(), data);
    assert!(leftovers(&b_root).is_empty());
    let resent = counted.bytes();
    assert!(
        resent < data.len() as u64 * 3 / 4,
        "the rerun after {who:?} died carried {resent} bytes of {}: it did not resume",
        data.len()
    );
}

#[tokio::test]
async fn a_copy_cut_by_the_death_of_its_source_resumes_when_run_again() {
    cut_and_resume(Dies::Source).await;
}

#[tokio::test]
async fn a_copy_cut_by_the_death_of_its_destination_resumes_when_run_again() {
    cut_and_resume(Dies::Destination).await;
}

#[tokio::test]
async fn a_copy_whose_client_dies_ends_on_both_servers_and_resumes_when_run_again() {
    cut_and_resume(Dies::Client).await;
}
