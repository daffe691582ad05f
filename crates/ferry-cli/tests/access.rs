//! The access side of the CLI: `ferry token add|list|revoke`, scoped tokens against a running
//! server, encryption flags, and a changed server key.

use crate::util;

use std::fs;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use util::*;

const CMD_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn tokens_are_added_listed_scoped_and_revoked() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let tokens = sb.path("tokens.toml");
    fs::create_dir_all(root.join("pub")).unwrap();
    fs::write(root.join("pub/readme.txt"), "hello").unwrap();
    fs::create_dir_all(root.join("private")).unwrap();

    let (alice, monitor) = add_and_list(&sb, &tokens);

    let tokens_arg = tokens.to_str().unwrap().to_owned();
    let s = Server::start(&sb, &root, None, &["--tokens", &tokens_arg]);
    let src = sb.path("src/run1.bin");
    write_pattern(&src, 300_000, 4);

    // alice may write under her prefix...
    let out = run(
        sb.client(&alice)
            .arg("put")
            .arg(&src)
            .arg(s.remote("/incoming/alice/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    assert_eq!(
        file_b3(&root.join("incoming/alice/run1.bin")),
        file_b3(&src)
    );
    // ...and nowhere else: permission denied naming the path, exit 1, nothing created.
    let out = run(
        sb.client(&alice)
            .arg("put")
            .arg(&src)
            .arg(s.remote("/private/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 1);
    assert!(
        out.stderr.contains("permission denied") && out.stderr.contains("/private/"),
        "{out:?}"
    );
    assert!(names(&root.join("private")).is_empty());
    // The read-only token reads, but cannot write even where alice can.
    let got = sb.mkdir("got");
    let out = run(
        sb.client(&monitor)
            .arg("get")
            .arg(s.remote("/pub/readme.txt"))
            .arg(&got),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    assert_eq!(fs::read_to_string(got.join("readme.txt")).unwrap(), "hello");
    let out = run(
        sb.client(&monitor)
            .arg("put")
            .arg(&src)
            .arg(s.remote("/incoming/alice/other/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 1);
    assert!(out.stderr.contains("permission denied"), "{out:?}");

    // Revoked while the server runs: refused at the next login.
    let out = run(
        sb.ferry()
            .args(["token", "revoke", "alice", "--tokens"])
            .arg(&tokens),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    // Make sure the file's mtime differs from the one the server cached.
    let f = fs::File::options().write(true).open(&tokens).unwrap();
    f.set_modified(std::time::SystemTime::now() + Duration::from_secs(5))
        .unwrap();
    let out = run(
        sb.client(&alice).arg("ls").arg(s.remote("/pub")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 1);
    assert!(out.stderr.contains("wrong token"), "{out:?}");
    let out = run(
        sb.client(&monitor).arg("ls").arg(s.remote("/pub")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
}

/// Adds the tokens `alice` (reads /pub, writes /incoming/alice) and `monitor` (reads /pub,
/// read-only) to `tokens`, refuses a duplicate and a bad prefix, and lists them, secrets
/// nowhere but in `token add`'s output. Returns the two secrets.
fn add_and_list(sb: &Sandbox, tokens: &Path) -> (String, String) {
    let tokens = tokens.to_path_buf();
    let add = |args: &[&str]| {
        let out = run(
            sb.ferry()
                .args(["token", "add"])
                .args(args)
                .arg("--tokens")
                .arg(&tokens),
            CMD_TIMEOUT,
        );
        assert_code(&out, 0);
        let t = out.stdout.trim().to_owned();
        assert_eq!(t.len(), 48, "the token is the only stdout: {out:?}");
        t
    };
    let alice = add(&["alice", "--read", "/pub", "--write", "/incoming/alice"]);
    let monitor = add(&["monitor", "--read", "/pub", "--read-only"]);
    // A duplicate name is a usage error; a bad prefix too.
    let out = run(
        sb.ferry()
            .args(["token", "add", "alice", "--tokens"])
            .arg(&tokens),
        CMD_TIMEOUT,
    );
    assert_code(&out, 2);
    let out = run(
        sb.ferry()
            .args(["token", "add", "evil", "--read", "../etc", "--tokens"])
            .arg(&tokens),
        CMD_TIMEOUT,
    );
    assert_code(&out, 2);

    let out = run(
        sb.ferry().args(["token", "list", "--tokens"]).arg(&tokens),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    assert!(
        out.stdout
            .contains("alice\tread /pub\twrite /incoming/alice"),
        "{out:?}"
    );
    assert!(
        out.stdout.contains("monitor\tread /pub\tread-only"),
        "{out:?}"
    );
    let stored = fs::read_to_string(&tokens).unwrap();
    assert!(!stored.contains(&alice) && !stored.contains(&monitor));
    assert!(!out.stdout.contains(&alice));
    (alice, monitor)
}

/// Starts `ferry serve` on a given port with its own state directory (so its own key).
fn serve_on(sb: &Sandbox, port: u16, state: &str, extra: &[&str]) -> (ChildGuard, String) {
    let log = sb.path(&format!("{state}.log"));
    let listen = format!("127.0.0.1:{port}");
    let mut cmd = sb.serve_cmd(&sb.mkdir("root"), &listen, Some(&sb.path("token")));
    cmd.env("FERRY_STATE_DIR", sb.path(state))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap());
    let mut guard = ChildGuard(Some(cmd.spawn().unwrap()));
    let text = wait_serving(&mut guard, &log, &listen, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("server not up: {e}"));
    let fp = text
        .split_whitespace()
        .find(|w| w.starts_with("sha256:"))
        .expect("fingerprint printed")
        .to_owned();
    (guard, fp)
}

#[test]
fn a_changed_server_key_is_refused_and_plaintext_needs_both_ends() {
    let sb = Sandbox::new();
    let port = free_port();
    let (first, fp1) = serve_on(&sb, port, "state-a", &[]);
    let token = fs::read_to_string(sb.path("token"))
        .unwrap()
        .trim()
        .to_owned();
    let remote = format!("127.0.0.1:{port}:/");

    let out = run(sb.client(&token).arg("ls").arg(&remote), CMD_TIMEOUT);
    assert_code(&out, 0);
    let known = fs::read_to_string(sb.xdg_config().join("ferry/known_hosts")).unwrap();
    assert_eq!(known, format!("127.0.0.1:{port} {fp1}\n"));

    // --no-encrypt against a server that does not allow it: a clear error, not a fallback.
    let out = run(
        sb.client(&token).args(["ls", "--no-encrypt"]).arg(&remote),
        CMD_TIMEOUT,
    );
    assert_code(&out, 1);
    assert!(out.stderr.contains("requires TLS"), "{out:?}");
    drop(first);

    // The same address now answers with another key (reinstalled, or someone in between).
    let (second, fp2) = serve_on(&sb, port, "state-b", &["--allow-plaintext"]);
    assert_ne!(fp1, fp2);
    let out = run(sb.client(&token).arg("ls").arg(&remote), CMD_TIMEOUT);
    assert_code(&out, 1);
    assert!(
        out.stderr.contains("CHANGED") && out.stderr.contains("known_hosts"),
        "{out:?}"
    );
    assert!(out.stderr.contains(&fp2), "the new key is shown: {out:?}");
    // Pinning the new key explicitly works; so does plain TCP where the server allows it.
    let out = run(
        sb.client(&token)
            .args(["ls", "--server-fingerprint", &fp2])
            .arg(&remote),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    let out = run(
        sb.client(&token).args(["ls", "--no-encrypt"]).arg(&remote),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    drop(second);
}
