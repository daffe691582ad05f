//! `ferry sync` end to end against a `ferry serve`: both directions, a second run that sends
//! nothing, `--checksum`, `--delete` with filters and after a failure, `--dry-run`, between
//! two servers, and usage errors.

use crate::util;

use std::fs;
use std::path::Path;

use util::*;

fn make_tree(dir: &Path) {
    for (f, data) in [
        ("a.txt", "alpha"),
        ("sub/b.txt", "bravo"),
        ("sub/deep/c.txt", "charlie"),
        ("skip.log", "log"),
    ] {
        let p = dir.join(f);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, data).unwrap();
    }
}

/// Same size, other bytes, the old mtime back: a change size and mtime cannot see.
fn change_unseen(path: &Path) {
    let mtime = fs::metadata(path).unwrap().modified().unwrap();
    let data: Vec<u8> = fs::read(path).unwrap().iter().map(|b| b ^ 0x20).collect();
    fs::write(path, data).unwrap();
    let f = fs::File::options().write(true).open(path).unwrap();
    f.set_modified(mtime).unwrap();
}

#[test]
fn sync_up_and_down_sends_only_what_changed() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let src = sb.path("src");
    make_tree(&src);
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
    let sync = |extra: &[&str]| {
        run(
            sb.client(&s.token)
                .args(["sync", "--json"])
                .args(extra)
                .arg(&src)
                .arg(s.remote("/mirror")),
            CMD_TIMEOUT,
        )
    };
    let out = sync(&[]);
    assert_code(&out, 0);
    let v = one_json(&out.stdout);
    assert_eq!(v["plan"]["send"].as_array().unwrap().len(), 4, "{out:?}");
    assert_eq!(
        fs::read(root.join("mirror/sub/deep/c.txt")).unwrap(),
        b"charlie"
    );

    let out = sync(&[]);
    assert_code(&out, 0);
    let v = one_json(&out.stdout);
    assert_eq!(v["plan"]["unchanged"], 4, "{out:?}");
    assert!(v["transfer"].is_null(), "nothing sent: {out:?}");

    change_unseen(&src.join("sub/b.txt"));
    assert_code(&sync(&[]), 0);
    assert_eq!(fs::read(root.join("mirror/sub/b.txt")).unwrap(), b"bravo");
    let out = sync(&["--checksum"]);
    assert_code(&out, 0);
    assert_eq!(u64_field(&one_json(&out.stdout)["transfer"], "bytes"), 5);
    assert_eq!(fs::read(root.join("mirror/sub/b.txt")).unwrap(), b"BRAVO");

    // Down: into a new local directory of that name.
    let back = sb.path("back");
    let out = run(
        sb.client(&s.token)
            .arg("sync")
            .arg(s.remote("/mirror"))
            .arg(&back),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    assert!(out.stderr.contains("0 unchanged"), "{out:?}");
    assert_eq!(fs::read(back.join("sub/b.txt")).unwrap(), b"BRAVO");
}

#[test]
fn delete_dry_run_and_filters() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let src = sb.path("src");
    make_tree(&src);
    let mirror = root.join("mirror");
    fs::create_dir_all(mirror.join("old/x")).unwrap();
    fs::write(mirror.join("old/x/y.txt"), "y").unwrap();
    fs::write(mirror.join("stale.txt"), "s").unwrap();
    fs::write(mirror.join("kept.log"), "excluded, so protected").unwrap();
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
    let sync = |extra: &[&str]| {
        run(
            sb.client(&s.token)
                .args(["sync", "--delete", "--exclude=*.log"])
                .args(extra)
                .arg(&src)
                .arg(s.remote("/mirror")),
            CMD_TIMEOUT,
        )
    };
    let out = sync(&["-n"]);
    assert_code(&out, 0);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "send a.txt",
            "send sub/b.txt",
            "send sub/deep/c.txt",
            "delete stale.txt",
            "delete old/x/y.txt",
            "delete old/x",
            "delete old",
        ],
        "{out:?}"
    );
    assert!(mirror.join("stale.txt").exists() && !mirror.join("a.txt").exists());
    let out = sync(&["--dry-run", "--json"]);
    assert_code(&out, 0);
    assert_eq!(one_json(&out.stdout)["delete"].as_array().unwrap().len(), 4);

    // A file where the source has a directory: the transfer fails, nothing is deleted.
    fs::write(mirror.join("sub"), "in the way").unwrap();
    let out = sync(&[]);
    assert_code(&out, 1);
    assert!(out.stderr.contains("NOT deleted"), "{out:?}");
    assert!(mirror.join("stale.txt").exists());
    fs::remove_file(mirror.join("sub")).unwrap();

    let out = sync(&[]);
    assert_code(&out, 0);
    assert!(out.stderr.contains("4 deleted"), "{out:?}");
    assert!(!mirror.join("stale.txt").exists() && !mirror.join("old").exists());
    assert!(mirror.join("kept.log").exists() && !mirror.join("skip.log").exists());

    // A missing source fails (exit 1) and empties nothing.
    let out = run(
        sb.client(&s.token)
            .args(["sync", "--delete"])
            .arg(sb.path("no-such-dir"))
            .arg(s.remote("/mirror")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 1);
    assert!(out.stderr.contains("no-such-dir"), "{out:?}");
    assert!(mirror.join("a.txt").exists());
}

#[test]
fn sync_usage_errors() {
    let sb = Sandbox::new();
    for (args, says) in [
        (vec!["sync", "a", "b"], "one side on a server"),
        (
            vec!["sync", "--server-fingerprint=sha256:00", "h1:/a", "h2:/b"],
            "two servers",
        ),
        (
            vec!["sync", "--dest-token=t", "x", "h:/b"],
            "between two servers",
        ),
        (vec!["sync", "--exclude=a**", "x", "h:/b"], "a**"),
        (
            vec!["sync", "--skip-existing", "x", "h:/b"],
            "sync replaces",
        ),
    ] {
        let out = run(sb.client("t").args(&args), CMD_TIMEOUT);
        assert_code(&out, 2);
        assert!(out.stderr.contains(says), "{args:?}: {out:?}");
    }
}

/// Two `serve --third-party` on loopback: A's tree synced to B as a third-party copy, a
/// second run that sends nothing, a dry run, --delete with a filter, and a server that takes
/// no part in third-party copies refusing.
#[test]
fn sync_between_two_servers() {
    let sb = Sandbox::new();
    let (root_a, root_b) = (sb.mkdir("a"), sb.mkdir("b"));
    make_tree(&root_a.join("src"));
    let mirror = root_b.join("mirror");
    fs::create_dir_all(&mirror).unwrap();
    fs::write(mirror.join("stale.txt"), "s").unwrap();
    fs::write(mirror.join("kept.log"), "excluded, so protected").unwrap();
    let third = ["--third-party"];
    let a = Server::start(&sb, &root_a, Some(&sb.path("token-a")), &third);
    let b = Server::start(&sb, &root_b, Some(&sb.path("token-b")), &third);
    let sync = |a: &Server, b: &Server, extra: &[&str]| {
        run(
            sb.client("none")
                .args(["sync", "--exclude=*.log"])
                .args(["--source-token", &a.token, "--dest-token", &b.token])
                .args(extra)
                .arg(a.remote("/src"))
                .arg(b.remote("/mirror")),
            CMD_TIMEOUT,
        )
    };
    let out = sync(&a, &b, &["-n", "--delete"]);
    assert_code(&out, 0);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "send a.txt",
            "send sub/b.txt",
            "send sub/deep/c.txt",
            "delete stale.txt"
        ],
        "{out:?}"
    );
    assert!(!mirror.join("a.txt").exists() && mirror.join("stale.txt").exists());

    let out = sync(&a, &b, &["--json", "--delete"]);
    assert_code(&out, 0);
    let v = one_json(&out.stdout);
    assert!(
        v["transfer"].is_null(),
        "nothing through the client: {out:?}"
    );
    assert_eq!(u64_field(&v["copy"], "files"), 3, "{out:?}");
    assert_eq!(v["deleted"], 1, "{out:?}");
    assert_eq!(fs::read(mirror.join("sub/deep/c.txt")).unwrap(), b"charlie");
    assert!(!mirror.join("stale.txt").exists() && !mirror.join("skip.log").exists());
    assert!(mirror.join("kept.log").exists());

    let out = sync(&a, &b, &["--json", "--delete"]);
    assert_code(&out, 0);
    let v = one_json(&out.stdout);
    assert_eq!(v["plan"]["unchanged"], 3, "{out:?}");
    assert!(
        v["copy"].is_null() && v["transfer"].is_null(),
        "nothing sent: {out:?}"
    );

    // A destination that takes no part in third-party copies refuses; nothing is deleted and
    // nothing goes through this host.
    let plain = Server::start(&sb, &root_b, Some(&sb.path("token-c")), &[]);
    fs::write(mirror.join("stale.txt"), "s").unwrap();
    fs::write(root_a.join("src/new.txt"), "new").unwrap();
    let out = sync(&a, &plain, &["--delete"]);
    assert_code(&out, 1);
    assert!(out.stderr.contains("--third-party"), "{out:?}");
    assert!(mirror.join("stale.txt").exists() && !mirror.join("new.txt").exists());
}

/// `--checksum` against a server with a catalog compares with the digests the server
/// registered, without reading its files: a change made on the server behind ferry's back,
/// size and mtime kept, is not seen (that is `verify`'s job), in either direction. Without a
/// catalog the server reads its file, and the same change is found and undone.
#[test]
fn sync_checksum_takes_the_servers_registered_digests() {
    let sb = Sandbox::new();
    let src = sb.path("src");
    make_tree(&src);
    write_pattern(&src.join("big.bin"), 3 << 20, 7);
    let sync = |s: &Server, from: &str, to: &str| {
        run(
            sb.client(&s.token)
                .args(["sync", "--json", "--checksum", "--streams", "2", from, to]),
            CMD_TIMEOUT,
        )
    };
    let src_arg = src.to_str().unwrap().to_owned();

    let root = sb.mkdir("root");
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
    assert_code(&sync(&s, &src_arg, &s.remote("/mirror")), 0);
    let back = sb.path("back");
    let back_arg = back.to_str().unwrap().to_owned();
    assert_code(&sync(&s, &s.remote("/mirror"), &back_arg), 0);
    // The catalog's thread registers a put's files just after they are stored.
    std::thread::sleep(std::time::Duration::from_millis(500));
    change_unseen(&root.join("mirror/sub/b.txt"));
    change_unseen(&root.join("mirror/big.bin"));

    let out = sync(&s, &src_arg, &s.remote("/mirror"));
    assert_code(&out, 0);
    let sent = &one_json(&out.stdout)["transfer"];
    assert_eq!(u64_field(sent, "bytes"), 0, "{out:?}");
    assert_eq!(fs::read(root.join("mirror/sub/b.txt")).unwrap(), b"BRAVO");
    // Down, the server is the sender. A file it has read whole (a small one, sent in the
    // blocks that leave before the answer) it compares by what it read; a larger one, by
    // its registered digest.
    assert_code(&sync(&s, &s.remote("/mirror"), &back_arg), 0);
    assert_eq!(
        file_b3(&back.join("big.bin")),
        file_b3(&src.join("big.bin"))
    );

    let bare = sb.mkdir("bare");
    let n = Server::start(&sb, &bare, Some(&sb.path("token2")), &["--catalog", "none"]);
    assert_code(&sync(&n, &src_arg, &n.remote("/mirror")), 0);
    change_unseen(&bare.join("mirror/sub/b.txt"));
    change_unseen(&bare.join("mirror/big.bin"));
    let out = sync(&n, &src_arg, &n.remote("/mirror"));
    assert_code(&out, 0);
    assert_eq!(
        u64_field(&one_json(&out.stdout)["transfer"], "bytes"),
        5 + (3 << 20)
    );
    assert_eq!(fs::read(bare.join("mirror/sub/b.txt")).unwrap(), b"bravo");
    assert_eq!(
        file_b3(&bare.join("mirror/big.bin")),
        file_b3(&src.join("big.bin"))
    );
}

/// A symlink that changed alone, with no file to send, is synced (made again elsewhere, its
/// size and mtime differ), both ways; an unchanged one leaves nothing to do.
#[test]
fn a_link_that_changed_alone_is_synced() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let src = sb.path("src");
    make_tree(&src);
    std::os::unix::fs::symlink("a.txt", src.join("link")).unwrap();
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
    let sync = |from: String, to: String| {
        run(
            sb.client(&s.token)
                .args(["sync", "--json"])
                .arg(from)
                .arg(to),
            CMD_TIMEOUT,
        )
    };
    let (src_arg, there) = (src.display().to_string(), s.remote("/mirror"));
    assert_code(&sync(src_arg.clone(), there.clone()), 0);
    assert_eq!(
        fs::read_link(root.join("mirror/link")).unwrap(),
        Path::new("a.txt")
    );
    let out = sync(src_arg.clone(), there.clone());
    assert_code(&out, 0);
    assert!(one_json(&out.stdout)["transfer"].is_null(), "{out:?}");

    fs::remove_file(src.join("link")).unwrap();
    std::os::unix::fs::symlink("sub/b.txt", src.join("link")).unwrap();
    let out = sync(src_arg, there.clone());
    assert_code(&out, 0);
    let v = one_json(&out.stdout);
    assert_eq!(v["plan"]["send"], serde_json::json!(["link"]), "{v}");
    assert_eq!(
        fs::read_link(root.join("mirror/link")).unwrap(),
        Path::new("sub/b.txt")
    );

    // Down: a local copy whose link is pointed elsewhere is put back.
    let back = sb.path("back");
    assert_code(&sync(there.clone(), back.display().to_string()), 0);
    fs::remove_file(back.join("link")).unwrap();
    std::os::unix::fs::symlink("elsewhere", back.join("link")).unwrap();
    assert_code(&sync(there, back.display().to_string()), 0);
    assert_eq!(
        fs::read_link(back.join("link")).unwrap(),
        Path::new("sub/b.txt")
    );
}
