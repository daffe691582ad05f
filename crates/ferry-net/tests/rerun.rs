//! Running the same transfer again is a no-op (issue 34): for every shape of tree the other
//! tests use (mixed sizes, deep, odd names, symlinks, empty files and directories with their
//! modes and mtimes), a put and then the same put again, a get and then the same get again.
//! The second run succeeds, stores nothing, counts every file and symlink as skipped, sends no
//! data beyond what a sender sends before its first decision comes back (the early budget),
//! and leaves the tree exactly as it was, to the nanosecond.

use crate::util;

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use ferry_proto::ExistingPolicy;
use util::*;

// ---------------------------------------------------------------------------------------------
// what a tree is, exactly

/// Relative path ("" for the top) → (kind, content digest or link target, mode, mtime in ns).
/// Stricter than `util::snapshot`: whole nanoseconds, and symlinks' own mtimes too.
type Exact = BTreeMap<String, (char, String, u32, i64)>;

fn exact(top: &Path) -> Exact {
    let mut out = Exact::new();
    let mut stack = vec![top.to_path_buf()];
    let mut seen = 0;
    while let Some(p) = stack.pop() {
        seen += 1;
        assert!(seen < 100_000, "runaway walk of {}", top.display());
        let m = std::fs::symlink_metadata(&p).unwrap();
        let rel = p.strip_prefix(top).unwrap().to_string_lossy().into_owned();
        let ns = m.mtime() * 1_000_000_000 + m.mtime_nsec();
        let mode = m.permissions().mode() & 0o7777;
        let ft = m.file_type();
        let entry = if ft.is_symlink() {
            let target = std::fs::read_link(&p).unwrap();
            ('l', target.to_string_lossy().into_owned(), 0, ns)
        } else if ft.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
            ('d', String::new(), mode, ns)
        } else {
            let digest = blake3::hash(&std::fs::read(&p).unwrap())
                .to_hex()
                .to_string();
            ('f', digest, mode, ns)
        };
        out.insert(rel, entry);
    }
    out
}

/// How two trees differ, briefly ("" when they are the same).
fn diff(want: &Exact, got: &Exact) -> String {
    let mut out: Vec<String> = Vec::new();
    for (k, v) in want {
        match got.get(k) {
            None => out.push(format!("missing {k:?}")),
            Some(g) if g != v => out.push(format!("{k:?}: want {v:?}, got {g:?}")),
            _ => {}
        }
    }
    out.extend(
        got.keys()
            .filter(|k| !want.contains_key(*k))
            .map(|k| format!("extra {k:?}")),
    );
    let n = out.len();
    out.truncate(8);
    if n > 8 {
        out.push(format!("... {} more", n - 8));
    }
    out.join("\n")
}

/// Files and symlinks: what a re-run reports as skipped.
fn skippable(tree: &Exact) -> u64 {
    tree.values().filter(|(kind, ..)| *kind != 'd').count() as u64
}

// ---------------------------------------------------------------------------------------------
// building trees with exact metadata

fn ns_time(ns: i64) -> std::time::SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns as u64)
}

fn make_file(p: &Path, data: &[u8], mode: u32, mtime_ns: i64) {
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).unwrap();
    }
    let f = std::fs::File::create(p).unwrap();
    std::io::Write::write_all(&mut &f, data).unwrap();
    f.set_modified(ns_time(mtime_ns)).unwrap();
    f.set_permissions(std::fs::Permissions::from_mode(mode))
        .unwrap();
}

fn make_link(target: &str, p: &Path, mtime_ns: i64) {
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).unwrap();
    }
    std::os::unix::fs::symlink(target, p).unwrap();
    set_link_mtime(p, mtime_ns);
}

/// `lutimes`: std sets times only through an open file, which would follow the link.
fn set_link_mtime(p: &Path, mtime_ns: i64) {
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let t = libc::timespec {
        tv_sec: mtime_ns.div_euclid(1_000_000_000),
        tv_nsec: mtime_ns.rem_euclid(1_000_000_000),
    };
    // SAFETY: `c` is a valid NUL-terminated path and `times` points at two timespecs.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            [t, t].as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(rc, 0, "utimensat {}", p.display());
}

/// Gives every directory under `top` (and `top`) a mode and an mtime of its own, deepest first:
/// making entries changes a directory's mtime, so this comes last.
fn settle_dirs(top: &Path, modes: &[u32]) {
    let mut dirs: Vec<_> = exact(top)
        .into_iter()
        .filter(|(_, v)| v.0 == 'd')
        .map(|(k, _)| k)
        .collect();
    dirs.sort_by_key(|k| {
        std::cmp::Reverse(if k.is_empty() {
            0
        } else {
            1 + k.matches('/').count()
        })
    });
    for (i, rel) in dirs.iter().enumerate() {
        let p = top.join(rel);
        let f = std::fs::File::open(&p).unwrap();
        f.set_modified(ns_time(
            1_300_000_000_000_000_000 + i as i64 * 1_000_003_001,
        ))
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(modes[i % modes.len()]))
            .unwrap();
    }
}

fn t(i: u64) -> i64 {
    1_500_000_000_000_000_000 + i as i64 * 7_919_000_013
}

/// Files of every size class (empty, one byte, one block, just over, several blocks, larger
/// than the early budget of a stream), modes, nested directories, empty ones, a few links.
fn mixed(top: &Path) {
    let sizes = [
        0,
        1,
        1000,
        BLOCK as usize - 1,
        BLOCK as usize,
        BLOCK as usize + 1,
        3 * BLOCK as usize + 5,
        300_000,
        1 << 20,
    ];
    let modes = [0o644, 0o600, 0o755, 0o444, 0o640];
    for (i, size) in sizes.iter().enumerate() {
        let i = i as u64;
        make_file(
            &top.join(format!("f{i}.bin")),
            &bytes(*size, i),
            modes[i as usize % 5],
            t(i),
        );
        make_file(
            &top.join(format!("sub{}/g{i}.bin", i % 3)),
            &bytes(*size / 3, 100 + i),
            0o644,
            t(100 + i),
        );
    }
    for i in 0..120u64 {
        make_file(
            &top.join(format!("many/{i:03}")),
            &bytes((i as usize * 37) % 3000, i),
            0o644,
            t(i),
        );
    }
    std::fs::create_dir_all(top.join("empty")).unwrap();
    std::fs::create_dir_all(top.join("sub1/empty/too")).unwrap();
    make_link("f1.bin", &top.join("link"), t(7));
    make_link("../f2.bin", &top.join("sub2/up"), t(8));
    settle_dirs(top, &[0o755, 0o750, 0o700]);
}

/// Forty levels, a file at each, an empty directory and a link at the bottom.
fn deep(top: &Path) {
    let mut dir = top.to_path_buf();
    for level in 0..40u64 {
        dir = dir.join(format!("level{level:02}"));
        make_file(
            &dir.join("here.txt"),
            &bytes(100 + level as usize, level),
            0o644,
            t(level),
        );
    }
    std::fs::create_dir(dir.join("bottom")).unwrap();
    make_link("../level38/here.txt", &dir.join("up"), t(99));
    settle_dirs(top, &[0o755, 0o711]);
}

/// Names a shell or a parser would trip over, as files, as directories, as links and as link
/// targets.
fn odd_names(top: &Path) {
    let mut names: Vec<String> = [
        "with space",
        " leading space",
        "trailing space ",
        "single'quote",
        "double\"quote",
        "new\nline",
        "tab\there",
        "carriage\rreturn",
        "-leading-dash",
        "--",
        "-",
        "emoji 🦀🚀",
        "日本語のファイル",
        "...",
        "..hidden",
        ".hidden",
        "a..b",
        "back\\slash",
        "%s%n%x",
        "*?[glob]",
        "$(echo pwned)",
        "#hash",
        "~tilde",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    names.push("n".repeat(255));
    names.push(format!("{}x", "é".repeat(127)));
    for (i, n) in names.iter().enumerate() {
        let i = i as u64;
        make_file(&top.join(n), &bytes(10 + i as usize, i), 0o644, t(i));
        make_file(
            &top.join("dirs").join(n).join(n),
            &bytes(3 * i as usize, 100 + i),
            0o600,
            t(i + 50),
        );
        if n.len() < 200 {
            make_link(
                &format!("../{n}"),
                &top.join("links").join(format!("to {n}")),
                t(i + 200),
            );
        }
    }
    settle_dirs(top, &[0o755]);
}

/// Links of every kind: relative, upwards, absolute, dangling, to a directory (not followed),
/// to themselves, with odd names and odd targets; and a farm of many in one directory, which
/// several writer threads handle at once.
fn symlinks(top: &Path) {
    make_file(&top.join("data.txt"), b"inside data", 0o644, t(1));
    make_file(&top.join("sub/deeper/file.txt"), b"deeper", 0o644, t(2));
    let links: &[(&str, &str)] = &[
        ("rel", "data.txt"),
        ("sub/up", "../data.txt"),
        ("sub/deeper/upup", "../../sub"),
        ("dirlink", "sub"),
        ("absolute", "/etc/hostname"),
        ("relative_escape", "../../../../../../etc/passwd"),
        ("dangling", "does/not/exist"),
        ("dangling_abs", "/nonexistent/ferry/target"),
        ("self", "self"),
        ("odd target", "a b/'c'\n\"d\"/🦀"),
        ("link 'odd' \"name\"\n\t🦀", "../data.txt/../x"),
        ("-dash link", "--"),
    ];
    for (i, (rel, target)) in links.iter().enumerate() {
        make_link(target, &top.join(rel), t(10 + i as u64));
    }
    for i in 0..300u64 {
        make_link(
            &format!("target-{i}"),
            &top.join(format!("farm/l{i:03}")),
            t(i),
        );
    }
    settle_dirs(top, &[0o755, 0o700]);
}

/// Nothing but empty files and empty directories, with modes and mtimes of their own
/// (sub-second, before 1970's first second, read-only).
fn empties(top: &Path) {
    let files: &[(&str, u32, i64)] = &[
        ("empty.bin", 0o600, 1_000_000_000_123_456_789),
        ("readonly", 0o444, 1_200_000_000_999_999_999),
        ("exec", 0o755, 1_100_000_000_000_000_001),
        ("old", 0o644, 1_000_000_000),
        ("epoch", 0o644, 0),
        ("a/b/c/zero", 0o640, 1_370_000_000_000_000_009),
        ("private/nothing", 0o600, 1_310_000_000_000_000_000),
    ];
    for (rel, mode, ns) in files {
        make_file(&top.join(rel), b"", *mode, *ns);
    }
    for d in ["emptydir", "private/empty", "a/b/also-empty", "x/y/z"] {
        std::fs::create_dir_all(top.join(d)).unwrap();
    }
    settle_dirs(top, &[0o755, 0o700, 0o750, 0o711]);
}

// ---------------------------------------------------------------------------------------------
// the runs

async fn put(cfg: &ferry_net::ClientConfig, src: &Path, dest: &str) -> ferry_net::TransferReport {
    ferry_net::client::put(cfg, &[src.to_path_buf()], dest, reporter())
        .await
        .unwrap_or_else(|e| panic!("put {} to {dest}: {e}", src.display()))
}

async fn get(cfg: &ferry_net::ClientConfig, src: &str, dest: &Path) -> ferry_net::TransferReport {
    ferry_net::client::get(cfg, src, dest, reporter())
        .await
        .unwrap_or_else(|e| panic!("get {src} to {}: {e}", dest.display()))
}

fn assert_ok(r: &ferry_net::TransferReport, what: &str) {
    assert!(
        r.is_success(),
        "{what}: failed={} errors={:?}",
        r.failed,
        &r.errors[..r.errors.len().min(5)]
    );
}

/// Block bytes a session may send before its first decisions are back: one early cut per
/// stream, plus one block for each reader thread that found room just before it ran out.
fn early_bound(streams: u64, readers: u64) -> u64 {
    ferry_core::send::EARLY_PER_STREAM * streams + readers * u64::from(BLOCK)
}

/// Bytes a sending client may write on its data connections in a re-run of the tree at `src`
/// (`tree` is what it holds): the early block data, the head of every block that data could be cut into, and the
/// frame of each directory and symlink, each encoded as ferry encodes it.
fn put_bound(src: &Path, tree: &Exact, streams: u64, readers: u64) -> u64 {
    let top = src.file_name().unwrap().to_str().unwrap();
    let len = |f: ferry_proto::Frame| {
        let mut buf = bytes::BytesMut::new();
        f.encode(&mut buf);
        buf.len() as u64
    };
    let mut total = early_bound(streams, readers);
    for (rel, (kind, target, mode, mtime_ns)) in tree {
        let path = if rel.is_empty() {
            top.to_owned()
        } else {
            format!("{top}/{rel}")
        };
        total += match kind {
            'd' => len(ferry_proto::Frame::Dir {
                path,
                mode: *mode,
                mtime_ns: *mtime_ns,
            }),
            'l' => len(ferry_proto::Frame::Symlink {
                path,
                target: target.clone(),
                mtime_ns: *mtime_ns,
            }),
            _ => {
                let size = std::fs::symlink_metadata(src.join(rel)).unwrap().len();
                let blocks = size.div_ceil(u64::from(BLOCK)).max(1);
                let head = len(ferry_proto::Frame::Block(ferry_proto::Block {
                    file: ferry_proto::FileMeta {
                        id: ferry_proto::FileId(u64::MAX),
                        path,
                        size,
                        mode: *mode,
                        mtime_ns: *mtime_ns,
                    },
                    offset: u64::MAX,
                    digest: 0,
                    file_digest: Some(bytes::Bytes::from_static(&[0; 64])),
                    early: true,
                    data: bytes::Bytes::new(),
                }));
                blocks * head
            }
        };
    }
    total
}

/// A second run: a success that stored nothing and skipped every file and symlink.
fn assert_no_op(r: &ferry_net::TransferReport, tree: &Exact, what: &str) {
    assert_ok(r, what);
    assert_eq!(
        (r.files, r.bytes, r.failed),
        (0, 0, 0),
        "{what}: a re-run stored something"
    );
    assert_eq!(r.skipped, skippable(tree), "{what}: skipped");
}

/// Put, put again, get, get again; each copy must equal the source exactly, and stay so.
async fn rerun_is_a_no_op(shape: fn(&Path), name: &str) {
    let server = TestServer::start_in(fast_tempdir(), |_| {}).await;
    let cfg = server.client();
    let src = fast_tempdir();
    let tree = src.path().join(name);
    std::fs::create_dir(&tree).unwrap();
    shape(&tree);
    let want = exact(&tree);

    let r = put(&cfg, &tree, "/incoming/").await;
    assert_ok(&r, "first put");
    let on_server = server.root.join("incoming").join(name);
    assert_eq!(diff(&want, &exact(&on_server)), "", "first put");
    let r = put(&cfg, &tree, "/incoming/").await;
    assert_no_op(&r, &want, "second put");
    // A sending client counts whole frames: the entries' own frames come on top of the data.
    let sent: u64 = r.streams.iter().map(|s| s.bytes).sum();
    let bound = put_bound(
        &tree,
        &want,
        u64::from(cfg.opts.streams),
        cfg.readers as u64,
    );
    eprintln!("{name}: second put sent {sent} bytes in frames (bound {bound})");
    assert!(sent <= bound, "{name}: second put sent {sent} bytes");
    assert_eq!(diff(&want, &exact(&on_server)), "", "after the second put");
    assert_eq!(leftovers(&server.root), Vec::<String>::new());

    let back = fast_tempdir();
    let remote = format!("/incoming/{name}");
    let r = get(&cfg, &remote, back.path()).await;
    assert_ok(&r, "first get");
    let copy = back.path().join(name);
    assert_eq!(diff(&want, &exact(&copy)), "", "first get");
    let r = get(&cfg, &remote, back.path()).await;
    assert_no_op(&r, &want, "second get");
    // A receiving client counts block data only.
    let sent: u64 = r.streams.iter().map(|s| s.bytes).sum();
    let readers = ferry_net::ServerConfig::new(&server.root, TOKEN).readers as u64;
    let bound = early_bound(u64::from(cfg.opts.streams), readers);
    eprintln!("{name}: second get carried {sent} bytes of block data (bound {bound})");
    assert!(
        sent <= bound,
        "{name}: second get carried {sent} bytes of data"
    );
    assert_eq!(diff(&want, &exact(&copy)), "", "after the second get");
    assert_eq!(leftovers(back.path()), Vec::<String>::new());
    assert_eq!(
        names(back.path())
            .iter()
            .filter(|n| !n.starts_with(name))
            .count(),
        0
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerun_of_a_mixed_tree_is_a_no_op() {
    rerun_is_a_no_op(mixed, "mixed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerun_of_a_deep_tree_is_a_no_op() {
    rerun_is_a_no_op(deep, "deep").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerun_of_odd_names_is_a_no_op() {
    rerun_is_a_no_op(odd_names, "names").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerun_of_symlinks_is_a_no_op() {
    rerun_is_a_no_op(symlinks, "links").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerun_of_empty_files_and_dirs_is_a_no_op() {
    rerun_is_a_no_op(empties, "empties").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerun_of_a_single_symlink_is_a_no_op() {
    // A link as the whole transfer, not inside a tree.
    let server = TestServer::start().await;
    let cfg = server.client();
    let src = tempfile::tempdir().unwrap();
    let link = src.path().join("alone");
    make_link("somewhere/else", &link, t(3));
    assert_ok(&put(&cfg, &link, "/").await, "first put of a link");
    let r = put(&cfg, &link, "/").await;
    assert_ok(&r, "second put of a link");
    assert_eq!((r.files, r.bytes, r.skipped), (0, 0, 1), "{r:?}");
    let on_server = server.root.join("alone");
    assert_eq!(
        std::fs::read_link(&on_server).unwrap(),
        Path::new("somewhere/else")
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_with_a_new_target_still_needs_overwrite_and_a_stale_mtime_is_mended() {
    let server = TestServer::start().await;
    let mut cfg = server.client();
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("t");
    make_file(&tree.join("a"), b"a", 0o644, t(1));
    make_link("a", &tree.join("same"), t(2));
    make_link("a", &tree.join("moved"), t(3));
    assert_ok(&put(&cfg, &tree, "/").await, "first put");
    let on_server = server.root.join("t");

    // The same target with another mtime on the server: still complete; the mtime is mended.
    set_link_mtime(&on_server.join("same"), t(1000));
    // A link whose target changed at the source: not the same link.
    std::fs::remove_file(tree.join("moved")).unwrap();
    make_link("elsewhere", &tree.join("moved"), t(3));
    let want = exact(&tree);

    let r = put(&cfg, &tree, "/").await;
    assert_eq!(r.failed, 1, "{r:?}");
    assert!(
        r.errors
            .iter()
            .any(|e| e.contains("moved") && e.contains("--overwrite")),
        "{:?}",
        r.errors
    );
    assert_eq!(
        std::fs::read_link(on_server.join("moved")).unwrap(),
        Path::new("a")
    );
    assert_eq!(
        exact(&on_server).get("same"),
        want.get("same"),
        "mtime mended"
    );
    assert_eq!(r.skipped, 2, "the file and the unchanged link: {r:?}");

    cfg.opts.existing = ExistingPolicy::Overwrite;
    let r = put(&cfg, &tree, "/").await;
    assert_ok(&r, "put --overwrite");
    assert_eq!(diff(&want, &exact(&on_server)), "");
    assert_eq!(leftovers(&server.root), Vec::<String>::new());
    server.stop().await;
}
