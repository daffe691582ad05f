//! Striped gets: one endpoint made of several servers over one shared file system. The first
//! server coordinates (walks, offers, reads and hashes every file); the client fetches most
//! blocks of large files from the others, and when one dies its blocks come from the rest.

use crate::util;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferry_net::{Security, ServerTrust, StripeHost};
use util::*;

/// Three servers on 127.0.0.1, each on its own port, all rooted at one directory (the shared
/// file system); the second and third take stripe sessions.
async fn three_hosts() -> (tempfile::TempDir, PathBuf, Vec<TestServer>) {
    let shared = tempfile::tempdir().unwrap();
    let root = shared.path().join("fs");
    std::fs::create_dir(&root).unwrap();
    let mut servers = Vec::new();
    for i in 0..3 {
        let root = root.clone();
        servers.push(
            TestServer::start_with(move |c| {
                c.root = root;
                c.stripe = i > 0;
            })
            .await,
        );
    }
    (shared, root, servers)
}

/// A client of the first server that stripes over the others, each pinned by its own key.
fn striped(servers: &[TestServer]) -> ferry_net::ClientConfig {
    let mut cfg = servers[0].client();
    cfg.opts.block_size = 256 << 10;
    cfg.stripe = servers[1..]
        .iter()
        .map(|s| StripeHost {
            server: s.addr.to_string(),
            security: Security::Tls(ServerTrust::Pinned(s.fingerprint.unwrap())),
            token: None,
        })
        .collect();
    cfg
}

fn b3(path: &Path) -> blake3::Hash {
    blake3::hash(&std::fs::read(path).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_striped_get_of_a_file_and_a_tree_is_byte_identical_and_uses_every_host() {
    let (_shared, root, servers) = three_hosts().await;
    let tree = root.join("tree");
    write(&tree.join("big.bin"), &bytes(16 << 20, 1));
    write(&tree.join("sub/mid.bin"), &bytes((3 << 20) + 4321, 2));
    for i in 0..20 {
        write(
            &tree.join(format!("sub/small{i}")),
            &bytes(1000 + i * 977, 3 + i as u64),
        );
    }
    let cfg = striped(&servers);
    let local = tempfile::tempdir().unwrap();
    // One large file alone.
    let one = ferry_net::client::get(&cfg, "/tree/big.bin", local.path(), reporter())
        .await
        .expect("striped get of one file");
    assert!(one.is_success(), "{:?}", one.errors);
    assert_eq!(b3(&local.path().join("big.bin")), b3(&tree.join("big.bin")));
    // Which host takes how many blocks is their pace's on loopback: their sum.
    for s in &one.stripes {
        assert!(s.failed.is_none(), "{s:?}");
    }
    assert!(one.stripes.iter().map(|s| s.blocks).sum::<u64>() > 0);
    // The coordinator's connections did not carry all of it: the stripe hosts brought the
    // rest.
    let coordinator: u64 = one.streams.iter().map(|s| s.bytes).sum();
    let fetched: u64 = one.stripes.iter().map(|s| s.bytes).sum();
    assert!(coordinator < 16 << 20, "{coordinator} {:?}", one.stripes);
    assert!(coordinator + fetched >= 16 << 20, "{coordinator} {fetched}");
    // A tree: large files striped, small ones from the coordinator.
    let report = ferry_net::client::get(&cfg, "/tree", local.path(), reporter())
        .await
        .expect("striped get of a tree");
    assert!(report.is_success(), "{:?}", report.errors);
    assert_eq!(report.files, 22);
    assert_eq!(snapshot(&local.path().join("tree")), snapshot(&tree));
    assert_eq!(report.stripes.len(), 2);
    for s in &report.stripes {
        assert!(s.failed.is_none(), "{s:?}");
    }
    assert!(report.stripes.iter().map(|s| s.blocks).sum::<u64>() > 0);
    assert!(
        leftovers(local.path()).is_empty(),
        "{:?}",
        leftovers(local.path())
    );
}

/// Counts the bytes the get stores, so the test can act in the middle of it.
#[derive(Default)]
struct Progress(AtomicU64);

impl ferry_core::Reporter for Progress {
    fn on_bytes(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_striped_get_completes_byte_identical_when_a_stripe_host_dies() {
    let (_shared, root, mut servers) = three_hosts().await;
    let total = 48u64 << 20;
    let data = bytes(total as usize, 9);
    write(&root.join("f"), &data);
    let mut cfg = striped(&servers);
    cfg.opts.streams = 2;
    let local = tempfile::tempdir().unwrap();
    let progress = Arc::new(Progress::default());
    let get = {
        let (cfg, dest, progress) = (cfg.clone(), local.path().to_owned(), progress.clone());
        tokio::spawn(async move { ferry_net::client::get(&cfg, "/f", &dest, progress).await })
    };
    // Kill the last host once a quarter of the file is across: it has blocks in flight then.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while progress.0.load(Ordering::Relaxed) < total / 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the get did not start"
        );
        assert!(!get.is_finished(), "the get ended before the kill");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    servers[2].kill();
    let report = tokio::time::timeout(Duration::from_secs(30), get)
        .await
        .expect("the get ends")
        .unwrap()
        .expect("the get completes without the dead host");
    assert!(report.is_success(), "{:?}", report.errors);
    assert_eq!(b3(&local.path().join("f")), blake3::hash(&data));
    assert!(
        leftovers(local.path()).is_empty(),
        "{:?}",
        leftovers(local.path())
    );
    let dead = &report.stripes[1];
    assert!(dead.failed.is_some(), "{dead:?}");
    assert!(
        report.stripes[0].failed.is_none(),
        "{:?}",
        report.stripes[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stripe_read_session_is_refused_without_the_setting_or_outside_the_scope() {
    let (_shared, root, servers) = three_hosts().await;
    write(&root.join("f"), &bytes(1 << 20, 4));
    let local = tempfile::tempdir().unwrap();
    // The coordinator itself takes no stripe sessions.
    let mut cfg = striped(&servers);
    cfg.stripe.push(StripeHost {
        server: servers[0].addr.to_string(),
        security: Security::Tls(ServerTrust::Pinned(servers[0].fingerprint.unwrap())),
        token: None,
    });
    let e = ferry_net::client::get(&cfg, "/f", local.path(), reporter())
        .await
        .expect_err("a host without --stripe refuses");
    assert!(e.to_string().contains("serve --stripe"), "{e}");
    assert!(!local.path().join("f").exists());
    // A raw stripe read request outside the token's read scope.
    let tokens = tempfile::tempdir().unwrap();
    let file = tokens.path().join("tokens.toml");
    let reader =
        ferry_net::access::add_token(&file, "reader", vec!["/pub".into()], vec![], false).unwrap();
    let scoped = TestServer::start_with(|c| {
        c.stripe = true;
        c.access = Arc::new(ferry_net::access::Access::file(&file));
    })
    .await;
    let mut raw = Raw::connect(scoped.addr).await;
    raw.send(&hello_control(&reader)).await.unwrap();
    raw.send(&ferry_proto::Frame::StripeRead {
        src: "/secret".into(),
        opts: raw_opts(ferry_proto::ExistingPolicy::Fail),
    })
    .await
    .unwrap();
    match raw.expect(Duration::from_secs(5)).await {
        ferry_proto::Frame::Welcome { capabilities, .. } => {
            assert!(capabilities.has(ferry_proto::Capabilities::STRIPE_READ));
        }
        other => panic!("{other:?}"),
    }
    let (code, _) = refusal(&mut raw, Duration::from_secs(5)).await;
    assert_eq!(code, Some(ferry_proto::ErrorCode::DENIED));
}

/// A tree of one-block files (1 KiB to 64 KiB) written under `root`/`name`: the paths and
/// their total bytes.
fn small_tree(root: &Path, name: &str, n: u64) -> (Vec<String>, u64) {
    let mut files = Vec::new();
    let mut total = 0;
    for i in 0..n {
        let size = (1 << 10) + (i * 7919) % (63 << 10);
        let rel = format!("d{}/s{i}", i % 7);
        write(&root.join(name).join(&rel), &bytes(size as usize, 200 + i));
        files.push(rel);
        total += size;
    }
    (files, total)
}

/// A get of a tree of 300 one-block files: the coordinator sends each striped file's digest
/// apart (`STRIPE_DIGEST`) and every stripe host brings whole files; the tree is
/// byte-identical, and a second get of it finds every file in place and fetches nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_striped_get_of_small_files_has_every_stripe_host_serve_files() {
    let (_shared, root, servers) = three_hosts().await;
    let (files, total) = small_tree(&root, "small", 300);
    let mut cfg = striped(&servers);
    cfg.opts.streams = 2;
    let local = tempfile::tempdir().unwrap();
    let report = ferry_net::client::get(&cfg, "/small", local.path(), reporter())
        .await
        .expect("striped get of small files");
    assert!(report.is_success(), "{:?}", report.errors);
    assert_eq!(report.files, files.len() as u64);
    assert_eq!(
        snapshot(&local.path().join("small")),
        snapshot(&root.join("small"))
    );
    assert_eq!(report.stripes.len(), 2);
    for s in &report.stripes {
        // Whole files: a block each, of at most 64 KiB; on connections the host opened.
        assert!(s.failed.is_none(), "{s:?}");
        assert!(s.bytes <= s.blocks * (64 << 10), "{s:?}");
        assert!(s.carried <= s.connections, "{s:?}");
    }
    // How many each host serves is their pace's (a host answering late may serve none): the
    // hosts together served a share of the 1,200 files.
    assert!(
        report.stripes.iter().map(|s| s.blocks).sum::<u64>() >= 20,
        "{:?}",
        report.stripes
    );
    // What the stripe hosts brought did not also come over the coordinator's connections.
    let coordinator: u64 = report.streams.iter().map(|s| s.bytes).sum();
    let fetched: u64 = report.stripes.iter().map(|s| s.bytes).sum();
    assert!(
        coordinator + fetched >= total,
        "{coordinator} {fetched} {total}"
    );
    assert!(
        coordinator < total,
        "{coordinator} {total} {:?}",
        report.stripes
    );
    assert!(
        leftovers(local.path()).is_empty(),
        "{:?}",
        leftovers(local.path())
    );
    // Rerun: everything is in place; nothing is fetched from anyone.
    let again = ferry_net::client::get(&cfg, "/small", local.path(), reporter())
        .await
        .expect("second get");
    assert!(again.is_success(), "{:?}", again.errors);
    assert_eq!(again.stripes.iter().map(|s| s.blocks).sum::<u64>(), 0);
    assert_eq!(
        snapshot(&local.path().join("small")),
        snapshot(&root.join("small"))
    );
}

/// A striped get of a tree of one-block files whose last stripe host is killed a quarter of
/// the way through: the files it owed come from the other host or the coordinator, and the
/// tree arrives byte-identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_striped_get_of_small_files_completes_byte_identical_when_a_stripe_host_dies() {
    let (_shared, root, mut servers) = three_hosts().await;
    let (files, total) = small_tree(&root, "small", 1200);
    let mut cfg = striped(&servers);
    cfg.opts.streams = 2;
    let local = tempfile::tempdir().unwrap();
    let progress = Arc::new(Progress::default());
    let get = {
        let (cfg, dest, progress) = (cfg.clone(), local.path().to_owned(), progress.clone());
        tokio::spawn(async move { ferry_net::client::get(&cfg, "/small", &dest, progress).await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while progress.0.load(Ordering::Relaxed) < total / 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the get did not start"
        );
        assert!(!get.is_finished(), "the get ended before the kill");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    servers[2].kill();
    let report = tokio::time::timeout(Duration::from_secs(60), get)
        .await
        .expect("the get ends")
        .unwrap()
        .expect("the get completes without the dead host");
    assert!(report.is_success(), "{:?}", report.errors);
    assert_eq!(report.files, files.len() as u64);
    assert_eq!(
        snapshot(&local.path().join("small")),
        snapshot(&root.join("small"))
    );
    assert!(
        leftovers(local.path()).is_empty(),
        "{:?}",
        leftovers(local.path())
    );
    assert!(
        report.stripes[1].failed.is_some(),
        "{:?}",
        report.stripes[1]
    );
    assert!(
        report.stripes[0].failed.is_none(),
        "{:?}",
        report.stripes[0]
    );
}
