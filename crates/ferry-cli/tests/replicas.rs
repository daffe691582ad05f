//! `ferry repl` and `ferry verify --repair` between two `serve --third-party` on loopback
//! (issue 39): each with a catalog of its own (SQLite in its state directory) or both on one
//! PostgreSQL catalog. A repl leaves byte-identical copies that `stat` shows as good replicas;
//! a replica corrupted behind ferry's back is found bad by verify and restored by a repair.

use crate::util;

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;
use util::*;

/// Two servers `a` and `b`, each with its own root, state directory and token.
struct Zone {
    sb: Sandbox,
    a: Server,
    b: Server,
}

impl Zone {
    /// `catalog`: a PostgreSQL location both share, or `None` for a SQLite catalog each.
    fn start(catalog: Option<&str>) -> Self {
        let sb = Sandbox::new();
        let a = serve(&sb, "a", catalog);
        let b = serve(&sb, "b", catalog);
        Self { sb, a, b }
    }

    fn root(&self, side: &str) -> PathBuf {
        self.server(side).root.clone()
    }

    fn server(&self, side: &str) -> &Server {
        match side {
            "a" => &self.a,
            _ => &self.b,
        }
    }

    /// Puts the local `src` into `dir` on `a`.
    fn put_a(&self, src: &Path, dir: &str) {
        let out = run(
            self.sb
                .client(&self.a.token)
                .arg("put")
                .arg(src)
                .arg(self.a.remote(dir)),
            CMD_TIMEOUT,
        );
        assert_code(&out, 0);
    }

    /// `ferry repl --json SRC --to b` (a's path on b), as a's and b's tokens allow.
    fn repl(&self, path: &str, extra: &[&str]) -> Out {
        run(
            self.sb
                .ferry()
                .args(["repl", "--json", "--retry-for", "0"])
                .args(["--source-token", &self.a.token])
                .args(["--dest-token", &self.b.token])
                .args(extra)
                .arg(self.a.remote(path))
                .arg("--to")
                .arg(format!("127.0.0.1:{}", self.b.port)),
            CMD_TIMEOUT,
        )
    }

    /// `ferry stat --json` of `path` through `side`.
    fn stat(&self, side: &str, path: &str) -> Value {
        let s = self.server(side);
        let out = run(
            self.sb
                .client(&s.token)
                .args(["stat", "--json"])
                .arg(s.remote(path)),
            CMD_TIMEOUT,
        );
        assert_code(&out, 0);
        one_json(&out.stdout)
    }

    /// `ferry verify --json` of `path` on `side`, with `extra` (a repair from the other).
    fn verify(&self, side: &str, path: &str, extra: &[String]) -> Out {
        let s = self.server(side);
        run(
            self.sb
                .client(&s.token)
                .args(["verify", "--json", "--retry-for", "0"])
                .args(extra)
                .arg(s.remote(path)),
            CMD_TIMEOUT,
        )
    }

    /// `--repair --from` the other server, with its token.
    fn repair_from(&self, side: &str) -> Vec<String> {
        let s = self.server(side);
        vec![
            "--repair".into(),
            "--from".into(),
            format!("127.0.0.1:{}", s.port),
            "--from-token".into(),
            s.token.clone(),
        ]
    }
}

/// `ferry serve --third-party` named `name` in the catalog (its own, or `catalog`).
fn serve(sb: &Sandbox, name: &str, catalog: Option<&str>) -> Server {
    let root = sb.mkdir(name);
    let state = sb.mkdir(&format!("state-{name}"));
    let mut extra = vec!["--third-party", "--catalog-name", name];
    if let Some(c) = catalog {
        extra.extend(["--catalog", c]);
    }
    Server::start_with(
        sb,
        &root,
        Some(&sb.path(&format!("token-{name}"))),
        &extra,
        |c| {
            c.env("FERRY_STATE_DIR", &state);
        },
    )
}

/// The replicas of a `stat --json` answer: (server, state, physical), by server.
fn replicas(v: &Value) -> Vec<(String, String, String)> {
    v["replicas"]
        .as_array()
        .expect("replicas is an array")
        .iter()
        .map(|r| {
            (
                r["server"].as_str().unwrap().to_owned(),
                r["state"].as_str().unwrap().to_owned(),
                r["physical"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn both_good(z: &Zone, path: &str) -> Vec<(String, String, String)> {
    let physical = |side: &str| {
        z.root(side)
            .join(path.trim_start_matches('/'))
            .to_string_lossy()
            .into_owned()
    };
    vec![
        ("a".to_owned(), "good".to_owned(), physical("a")),
        ("b".to_owned(), "good".to_owned(), physical("b")),
    ]
}

/// A file and a tree replicated from a to b: identical bytes, and `stat` through a (and
/// through b, when the catalog is shared) shows both replicas good.
fn repl_of_a_file_and_a_tree(catalog: Option<&str>) {
    let z = Zone::start(catalog);
    let shared = catalog.is_some();
    let data = z.sb.path("src/data");
    write_pattern(&data.join("f.bin"), 300_000, 1);
    for (i, p) in ["run/x.dat", "run/y.dat", "run/sub/z.dat"]
        .iter()
        .enumerate()
    {
        write_pattern(&data.join(p), 5_000 + i as u64 * 777, i as u64 + 2);
    }
    z.put_a(&data, "/");
    fs::create_dir_all(z.root("b").join("data")).unwrap();

    let out = z.repl("/data/f.bin", &[]);
    assert_code(&out, 0);
    let v = one_json(&out.stdout);
    assert_eq!(u64_field(&v["copy"], "files"), 1, "{out:?}");
    assert_eq!(v["shared_catalog"], shared, "{out:?}");
    assert_eq!(u64_field(&v, "recorded"), u64::from(!shared), "{out:?}");
    assert_eq!(
        file_b3(&z.root("b").join("data/f.bin")),
        file_b3(&data.join("f.bin"))
    );
    let a = z.stat("a", "/data/f.bin");
    assert_eq!(replicas(&a), both_good(&z, "/data/f.bin"));
    assert_eq!(a["digest"].as_str().unwrap(), file_b3(&data.join("f.bin")));
    // Each catalog knows both copies: the shared one by the registration, separate ones by
    // the records repl left in each.
    assert_eq!(replicas(&z.stat("b", "/data/f.bin")), replicas(&a));

    // Without -r a directory is refused, saying why; with it, the tree.
    let out = z.repl("/data/run", &[]);
    assert_code(&out, 1);
    assert!(out.stderr.contains("needs -r"), "{out:?}");
    let out = z.repl("/data/run", &["-r"]);
    assert_code(&out, 0);
    let v = one_json(&out.stdout);
    assert_eq!(u64_field(&v["copy"], "files"), 3, "{out:?}");
    assert_eq!(
        u64_field(&v, "recorded"),
        if shared { 0 } else { 3 },
        "{out:?}"
    );
    assert_eq!(
        tree_digest(&z.root("b").join("data/run")),
        tree_digest(&data.join("run"))
    );
    for p in ["/data/run/x.dat", "/data/run/sub/z.dat"] {
        for side in ["a", "b"] {
            assert_eq!(replicas(&z.stat(side, p)), both_good(&z, p), "{side} {p}");
        }
    }
    // Again: nothing differs, and the replicas stay as they are.
    let out = z.repl("/data/run", &["-r"]);
    assert_code(&out, 0);
    assert_eq!(
        replicas(&z.stat("a", "/data/run/y.dat")),
        both_good(&z, "/data/run/y.dat")
    );
    drop(z);
}

#[test]
fn repl_of_a_file_and_a_tree_with_a_catalog_each() {
    repl_of_a_file_and_a_tree(None);
}

#[test]
fn repl_of_a_file_and_a_tree_in_a_shared_postgresql_catalog() {
    let Some(cluster) = ferry_netem::needs(
        "ferry_cli::replicas::repl_of_a_file_and_a_tree_in_a_shared_postgresql_catalog",
        ferry_catalog::TestCluster::start(),
    ) else {
        return;
    };
    repl_of_a_file_and_a_tree(Some(&cluster.database_url()));
    drop(cluster);
}

/// b's replica corrupted behind ferry's back: verify marks it bad, verify --repair copies a's
/// good one over it, verifies it and marks it good; a file only b holds cannot be repaired.
fn repair_of_a_corrupted_replica(catalog: Option<&str>) {
    let z = Zone::start(catalog);
    let src = z.sb.path("src/keep.bin");
    write_pattern(&src, 400_000, 7);
    z.put_a(&src, "/");
    let out = z.repl("/keep.bin", &[]);
    assert_code(&out, 0);
    let copy = z.root("b").join("keep.bin");
    // Same size, other bytes, the mtime kept: only a re-hash finds it.
    let mtime = fs::metadata(&copy).unwrap().modified().unwrap();
    let mut bytes = fs::read(&copy).unwrap();
    bytes[1000..1100].fill(0xAA);
    fs::write(&copy, &bytes).unwrap();
    fs::File::options()
        .write(true)
        .open(&copy)
        .unwrap()
        .set_modified(mtime)
        .unwrap();

    let out = z.verify("b", "/keep.bin", &[]);
    assert_code(&out, 1);
    assert_eq!(u64_field(&one_json(&out.stdout), "bad"), 1, "{out:?}");
    let states = |side: &str| -> Vec<String> {
        replicas(&z.stat(side, "/keep.bin"))
            .into_iter()
            .map(|r| format!("{} {}", r.0, r.1))
            .collect()
    };
    assert_eq!(states("b"), ["a good", "b bad"]);

    let out = z.verify("b", "/keep.bin", &z.repair_from("a"));
    assert_code(&out, 0);
    let v = one_json(&out.stdout);
    assert_eq!(v["repaired"][0]["path"], "/keep.bin", "{out:?}");
    assert_eq!(v["unrepaired"].as_array().unwrap().len(), 0, "{out:?}");
    assert_eq!(file_b3(&copy), file_b3(&src));
    assert_eq!(states("b"), ["a good", "b good"]);
    let out = z.verify("b", "/keep.bin", &[]);
    assert_code(&out, 0);

    // A file b alone holds, corrupted: no good replica anywhere, a clear error and exit 1.
    let only = z.root("b").join("only.bin");
    let src2 = z.sb.path("src/only.bin");
    write_pattern(&src2, 10_000, 9);
    let out = run(
        z.sb.client(&z.b.token)
            .arg("put")
            .arg(&src2)
            .arg(z.b.remote("/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    fs::write(&only, vec![0u8; 10_000]).unwrap();
    let out = z.verify("b", "/only.bin", &z.repair_from("a"));
    assert_code(&out, 1);
    let v = one_json(&out.stdout);
    assert_eq!(v["unrepaired"][0]["path"], "/only.bin", "{out:?}");
    assert!(
        v["unrepaired"][0]["why"]
            .as_str()
            .unwrap()
            .contains("no good replica"),
        "{out:?}"
    );
    assert!(!out.stderr.contains("panicked"), "{out:?}");
    drop(z);
}

#[test]
fn verify_repair_restores_a_corrupted_replica_with_a_catalog_each() {
    repair_of_a_corrupted_replica(None);
}

#[test]
fn verify_repair_restores_a_corrupted_replica_in_a_shared_postgresql_catalog() {
    let Some(cluster) = ferry_netem::needs(
        "ferry_cli::replicas::verify_repair_restores_a_corrupted_replica_in_a_shared_postgresql_catalog",
        ferry_catalog::TestCluster::start(),
    ) else {
        return;
    };
    repair_of_a_corrupted_replica(Some(&cluster.database_url()));
    drop(cluster);
}

/// A token that may only read at the destination is refused the repl, and nothing lands.
#[test]
fn repl_needs_write_at_the_destination() {
    let z = Zone::start(None);
    let src = z.sb.path("src/r.bin");
    write_pattern(&src, 20_000, 3);
    z.put_a(&src, "/");
    let tokens = z.sb.path("tokens-c");
    let out = run(
        z.sb.ferry()
            .args([
                "token",
                "add",
                "reader",
                "--read",
                "/",
                "--read-only",
                "--tokens",
            ])
            .arg(&tokens),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    let reader = out.stdout.trim().to_owned();
    let root_c = z.sb.mkdir("c");
    let c = Server::start_with(
        &z.sb,
        &root_c,
        None,
        &[
            "--third-party",
            "--catalog-name",
            "c",
            "--tokens",
            tokens.to_str().unwrap(),
        ],
        |cmd| {
            cmd.env("FERRY_STATE_DIR", z.sb.mkdir("state-c"));
        },
    );
    let out = run(
        z.sb.ferry()
            .args(["repl", "--retry-for", "0"])
            .args(["--source-token", &z.a.token, "--dest-token", &reader])
            .arg(z.a.remote("/r.bin"))
            .arg("--to")
            .arg(format!("127.0.0.1:{}", c.port)),
        CMD_TIMEOUT,
    );
    assert_code(&out, 1);
    assert!(out.stderr.contains("permission denied"), "{out:?}");
    assert!(names(&root_c).is_empty(), "{out:?}");
    assert_eq!(replicas(&z.stat("a", "/r.bin")).len(), 1);
}
