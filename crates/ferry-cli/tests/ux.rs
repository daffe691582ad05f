//! End-to-end tests of what a person (or a script) sees when something goes wrong: addresses
//! that are not what they look like, servers that are not there, failures printed once and
//! named by what the user typed, JSON on failure, help text, and names that must not drive
//! the terminal. Real processes, loopback only, every command under a deadline.

use crate::util;

use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use util::*;

/// The deadline of a command that must fail at once or within seconds: the old behaviour it
/// guards against took minutes (retrying the whole `--retry-for`).
const QUICK: Duration = Duration::from_secs(20);

/// A tree of a few files in two directories.
fn small_tree(dir: &Path) {
    fs::create_dir_all(dir.join("d")).unwrap();
    for i in 0..3 {
        fs::write(dir.join(format!("f{i}.txt")), format!("file {i}\n")).unwrap();
        fs::write(dir.join(format!("d/g{i}.txt")), format!("deeper {i}\n")).unwrap();
    }
}

/// Rewrites every file of `small_tree` with other contents.
fn small_tree_changed(dir: &Path) {
    for i in 0..3 {
        fs::write(dir.join(format!("f{i}.txt")), format!("changed {i}\n")).unwrap();
        fs::write(
            dir.join(format!("d/g{i}.txt")),
            format!("changed deeper {i}\n"),
        )
        .unwrap();
    }
}

/// Lines of stderr that report an error.
fn error_lines(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.starts_with("error:")).collect()
}

/// A test that needs what this host may not give (mount namespaces): without it, it says so
/// and passes, except under CI, where a test that cannot run must not pass.
fn cannot_run(test: &str, why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("{test} cannot run here: {why}");
    }
    eprintln!("SKIPPED {test}: {why}");
}

/// Whether this process may make a mount namespace and bind-mount in it (root, usually).
fn can_mount() -> Result<(), String> {
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", "mount --bind / /mnt && umount /mnt"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("unshare: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// `ferry ARGS` run in a private mount namespace where `ro` is a read-only bind mount of
/// itself (so even root cannot write there), with the sandbox's environment. The namespace
/// ends with the process: nothing is left mounted.
fn ferry_with_read_only(
    sb: &Sandbox,
    ro: &Path,
    token: Option<&str>,
    args: &[OsString],
) -> Command {
    let template = match token {
        Some(t) => sb.client(t),
        None => sb.ferry(),
    };
    let mut c = Command::new("unshare");
    for (k, v) in template.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c.args(["-m", "sh", "-c"])
        .arg(r#"mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" && shift && exec "$@""#)
        .arg("sh")
        .arg(ro)
        .arg(BIN)
        .args(args);
    c
}

/// A `ferry serve` on `root` in a namespace where `ro` (under `root`) is read-only.
fn server_with_read_only(sb: &Sandbox, root: &Path, ro: &Path) -> (ChildGuard, String, String) {
    let token_file = sb.path("ro-token");
    let log = sb.path("ro-serve.log");
    let port = free_port();
    let args: Vec<OsString> = vec![
        "serve".into(),
        "--root".into(),
        root.into(),
        "--listen".into(),
        format!("127.0.0.1:{port}").into(),
        "--token-file".into(),
        token_file.clone().into(),
    ];
    let mut cmd = ferry_with_read_only(sb, ro, None, &args);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap());
    let mut guard = ChildGuard(Some(cmd.spawn().expect("spawning unshare")));
    let listen = format!("127.0.0.1:{port}");
    if let Err(e) = wait_serving(&mut guard, &log, &listen, Duration::from_secs(10)) {
        panic!("server not up: {e}");
    }
    let token = fs::read_to_string(&token_file).unwrap().trim().to_owned();
    (guard, format!("127.0.0.1:{port}"), token)
}

// ---------------------------------------------------------------------------------------------
// Addresses

/// `HOST:PORT` with no path was read as the path `PORT` on port 7070 (and retried for minutes);
/// `HOST:WORD:/PATH` as the path `WORD:/PATH`. Both are usage errors, with the likely meaning.
#[test]
fn a_port_without_a_path_is_a_usage_error_with_a_hint() {
    let sb = Sandbox::new();
    let file = sb.path("f.txt");
    fs::write(&file, b"x").unwrap();
    // Something listens where the user meant to go; nothing may connect to 7070 instead.
    let meant = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = meant.local_addr().unwrap().port();
    let remote = format!("127.0.0.1:{port}");
    let cases: Vec<(Vec<OsString>, String)> = vec![
        (
            vec!["put".into(), file.clone().into(), remote.clone().into()],
            format!("did you mean 127.0.0.1:{port}:/ ?"),
        ),
        (
            vec!["get".into(), remote.clone().into(), sb.path("out").into()],
            format!("did you mean 127.0.0.1:{port}:/ ?"),
        ),
        (
            vec!["ls".into(), format!("[::1]:{port}").into()],
            format!("did you mean [::1]:{port}:/ ?"),
        ),
        (
            vec!["put".into(), file.clone().into(), "dtn2:notaport:/x".into()],
            "did you mean dtn2:/x".to_owned(),
        ),
    ];
    for (args, hint) in cases {
        let t0 = Instant::now();
        let out = run(sb.client("t").args(&args), QUICK);
        assert_code(&out, 2);
        assert!(out.stderr.contains(&hint), "{args:?}: {out:?}");
        assert!(
            out.stderr.lines().any(|l| l.starts_with("hint: ")),
            "the hint has its own line: {out:?}"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{args:?} took {:?}",
            t0.elapsed()
        );
    }
    // The same, as JSON for a script.
    let out = run(
        sb.client("t")
            .args(["put", "--json"])
            .arg(&file)
            .arg(&remote),
        QUICK,
    );
    assert_code(&out, 2);
    let v = one_json(&out.stdout);
    assert_eq!(v["error"]["kind"], "usage", "{v}");
    assert_eq!(v["error"]["exit_code"], 2, "{v}");
    assert!(
        v["error"]["hint"]
            .as_str()
            .unwrap()
            .contains(&format!("{remote}:/")),
        "{v}"
    );
    // A path after the port, and a relative path with a colon in it, still work as before.
    let out = run(
        sb.client("t")
            .args(["ls", "--retry-for", "0", "--connect-timeout", "1s"])
            .arg(format!("{remote}:/")),
        QUICK,
    );
    assert_ne!(out.code(), Some(2), "{out:?}");
}

// ---------------------------------------------------------------------------------------------
// Connection errors and retries

/// A server that never answered: the error names the address and port tried, and the client
/// gives up within seconds (not after the default three minutes of `--retry-for`); ls too.
#[test]
fn an_absent_server_is_named_and_given_up_on_in_seconds() {
    let sb = Sandbox::new();
    let file = sb.path("f.txt");
    fs::write(&file, b"x").unwrap();
    let port = free_port(); // nobody listens there now
    let remote = format!("127.0.0.1:{port}:/");
    let runs: Vec<Vec<OsString>> = vec![
        vec!["put".into(), file.clone().into(), remote.clone().into()],
        vec!["get".into(), remote.clone().into(), sb.path("out/").into()],
        vec!["ls".into(), remote.clone().into()],
    ];
    for args in runs {
        let t0 = Instant::now();
        let out = run(sb.client("t").args(&args), QUICK);
        let took = t0.elapsed();
        assert_code(&out, 1);
        let errors = error_lines(&out.stderr);
        assert_eq!(errors.len(), 1, "{args:?}: {out:?}");
        assert!(
            errors[0].contains(&format!("connecting to 127.0.0.1:{port}: ")),
            "names the address tried: {out:?}"
        );
        // Retried briefly: a restart is ridden out, a wrong port costs seconds.
        assert!(out.stderr.contains("attempt 1 failed"), "{out:?}");
        assert!(took < Duration::from_secs(10), "{args:?} took {took:?}");
    }
}

/// A name that does not resolve is not retried at all.
#[test]
fn a_name_that_does_not_resolve_is_not_retried() {
    let sb = Sandbox::new();
    let file = sb.path("f.txt");
    fs::write(&file, b"x").unwrap();
    // `.invalid` never resolves (RFC 6761).
    for args in [
        vec![
            OsString::from("put"),
            file.clone().into(),
            "no-such-host.invalid:/".into(),
        ],
        vec!["ls".into(), "no-such-host.invalid:/".into()],
    ] {
        let out = run(sb.client("t").args(&args), QUICK);
        assert_code(&out, 1);
        assert!(out.stderr.contains("no-such-host.invalid"), "{out:?}");
        assert!(!out.stderr.contains("attempt"), "not retried: {out:?}");
    }
}

/// `--json` gives a script JSON on a failure too, with the exit code unchanged.
#[test]
fn json_failures_are_json() {
    let sb = Sandbox::new();
    let file = sb.path("f.txt");
    fs::write(&file, b"x").unwrap();
    let port = free_port();
    for args in [
        vec![
            OsString::from("put"),
            "--json".into(),
            "--retry-for".into(),
            "0".into(),
            file.clone().into(),
            format!("127.0.0.1:{port}:/").into(),
        ],
        vec![
            "ls".into(),
            "--json".into(),
            "--retry-for".into(),
            "0".into(),
            format!("127.0.0.1:{port}:/").into(),
        ],
    ] {
        let out = run(sb.client("t").args(&args), QUICK);
        assert_code(&out, 1);
        let v = one_json(&out.stdout);
        assert_eq!(v["error"]["kind"], "failed", "{v}");
        assert_eq!(v["error"]["exit_code"], 1, "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains(&format!("connecting to 127.0.0.1:{port}")),
            "{v}"
        );
    }
    // An argument clap refuses: JSON as well, exit 2.
    let out = run(
        sb.client("t")
            .args(["put", "--json", "--no-such-flag", "a", "h:/"]),
        QUICK,
    );
    assert_code(&out, 2);
    assert_eq!(one_json(&out.stdout)["error"]["kind"], "usage");
}

// ---------------------------------------------------------------------------------------------
// Failures printed once, named by what the user typed

/// Each failed file is reported once, as an error (it was a `warning:` and then an `error:`),
/// whether the receiver is remote (put) or local (get).
#[test]
fn each_failure_is_printed_once() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let src = sb.path("src/tree");
    small_tree(&src);
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
    // Both directions fail every file: each exists at the destination (the default policy).
    let out = run(
        sb.client(&s.token).arg("put").arg(&src).arg(s.remote("/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    let back = sb.mkdir("back");
    let out = run(
        sb.client(&s.token)
            .arg("get")
            .arg(s.remote("/tree"))
            .arg(&back),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    // Both sides now differ from the server's copy, which makes every file a conflict.
    small_tree_changed(&src);
    small_tree_changed(&back.join("tree"));
    for (what, out) in [
        (
            "put",
            run(
                sb.client(&s.token).arg("put").arg(&src).arg(s.remote("/")),
                CMD_TIMEOUT,
            ),
        ),
        (
            "get",
            run(
                sb.client(&s.token)
                    .arg("get")
                    .arg(s.remote("/tree"))
                    .arg(&back),
                CMD_TIMEOUT,
            ),
        ),
    ] {
        assert_code(&out, 1);
        assert!(!out.stderr.contains("warning:"), "{what}: {out:?}");
        for name in ["f0.txt", "f1.txt", "f2.txt", "g0.txt", "g1.txt", "g2.txt"] {
            let lines: Vec<&str> = out.stderr.lines().filter(|l| l.contains(name)).collect();
            assert_eq!(lines.len(), 1, "{what}: {name} once: {out:?}");
            assert!(lines[0].starts_with("error: "), "{what}: {out:?}");
        }
    }
}

/// A destination that cannot be written at all stops the transfer with one line naming the
/// directory (not one line per file naming a hidden `.part` file); a directory inside it
/// that cannot be written fails its files, naming that directory.
#[test]
fn an_unwritable_destination_is_named_once() {
    let test = "an_unwritable_destination_is_named_once";
    if let Err(why) = can_mount() {
        return cannot_run(test, &format!("needs a mount namespace: {why}"));
    }
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let src = sb.path("src/tree");
    small_tree(&src);
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
    let out = run(
        sb.client(&s.token).arg("put").arg(&src).arg(s.remote("/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);

    // get into a read-only directory.
    let dest = sb.mkdir("dest");
    let args: Vec<OsString> = vec!["get".into(), s.remote("/tree").into(), dest.clone().into()];
    let out = run(
        &mut ferry_with_read_only(&sb, &dest, Some(&s.token), &args),
        CMD_TIMEOUT,
    );
    assert_code(&out, 1);
    let errors = error_lines(&out.stderr);
    assert_eq!(errors.len(), 1, "one line: {out:?}");
    assert!(errors[0].contains(&dest.display().to_string()), "{out:?}");
    assert!(errors[0].contains("Read-only file system"), "{out:?}");
    assert!(!out.stderr.contains(".part"), "{out:?}");
    assert!(names(&dest).is_empty());

    // put to a server whose destination is read-only: one line too.
    let srv_root = sb.mkdir("srv2");
    let ro = srv_root.join("ro");
    fs::create_dir_all(ro.join("tree/d")).unwrap();
    let (_guard, addr, token) = server_with_read_only(&sb, &srv_root, &ro);
    let out = run(
        sb.client(&token)
            .arg("put")
            .arg(&src)
            .arg(format!("{addr}:/ro/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 1);
    let errors = error_lines(&out.stderr);
    assert_eq!(errors.len(), 1, "one line: {out:?}");
    assert!(
        errors[0].contains("/ro/"),
        "names the destination as given: {out:?}"
    );
    assert!(!out.stderr.contains(".part"), "{out:?}");

    // A read-only directory below a writable destination: its files fail, naming it.
    let srv3 = sb.mkdir("srv3");
    fs::create_dir_all(srv3.join("tree/d")).unwrap();
    let (_guard3, addr3, token3) = server_with_read_only(&sb, &srv3, &srv3.join("tree/d"));
    let out = run(
        sb.client(&token3)
            .arg("put")
            .arg(&src)
            .arg(format!("{addr3}:/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 1);
    let errors = error_lines(&out.stderr);
    assert_eq!(errors.len(), 3, "the three files in d/: {out:?}");
    for e in errors {
        assert!(e.contains("in directory tree/d"), "{out:?}");
        assert!(!e.contains(".part"), "{out:?}");
    }
    assert!(
        srv3.join("tree/f0.txt").exists(),
        "the writable part was written"
    );
}

/// Errors about paths name them as the user wrote them: the whole remote path (not the first
/// component that is missing), the whole local path.
#[test]
fn missing_paths_are_named_in_full() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
    for args in [
        vec![
            OsString::from("get"),
            s.remote("/no/such").into(),
            sb.path("out/").into(),
        ],
        vec!["ls".into(), s.remote("/no/such").into()],
    ] {
        let out = run(sb.client(&s.token).args(&args), CMD_TIMEOUT);
        assert_code(&out, 1);
        assert!(out.stderr.contains("/no/such: No such file"), "{out:?}");
    }
    let missing = sb.path("src/no/such.txt");
    let out = run(
        sb.client(&s.token)
            .arg("put")
            .arg(&missing)
            .arg(s.remote("/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 1);
    assert!(
        out.stderr
            .contains(&format!("{}: No such file", missing.display())),
        "{out:?}"
    );
}

/// A run that moved nothing names no bottleneck: nothing limited it.
#[test]
fn a_run_that_moved_nothing_names_no_bottleneck() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let src = sb.path("src/tree");
    small_tree(&src);
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
    let put = |extra: &[&str]| {
        run(
            sb.client(&s.token)
                .arg("put")
                .args(extra)
                .arg("--skip-existing")
                .arg(&src)
                .arg(s.remote("/")),
            CMD_TIMEOUT,
        )
    };
    let out = put(&[]);
    assert_code(&out, 0);
    assert!(
        out.stderr.contains("limited by"),
        "a run that moved data names it: {out:?}"
    );
    let out = put(&[]);
    assert_code(&out, 0);
    assert!(out.stderr.contains("6 skipped"), "{out:?}");
    assert!(!out.stderr.contains("limited by"), "{out:?}");
    let out = put(&["--json"]);
    assert_code(&out, 0);
    let v = one_json(&out.stdout);
    assert_eq!(v["bytes"], 0, "{v}");
    assert_eq!(v["tuning"]["bottleneck"], "none", "{v}");
}

// ---------------------------------------------------------------------------------------------
// Help and option syntax

/// An option set from the environment is not shown as required in a usage line, and the help
/// does not print an empty `[env: FERRY_SSH=]`.
#[test]
fn help_and_usage_do_not_show_environment_values() {
    let sb = Sandbox::new();
    let out = run(sb.client("secret-token").args(["get", "host:/x"]), QUICK);
    assert_code(&out, 2);
    let usage = out
        .stderr
        .lines()
        .find(|l| l.starts_with("Usage:"))
        .unwrap_or_default();
    assert!(
        usage.contains("get") && !usage.contains("--token"),
        "{out:?}"
    );
    assert!(!out.stderr.contains("secret-token"), "{out:?}");
    let mut c = sb.ferry();
    c.args(["put", "--help"])
        .env("FERRY_SSH", "ssh -i /secret/key")
        .env("FERRY_REMOTE_BIN", "/opt/ferry");
    let out = run(&mut c, QUICK);
    assert_code(&out, 0);
    assert!(out.stdout.contains("[env: FERRY_SSH]"), "{}", out.stdout);
    assert!(!out.stdout.contains("FERRY_SSH="), "{}", out.stdout);
    assert!(!out.stdout.contains("/secret/key"), "{}", out.stdout);
    assert!(!out.stdout.contains("/opt/ferry"), "{}", out.stdout);
    // Still read from the environment: the ssh command named there is the one run.
    let mut c = sb.ferry();
    c.args(["put", "--retry-for", "0", "--connect-timeout", "2s"])
        .arg(sb.path("home"))
        .arg("u@h:/x")
        .env("FERRY_SSH", "/nonexistent/ssh-from-env");
    let out = run(&mut c, QUICK);
    assert_code(&out, 1);
    assert!(out.stderr.contains("/nonexistent/ssh-from-env"), "{out:?}");
}

/// Every option that takes a time takes the same syntax: `30`, `30s`, `3m`.
#[test]
fn durations_have_one_syntax() {
    let sb = Sandbox::new();
    let file = sb.path("f.txt");
    fs::write(&file, b"x").unwrap();
    let port = free_port();
    for t in ["3", "3s", "1m", "1500ms"] {
        let out = run(
            sb.client("t")
                .args(["put", "--retry-for", "0", "--connect-timeout", t])
                .arg(&file)
                .arg(format!("127.0.0.1:{port}:/")),
            QUICK,
        );
        assert_code(&out, 1); // refused: the option itself was fine
    }
    let out = run(
        sb.client("t")
            .args(["put", "--connect-timeout", "3 fortnights"])
            .arg(&file)
            .arg(format!("127.0.0.1:{port}:/")),
        QUICK,
    );
    assert_code(&out, 2);
    assert!(out.stderr.contains("--connect-timeout"), "{out:?}");
    // The server's idle timeout too.
    let root = sb.mkdir("root");
    let s = Server::start(
        &sb,
        &root,
        Some(&sb.path("token")),
        &["--idle-timeout", "2m"],
    );
    let out = run(
        sb.client(&s.token).arg("ls").arg(s.remote("/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
}

// ---------------------------------------------------------------------------------------------
// Terminal injection

/// A name on the server with control characters cannot drive the terminal through `ls`; the
/// JSON listing keeps it exact.
#[test]
fn ls_escapes_control_characters_in_names() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let evil = "a\u{1b}]0;owned\u{7}b\nc\u{9b}2J\u{202e}txt";
    fs::write(root.join(evil), b"x").unwrap();
    let s = Server::start(&sb, &root, Some(&sb.path("token")), &[]);
    let out = run(
        sb.client(&s.token).arg("ls").arg(s.remote("/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    assert_eq!(
        out.stdout.lines().count(),
        1,
        "one entry, one line: {:?}",
        out.stdout
    );
    for c in ['\u{1b}', '\u{7}', '\u{9b}', '\u{202e}'] {
        assert!(!out.stdout.contains(c), "{:?}", out.stdout);
    }
    assert!(
        out.stdout
            .contains("a\\x1b]0;owned\\x07b\\nc\\u{9b}2J\\u{202e}txt"),
        "{:?}",
        out.stdout
    );
    let out = run(
        sb.client(&s.token)
            .args(["ls", "--json"])
            .arg(s.remote("/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    assert_eq!(one_json(&out.stdout)[0]["name"], evil);
}

/// A plain `Error` frame, which anyone who answers on the port can send before TLS: its
/// message is printed escaped.
#[test]
fn a_servers_error_message_cannot_drive_the_terminal() {
    let sb = Sandbox::new();
    let file = sb.path("f.txt");
    fs::write(&file, b"x").unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let message = "busy\u{1b}[2J\nerror: fake line";
    // Frame: type, payload length (u32), code (u16), message length (u16), message.
    let mut payload = Vec::new();
    payload.extend_from_slice(&1u16.to_be_bytes());
    payload.extend_from_slice(&(message.len() as u16).to_be_bytes());
    payload.extend_from_slice(message.as_bytes());
    let mut frame = vec![ferry_proto::FrameType::ERROR.0];
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(&payload);
    let fake = std::thread::spawn(move || {
        listener.set_nonblocking(false).unwrap();
        // One connection is all the client makes (no retry: --retry-for 0).
        if let Ok((mut s, _)) = listener.accept() {
            let _ = s.write_all(&frame);
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let out = run(
        sb.client("t")
            .args(["put", "--retry-for", "0"])
            .arg(&file)
            .arg(format!("127.0.0.1:{port}:/")),
        QUICK,
    );
    fake.join().unwrap();
    assert_code(&out, 1);
    assert!(!out.stderr.contains('\u{1b}'), "{out:?}");
    assert!(
        out.stderr.contains("busy\\x1b[2J\\nerror: fake line"),
        "{out:?}"
    );
    assert_eq!(error_lines(&out.stderr).len(), 1, "{out:?}");
}
