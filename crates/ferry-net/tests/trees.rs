//! Whole trees through put and get against a real server on loopback: shapes (many files, deep,
//! wide), names, metadata, symlinks, existing destinations, checksums and corruption. Every
//! comparison uses `util::snapshot` (std + blake3), never ferry's own digest path.

use crate::util;

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ferry_net::SessionError;
use ferry_proto::{ChecksumAlgo, EntryKind, ErrorCode, ExistingPolicy};
use util::*;

// ---------------------------------------------------------------------------------------------
// helpers

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Sets mtime (and atime) with std only; works for files and directories alike.
fn set_mtime(p: &Path, secs: u64, nanos: u32) {
    let t = UNIX_EPOCH + Duration::new(secs, nanos);
    let f = std::fs::File::open(p).unwrap();
    f.set_times(std::fs::FileTimes::new().set_accessed(t).set_modified(t))
        .unwrap();
}

/// Creates a file with content, mode and mtime through one handle (one open, not three).
fn make_file(p: &Path, data: &[u8], mode: u32, secs: u64, nanos: u32) {
    use std::io::Write;
    let mut f = std::fs::File::create(p).unwrap();
    f.write_all(data).unwrap();
    let t = UNIX_EPOCH + Duration::new(secs, nanos);
    f.set_times(std::fs::FileTimes::new().set_accessed(t).set_modified(t))
        .unwrap();
    f.set_permissions(std::fs::Permissions::from_mode(mode))
        .unwrap();
}

fn mtime(p: &Path) -> SystemTime {
    std::fs::symlink_metadata(p).unwrap().modified().unwrap()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

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

fn assert_ok(r: &ferry_net::TransferReport) {
    assert!(
        r.is_success(),
        "failed={} errors={:?}",
        r.failed,
        &r.errors[..r.errors.len().min(5)]
    );
}

/// Puts `tree` into `/incoming/` and gets it back into a fresh local directory; both copies must
/// equal the source, and neither side may keep a temporary file. Returns the local copy.
async fn round_trip(server: &TestServer, tree: &Path, back: &Path) -> PathBuf {
    round_trip_with(server, &server.client(), tree, back).await
}

async fn round_trip_with(
    server: &TestServer,
    cfg: &ferry_net::ClientConfig,
    tree: &Path,
    back: &Path,
) -> PathBuf {
    let name = tree.file_name().unwrap().to_str().unwrap().to_owned();
    let expect = snapshot(tree);
    let r = put(cfg, tree, "/incoming/").await;
    assert_ok(&r);
    let on_server = server.root.join("incoming").join(&name);
    assert_eq!(diff(&expect, &snapshot(&on_server)), "", "put differs");
    let r = get(cfg, &format!("/incoming/{name}"), &back.join("copy/")).await;
    assert_ok(&r);
    let copy = back.join("copy").join(&name);
    assert_eq!(diff(&expect, &snapshot(&copy)), "", "get differs");
    assert_eq!(leftovers(&server.root), Vec::<String>::new());
    assert_eq!(leftovers(back), Vec::<String>::new());
    copy
}

type Snap = BTreeMap<String, (char, String, u32, i64)>;

/// A short description of how two snapshots differ ("" when equal), so a failure on a tree of
/// 10,000 entries prints what matters instead of two huge maps.
fn diff(want: &Snap, got: &Snap) -> String {
    let mut out = Vec::new();
    for (k, v) in want {
        match got.get(k) {
            None => out.push(format!("missing {k:?}")),
            Some(g) if g != v => out.push(format!("{k:?}: want {v:?}, got {g:?}")),
            _ => {}
        }
    }
    for k in got.keys() {
        if !want.contains_key(k) {
            out.push(format!("extra {k:?}"));
        }
    }
    let n = out.len();
    out.truncate(10);
    if n > 10 {
        out.push(format!("... {} more", n - 10));
    }
    out.join("\n")
}

// ---------------------------------------------------------------------------------------------
// shapes

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_small_files_round_trip() {
    // On tmpfs where available: this test is about the protocol and the receiver's bookkeeping
    // for many files, and 30,000 file creations on a busy shared disk take most of a minute.
    let server = TestServer::start_in(fast_tempdir(), |_| {}).await;
    let src = fast_tempdir();
    let tree = src.path().join("many");
    let modes = [0o644, 0o600, 0o640, 0o755];
    for d in 0..100u64 {
        let dir = tree.join(format!("d{d:03}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..100u64 {
            let i = d * 100 + f;
            make_file(
                &dir.join(format!("f{f:03}.bin")),
                &bytes(1024 + (i as usize * 37) % 9216, i),
                modes[i as usize % modes.len()],
                1_500_000_000 + i,
                (i as u32 * 7919) % 1_000_000_000,
            );
        }
        set_mtime(&dir, 1_400_000_000 + d, 0);
    }
    let back = fast_tempdir();
    let copy = round_trip(&server, &tree, back.path()).await;
    assert_eq!(snapshot(&copy).len(), 10_100);
    // Sub-second mtimes survive too (the snapshot compares whole seconds only).
    for i in [0u64, 1, 4_999, 9_999] {
        let rel = format!("d{:03}/f{:03}.bin", i / 100, i % 100);
        assert_eq!(mtime(&tree.join(&rel)), mtime(&copy.join(&rel)), "{rel}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_tree_round_trip() {
    let server = TestServer::start().await;
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("deep");
    let mut dir = tree.clone();
    for level in 0..60 {
        dir = dir.join(format!("level{level:02}"));
        write(&dir.join("here.txt"), &bytes(100 + level, level as u64));
    }
    // The deepest directory also holds an empty one.
    std::fs::create_dir(dir.join("bottom")).unwrap();
    let back = tempfile::tempdir().unwrap();
    let copy = round_trip(&server, &tree, back.path()).await;
    let deepest: PathBuf = (0..60).map(|l| format!("level{l:02}")).collect();
    assert!(copy.join(&deepest).join("bottom").is_dir());
    assert_eq!(
        std::fs::read(copy.join(&deepest).join("here.txt")).unwrap(),
        bytes(159, 59)
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wide_directory_round_trip_and_listing() {
    let server = TestServer::start_in(fast_tempdir(), |_| {}).await;
    let src = fast_tempdir();
    let tree = src.path().join("wide");
    std::fs::create_dir(&tree).unwrap();
    for i in 0..3000u64 {
        make_file(
            &tree.join(format!("entry-{i:05}")),
            &bytes(i as usize % 700, i),
            0o644,
            1_600_000_000,
            i as u32,
        );
    }
    let back = fast_tempdir();
    round_trip(&server, &tree, back.path()).await;
    // A listing of 3,000 entries spans several ListEntries frames (1,024 at most each).
    let entries =
        ferry_net::client::list(&server.client(), "/incoming/wide", &ferry_core::NoReporter)
            .await
            .unwrap();
    assert_eq!(entries.len(), 3000);
    let mut names: Vec<_> = entries.iter().map(|e| e.name.clone()).collect();
    names.sort();
    let want: Vec<_> = (0..3000).map(|i| format!("entry-{i:05}")).collect();
    assert_eq!(names, want);
    for e in &entries {
        let i: usize = e.name[6..].parse().unwrap();
        assert_eq!((e.kind, e.size), (EntryKind::File, (i % 700) as u64));
    }
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// names

fn odd_names() -> Vec<String> {
    let mut v: Vec<String> = [
        "with space",
        " leading space",
        "trailing space ",
        "single'quote",
        "double\"quote",
        "both'\"quotes",
        "new\nline",
        "tab\there",
        "carriage\rreturn",
        "-leading-dash",
        "--",
        "-",
        "emoji 🦀🚀",
        "日本語のファイル",
        "ünïcödé",
        "...",
        "..hidden",
        ".hidden",
        "a..b",
        "back\\slash",
        "%s%n%x",
        "*?[glob]",
        "$(echo pwned)",
        "semi;colon&amp|pipe",
        "#hash",
        "~tilde",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push("n".repeat(255));
    // 255 bytes of two-byte characters plus one: the byte limit, not the character count.
    v.push(format!("{}x", "é".repeat(127)));
    assert!(v.iter().all(|n| n.len() <= 255));
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unicode_and_odd_names_round_trip() {
    let server = TestServer::start().await;
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("names");
    let names = odd_names();
    for (i, n) in names.iter().enumerate() {
        write(&tree.join(n), &bytes(10 + i, i as u64));
        // The same names as directories, each holding a file with the same odd name.
        write(
            &tree.join("dirs").join(n).join(n),
            &bytes(3 * i, 100 + i as u64),
        );
    }
    let back = tempfile::tempdir().unwrap();
    round_trip(&server, &tree, back.path()).await;

    let listed =
        ferry_net::client::list(&server.client(), "/incoming/names", &ferry_core::NoReporter)
            .await
            .unwrap();
    let mut got: Vec<_> = listed.into_iter().map(|e| e.name).collect();
    got.sort();
    let mut want = names.clone();
    want.push("dirs".into());
    want.sort();
    assert_eq!(got, want);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_name_as_transfer_root_and_remote_path() {
    // The odd name is the transfer's top entry, appears in the remote destination path, and is
    // the remote source of a get.
    let server = TestServer::start().await;
    let src = tempfile::tempdir().unwrap();
    let top = "top 'dir' \"x\"\n🦀 -";
    let tree = src.path().join(top);
    write(&tree.join("a b/c'd"), &bytes(5000, 1));
    let cfg = server.client();
    let remote = "in dir/with 'odd' \"path\"\t🦀/";
    assert_ok(&put(&cfg, &tree, remote).await);
    let on_server = server.root.join(remote.trim_end_matches('/')).join(top);
    assert_eq!(snapshot(&tree), snapshot(&on_server));
    let back = tempfile::tempdir().unwrap();
    let r = get(
        &cfg,
        &format!("{remote}{top}"),
        &back.path().join("renamed"),
    )
    .await;
    assert_ok(&r);
    assert_eq!(snapshot(&tree), snapshot(&back.path().join("renamed")));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_utf8_name_is_reported_and_its_siblings_still_sent() {
    let server = TestServer::start().await;
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("mixed");
    write(&tree.join("a-good.txt"), b"good");
    write(&tree.join("z-good.txt"), b"also good");
    write(&tree.join("sub/inner.txt"), b"inner");
    let bad = std::ffi::OsStr::from_bytes(b"bad-\xff\xfe.txt");
    std::fs::write(tree.join(bad), b"bad name").unwrap();
    let r = ferry_net::client::put(
        &server.client(),
        std::slice::from_ref(&tree),
        "/",
        reporter(),
    )
    .await
    .unwrap();
    // The name cannot travel (the wire carries UTF-8): it must be reported...
    assert!(!r.is_success());
    assert!(
        r.errors.iter().any(|e| e.contains("UTF-8")),
        "{:?}",
        r.errors
    );
    // ...but it must not take its siblings down with it.
    let got = server.root.join("mixed");
    assert_eq!(std::fs::read(got.join("a-good.txt")).unwrap(), b"good");
    assert_eq!(std::fs::read(got.join("z-good.txt")).unwrap(), b"also good");
    assert_eq!(std::fs::read(got.join("sub/inner.txt")).unwrap(), b"inner");
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// metadata

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_files_empty_dirs_modes_and_mtimes_kept() {
    let server = TestServer::start().await;
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("meta");
    // (path, is_dir, mode, mtime secs, mtime nanos)
    let spec: &[(&str, bool, u32, u64, u32)] = &[
        ("empty.bin", false, 0o600, 1_000_000_000, 123_456_789),
        ("exec.sh", false, 0o755, 1_100_000_000, 1),
        ("readonly.txt", false, 0o444, 1_200_000_000, 999_999_999),
        ("private", true, 0o700, 1_300_000_000, 500),
        ("private/secret.txt", false, 0o600, 1_310_000_000, 0),
        ("private/empty", true, 0o750, 1_320_000_000, 42),
        ("emptydir", true, 0o755, 1_330_000_000, 0),
        ("a", true, 0o711, 1_340_000_000, 0),
        ("a/b", true, 0o755, 1_350_000_000, 7),
        ("a/b/c", true, 0o700, 1_360_000_000, 8),
        ("a/b/c/zero", false, 0o640, 1_370_000_000, 9),
        ("old.txt", false, 0o644, 1, 0),
        ("pre1970.txt", false, 0o644, 0, 0),
    ];
    std::fs::create_dir(&tree).unwrap();
    for (rel, is_dir, _, _, _) in spec {
        let p = tree.join(rel);
        if *is_dir {
            std::fs::create_dir_all(&p).unwrap();
        } else if rel.contains("empty") || rel.contains("zero") {
            write(&p, b"");
        } else {
            write(&p, &bytes(rel.len() * 100, rel.len() as u64));
        }
    }
    // Deepest first: creating an entry changes its directory's mtime.
    let mut order: Vec<_> = spec.iter().collect();
    order.sort_by_key(|s| std::cmp::Reverse(s.0.matches('/').count()));
    for (rel, _, mode, secs, nanos) in order {
        let p = tree.join(rel);
        set_mtime(&p, *secs, *nanos);
        chmod(&p, *mode);
    }
    let back = tempfile::tempdir().unwrap();
    let copy = round_trip(&server, &tree, back.path()).await;
    let on_server = server.root.join("incoming/meta");
    for (rel, is_dir, mode, _, _) in spec {
        for side in [&on_server, &copy] {
            let (want, got) = (tree.join(rel), side.join(rel));
            let m = std::fs::symlink_metadata(&got).unwrap();
            assert_eq!(m.is_dir(), *is_dir, "{}", got.display());
            assert_eq!(m.mode() & 0o7777, *mode, "{}", got.display());
            assert_eq!(mtime(&want), mtime(&got), "{} (nanoseconds)", got.display());
            if !is_dir {
                assert_eq!(std::fs::read(&want).unwrap(), std::fs::read(&got).unwrap());
            }
        }
    }
    assert_eq!(std::fs::metadata(copy.join("empty.bin")).unwrap().len(), 0);
    assert_eq!(std::fs::read_dir(copy.join("emptydir")).unwrap().count(), 0);
    // The top directory of the transfer keeps its metadata as well.
    set_mtime(&tree, 1_234_567_890, 0);
    let cfg = server.client();
    let r = put(&cfg, &tree, "/second/").await;
    assert_ok(&r);
    assert_eq!(mtime(&server.root.join("second/meta")), mtime(&tree));
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// symlinks

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlinks_recreated_never_followed() {
    let server = TestServer::start().await;
    let cfg = server.client();
    let outside = tempfile::tempdir().unwrap();
    let secret = b"OUTSIDE-SECRET-must-never-be-copied-8c1f";
    write(&outside.path().join("secret.txt"), secret);
    let outside_file = outside.path().join("secret.txt");
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("links");
    write(&tree.join("data.txt"), b"inside data");
    write(&tree.join("sub/deeper/file.txt"), b"deeper");
    let links: &[(&str, String)] = &[
        ("rel", "data.txt".into()),
        ("sub/up", "../data.txt".into()),
        ("sub/deeper/upup", "../../sub".into()),
        ("dirlink", "sub".into()),
        ("outside_file", outside_file.to_str().unwrap().into()),
        ("outside_dir", outside.path().to_str().unwrap().into()),
        ("relative_escape", "../../../../../../etc/passwd".into()),
        ("dangling", "does/not/exist".into()),
        ("dangling_abs", "/nonexistent/ferry/target".into()),
        ("self", "self".into()),
        ("odd target", "a b/'c'\n\"d\"/🦀".into()),
        ("link 'odd' \"name\"\n\t🦀", "../data.txt/../x".into()),
        ("-dash link", "--".into()),
    ];
    for (rel, target) in links {
        std::os::unix::fs::symlink(target, tree.join(rel)).unwrap();
    }
    let back = tempfile::tempdir().unwrap();
    let copy = round_trip_with(&server, &cfg, &tree, back.path()).await;
    let on_server = server.root.join("incoming/links");
    for side in [&on_server, &copy] {
        for (rel, target) in links {
            let p = side.join(rel);
            let m = std::fs::symlink_metadata(&p).unwrap();
            assert!(m.file_type().is_symlink(), "{} is not a link", p.display());
            assert_eq!(std::fs::read_link(&p).unwrap(), Path::new(target));
        }
        // A link to a directory is not descended into.
        assert_eq!(
            names(side)
                .iter()
                .filter(|n| n.starts_with("dirlink/"))
                .count(),
            0
        );
        assert!(!any_file_contains(side, secret));
    }
    // A link as the top entry of a get arrives as a link, not as what it points to.
    let r = get(
        &server.client(),
        "/incoming/links/outside_dir",
        &back.path().join("top"),
    )
    .await;
    assert_ok(&r);
    assert!(std::fs::symlink_metadata(back.path().join("top"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(!any_file_contains(back.path(), secret));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_symlinks_in_one_directory() {
    // Symlinks are handled by several writer threads at once; each needs its own temporary
    // name. Alternating targets make a swapped link visible.
    let server = TestServer::start().await;
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("farm");
    std::fs::create_dir(&tree).unwrap();
    for i in 0..2000 {
        std::os::unix::fs::symlink(format!("target-{i}"), tree.join(format!("l{i:04}"))).unwrap();
    }
    let r = put(&server.client(), &tree, "/").await;
    assert_ok(&r);
    assert_eq!(
        diff(&snapshot(&tree), &snapshot(&server.root.join("farm"))),
        ""
    );
    assert_eq!(leftovers(&server.root), Vec::<String>::new());
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// existing destinations

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn existing_destination_fail_overwrite_skip() {
    let server = TestServer::start().await;
    let old = b"old content on the server".to_vec();
    let new_a = bytes(3 * BLOCK as usize + 5, 1);
    let new_b = bytes(777, 2);
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("dst");
    write(&tree.join("a.bin"), &new_a);
    write(&tree.join("b.bin"), &new_b);
    std::os::unix::fs::symlink("a.bin", tree.join("link")).unwrap();
    let a_on_server = server.root.join("dst/a.bin");
    let b_on_server = server.root.join("dst/b.bin");
    write(&a_on_server, &old);

    // Default policy: the existing file is reported failed and left alone, others arrive.
    let mut cfg = server.client();
    assert_eq!(cfg.opts.existing, ExistingPolicy::Fail);
    let r = put(&cfg, &tree, "/").await;
    assert_eq!(r.failed, 1, "{:?}", r.errors);
    assert!(!r.is_success());
    assert!(
        r.errors.iter().any(|e| e.contains("a.bin")),
        "{:?}",
        r.errors
    );
    assert_eq!(r.files, 1);
    assert_eq!(std::fs::read(&a_on_server).unwrap(), old);
    assert_eq!(std::fs::read(&b_on_server).unwrap(), new_b);
    assert_eq!(leftovers(&server.root), Vec::<String>::new());

    // Overwrite: both files replaced (the old one, and the one from the first run changed
    // since); the link from the first run has the same target, so it is complete already.
    cfg.opts.existing = ExistingPolicy::Overwrite;
    write(&b_on_server, b"changed since");
    let r = put(&cfg, &tree, "/").await;
    assert_ok(&r);
    assert_eq!((r.files, r.skipped), (2, 1));
    assert_eq!(std::fs::read(&a_on_server).unwrap(), new_a);
    assert_eq!(std::fs::read(&b_on_server).unwrap(), new_b);
    assert_eq!(
        std::fs::read_link(server.root.join("dst/link")).unwrap(),
        Path::new("a.bin")
    );

    // Skip: existing entries kept and counted, a missing one still arrives.
    cfg.opts.existing = ExistingPolicy::Skip;
    write(&a_on_server, &old);
    std::fs::remove_file(&b_on_server).unwrap();
    let r = put(&cfg, &tree, "/").await;
    assert_ok(&r);
    assert_eq!(r.files, 1);
    assert_eq!(r.skipped, 2, "a.bin and the link exist"); // file + symlink
    assert_eq!(std::fs::read(&a_on_server).unwrap(), old);
    assert_eq!(std::fs::read(&b_on_server).unwrap(), new_b);
    assert_eq!(leftovers(&server.root), Vec::<String>::new());

    // The same on the client side of a get, default policy.
    let back = tempfile::tempdir().unwrap();
    let local_a = back.path().join("dst/a.bin");
    write(&local_a, b"local and precious");
    let r = get(&server.client(), "/dst", back.path()).await;
    assert_eq!(r.failed, 1, "{:?}", r.errors);
    assert_eq!(std::fs::read(&local_a).unwrap(), b"local and precious");
    assert_eq!(std::fs::read(back.path().join("dst/b.bin")).unwrap(), new_b);
    assert_eq!(leftovers(back.path()), Vec::<String>::new());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn existing_single_file_destination_default_fails() {
    let server = TestServer::start().await;
    let src = tempfile::tempdir().unwrap();
    let f = src.path().join("one.bin");
    write(&f, &bytes(10_000, 5));
    write(&server.root.join("there.bin"), b"keep me");
    let r = ferry_net::client::put(&server.client(), &[f], "/there.bin", reporter()).await;
    match r {
        Ok(r) => assert!(r.failed == 1 && !r.is_success(), "{r:?}"),
        Err(SessionError::Remote { code, .. }) => assert_eq!(code, ErrorCode::EXISTS),
        Err(e) => panic!("unexpected error {e}"),
    }
    assert_eq!(
        std::fs::read(server.root.join("there.bin")).unwrap(),
        b"keep me"
    );
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// digests and corruption

fn independent_digest(algo: ChecksumAlgo, data: &[u8]) -> String {
    use md5::Digest as _;
    match algo {
        ChecksumAlgo::Blake3 => blake3::hash(data).to_hex().to_string(),
        ChecksumAlgo::Xxh3 => hex(&xxhash_rust::xxh3::xxh3_128(data).to_be_bytes()),
        ChecksumAlgo::Sha256 => hex(&sha2::Sha256::digest(data)),
        ChecksumAlgo::Md5 => hex(&md5::Md5::digest(data)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_checksums_multi_block_and_manifest() {
    let server = TestServer::start().await;
    let src = tempfile::tempdir().unwrap();
    let data = bytes(6 * BLOCK as usize + 4321, 77);
    let small = bytes(10, 78);
    let tree = src.path().join("sums");
    write(&tree.join("big.bin"), &data);
    write(&tree.join("small.bin"), &small);
    write(&tree.join("empty.bin"), b"");
    for algo in [
        ChecksumAlgo::Blake3,
        ChecksumAlgo::Xxh3,
        ChecksumAlgo::Sha256,
        ChecksumAlgo::Md5,
    ] {
        let name = ferry_core::digest::algo_name(algo);
        let mut cfg = server.client();
        cfg.opts.checksum = algo;
        let r = put(&cfg, &tree, &format!("/{name}/")).await;
        assert_ok(&r);
        assert_eq!(r.checksum, name);
        let want: BTreeMap<String, String> = [
            ("sums/big.bin", &data[..]),
            ("sums/empty.bin", &[][..]),
            ("sums/small.bin", &small[..]),
        ]
        .into_iter()
        .map(|(p, d)| (p.to_owned(), independent_digest(algo, d)))
        .collect();
        let got: BTreeMap<_, _> = r.manifest.iter().cloned().collect();
        assert_eq!(got, want, "{name}: sender's manifest");
        assert_eq!(
            std::fs::read(server.root.join(name).join("sums/big.bin")).unwrap(),
            data
        );

        let back = tempfile::tempdir().unwrap();
        let r = get(&cfg, &format!("/{name}/sums/big.bin"), back.path()).await;
        assert_ok(&r);
        assert_eq!(
            r.manifest,
            vec![("big.bin".to_owned(), independent_digest(algo, &data))],
            "{name}: receiver's manifest"
        );
        assert_eq!(std::fs::read(back.path().join("big.bin")).unwrap(), data);
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_blocks_are_resent_and_file_arrives_intact() {
    let server = TestServer::start().await;
    let src = tempfile::tempdir().unwrap();
    let f = src.path().join("fragile.bin");
    let data = bytes(10 * BLOCK as usize + 99, 3);
    write(&f, &data);
    for streams in [1u16, 4] {
        let mut cfg = server.client();
        cfg.opts.streams = streams;
        cfg.corrupt_blocks = vec![0, 3, 7];
        let dest = format!("/s{streams}.bin");
        let r = ferry_net::client::put(&cfg, std::slice::from_ref(&f), &dest, reporter())
            .await
            .unwrap();
        assert_ok(&r);
        assert_eq!(r.bad_blocks, 3, "streams={streams}");
        assert_eq!(r.files, 1);
        let got = std::fs::read(server.root.join(&dest[1..])).unwrap();
        assert!(got == data, "streams={streams}: content differs");
        assert_eq!(r.manifest[0].1, blake3::hash(&data).to_hex().to_string());
    }
    // The last block (the one that carries the file digest) corrupted as well.
    let mut cfg = server.client();
    cfg.corrupt_blocks = vec![10];
    let r = ferry_net::client::put(&cfg, std::slice::from_ref(&f), "/last.bin", reporter())
        .await
        .unwrap();
    assert_ok(&r);
    assert_eq!(r.bad_blocks, 1);
    assert!(std::fs::read(server.root.join("last.bin")).unwrap() == data);
    assert_eq!(leftovers(&server.root), Vec::<String>::new());
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// get destinations and listing

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_file_to_new_name_tree_into_existing_dir_and_list() {
    let server = TestServer::start().await;
    let pub_dir = server.root.join("pub");
    let a = bytes(3 * BLOCK as usize + 1, 11);
    write(&pub_dir.join("a.bin"), &a);
    chmod(&pub_dir.join("a.bin"), 0o640);
    set_mtime(&pub_dir.join("a.bin"), 1_600_000_000, 250);
    write(&pub_dir.join("tree/x/y.txt"), b"yyy");
    write(&pub_dir.join("tree/z.bin"), &bytes(70_000, 12));
    std::fs::create_dir_all(pub_dir.join("tree/empty")).unwrap();
    std::fs::create_dir_all(pub_dir.join("emptydir")).unwrap();
    std::os::unix::fs::symlink("a.bin", pub_dir.join("link")).unwrap();
    let cfg = server.client();

    // A single file into a name that does not exist yet.
    let back = tempfile::tempdir().unwrap();
    let new_name = back.path().join("sub/new-name.bin");
    let r = get(&cfg, "/pub/a.bin", &new_name).await;
    assert_ok(&r);
    assert_eq!(r.files, 1);
    assert!(std::fs::read(&new_name).unwrap() == a);
    assert_eq!(std::fs::metadata(&new_name).unwrap().mode() & 0o7777, 0o640);
    assert_eq!(mtime(&new_name), mtime(&pub_dir.join("a.bin")));
    assert_eq!(names(back.path()), vec!["sub", "sub/new-name.bin"]);

    // A tree into an existing directory: it lands inside, next to what is there.
    let existing = back.path().join("existing");
    write(&existing.join("keep.txt"), b"keep");
    let r = get(&cfg, "/pub/tree", &existing).await;
    assert_ok(&r);
    assert_eq!(
        snapshot(&pub_dir.join("tree")),
        snapshot(&existing.join("tree"))
    );
    assert_eq!(std::fs::read(existing.join("keep.txt")).unwrap(), b"keep");
    // A tree into a new name is renamed like cp -r.
    let r = get(&cfg, "pub/tree/", &back.path().join("renamed")).await;
    assert_ok(&r);
    assert_eq!(
        snapshot(&pub_dir.join("tree")),
        snapshot(&back.path().join("renamed"))
    );

    // Listing: names, kinds, sizes, modes, mtimes.
    let entries = ferry_net::client::list(&cfg, "/pub", &ferry_core::NoReporter)
        .await
        .unwrap();
    let got: Vec<_> = entries.iter().map(|e| (e.name.as_str(), e.kind)).collect();
    assert_eq!(
        got,
        vec![
            ("a.bin", EntryKind::File),
            ("emptydir", EntryKind::Dir),
            ("link", EntryKind::Symlink),
            ("tree", EntryKind::Dir),
        ]
    );
    let a_entry = &entries[0];
    assert_eq!(a_entry.size, a.len() as u64);
    assert_eq!(a_entry.mode & 0o7777, 0o640);
    assert_eq!(a_entry.mtime_ns, 1_600_000_000_000_000_250);
    assert_eq!(
        entries[2].size,
        "a.bin".len() as u64,
        "a link's size is its target's length"
    );
    // A file is described by itself; the root lists its top entries.
    let one = ferry_net::client::list(&cfg, "pub/a.bin", &ferry_core::NoReporter)
        .await
        .unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(
        (one[0].name.as_str(), one[0].size),
        ("a.bin", a.len() as u64)
    );
    let top = ferry_net::client::list(&cfg, "/", &ferry_core::NoReporter)
        .await
        .unwrap();
    assert_eq!(
        top.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
        ["pub"]
    );
    let empty = ferry_net::client::list(&cfg, "/pub/emptydir", &ferry_core::NoReporter)
        .await
        .unwrap();
    assert!(empty.is_empty());
    // Missing paths are a clear not-found, for list and get alike.
    for res in [
        ferry_net::client::list(&cfg, "/pub/nope", &ferry_core::NoReporter)
            .await
            .map(|_| ()),
        ferry_net::client::get(&cfg, "/pub/nope", back.path(), reporter())
            .await
            .map(|_| ()),
    ] {
        match res {
            Err(SessionError::Remote { code, .. }) => assert_eq!(code, ErrorCode::NOT_FOUND),
            other => panic!("expected not_found, got {other:?}"),
        }
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_symlink_on_put_is_explained_to_the_client() {
    // A symlink whose name is taken on the server: the client must learn which entry failed
    // and why, not just a count.
    let server = TestServer::start().await;
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("c");
    write(&tree.join("sub/f.txt"), b"f");
    std::os::unix::fs::symlink("sub/f.txt", tree.join("link")).unwrap();
    write(&server.root.join("c/link"), b"a file where the link goes");
    let r = put(&server.client(), &tree, "/").await;
    assert_eq!(r.failed, 1, "{r:?}");
    assert!(
        r.errors.iter().any(|e| e.contains("link")),
        "failed={} but errors={:?}",
        r.failed,
        r.errors
    );
    assert_eq!(
        std::fs::read(server.root.join("c/link")).unwrap(),
        b"a file where the link goes"
    );
    server.stop().await;
}
