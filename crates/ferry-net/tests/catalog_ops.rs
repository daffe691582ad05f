//! The catalog's user operations over the wire (issue 39): stat, meta, find answered from the
//! server's catalog; rm, mv and mkdir keeping files and catalog in step; every one under the
//! token's scopes and confined beneath them, symlinks included.

use crate::util;

use std::path::Path;
use std::sync::Arc;

use ferry_catalog::{Catalog, Location};
use ferry_core::NoReporter;
use ferry_net::access::{self, Access};
use ferry_net::catalog::{self as cat, Changed};
use ferry_net::{ClientConfig, SessionError};
use ferry_proto::{Compare, ErrorCode, FindCondition, FindRequest, MetaEntry, ReplicaHealth};
use util::*;

const R: &NoReporter = &NoReporter;

fn memory_catalog() -> Arc<Catalog> {
    Arc::new(Catalog::open(&Location::Memory, "test").unwrap())
}

/// The code of a refusal (panics on success).
fn code<T: std::fmt::Debug>(r: Result<T, SessionError>) -> ErrorCode {
    match r {
        Err(SessionError::Remote { code, .. }) => code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn message<T: std::fmt::Debug>(r: Result<T, SessionError>) -> String {
    match r {
        Err(SessionError::Remote { message, .. }) => message,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn entry(attr: &str, value: &str, unit: &str) -> MetaEntry {
    MetaEntry {
        attr: attr.into(),
        value: value.into(),
        unit: unit.into(),
    }
}

fn find_under(under: &str) -> FindRequest {
    FindRequest {
        under: under.into(),
        conditions: Vec::new(),
        name: None,
        newer_ns: None,
        larger: None,
        limit: 1000,
    }
}

fn cond(compare: Compare, attr: &str, value: &str) -> FindCondition {
    FindCondition {
        compare,
        attr: attr.into(),
        value: value.into(),
    }
}

async fn paths_found(cfg: &ClientConfig, f: FindRequest) -> Vec<String> {
    let found = cat::find(cfg, f, R).await.unwrap();
    found.objects.into_iter().map(|o| o.path).collect()
}

/// Puts a small tree (`a.dat`, `b.txt`, `sub/c.dat`) to `dest` on the server.
async fn put_tree(cfg: &ClientConfig, dest: &str) {
    let src = tempfile::tempdir().unwrap();
    let top = src.path().join("tree");
    write(&top.join("a.dat"), &bytes(3000, 1));
    write(&top.join("b.txt"), &bytes(10, 2));
    write(&top.join("sub/c.dat"), &bytes(50_000, 3));
    let r = ferry_net::client::put(cfg, std::slice::from_ref(&top), dest, reporter())
        .await
        .unwrap();
    assert!(r.is_success(), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stat_meta_and_find_answer_from_the_catalog() {
    let catalog = memory_catalog();
    let c2 = catalog.clone();
    let server = TestServer::start_with(move |c| c.catalog = Some(c2)).await;
    let cfg = server.client();
    put_tree(&cfg, "/in/").await;

    let s = cat::stat(&cfg, "/in/tree/a.dat", R).await.unwrap();
    assert_eq!(s.object.path, "in/tree/a.dat");
    assert_eq!(s.object.size, 3000);
    assert_eq!(s.object.algo, "blake3");
    assert_eq!(s.object.digest, blake3::hash(&bytes(3000, 1)).as_bytes());
    assert_eq!(s.object.stored_by, "default");
    assert!(s.object.stored_at > 0);
    assert_eq!(s.replicas.len(), 1);
    assert_eq!(s.replicas[0].state, ReplicaHealth::Good);
    assert!(s.metadata.is_empty());

    let set = |p: &'static str, e: MetaEntry| {
        let cfg = cfg.clone();
        async move { cat::meta_set(&cfg, p, e, R).await }
    };
    set("/in/tree/a.dat", entry("temp", "42.5", "K"))
        .await
        .unwrap();
    set("/in/tree/sub/c.dat", entry("temp", "12", "K"))
        .await
        .unwrap();
    set("/in/tree/a.dat", entry("instrument", "xrd", ""))
        .await
        .unwrap();
    let meta = cat::meta_ls(&cfg, "/in/tree/a.dat", R).await.unwrap();
    assert_eq!(
        meta,
        [entry("instrument", "xrd", ""), entry("temp", "42.5", "K")]
    );
    let s = cat::stat(&cfg, "/in/tree/a.dat", R).await.unwrap();
    assert_eq!(s.metadata, meta);

    // Each part of a find, alone and together.
    let mut f = find_under("/in");
    f.conditions = vec![cond(Compare::Gt, "temp", "40")];
    assert_eq!(paths_found(&cfg, f).await, ["in/tree/a.dat"]);
    let mut f = find_under("/in");
    f.conditions = vec![cond(Compare::Eq, "temp", "12")];
    assert_eq!(paths_found(&cfg, f).await, ["in/tree/sub/c.dat"]);
    let mut f = find_under("/in/tree");
    f.name = Some("*.dat".into());
    assert_eq!(
        paths_found(&cfg, f).await,
        ["in/tree/a.dat", "in/tree/sub/c.dat"]
    );
    let mut f = find_under("/");
    f.larger = Some(10_000);
    assert_eq!(paths_found(&cfg, f).await, ["in/tree/sub/c.dat"]);
    let mut f = find_under("/in");
    f.newer_ns = Some(i64::MAX);
    assert!(paths_found(&cfg, f).await.is_empty());
    // Bounded: one asked, one given, and the answer says more matched.
    let mut f = find_under("/in");
    f.limit = 1;
    let found = cat::find(&cfg, f, R).await.unwrap();
    assert_eq!(found.objects.len(), 1);
    assert!(found.more);
    let found = cat::find(&cfg, find_under("/in"), R).await.unwrap();
    assert_eq!(found.objects.len(), 3);
    assert!(!found.more);

    let n = cat::meta_rm(&cfg, "/in/tree/a.dat", "temp", None, R)
        .await
        .unwrap();
    assert_eq!(n.objects, 1);
    let mut f = find_under("/in");
    f.conditions = vec![cond(Compare::Gt, "temp", "40")];
    assert!(paths_found(&cfg, f).await.is_empty());

    // Refusals: an unregistered path, a comparison with no number.
    assert_eq!(
        code(cat::stat(&cfg, "/in/tree/none", R).await),
        ErrorCode::NOT_FOUND
    );
    assert_eq!(
        code(set("/in/tree/none", entry("a", "b", "")).await),
        ErrorCode::NOT_FOUND
    );
    let mut f = find_under("/in");
    f.conditions = vec![cond(Compare::Lt, "temp", "warm")];
    assert_eq!(code(cat::find(&cfg, f, R).await), ErrorCode::BAD_REQUEST);
    server.stop().await;
}

/// An object's metadata is bounded in count: the one past the bound is refused, the same
/// entry again still replaces its unit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_per_object_is_bounded() {
    let catalog = memory_catalog();
    let c2 = catalog.clone();
    let server = TestServer::start_with(move |c| c.catalog = Some(c2)).await;
    let cfg = server.client();
    put_tree(&cfg, "/in/").await;
    // Straight into the catalog up to the bound; the server counts what is there.
    for i in 0..ferry_proto::MAX_META_ENTRIES {
        let avu = ferry_catalog::Avu {
            attr: format!("a{i:03}"),
            value: "v".into(),
            unit: String::new(),
        };
        catalog.meta_set("in/tree/a.dat", &avu).unwrap();
    }
    let r = cat::meta_set(&cfg, "/in/tree/a.dat", entry("one", "more", ""), R).await;
    let why = message(r);
    assert!(why.contains("at most 128"), "{why}");
    cat::meta_set(&cfg, "/in/tree/a.dat", entry("a000", "v", "m"), R)
        .await
        .unwrap();
    let s = cat::stat(&cfg, "/in/tree/a.dat", R).await.unwrap();
    assert_eq!(s.metadata.len(), ferry_proto::MAX_META_ENTRIES);
    assert_eq!(s.metadata[0], entry("a000", "v", "m"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rm_mv_and_mkdir_keep_files_and_catalog_in_step() {
    let catalog = memory_catalog();
    let c2 = catalog.clone();
    let server = TestServer::start_with(move |c| c.catalog = Some(c2)).await;
    let root = server.root.clone();
    let cfg = server.client();
    put_tree(&cfg, "/in/").await;

    // A file moved: its object with it, metadata kept.
    cat::meta_set(&cfg, "/in/tree/a.dat", entry("k", "v", ""), R)
        .await
        .unwrap();
    let m = cat::rename(&cfg, "/in/tree/a.dat", "/in/moved.dat", R)
        .await
        .unwrap();
    assert_eq!(
        m,
        Changed {
            entries: 1,
            objects: 1
        }
    );
    assert!(root.join("in/moved.dat").is_file());
    assert!(!root.join("in/tree/a.dat").exists());
    let s = cat::stat(&cfg, "/in/moved.dat", R).await.unwrap();
    assert_eq!(s.metadata, [entry("k", "v", "")]);
    assert_eq!(
        code(cat::stat(&cfg, "/in/tree/a.dat", R).await),
        ErrorCode::NOT_FOUND
    );

    // Directories: made, with and without their parents.
    assert_eq!(
        code(cat::mkdir(&cfg, "/in/x/y", false, R).await),
        ErrorCode::NOT_FOUND
    );
    cat::mkdir(&cfg, "/in/archive/2026", true, R).await.unwrap();
    assert!(root.join("in/archive/2026").is_dir());
    cat::mkdir(&cfg, "/in/archive/2026", true, R).await.unwrap();
    assert_eq!(
        code(cat::mkdir(&cfg, "/in/archive/2026", false, R).await),
        ErrorCode::EXISTS
    );

    // A tree moved into an existing directory, as `mv` does.
    let m = cat::rename(&cfg, "/in/tree", "/in/archive/2026", R)
        .await
        .unwrap();
    assert_eq!(m.objects, 2);
    assert!(root.join("in/archive/2026/tree/sub/c.dat").is_file());
    assert_eq!(
        paths_found(&cfg, find_under("/in/archive")).await,
        [
            "in/archive/2026/tree/b.txt",
            "in/archive/2026/tree/sub/c.dat"
        ]
    );
    // Onto an existing file: refused, nothing changed.
    assert_eq!(
        code(cat::rename(&cfg, "/in/moved.dat", "/in/archive/2026/tree/b.txt", R).await),
        ErrorCode::EXISTS
    );
    assert!(root.join("in/moved.dat").is_file());
    // Into itself: refused.
    assert_eq!(
        code(cat::rename(&cfg, "/in/archive", "/in/archive/2026/deeper", R).await),
        ErrorCode::BAD_REQUEST
    );

    // A catalog that refuses the rename (an entry left at the target, its file gone behind
    // ferry's back): the file is moved back, and the error says so.
    std::fs::remove_file(root.join("in/archive/2026/tree/b.txt")).unwrap();
    let r = cat::rename(&cfg, "/in/moved.dat", "/in/archive/2026/tree/b.txt", R).await;
    let why = message(r);
    assert!(why.contains("moved back"), "{why}");
    assert!(root.join("in/moved.dat").is_file());
    assert!(!root.join("in/archive/2026/tree/b.txt").exists());
    // rm of a path whose file is gone forgets its entry; then there is nothing to remove.
    let r = cat::remove(&cfg, "/in/archive/2026/tree/b.txt", false, R)
        .await
        .unwrap();
    assert_eq!(
        r,
        Changed {
            entries: 0,
            objects: 1
        }
    );
    assert_eq!(
        code(cat::remove(&cfg, "/in/archive/2026/tree/b.txt", false, R).await),
        ErrorCode::NOT_FOUND
    );

    // A directory needs -r; with it, the tree and its objects go.
    assert_eq!(
        code(cat::remove(&cfg, "/in/archive", false, R).await),
        ErrorCode::IO
    );
    let r = cat::remove(&cfg, "/in/archive", true, R).await.unwrap();
    assert_eq!(
        r,
        Changed {
            entries: 5,
            objects: 1
        }
    );
    assert!(!root.join("in/archive").exists());
    assert!(paths_found(&cfg, find_under("/in/archive"))
        .await
        .is_empty());
    let r = cat::remove(&cfg, "/in/moved.dat", false, R).await.unwrap();
    assert_eq!(r.objects, 1);
    assert_eq!(catalog.count().unwrap(), 0);
    server.stop().await;
}

struct Bed {
    server: TestServer,
    writer: String,
    reader: String,
    _tokens: tempfile::TempDir,
}

/// `/pub` readable and `/incoming` writable for `writer`, `/pub` readable for a read-only
/// `reader`, `/priv` for neither; a file registered in each (put by a full-access admin).
async fn bed() -> Bed {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    let writer = access::add_token(
        &tokens,
        "writer",
        vec!["/pub".into(), "/incoming".into()],
        vec!["/incoming".into()],
        false,
    )
    .unwrap();
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
    for dest in ["/pub/", "/priv/", "/incoming/"] {
        put_tree(&cfg, dest).await;
    }
    Bed {
        server,
        writer,
        reader,
        _tokens: dir,
    }
}

impl Bed {
    fn as_token(&self, token: &str) -> ClientConfig {
        let mut c = self.server.client();
        c.token = token.to_owned();
        c
    }

    fn priv_untouched(&self) {
        let p = self.server.root.join("priv/tree");
        assert_eq!(names(&p), ["a.dat", "b.txt", "sub", "sub/c.dat"]);
        assert_eq!(std::fs::read(p.join("a.dat")).unwrap(), bytes(3000, 1));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_need_the_read_scope_and_changes_the_write_scope() {
    let bed = bed().await;
    let w = bed.as_token(&bed.writer);
    let r = bed.as_token(&bed.reader);
    let denied = ErrorCode::DENIED;
    // Reads: in scope answered, out of scope refused (a find of the whole tree too).
    cat::stat(&r, "/pub/tree/a.dat", R).await.unwrap();
    cat::meta_ls(&r, "/pub/tree/a.dat", R).await.unwrap();
    assert_eq!(paths_found(&r, find_under("/pub")).await.len(), 3);
    assert_eq!(code(cat::stat(&w, "/priv/tree/a.dat", R).await), denied);
    assert_eq!(code(cat::meta_ls(&w, "/priv/tree/a.dat", R).await), denied);
    assert_eq!(code(cat::find(&w, find_under("/"), R).await), denied);
    assert_eq!(code(cat::find(&w, find_under("/priv"), R).await), denied);
    // Changes: refused where the token may only read, or not at all.
    let e = entry("k", "v", "");
    assert_eq!(
        code(cat::meta_set(&r, "/pub/tree/a.dat", e.clone(), R).await),
        denied
    );
    assert_eq!(
        code(cat::meta_set(&w, "/pub/tree/a.dat", e.clone(), R).await),
        denied
    );
    assert_eq!(
        code(cat::meta_rm(&w, "/pub/tree/a.dat", "k", None, R).await),
        denied
    );
    assert_eq!(
        code(cat::remove(&w, "/pub/tree/a.dat", false, R).await),
        denied
    );
    assert_eq!(code(cat::remove(&w, "/priv", true, R).await), denied);
    assert_eq!(code(cat::mkdir(&r, "/pub/new", false, R).await), denied);
    assert_eq!(
        code(cat::rename(&w, "/incoming/tree", "/pub/tree2", R).await),
        denied
    );
    assert_eq!(
        code(cat::rename(&w, "/pub/tree", "/incoming/stolen", R).await),
        denied
    );
    assert!(bed.server.root.join("pub/tree/a.dat").is_file());
    // In scope, the same changes are made.
    cat::meta_set(&w, "/incoming/tree/a.dat", e, R)
        .await
        .unwrap();
    cat::rename(&w, "/incoming/tree", "/incoming/t2", R)
        .await
        .unwrap();
    // The top of a scope is neither removed nor moved.
    assert_eq!(
        code(cat::remove(&w, "/incoming", true, R).await),
        ErrorCode::BAD_REQUEST
    );
    assert_eq!(
        code(cat::rename(&w, "/incoming", "/incoming/x", R).await),
        ErrorCode::BAD_REQUEST
    );
    cat::remove(&w, "/incoming/t2", true, R).await.unwrap();
    bed.priv_untouched();
    bed.server.stop().await;
}

/// Neither `..` nor a symlink stored in a scope leads an operation out of it: a link is
/// removed as itself, never followed to what it names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_stay_confined_through_dots_and_links() {
    let bed = bed().await;
    let w = bed.as_token(&bed.writer);
    let root = bed.server.root.clone();
    std::os::unix::fs::symlink("../priv/tree", root.join("incoming/esc")).unwrap();
    std::os::unix::fs::symlink("/", root.join("incoming/abs")).unwrap();

    // `..` never resolves.
    let r = cat::stat(&w, "/incoming/../priv/tree/a.dat", R).await;
    assert_ne!(code(r), ErrorCode::NOT_FOUND);
    let r = cat::remove(&w, "/incoming/../priv/tree/a.dat", false, R).await;
    assert!(r.is_err());
    // Through a link: refused, the far side untouched.
    for link in ["esc", "abs"] {
        let inside = if link == "esc" { "a.dat" } else { "tmp" };
        let p = format!("/incoming/{link}/{inside}");
        assert!(cat::remove(&w, &p, true, R).await.is_err(), "rm {p}");
        let to = format!("/incoming/got-{link}");
        assert!(cat::rename(&w, &p, &to, R).await.is_err(), "mv {p}");
        let made = format!("/incoming/{link}/new/dir");
        assert!(
            cat::mkdir(&w, &made, true, R).await.is_err(),
            "mkdir {made}"
        );
    }
    assert!(!root.join("incoming/got-esc").exists());
    assert!(!root.join("priv/tree/new").exists());
    bed.priv_untouched();
    // A link removed (even with -r) is the link, not what it points to.
    cat::remove(&w, "/incoming/esc", true, R).await.unwrap();
    assert!(std::fs::symlink_metadata(root.join("incoming/esc")).is_err());
    bed.priv_untouched();
    // A tree holding a link to elsewhere: the link goes, its target stays.
    std::os::unix::fs::symlink("../../priv/tree", root.join("incoming/tree/sub/lnk")).unwrap();
    cat::remove(&w, "/incoming/tree", true, R).await.unwrap();
    assert!(!root.join("incoming/tree").exists());
    bed.priv_untouched();
    bed.server.stop().await;
}

/// A server without a catalog refuses what needs one and still removes, renames and makes
/// directories.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_catalog_files_alone() {
    let server = TestServer::start().await;
    let root = server.root.clone();
    let cfg = server.client();
    put_tree(&cfg, "/in/").await;
    let r = cat::stat(&cfg, "/in/tree/a.dat", R).await;
    assert!(message(r).contains("no catalog"));
    let r = cat::find(&cfg, find_under("/in"), R).await;
    assert_eq!(code(r), ErrorCode::BAD_REQUEST);
    let r = cat::meta_set(&cfg, "/in/tree/a.dat", entry("a", "b", ""), R).await;
    assert_eq!(code(r), ErrorCode::BAD_REQUEST);
    cat::mkdir(&cfg, "/in/d", false, R).await.unwrap();
    cat::rename(&cfg, "/in/tree/a.dat", "/in/d", R)
        .await
        .unwrap();
    assert!(root.join("in/d/a.dat").is_file());
    let r = cat::remove(&cfg, "/in/tree", true, R).await.unwrap();
    assert_eq!(
        r,
        Changed {
            entries: 4,
            objects: 0
        }
    );
    assert!(!Path::new(&root.join("in/tree")).exists());
    server.stop().await;
}

/// A find's answer past one frame's worth comes in several, in path order, capped at the limit
/// with `more` said once, at its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_find_comes_in_frames_and_stops_at_its_limit() {
    let catalog = memory_catalog();
    let n = 3 * ferry_proto::MAX_FOUND_ENTRIES + 7;
    let commits: Vec<ferry_catalog::Commit> = (0..n)
        .map(|i| ferry_catalog::Commit {
            path: format!("big/f{i:05}"),
            size: i as u64,
            mtime_ns: 1,
            digest: vec![1; 32],
            algo: "blake3".into(),
            stored_by: "t".into(),
            physical: format!("/srv/big/f{i:05}"),
        })
        .collect();
    catalog.register(&commits).unwrap();
    let c2 = catalog.clone();
    let server = TestServer::start_with(move |c| c.catalog = Some(c2)).await;
    let cfg = server.client();
    let all = cat::find(&cfg, find_under("/big"), R).await.unwrap();
    assert!(!all.more);
    let want: Vec<String> = (0..n).map(|i| format!("big/f{i:05}")).collect();
    let got: Vec<String> = all.objects.into_iter().map(|o| o.path).collect();
    assert_eq!(got, want);
    let mut f = find_under("/big");
    f.limit = 2 * ferry_proto::MAX_FOUND_ENTRIES as u32 + 1;
    let some = cat::find(&cfg, f, R).await.unwrap();
    assert!(some.more);
    assert_eq!(some.objects.len(), 2 * ferry_proto::MAX_FOUND_ENTRIES + 1);
    assert_eq!(some.objects[0].path, "big/f00000");
    let mut f = find_under("/big");
    f.limit = n as u32;
    let exact = cat::find(&cfg, f, R).await.unwrap();
    assert_eq!((exact.objects.len(), exact.more), (n, false));
    server.stop().await;
}
