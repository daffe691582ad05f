//! The catalog commands through the real binary against a real `ferry serve` (its catalog on
//! by default): stat, meta, find, mv, mkdir, rm and verify, each with --json and as a human
//! reads it, and their exit codes (0 done, 1 refused by the server or, for verify, a problem
//! found, 2 a usage error).

use crate::util;

use std::fs;

use serde_json::Value;
use util::*;

struct Bed {
    sb: Sandbox,
    server: Server,
}

impl Bed {
    /// A server with `run/a.h5` (3000 bytes), `run/b.txt` and `run/sub/c.h5` (50,000) put.
    fn new() -> Self {
        let sb = Sandbox::new();
        let root = sb.mkdir("root");
        let src = sb.path("src/run");
        write_pattern(&src.join("a.h5"), 3000, 1);
        write_pattern(&src.join("b.txt"), 10, 2);
        write_pattern(&src.join("sub/c.h5"), 50_000, 3);
        let server = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
        let bed = Self { sb, server };
        let out = bed.ferry(
            &["put"],
            &[&src.display().to_string(), &bed.remote("/data/")],
        );
        assert_code(&out, 0);
        bed
    }

    fn remote(&self, path: &str) -> String {
        self.server.remote(path)
    }

    /// `ferry ARGS... REST...` as the server's token.
    fn ferry(&self, args: &[&str], rest: &[&str]) -> Out {
        run(
            self.sb.client(&self.server.token).args(args).args(rest),
            CMD_TIMEOUT,
        )
    }

    /// `ferry ARGS... --json REMOTE(path) REST...`, exit code 0, its one JSON document.
    fn json(&self, args: &[&str], path: &str, rest: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        let remote = self.remote(path);
        let mut tail = vec![remote.as_str()];
        tail.extend_from_slice(rest);
        let out = self.ferry(&all, &tail);
        assert_code(&out, 0);
        one_json(&out.stdout)
    }
}

fn paths_of(v: &Value) -> Vec<String> {
    v["objects"]
        .as_array()
        .expect("objects is an array")
        .iter()
        .map(|o| o["path"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn stat_meta_and_find_with_json_and_without() {
    let bed = Bed::new();
    let v = bed.json(&["stat"], "/data/run/a.h5", &[]);
    assert_eq!(v["path"], "/data/run/a.h5");
    assert_eq!(u64_field(&v, "size"), 3000);
    assert_eq!(v["algo"], "blake3");
    assert_eq!(
        v["digest"].as_str().unwrap(),
        file_b3(&bed.sb.path("src/run/a.h5"))
    );
    assert!(v["stored_by"].is_string());
    assert!(u64_field(&v, "stored_at_ns") > 0);
    let replicas = v["replicas"].as_array().unwrap();
    assert_eq!(replicas.len(), 1);
    assert_eq!(replicas[0]["state"], "good");
    assert_eq!(v["metadata"], Value::Array(Vec::new()));

    let v = bed.json(&["meta", "set"], "/data/run/a.h5", &["temp", "42.5", "K"]);
    assert_eq!(v["set"]["attr"], "temp");
    bed.json(&["meta", "set"], "/data/run/sub/c.h5", &["temp", "12"]);
    let v = bed.json(&["meta", "ls"], "/data/run/a.h5", &[]);
    assert_eq!(
        v,
        serde_json::json!([{"attr": "temp", "value": "42.5", "unit": "K"}])
    );
    let out = bed.ferry(&["meta", "ls"], &[&bed.remote("/data/run/a.h5")]);
    assert_code(&out, 0);
    assert_eq!(out.stdout.trim(), "temp = 42.5 K");
    let out = bed.ferry(&["stat"], &[&bed.remote("/data/run/a.h5")]);
    assert_code(&out, 0);
    assert!(out.stdout.contains("size:      3000"), "{}", out.stdout);
    assert!(out.stdout.contains("temp = 42.5 K"), "{}", out.stdout);

    // find: by metadata, name, size, date; capped with a marker.
    let v = bed.json(&["find", "--meta", "temp>40"], "/data", &[]);
    assert_eq!(paths_of(&v), ["/data/run/a.h5"]);
    assert_eq!(v["more"], false);
    let v = bed.json(&["find", "--meta", "temp=12"], "/data", &[]);
    assert_eq!(paths_of(&v), ["/data/run/sub/c.h5"]);
    let v = bed.json(&["find", "--name", "*.h5", "--larger", "10K"], "/data", &[]);
    assert_eq!(paths_of(&v), ["/data/run/sub/c.h5"]);
    let v = bed.json(&["find", "--newer", "2200-01-01"], "/", &[]);
    assert!(paths_of(&v).is_empty());
    let v = bed.json(&["find", "--newer", "1970-01-02"], "/", &[]);
    assert_eq!(paths_of(&v).len(), 3);
    let v = bed.json(&["find", "--limit", "2"], "/data", &[]);
    assert_eq!(paths_of(&v).len(), 2);
    assert_eq!(v["more"], true);
    let out = bed.ferry(&["find", "--limit", "2"], &[&bed.remote("/data")]);
    assert_code(&out, 0);
    assert_eq!(out.stdout.lines().count(), 2, "{}", out.stdout);
    assert!(out.stderr.contains("more"), "{}", out.stderr);
    let out = bed.ferry(&["find", "--name", "*.txt"], &[&bed.remote("/data")]);
    assert_eq!(out.stdout.trim(), "/data/run/b.txt");

    let v = bed.json(&["meta", "rm"], "/data/run/a.h5", &["temp"]);
    assert_eq!(u64_field(&v, "objects"), 1);
    let v = bed.json(&["find", "--meta", "temp>40"], "/data", &[]);
    assert!(paths_of(&v).is_empty());

    // Refusals: not registered (1), bad arguments (2), each as JSON too.
    let out = bed.ferry(&["stat", "--json"], &[&bed.remote("/data/run/none")]);
    assert_code(&out, 1);
    let v = one_json(&out.stdout);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not in the catalog"));
    for bad in [
        vec!["find", "--meta", "temp>warm"],
        vec!["find", "--newer", "yesterday"],
        vec!["find", "--limit", "0"],
    ] {
        let out = bed.ferry(&bad, &[&bed.remote("/data")]);
        assert_code(&out, 2);
    }
    let out = bed.ferry(&["stat"], &["not-a-remote"]);
    assert_code(&out, 2);
}

/// Every JSON document on stdout, in order.
fn all_json(stdout: &str) -> Vec<Value> {
    serde_json::Deserializer::from_str(stdout)
        .into_iter::<Value>()
        .map(|v| v.unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {stdout:?}")))
        .collect()
}

#[test]
fn stat_and_meta_ls_of_several_files_answer_each_in_turn() {
    let bed = Bed::new();
    bed.json(&["meta", "set"], "/data/run/a.h5", &["temp", "42.5", "K"]);
    // The others as a bare /PATH or the server named again; one object a file, in order.
    let a = bed.remote("/data/run/a.h5");
    let c = bed.remote("/data/run/sub/c.h5");
    let out = bed.ferry(&["stat", "--json"], &[&a, "/data/run/b.txt", &c]);
    assert_code(&out, 0);
    let all = all_json(&out.stdout);
    let paths: Vec<&str> = all.iter().map(|v| v["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        ["/data/run/a.h5", "/data/run/b.txt", "/data/run/sub/c.h5"]
    );
    assert_eq!(u64_field(&all[2], "size"), 50_000);
    assert_eq!(all[0]["metadata"][0]["attr"], "temp");
    // A refused path is said in its place (and on stderr); the others are answered; exit 1.
    let out = bed.ferry(&["stat", "--json"], &[&a, "/data/run/none", &c]);
    assert_code(&out, 1);
    let all = all_json(&out.stdout);
    assert_eq!(all.len(), 3, "{}", out.stdout);
    assert_eq!(all[1]["path"], "/data/run/none");
    assert!(all[1]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not in the catalog"));
    assert_eq!(all[2]["path"], "/data/run/sub/c.h5");
    assert!(out.stderr.contains("/data/run/none"), "{}", out.stderr);
    // As a person reads it: each stat in turn.
    let out = bed.ferry(&["stat"], &[&a, "/data/run/b.txt"]);
    assert_code(&out, 0);
    assert_eq!(out.stdout.matches("path:").count(), 2, "{}", out.stdout);
    // meta ls of several: each under its path.
    let out = bed.ferry(&["meta", "ls", "--json"], &[&a, "/data/run/b.txt"]);
    assert_code(&out, 0);
    assert_eq!(
        all_json(&out.stdout),
        [
            serde_json::json!({"path": "/data/run/a.h5",
                "meta": [{"attr": "temp", "value": "42.5", "unit": "K"}]}),
            serde_json::json!({"path": "/data/run/b.txt", "meta": []}),
        ]
    );
    let out = bed.ferry(&["meta", "ls"], &[&a, "/data/run/b.txt"]);
    assert_code(&out, 0);
    assert_eq!(
        out.stdout.trim(),
        "/data/run/a.h5:\ntemp = 42.5 K\n\n/data/run/b.txt:"
    );
    // Another server in the same command is a usage error.
    let out = bed.ferry(&["stat"], &[&a, "127.0.0.1:1:/x"]);
    assert_code(&out, 2);
}

#[test]
fn mv_mkdir_and_rm_keep_files_and_catalog_in_step() {
    let bed = Bed::new();
    let root = bed.server.root.clone();
    let v = bed.json(&["mkdir", "-p"], "/archive/2026", &[]);
    assert_eq!(v["made"], "/archive/2026");
    assert!(root.join("archive/2026").is_dir());
    let out = bed.ferry(&["mkdir"], &[&bed.remote("/archive/2026")]);
    assert_code(&out, 1);

    // A tree moved into a directory (the destination named as a bare path).
    let v = bed.json(&["mv"], "/data/run", &["/archive/2026"]);
    assert_eq!(u64_field(&v, "objects"), 3);
    assert!(root.join("archive/2026/run/sub/c.h5").is_file());
    assert!(!root.join("data/run").exists());
    let v = bed.json(&["stat"], "/archive/2026/run/a.h5", &[]);
    assert_eq!(u64_field(&v, "size"), 3000);
    // One file renamed, the destination named as a remote of the same server.
    let to = bed.remote("/archive/a-renamed.h5");
    let v = bed.json(&["mv"], "/archive/2026/run/a.h5", &[&to]);
    assert_eq!(u64_field(&v, "objects"), 1);
    bed.json(&["stat"], "/archive/a-renamed.h5", &[]);
    // Another server's path: a usage error.
    let out = bed.ferry(
        &["mv"],
        &[&bed.remote("/archive/a-renamed.h5"), "127.0.0.1:1:/x"],
    );
    assert_code(&out, 2);

    // rm: a directory needs -r; with it the tree and its catalog entries go.
    let out = bed.ferry(&["rm"], &[&bed.remote("/archive/2026")]);
    assert_code(&out, 1);
    assert!(out.stderr.contains("rm -r"), "{}", out.stderr);
    let v = bed.json(&["rm", "-r"], "/archive/2026", &[]);
    assert_eq!(u64_field(&v, "objects"), 2);
    assert!(!root.join("archive/2026").exists());
    let v = bed.json(&["find"], "/", &[]);
    assert_eq!(paths_of(&v), ["/archive/a-renamed.h5"]);
    let out = bed.ferry(&["rm"], &[&bed.remote("/archive/a-renamed.h5")]);
    assert_code(&out, 0);
    assert!(out.stdout.contains("removed"), "{}", out.stdout);
    assert!(fs::read_dir(root.join("archive")).unwrap().next().is_none());
    let out = bed.ferry(&["rm", "--json"], &[&bed.remote("/archive/a-renamed.h5")]);
    assert_code(&out, 1);
    one_json(&out.stdout);
}

/// Flips two bytes of a file, keeping its size and mtime: what only a re-hash can see.
fn flip(path: &std::path::Path) {
    let mtime = fs::metadata(path).unwrap().modified().unwrap();
    let mut data = fs::read(path).unwrap();
    data[10] ^= 0xFF;
    data[11] ^= 0x01;
    fs::write(path, &data).unwrap();
    let f = fs::File::options().write(true).open(path).unwrap();
    f.set_modified(mtime).unwrap();
}

#[test]
fn verify_reports_problems_with_its_exit_code() {
    let bed = Bed::new();
    let v = bed.json(&["verify", "-r"], "/data", &[]);
    assert_eq!(u64_field(&v, "checked"), 3);
    assert_eq!(u64_field(&v, "good"), 3);
    assert_eq!(u64_field(&v, "bytes"), 53_010);
    assert_eq!(v["problems"].as_array().unwrap().len(), 0);
    assert_eq!(v["more"], false);

    let root = bed.server.root.clone();
    flip(&root.join("data/run/a.h5"));
    write_pattern(&root.join("data/run/sub/extra.h5"), 100, 9);
    // Without -r: the changed file, not the new one.
    let out = bed.ferry(&["verify"], &[&bed.remote("/data")]);
    assert_code(&out, 1);
    assert!(
        out.stdout
            .starts_with("3 checked: 2 good, 1 bad, 0 missing, 0 unregistered;"),
        "{out:?}"
    );
    assert!(out.stdout.contains("bad\t/data/run/a.h5\n"), "{out:?}");
    assert!(!out.stdout.contains("extra.h5"), "{out:?}");
    let s = bed.json(&["stat"], "/data/run/a.h5", &[]);
    assert_eq!(s["replicas"][0]["state"], "bad");
    // With -r and --json: the new file too.
    let out = bed.ferry(&["verify", "-r", "--json"], &[&bed.remote("/data")]);
    assert_code(&out, 1);
    let v = one_json(&out.stdout);
    assert_eq!(u64_field(&v, "bad"), 1);
    assert_eq!(u64_field(&v, "unregistered"), 1);
    let problems = v["problems"].as_array().unwrap();
    assert_eq!(problems[0]["problem"], "bad");
    assert_eq!(problems[0]["path"], "/data/run/a.h5");
    assert_eq!(problems[1]["problem"], "unregistered");
    assert_eq!(problems[1]["path"], "/data/run/sub/extra.h5");
    // A missing file, and usage errors.
    fs::remove_file(root.join("data/run/b.txt")).unwrap();
    let out = bed.ferry(&["verify"], &[&bed.remote("/data/run/b.txt")]);
    assert_code(&out, 1);
    assert!(out.stdout.contains("missing\t/data/run/b.txt"), "{out:?}");
    assert_code(&bed.ferry(&["verify"], &[]), 2);
    assert_code(&bed.ferry(&["verify"], &["not-a-remote"]), 2);
}

/// A reader that goes away (`ferry find ... | head -0`) ends the command quietly with 0, for
/// every command that prints data, not with a panic on the broken pipe.
#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    let bed = Bed::new();
    for args in [
        vec!["find", "--name", "*"],
        vec!["stat"],
        vec!["ls"],
        vec!["verify", "-r"],
    ] {
        let path = if args[0] == "stat" {
            "/data/run/a.h5"
        } else {
            "/data"
        };
        let mut child = bed
            .sb
            .client(&bed.server.token)
            .args(&args)
            .arg(bed.remote(path))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Closed before the command has reached the server, so its first line meets no reader.
        drop(child.stdout.take());
        let mut err = child.stderr.take().unwrap();
        let mut guard = ChildGuard(Some(child));
        let status = guard
            .wait_for(CMD_TIMEOUT)
            .expect("the command ends on its own");
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut err, &mut stderr).unwrap();
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(status.code(), Some(0), "{args:?}: {stderr}");
    }
}
