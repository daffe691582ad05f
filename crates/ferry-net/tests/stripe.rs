//! Striped puts: one endpoint made of several servers over one shared file system. The
//! first server coordinates (decides, verifies, commits); the others write blocks into its
//! partial copies (every block of files over 64 KiB, small files' and last blocks too), and
//! when one dies its blocks go to the others.

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
async fn a_striped_put_of_a_file_and_a_tree_is_byte_identical_and_uses_every_host() {
    let (_shared, root, servers) = three_hosts().await;
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("tree");
    write(&tree.join("big.bin"), &bytes(16 << 20, 1));
    write(&tree.join("sub/mid.bin"), &bytes(3 << 20, 2));
    for i in 0..20 {
        write(
            &tree.join(format!("sub/small{i}")),
            &bytes(1000 + i * 977, 3 + i as u64),
        );
    }
    let cfg = striped(&servers);
    let report = ferry_net::client::put(&cfg, std::slice::from_ref(&tree), "/in", reporter())
        .await
        .expect("striped put");
    assert!(report.is_success(), "{:?}", report.errors);
    assert_eq!(report.files, 22);
    for rel in ["big.bin", "sub/mid.bin", "sub/small0", "sub/small19"] {
        assert_eq!(
            b3(&root.join("in/tree").join(rel)),
            b3(&tree.join(rel)),
            "{rel}"
        );
    }
    assert!(leftovers(&root).is_empty(), "{:?}", leftovers(&root));
    // The coordinator's connections and the stripe hosts carried data. Which host takes how
    // many blocks is a race on loopback (under CI's load a host whose connections open last
    // may find the queue empty), so the hosts' sum is asserted; the shares on equal links are
    // the bench's.
    assert!(report.streams.iter().map(|s| s.bytes).sum::<u64>() > 0);
    assert_eq!(report.stripes.len(), 2);
    for s in &report.stripes {
        assert!(s.failed.is_none(), "{s:?}");
    }
    assert!(
        report.stripes.iter().map(|s| s.blocks).sum::<u64>() > 0,
        "{:?}",
        report.stripes
    );
}

/// Counts the bytes the put reports, so the test can act in the middle of it.
#[derive(Default)]
struct Progress(AtomicU64);

impl ferry_core::Reporter for Progress {
    fn on_bytes(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_striped_put_completes_byte_identical_when_a_stripe_host_dies() {
    let (_shared, root, mut servers) = three_hosts().await;
    let src = tempfile::tempdir().unwrap();
    let total = 48u64 << 20;
    let data = bytes(total as usize, 9);
    write(&src.path().join("f"), &data);
    let mut cfg = striped(&servers);
    cfg.opts.streams = 2;
    let progress = Arc::new(Progress::default());
    let put = {
        let (cfg, path, progress) = (cfg.clone(), src.path().join("f"), progress.clone());
        tokio::spawn(async move { ferry_net::client::put(&cfg, &[path], "/", progress).await })
    };
    // Kill the last host once a quarter of the file is across: it has blocks in flight then.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while progress.0.load(Ordering::Relaxed) < total / 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the put did not start"
        );
        assert!(!put.is_finished(), "the put ended before the kill");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    servers[2].kill();
    let report = tokio::time::timeout(Duration::from_secs(30), put)
        .await
        .expect("the put ends")
        .unwrap()
        .expect("the put completes without the dead host");
    assert!(report.is_success(), "{:?}", report.errors);
    assert_eq!(b3(&root.join("f")), blake3::hash(&data));
    assert!(leftovers(&root).is_empty(), "{:?}", leftovers(&root));
    let dead = &report.stripes[1];
    assert!(dead.failed.is_some(), "{dead:?}");
    assert!(
        report.stripes[0].failed.is_none(),
        "{:?}",
        report.stripes[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stripe_session_is_refused_without_the_setting_or_outside_the_scope() {
    let (_shared, root, servers) = three_hosts().await;
    let src = tempfile::tempdir().unwrap();
    write(&src.path().join("f"), &bytes(1 << 20, 4));
    // The coordinator itself takes no stripe sessions.
    let mut cfg = striped(&servers);
    cfg.stripe.push(StripeHost {
        server: servers[0].addr.to_string(),
        security: Security::Tls(ServerTrust::Pinned(servers[0].fingerprint.unwrap())),
        token: None,
    });
    let e = ferry_net::client::put(&cfg, &[src.path().join("f")], "/", reporter())
        .await
        .expect_err("a host without --stripe refuses");
    assert!(e.to_string().contains("serve --stripe"), "{e}");
    assert!(!root.join("f").exists());
    // A raw stripe request outside the token's write scope.
    let tokens = tempfile::tempdir().unwrap();
    let file = tokens.path().join("tokens.toml");
    let writer =
        ferry_net::access::add_token(&file, "writer", vec![], vec!["/in".into()], false).unwrap();
    let scoped = TestServer::start_with(|c| {
        c.stripe = true;
        c.access = Arc::new(ferry_net::access::Access::file(&file));
    })
    .await;
    let mut raw = Raw::connect(scoped.addr).await;
    raw.send(&hello_control(&writer)).await.unwrap();
    raw.send(&ferry_proto::Frame::StripeRequest {
        dest: "/out/".into(),
        opts: raw_opts(ferry_proto::ExistingPolicy::Fail),
    })
    .await
    .unwrap();
    assert!(matches!(
        raw.expect(Duration::from_secs(5)).await,
        ferry_proto::Frame::Welcome { .. }
    ));
    let (code, _) = refusal(&mut raw, Duration::from_secs(5)).await;
    assert_eq!(code, Some(ferry_proto::ErrorCode::DENIED));
}

/// A stripe host that is down when the transfer starts is left out, reported failed with its
/// reason, and the put and the get complete on the others, as when one dies mid-way; a host
/// that refuses (above) still fails the transfer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stripe_host_down_at_the_start_is_left_out_and_the_transfer_completes() {
    let (_shared, root, mut servers) = three_hosts().await;
    let src = tempfile::tempdir().unwrap();
    let data = bytes(8 << 20, 6);
    write(&src.path().join("f"), &data);
    let cfg = striped(&servers);
    servers[1].kill();
    let report = ferry_net::client::put(&cfg, &[src.path().join("f")], "/in", reporter())
        .await
        .expect("the put goes on without the host that is down");
    assert!(report.is_success(), "{:?}", report.errors);
    assert_eq!(b3(&root.join("in/f")), blake3::hash(&data));
    assert_eq!(report.stripes.len(), 2);
    let down = &report.stripes[0];
    assert_eq!(down.host, servers[1].addr.to_string());
    assert_eq!(down.blocks, 0);
    assert!(
        down.failed.as_deref().is_some_and(|f| !f.is_empty()),
        "{down:?}"
    );
    assert!(
        report.stripes[1].failed.is_none(),
        "{:?}",
        report.stripes[1]
    );
    let back = src.path().join("back");
    let report = ferry_net::client::get(&cfg, "/in/f", &back, reporter())
        .await
        .expect("the get goes on without the host that is down");
    assert!(report.is_success(), "{:?}", report.errors);
    assert_eq!(b3(&back), blake3::hash(&data));
    assert_eq!(report.stripes[0].host, servers[1].addr.to_string());
    assert!(report.stripes[0].failed.is_some(), "{:?}", report.stripes);
}

/// A tree of many one-block files (64 KiB to 256 KiB, the block size) and a few of several
/// blocks: the stripe hosts write the one-block files too (`STRIPE_WHOLE`), and when one is
/// killed a quarter of the way through, what it owes (whole small files among it) goes to the
/// others and the tree arrives byte-identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_striped_tree_of_small_files_completes_byte_identical_when_a_stripe_host_dies() {
    let (_shared, root, mut servers) = three_hosts().await;
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("tree");
    let mut files = Vec::new();
    for i in 0..240u64 {
        // 65 KiB to 256 KiB: more than the coordinator keeps, at most one block.
        let size = (65 << 10) + (i * 7919) % (191 << 10);
        files.push((format!("d{}/s{i}", i % 7), size as usize));
    }
    for i in 0..3u64 {
        files.push((format!("large{i}"), (1 << 20) + 1000 * i as usize));
    }
    let mut total = 0u64;
    for (i, (rel, size)) in files.iter().enumerate() {
        write(&tree.join(rel), &bytes(*size, 100 + i as u64));
        total += *size as u64;
    }
    let mut cfg = striped(&servers);
    cfg.opts.streams = 2;
    let progress = Arc::new(Progress::default());
    let put = {
        let (cfg, tree, progress) = (cfg.clone(), tree.clone(), progress.clone());
        tokio::spawn(async move { ferry_net::client::put(&cfg, &[tree], "/in", progress).await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while progress.0.load(Ordering::Relaxed) < total / 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the put did not start"
        );
        assert!(!put.is_finished(), "the put ended before the kill");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    servers[2].kill();
    let report = tokio::time::timeout(Duration::from_secs(60), put)
        .await
        .expect("the put ends")
        .unwrap()
        .expect("the put completes without the dead host");
    assert!(report.is_success(), "{:?}", report.errors);
    assert_eq!(report.files, files.len() as u64);
    for (rel, _) in &files {
        assert_eq!(
            b3(&root.join("in/tree").join(rel)),
            b3(&tree.join(rel)),
            "{rel}"
        );
    }
    assert!(leftovers(&root).is_empty(), "{:?}", leftovers(&root));
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
    // More blocks than the large files have that are not their last: one-block files and
    // last blocks went to the stripe hosts too.
    let not_last: u64 = files
        .iter()
        .map(|(_, size)| ((*size as u64).div_ceil(256 << 10)).saturating_sub(1))
        .sum();
    let landed: u64 = report.stripes.iter().map(|s| s.blocks).sum();
    assert!(
        landed > not_last,
        "{:?}, {not_last} not last",
        report.stripes
    );
}

/// A striped put of one file of 64 blocks over equal (loopback) links, two fixed streams on
/// each host: no host carries blocks on more connections than the coordinator has, and the
/// blocks are shared between the coordinator and the stripe hosts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_striped_puts_hosts_carry_blocks_on_at_most_the_coordinators_count() {
    let (_shared, root, servers) = three_hosts().await;
    let src = tempfile::tempdir().unwrap();
    let blocks = 64u64;
    let data = bytes((blocks << 18) as usize, 77);
    write(&src.path().join("f"), &data);
    let mut cfg = striped(&servers);
    cfg.opts.streams = 2;
    let report = ferry_net::client::put(&cfg, &[src.path().join("f")], "/in/", reporter())
        .await
        .expect("striped put");
    assert!(report.is_success(), "{:?}", report.errors);
    assert_eq!(b3(&root.join("in/f")), blake3::hash(&data));
    let k = report.stripes.len() as u64 + 1;
    assert_eq!(k, 3);
    // What each host carries on loopback is a race between connections (10 to 27 of 64 seen
    // in one run of a few); the shares on equal links are the bench's (notebook, "Issue 38:
    // the coordinator's share and striped small files"). What is fixed is that no host
    // carries data on more connections than the coordinator's count, and that the hosts and
    // the coordinator share the blocks (which host takes part is the race: CI once saw a host
    // open its connections after the others had taken every block of a smaller file).
    let hosts: u64 = report.stripes.iter().map(|s| s.blocks).sum();
    for s in &report.stripes {
        assert!(s.failed.is_none(), "{s:?}");
        assert_eq!(s.connections, 2, "{s:?}");
        assert!(s.carried <= 2, "{s:?}");
    }
    assert!(hosts > 0, "no stripe host carried a block");
    assert!(
        hosts < blocks,
        "the coordinator carried none: {:?}",
        report.stripes
    );
}
