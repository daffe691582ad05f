//! Two `ferry serve` on loopback sharing one PostgreSQL catalog (issue 39): a put to each,
//! then `ferry stat` through either server knows every file and every replica, each replica
//! named by the server that holds it.

use crate::util;

use serde_json::Value;
use util::*;

/// One of the two servers, with its own sandbox (state, token, known hosts).
struct Site {
    sb: Sandbox,
    server: Server,
}

impl Site {
    fn start(catalog: &str, name: &str) -> Self {
        let sb = Sandbox::new();
        let root = sb.mkdir("root");
        let server = Server::start(
            &sb,
            &root,
            Some(&sb.path("token")),
            &["--catalog", catalog, "--catalog-name", name],
        );
        Self { sb, server }
    }

    /// Puts a file of `len` bytes as `/NAME`.
    fn put(&self, name: &str, len: u64, seed: u64) {
        let src = self.sb.path(&format!("src/{name}"));
        write_pattern(&src, len, seed);
        let out = run(
            self.sb
                .client(&self.server.token)
                .arg("put")
                .arg(&src)
                .arg(self.server.remote("/")),
            CMD_TIMEOUT,
        );
        assert_code(&out, 0);
    }

    /// `ferry stat --json` of `path` through this server.
    fn stat(&self, path: &str) -> Value {
        let out = run(
            self.sb
                .client(&self.server.token)
                .args(["stat", "--json"])
                .arg(self.server.remote(path)),
            CMD_TIMEOUT,
        );
        assert_code(&out, 0);
        one_json(&out.stdout)
    }
}

/// The replicas of a `stat --json` answer: (server, state).
fn replicas(v: &Value) -> Vec<(String, String)> {
    v["replicas"]
        .as_array()
        .expect("replicas is an array")
        .iter()
        .map(|r| {
            (
                r["server"].as_str().unwrap().to_owned(),
                r["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn two_servers_share_one_postgresql_catalog() {
    let Some(cluster) = ferry_netem::needs(
        "ferry_cli::shared_catalog::two_servers_share_one_postgresql_catalog",
        ferry_catalog::TestCluster::start(),
    ) else {
        return;
    };
    let catalog = cluster.database_url();
    let one = Site::start(&catalog, "one");
    let two = Site::start(&catalog, "two");
    assert!(
        one.server
            .stderr()
            .contains("shared; this server's replicas are \"one\""),
        "{}",
        one.server.stderr()
    );
    one.put("a.txt", 1000, 1);
    two.put("b.txt", 2000, 2);
    one.put("f.txt", 3000, 3);
    two.put("f.txt", 3000, 3);
    for site in [&one, &two] {
        let a = site.stat("/a.txt");
        assert_eq!(u64_field(&a, "size"), 1000);
        assert_eq!(replicas(&a), [("one".to_owned(), "good".to_owned())]);
        let b = site.stat("/b.txt");
        assert_eq!(u64_field(&b, "size"), 2000);
        assert_eq!(
            b["digest"].as_str().unwrap(),
            file_b3(&two.sb.path("src/b.txt"))
        );
        assert_eq!(replicas(&b), [("two".to_owned(), "good".to_owned())]);
        // Stored on both: the later copy is the good one until the other is replicated anew.
        assert_eq!(
            replicas(&site.stat("/f.txt")),
            [
                ("one".to_owned(), "stale".to_owned()),
                ("two".to_owned(), "good".to_owned())
            ]
        );
    }
    // The log names the catalog (this location has no password to hide).
    assert!(one.server.stderr().contains("ferry: catalog host="));
    // The servers stop before the cluster does.
    drop((one, two));
}

/// A PostgreSQL catalog that cannot be reached stops the server at start with the reason, and
/// without the location's password.
#[test]
fn an_unreachable_catalog_is_a_clear_error_at_start() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let catalog = format!("postgres://ferry:s3cret@127.0.0.1:{}/ferry", free_port());
    let out = run(
        sb.serve_cmd(&root, "127.0.0.1:0", Some(&sb.path("token")))
            .args(["--catalog", &catalog]),
        CMD_TIMEOUT,
    );
    assert_ne!(out.code(), Some(0), "{out:?}");
    assert!(!out.stderr.contains("panicked"), "{out:?}");
    assert!(
        out.stderr
            .contains("cannot connect to the catalog postgres://ferry:***@127.0.0.1:"),
        "{out:?}"
    );
    assert!(!out.stderr.contains("s3cret"), "{out:?}");
}

/// Files stored under final names in the directories of `dir` (`dNN/fNNNN`), partial files
/// left out: cheap enough to poll while a put runs.
fn stored_under(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for d in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(d.path()).into_iter().flatten().flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            if !name.starts_with(".ferry-") {
                out.push(format!("{}/{name}", d.file_name().to_string_lossy()));
            }
        }
    }
    out
}

/// A server on PostgreSQL killed (SIGKILL) in the middle of a put: its intents were in the
/// intents file of its state directory, never in the database, and at its next start every
/// file stored under a final name is registered with its size, none that is not, and the file
/// holds no intent any more.
#[test]
fn a_server_on_postgresql_killed_mid_put_registers_its_local_intents_at_the_next_start() {
    const FILES: usize = 2000;
    let Some(cluster) = ferry_netem::needs(
        "ferry_cli::shared_catalog::a_server_on_postgresql_killed_mid_put_registers_its_local_intents_at_the_next_start",
        ferry_catalog::TestCluster::start(),
    ) else {
        return;
    };
    let url = cluster.database_url();
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    for i in 0..FILES {
        write_pattern(
            &sb.path(&format!("src/tree/d{:02}/f{i:04}", i % 20)),
            2048,
            i as u64,
        );
    }
    let args = ["--catalog", url.as_str(), "--catalog-name", "one"];
    let server = Server::start(&sb, &root, Some(&sb.path("token")), &args);
    let mut put = ChildGuard(Some(
        sb.client(&server.token)
            .arg("put")
            .arg("--quiet")
            .arg(sb.path("src/tree"))
            .arg(server.remote("/in/"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    ));
    let tree = root.join("in/tree");
    assert!(
        wait_until(std::time::Duration::from_secs(30), || stored_under(&tree)
            .len()
            >= FILES / 10),
        "the put gets under way"
    );
    server.signal("KILL");
    // The client would retry a while against a server that is gone: its outcome is not this
    // test's business.
    let _ = put.child().kill();
    let _ = put.wait_for(std::time::Duration::from_secs(10));
    let stored = stored_under(&tree);
    assert!(stored.len() < FILES, "killed before the put ended");
    let location = ferry_catalog::Location::parse(&url).unwrap();
    let in_db = ferry_catalog::Catalog::open(&location, "one").unwrap();
    assert!(
        in_db.pending().unwrap().is_empty(),
        "no intent in the database"
    );
    let intents = sb.state_dir().join("intents.sqlite");
    let left =
        ferry_catalog::Catalog::open(&ferry_catalog::Location::Sqlite(intents.clone()), "one")
            .unwrap()
            .pending()
            .unwrap()
            .len();
    drop(server);

    let server = Server::start(&sb, &root, Some(&sb.path("token")), &args);
    let registered = in_db.count().unwrap();
    eprintln!(
        "stored {} of {FILES} before the kill, {left} intents left in the file; after the restart {registered} registered",
        stored.len()
    );
    assert_eq!(registered, stored.len() as u64, "{}", server.stderr());
    for p in &stored {
        let s = in_db.stat(&format!("in/tree/{p}")).unwrap().expect(p);
        assert_eq!(s.object.size, 2048, "{p}");
    }
    let after = ferry_catalog::Catalog::open(&ferry_catalog::Location::Sqlite(intents), "one")
        .unwrap()
        .pending()
        .unwrap();
    assert!(after.is_empty(), "{after:?}");
    drop(server);
}
