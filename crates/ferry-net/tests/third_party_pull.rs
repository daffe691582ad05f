//! Pulled third-party copies: the destination B gets from a source endpoint of three servers
//! over one shared file system (A1 coordinates, A2 and A3 send blocks of large files), for a
//! client that holds only control sessions. The source hosts each mint a read grant: A1's good
//! for one get of the copy's one path, A2's and A3's for one stripe read session of it, and
//! nothing else. A single source host is pulled the same way (`copy::pull`).

use crate::util;

use std::path::{Path, PathBuf};
use std::time::Duration;

use ferry_net::copy::{copy, pull, CopyConfig, CopyReport};
use ferry_net::{ClientConfig, Security, ServerTrust, SessionError, StripeHost};
use ferry_proto::{ErrorCode, ExistingPolicy, Frame};
use util::*;

/// A1, A2, A3 rooted at one shared directory (A2 and A3 take stripe sessions unless
/// `stripe_hosts` is false) and B on its own root; all take part in third-party copies unless
/// `b_third_party` is false for B.
async fn bed(
    stripe_hosts: bool,
    b_third_party: bool,
) -> (tempfile::TempDir, PathBuf, Vec<TestServer>, TestServer) {
    let shared = tempfile::tempdir().unwrap();
    let root = shared.path().join("fs");
    std::fs::create_dir_all(&root).unwrap();
    let mut sources = Vec::new();
    for i in 0..3 {
        let root = root.clone();
        sources.push(
            TestServer::start_with(move |c| {
                c.root = root;
                c.third_party = true;
                c.stripe = i > 0 && stripe_hosts;
            })
            .await,
        );
    }
    let b = TestServer::start_with(|c| c.third_party = b_third_party).await;
    (shared, root, sources, b)
}

fn pinned(s: &TestServer) -> StripeHost {
    StripeHost {
        server: s.addr.to_string(),
        security: Security::Tls(ServerTrust::Pinned(s.fingerprint.unwrap())),
        token: None,
    }
}

/// A copy from the endpoint A1 (striped over A2 and A3) into B.
fn from_endpoint(sources: &[TestServer], b: &TestServer) -> CopyConfig {
    let mut source = sources[0].client();
    source.opts.block_size = 256 << 10;
    source.stripe = sources[1..].iter().map(pinned).collect();
    CopyConfig {
        source,
        dest: b.client(),
        dest_addr: None,
    }
}

fn b3(path: &Path) -> blake3::Hash {
    blake3::hash(&std::fs::read(path).unwrap())
}

/// What each source stripe host did, as B's get reported it: (blocks, failed).
fn stripes(report: &CopyReport) -> Vec<(u64, bool)> {
    report.source_report["stripes"]
        .as_array()
        .expect("the destination's get reports the source's stripe hosts")
        .iter()
        .map(|s| (s["blocks"].as_u64().unwrap(), !s["failed"].is_null()))
        .collect()
}

fn code_of<T: std::fmt::Debug>(r: Result<T, SessionError>) -> ErrorCode {
    match r {
        Err(SessionError::Remote { code, .. }) => code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_from_a_source_endpoint_of_a_file_and_a_tree_is_byte_identical_and_striped() {
    let (_shared, root, sources, b) = bed(true, true).await;
    let data = bytes(24 << 20, 5);
    write(&root.join("big.bin"), &data);
    let cfg = from_endpoint(&sources, &b);
    let report = copy(&cfg, "/big.bin", "/in/", reporter())
        .await
        .expect("pulled striped copy");
    assert!(report.is_success(), "{report:?}");
    assert_eq!((report.files, report.bytes), (1, data.len() as u64));
    assert_eq!(b3(&b.root.join("in/big.bin")), blake3::hash(&data));
    assert!(leftovers(&b.root).is_empty(), "{:?}", leftovers(&b.root));
    let hosts = stripes(&report);
    assert_eq!(hosts.len(), 2);
    // Which host takes how many is a race on loopback (a host whose connections open last
    // under load may find none left of 24 blocks): none failed, and together they carried.
    assert!(hosts.iter().all(|(_, failed)| !failed), "{hosts:?}");
    assert!(hosts.iter().map(|(b, _)| b).sum::<u64>() > 0, "{hosts:?}");
    // The coordinator did not send it all: B's get says how much its connections carried.
    let coordinator: u64 = report.source_report["streams"]
        .as_array()
        .expect("the get's streams")
        .iter()
        .map(|s| s["bytes"].as_u64().unwrap())
        .sum();
    assert!(coordinator < data.len() as u64, "{coordinator}");

    let tree = root.join("run");
    write(&tree.join("big.bin"), &bytes(16 << 20, 1));
    write(&tree.join("sub/mid.bin"), &bytes((3 << 20) + 4321, 2));
    for i in 0..20 {
        write(
            &tree.join(format!("sub/small{i}")),
            &bytes(1000 + i * 977, 3 + i as u64),
        );
    }
    write(&tree.join("empty"), &[]);
    std::os::unix::fs::symlink("sub/mid.bin", tree.join("link")).unwrap();
    let report = copy(&cfg, "/run", "/in", reporter())
        .await
        .expect("pulled striped copy of a tree");
    assert!(report.is_success(), "{report:?}");
    assert_eq!(report.files, 23, "22 files and the empty one");
    assert_eq!(snapshot(&tree), snapshot(&b.root.join("in/run")));
    assert!(leftovers(&b.root).is_empty(), "{:?}", leftovers(&b.root));
    let hosts = stripes(&report);
    assert!(hosts.iter().all(|(b, f)| *b > 0 && !f), "{hosts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_from_a_source_endpoint_completes_byte_identical_when_a_source_host_dies() {
    let (_shared, root, mut sources, b) = bed(true, true).await;
    let data = bytes(64 << 20, 9);
    write(&root.join("f"), &data);
    let mut cfg = from_endpoint(&sources, &b);
    cfg.source.opts.streams = 2;
    let run = {
        let cfg = cfg.clone();
        tokio::spawn(async move { copy(&cfg, "/f", "/in/", reporter()).await })
    };
    // Kill A3 once B opened the file's partial copy: its stripe read session is open then,
    // and blocks are asked of it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while leftovers(&b.root).is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the copy did not start"
        );
        assert!(!run.is_finished(), "the copy ended before the kill");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    sources[2].kill();
    let report = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the copy ends")
        .unwrap()
        .expect("the copy completes without the dead host");
    assert!(report.is_success(), "{report:?}");
    assert_eq!(b3(&b.root.join("in/f")), blake3::hash(&data));
    assert!(leftovers(&b.root).is_empty(), "{:?}", leftovers(&b.root));
    let hosts = stripes(&report);
    assert_eq!((hosts[0].1, hosts[1].1), (false, true), "{hosts:?}");
}

/// A read grant from `host` for `src` (`stripe`: a stripe read grant), minted over a raw
/// session (kept open: closing it revokes the grant).
async fn mint_read(host: &TestServer, src: &str, stripe: bool) -> (Raw, Result<String, ErrorCode>) {
    let (mut c, _, _) = control(host).await;
    let ask = Frame::ReadGrantRequest {
        src: src.into(),
        stripe,
    };
    c.send(&ask).await.unwrap();
    match c.expect(T).await {
        Frame::Granted { grant, .. } => (c, Ok(grant)),
        Frame::Error { code, .. } => (c, Err(code)),
        other => panic!("expected Granted, got {other:?}"),
    }
}

/// A raw session logged in with `grant`, once the session refused before it has let go of
/// the grant (it is used by one session at a time; a refused one ends a moment after its
/// `Error`).
async fn logged_in(host: &TestServer, grant: &str) -> Raw {
    for _ in 0..100 {
        let mut c = Raw::connect(host.addr).await;
        c.send(&hello_control(grant)).await.unwrap();
        match c.expect(T).await {
            Frame::Welcome { .. } => return c,
            Frame::Error { code, .. } if code == ErrorCode::BUSY => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => panic!("expected Welcome, got {other:?}"),
        }
    }
    panic!("the grant stayed in use");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_grant_is_good_for_one_get_of_its_path_only() {
    let (_shared, root, sources, _b) = bed(true, true).await;
    let a = &sources[0];
    write(&root.join("data/x"), &bytes(3 << 20, 7));
    write(&root.join("other/y"), &bytes(1 << 20, 8));
    let (minting, grant) = mint_read(a, "/data", false).await;
    let grant = grant.expect("A1 mints a read grant");
    let with = |token: &str| ClientConfig {
        token: token.to_owned(),
        ..a.client()
    };
    let local = tempfile::tempdir().unwrap();
    let get = |cfg: ClientConfig, src: &'static str| {
        let dest = local.path().to_owned();
        async move { ferry_net::client::get(&cfg, src, &dest, reporter()).await }
    };
    // Another path, even below its own: denied, named.
    assert_eq!(
        code_of(get(with(&grant), "/other").await),
        ErrorCode::DENIED
    );
    assert_eq!(
        code_of(get(with(&grant), "/data/x").await),
        ErrorCode::DENIED
    );
    // Writing with it: denied.
    let file = local.path().join("up");
    write(&file, &bytes(1 << 20, 9));
    let put = ferry_net::client::put(&with(&grant), &[file], "/data/", reporter()).await;
    assert_eq!(code_of(put), ErrorCode::DENIED);
    // Nor does it list, or mint a grant.
    for ask in [
        Frame::ListRequest {
            path: "/data".into(),
        },
        Frame::ReadGrantRequest {
            src: "/data".into(),
            stripe: false,
        },
    ] {
        let mut c = logged_in(a, &grant).await;
        c.send(&ask).await.unwrap();
        match c.expect(T).await {
            Frame::Error { code, .. } => assert_eq!(code, ErrorCode::DENIED, "{ask:?}"),
            other => panic!("expected a refusal of {ask:?}, got {other:?}"),
        }
    }
    // Presented to another host of the same file system: unknown there.
    let elsewhere = ClientConfig {
        token: grant.clone(),
        ..sources[1].client()
    };
    assert_eq!(code_of(get(elsewhere, "/data").await), ErrorCode::AUTH);
    // Its own path: one get, which spends it (once the refused sessions let go of it).
    drop(logged_in(a, &grant).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let report = get(with(&grant), "/data").await.expect("its own path");
    assert!(report.is_success(), "{:?}", report.errors);
    assert_eq!(b3(&local.path().join("data/x")), b3(&root.join("data/x")));
    assert_eq!(
        code_of(get(with(&grant), "/data").await),
        ErrorCode::AUTH,
        "spent"
    );
    drop(minting);
    // Replayed after its minting session closed: revoked.
    let (minting, grant) = mint_read(a, "/data", false).await;
    let grant = grant.unwrap();
    drop(minting);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(code_of(get(with(&grant), "/data").await), ErrorCode::AUTH);
    // A stripe read grant is no grant for a get.
    let (_minting, stripe) = mint_read(&sources[1], "/data", true).await;
    let stripe = stripe.expect("A2 mints a stripe read grant");
    let as_get = ClientConfig {
        token: stripe,
        ..sources[1].client()
    };
    assert_eq!(code_of(get(as_get, "/data").await), ErrorCode::DENIED);
    // A host without --stripe mints no stripe read grant; a write grant is no read grant.
    let (_c, refused) = mint_read(a, "/data", true).await;
    assert_eq!(refused, Err(ErrorCode::DENIED));
    let (mut c, _, _) = control(a).await;
    c.send(&Frame::GrantRequest {
        dest: "/in/".into(),
        existing: ExistingPolicy::Fail,
    })
    .await
    .unwrap();
    let write_grant = match c.expect(T).await {
        Frame::Granted { grant, .. } => grant,
        other => panic!("expected Granted, got {other:?}"),
    };
    assert_eq!(
        code_of(get(with(&write_grant), "/data").await),
        ErrorCode::DENIED
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pulled_copy_is_refused_before_data_moves_where_a_server_cannot_take_part() {
    let nothing_at = |b: &TestServer| {
        assert!(
            snapshot(&b.root).is_empty(),
            "nothing written: {:?}",
            snapshot(&b.root)
        );
    };
    // Source hosts without --stripe.
    let (_shared, root, sources, b) = bed(false, true).await;
    write(&root.join("f"), &bytes(4 << 20, 3));
    let e = copy(&from_endpoint(&sources, &b), "/f", "/in/", reporter()).await;
    let message = format!("{e:?}");
    assert_eq!(code_of(e), ErrorCode::DENIED);
    assert!(message.contains("stripe host"), "{message}");
    nothing_at(&b);
    // A destination without --third-party: says how to allow it.
    let (_shared, root, sources, b) = bed(true, false).await;
    write(&root.join("f"), &bytes(4 << 20, 3));
    let e = copy(&from_endpoint(&sources, &b), "/f", "/in/", reporter()).await;
    let message = format!("{e:?}");
    assert_eq!(code_of(e), ErrorCode::DENIED);
    assert!(message.contains("--third-party"), "{message}");
    nothing_at(&b);
    // A source and a destination both of several hosts: refused, saying so.
    let (_shared, root, sources, b) = bed(true, true).await;
    write(&root.join("f"), &bytes(4 << 20, 3));
    let mut cfg = from_endpoint(&sources, &b);
    cfg.dest.stripe = vec![pinned(&sources[1])];
    let e = copy(&cfg, "/f", "/in/", reporter()).await.unwrap_err();
    assert!(e.to_string().contains("not both yet"), "{e}");
    nothing_at(&b);
    // A source that does not exist: the destination's get fails, nothing is written.
    let cfg = from_endpoint(&sources, &b);
    let e = copy(&cfg, "/missing", "/in/", reporter()).await;
    assert!(e.is_err(), "{e:?}");
    nothing_at(&b);
}

/// Cuts a pulled copy from one source host by dropping its client once a third of the file
/// crossed (B's get is dropped on its next progress tick, the read grant revoked), then runs
/// it again: it completes identical, carrying well under the whole file.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pulled_copy_from_one_host_resumes_when_run_again() {
    let a = TestServer::start_with(|c| c.third_party = true).await;
    let b = TestServer::start_with(|c| c.third_party = true).await;
    let data = bytes(24 << 20, 42);
    write(&a.root.join("big"), &data);
    // B and the client reach A through a relay paced to 8 MB/s, so that the copy is under
    // way when the cut comes.
    let paced = Relay::start(a.addr, Some(8 << 20)).await;
    let via = |relay: &Relay| {
        let mut source = a.client();
        source.server = relay.addr.to_string();
        CopyConfig {
            source,
            dest: b.client(),
            dest_addr: None,
        }
    };
    let cfg = via(&paced);
    let first = tokio::spawn(async move { pull(&cfg, "/big", "/", reporter()).await });
    for _ in 0..200 {
        if paced.bytes() > (8 << 20) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(paced.bytes() > (8 << 20), "the copy got under way");
    first.abort();
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
    assert!(!b.root.join("big").exists(), "nothing under the final name");
    let counted = Relay::start(a.addr, None).await;
    let report = pull(&via(&counted), "/big", "/", reporter())
        .await
        .expect("rerun");
    assert!(report.is_success(), "{report:?}");
    assert_eq!(std::fs::read(b.root.join("big")).unwrap(), data);
    assert!(leftovers(&b.root).is_empty());
    let resent = counted.bytes();
    assert!(
        resent < data.len() as u64 * 3 / 4,
        "the rerun carried {resent} bytes of {}: it did not resume",
        data.len()
    );
}

/// A pulled copy of a tree of 300 one-block files from the endpoint: B's get stripes them
/// whole (`STRIPE_DIGEST`), every source stripe host sends files, and the tree arrives
/// byte-identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pulled_copy_of_small_files_has_every_source_host_send_files() {
    let (_shared, root, sources, b) = bed(true, true).await;
    let tree = root.join("small");
    for i in 0..300u64 {
        let size = (1 << 10) + (i * 7919) % (63 << 10);
        write(
            &tree.join(format!("d{}/s{i}", i % 7)),
            &bytes(size as usize, 300 + i),
        );
    }
    let mut cfg = from_endpoint(&sources, &b);
    cfg.source.opts.streams = 2;
    let report = copy(&cfg, "/small", "/in/", reporter())
        .await
        .expect("pulled striped copy of small files");
    assert!(report.is_success(), "{report:?}");
    assert_eq!(report.files, 300);
    assert_eq!(snapshot(&tree), snapshot(&b.root.join("in/small")));
    assert!(leftovers(&b.root).is_empty(), "{:?}", leftovers(&b.root));
    let hosts = stripes(&report);
    assert_eq!(hosts.len(), 2);
    assert!(hosts.iter().all(|(b, f)| *b >= 10 && !f), "{hosts:?}");
}
