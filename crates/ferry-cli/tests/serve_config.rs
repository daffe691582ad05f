//! A server as a daemon runs it: `ferry serve --config FILE` with the command line overriding
//! the file, a misspelt key refused, and one log line per session (`--log-format json`).

use crate::util;

use std::fs;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use util::*;

/// `ferry serve --config FILE extra...`, waited for until it serves on `listen`; the stderr
/// log is in the returned path.
fn serve_with_config(
    sb: &Sandbox,
    config: &Path,
    extra: &[&str],
    listen: &str,
) -> (ChildGuard, std::path::PathBuf) {
    let log_path = sb.path("serve.log");
    let log = fs::File::create(&log_path).unwrap();
    let mut cmd = sb.ferry();
    cmd.arg("serve")
        .arg("--config")
        .arg(config)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    let mut guard = ChildGuard(Some(cmd.spawn().expect("spawning ferry serve")));
    if let Err(e) = wait_serving(&mut guard, &log_path, listen, Duration::from_secs(5)) {
        panic!("{e}");
    }
    (guard, log_path)
}

/// The JSON log line at `level` of a session that `token` ran, waited for (the server logs it
/// as the session ends, which the client may see first).
fn session_line(log: &Path, token: &str, level: &str) -> serde_json::Value {
    let mut found = None;
    let seen = wait_until(Duration::from_secs(5), || {
        let text = fs::read_to_string(log).unwrap_or_default();
        found = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["message"] == "session" && v["token"] == token && v["level"] == level);
        found.is_some()
    });
    assert!(
        seen,
        "no JSON session line for {token}:\n{}",
        fs::read_to_string(log).unwrap_or_default()
    );
    found.unwrap()
}

#[test]
fn a_config_file_sets_root_listen_limits_and_the_log_format() {
    let sb = Sandbox::new();
    sb.mkdir("etc/data");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    // Relative paths are from the file's directory.
    let config = sb.path("etc/serve.toml");
    fs::write(
        &config,
        format!(
            "root = \"data\"\nlisten = [\"{listen}\"]\ntoken_file = \"token\"\n\
             max_streams = 2\nidle_timeout = \"30s\"\nlog_format = \"json\"\n"
        ),
    )
    .unwrap();
    let (_server, log) = serve_with_config(&sb, &config, &[], &listen);
    let token = fs::read_to_string(sb.path("etc/token")).unwrap();
    let src = sb.path("src/a.bin");
    write_pattern(&src, 3 << 20, 7);
    let out = run(
        sb.client(token.trim())
            .args(["put", "--json", "--streams", "4"])
            .arg(&src)
            .arg(format!("{listen}:/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    assert_eq!(file_b3(&sb.path("etc/data/a.bin")), file_b3(&src));
    let v = one_json(&out.stdout);
    let streams = v["streams"].as_array().expect("streams");
    assert!(
        (1..=2).contains(&streams.len()),
        "max_streams = 2 from the file caps the session: {v}"
    );
    let line = session_line(&log, "token-file", "INFO");
    assert_eq!(line["what"], "put", "{line}");
    assert_eq!(line["bytes"], 3 << 20, "{line}");
    assert_eq!(line["result"], "ok", "{line}");
    assert!(
        line["peer"]
            .as_str()
            .is_some_and(|p| p.starts_with("127.0.0.1:")),
        "{line}"
    );
    assert!(line["secs"].as_f64().is_some() && line["bytes_per_sec"].as_u64().is_some());
    // A session that fails logs its error in the same line, as a warning.
    let out = run(
        sb.client(token.trim())
            .arg("ls")
            .arg(format!("{listen}:/no-such-dir")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 1);
    let line = session_line(&log, "token-file", "WARN");
    assert!(
        line["result"]
            .as_str()
            .is_some_and(|r| r.contains("no-such-dir")),
        "{line}"
    );
}

#[test]
fn the_command_line_overrides_the_file() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let config = sb.path("serve.toml");
    // Neither the file's root nor its address exists: the server serves only if the command
    // line's replace them.
    fs::write(
        &config,
        "root = \"/nonexistent/ferry-root\"\nlisten = [\"192.0.2.1:1\"]\nlog_format = \"json\"\n",
    )
    .unwrap();
    let (_server, log) = serve_with_config(
        &sb,
        &config,
        &[
            "--root",
            root.to_str().unwrap(),
            "--listen",
            &listen,
            "--token-file",
            sb.path("token").to_str().unwrap(),
            "--log-format",
            "text",
        ],
        &listen,
    );
    let token = fs::read_to_string(sb.path("token")).unwrap();
    let out = run(
        sb.client(token.trim()).arg("ls").arg(format!("{listen}:/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    // The text log, as the command line said: the session line is not JSON.
    let seen = wait_until(Duration::from_secs(5), || {
        let text = fs::read_to_string(&log).unwrap_or_default();
        text.lines().any(|l| {
            l.contains("session token=token-file ")
                && l.contains(" what=list ")
                && !l.starts_with('{')
        })
    });
    assert!(seen, "{}", fs::read_to_string(&log).unwrap_or_default());
}

#[test]
fn an_unknown_key_is_a_usage_error_naming_it() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let config = sb.path("serve.toml");
    fs::write(&config, "max_conections = 3\n").unwrap();
    let out = run(
        sb.ferry()
            .arg("serve")
            .arg("--root")
            .arg(&root)
            .arg("--config")
            .arg(&config),
        CMD_TIMEOUT,
    );
    assert_code(&out, 2);
    assert!(
        out.stderr.contains("line 1") && out.stderr.contains("unknown field `max_conections`"),
        "{out:?}"
    );
    // A file that does not exist is one too, not a default configuration.
    let out = run(
        sb.ferry()
            .arg("serve")
            .arg("--config")
            .arg(sb.path("missing.toml")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 2);
    assert!(out.stderr.contains("missing.toml"), "{out:?}");
}

/// `catalog` in the file (relative to it) is where a put's files are registered, with the
/// digest of what was sent; `--catalog none` on the command line turns it off.
#[test]
fn the_catalog_key_places_the_catalog_and_none_turns_it_off() {
    let sb = Sandbox::new();
    sb.mkdir("etc/data");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let config = sb.path("etc/serve.toml");
    fs::write(
        &config,
        format!(
            "root = \"data\"\nlisten = [\"{listen}\"]\ntoken_file = \"token\"\n\
             catalog = \"cat.sqlite\"\n"
        ),
    )
    .unwrap();
    let token = {
        let (_server, _log) = serve_with_config(&sb, &config, &[], &listen);
        let token = fs::read_to_string(sb.path("etc/token")).unwrap();
        let src = sb.path("src/a.bin");
        write_pattern(&src, 300_000, 3);
        let out = run(
            sb.client(token.trim())
                .arg("put")
                .arg(&src)
                .arg(format!("{listen}:/")),
            CMD_TIMEOUT,
        );
        assert_code(&out, 0);
        let db = ferry_catalog::Location::Sqlite(sb.path("etc/cat.sqlite"));
        let catalog = ferry_catalog::Catalog::open(&db, "test").unwrap();
        let stat = catalog.stat("a.bin").unwrap().expect("a.bin is registered");
        let hex: String = stat
            .object
            .digest
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(hex, file_b3(&src));
        assert_eq!(stat.object.stored_by, "token-file");
        token
    };
    assert!(!sb.state_dir().join("catalog.sqlite").exists());
    let (_server, log) = serve_with_config(&sb, &config, &["--catalog", "none"], &listen);
    let out = run(
        sb.client(token.trim())
            .arg("put")
            .arg(sb.path("src/a.bin"))
            .arg(format!("{listen}:/b.bin")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    let text = fs::read_to_string(log).unwrap();
    assert!(!text.contains("ferry: catalog"), "{text}");
    assert!(!sb.state_dir().join("catalog.sqlite").exists());
}

/// Without `catalog` a server keeps one in its state directory (catalog.sqlite) for its root;
/// a second server of the same user on another root leaves that one alone and serves without,
/// and naming it for the other root is refused.
#[test]
fn the_catalog_is_on_by_default_in_the_state_directory_for_one_root() {
    let sb = Sandbox::new();
    sb.mkdir("etc/data");
    sb.mkdir("etc/other");
    let listen = format!("127.0.0.1:{}", free_port());
    let config = |root: &str| {
        let path = sb.path(&format!("etc/{root}.toml"));
        let text = format!("root = \"{root}\"\nlisten = [\"{listen}\"]\ntoken_file = \"token\"\n");
        fs::write(&path, text).unwrap();
        path
    };
    let db = sb.state_dir().join("catalog.sqlite");
    {
        let (_server, _log) = serve_with_config(&sb, &config("data"), &[], &listen);
        let token = fs::read_to_string(sb.path("etc/token")).unwrap();
        let src = sb.path("src/a.bin");
        write_pattern(&src, 200_000, 5);
        let out = run(
            sb.client(token.trim())
                .arg("put")
                .arg(&src)
                .arg(format!("{listen}:/")),
            CMD_TIMEOUT,
        );
        assert_code(&out, 0);
        let catalog =
            ferry_catalog::Catalog::open(&ferry_catalog::Location::Sqlite(db.clone()), "test")
                .unwrap();
        let stat = catalog.stat("a.bin").unwrap().expect("a.bin is registered");
        assert_eq!(stat.object.size, 200_000);
    }
    let other = config("other");
    {
        let (_server, log) = serve_with_config(&sb, &other, &[], &listen);
        let text = fs::read_to_string(log).unwrap();
        assert!(text.contains("ferry: warning: no catalog"), "{text}");
        assert!(!text.contains("ferry: catalog "), "{text}");
    }
    let out = run(
        sb.ferry()
            .arg("serve")
            .arg("--config")
            .arg(&other)
            .arg("--catalog")
            .arg(&db),
        CMD_TIMEOUT,
    );
    assert_code(&out, 2);
    assert!(out.stderr.contains("etc/data"), "{out:?}");
}
