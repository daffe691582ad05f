//! ferry's filter rules against rsync's own: the same tree and rules, the same set of files.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use ferry_core::filter::{Action, Filter};

/// A tree with files at several depths, directories that rules name, and look-alike names.
const FILES: &[&str] = &[
    "top.txt",
    "top.log",
    "keep.log",
    "a.o",
    "src/main.c",
    "src/main.o",
    "src/util/x.c",
    "src/util/x.o",
    "src/util/deep/y.txt",
    "build/out.bin",
    "build/logs/b.log",
    "docs/build/readme.txt",
    "docs/notes.txt",
    "data/top.txt",
    "data/cache/c1.bin",
    "data/cache",
    "cache/z.txt",
    "zz/[x].txt",
    "zz/q1.txt",
    "zz/qq.txt",
];

fn build(root: &Path) {
    for f in FILES {
        let p = root.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        if p.is_dir() {
            // `data/cache` above is a directory already: a file of that name elsewhere would
            // clash, so it stays a directory (dir-only rules see it as one).
            continue;
        }
        std::fs::write(&p, f.as_bytes()).unwrap();
    }
    // A file named like a directory rule, to tell `cache/` from `cache`.
    std::fs::write(root.join("src/cache"), b"file").unwrap();
}

/// The files rsync would send from `root` with `args` (its filter options).
fn rsync_files(root: &Path, args: &[&str]) -> BTreeSet<String> {
    let out = Command::new("rsync")
        .args(["-r", "--dry-run", "--out-format=%n"])
        .args(args)
        .arg(format!("{}/", root.display()))
        .arg(root.with_file_name("rsync-dest-never-made"))
        .output()
        .expect("rsync is needed for this test (scripts/deps.sh installs it)");
    assert!(out.status.success(), "rsync failed: {out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.ends_with('/') && !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The files ferry's walk would send: excluded directories are not entered.
fn ferry_files(root: &Path, rel: &str, filter: &Filter, out: &mut BTreeSet<String>) {
    let dir = if rel.is_empty() {
        root.to_owned()
    } else {
        root.join(rel)
    };
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        let path = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        let is_dir = entry.file_type().unwrap().is_dir();
        if !filter.allows(&path, is_dir) {
            continue;
        }
        if is_dir {
            ferry_files(root, &path, filter, out);
        } else {
            out.insert(path);
        }
    }
}

/// Runs one rule set both ways; `rules` are (`--include`/`--exclude`, pattern) in order.
fn compare(rules: &[(Action, &str)]) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("tree");
    build(&root);
    let mut args = Vec::new();
    let mut filter = Filter::default();
    for (action, pattern) in rules {
        let flag = match action {
            Action::Include => "--include",
            Action::Exclude => "--exclude",
        };
        args.push(format!("{flag}={pattern}"));
        filter.add(*action, pattern).unwrap();
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let want = rsync_files(&root, &args);
    let mut got = BTreeSet::new();
    ferry_files(&root, "", &filter, &mut got);
    assert_eq!(got, want, "rules {rules:?}");
    assert!(
        !want.is_empty() || rules.is_empty(),
        "a rule set that sends nothing proves little: {rules:?}"
    );
}

use Action::{Exclude as X, Include as I};

#[test]
fn no_rules_send_everything() {
    compare(&[]);
}

#[test]
fn unanchored_patterns_match_at_any_depth() {
    compare(&[(X, "*.o")]);
    compare(&[(X, "top.txt"), (X, "util/*.c")]);
    compare(&[(X, "q?.txt"), (X, "[x].txt")]);
    compare(&[(X, "\\[x].txt")]);
}

#[test]
fn anchored_patterns_match_at_the_root_only() {
    compare(&[(X, "/top.txt")]);
    compare(&[(X, "/build")]);
    compare(&[(X, "/src/*.c")]);
}

#[test]
fn dir_only_patterns_skip_files_of_that_name() {
    compare(&[(X, "cache/")]);
    compare(&[(X, "build/")]);
    compare(&[(X, "/data/cache/")]);
}

#[test]
fn double_star_crosses_directories() {
    compare(&[(X, "/src/**")]);
    compare(&[(X, "src/**/*.o")]);
    compare(&[(X, "**/deep")]);
    compare(&[(X, "util/**")]);
    compare(&[(X, "/**/*.txt")]);
}

#[test]
fn include_before_exclude_wins() {
    compare(&[(I, "keep.log"), (X, "*.log")]);
    compare(&[(X, "*.log"), (I, "keep.log")]);
    compare(&[(I, "/docs/build/"), (X, "build/")]);
}

#[test]
fn exclude_everything_but() {
    compare(&[(I, "*/"), (I, "*.txt"), (X, "*")]);
    compare(&[(I, "/src/"), (I, "/src/**"), (X, "*")]);
    // Without `*/` the directories are excluded, so nothing below the root is reached.
    compare(&[(I, "*.txt"), (X, "*")]);
}

#[test]
fn double_star_between_and_at_the_start() {
    compare(&[(X, "/**/*.txt")]);
    compare(&[(X, "**/*.txt")]);
    compare(&[(X, "src/**/y.txt")]);
    compare(&[(X, "**/util/x.c")]);
}

#[test]
fn bang_clears_the_rules_before_it() {
    compare(&[(X, "*.o"), (X, "!"), (X, "*.c")]);
    compare(&[(I, "*.txt"), (X, "*.log"), (X, "!"), (X, "top.*")]);
}

#[test]
fn triple_star_is_a_directory_and_its_contents() {
    compare(&[(X, "/src/util/***")]);
    compare(&[(X, "cache/***")]);
    compare(&[(I, "/src/***"), (X, "*")]);
    compare(&[(I, "/docs/build/***"), (X, "build/")]);
}

/// Runs one rules file both ways: rsync reads it with `--filter='. FILE'`, ferry as
/// `--filter-from`. `files` are (name, text) written beside the tree first (for `merge`).
fn compare_file(rules: &str, files: &[(&str, &str)]) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("tree");
    build(&root);
    let at = |name: &str| tmp.path().join(name).display().to_string();
    for (name, text) in files {
        std::fs::write(at(name), text.replace("@", &at(""))).unwrap();
    }
    let main = at("rules");
    std::fs::write(&main, rules.replace("@", &at(""))).unwrap();
    let want = rsync_files(&root, &[&format!("--filter=. {main}")]);
    let mut filter = Filter::default();
    filter.add_file(Path::new(&main)).unwrap();
    let mut got = BTreeSet::new();
    ferry_files(&root, "", &filter, &mut got);
    assert_eq!(got, want, "rules {rules:?} with {files:?}");
    assert!(
        !want.is_empty(),
        "a rule set that sends nothing proves little"
    );
}

#[test]
fn rules_files_merge_clear_and_triple_star() {
    compare_file("- *.o\n!\n- *.c\n", &[]);
    compare_file(
        "+ keep.log\nmerge @more\n- top.*\n",
        &[("more", "- *.log\n+ *.o\n")],
    );
    compare_file(
        ". @more\n- /src/***\n",
        &[("more", "+ /src/util/***\n+ /src/\n")],
    );
    compare_file(
        "merge @a\n- *.txt\n",
        &[("a", "+ docs/***\n. @b\n"), ("b", "- *.bin\n!\n- *.o\n")],
    );
}
