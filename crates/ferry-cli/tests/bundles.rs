//! Bundles through the real binary against a real `ferry serve`: `put --untar` of archives
//! GNU tar made (every member stored byte-identical and registered; hostile and piped archives
//! refused), and `get --tar` read back by GNU tar.

use crate::util;

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

use util::*;

struct Bed {
    sb: Sandbox,
    server: Server,
}

impl Bed {
    fn new() -> Self {
        let sb = Sandbox::new();
        let root = sb.mkdir("root");
        let server = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
        Self { sb, server }
    }

    fn remote(&self, path: &str) -> String {
        self.server.remote(path)
    }

    /// `ferry ARGS...` as the server's token.
    fn ferry(&self, args: &[&str]) -> Out {
        run(self.sb.client(&self.server.token).args(args), CMD_TIMEOUT)
    }

    /// The catalog's digest of `path`, by `ferry stat --json`.
    fn registered(&self, path: &str) -> String {
        let out = self.ferry(&["stat", "--json", &self.remote(path)]);
        assert_code(&out, 0);
        one_json(&out.stdout)["digest"]
            .as_str()
            .unwrap_or_else(|| panic!("{path}: no digest in {}", out.stdout))
            .to_owned()
    }
}

/// `tar ARGS...` (GNU tar), which must succeed.
fn gnu_tar(dir: &Path, args: &[&str]) {
    let out = Command::new("tar")
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("GNU tar is installed");
    assert!(
        out.status.success(),
        "tar {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `src/tree`: nested directories, an empty file and an empty directory, a file of several
/// MiB (many blocks), names with spaces, a name past tar's 100 bytes, a symlink and a hard
/// link.
fn make_tree(sb: &Sandbox) -> std::path::PathBuf {
    let tree = sb.path("src/tree");
    write_pattern(&tree.join("a dir/b c.txt"), 1000, 1);
    write_pattern(
        &tree.join("nested/deep/er/big.bin"),
        6 * 1024 * 1024 + 123,
        2,
    );
    write_pattern(&tree.join("nested/small"), 10, 3);
    write_pattern(&tree.join("empty"), 0, 4);
    write_pattern(&tree.join(format!("nested/{}", "long".repeat(30))), 300, 5);
    fs::create_dir_all(tree.join("nested/empty dir")).unwrap();
    std::os::unix::fs::symlink("small", tree.join("nested/link")).unwrap();
    fs::hard_link(tree.join("nested/small"), tree.join("nested/hard")).unwrap();
    tree
}

/// Every regular file under `root`, relative.
fn files(root: &Path) -> Vec<String> {
    tree_digest(root)
        .into_iter()
        .filter(|(_, e)| matches!(e, Entry::File { .. }))
        .map(|(p, _)| p)
        .collect()
}

#[test]
fn untar_of_a_gnu_tar_lands_identical_and_every_member_is_registered() {
    let bed = Bed::new();
    let tree = make_tree(&bed.sb);
    let mtime = fs::metadata(tree.join("nested/deep/er/big.bin"))
        .unwrap()
        .modified()
        .unwrap();
    gnu_tar(&bed.sb.path("src"), &["-cf", "../bundle.tar", "tree"]);
    let archive = bed.sb.path("bundle.tar").display().to_string();
    let out = bed.ferry(&["put", "--untar", &archive, &bed.remote("/data/")]);
    assert_code(&out, 0);

    let landed = bed.server.root.join("data/tree");
    assert_eq!(tree_digest(&landed), tree_digest(&tree));
    let landed_mtime = fs::metadata(landed.join("nested/deep/er/big.bin"))
        .unwrap()
        .modified()
        .unwrap();
    // tar keeps whole seconds.
    let secs =
        |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    assert_eq!(secs(landed_mtime), secs(mtime));
    let all = files(&tree);
    assert_eq!(all.len(), 6);
    for rel in all {
        assert_eq!(
            bed.registered(&format!("/data/tree/{rel}")),
            file_b3(&tree.join(&rel)),
            "{rel}"
        );
    }
    // Nothing but the tree was written: no copy of the archive on either side.
    assert_eq!(names(&bed.server.root.join("data")), ["tree"]);
}

#[test]
fn hostile_and_piped_archives_are_refused_and_nothing_is_written() {
    let bed = Bed::new();
    let work = bed.sb.mkdir("work/in");
    write_pattern(&bed.sb.path("work/outside.txt"), 100, 5);
    write_pattern(&work.join("fine.txt"), 100, 6);
    // -P keeps `..` and a leading `/` in member names.
    gnu_tar(&work, &["-cPf", "../up.tar", "fine.txt", "../outside.txt"]);
    let abs = bed.sb.path("work/outside.txt").display().to_string();
    gnu_tar(&work, &["-cPf", "../abs.tar", "fine.txt", &abs]);

    for (tar, member) in [("up.tar", "../outside.txt"), ("abs.tar", abs.as_str())] {
        let archive = bed.sb.path(&format!("work/{tar}")).display().to_string();
        let out = bed.ferry(&["put", "--untar", &archive, &bed.remote("/data/")]);
        assert_code(&out, 1);
        assert!(
            out.stderr.contains(&format!("member `{member}` refused")),
            "{tar}: {}",
            out.stderr
        );
    }
    // Refused before anything was sent: not even the harmless member landed.
    assert!(
        all_paths(&bed.server.root).is_empty(),
        "{:?}",
        all_paths(&bed.server.root)
    );
    assert_eq!(
        names(&bed.sb.path("work")),
        ["abs.tar", "in", "outside.txt", "up.tar"]
    );

    let out = bed.ferry(&["put", "--untar", "-", &bed.remote("/data/")]);
    assert_code(&out, 1);
    assert!(
        out.stderr.contains("standard input is a stream")
            && out.stderr.contains("members are read where they lie"),
        "{}",
        out.stderr
    );
}

/// A server holding `src/tree` put at `/data/tree` (registered by the put).
fn bed_with_tree() -> (Bed, std::path::PathBuf) {
    let bed = Bed::new();
    let tree = make_tree(&bed.sb);
    let out = bed.ferry(&["put", &tree.display().to_string(), &bed.remote("/data/")]);
    assert_code(&out, 0);
    (bed, tree)
}

/// `tar ARGS...` run in `dir`: its exit status and what it printed.
fn tar_output(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("tar")
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("GNU tar is installed");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn get_tar_is_read_back_by_gnu_tar_whole_and_as_a_subset() {
    let (bed, tree) = bed_with_tree();
    // To stdout.
    let whole = bed.sb.path("whole.tar");
    let status = bed
        .sb
        .client(&bed.server.token)
        .args(["get", "--tar", &bed.remote("/data/tree")])
        .stdout(fs::File::create(&whole).unwrap())
        .status()
        .unwrap();
    assert!(status.success());
    let (ok, listing) = tar_output(&bed.sb.path(""), &["-tvf", "whole.tar"]);
    assert!(ok, "{listing}");
    assert!(listing.contains("nested/deep/er/big.bin"), "{listing}");
    let x = bed.sb.mkdir("x");
    gnu_tar(&x, &["-xf", "../whole.tar"]);
    assert_eq!(tree_digest(&x), tree_digest(&tree));

    // A subset, to a file; the same bytes each time (a stable order).
    for name in ["sub.tar", "sub2.tar"] {
        let file = bed.sb.path(name).display().to_string();
        let remote = bed.remote("/data/tree");
        let out = bed.ferry(&[
            "get",
            "--tar",
            &remote,
            "nested/small",
            "a dir",
            "-o",
            &file,
        ]);
        assert_code(&out, 0);
    }
    assert_eq!(
        fs::read(bed.sb.path("sub.tar")).unwrap(),
        fs::read(bed.sb.path("sub2.tar")).unwrap()
    );
    let (ok, listing) = tar_output(&bed.sb.path(""), &["-tf", "sub.tar"]);
    assert!(ok, "{listing}");
    assert_eq!(
        listing.lines().collect::<Vec<_>>(),
        ["a dir/", "a dir/b c.txt", "nested/small"]
    );
    let y = bed.sb.mkdir("y");
    gnu_tar(&y, &["-xf", "../sub.tar"]);
    for rel in ["a dir/b c.txt", "nested/small"] {
        assert_eq!(
            fs::read(y.join(rel)).unwrap(),
            fs::read(tree.join(rel)).unwrap()
        );
    }
}

#[test]
fn get_tar_of_a_file_changed_behind_ferrys_back_fails_naming_it() {
    let (bed, _tree) = bed_with_tree();
    let victim = bed.server.root.join("data/tree/nested/deep/er/big.bin");
    let mtime = fs::metadata(&victim).unwrap().modified().unwrap();
    let mut bytes = fs::read(&victim).unwrap();
    bytes[4_000_000] ^= 0xff;
    fs::write(&victim, &bytes).unwrap();
    let f = fs::OpenOptions::new().write(true).open(&victim).unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);
    assert_eq!(fs::metadata(&victim).unwrap().modified().unwrap(), mtime);

    let file = bed.sb.path("bad.tar").display().to_string();
    let out = bed.ferry(&["get", "--tar", &bed.remote("/data/tree"), "-o", &file]);
    assert_code(&out, 1);
    assert!(
        out.stderr.contains("member `nested/deep/er/big.bin`")
            && out.stderr.contains("no longer match the digest registered"),
        "{}",
        out.stderr
    );
    // What was written is a truncated archive, and GNU tar says so.
    let (ok, listing) = tar_output(&bed.sb.path(""), &["-tf", "bad.tar"]);
    assert!(!ok, "{listing}");
}

#[test]
fn get_tar_from_a_server_without_a_catalog_is_refused_saying_why() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    write_pattern(&root.join("data/a"), 10, 7);
    let server = Server::start(&sb, &root, Some(&sb.path("token")), &["--catalog", "none"]);
    let file = sb.path("out.tar").display().to_string();
    let out = run(
        sb.client(&server.token)
            .args(["get", "--tar", &server.remote("/data"), "-o", &file]),
        CMD_TIMEOUT,
    );
    assert_code(&out, 1);
    assert!(
        out.stderr.contains("keeps no catalog") && out.stderr.contains("unchecked"),
        "{}",
        out.stderr
    );
}
