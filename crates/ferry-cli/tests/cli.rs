//! End-to-end tests of the `ferry` binary: real processes, real sockets on 127.0.0.1, real
//! files in per-test temp dirs. Every server is a child process killed on drop.

use crate::util;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use util::*;

const MIB: u64 = 1 << 20;

/// A small tree with nesting, an empty file, an empty dir, a symlink and a multi-block file.
fn make_tree(dir: &Path) {
    fs::create_dir_all(dir.join("sub/deeper")).unwrap();
    fs::create_dir_all(dir.join("sub/emptydir")).unwrap();
    fs::write(dir.join("a.txt"), b"hello ferry\n").unwrap();
    fs::write(dir.join("empty.bin"), b"").unwrap();
    write_pattern(&dir.join("big.bin"), 3 * MIB + 123, 7);
    write_pattern(&dir.join("sub/deeper/c.bin"), 70_000, 8);
    fs::write(dir.join("sub/b.txt"), b"bee\n").unwrap();
    std::os::unix::fs::symlink("a.txt", dir.join("link")).unwrap();
}

fn f64_field(v: &Value, k: &str) -> f64 {
    v[k].as_f64()
        .unwrap_or_else(|| panic!("`{k}` is not a number in {v}"))
}

// ---------------------------------------------------------------------------------------------
// serve: tokens and state

#[test]
fn serve_token_file_is_created_0600_and_reused() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let tf = sb.path("secrets/token"); // the parent does not exist yet either
    let s1 = Server::start(&sb, &root, Some(&tf), &[]);
    assert_eq!(mode(&tf), 0o600, "token file mode");
    let t1 = fs::read_to_string(&tf).unwrap().trim().to_owned();
    assert!(
        t1.len() >= 32 && t1.bytes().all(|b| b.is_ascii_hexdigit()),
        "token looks random: {t1:?}"
    );
    drop(s1);

    let s2 = Server::start(&sb, &root, Some(&tf), &[]);
    assert_eq!(s2.token, t1, "second start reuses the token");
    assert_eq!(fs::read_to_string(&tf).unwrap().trim(), t1);
    assert_eq!(mode(&tf), 0o600);
    // And it is the token the server actually accepts.
    let out = run(sb.client(&t1).arg("ls").arg(s2.remote("/")), CMD_TIMEOUT);
    assert_code(&out, 0);
}

/// A server whose host refuses TCP Fast Open says so at start, with the setting that allows
/// it; one whose host allows it says nothing about it.
#[test]
fn serve_says_when_its_host_refuses_fast_open() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let s = Server::start(&sb, &root, None, &[]);
    // Served once, the server has written everything it says at start.
    assert_code(
        &run(
            sb.client(&s.token).arg("ls").arg(s.remote("/")),
            CMD_TIMEOUT,
        ),
        0,
    );
    let err = s.stderr();
    let setting = fs::read_to_string("/proc/sys/net/ipv4/tcp_fastopen")
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok())
        .ok_or("net.ipv4.tcp_fastopen cannot be read here");
    let Some(setting) = ferry_netem::needs("serve_says_when_its_host_refuses_fast_open", setting)
    else {
        return;
    };
    let note = err.lines().find(|l| l.contains("TCP Fast Open"));
    if setting & 2 == 0 {
        let note = note.unwrap_or_else(|| panic!("tcp_fastopen={setting}, no note:\n{err}"));
        assert!(
            note.contains(&format!("sysctl -w net.ipv4.tcp_fastopen={}", setting | 3)),
            "{note}"
        );
    } else {
        assert!(note.is_none(), "tcp_fastopen={setting} allows it:\n{err}");
    }
}

/// `ferry serve` under a low soft limit on open files (1024 is usual) raises it to the hard
/// limit, and warns when even the hard limit is below what its connection cap may need.
#[test]
fn serve_raises_its_open_file_limit() {
    let own = rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum;
    let enough = own
        .is_none_or(|m| m >= 1024)
        .then_some(())
        .ok_or("this process may not open 1024 files");
    let Some(()) = ferry_netem::needs("serve_raises_its_open_file_limit", enough) else {
        return;
    };
    let hard = own.unwrap_or(u64::MAX).min(4096);
    let limited = |soft: u64, hard: u64| {
        move |cmd: &mut std::process::Command| {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe; the closure allocates nothing.
            unsafe {
                cmd.pre_exec(move || {
                    let l = libc::rlimit {
                        rlim_cur: soft,
                        rlim_max: hard,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &l) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
    };
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    // Room for the cap under the hard limit: raised, and nothing said.
    let s = Server::start_with(
        &sb,
        &root,
        None,
        &["--max-connections", "100"],
        limited(256, hard),
    );
    assert_eq!(open_files(s.guard.pid()), (hard, hard));
    assert!(!s.stderr().contains("open files"), "{}", s.stderr());
    drop(s);
    // A hard limit below what 512 connections may need (3 each): raised as far as it goes,
    // and the operator is told what to change.
    let s = Server::start_with(
        &sb,
        &root,
        None,
        &["--max-connections", "512"],
        limited(256, 1024),
    );
    assert_eq!(open_files(s.guard.pid()), (1024, 1024));
    let err = s.stderr();
    let warning = err
        .lines()
        .find(|l| l.contains("limit on open files"))
        .unwrap_or_else(|| panic!("no warning:\n{err}"));
    assert!(
        warning.contains("is 1024, below the 1600")
            && warning.contains("--max-connections 512")
            && warning.contains("LimitNOFILE="),
        "{warning}"
    );
}

/// The soft and hard limits on open files of process `pid`, from `/proc/PID/limits`.
fn open_files(pid: u32) -> (u64, u64) {
    let limits = fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_else(|| panic!("{limits}"));
    let n: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (n[0], n[1])
}

#[test]
fn serve_without_token_file_uses_state_dir_and_shows_token_once() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let state = sb.state_dir();
    let s1 = Server::start(&sb, &root, None, &[]);
    let err1 = s1.stderr();
    let token = s1.token.clone();
    assert_eq!(token.len(), 48, "first start shows the new token:\n{err1}");
    assert_eq!(err1.matches(&token).count(), 1, "token shown once:\n{err1}");
    // Only the hash is stored, in a private file; the TLS key sits beside it.
    let tokens = state.join("tokens.toml");
    let stored = fs::read_to_string(&tokens).unwrap();
    assert!(!stored.contains(&token), "secret stored:\n{stored}");
    assert!(stored.contains("name = \"default\""), "{stored}");
    assert_eq!(mode(&tokens), 0o600);
    assert_eq!(mode(&state.join("server-key.pem")) & 0o077, 0);
    let fp_line = err1
        .lines()
        .find(|l| l.contains("--server-fingerprint sha256:"))
        .unwrap_or_else(|| panic!("fingerprint shown:\n{err1}"));
    let fingerprint = fp_line.rsplit(' ').next().unwrap().to_owned();
    drop(s1);

    let s2 = Server::start(&sb, &root, None, &[]);
    let err2 = s2.stderr();
    assert!(
        !err2.contains(&token),
        "second start must not print the token again:\n{err2}"
    );
    assert!(
        err2.contains(&fingerprint),
        "same key after a restart:\n{err2}"
    );
    // The token from the first start still works, pinned to the printed fingerprint.
    let out = run(
        sb.client(&token)
            .args(["ls", "--server-fingerprint", &fingerprint])
            .arg(s2.remote("/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
}

// ---------------------------------------------------------------------------------------------
// put / get / ls

#[test]
fn put_tree_get_back_identical_and_ls() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let src = sb.path("src/tree");
    make_tree(&src);
    let want = tree_digest(&src);
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);

    let out = run(
        sb.client(&s.token)
            .args(["put", "--block-size", "1M", "--streams", "3"])
            .arg(&src)
            .arg(s.remote("/dir/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    assert_eq!(
        tree_digest(&root.join("dir/tree")),
        want,
        "server copy differs"
    );

    let dest = sb.path("back");
    let out = run(
        sb.client(&s.token)
            .args(["get", "--block-size", "1M", "--streams", "2"])
            .arg(s.remote("/dir/tree"))
            .arg(format!("{}/", dest.display())),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    assert_eq!(
        tree_digest(&dest.join("tree")),
        want,
        "fetched copy differs"
    );

    // ls, plain: one entry per line, name last (directories with a trailing '/').
    let out = run(
        sb.client(&s.token).arg("ls").arg(s.remote("/dir/tree")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    let listed: BTreeSet<String> = out
        .stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            l.split_whitespace()
                .last()
                .unwrap()
                .trim_end_matches('/')
                .to_owned()
        })
        .collect();
    let expected: BTreeSet<String> = ["a.txt", "big.bin", "empty.bin", "link", "sub"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(listed, expected, "ls output:\n{}", out.stdout);
    let sub_line = out.stdout.lines().find(|l| l.ends_with(" sub/"));
    assert!(
        sub_line.is_some_and(|l| l.starts_with('d')),
        "{}",
        out.stdout
    );

    let out = run(
        sb.client(&s.token).arg("ls").arg(s.remote("/dir")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    assert!(
        out.stdout.lines().any(|l| l.ends_with(" tree/")),
        "{}",
        out.stdout
    );

    // ls --json: names, kinds and sizes.
    let out = run(
        sb.client(&s.token)
            .args(["ls", "--json"])
            .arg(s.remote("/dir/tree")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    let v = one_json(&out.stdout);
    let arr = v.as_array().expect("ls --json is an array");
    let by_name: BTreeMap<&str, &Value> = arr
        .iter()
        .map(|e| (e["name"].as_str().expect("name is a string"), e))
        .collect();
    assert_eq!(
        by_name
            .keys()
            .map(|s| s.to_string())
            .collect::<BTreeSet<_>>(),
        expected
    );
    for f in ["a.txt", "big.bin", "empty.bin"] {
        let size = fs::metadata(src.join(f)).unwrap().len();
        assert_eq!(by_name[f]["size"].as_u64(), Some(size), "size of {f}");
        assert_eq!(by_name[f]["kind"], "file", "{}", by_name[f]);
    }
    assert_eq!(by_name["sub"]["kind"], "dir");
    assert_eq!(by_name["link"]["kind"], "symlink");
}

#[test]
fn put_json_prints_exactly_one_document() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let file = sb.path("src/data.bin");
    write_pattern(&file, 5 * MIB, 3);
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
    let out = run(
        sb.client(&s.token)
            .args(["put", "--json", "--streams", "3", "--block-size", "256K"])
            .arg(&file)
            .arg(s.remote("/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    let v = one_json(&out.stdout);
    assert!(v.is_object(), "{v}");
    assert_eq!(u64_field(&v, "files"), 1);
    assert_eq!(u64_field(&v, "bytes"), 5 * MIB);
    assert!(f64_field(&v, "seconds") > 0.0, "{v}");
    assert!(f64_field(&v, "mib_per_s") > 0.0, "{v}");
    let streams = v["streams"].as_array().expect("streams is an array");
    assert_eq!(streams.len(), 3, "one entry per stream: {v}");
    let mut total = 0;
    for st in streams {
        total += u64_field(st, "bytes");
        let tcp = &st["tcp"];
        assert!(tcp.is_object(), "tcp info present: {st}");
        for k in [
            "rtt_us",
            "snd_cwnd",
            "total_retrans",
            "sndbuf",
            "rcvbuf",
            "busy_us",
            "rwnd_limited_us",
            "sndbuf_limited_us",
        ] {
            assert!(tcp[k].is_u64(), "tcp.{k} is a number: {st}");
        }
        assert!(u64_field(tcp, "sndbuf") > 0 && u64_field(tcp, "snd_cwnd") > 0);
    }
    assert!(total >= 5 * MIB, "streams carried the data: {total}");
    // Bytes per interval as they reached the server (TLS records included, so a little
    // more than the frames), complete intervals only: on loopback there may be none.
    let timeline = &v["timeline"];
    assert_eq!(u64_field(timeline, "interval_ms"), 250, "{timeline}");
    let per_interval = timeline["bytes"]
        .as_array()
        .expect("timeline.bytes is an array");
    let acked: u64 = per_interval
        .iter()
        .map(|b| b.as_u64().expect("a count"))
        .sum();
    assert!(acked <= total + total / 50, "{acked} of {total}");
    assert_eq!(file_b3(&root.join("data.bin")), file_b3(&file));
}

#[test]
fn manifest_matches_blake3_and_md5() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let src = sb.path("src/tree");
    make_tree(&src);
    let parent = src.parent().unwrap().to_path_buf();
    let files: BTreeSet<String> = tree_digest(&src)
        .into_iter()
        .filter(|(_, e)| matches!(e, Entry::File { .. }))
        .map(|(p, _)| p)
        .collect();
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);

    for (algo, dest, digest) in [
        ("blake3", "/b3/", file_b3 as fn(&Path) -> String),
        ("md5", "/md5/", file_md5),
    ] {
        let manifest = sb.path(&format!("manifest-{algo}.txt"));
        let out = run(
            sb.client(&s.token)
                .args(["put", "--checksum", algo, "--manifest"])
                .arg(&manifest)
                .arg(&src)
                .arg(s.remote(dest)),
            CMD_TIMEOUT,
        );
        assert_code(&out, 0);
        let text = fs::read_to_string(&manifest).expect("manifest written");
        let mut seen = BTreeSet::new();
        for line in text.lines() {
            let (hex, path) = line
                .split_once("  ")
                .unwrap_or_else(|| panic!("not `<hex>  <path>`: {line:?}"));
            let want_len = if algo == "md5" { 32 } else { 64 };
            assert_eq!(hex.len(), want_len, "{algo} digest length: {line:?}");
            assert!(hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
            // The path names the file as sent: relative to the source's parent.
            let rel = path.trim_start_matches('/');
            let local = parent.join(rel);
            assert!(local.is_file(), "{path} is not a sent file ({text})");
            assert_eq!(hex, digest(&local), "{algo} of {path}");
            seen.insert(rel.strip_prefix("tree/").unwrap_or(rel).to_owned());
        }
        assert_eq!(seen, files, "one manifest line per file:\n{text}");
    }
}

/// Files of every size, one large enough to be read by several readers at once (segments):
/// the manifest's digest of each, and the stored copy, are what `b3sum` prints for the source.
#[test]
fn manifest_digests_are_what_b3sum_prints_for_every_size() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let src = sb.mkdir("sizes");
    let sizes = [
        0,
        1,
        1023,
        1024,
        1025,
        8 * MIB - 1,
        8 * MIB + 1,
        70 * MIB + 333,
    ];
    for (i, &n) in sizes.iter().enumerate() {
        write_pattern(&src.join(format!("f{i}")), n, i as u64 + 40);
    }
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
    let manifest = sb.path("manifest.txt");
    let out = run(
        sb.client(&s.token)
            .args(["put", "--manifest"])
            .arg(&manifest)
            .arg(&src)
            .arg(s.remote("/in/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    let text = fs::read_to_string(&manifest).expect("manifest written");
    let listed: BTreeMap<String, String> = text
        .lines()
        .map(|l| {
            let (hex, path) = l.split_once("  ").expect("`<hex>  <path>`");
            let name = path.rsplit('/').next().unwrap().to_owned();
            (name, hex.to_owned())
        })
        .collect();
    assert_eq!(listed.len(), sizes.len(), "one line per file:\n{text}");
    let names: Vec<String> = (0..sizes.len()).map(|i| format!("f{i}")).collect();
    let b3sum = std::process::Command::new("b3sum")
        .arg("--no-names")
        .args(names.iter().map(|n| src.join(n)))
        .output();
    let sums: Vec<String> = match b3sum {
        Ok(o) if o.status.success() => String::from_utf8(o.stdout)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect(),
        other => {
            assert!(
                std::env::var_os("CI").is_none(),
                "b3sum is needed (scripts/bench-deps.sh installs it): {other:?}"
            );
            eprintln!("b3sum is not installed: comparing with the blake3 crate");
            names.iter().map(|n| file_b3(&src.join(n))).collect()
        }
    };
    for (name, sum) in names.iter().zip(&sums) {
        assert_eq!(&listed[name], sum, "{name}: the manifest's digest");
        assert_eq!(
            &file_b3(&root.join("in/sizes").join(name)),
            sum,
            "{name}: the stored copy"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// exit codes

#[test]
fn wrong_token_exits_1_with_authentication_message() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let file = sb.path("f.txt");
    fs::write(&file, b"x").unwrap();
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
    let out = run(
        sb.client("not-the-token")
            .arg("put")
            .arg(&file)
            .arg(s.remote("/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 1);
    assert!(
        out.stderr.to_lowercase().contains("authentication"),
        "{out:?}"
    );
    assert!(
        names(&root).is_empty(),
        "nothing stored: {:?}",
        names(&root)
    );
}

#[test]
fn missing_token_is_a_usage_error() {
    let sb = Sandbox::new();
    let file = sb.path("f.txt");
    fs::write(&file, b"x").unwrap();
    // No server at all: the token is missing before anything is dialled.
    let port = free_port();
    for cmd in [
        vec!["put".to_owned(), file.display().to_string()],
        vec!["get".to_owned()],
        vec!["ls".to_owned()],
    ] {
        let mut c = sb.ferry();
        c.args(&cmd).arg(format!("127.0.0.1:{port}:/x"));
        if cmd[0] == "get" {
            c.arg(sb.path("dest"));
        }
        let out = run(&mut c, CMD_TIMEOUT);
        assert_code(&out, 2);
        assert!(out.stderr.contains("token"), "{cmd:?}: {out:?}");
    }
}

#[test]
fn bad_block_size_is_a_usage_error() {
    let sb = Sandbox::new();
    let file = sb.path("f.txt");
    fs::write(&file, b"x").unwrap();
    let port = free_port();
    let out = run(
        sb.client("t")
            .args(["put", "--block-size", "3Q"])
            .arg(&file)
            .arg(format!("127.0.0.1:{port}:/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 2);
    assert!(out.stderr.contains("3Q"), "{out:?}");
}

#[test]
fn unknown_flag_is_a_usage_error() {
    let sb = Sandbox::new();
    let out = run(
        sb.client("t")
            .args(["put", "--no-such-flag", "a", "127.0.0.1:1:/"]),
        CMD_TIMEOUT,
    );
    assert_code(&out, 2);
    assert!(out.stderr.contains("--no-such-flag"), "{out:?}");
}

#[test]
fn existing_destination_fail_skip_overwrite() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
    let file = sb.path("src/f.txt");
    fs::create_dir_all(file.parent().unwrap()).unwrap();
    fs::write(&file, b"old contents\n").unwrap();
    let put = |extra: &[&str]| {
        run(
            sb.client(&s.token)
                .arg("put")
                .args(extra)
                .arg(&file)
                .arg(s.remote("/")),
            CMD_TIMEOUT,
        )
    };
    assert_code(&put(&[]), 0);
    assert_eq!(fs::read(root.join("f.txt")).unwrap(), b"old contents\n");

    fs::write(&file, b"NEW contents, longer than before\n").unwrap();
    let out = put(&[]);
    assert_code(&out, 1);
    assert!(out.stderr.contains("exists"), "{out:?}");
    assert_eq!(
        fs::read(root.join("f.txt")).unwrap(),
        b"old contents\n",
        "old file intact"
    );
    assert_eq!(names(&root), ["f.txt"], "no temp files left");

    let out = put(&["--skip-existing"]);
    assert_code(&out, 0);
    assert_eq!(fs::read(root.join("f.txt")).unwrap(), b"old contents\n");

    let out = put(&["--overwrite"]);
    assert_code(&out, 0);
    assert_eq!(
        fs::read(root.join("f.txt")).unwrap(),
        b"NEW contents, longer than before\n",
        "replaced"
    );
    assert_eq!(names(&root), ["f.txt"]);

    // The two policies together make no sense.
    let out = put(&["--overwrite", "--skip-existing"]);
    assert_code(&out, 2);
}

#[test]
fn connection_refused_exits_1() {
    let sb = Sandbox::new();
    let file = sb.path("f.txt");
    fs::write(&file, b"x").unwrap();
    let port = free_port(); // nobody listens there now
    let t0 = Instant::now();
    let out = run(
        sb.client("t")
            .args(["put", "--retry-for", "0"])
            .arg(&file)
            .arg(format!("127.0.0.1:{port}:/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 1);
    assert!(out.stderr.starts_with("error:"), "{out:?}");
    assert!(
        out.stderr.to_lowercase().contains("refused"),
        "says why: {out:?}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "fails fast on refusal"
    );
}

// ---------------------------------------------------------------------------------------------
// TCP window, config file, terminal behaviour

#[test]
fn tcp_window_fixes_socket_buffers() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let file = sb.path("src/data.bin");
    write_pattern(&file, 4 * MIB, 5);
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
    let out = run(
        sb.client(&s.token)
            .args(["put", "--json", "--tcp-window", "1M", "--streams", "2"])
            .arg(&file)
            .arg(s.remote("/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    assert!(
        out.stderr.contains("disables the kernel's TCP autotuning"),
        "using the option warns: {out:?}"
    );
    let v = one_json(&out.stdout);
    // Linux caps SO_SNDBUF at net.core.wmem_max and reports twice what was set.
    let cap = |f: &str| -> u64 {
        fs::read_to_string(f)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(u64::MAX)
    };
    let want_snd = 2 * MIB.min(cap("/proc/sys/net/core/wmem_max"));
    let want_rcv = 2 * MIB.min(cap("/proc/sys/net/core/rmem_max"));
    let streams = v["streams"].as_array().expect("streams");
    assert_eq!(streams.len(), 2);
    for st in streams {
        let tcp = &st["tcp"];
        let snd = u64_field(tcp, "sndbuf");
        assert!(snd >= MIB, "sndbuf {snd} < 1 MiB: {st}");
        assert_eq!(snd, want_snd, "sndbuf is the fixed size: {st}");
        assert_eq!(u64_field(tcp, "rcvbuf"), want_rcv, "rcvbuf fixed: {st}");
    }
    assert_eq!(file_b3(&root.join("data.bin")), file_b3(&file));
    // The option is documented as disabling autotuning.
    let help = run(sb.ferry().args(["put", "--help"]), CMD_TIMEOUT);
    assert_code(&help, 0);
    assert!(help.stdout.contains("autotuning"), "{}", help.stdout);
}

#[test]
fn token_from_config_file_and_per_host_override() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
    let cfg_dir = sb.xdg_config().join("ferry");
    fs::create_dir_all(&cfg_dir).unwrap();
    let cfg = cfg_dir.join("config.toml");
    let good = &s.token;
    let cases = [
        (format!("token = \"{good}\"\n"), 0, "default token"),
        (
            format!("token = \"wrong\"\n\n[hosts.\"127.0.0.1\"]\ntoken = \"{good}\"\n"),
            0,
            "per-host token overrides the default",
        ),
        (
            format!("token = \"{good}\"\n\n[hosts.\"127.0.0.1\"]\ntoken = \"wrong\"\n"),
            1,
            "per-host token wins even when it is wrong",
        ),
        (
            format!("token = \"wrong\"\n\n[hosts.\"example.org\"]\ntoken = \"{good}\"\n"),
            1,
            "another host's token is not used",
        ),
    ];
    for (i, (text, code, what)) in cases.iter().enumerate() {
        fs::write(&cfg, text).unwrap();
        let file = sb.path(&format!("src/f{i}.txt"));
        fs::create_dir_all(file.parent().unwrap()).unwrap();
        fs::write(&file, format!("case {i}\n")).unwrap();
        let out = run(
            sb.ferry().arg("put").arg(&file).arg(s.remote("/")),
            CMD_TIMEOUT,
        );
        assert_eq!(out.code(), Some(*code), "{what}\n{out:?}");
        let stored = root.join(format!("f{i}.txt"));
        if *code == 0 {
            assert_eq!(fs::read(&stored).unwrap(), format!("case {i}\n").as_bytes());
        } else {
            assert!(
                out.stderr.to_lowercase().contains("authentication"),
                "{out:?}"
            );
            assert!(!stored.exists());
        }
    }
    // ls reads the same file.
    fs::write(&cfg, format!("[hosts.\"127.0.0.1\"]\ntoken = \"{good}\"\n")).unwrap();
    let out = run(sb.ferry().arg("ls").arg(s.remote("/")), CMD_TIMEOUT);
    assert_code(&out, 0);
    assert!(out.stdout.contains("f0.txt"), "{out:?}");
}

#[test]
fn not_a_terminal_no_progress_artifacts_and_quiet_is_silent() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let file = sb.path("src/data.bin");
    write_pattern(&file, 16 * MIB, 9);
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);

    let out = run(
        sb.client(&s.token)
            .arg("put")
            .arg(&file)
            .arg(s.remote("/a/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    assert!(out.stdout.is_empty(), "nothing on stdout: {out:?}");
    assert!(!out.stderr.contains('\r'), "no carriage returns: {out:?}");
    assert!(!out.stderr.contains('\x1b'), "no escape codes: {out:?}");
    // The first contact pins the server's key and says so, once (like ssh).
    let lines: Vec<&str> = out.stderr.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 2, "the pin notice and the summary: {out:?}");
    assert!(lines[0].contains("pinned its key"), "{out:?}");
    let lines = &lines[1..];
    assert!(
        lines[0].starts_with("put: 1 files, 16.00 MiB in ") && lines[0].contains("verified"),
        "{out:?}"
    );

    let out = run(
        sb.client(&s.token)
            .args(["-q", "put"])
            .arg(&file)
            .arg(s.remote("/b/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    assert!(out.stderr.is_empty(), "-q prints nothing: {out:?}");
    assert!(out.stdout.is_empty(), "-q prints nothing: {out:?}");
    assert_eq!(file_b3(&root.join("b/data.bin")), file_b3(&file));
}

// ---------------------------------------------------------------------------------------------
// demo, shutdown, interrupted transfers

#[test]
fn demo_json_reports_three_verified_cases() {
    let sb = Sandbox::new();
    let out = run(
        sb.ferry().args([
            "demo",
            "--file-size",
            "8M",
            "--small-files",
            "200",
            "--small-size",
            "4K",
            "--json",
        ]),
        Duration::from_secs(40),
    );
    assert_code(&out, 0);
    let v = one_json(&out.stdout);
    let cases = v.as_array().expect("demo --json is an array");
    assert_eq!(cases.len(), 3, "{v}");
    let expect = [(1, 8 * MIB), (200, 200 * 4096), (1, 200 * 4096)];
    for (c, (files, bytes)) in cases.iter().zip(expect) {
        assert_eq!(c["verified"], true, "{c}");
        assert!(f64_field(c, "mib_per_s") > 0.0, "{c}");
        assert!(f64_field(c, "seconds") > 0.0, "{c}");
        assert_eq!(u64_field(c, "files"), files, "{c}");
        assert_eq!(u64_field(c, "bytes"), bytes, "{c}");
    }
}

#[test]
fn sigterm_stops_the_server_gracefully() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let mut s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
    // An idle connection that never says Hello must not hold the shutdown up.
    let idle = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    s.signal("TERM");
    let status = s
        .guard
        .wait_for(Duration::from_secs(5))
        .unwrap_or_else(|| panic!("no exit within 5 s of SIGTERM:\n{}", s.stderr()));
    assert_eq!(status.code(), Some(0), "{}", s.stderr());
    assert!(s.stderr().contains("ferry: stopped"), "{}", s.stderr());
    drop(idle);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", s.port)).is_err(),
        "port closed after shutdown"
    );
}

#[test]
fn killed_client_leaves_only_temp_files_which_expire() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let file = sb.path("src/large.bin");
    write_pattern(&file, 300 * MIB, 11);
    let s = Server::start(
        &sb,
        &root,
        Some(&sb.path("token")),
        &["--idle-timeout", "5"],
    );
    let put_cmd = || {
        let mut c = sb.client(&s.token);
        c.args(["put", "--block-size", "1M", "--streams", "2"])
            .arg(&file)
            .arg(s.remote("/large.bin"));
        c
    };
    let final_path = root.join("large.bin");
    let only_temps = |root: &Path| {
        names(root)
            .iter()
            .all(|n| n.starts_with(".ferry-") && (n.ends_with(".part") || n.ends_with(".journal")))
    };

    let err_path = sb.path("put.err");
    let mut client = ChildGuard(Some(
        put_cmd()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(fs::File::create(&err_path).unwrap())
            .spawn()
            .unwrap(),
    ));
    // Wait until the server is well into writing the temporary file, then SIGKILL the client.
    let mid = wait_until(Duration::from_secs(15), || {
        names(&root).iter().any(|n| {
            n.starts_with(".ferry-")
                && fs::metadata(root.join(n)).is_ok_and(|m| m.len() >= 16 * MIB)
        }) || client.child().try_wait().unwrap().is_some()
    });
    assert!(mid, "the transfer never started");
    // If the put succeeded, make the file bigger.
    client.assert_running(&err_path, "interrupted");
    client.child().kill().unwrap();
    client
        .wait_for(Duration::from_secs(5))
        .expect("killed client reaped");
    let after_kill = names(&root);
    let partial: u64 = after_kill
        .iter()
        .filter_map(|n| fs::metadata(root.join(n)).ok())
        .map(|m| m.len())
        .sum();
    assert!(
        !final_path.exists(),
        "final name after kill: {after_kill:?}"
    );
    assert!(only_temps(&root), "only temp files: {after_kill:?}");

    // The server notices (EOF) and ends the session, keeping the journaled partial copy for
    // the next attempt; nothing ever appears under the final name.
    std::thread::sleep(Duration::from_millis(500));
    assert!(!final_path.exists());
    assert!(only_temps(&root), "only temp files: {:?}", names(&root));
    assert!(
        names(&root).iter().any(|n| n.ends_with(".journal")),
        "a resume journal is kept: {:?}",
        names(&root)
    );
    eprintln!("killed with {partial} bytes in temp files {after_kill:?}");

    // The re-run resumes: it sends only what is missing (plus the final block, which carries
    // the file digest), and the result is byte-identical.
    let out = run(put_cmd().arg("--json"), Duration::from_secs(40));
    assert_code(&out, 0);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("one JSON document");
    let sent: u64 = v["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["bytes"].as_u64().unwrap())
        .sum();
    eprintln!("re-run sent {sent} bytes of {}", 300 * MIB);
    assert!(
        sent + 8 * MIB <= 300 * MIB,
        "the re-run resent nearly everything: {sent} bytes"
    );
    assert_eq!(
        file_b3(&final_path),
        file_b3(&file),
        "re-run is byte-identical"
    );
    assert_eq!(names(&root), ["large.bin"]);
}

#[test]
fn stalled_client_session_ends_after_idle_timeout() {
    // SIGKILL closes the client's sockets, so the server sees EOF at once. A stopped client
    // keeps them open and silent: only the idle timeout can end that session.
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let file = sb.path("src/large.bin");
    write_pattern(&file, 300 * MIB, 12);
    let s = Server::start(
        &sb,
        &root,
        Some(&sb.path("token")),
        &["--idle-timeout", "5"],
    );
    let err_path = sb.path("put.err");
    let mut client = ChildGuard(Some(
        sb.client(&s.token)
            .args(["put", "--block-size", "1M", "--streams", "2"])
            .arg(&file)
            .arg(s.remote("/large.bin"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(fs::File::create(&err_path).unwrap())
            .spawn()
            .unwrap(),
    ));
    let mid = wait_until(Duration::from_secs(15), || {
        names(&root).iter().any(|n| {
            n.starts_with(".ferry-")
                && fs::metadata(root.join(n)).is_ok_and(|m| m.len() >= 16 * MIB)
        }) || client.child().try_wait().unwrap().is_some()
    });
    assert!(mid, "the transfer never started");
    client.assert_running(&err_path, "stopped");
    let stop = std::process::Command::new("kill")
        .args(["-STOP", &client.pid().to_string()])
        .status()
        .unwrap();
    assert!(stop.success());
    let stopped_at = Instant::now();
    assert!(
        client.child().try_wait().unwrap().is_none(),
        "the put finished before it could be stopped"
    );
    let final_path = root.join("large.bin");
    std::thread::sleep(Duration::from_secs(1));
    assert!(!final_path.exists());
    assert!(
        names(&root).iter().any(|n| n.starts_with(".ferry-")),
        "the session is still open 1 s into the stall: {:?}",
        names(&root)
    );
    // While the stalled session holds the partial copy, another put of the same file is
    // refused as busy instead of writing into it; once the idle timeout ends the session, a
    // put resumes from it.
    let retry = |budget: &str| {
        let mut c = sb.client(&s.token);
        c.args([
            "put",
            "--block-size",
            "1M",
            "--streams",
            "2",
            "--retry-for",
            budget,
        ])
        .arg(&file)
        .arg(s.remote("/large.bin"));
        c
    };
    let busy = run(&mut retry("0"), Duration::from_secs(40));
    assert_code(&busy, 1);
    assert!(busy.stderr.contains("another transfer"), "{busy:?}");
    std::thread::sleep(Duration::from_secs(6).saturating_sub(stopped_at.elapsed()));
    let waited = stopped_at.elapsed();
    let out = run(retry("0").arg("--json"), Duration::from_secs(40));
    assert_code(&out, 0);
    assert_eq!(file_b3(&final_path), file_b3(&file));
    // It resumed from the stalled session's partial copy (16 MiB or more), not from nothing.
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("one JSON document");
    let sent: u64 = v["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["bytes"].as_u64().unwrap())
        .sum();
    eprintln!(
        "the put after the idle timeout sent {sent} bytes of {}",
        300 * MIB
    );
    assert!(
        sent + 8 * MIB <= 300 * MIB,
        "the put after the idle timeout resent nearly everything: {sent} bytes"
    );
    assert!(
        waited >= Duration::from_secs(4),
        "resumed after {waited:?}, before the 5 s idle timeout"
    );
    drop(client); // SIGKILL works on a stopped process too

    let out = run(
        sb.client(&s.token)
            .args(["put", "--block-size", "1M", "--streams", "2"])
            .arg(&file)
            .arg(s.remote("/large.bin")),
        Duration::from_secs(40),
    );
    assert_code(&out, 0);
    assert_eq!(file_b3(&final_path), file_b3(&file));
}

#[test]
fn remote_paths_are_confined_to_the_root() {
    let sb = Sandbox::new();
    let root = sb.mkdir("srv/root");
    let outside = sb.mkdir("srv/outside");
    fs::write(sb.path("srv/secret.txt"), b"secret\n").unwrap();
    std::os::unix::fs::symlink(&outside, root.join("escape")).unwrap();
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
    let file = sb.path("src/f.txt");
    fs::create_dir_all(file.parent().unwrap()).unwrap();
    fs::write(&file, b"payload\n").unwrap();

    for dest in ["/../f.txt", "/../outside/", "/escape/", "/escape/f.txt"] {
        let out = run(
            sb.client(&s.token)
                .arg("put")
                .arg(&file)
                .arg(s.remote(dest)),
            CMD_TIMEOUT,
        );
        assert!(
            names(&outside).is_empty() && !sb.path("srv/f.txt").exists(),
            "put to {dest} wrote outside the root\n{out:?}"
        );
        assert_ne!(out.code(), Some(0), "put to {dest} succeeded?\n{out:?}");
    }
    for src in ["/../secret.txt", "/escape/../../secret.txt"] {
        let dest = sb.path("got");
        let out = run(
            sb.client(&s.token).arg("get").arg(s.remote(src)).arg(&dest),
            CMD_TIMEOUT,
        );
        assert_ne!(out.code(), Some(0), "get {src} succeeded\n{out:?}");
        assert!(!dest.exists(), "get {src} fetched something");
    }
}

#[test]
fn put_whose_destination_dir_cannot_be_made_says_why() {
    let sb = Sandbox::new();
    let root = sb.mkdir("srv/root");
    let outside = sb.mkdir("srv/outside");
    fs::write(root.join("plain"), b"a regular file\n").unwrap();
    std::os::unix::fs::symlink(&outside, root.join("escape")).unwrap();
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
    let file = sb.path("src/f.txt");
    fs::create_dir_all(file.parent().unwrap()).unwrap();
    fs::write(&file, b"payload\n").unwrap();
    for (dest, reason) in [
        ("/plain/", "Not a directory"),
        ("/escape/", "outside the transfer root"),
    ] {
        let out = run(
            sb.client(&s.token)
                .arg("put")
                .arg(&file)
                .arg(s.remote(dest)),
            CMD_TIMEOUT,
        );
        assert_code(&out, 1);
        assert!(out.stderr.contains(reason), "put to {dest}: {out:?}");
        assert!(
            !out.stderr.contains("temporary"),
            "a permanent error is not called temporary: {out:?}"
        );
        assert!(names(&outside).is_empty());
    }
}

#[test]
fn error_causes_are_printed_once() {
    let sb = Sandbox::new();
    let file = sb.path("f.txt");
    fs::write(&file, b"x").unwrap();
    let port = free_port();
    let out = run(
        sb.client("t")
            .args(["put", "--retry-for", "0"])
            .arg(&file)
            .arg(format!("127.0.0.1:{port}:/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 1);
    assert_eq!(
        out.stderr.matches("Connection refused").count(),
        1,
        "{out:?}"
    );
    let out = run(
        sb.client("t")
            .args(["put", "--retry-for", "0"])
            .arg(sb.path("does-not-exist"))
            .arg(format!("127.0.0.1:{port}:/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 1);
    assert!(out.stderr.contains("does-not-exist"), "{out:?}");
    assert_eq!(
        out.stderr.matches("No such file or directory").count(),
        1,
        "{out:?}"
    );
}

#[test]
fn probe_host_and_disk_report_json_and_leave_nothing_behind() {
    let sb = Sandbox::new();
    let out = run(
        sb.ferry().args(["probe", "host", "--quick", "--json"]),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("host report is JSON");
    assert!(v["speeds"].as_array().is_some_and(|s| !s.is_empty()), "{v}");
    assert!(v["tcp"].is_object(), "{v}");
    // The routes' initial windows, read with `ip -j route` (empty on a host without routes,
    // or without `ip`, which a note then says).
    assert!(v["routes"].is_array(), "{v}");

    let dir = sb.mkdir("disk");
    let out = run(
        sb.ferry()
            .args(["probe", "disk", "--quick", "--max-threads", "2", "--json"])
            .arg(&dir),
        Duration::from_secs(120),
    );
    assert_code(&out, 0);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("disk report is JSON");
    let points = v["points"].as_array().expect("points");
    assert!(!points.is_empty());
    assert!(names(&dir).is_empty(), "probe left {:?}", names(&dir));
    // Text form for people: a recommendation section.
    let out = run(
        sb.ferry()
            .args(["probe", "disk", "--quick", "--max-threads", "1"])
            .arg(&dir),
        Duration::from_secs(120),
    );
    assert_code(&out, 0);
    assert!(out.stdout.contains("recommendation"), "{}", out.stdout);
}

// ---------------------------------------------------------------------------------------------
// auto-tuned streams

/// A put or get over a path an earlier transfer measured as long and fast opens ramp helpers:
/// extra connections that carry two blocks each at the start and park. The path is remembered
/// from large transfers only, and fixed streams or a short path open none.
/// The get half of `a_transfer_over_a_remembered_long_path_opens_ramp_helpers`: `paths` reads
/// what the client remembers of the path to `s`, `remember_a_long_path` makes it 100 ms.
fn get_over_a_long_path(
    sb: &Sandbox,
    s: &Server,
    large: &Path,
    paths: &dyn Fn() -> Value,
    remember_a_long_path: &dyn Fn(),
) {
    let large = large.to_path_buf();
    // A get over the same path (that put remembered loopback's again): the server, sending,
    // keeps the connections beyond 16 as helpers (the client says so with
    // `Capabilities::RAMP_HELPERS`).
    assert!(u64_field(&paths(), "rtt_us") < 20_000, "{}", paths());
    remember_a_long_path();
    let back = sb.mkdir("back");
    let out = run(
        sb.client(&s.token)
            .args(["get", "--json", "--block-size", "256K"])
            .arg(s.remote("/large.bin"))
            .arg(&back),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    let v = one_json(&out.stdout);
    let t = &v["tuning"];
    let helpers = u64_field(t, "ramp_helpers");
    assert!((1..=40).contains(&helpers), "{v}");
    assert_eq!(u64_field(t, "connections"), 16 + helpers, "{v}");
    assert!(u64_field(t, "streams") <= 16, "{v}");
    let mut carried = 0;
    for (i, st) in v["streams"].as_array().unwrap().iter().enumerate().skip(16) {
        let bytes = u64_field(st, "bytes");
        assert!(
            bytes <= 2 * 260 * 1024,
            "helper {i} carried {bytes} bytes: {v}"
        );
        carried += bytes;
    }
    // Helpers carry blocks whatever the tuner's count, which on loopback starts at 4: a
    // server that took them for tuned connections would have left them idle.
    assert!(carried > 0, "{v}");
    assert_eq!(file_b3(&back.join("large.bin")), file_b3(&large));
}

#[test]
fn a_transfer_over_a_remembered_long_path_opens_ramp_helpers() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let (small, large) = (sb.path("src/small.bin"), sb.path("src/large.bin"));
    write_pattern(&small, 6 * MIB, 21);
    write_pattern(&large, 64 * MIB, 22);
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
    let server = s.remote("/").trim_end_matches(":/").to_owned();
    let put = |file: &Path, options: &[&str]| {
        let out = run(
            sb.client(&s.token)
                .args(["put", "--json", "--overwrite", "--block-size", "256K"])
                .args(options)
                .arg(file)
                .arg(s.remote("/")),
            CMD_TIMEOUT,
        );
        assert_code(&out, 0);
        one_json(&out.stdout)
    };
    let profiles = sb.state_dir().join("profiles.json");
    let paths = || -> Value {
        fs::read(&profiles).map_or(Value::Null, |b| {
            serde_json::from_slice::<Value>(&b).unwrap()["paths"][&server].clone()
        })
    };

    // Nothing remembered: no helpers. A small transfer remembers no path.
    let v = put(&small, &[]);
    assert_eq!(u64_field(&v["tuning"], "ramp_helpers"), 0, "{v}");
    assert_eq!(u64_field(&v["tuning"], "connections"), 16, "{v}");
    assert!(paths().is_null(), "{}", paths());
    // A large one does: loopback's round trip (below the helpers' 20 ms) and its rate.
    let v = put(&large, &[]);
    assert_eq!(u64_field(&v["tuning"], "ramp_helpers"), 0, "{v}");
    let p = paths();
    assert!(
        (1..20_000).contains(&u64_field(&p, "rtt_us")) && u64_field(&p, "bytes_per_s") > 0,
        "{p}"
    );
    assert_eq!(file_b3(&root.join("large.bin")), file_b3(&large));
    // On loopback that path opens no helpers.
    let v = put(&small, &[]);
    assert_eq!(u64_field(&v["tuning"], "ramp_helpers"), 0, "{v}");

    // The same server remembered at 100 ms and 1 Gbit/s: the most helpers, beyond the 16
    // connections the tuner may use. Each carries at most two blocks and none of them is
    // ever counted among the streams carrying data.
    let remember_a_long_path = || {
        let mut file: Value = serde_json::from_slice(&fs::read(&profiles).unwrap()).unwrap();
        file["paths"][&server] =
            serde_json::json!({"rtt_us": 100_000, "bytes_per_s": 125_000_000, "updated": 1});
        fs::write(&profiles, serde_json::to_vec(&file).unwrap()).unwrap();
    };
    remember_a_long_path();
    // New content, so that the server stores it rather than finding it complete.
    write_pattern(&large, 64 * MIB, 23);
    let v = put(&large, &[]);
    assert_eq!(u64_field(&v, "bytes"), 64 * MIB, "{v}");
    let t = &v["tuning"];
    let helpers = u64_field(t, "ramp_helpers");
    assert!((1..=40).contains(&helpers), "{v}");
    assert_eq!(u64_field(t, "connections"), 16 + helpers, "{v}");
    assert!(u64_field(t, "streams") <= 16, "{v}");
    let streams = v["streams"].as_array().unwrap();
    assert_eq!(streams.len() as u64, 16 + helpers, "{v}");
    // A 256 KiB block is about 256.2 KiB on the wire (frame header, path, digests).
    let mut carried = 0;
    for (i, st) in streams.iter().enumerate().skip(16) {
        let bytes = u64_field(st, "bytes");
        assert!(
            bytes <= 2 * 260 * 1024,
            "helper {i} carried {bytes} bytes: {v}"
        );
        assert_eq!(u64_field(st, "resent"), 0, "helper {i} took copies: {v}");
        carried += bytes;
    }
    assert!(carried > 0, "{v}");
    assert_eq!(file_b3(&root.join("large.bin")), file_b3(&large));

    get_over_a_long_path(&sb, &s, &large, &paths, &remember_a_long_path);

    // Fixed streams open exactly what they say.
    let v = put(&small, &["--streams", "4"]);
    assert_eq!(u64_field(&v["tuning"], "ramp_helpers"), 0, "{v}");
    assert_eq!(u64_field(&v["tuning"], "connections"), 4, "{v}");
}

/// What the first put with `--streams auto` (the default) and no profile reports of its
/// tuning: auto from the default start, each end tuning its own storage threads.
fn assert_default_auto_tuning(v: &Value) {
    let t = &v["tuning"];
    assert_eq!(t["mode"], "auto", "{v}");
    assert_eq!(t["start_from"], "default", "{v}");
    assert_eq!(u64_field(t, "start"), 4, "{v}");
    assert!(
        u64_field(t, "connections") >= u64_field(t, "streams"),
        "{v}"
    );
    assert!(
        t["steps"].is_array() && t["load"]["sender"].is_object(),
        "{v}"
    );
    let b = t["bottleneck"].as_str().expect("bottleneck is a string");
    assert!(
        ["network", "source storage", "destination storage", "cpu"].contains(&b),
        "{v}"
    );
    // Each end runs and tunes its own storage threads: this client its readers, the server
    // its writers (which it reports at the end).
    let (r, w) = (&t["readers"], &t["writers"]);
    assert_eq!(
        (r["side"].as_str(), r["mode"].as_str()),
        (Some("client"), Some("auto")),
        "{v}"
    );
    assert_eq!(r["start_from"], "default", "{v}");
    assert_eq!(u64_field(r, "start"), 4, "{v}");
    assert!((1..=16).contains(&u64_field(r, "threads")), "{v}");
    assert_eq!(w["side"], "server", "{v}");
    assert!((1..=16).contains(&u64_field(w, "threads")), "{v}");
}

/// `MAJOR:MINOR` of the file system `file` is on, as disk profiles are keyed.
fn device_of(file: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let dev = fs::metadata(file).unwrap().dev();
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    format!("{major}:{minor}")
}

#[test]
fn put_streams_auto_reports_tuning_and_starts_from_a_profile() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let file = sb.path("src/data.bin");
    write_pattern(&file, 5 * MIB, 11);
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
    // A put of `file` with these options that must succeed (in 256 KiB blocks unless the
    // options give a block size or say "default-block").
    let put = |options: &[&str]| {
        let block: &[&str] =
            if options.contains(&"default-block") || options.contains(&"--block-size") {
                &[]
            } else {
                &["--block-size", "256K"]
            };
        let options: Vec<&str> = options
            .iter()
            .copied()
            .filter(|o| *o != "default-block")
            .collect();
        let out = run(
            sb.client(&s.token)
                .arg("put")
                .args(&options)
                .args(block)
                .arg(&file)
                .arg(s.remote("/")),
            CMD_TIMEOUT,
        );
        assert_code(&out, 0);
        out
    };
    // `auto` is the default: no --streams.
    let v = one_json(&put(&["--json"]).stdout);
    assert_default_auto_tuning(&v);
    assert_eq!(file_b3(&root.join("data.bin")), file_b3(&file));

    // A remembered stream count for this server is where the next transfer starts.
    let server = s.remote("/").trim_end_matches(":/").to_owned();
    fs::create_dir_all(sb.state_dir()).unwrap();
    fs::write(
        sb.state_dir().join("profiles.json"),
        format!(
            r#"{{"version":1,"endpoints":{{"{server}":{{"streams":2,"settled":true,"updated":1}}}}}}"#
        ),
    )
    .unwrap();
    // Other contents, so that this put moves data: a run that moves none names no bottleneck.
    write_pattern(&file, 5 * MIB, 12);
    let out = put(&["--streams", "auto", "--overwrite"]);
    assert!(
        out.stderr.contains("streams (auto), ")
            && out.stderr.contains(" readers, ")
            && out.stderr.contains(" writers, limited by "),
        "summary line says how the streams and threads were chosen and what limited them: {}",
        out.stderr
    );
    let v = one_json(&put(&["--json", "--overwrite"]).stdout);
    assert_eq!(v["tuning"]["start_from"], "profile", "{v}");
    assert_eq!(u64_field(&v["tuning"], "start"), 2, "{v}");
    assert_eq!(file_b3(&root.join("data.bin")), file_b3(&file));

    // `ferry probe disk`'s profile of the source's file system is where the readers start.
    let dev = device_of(&file);
    fs::write(
        sb.state_dir().join("disk-profiles.json"),
        format!(
            r#"{{"{dev}":{{"path":"/x","read_threads":2,"write_threads":1,"read_mib_per_s":1.0,"write_mib_per_s":1.0,"measured_at":"2026-11-22T00:00:00Z"}}}}"#
        ),
    )
    .unwrap();
    let v = one_json(&put(&["--json", "--overwrite"]).stdout);
    let r = &v["tuning"]["readers"];
    assert_eq!(r["start_from"], "disk profile", "{v}");
    assert_eq!(u64_field(r, "start"), 2, "{v}");
    // A profile saved before it recorded a request size leaves the block size alone.
    let v = one_json(&put(&["--json", "--overwrite", "default-block"]).stdout);
    assert_eq!(v["block_size_from"], "default", "{v}");
    assert_eq!(u64_field(&v, "block_size"), 8 << 20, "{v}");
    // With one, blocks start at the request size the probe found best, within 1-16 MiB...
    fs::write(
        sb.state_dir().join("disk-profiles.json"),
        format!(
            r#"{{"{dev}":{{"path":"/x","read_threads":2,"write_threads":1,"read_mib_per_s":1.0,"write_mib_per_s":1.0,"request_size":67108864,"measured_at":"2026-11-22T00:00:00Z"}}}}"#
        ),
    )
    .unwrap();
    let v = one_json(&put(&["--json", "--overwrite", "default-block"]).stdout);
    assert_eq!(v["block_size_from"], "disk profile", "{v}");
    assert_eq!(u64_field(&v, "block_size"), 16 << 20, "{v}");
    assert_eq!(file_b3(&root.join("data.bin")), file_b3(&file));
    // ...and --block-size fixes it.
    let v = one_json(&put(&["--json", "--block-size", "4M", "--overwrite"]).stdout);
    assert_eq!(v["block_size_from"], "fixed", "{v}");
    assert_eq!(u64_field(&v, "block_size"), 4 << 20, "{v}");
    // A number fixes the pool.
    let v = one_json(&put(&["--json", "--readers", "3", "--overwrite"]).stdout);
    let r = &v["tuning"]["readers"];
    assert_eq!(
        (r["mode"].as_str(), r["start_from"].as_str()),
        (Some("fixed"), Some("fixed")),
        "{v}"
    );
    assert_eq!(u64_field(r, "threads"), 3, "{v}");
    assert_eq!(file_b3(&root.join("data.bin")), file_b3(&file));
}

#[test]
fn streams_must_be_auto_or_a_number() {
    let sb = Sandbox::new();
    let out = run(
        sb.client("t")
            .args(["put", "--streams", "lots", "x", "127.0.0.1:1:/"]),
        CMD_TIMEOUT,
    );
    assert_code(&out, 2);
    assert!(out.stderr.contains("auto"), "{}", out.stderr);
}

#[test]
fn probe_net_quick_json_reports_and_saves_a_profile() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
    let endpoint = format!("127.0.0.1:{}", s.port);
    let out = run(
        sb.client(&s.token)
            .args(["probe", "net", "--quick", "--json"])
            .arg(&endpoint),
        Duration::from_secs(60),
    );
    assert_code(&out, 0);
    let v: Value = serde_json::from_str(&out.stdout).expect("net report is JSON");
    assert_eq!(v["endpoint"], endpoint.as_str(), "{v}");
    assert_eq!(v["direction"], "client_to_server", "{v}");
    let points = v["points"].as_array().expect("points");
    // --quick: streams 1 then 4 (the ramp may stop after 1 on a host where 4 gain < 5%).
    assert!(!points.is_empty() && points.len() <= 2, "{v}");
    assert_eq!(points[0]["streams"], 1, "{v}");
    for p in points {
        assert_eq!(p["window"], 0, "{v}");
        assert!(f64_field(p, "rate_mbps") > 0.0, "{v}");
        assert_eq!(p["runs_mbps"].as_array().map(Vec::len), Some(1), "{v}");
    }
    assert!(f64_field(&v, "rtt_idle_ms") >= 0.0, "{v}");
    let best = &v["best"];
    assert!(f64_field(best, "rate_mbps") > 0.0, "{v}");
    assert!(u64_field(best, "bdp_bytes") > 0, "{v}");
    assert!(
        ["window", "loss", "link", "unknown"].contains(&v["limit"].as_str().unwrap_or("")),
        "{v}"
    );
    assert!(
        v["explanation"].as_array().is_some_and(|e| !e.is_empty()),
        "{v}"
    );
    assert!(v["tcp"].is_object(), "{v}");

    // The profile, keyed by host:port, in the client state directory.
    let file = sb.state_dir().join("net-profiles.json");
    assert_eq!(v["profile"], file.to_str().unwrap(), "{v}");
    let profiles: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let p = &profiles[endpoint.as_str()];
    assert_eq!(p["streams"], best["streams"], "{profiles}");
    assert_eq!(p["window"], 0, "{profiles}");
    assert!(f64_field(p, "rate_mbps") > 0.0, "{profiles}");
    assert!(p["rtt_ms"].is_number(), "{profiles}");
    assert!(
        p["measured_at"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{profiles}"
    );

    // A transfer to this server with no tuned history of its own starts from the probe's best.
    let data = sb.path("src/probe-then-put.bin");
    write_pattern(&data, MIB, 5);
    let out = run(
        sb.client(&s.token)
            .args(["put", "--json"])
            .arg(&data)
            .arg(s.remote("/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    let t = &one_json(&out.stdout)["tuning"];
    assert_eq!(t["start_from"], "probe", "{t}");
    assert_eq!(t["start"], best["streams"], "{t}");

    // Text form, no save: the table and the best setting, and the profile file is unchanged.
    let before = std::fs::read(&file).unwrap();
    let out = run(
        sb.client(&s.token)
            .args(["probe", "net", "--quick", "--no-save", "--seconds", "1"])
            .arg(&endpoint),
        Duration::from_secs(60),
    );
    assert_code(&out, 0);
    assert!(out.stdout.contains("best: "), "{}", out.stdout);
    assert!(out.stdout.contains("autotuning"), "{}", out.stdout);
    assert_eq!(std::fs::read(&file).unwrap(), before);

    // A wrong token ends the probe at once with the server's reason.
    let out = run(
        sb.client("wrong")
            .args(["probe", "net", "--quick"])
            .arg(&endpoint),
        Duration::from_secs(30),
    );
    assert_code(&out, 1);
    assert!(out.stderr.contains("authentication failed"), "{out:?}");
}
