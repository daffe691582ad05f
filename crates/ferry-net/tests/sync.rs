//! `sync` on loopback, both ways: what is sent, what is left unread, what `delete` removes and
//! when it removes nothing; and the server's `RemoveRequest` held to the token's write scope.

use crate::util;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::filter::{Action, Filter};
use ferry_net::access::{self, Access};
use ferry_net::sync::{self, Direction, SyncOpts};
use ferry_proto::{ErrorCode, Frame};
use util::*;

fn make_tree(dir: &Path) {
    write(&dir.join("a.txt"), b"alpha");
    write(&dir.join("sub/b.bin"), &bytes(300_000, 1));
    write(&dir.join("sub/deep/c.txt"), b"charlie");
    write(&dir.join("skip.log"), b"log");
}

/// Replaces a file's content with other bytes of the same length and puts its mtime back, as
/// a change that size and mtime cannot see.
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

fn put(src: &Path, dest: &str) -> Direction {
    Direction::Put {
        src: src.to_owned(),
        dest: dest.to_owned(),
    }
}

fn opts(checksum: bool, delete: bool) -> SyncOpts {
    SyncOpts {
        checksum,
        delete,
        dry_run: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sync_to_a_server_and_back_sends_only_what_changed() {
    let server = TestServer::start().await;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    make_tree(&src);
    let cfg = server.client();
    let all = Filter::default();
    let first = sync::sync(
        &cfg,
        &put(&src, "/mirror"),
        &all,
        opts(false, false),
        reporter(),
    )
    .await
    .unwrap();
    assert!(first.is_success(), "{first:?}");
    assert_eq!(first.plan.send.len(), 4);
    assert_eq!(snapshot(&src), snapshot(&server.root.join("mirror")));

    // Nothing changed: nothing sent, no transfer at all.
    let again = sync::sync(
        &cfg,
        &put(&src, "/mirror"),
        &all,
        opts(false, false),
        reporter(),
    )
    .await
    .unwrap();
    assert!(again.plan.send.is_empty(), "{:?}", again.plan);
    assert_eq!(again.plan.unchanged, 4);
    assert!(again.transfer.is_none());

    // Same size, same mtime, other bytes: unseen by size and mtime (so nothing read it), found
    // by --checksum and replaced.
    change_unseen(&src.join("sub/b.bin"));
    let blind = sync::sync(
        &cfg,
        &put(&src, "/mirror"),
        &all,
        opts(false, false),
        reporter(),
    )
    .await
    .unwrap();
    assert!(blind.plan.send.is_empty());
    assert_ne!(snapshot(&src), snapshot(&server.root.join("mirror")));
    let sums = sync::sync(
        &cfg,
        &put(&src, "/mirror"),
        &all,
        opts(true, false),
        reporter(),
    )
    .await
    .unwrap();
    let t = sums.transfer.as_ref().unwrap();
    assert!(t.is_success(), "{t:?}");
    assert_eq!(
        (t.files, t.bytes),
        (1, 300_000),
        "only the changed file moves"
    );
    assert_eq!(snapshot(&src), snapshot(&server.root.join("mirror")));

    // And back: a get into a new local tree, then a second that sends nothing.
    let back = tmp.path().join("back");
    let get = Direction::Get {
        src: "/mirror".into(),
        dest: back.clone(),
    };
    let r = sync::sync(&cfg, &get, &all, opts(false, false), reporter())
        .await
        .unwrap();
    assert!(r.is_success(), "{r:?}");
    assert_eq!(snapshot(&src), snapshot(&back));
    let r = sync::sync(&cfg, &get, &all, opts(false, false), reporter())
        .await
        .unwrap();
    assert!(r.plan.send.is_empty() && r.transfer.is_none(), "{r:?}");

    // An empty directory is a tree too (made at the destination); a missing source is an
    // error, never an empty tree that --delete would empty the destination by.
    std::fs::create_dir_all(server.root.join("empty")).unwrap();
    let get = |src: &str| Direction::Get {
        src: src.into(),
        dest: tmp.path().join("empty-copy"),
    };
    let r = sync::sync(&cfg, &get("/empty"), &all, opts(false, true), reporter())
        .await
        .unwrap();
    assert!(r.is_success(), "{r:?}");
    assert!(tmp.path().join("empty-copy").is_dir());
    let err = sync::sync(&cfg, &get("/none"), &all, opts(false, true), reporter())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("/none"), "{err}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delete_removes_extraneous_entries_but_not_excluded_ones() {
    let server = TestServer::start().await;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    make_tree(&src);
    let mirror = server.root.join("mirror");
    write(&mirror.join("old.txt"), b"old");
    write(&mirror.join("olddir/x/y.txt"), b"y");
    write(&mirror.join("keep.log"), b"excluded: protected");
    let mut filter = Filter::default();
    filter.add(Action::Exclude, "*.log").unwrap();
    let cfg = server.client();
    // A dry run lists the same and changes nothing.
    let before = snapshot(&mirror);
    let dry = SyncOpts {
        dry_run: true,
        ..opts(false, true)
    };
    let plan = sync::sync(&cfg, &put(&src, "/mirror"), &filter, dry, reporter())
        .await
        .unwrap()
        .plan;
    assert_eq!(plan.send, ["a.txt", "sub/b.bin", "sub/deep/c.txt"]);
    assert_eq!(
        plan.delete,
        ["olddir/x/y.txt", "olddir/x", "olddir", "old.txt"]
    );
    assert_eq!(snapshot(&mirror), before);

    let r = sync::sync(
        &cfg,
        &put(&src, "/mirror"),
        &filter,
        opts(false, true),
        reporter(),
    )
    .await
    .unwrap();
    assert!(r.is_success(), "{r:?}");
    assert_eq!(r.deleted, 4);
    assert!(
        mirror.join("keep.log").exists(),
        "an excluded file is not deleted"
    );
    assert!(!mirror.join("skip.log").exists(), "nor sent");
    assert!(!mirror.join("old.txt").exists() && !mirror.join("olddir").exists());
    assert!(mirror.join("sub/deep/c.txt").exists());

    // The same the other way: a local destination.
    let local = tmp.path().join("local");
    write(&local.join("extra/z.txt"), b"z");
    write(&local.join("note.log"), b"kept");
    let get = Direction::Get {
        src: "/mirror".into(),
        dest: local.clone(),
    };
    let r = sync::sync(&cfg, &get, &filter, opts(false, true), reporter())
        .await
        .unwrap();
    assert!(r.is_success(), "{r:?}");
    assert!(!local.join("extra").exists());
    assert!(local.join("note.log").exists() && local.join("sub/b.bin").exists());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delete_after_a_failed_transfer_deletes_nothing() {
    let server = TestServer::start().await;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    make_tree(&src);
    let mirror = server.root.join("mirror");
    write(&mirror.join("old.txt"), b"old");
    // A directory where the source has a file: that file fails.
    std::fs::create_dir_all(mirror.join("a.txt/in-the-way")).unwrap();
    let r = sync::sync(
        &server.client(),
        &put(&src, "/mirror"),
        &Filter::default(),
        opts(false, true),
        reporter(),
    )
    .await
    .unwrap();
    assert!(!r.is_success());
    assert!(r.transfer.as_ref().is_some_and(|t| t.failed > 0), "{r:?}");
    assert_eq!(r.deleted, 0);
    assert!(
        mirror.join("old.txt").exists(),
        "nothing is deleted after a failure"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn remove_requests_stay_in_the_write_scope() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    let writer = access::add_token(
        &tokens,
        "writer",
        vec!["/incoming".into()],
        vec!["/incoming".into()],
        false,
    )
    .unwrap();
    let server = TestServer::start_with(|c| c.access = Arc::new(Access::file(&tokens))).await;
    write(&server.root.join("incoming/mine.txt"), b"mine");
    write(&server.root.join("incoming/full/x"), b"x");
    write(&server.root.join("priv/secret.txt"), b"secret");
    std::os::unix::fs::symlink("../priv", server.root.join("incoming/link")).unwrap();
    let mut cfg = server.client();
    cfg.token = writer;
    let paths: Vec<String> = [
        "mine.txt",
        "../priv/secret.txt",
        "link/secret.txt",
        "full",
        "gone.txt",
    ]
    .map(String::from)
    .to_vec();
    let (removed, errors) = sync::remove_remote(&cfg, "/incoming", &paths, reporter().as_ref())
        .await
        .unwrap();
    assert_eq!(removed, 2, "mine.txt and the missing gone.txt: {errors:?}");
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(errors[0].contains("../priv/secret.txt"), "{errors:?}");
    assert!(errors[1].contains("link/secret.txt"), "{errors:?}");
    assert!(
        errors[2].contains("full"),
        "a full directory stays: {errors:?}"
    );
    assert!(server.root.join("priv/secret.txt").exists());
    assert!(server.root.join("incoming/full/x").exists());
    assert!(!server.root.join("incoming/mine.txt").exists());

    // The link itself may go (never what it points to); the scope's top, the root and paths
    // of another scope may not.
    let (removed, errors) = sync::remove_remote(
        &cfg,
        "/",
        &[
            "incoming/link".into(),
            "incoming".into(),
            "priv/secret.txt".into(),
        ],
        reporter().as_ref(),
    )
    .await
    .unwrap();
    assert_eq!(removed, 1, "{errors:?}");
    assert!(errors[0].contains("top of a write scope"), "{errors:?}");
    assert!(errors[1].contains("may not remove"), "{errors:?}");
    assert!(server.root.join("priv/secret.txt").exists());

    // Raw: a request answers with codes, and `more` keeps the connection for the next.
    let mut raw = Raw::connect(server.addr).await;
    raw.send(&hello_control(&cfg.token)).await.unwrap();
    assert!(matches!(
        raw.expect(Duration::from_secs(5)).await,
        Frame::Welcome { .. }
    ));
    let ask = |paths: &[&str], more| Frame::RemoveRequest {
        paths: paths.iter().map(|p| p.to_string()).collect(),
        more,
    };
    raw.send(&ask(&["/priv/secret.txt"], true)).await.unwrap();
    match raw.expect(Duration::from_secs(5)).await {
        Frame::Removed { removed, failures } => {
            assert_eq!(removed, 0);
            assert_eq!(failures[0].index, 0);
            assert_eq!(failures[0].code, ErrorCode::DENIED);
        }
        other => panic!("{other:?}"),
    }
    raw.send(&ask(&["/incoming/none"], false)).await.unwrap();
    assert_eq!(
        raw.expect(Duration::from_secs(5)).await,
        Frame::Removed {
            removed: 1,
            failures: vec![]
        }
    );
    server.stop().await;
}
