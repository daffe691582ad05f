//! Policies per path prefix (`[[policy]]` in `ferry serve --config`, issue 39) between two
//! servers on loopback, each with a catalog of its own or both on one PostgreSQL catalog: a
//! put under a `replicas = 2` prefix ends with a good replica on the peer (the server copies it
//! itself, in the background); one owed to a peer that is down follows once it is up, across
//! a restart of the source; retention refuses an early rm and mv; a policy's checksum refuses
//! a put with another, and a put, sync or cp that leaves it to ferry takes it; `stat` shows
//! all of it.

use crate::util;

use std::fs;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use util::*;

/// How long a replica may take to appear (the copy itself takes milliseconds; the bound is
/// for a loaded machine and the retry's backoff).
const REPLICA_WAIT: Duration = Duration::from_secs(90);

/// `ferry serve` named `name` (in the catalog and in its directories) on `port`, with its own
/// state directory (TLS key, SQLite catalog) and token file, and `extra` options.
fn start(sb: &Sandbox, name: &str, port: u16, extra: &[&str]) -> Server {
    let root = sb.mkdir(name);
    let state = sb.mkdir(&format!("state-{name}"));
    let token = sb.path(&format!("token-{name}"));
    let listen = format!("127.0.0.1:{port}");
    let n = fs::read_dir(sb.dir.path()).unwrap().count();
    let log_path = sb.path(&format!("serve-{name}-{n}.log"));
    let mut cmd = sb.serve_cmd(&root, &listen, Some(&token));
    cmd.args(["--catalog-name", name])
        .args(extra)
        .env("FERRY_STATE_DIR", &state)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log_path).unwrap());
    let mut guard = ChildGuard(Some(cmd.spawn().expect("spawning ferry serve")));
    if let Err(e) = wait_serving(&mut guard, &log_path, &listen, Duration::from_secs(10)) {
        panic!("{name}: {e}");
    }
    Server {
        guard,
        port,
        root,
        token: fs::read_to_string(&token).unwrap().trim().to_owned(),
        stderr_path: log_path,
    }
}

/// The key fingerprint a server printed at start.
fn fingerprint(s: &Server) -> String {
    s.stderr()
        .lines()
        .find_map(|l| l.split("--server-fingerprint ").nth(1))
        .expect("the server prints its fingerprint")
        .trim()
        .to_owned()
}

/// A config for `a`: `policy_retry_max` 2 s, `raw/` wanting 2 replicas with `b` as the peer,
/// `keep/` retained for a day, `sums/` registered with sha256.
fn config_for_a(sb: &Sandbox, b_port: u16, b_fingerprint: &str) -> String {
    let path = sb.path("a.toml");
    let text = format!(
        "policy_retry_max = \"2s\"\n\n\
         [[policy]]\nprefix = \"raw/\"\nreplicas = 2\nto = [\"b\"]\n\n\
         [[policy]]\nprefix = \"keep\"\nretain = \"1d\"\n\n\
         [[policy]]\nprefix = \"sums\"\nchecksum = \"sha256\"\n\n\
         [peers.b]\naddr = \"127.0.0.1:{b_port}\"\nfingerprint = \"{b_fingerprint}\"\n\
         token_file = \"{}\"\n",
        sb.path("token-b").display()
    );
    fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

fn put(sb: &Sandbox, s: &Server, src: &Path, dest: &str, extra: &[&str]) -> Out {
    run(
        sb.client(&s.token)
            .arg("put")
            .args(extra)
            .arg(src)
            .arg(s.remote(dest)),
        CMD_TIMEOUT,
    )
}

fn stat(sb: &Sandbox, s: &Server, path: &str) -> Value {
    let out = run(
        sb.client(&s.token)
            .args(["stat", "--json"])
            .arg(s.remote(path)),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    one_json(&out.stdout)
}

/// Polls `a`'s stat of `path` until its policy has 2 good replicas and owes nothing.
fn wait_for_two_good(sb: &Sandbox, a: &Server, path: &str) -> Value {
    let mut last = Value::Null;
    let met = wait_until(REPLICA_WAIT, || {
        last = stat(sb, a, path);
        let p = &last["policy"];
        let done = p["replicas_good"] == 2 && p["owed"].is_null();
        if !done {
            std::thread::sleep(Duration::from_millis(200));
        }
        done
    });
    assert!(
        met,
        "no second good replica of {path}: {last:#}\n{}",
        a.stderr()
    );
    last
}

fn good_servers(v: &Value) -> Vec<String> {
    let mut good: Vec<String> = v["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["state"] == "good")
        .map(|r| r["server"].as_str().unwrap().to_owned())
        .collect();
    good.sort();
    good
}

/// A put under `raw/` on `a`: it answers at once, and `a` then copies the file to `b` and
/// knows it as a good replica there; `b`'s file is byte-identical. A file moved into the
/// prefix is copied too; one moved out leaves `b`'s copy where it is (known at that path with
/// a catalog each, stale in a shared one).
fn a_put_under_a_replicated_prefix_reaches_the_peer(catalog: Option<&str>) {
    let sb = Sandbox::new();
    let shared: Vec<&str> = catalog.map_or(Vec::new(), |c| vec!["--catalog", c]);
    let b = start(&sb, "b", free_port(), &shared);
    let config = config_for_a(&sb, b.port, &fingerprint(&b));
    let mut a_args = vec!["--config", config.as_str()];
    a_args.extend(&shared);
    let a = start(&sb, "a", free_port(), &a_args);
    let src = sb.path("src/run1.bin");
    fs::create_dir_all(src.parent().unwrap()).unwrap();
    write_pattern(&src, 3_000_000, 11);
    assert_code(&put(&sb, &a, &src, "/raw/", &[]), 0);
    let v = wait_for_two_good(&sb, &a, "/raw/run1.bin");
    assert_eq!(v["policy"]["prefix"], "/raw");
    assert_eq!(v["policy"]["replicas_wanted"], 2);
    assert_eq!(good_servers(&v), ["a", "b"]);
    let copy = b.root.join("raw/run1.bin");
    assert_eq!(file_b3(&copy), file_b3(&src));
    // The peer's catalog knows its copy (the same object in a shared catalog).
    assert!(good_servers(&stat(&sb, &b, "/raw/run1.bin")).contains(&"b".to_owned()));
    // Outside the prefix nothing is owed, and nothing copied.
    assert_code(&put(&sb, &a, &src, "/other.bin", &[]), 0);
    let v = stat(&sb, &a, "/other.bin");
    assert!(v["policy"].is_null(), "{v:#}");
    assert!(!b.root.join("other.bin").exists());
    // Moved into the prefix, it owes its copy there and gets it.
    let mv = |from: &str, to: &str| {
        let out = run(
            sb.client(&a.token).arg("mv").arg(a.remote(from)).arg(to),
            CMD_TIMEOUT,
        );
        assert_code(&out, 0);
    };
    mv("/other.bin", "/raw/moved.bin");
    let v = wait_for_two_good(&sb, &a, "/raw/moved.bin");
    assert_eq!(good_servers(&v), ["a", "b"]);
    assert_eq!(file_b3(&b.root.join("raw/moved.bin")), file_b3(&src));
    // Moved out of it: a's file moves, b's copy stays where it is: known there when b has a
    // catalog of its own (a's record of it), stale when b shares a's catalog (b knows its
    // replicas at the objects' paths).
    mv("/raw/run1.bin", "/cooked.bin");
    let v = stat(&sb, &a, "/cooked.bin");
    assert!(v["policy"].is_null(), "{v:#}");
    let at = |server: &str| -> (String, String) {
        v["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["server"] == server)
            .map(|r| {
                let s = |k: &str| r[k].as_str().unwrap().to_owned();
                (s("path"), s("state"))
            })
            .unwrap_or_default()
    };
    let b_copy = match catalog {
        None => ("/raw/run1.bin".to_owned(), "good".to_owned()),
        Some(_) => ("/cooked.bin".to_owned(), "stale".to_owned()),
    };
    assert_eq!(
        (at("a"), at("b")),
        (("/cooked.bin".into(), "good".into()), b_copy),
        "{v:#}"
    );
    assert!(b.root.join("raw/run1.bin").exists());
}

#[test]
fn a_put_under_a_replicated_prefix_reaches_the_peer_with_a_catalog_each() {
    a_put_under_a_replicated_prefix_reaches_the_peer(None);
}

#[test]
fn a_put_under_a_replicated_prefix_reaches_the_peer_in_a_shared_postgresql_catalog() {
    let Some(cluster) = ferry_netem::needs(
        "ferry_cli::policies::a_put_under_a_replicated_prefix_reaches_the_peer_in_a_shared_postgresql_catalog",
        ferry_catalog::TestCluster::start(),
    ) else {
        return;
    };
    a_put_under_a_replicated_prefix_reaches_the_peer(Some(&cluster.database_url()));
    drop(cluster);
}

/// The peer is down when the put lands: `stat` shows the replica owed with the failure, the
/// source is killed and started again, then the peer comes up on its address, and the
/// replica follows from what the source's catalog kept.
#[test]
fn a_replica_owed_to_a_peer_that_was_down_follows_across_a_restart_of_the_source() {
    let sb = Sandbox::new();
    let b_port = free_port();
    let b = start(&sb, "b", b_port, &[]);
    let config = config_for_a(&sb, b.port, &fingerprint(&b));
    drop(b);
    let a = start(&sb, "a", free_port(), &["--config", &config]);
    let src = sb.path("src.bin");
    write_pattern(&src, 500_000, 5);
    assert_code(&put(&sb, &a, &src, "/raw/late.bin", &[]), 0);
    let mut last = Value::Null;
    let failed = wait_until(REPLICA_WAIT, || {
        last = stat(&sb, &a, "/raw/late.bin");
        let owed = &last["policy"]["owed"];
        let tried = owed["tries"].as_u64().unwrap_or(0) >= 1;
        if !tried {
            std::thread::sleep(Duration::from_millis(200));
        }
        tried
    });
    assert!(failed, "no failed try shown: {last:#}");
    let p = &last["policy"];
    assert_eq!(
        (&p["replicas_wanted"], &p["replicas_good"]),
        (&2.into(), &1.into())
    );
    let note = p["owed"]["note"].as_str().unwrap();
    assert!(note.contains("peer b"), "{note}");
    // Text output says the same in a line.
    let out = run(
        sb.client(&a.token)
            .arg("stat")
            .arg(a.remote("/raw/late.bin")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    assert!(
        out.stdout
            .contains("policy:    /raw: 2 wanted, 1 good; next try in"),
        "{out:?}"
    );
    drop(a);
    let a = start(&sb, "a", free_port(), &["--config", &config]);
    let b = start(&sb, "b", b_port, &[]);
    let v = wait_for_two_good(&sb, &a, "/raw/late.bin");
    assert_eq!(good_servers(&v), ["a", "b"]);
    assert_eq!(file_b3(&b.root.join("raw/late.bin")), file_b3(&src));
}

/// `keep/` is retained for a day: an rm, an mv and a put --overwrite of another file are
/// refused with the policy named; the file, its catalog entry and its contents stay.
#[test]
fn retention_refuses_an_early_rm_mv_and_overwrite_and_stat_shows_the_policy() {
    let sb = Sandbox::new();
    let b = start(&sb, "b", free_port(), &[]);
    let config = config_for_a(&sb, b.port, &fingerprint(&b));
    let a = start(&sb, "a", free_port(), &["--config", &config]);
    let src = sb.path("doc.txt");
    fs::write(&src, "kept\n").unwrap();
    assert_code(&put(&sb, &a, &src, "/keep/doc.txt", &[]), 0);
    let v = stat(&sb, &a, "/keep/doc.txt");
    assert_eq!(v["policy"]["prefix"], "/keep");
    assert_eq!(v["policy"]["retain_s"], 86_400);
    for args in [
        vec!["rm".to_owned(), a.remote("/keep/doc.txt")],
        vec!["rm".to_owned(), "-r".to_owned(), a.remote("/keep")],
        vec![
            "mv".to_owned(),
            a.remote("/keep/doc.txt"),
            "/elsewhere.txt".to_owned(),
        ],
    ] {
        let out = run(sb.client(&a.token).args(&args), CMD_TIMEOUT);
        assert_ne!(out.code(), Some(0), "{args:?}: {out:?}");
        assert!(
            out.stderr.contains("retained") && out.stderr.contains("/keep"),
            "{args:?}: {out:?}"
        );
    }
    fs::write(&src, "other contents\n").unwrap();
    let out = put(&sb, &a, &src, "/keep/doc.txt", &["--overwrite"]);
    assert_ne!(out.code(), Some(0), "{out:?}");
    assert!(out.stderr.contains("retained"), "{out:?}");
    assert_eq!(
        fs::read_to_string(a.root.join("keep/doc.txt")).unwrap(),
        "kept\n"
    );
    assert_eq!(stat(&sb, &a, "/keep/doc.txt")["size"], 5);
    // Outside the prefix an rm goes through.
    assert_code(&put(&sb, &a, &src, "/free.txt", &[]), 0);
    let out = run(
        sb.client(&a.token).arg("rm").arg(a.remote("/free.txt")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
}

/// `sums/` registers sha256: a put with another algorithm chosen is refused naming the policy
/// before any data moves; one that leaves the choice to ferry is put again with sha256 and
/// registered so; one with `--checksum sha256` too.
#[test]
fn a_policys_checksum_refuses_a_put_with_another_and_registers_its_own() {
    let sb = Sandbox::new();
    let b = start(&sb, "b", free_port(), &[]);
    let config = config_for_a(&sb, b.port, &fingerprint(&b));
    let a = start(&sb, "a", free_port(), &["--config", &config]);
    let src = sb.path("f.dat");
    write_pattern(&src, 10_000, 3);
    let out = put(&sb, &a, &src, "/sums/f.dat", &["--checksum", "blake3"]);
    assert_ne!(out.code(), Some(0), "{out:?}");
    assert!(
        out.stderr.contains("sha256") && out.stderr.contains("/sums"),
        "{out:?}"
    );
    assert!(!a.root.join("sums/f.dat").exists());
    let out = put(&sb, &a, &src, "/sums/f.dat", &["--json"]);
    assert_code(&out, 0);
    assert!(
        out.stderr.contains("putting with --checksum sha256"),
        "{out:?}"
    );
    assert_eq!(one_json(&out.stdout)["checksum"], "sha256", "{out:?}");
    let v = stat(&sb, &a, "/sums/f.dat");
    assert_eq!(v["policy"]["checksum"], "sha256");
    assert_eq!(v["algo"], "sha256", "{v:#}");
    assert_eq!(
        fs::read(a.root.join("sums/f.dat")).unwrap(),
        fs::read(&src).unwrap()
    );
    assert_code(
        &put(&sb, &a, &src, "/sums/g.dat", &["--checksum", "sha256"]),
        0,
    );
    assert_eq!(stat(&sb, &a, "/sums/g.dat")["algo"], "sha256");
}

/// A sync into `sums/` that leaves the digest to ferry is run again with the policy's sha256;
/// one with `--digest blake3` chosen is refused.
#[test]
fn a_sync_into_a_policys_prefix_takes_its_checksum() {
    let sb = Sandbox::new();
    let b = start(&sb, "b", free_port(), &[]);
    let config = config_for_a(&sb, b.port, &fingerprint(&b));
    let a = start(&sb, "a", free_port(), &["--config", &config]);
    let tree = sb.mkdir("tree");
    write_pattern(&tree.join("x.dat"), 5_000, 1);
    write_pattern(&tree.join("y.dat"), 7_000, 2);
    let sync = |extra: &[&str]| {
        run(
            sb.client(&a.token)
                .arg("sync")
                .args(extra)
                .arg(&tree)
                .arg(a.remote("/sums/tree")),
            CMD_TIMEOUT,
        )
    };
    let out = sync(&["--digest", "blake3"]);
    assert_ne!(out.code(), Some(0), "{out:?}");
    assert!(out.stderr.contains("sha256"), "{out:?}");
    assert!(!a.root.join("sums/tree/x.dat").exists());
    let out = sync(&[]);
    assert_code(&out, 0);
    assert!(
        out.stderr.contains("syncing with --digest sha256"),
        "{out:?}"
    );
    for f in ["x.dat", "y.dat"] {
        assert_eq!(
            fs::read(a.root.join("sums/tree").join(f)).unwrap(),
            fs::read(tree.join(f)).unwrap()
        );
        assert_eq!(stat(&sb, &a, &format!("/sums/tree/{f}"))["algo"], "sha256");
    }
}

/// A third-party copy into `sums/` that leaves the algorithm to ferry is run again with the
/// policy's sha256 (pushed, the refusal comes through the source's put; pulled, from the
/// destination itself); one with `--checksum blake3` chosen is refused.
#[test]
fn a_cp_into_a_policys_prefix_takes_its_checksum() {
    let sb = Sandbox::new();
    let b = start(&sb, "b", free_port(), &["--third-party"]);
    let config = config_for_a(&sb, b.port, &fingerprint(&b));
    let a = start(
        &sb,
        "a",
        free_port(),
        &["--config", &config, "--third-party"],
    );
    let src = sb.path("f.dat");
    write_pattern(&src, 20_000, 5);
    assert_code(&put(&sb, &b, &src, "/f.dat", &[]), 0);
    let cp = |extra: &[&str], to: &str| {
        run(
            sb.ferry()
                .args(["cp", "--json", "--retry-for", "0"])
                .args(["--source-token", &b.token, "--dest-token", &a.token])
                .args(extra)
                .arg(b.remote("/f.dat"))
                .arg(a.remote(to)),
            CMD_TIMEOUT,
        )
    };
    let out = cp(&["--checksum", "blake3"], "/sums/f.dat");
    assert_ne!(out.code(), Some(0), "{out:?}");
    assert!(
        out.stderr.contains("sha256") && out.stderr.contains("/sums"),
        "{out:?}"
    );
    assert!(!a.root.join("sums/f.dat").exists());
    for (extra, to) in [(&[][..], "/sums/f.dat"), (&["--pull"][..], "/sums/g.dat")] {
        let out = cp(extra, to);
        assert_code(&out, 0);
        assert!(
            out.stderr.contains("copying with --checksum sha256"),
            "{out:?}"
        );
        assert_eq!(stat(&sb, &a, to)["algo"], "sha256", "{to}");
        let name = to.trim_start_matches('/');
        assert_eq!(
            fs::read(a.root.join(name)).unwrap(),
            fs::read(&src).unwrap()
        );
    }
}

/// A policy naming a peer with no `[peers.NAME]` table stops the server at start.
#[test]
fn a_server_with_an_inconsistent_policy_does_not_start() {
    let sb = Sandbox::new();
    let config = sb.path("bad.toml");
    fs::write(
        &config,
        "[[policy]]\nprefix = \"raw\"\nreplicas = 2\nto = [\"nowhere\"]\n",
    )
    .unwrap();
    let root = sb.mkdir("root");
    let out = run(
        sb.serve_cmd(&root, "127.0.0.1:0", Some(&sb.path("token")))
            .arg("--config")
            .arg(&config),
        CMD_TIMEOUT,
    );
    assert_ne!(out.code(), Some(0), "{out:?}");
    assert!(
        out.stderr.contains("nowhere") && out.stderr.contains("[peers.nowhere]"),
        "{out:?}"
    );
}
