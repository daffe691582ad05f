//! `ferry service` and its clients end to end: a real `ferry serve`, the service in front of
//! it, `ferry submit` of a tree that ends done and identical, `ferry jobs`/`job`/`cancel`/`links`
//! with `--json` and their exit codes, and a graceful stop on SIGTERM.

use std::fs;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::util::*;

/// A running `ferry service`, killed when dropped.
struct ServiceChild {
    guard: ChildGuard,
    addr: String,
    fingerprint: String,
    log: std::path::PathBuf,
}

impl ServiceChild {
    fn start(sb: &Sandbox, state: &std::path::Path, local: &std::path::Path) -> Self {
        let port = free_port();
        let log = sb.path("service.log");
        let mut cmd = sb.ferry();
        cmd.args(["service", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--state")
            .arg(state)
            .arg("--local-root")
            .arg(local)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap());
        let mut guard = ChildGuard(Some(cmd.spawn().expect("spawning ferry service")));
        let t0 = Instant::now();
        let fingerprint = loop {
            let text = fs::read_to_string(&log).unwrap_or_default();
            if let Some(fp) = text
                .lines()
                .find_map(|l| l.strip_prefix("ferry: certificate fingerprint "))
            {
                break fp.trim().to_owned();
            }
            assert!(
                guard.child().try_wait().unwrap().is_none(),
                "ferry service exited:\n{text}"
            );
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "ferry service starts:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        Self {
            guard,
            addr: format!("127.0.0.1:{port}"),
            fingerprint,
            log,
        }
    }

    /// `ferry CMD` against this service with `token`.
    fn cmd(&self, sb: &Sandbox, token: &str, args: &[&str]) -> Out {
        let mut c = sb.client(token);
        c.args(args).args([
            "--service",
            &self.addr,
            "--service-fingerprint",
            &self.fingerprint,
        ]);
        run(&mut c, CMD_TIMEOUT)
    }
}

#[test]
fn submit_a_tree_then_watch_it_done_and_identical_through_the_cli() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let server = Server::start(&sb, &root, None, &[]);
    let local = sb.mkdir("local");
    let tree = sb.mkdir("local/run42/sub");
    write_pattern(&tree.join("a.bin"), 300_000, 1);
    write_pattern(&local.join("run42/b.bin"), 5, 2);
    let state = sb.mkdir("svc");
    fs::write(
        state.join("endpoints.toml"),
        format!(
            "[[endpoint]]\nserver = \"127.0.0.1:{}\"\ntoken = \"{}\"\n",
            server.port, server.token
        ),
    )
    .unwrap();
    let mut add = sb.ferry();
    add.args(["token", "add", "alice", "--tokens"])
        .arg(state.join("tokens.toml"));
    let alice = run(&mut add, CMD_TIMEOUT);
    assert_code(&alice, 0);
    let alice = alice.stdout.trim().to_owned();
    let svc = ServiceChild::start(&sb, &state, &local);

    let dest = server.remote("/");
    let out = svc.cmd(
        &sb,
        &alice,
        &["submit", "/run42", &dest, "--label", "e2e", "--json"],
    );
    assert_code(&out, 0);
    let job = one_json(&out.stdout);
    let id = u64_field(&job, "id").to_string();
    assert_eq!(job["state"], "queued");
    assert_eq!(job["kind"], "put");
    assert_eq!(job["label"], "e2e");

    let t0 = Instant::now();
    let done = loop {
        let out = svc.cmd(&sb, &alice, &["job", &id, "--json"]);
        assert_code(&out, 0);
        let j = one_json(&out.stdout);
        if ["done", "failed", "cancelled"].contains(&j["state"].as_str().unwrap()) {
            break j;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "job ends: {j}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(u64_field(&done, "files_done"), 2);
    assert_eq!(
        tree_digest(&root.join("run42")),
        tree_digest(&local.join("run42"))
    );

    let out = svc.cmd(&sb, &alice, &["jobs", "--json"]);
    assert_code(&out, 0);
    assert_eq!(one_json(&out.stdout).as_array().unwrap().len(), 1);
    let out = svc.cmd(&sb, &alice, &["jobs"]);
    assert_code(&out, 0);
    assert!(out.stdout.contains("done"), "{out:?}");
    // Every job shown has ended: --watch shows them once and returns.
    let out = svc.cmd(&sb, &alice, &["jobs", "--watch"]);
    assert_code(&out, 0);
    assert_eq!(out.stdout.lines().count(), 2, "{out:?}");
    // The job's achieved rate is on its link's history.
    let out = svc.cmd(&sb, &alice, &["links", "--json"]);
    assert_code(&out, 0);
    let links = one_json(&out.stdout);
    let link = &links["links"][0];
    assert_eq!(link["name"], format!("127.0.0.1:{}", server.port));
    assert_eq!(link["last"]["source"], "transfer", "{links}");
    assert_eq!(link["flagged"], false);
    let out = svc.cmd(&sb, &alice, &["links"]);
    assert_code(&out, 0);
    assert!(out.stdout.contains("transfer"), "{out:?}");
    let out = svc.cmd(&sb, &alice, &["job", &id]);
    assert_code(&out, 0);
    assert!(
        out.stdout.contains(&format!("job {id}: done (put)")),
        "{out:?}"
    );

    // A job that has ended cannot be cancelled; one that does not exist is not found: exit 1.
    let out = svc.cmd(&sb, &alice, &["cancel", &id, "--json"]);
    assert_code(&out, 1);
    assert!(one_json(&out.stdout)["error"]["message"]
        .as_str()
        .unwrap()
        .contains("already ended"));
    assert_code(&svc.cmd(&sb, &alice, &["job", "999"]), 1);
    // What the user typed wrong is exit 2.
    let out = svc.cmd(
        &sb,
        &alice,
        &["submit", "/run42", &dest, "--sync", "newest"],
    );
    assert_code(&out, 2);
    assert!(
        out.stderr.contains("expected size, mtime or checksum"),
        "{out:?}"
    );
    assert_code(
        &svc.cmd(
            &sb,
            &alice,
            &["submit", "/run42", &dest, "--deadline", "soon"],
        ),
        2,
    );
    assert_code(&svc.cmd(&sb, "wrong-token", &["jobs"]), 1);

    // SIGTERM: the service stops cleanly.
    let pid = svc.guard.pid().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let mut guard = svc.guard;
    let status = guard
        .wait_for(Duration::from_secs(15))
        .expect("the service stops on SIGTERM");
    assert!(status.success(), "{status:?}");
    assert!(fs::read_to_string(&svc.log)
        .unwrap()
        .contains("ferry: service stopped"));
}

#[test]
fn a_bad_notification_setting_stops_the_service_at_start_with_why() {
    let sb = Sandbox::new();
    let state = sb.mkdir("svc");
    let mut c = sb.ferry();
    c.args(["service", "--listen", "127.0.0.1:0", "--state"])
        .arg(&state)
        .args(["--on-end-webhook", "ftp://hooks.example/"]);
    let out = run(&mut c, CMD_TIMEOUT);
    assert_code(&out, 2);
    assert!(out.stderr.contains("http:// or https://"), "{out:?}");
    let mut c = sb.ferry();
    c.args(["service", "--listen", "127.0.0.1:0", "--state"])
        .arg(&state)
        .args(["--on-end-arg", "x"]);
    assert_code(&run(&mut c, CMD_TIMEOUT), 2);
}

/// `--store`: a PostgreSQL queue that cannot be reached stops the service at start with the
/// reason and without the location's password; a location of another kind is refused.
#[test]
fn an_unreachable_shared_queue_is_a_clear_error_without_its_password() {
    let sb = Sandbox::new();
    let state = sb.mkdir("svc");
    let store = format!("postgres://ferry:s3cret@127.0.0.1:{}/ferry", free_port());
    let mut c = sb.ferry();
    c.args(["service", "--listen", "127.0.0.1:0", "--state"])
        .arg(&state)
        .args(["--store", &store]);
    let out = run(&mut c, CMD_TIMEOUT);
    assert_ne!(out.code(), Some(0), "{out:?}");
    assert!(!out.stderr.contains("panicked"), "{out:?}");
    assert!(
        out.stderr.contains("postgres://ferry:***@127.0.0.1:"),
        "{out:?}"
    );
    assert!(!out.stderr.contains("s3cret"), "{out:?}");
    let mut c = sb.ferry();
    c.args(["service", "--listen", "127.0.0.1:0", "--state"])
        .arg(&state)
        .args(["--store", "mysql://ferry:s3cret@db/ferry"]);
    let out = run(&mut c, CMD_TIMEOUT);
    assert_code(&out, 2);
    assert!(!out.stderr.contains("s3cret"), "{out:?}");
}
