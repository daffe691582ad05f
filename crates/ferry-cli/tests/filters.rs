//! `--exclude`/`--include`/`--filter-from` on put and get, end to end: what arrives is what
//! the rules let through, excluded directories are not made, and bad rules are usage errors.

use crate::util;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use util::*;

/// Files, directories and a symlink that the rules below tell apart.
fn make_tree(dir: &Path) {
    fs::create_dir_all(dir.join("sub/cache")).unwrap();
    fs::create_dir_all(dir.join("cache")).unwrap();
    fs::create_dir_all(dir.join("skipme/inner")).unwrap();
    for f in [
        "a.txt",
        "b.log",
        "keep.log",
        "sub/c.txt",
        "sub/d.o",
        "sub/cache/e.txt",
        "cache/f.txt",
        "skipme/inner/g.txt",
    ] {
        fs::write(dir.join(f), f.as_bytes()).unwrap();
    }
    // A file named like the `cache/` rule: it is sent (the rule matches directories only).
    fs::write(dir.join("sub/notcache"), b"x").unwrap();
    fs::write(dir.join("cachefile"), b"y").unwrap();
    std::os::unix::fs::symlink("a.txt", dir.join("link.log")).unwrap();
}

/// Every entry under `root`, directories with a trailing `/`.
fn entries(root: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, rel: &str, out: &mut BTreeSet<String>) {
        for e in fs::read_dir(root.join(rel)).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if e.file_type().unwrap().is_dir() {
                out.insert(format!("{path}/"));
                walk(root, &path, out);
            } else {
                out.insert(path);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, "", &mut out);
    out
}

/// What the rules of [`filter_args`] let through from [`make_tree`] sent as `tree`.
fn expected() -> BTreeSet<String> {
    [
        "tree/",
        "tree/a.txt",
        "tree/keep.log",
        "tree/cachefile",
        "tree/sub/",
        "tree/sub/c.txt",
        "tree/sub/notcache",
    ]
    .into_iter()
    .map(String::from)
    .collect()
}

/// `keep.log` is included before `*.log` excludes the other logs (and the symlink); `cache/`
/// leaves out both directories of that name at any depth; the rules file excludes `*.o` and
/// the anchored `/tree/skipme/`.
fn filter_args(sb: &Sandbox) -> Vec<String> {
    let rules = sb.path("rules");
    fs::write(
        &rules,
        "# ferry filter rules\n\n- *.o\n; anchored\n- /tree/skipme/\n",
    )
    .unwrap();
    vec![
        "--include".into(),
        "keep.log".into(),
        "--exclude=*.log".into(),
        "--filter-from".into(),
        rules.display().to_string(),
        "--exclude".into(),
        "cache/".into(),
    ]
}

#[test]
fn put_sends_only_what_the_rules_let_through() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let src = sb.path("src/tree");
    make_tree(&src);
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
    let out = run(
        sb.client(&s.token)
            .arg("put")
            .args(filter_args(&sb))
            .arg(&src)
            .arg(s.remote("/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    assert_eq!(entries(&root), expected());
    assert_eq!(fs::read(root.join("tree/keep.log")).unwrap(), b"keep.log");
}

#[test]
fn get_takes_only_what_the_rules_let_through() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    make_tree(&root.join("tree"));
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
    let dest = sb.mkdir("back");
    let out = run(
        sb.client(&s.token)
            .arg("get")
            .args(filter_args(&sb))
            .arg(s.remote("/tree"))
            .arg(format!("{}/", dest.display())),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    // Nothing excluded is made: no `cache/`, no `skipme/`, no symlink.
    assert_eq!(entries(&dest), expected());
    assert_eq!(fs::read(dest.join("tree/sub/c.txt")).unwrap(), b"sub/c.txt");
}

#[test]
fn bad_rules_are_usage_errors_that_name_them() {
    let sb = Sandbox::new();
    let src = sb.path("src/tree");
    make_tree(&src);
    let bad_line = sb.path("bad-rules");
    fs::write(&bad_line, "- *.o\nexclude *.c\n").unwrap();
    let missing = sb.path("no-such-rules");
    let cases: Vec<(Vec<String>, String)> = vec![
        (vec!["--exclude".into(), "[abc".into()], "`[abc`".into()),
        (vec!["--include".into(), "a**".into()], "`a**`".into()),
        (
            vec!["--filter-from".into(), missing.display().to_string()],
            missing.display().to_string(),
        ),
        (
            vec!["--filter-from".into(), bad_line.display().to_string()],
            format!("{}:2", bad_line.display()),
        ),
    ];
    for (args, named) in cases {
        for cmd in ["put", "get"] {
            let mut c = sb.client("t");
            c.arg(cmd).args(&args);
            if cmd == "put" {
                c.arg(&src).arg("127.0.0.1:1:/");
            } else {
                c.arg("127.0.0.1:1:/x").arg(sb.path("dest"));
            }
            let out = run(&mut c, CMD_TIMEOUT);
            assert_code(&out, 2);
            assert!(
                out.stderr.contains(&named),
                "{cmd} {args:?}: {}",
                out.stderr
            );
        }
    }
}
