//! `ferry get` of a file with two replicas (issue 39): two `serve --third-party` on loopback,
//! the file put on `a` and replicated to `b` by `ferry repl`, each server with a catalog of its
//! own or both on one PostgreSQL catalog. The client's path profiles make `b` the better path:
//! the get takes `b`'s copy; with `b`'s copy corrupted on disk the digest at the end fails and
//! `a` serves; with `b` stopped the connection fails and `a` serves.

use crate::util;

use std::fs;
use std::path::Path;

use serde_json::Value;
use util::*;

/// Servers `a` and `b` on one token (each its own root, state directory and catalog name).
struct Pair {
    sb: Sandbox,
    a: Server,
    b: Server,
}

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

impl Pair {
    /// `a` holds `/data/f.bin` (`len` bytes), replicated to `b` by `ferry repl`.
    fn start(catalog: Option<&str>, len: u64) -> Self {
        Self::start_to(catalog, len, "")
    }

    /// As [`Self::start`], the replica at `to` on `b` (`:/PATH`, its directory made there;
    /// empty: the same path).
    fn start_to(catalog: Option<&str>, len: u64, to: &str) -> Self {
        let sb = Sandbox::new();
        let a = serve(&sb, "a", catalog);
        // The same token on b: the get's one token serves for both hosts.
        fs::write(sb.path("token-b"), &a.token).unwrap();
        let b = serve(&sb, "b", catalog);
        assert_eq!(a.token, b.token);
        let src = sb.path("src/data/f.bin");
        write_pattern(&src, len, 39);
        let out = run(
            sb.client(&a.token)
                .arg("put")
                .arg(sb.path("src/data"))
                .arg(a.remote("/")),
            CMD_TIMEOUT,
        );
        assert_code(&out, 0);
        fs::create_dir_all(b.root.join("data")).unwrap();
        if let Some(parent) = Path::new(to.trim_start_matches(":/")).parent() {
            fs::create_dir_all(b.root.join(parent)).unwrap();
        }
        let out = run(
            sb.ferry()
                .args(["repl", "--json", "--retry-for", "0"])
                .args(["--source-token", &a.token, "--dest-token", &b.token])
                .arg(a.remote("/data/f.bin"))
                .arg("--to")
                .arg(format!("127.0.0.1:{}{}", b.port, to)),
            CMD_TIMEOUT,
        );
        assert_code(&out, 0);
        Self { sb, a, b }
    }

    fn address(s: &Server) -> String {
        format!("127.0.0.1:{}", s.port)
    }

    /// The client's profile says `b`'s path carries `fast` and `a`'s `slow` bytes a second.
    fn measured(&self, slow: u64, fast: u64) {
        let path =
            |rate: u64| serde_json::json!({"rtt_us": 100, "bytes_per_s": rate, "updated": 1});
        let file = serde_json::json!({
            "version": 1,
            "endpoints": {},
            "paths": {
                Self::address(&self.a): path(slow),
                Self::address(&self.b): path(fast),
            },
        });
        fs::create_dir_all(self.sb.state_dir()).unwrap();
        fs::write(
            self.sb.state_dir().join("profiles.json"),
            serde_json::to_vec(&file).unwrap(),
        )
        .unwrap();
    }

    /// `ferry get --json` of a's `/data/f.bin` into `dest` (a new directory), with `extra`.
    fn get(&self, dest: &str, extra: &[&str]) -> Out {
        let dest = self.sb.mkdir(dest);
        run(
            self.sb
                .client(&self.a.token)
                .args([
                    "get",
                    "--json",
                    "--retry-for",
                    "0",
                    "--connect-timeout",
                    "2s",
                ])
                .args(extra)
                .arg(self.a.remote("/data/f.bin"))
                .arg(&dest),
            CMD_TIMEOUT,
        )
    }

    fn original(&self) -> String {
        file_b3(&self.sb.path("src/data/f.bin"))
    }
}

/// Each copy the get looked at: (server, outcome).
fn tried(v: &Value) -> Vec<(String, String)> {
    v["replicas"]["tried"]
        .as_array()
        .expect("replicas.tried is an array")
        .iter()
        .map(|t| {
            (
                t["server"].as_str().unwrap().to_owned(),
                t["outcome"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn why(v: &Value, server: &str) -> String {
    v["replicas"]["tried"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["server"] == server)
        .map(|t| t["why"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default()
}

fn pair(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

/// Each replica of a `stat --json` answer: (server, its path on that server).
fn replica_paths(v: &Value) -> Vec<(String, String)> {
    v["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["server"].as_str().unwrap().to_owned(),
                r["path"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Corrupts `path` behind ferry's back: same size, mtime kept, other bytes.
fn corrupt(path: &Path) {
    let mtime = fs::metadata(path).unwrap().modified().unwrap();
    let mut bytes = fs::read(path).unwrap();
    bytes[1000..1100].fill(0xAA);
    fs::write(path, &bytes).unwrap();
    fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
}

fn best_replica_then_fallbacks(catalog: Option<&str>) {
    let mut p = Pair::start(catalog, 600_000);
    let want = p.original();

    // stat through a shows both replicas, each with the address its server is reached at.
    let out = run(
        p.sb.client(&p.a.token)
            .args(["stat", "--json"])
            .arg(p.a.remote("/data/f.bin")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    let v = one_json(&out.stdout);
    let addresses: Vec<(String, String)> = v["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["server"].as_str().unwrap().to_owned(),
                r["address"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        addresses,
        pair(&[("a", &Pair::address(&p.a)), ("b", &Pair::address(&p.b))])
    );
    // A replica at the same path is at the object's path.
    assert_eq!(
        replica_paths(&v),
        pair(&[("a", "/data/f.bin"), ("b", "/data/f.bin")])
    );

    // b is the better path: it serves.
    p.measured(10_000_000, 900_000_000);
    let out = p.get("got1", &[]);
    assert_code(&out, 0);
    let v = one_json(&out.stdout);
    assert_eq!(tried(&v), pair(&[("b", "served")]), "{out:?}");
    assert_eq!(file_b3(&p.sb.path("got1/f.bin")), want);
    // The other way round, a.
    p.measured(900_000_000, 10_000_000);
    let out = p.get("got2", &[]);
    assert_code(&out, 0);
    assert_eq!(tried(&one_json(&out.stdout)), pair(&[("a", "served")]));
    // Forced: b, whatever the profile says; or only the named server.
    let out = p.get("got3", &["--replica", "b"]);
    assert_code(&out, 0);
    assert_eq!(tried(&one_json(&out.stdout)), pair(&[("b", "served")]));
    assert_eq!(file_b3(&p.sb.path("got3/f.bin")), want);
    let out = p.get("got4", &["--no-replicas"]);
    assert_code(&out, 0);
    assert!(one_json(&out.stdout).get("replicas").is_none(), "{out:?}");
    let out = p.get("got5", &["--replica", "nowhere"]);
    assert_code(&out, 1);
    assert!(out.stderr.contains("no good replica"), "{out:?}");

    // b's copy corrupted on disk: the digest at the end is not the registered one, a serves,
    // and what lands is the registered file.
    p.measured(10_000_000, 900_000_000);
    corrupt(&p.b.root.join("data/f.bin"));
    let out = p.get("got6", &[]);
    assert_code(&out, 0);
    let v = one_json(&out.stdout);
    assert_eq!(
        tried(&v),
        pair(&[("b", "failed"), ("a", "served")]),
        "{out:?}"
    );
    assert!(why(&v, "b").contains("registered"), "{out:?}");
    assert_eq!(file_b3(&p.sb.path("got6/f.bin")), want);
    // Forced to the corrupted copy alone: the get fails and leaves no wrong file.
    let out = p.get("got7", &["--replica", "b"]);
    assert_code(&out, 1);
    assert!(!p.sb.path("got7/f.bin").exists(), "{out:?}");

    // b stopped: it cannot be reached, a serves.
    p.b.signal("KILL");
    p.b.guard.wait_for(std::time::Duration::from_secs(10));
    let out = p.get("got8", &[]);
    assert_code(&out, 0);
    let v = one_json(&out.stdout);
    assert_eq!(
        tried(&v),
        pair(&[("b", "failed"), ("a", "served")]),
        "{out:?}"
    );
    assert_eq!(file_b3(&p.sb.path("got8/f.bin")), want);
}

#[test]
fn get_takes_the_best_replica_and_falls_back_with_a_catalog_each() {
    best_replica_then_fallbacks(None);
}

#[test]
fn get_takes_the_best_replica_and_falls_back_in_a_shared_postgresql_catalog() {
    let Some(cluster) = ferry_netem::needs(
        "ferry_cli::best_replica::get_takes_the_best_replica_and_falls_back_in_a_shared_postgresql_catalog",
        ferry_catalog::TestCluster::start(),
    ) else {
        return;
    };
    best_replica_then_fallbacks(Some(&cluster.database_url()));
    drop(cluster);
}

/// A replica on a host this client has never trusted (no pin, no config entry) is not
/// contacted: the named server serves, and the get says why the other was skipped.
#[test]
fn an_unpinned_replica_host_is_not_contacted() {
    let p = Pair::start(None, 100_000);
    // Forget every pin but a's (the repl pinned both).
    let known = p.sb.xdg_config().join("ferry/known_hosts");
    let kept: Vec<String> = fs::read_to_string(&known)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with(&format!("{} ", Pair::address(&p.a))))
        .map(str::to_owned)
        .collect();
    assert_eq!(kept.len(), 1);
    fs::write(&known, kept.join("\n") + "\n").unwrap();
    p.measured(10_000_000, 900_000_000);
    let out = p.get("got", &[]);
    assert_code(&out, 0);
    let v = one_json(&out.stdout);
    assert_eq!(
        tried(&v),
        pair(&[("b", "skipped"), ("a", "served")]),
        "{out:?}"
    );
    assert!(why(&v, "b").contains("known hosts"), "{out:?}");
    // Still unpinned: nothing was recorded for b.
    assert!(!fs::read_to_string(&known)
        .unwrap()
        .contains(&format!("{} ", Pair::address(&p.b))));
}

/// `repl` to another path and name on `b` (catalogs of their own): `a`'s catalog records the
/// copy with its own path there and `stat` shows it; with `a`'s copy bad, a get of `a`'s path
/// fetches `b`'s copy at its path (byte-identical, under the name asked for), and
/// `verify --repair --from b` restores `a`'s copy from there.
#[test]
fn a_replica_at_another_path_is_fetched_and_repaired_from_there() {
    let p = Pair::start_to(None, 300_000, ":/elsewhere/g.bin");
    let want = p.original();
    assert_eq!(file_b3(&p.b.root.join("elsewhere/g.bin")), want);
    let stat = |human: bool| {
        let mut cmd = p.sb.client(&p.a.token);
        cmd.arg("stat");
        if !human {
            cmd.arg("--json");
        }
        let out = run(cmd.arg(p.a.remote("/data/f.bin")), CMD_TIMEOUT);
        assert_code(&out, 0);
        out.stdout
    };
    assert_eq!(
        replica_paths(&one_json(&stat(false))),
        pair(&[("a", "/data/f.bin"), ("b", "/elsewhere/g.bin")])
    );
    assert!(stat(true).contains("good") && stat(true).contains(" as /elsewhere/g.bin"));

    // a's copy corrupted and a measured faster: a's digest fails, b serves at its own path.
    p.measured(900_000_000, 10_000_000);
    let bad = p.a.root.join("data/f.bin");
    corrupt(&bad);
    let out = p.get("got", &[]);
    assert_code(&out, 0);
    let v = one_json(&out.stdout);
    assert_eq!(
        tried(&v),
        pair(&[("a", "failed"), ("b", "served")]),
        "{out:?}"
    );
    let served = &v["replicas"]["tried"][1];
    assert_eq!(served["path"], "/elsewhere/g.bin", "{out:?}");
    assert_eq!(file_b3(&p.sb.path("got/f.bin")), want);
    assert!(!p.sb.path("got/g.bin").exists());

    // The repair takes b's copy where it is.
    let out = run(
        p.sb.client(&p.a.token)
            .args(["verify", "--json", "--retry-for", "0", "--repair"])
            .args(["--from", &Pair::address(&p.b), "--from-token", &p.b.token])
            .arg(p.a.remote("/data/f.bin")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    let v = one_json(&out.stdout);
    assert_eq!(v["repaired"][0]["path"], "/data/f.bin", "{out:?}");
    assert_eq!(file_b3(&bad), want);
}
