//! The same command run twice (issue 34): `ferry put TREE host:/` and `ferry get host:TREE DIR`
//! of a tree with files, an empty file, empty directories and symlinks. The second run exits 0,
//! reports everything skipped and nothing stored, and leaves the tree as it was. (The
//! library-level tests in ferry-net's `tests/rerun.rs` cover every tree shape; this one is the
//! command a user types.)

use crate::util;

use std::fs;
use std::path::Path;

use util::*;

fn make_tree(top: &Path) {
    write_pattern(&top.join("big.bin"), 3 << 20, 1);
    write_pattern(&top.join("sub/small.txt"), 1000, 2);
    fs::write(top.join("empty.bin"), b"").unwrap();
    fs::create_dir_all(top.join("sub/empty")).unwrap();
    fs::create_dir_all(top.join("nothing")).unwrap();
    std::os::unix::fs::symlink("big.bin", top.join("link")).unwrap();
    std::os::unix::fs::symlink("../nowhere", top.join("sub/dangling")).unwrap();
}

/// Runs `cmd --json` and returns the summary, requiring exit code 0.
fn json_run(cmd: &mut std::process::Command, what: &str) -> serde_json::Value {
    let out = run(cmd.arg("--json"), CMD_TIMEOUT);
    assert_eq!(
        out.code(),
        Some(0),
        "{what}: exit {:?}\nstderr:\n{}",
        out.code(),
        out.stderr
    );
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("{what}: not one JSON document ({e}):\n{}", out.stdout))
}

/// The second run's summary: nothing stored, nothing failed, every file and link skipped.
fn assert_no_op(v: &serde_json::Value, skippable: u64, what: &str) {
    let n = |k: &str| {
        v[k].as_u64()
            .unwrap_or_else(|| panic!("{what}: no {k} in {v}"))
    };
    assert_eq!(
        (n("files"), n("bytes"), n("failed"), n("skipped")),
        (0, 0, 0, skippable),
        "{what}: {v}"
    );
    assert_eq!(v["errors"].as_array().map(Vec::len), Some(0), "{what}: {v}");
}

#[test]
fn put_and_get_run_twice_second_is_a_no_op() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let src = sb.path("src/tree");
    make_tree(&src);
    let want = tree_digest(&src);
    let skippable = want.values().filter(|e| !matches!(e, Entry::Dir)).count() as u64;
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);

    let put = || {
        let mut c = sb.client(&s.token);
        c.arg("put").arg(&src).arg(s.remote("/"));
        c
    };
    let first = json_run(&mut put(), "first put");
    assert_eq!(first["failed"].as_u64(), Some(0), "{first}");
    let second = json_run(&mut put(), "second put");
    assert_no_op(&second, skippable, "second put");
    assert_eq!(tree_digest(&root.join("tree")), want, "server copy");

    let back = sb.mkdir("back");
    let get = || {
        let mut c = sb.client(&s.token);
        c.arg("get").arg(s.remote("/tree")).arg(&back);
        c
    };
    let first = json_run(&mut get(), "first get");
    assert_eq!(first["failed"].as_u64(), Some(0), "{first}");
    let second = json_run(&mut get(), "second get");
    assert_no_op(&second, skippable, "second get");
    assert_eq!(tree_digest(&back.join("tree")), want, "local copy");
    assert_eq!(names(&back), ["tree"]);
}
