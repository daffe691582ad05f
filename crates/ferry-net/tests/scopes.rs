//! A token's scope holds through symlinks: every operation is resolved beneath the directory of
//! the prefix that grants it, so a link a writer stored (or anyone stored) cannot lead a put,
//! get or list out of that prefix; and the permission bits a peer sends are not all kept.
//! Each case below reproduces a finding of a hostile review of ede5c79.

use crate::util;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use ferry_net::access::{self, Access};
use ferry_net::{ClientConfig, SessionError, TransferReport};
use ferry_proto::ExistingPolicy;
use util::*;

struct Bed {
    server: TestServer,
    writer: String,
    reader: String,
    admin: String,
    _tokens: tempfile::TempDir,
}

/// A server with `/pub` (readable), `/incoming` (writable) and `/priv` (neither) for the
/// `writer` token, a read-only `reader` of `/pub`, and a full-access `admin`.
async fn bed() -> Bed {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    let writer = access::add_token(
        &tokens,
        "writer",
        vec!["/pub".into()],
        vec!["/incoming".into()],
        false,
    )
    .unwrap();
    let reader = access::add_token(&tokens, "reader", vec!["/pub".into()], vec![], true).unwrap();
    let admin = access::add_token(&tokens, "admin", vec![], vec![], false).unwrap();
    let server = TestServer::start_with(|c| c.access = Arc::new(Access::file(&tokens))).await;
    write(&server.root.join("pub/a.txt"), b"public");
    write(&server.root.join("priv/c.txt"), b"secret");
    std::fs::create_dir_all(server.root.join("incoming")).unwrap();
    Bed {
        server,
        writer,
        reader,
        admin,
        _tokens: dir,
    }
}

impl Bed {
    fn as_token(&self, token: &str, existing: ExistingPolicy) -> ClientConfig {
        let mut c = self.server.client();
        c.token = token.to_owned();
        c.opts.existing = existing;
        c
    }

    async fn put(
        &self,
        token: &str,
        existing: ExistingPolicy,
        src: &Path,
        dest: &str,
    ) -> Result<TransferReport, SessionError> {
        ferry_net::client::put(
            &self.as_token(token, existing),
            std::slice::from_ref(&src.to_path_buf()),
            dest,
            reporter(),
        )
        .await
    }

    fn priv_untouched(&self) {
        assert_eq!(names(&self.server.root.join("priv")), ["c.txt"]);
        assert_eq!(
            std::fs::read(self.server.root.join("priv/c.txt")).unwrap(),
            b"secret"
        );
    }
}

fn failed(r: &Result<TransferReport, SessionError>) -> bool {
    match r {
        Ok(report) => !report.is_success(),
        Err(_) => true,
    }
}

/// A writer stores links that lead out of its scope; writing through them is refused, and so
/// is changing a directory's metadata through one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_stored_links_stay_in_the_scope() {
    let bed = bed().await;
    let root = bed.server.root.clone();
    let local = tempfile::tempdir().unwrap();
    // The writer may store links with any target: the links themselves are put.
    let links = local.path().join("links");
    std::fs::create_dir(&links).unwrap();
    std::os::unix::fs::symlink("../priv", links.join("esc")).unwrap();
    std::os::unix::fs::symlink("..", links.join("rootl")).unwrap();
    for name in ["esc", "rootl"] {
        let r = bed
            .put(
                &bed.writer,
                ExistingPolicy::Fail,
                &links.join(name),
                "/incoming/",
            )
            .await
            .unwrap();
        assert!(r.is_success(), "{name}: {r:?}");
        assert!(std::fs::symlink_metadata(root.join("incoming").join(name))
            .unwrap()
            .file_type()
            .is_symlink());
    }
    let c = local.path().join("c.txt");
    write(&c, b"overwritten");
    let x = local.path().join("x.txt");
    write(&x, b"new file");

    // Overwriting a file through the link.
    let r = bed
        .put(
            &bed.writer,
            ExistingPolicy::Overwrite,
            &c,
            "/incoming/esc/c.txt",
        )
        .await;
    assert!(failed(&r), "{r:?}");
    bed.priv_untouched();
    // Creating a file through it.
    let r = bed
        .put(&bed.writer, ExistingPolicy::Fail, &x, "/incoming/esc/")
        .await;
    assert!(failed(&r), "{r:?}");
    bed.priv_untouched();
    // Planting a link in /pub through `rootl -> ..`.
    let leak = local.path().join("leak");
    std::os::unix::fs::symlink("../priv", &leak).unwrap();
    let r = bed
        .put(
            &bed.writer,
            ExistingPolicy::Fail,
            &leak,
            "/incoming/rootl/pub/",
        )
        .await;
    assert!(failed(&r), "{r:?}");
    assert!(std::fs::symlink_metadata(root.join("pub/leak")).is_err());

    // A directory named like the link, with mode 0700 and a 2001 mtime, put over it.
    let before = std::fs::metadata(&root).unwrap();
    let tree = local.path().join("tree");
    let rootl = tree.join("rootl");
    std::fs::create_dir_all(&rootl).unwrap();
    write(&rootl.join("f"), b"f");
    std::fs::set_permissions(&rootl, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::File::open(&rootl)
        .unwrap()
        .set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(978_307_200))
        .unwrap();
    let r = bed
        .put(&bed.writer, ExistingPolicy::Overwrite, &rootl, "/incoming/")
        .await;
    assert!(failed(&r), "{r:?}");
    let after = std::fs::metadata(&root).unwrap();
    assert_eq!(after.mode(), before.mode(), "the server root's mode");
    assert_eq!(after.mtime(), before.mtime(), "the server root's mtime");
    assert!(!root.join("f").exists());

    // A link that stays inside the scope is followed, as `cp` would.
    std::fs::create_dir(root.join("incoming/sub")).unwrap();
    std::os::unix::fs::symlink("sub", root.join("incoming/inner")).unwrap();
    let r = bed
        .put(&bed.writer, ExistingPolicy::Fail, &x, "/incoming/inner/")
        .await
        .unwrap();
    assert!(r.is_success(), "{r:?}");
    assert_eq!(
        std::fs::read(root.join("incoming/sub/x.txt")).unwrap(),
        b"new file"
    );
    bed.server.stop().await;
}

/// A read scope holds through a link inside it, for get and ls alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_through_links_stay_in_the_scope() {
    let bed = bed().await;
    let root = bed.server.root.clone();
    // Whoever made it (here the administrator), a link in /pub to /priv is no way in.
    std::os::unix::fs::symlink("../priv", root.join("pub/leak")).unwrap();
    std::os::unix::fs::symlink("..", root.join("pub/up")).unwrap();
    let out = tempfile::tempdir().unwrap();
    for token in [&bed.reader, &bed.writer] {
        let cfg = bed.as_token(token, ExistingPolicy::Fail);
        for src in ["/pub/leak/c.txt", "/pub/up/priv/c.txt", "/pub/up/priv"] {
            let r = ferry_net::client::get(&cfg, src, out.path(), reporter()).await;
            assert!(failed(&r), "{src}: {r:?}");
        }
        for path in ["/pub/leak", "/pub/up/priv", "/pub/leak/c.txt"] {
            let r = ferry_net::client::list(&cfg, path, &ferry_core::NoReporter).await;
            if let Ok(entries) = &r {
                assert!(
                    entries.iter().all(|e| e.name != "c.txt"),
                    "{path}: {entries:?}"
                );
            }
        }
    }
    assert!(!any_file_contains(out.path(), b"secret"));
    // The link itself is data like any other: a get of /pub brings it as a link.
    let cfg = bed.as_token(&bed.reader, ExistingPolicy::Fail);
    let r = ferry_net::client::get(&cfg, "/pub", out.path(), reporter())
        .await
        .unwrap();
    assert!(r.is_success(), "{r:?}");
    assert_eq!(
        std::fs::read_link(out.path().join("pub/leak")).unwrap(),
        Path::new("../priv")
    );
    assert!(!any_file_contains(out.path(), b"secret"));
    // The administrator's scope is the root: the same link leads to /priv, inside it.
    let admin = bed.as_token(&bed.admin, ExistingPolicy::Fail);
    let out2 = tempfile::tempdir().unwrap();
    let r = ferry_net::client::get(&admin, "/pub/leak/c.txt", out2.path(), reporter())
        .await
        .unwrap();
    assert!(r.is_success(), "{r:?}");
    bed.server.stop().await;
}

/// A prefix whose path holds a symlink is refused rather than followed: a writer of a parent
/// directory could otherwise move another token's scope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_that_is_a_symlink_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    let moved =
        access::add_token(&tokens, "moved", vec!["/shared/x".into()], vec![], true).unwrap();
    let server = TestServer::start_with(|c| c.access = Arc::new(Access::file(&tokens))).await;
    write(&server.root.join("priv/c.txt"), b"secret");
    std::fs::create_dir(server.root.join("shared")).unwrap();
    std::os::unix::fs::symlink("../priv", server.root.join("shared/x")).unwrap();
    let mut cfg = server.client();
    cfg.token = moved;
    let out = tempfile::tempdir().unwrap();
    let r = ferry_net::client::get(&cfg, "/shared/x/c.txt", out.path(), reporter()).await;
    let Err(e) = r else {
        panic!("expected a refusal: {r:?}")
    };
    assert!(e.to_string().contains("symlink"), "{e}");
    assert!(!any_file_contains(out.path(), b"secret"));
    server.stop().await;
}

/// Setuid, setgid and world-writable bits are cleared on a put by default and kept when the
/// server is told to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setuid_setgid_and_world_write_are_cleared() {
    let local = tempfile::tempdir().unwrap();
    let tree = local.path().join("t");
    std::fs::create_dir(&tree).unwrap();
    write(&tree.join("suid"), b"#!/bin/sh\n");
    std::fs::set_permissions(tree.join("suid"), std::fs::Permissions::from_mode(0o6777)).unwrap();
    write(&tree.join("plain"), b"x");
    std::fs::set_permissions(tree.join("plain"), std::fs::Permissions::from_mode(0o640)).unwrap();
    let sub = tree.join("sgid-dir");
    std::fs::create_dir(&sub).unwrap();
    std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o2777)).unwrap();
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o7777;

    for keep in [false, true] {
        let server = TestServer::start_with(|c| {
            if keep {
                c.modes = ferry_core::recv::Modes::Keep;
            }
        })
        .await;
        let r = ferry_net::client::put(
            &server.client(),
            std::slice::from_ref(&tree),
            "/",
            reporter(),
        )
        .await
        .unwrap();
        assert!(r.is_success(), "{r:?}");
        let at = server.root.join("t");
        if keep {
            assert_eq!(mode(&at.join("suid")), 0o6777);
            assert_eq!(mode(&at.join("sgid-dir")), 0o2777);
        } else {
            assert_eq!(mode(&at.join("suid")), 0o775);
            assert_eq!(mode(&at.join("sgid-dir")), 0o775);
        }
        assert_eq!(mode(&at.join("plain")), 0o640);

        // A get clears them on the client the same way, unless asked.
        let out = tempfile::tempdir().unwrap();
        let mut cfg = server.client();
        if keep {
            cfg.modes = ferry_core::recv::Modes::Keep;
        }
        let r = ferry_net::client::get(&cfg, "/t", out.path(), reporter())
            .await
            .unwrap();
        assert!(r.is_success(), "{r:?}");
        let want = if keep { 0o6777 } else { 0o775 };
        // The server stored 0o775 unless it kept the bits: a get sees what it stored.
        assert_eq!(mode(&out.path().join("t/suid")), want);
        server.stop().await;
    }
}

/// `get --safe-links` refuses links that are absolute or climb out of the tree; the others
/// are made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_with_safe_links_refuses_links_out_of_the_tree() {
    let server = TestServer::start().await;
    let t = server.root.join("t");
    write(&t.join("d/f"), b"f");
    std::os::unix::fs::symlink("/etc/passwd", t.join("abs")).unwrap();
    std::os::unix::fs::symlink("../../outside", t.join("d/up")).unwrap();
    std::os::unix::fs::symlink("../f2", t.join("d/ok")).unwrap();
    std::os::unix::fs::symlink("d/f", t.join("inside")).unwrap();
    for safe in [false, true] {
        let out = tempfile::tempdir().unwrap();
        let mut cfg = server.client();
        if safe {
            cfg.links = ferry_core::recv::Links::InTree;
        }
        let r = ferry_net::client::get(&cfg, "/t", out.path(), reporter())
            .await
            .unwrap();
        let made = |p: &str| std::fs::symlink_metadata(out.path().join("t").join(p)).is_ok();
        assert!(made("inside") && made("d/ok") && made("d/f"));
        if safe {
            assert_eq!(r.failed, 2, "{r:?}");
            assert!(!made("abs") && !made("d/up"));
            assert!(
                r.errors.iter().any(|e| e.contains("leaves the tree")),
                "{:?}",
                r.errors
            );
        } else {
            assert!(r.is_success(), "{r:?}");
            assert!(made("abs") && made("d/up"));
        }
    }
    server.stop().await;
}
