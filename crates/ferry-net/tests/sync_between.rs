//! `sync` between two servers on loopback: the changed files go from A to B as one third-party
//! copy (the client's connections carry control only), a second run sends nothing, `delete`
//! removes on B only after the copy stored everything, a dry run changes nothing, filters
//! apply, and servers that take no part in third-party copies refuse.

use crate::util;

use std::path::Path;
use std::time::Duration;

use ferry_core::filter::{Action, Filter};
use ferry_net::copy::CopyConfig;
use ferry_net::sync::{self, SyncOpts, SyncReport};
use ferry_proto::{CopyRequest, ErrorCode, ExistingPolicy, Frame};
use util::*;

fn third_party(c: &mut ferry_net::ServerConfig) {
    c.third_party = true;
}

/// The client reaches A at `a_via` (a counting relay, or A itself) and B at `b_via`; A
/// reaches B directly.
fn config(a: &TestServer, b: &TestServer, via: (String, String)) -> CopyConfig {
    let mut source = a.client();
    source.server = via.0;
    let mut dest = b.client();
    dest.server = via.1;
    CopyConfig {
        source,
        dest,
        dest_addr: Some(b.addr.to_string()),
    }
}

fn direct(a: &TestServer, b: &TestServer) -> CopyConfig {
    config(a, b, (a.addr.to_string(), b.addr.to_string()))
}

/// Five files (one of 8 MiB), an empty directory and a link.
fn make_tree(dir: &Path) -> u64 {
    write(&dir.join("a.txt"), b"alpha");
    write(&dir.join("sub/b.bin"), &bytes(300_000, 1));
    write(&dir.join("sub/big.bin"), &bytes(8 << 20, 2));
    write(&dir.join("sub/deep/c.txt"), b"charlie");
    write(&dir.join("skip.log"), b"log");
    std::fs::create_dir_all(dir.join("empty")).unwrap();
    std::os::unix::fs::symlink("sub/b.bin", dir.join("link")).unwrap();
    5 + 300_000 + (8 << 20) + 7 + 3
}

/// Other bytes of the same length, the mtime put back: a change size and mtime cannot see.
fn change_unseen(path: &Path) {
    let mtime = std::fs::metadata(path).unwrap().modified().unwrap();
    let mut data = std::fs::read(path).unwrap();
    for b in &mut data {
        *b = b.wrapping_add(1);
    }
    std::fs::write(path, &data).unwrap();
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(mtime).unwrap();
}

fn opts(checksum: bool, delete: bool) -> SyncOpts {
    SyncOpts {
        checksum,
        delete,
        dry_run: false,
    }
}

async fn between(
    cfg: &CopyConfig,
    src: &str,
    dest: &str,
    filter: &Filter,
    opts: SyncOpts,
) -> SyncReport {
    sync::sync_between(cfg, (src, dest), filter, opts, reporter())
        .await
        .expect("sync between servers")
}

/// Files and bytes the copy stored, as B confirmed them; (0, 0) when no copy ran.
fn sent(r: &SyncReport) -> (u64, u64) {
    assert!(r.transfer.is_none(), "nothing crosses the client: {r:?}");
    r.copy.as_ref().map_or((0, 0), |c| (c.files, c.bytes))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sync_between_servers_is_identical_and_a_second_one_sends_nothing() {
    let a = TestServer::start_with(third_party).await;
    let b = TestServer::start_with(third_party).await;
    let total = make_tree(&a.root.join("src"));
    let (to_a, to_b) = (
        Relay::start(a.addr, None).await,
        Relay::start(b.addr, None).await,
    );
    let cfg = config(&a, &b, (to_a.addr.to_string(), to_b.addr.to_string()));
    let all = Filter::default();
    let first = between(&cfg, "/src", "/mirror", &all, opts(false, false)).await;
    assert!(first.is_success(), "{first:?}");
    // The five files and the link.
    assert_eq!(first.plan.send.len(), 6, "{:?}", first.plan);
    assert_eq!(sent(&first), (5, total));
    assert_eq!(
        snapshot(&a.root.join("src")),
        snapshot(&b.root.join("mirror"))
    );
    assert!(leftovers(&b.root).is_empty());
    // The data went from A to B: the client's links carried the listings and control frames.
    let client_bytes = to_a.bytes() + to_b.bytes();
    assert!(
        client_bytes < total / 20,
        "{client_bytes} bytes crossed the client for {total} of data"
    );

    // Nothing changed: no copy at all.
    let again = between(&cfg, "/src", "/mirror", &all, opts(false, false)).await;
    assert!(again.is_success(), "{again:?}");
    assert!(again.plan.send.is_empty(), "{:?}", again.plan);
    assert_eq!(again.plan.unchanged, 5);
    assert_eq!(sent(&again), (0, 0));

    // One file changed in size: only it moves, into an existing tree.
    write(&a.root.join("src/sub/deep/c.txt"), b"charlie, longer");
    let one = between(&cfg, "/src", "/mirror", &all, opts(false, false)).await;
    assert!(one.is_success(), "{one:?}");
    assert_eq!(one.plan.send, ["sub/deep/c.txt"]);
    assert_eq!(sent(&one), (1, 15));
    assert_eq!(
        snapshot(&a.root.join("src")),
        snapshot(&b.root.join("mirror"))
    );

    // Same size and mtime, other bytes: unseen by default, found by --checksum (B proves the
    // others by digest) and replaced alone.
    change_unseen(&a.root.join("src/sub/b.bin"));
    let blind = between(&cfg, "/src", "/mirror", &all, opts(false, false)).await;
    assert_eq!(sent(&blind), (0, 0));
    assert_ne!(
        snapshot(&a.root.join("src")),
        snapshot(&b.root.join("mirror"))
    );
    let sums = between(&cfg, "/src", "/mirror", &all, opts(true, false)).await;
    assert!(sums.is_success(), "{sums:?}");
    assert_eq!(
        sums.plan.send.len(),
        5,
        "with --checksum every file is compared"
    );
    assert_eq!(sent(&sums), (1, 300_000), "only the changed file moves");
    assert_eq!(
        snapshot(&a.root.join("src")),
        snapshot(&b.root.join("mirror"))
    );

    // A single file syncs to a single file; an empty directory is a tree too.
    let file = between(&cfg, "/src/a.txt", "/one.txt", &all, opts(false, true)).await;
    assert!(file.is_success(), "{file:?}");
    assert_eq!(std::fs::read(b.root.join("one.txt")).unwrap(), b"alpha");
    std::fs::create_dir_all(a.root.join("void")).unwrap();
    let void = between(&cfg, "/void", "/void-copy", &all, opts(false, true)).await;
    assert!(void.is_success(), "{void:?}");
    assert!(b.root.join("void-copy").is_dir());

    // B still stores no link that points out of the synced directory.
    std::os::unix::fs::symlink("../one.txt", a.root.join("src/out")).unwrap();
    write(&a.root.join("src/new.txt"), b"new");
    let out = between(&cfg, "/src", "/mirror", &all, opts(false, false)).await;
    assert!(!out.is_success(), "{out:?}");
    assert!(b.root.join("mirror/out").symlink_metadata().is_err());
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delete_between_servers_follows_a_copy_that_stored_everything_and_filters_apply() {
    let a = TestServer::start_with(third_party).await;
    let b = TestServer::start_with(third_party).await;
    make_tree(&a.root.join("src"));
    let mirror = b.root.join("mirror");
    write(&mirror.join("old.txt"), b"old");
    write(&mirror.join("olddir/x/y.txt"), b"y");
    write(&mirror.join("keep.log"), b"excluded: protected");
    let mut filter = Filter::default();
    filter.add(Action::Exclude, "*.log").unwrap();
    filter.add(Action::Exclude, "/sub/big.bin").unwrap();
    let cfg = direct(&a, &b);

    // A dry run plans the same and changes nothing.
    let before = snapshot(&mirror);
    let dry = SyncOpts {
        dry_run: true,
        ..opts(false, true)
    };
    let plan = between(&cfg, "/src", "/mirror", &filter, dry).await;
    assert_eq!(
        plan.plan.send,
        ["a.txt", "link", "sub/b.bin", "sub/deep/c.txt"]
    );
    assert_eq!(
        plan.plan.delete,
        ["olddir/x/y.txt", "olddir/x", "olddir", "old.txt"]
    );
    assert_eq!(sent(&plan), (0, 0));
    assert_eq!(snapshot(&mirror), before);

    let r = between(&cfg, "/src", "/mirror", &filter, opts(false, true)).await;
    assert!(r.is_success(), "{r:?}");
    assert_eq!(sent(&r), (3, 5 + 300_000 + 7));
    assert_eq!(r.deleted, 4);
    assert!(
        mirror.join("keep.log").exists(),
        "an excluded file is not deleted"
    );
    assert!(!mirror.join("skip.log").exists(), "nor sent");
    assert!(
        !mirror.join("sub/big.bin").exists(),
        "an anchored exclude holds"
    );
    assert!(!mirror.join("old.txt").exists() && !mirror.join("olddir").exists());
    assert!(mirror.join("empty").is_dir() && mirror.join("link").is_symlink());
    assert_eq!(
        std::fs::read(mirror.join("sub/b.bin")).unwrap(),
        std::fs::read(a.root.join("src/sub/b.bin")).unwrap()
    );

    // A directory on B where A has a file: that file fails, so nothing is deleted.
    write(&a.root.join("src/new.txt"), b"new");
    std::fs::remove_file(mirror.join("a.txt")).unwrap();
    std::fs::create_dir_all(mirror.join("a.txt/in-the-way")).unwrap();
    write(&mirror.join("stale.txt"), b"stale");
    let failed = between(&cfg, "/src", "/mirror", &filter, opts(false, true)).await;
    assert!(!failed.is_success() && !failed.sent_all(), "{failed:?}");
    assert!(
        failed.copy.as_ref().is_some_and(|c| c.failed > 0),
        "{failed:?}"
    );
    assert_eq!(failed.deleted, 0);
    assert!(failed.plan.delete.contains(&"stale.txt".to_owned()));
    assert!(
        mirror.join("stale.txt").exists(),
        "nothing is deleted after a failure"
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn servers_without_third_party_refuse_a_sync_and_nothing_is_deleted() {
    let plain_a = TestServer::start().await;
    let b = TestServer::start_with(third_party).await;
    make_tree(&plain_a.root.join("src"));
    write(&b.root.join("mirror/extra.txt"), b"extra");
    let err = sync::sync_between(
        &direct(&plain_a, &b),
        ("/src", "/mirror"),
        &Filter::default(),
        opts(false, true),
        reporter(),
    )
    .await
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("--third-party") && text.contains("source"),
        "{text}"
    );
    assert!(b.root.join("mirror/extra.txt").exists());
    assert!(!b.root.join("mirror/a.txt").exists());

    let a = TestServer::start_with(third_party).await;
    let plain_b = TestServer::start().await;
    make_tree(&a.root.join("src"));
    write(&plain_b.root.join("mirror/extra.txt"), b"extra");
    let err = sync::sync_between(
        &direct(&a, &plain_b),
        ("/src", "/mirror"),
        &Filter::default(),
        opts(false, true),
        reporter(),
    )
    .await
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("--third-party") && text.contains("destination"),
        "{text}"
    );
    assert!(plain_b.root.join("mirror/extra.txt").exists());
    assert!(!plain_b.root.join("mirror/a.txt").exists());
}

/// The source holds the chosen paths to their form: plainly relative, below the source, which
/// must be a directory; anything else is refused before anything is dialled.
#[tokio::test]
async fn a_source_refuses_chosen_paths_that_are_not_plainly_below_it() {
    let a = TestServer::start_with(third_party).await;
    make_tree(&a.root.join("src"));
    let ask = |src: &str, paths: &[&str]| {
        let request = Frame::CopyRequest(Box::new(CopyRequest {
            src: src.into(),
            dest: "/mirror".into(),
            peer: "127.0.0.1:9".into(),
            fingerprint: [0; 32],
            grant: "g".into(),
            opts: raw_opts(ExistingPolicy::Overwrite),
            only: true,
            stripes: Vec::new(),
            pull: false,
        }));
        let paths = Frame::CopyPaths {
            paths: paths.iter().map(|p| p.to_string()).collect(),
            more: false,
        };
        (request, paths)
    };
    for (src, paths) in [
        ("/src", &["a.txt", "../secret"][..]),
        ("/src", &["/a.txt"][..]),
        ("/src", &["sub/./b.bin"][..]),
        ("/src", &[""][..]),
        ("/src/a.txt", &["a.txt"][..]),
    ] {
        let (mut c, _, _) = control(&a).await;
        let (request, paths_frame) = ask(src, paths);
        c.send(&request).await.unwrap();
        c.send(&paths_frame).await.unwrap();
        match c.expect(Duration::from_secs(10)).await {
            Frame::Error { code, message } => {
                assert_eq!(code, ErrorCode::BAD_REQUEST, "{src} {paths:?}: {message}")
            }
            other => panic!("{src} {paths:?}: {other:?}"),
        }
    }
}
