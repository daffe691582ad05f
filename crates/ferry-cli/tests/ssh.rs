//! Sessions started over ssh (`ferry put FILES USER@HOST:PATH`), against a private sshd on
//! loopback that this test starts with its own host key, client key and config, and stops.

use crate::util;

use std::fs;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use util::*;

const CMD_TIMEOUT: Duration = Duration::from_secs(120);

/// A private sshd; killed on drop.
struct Sshd {
    _guard: ChildGuard,
    port: u16,
    key: PathBuf,
}

fn have(cmd: &str) -> bool {
    Path::new(cmd).exists()
        || Command::new("sh")
            .args(["-c", &format!("command -v {cmd}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}

fn keygen(path: &Path) {
    let st = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
}

fn user() -> String {
    let out = Command::new("id").arg("-un").output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

impl Sshd {
    fn start(sb: &Sandbox, test: &str) -> Option<Self> {
        let tools = (have("/usr/sbin/sshd") && have("ssh") && have("ssh-keygen"))
            .then_some(())
            .ok_or("sshd/ssh/ssh-keygen not installed (scripts/deps.sh installs them)");
        ferry_netem::needs(test, tools)?;
        let dir = sb.mkdir("sshd");
        let host_key = dir.join("host_ed25519");
        let key = dir.join("client_ed25519");
        keygen(&host_key);
        keygen(&key);
        fs::copy(key.with_extension("pub"), dir.join("authorized_keys")).unwrap();
        // sshd refuses to start without its privilege-separation directory.
        let _ = fs::create_dir_all("/run/sshd");
        for _ in 0..3 {
            let port = free_port();
            let config = dir.join("sshd_config");
            fs::write(
                &config,
                format!(
                    "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nAuthorizedKeysFile {}\n\
                     PidFile none\nStrictModes no\nUsePAM no\nPasswordAuthentication no\n\
                     KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n\
                     LogLevel ERROR\n",
                    host_key.display(),
                    dir.join("authorized_keys").display()
                ),
            )
            .unwrap();
            let log = fs::File::create(dir.join("sshd.log")).unwrap();
            let child = Command::new("/usr/sbin/sshd")
                .args(["-D", "-e", "-f"])
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("spawning sshd");
            let mut guard = ChildGuard(Some(child));
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Some(Self {
                        _guard: guard,
                        port,
                        key,
                    });
                }
                if guard.child().try_wait().unwrap().is_some() {
                    guard.0 = None;
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!(
            "sshd did not start:\n{}",
            fs::read_to_string(dir.join("sshd.log")).unwrap_or_default()
        );
    }

    fn ssh_command(&self) -> String {
        format!(
            "ssh -F /dev/null -p {} -i {} -o IdentitiesOnly=yes -o BatchMode=yes \
             -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
            self.port,
            self.key.display()
        )
    }
}

fn oneshots_running(bin: &str) -> usize {
    let out = Command::new("pgrep")
        .args(["-f", &format!("{bin} serve --oneshot")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).lines().count()
}

#[test]
fn put_and_get_over_an_ssh_started_session() {
    let sb = Sandbox::new();
    let Some(sshd) = Sshd::start(&sb, "put_and_get_over_an_ssh_started_session") else {
        return;
    };
    let bin = env!("CARGO_BIN_EXE_ferry");
    let target = format!("{}@127.0.0.1", user());
    let src = sb.path("src/tree");
    write_pattern(&src.join("big.bin"), 9 << 20, 1);
    for i in 0..50 {
        write_pattern(&src.join(format!("small/f{i}.dat")), 1000 + i * 37, i + 2);
    }
    let want = tree_digest(&src);
    let dest = sb.mkdir("remote-side");
    let ssh_env = |c: &mut Command| {
        c.env("FERRY_SSH", sshd.ssh_command())
            .env("FERRY_REMOTE_BIN", bin)
            .env_remove("FERRY_TOKEN");
    };

    // put: no daemon, no token, no known-hosts entry: ssh authenticates, the one-time server
    // announces its key over the ssh channel, and the data goes straight to its port.
    let mut cmd = sb.ferry();
    ssh_env(&mut cmd);
    let out = run(
        cmd.args(["put", "--json", "--streams", "3"])
            .arg(&src)
            .arg(format!("{target}:{}/", dest.display())),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    let report: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(report["encrypted"], true, "{out:?}");
    assert!(report["server_fingerprint"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    assert_eq!(report["streams"].as_array().unwrap().len(), 3);
    assert_eq!(tree_digest(&dest.join("tree")), want);
    assert!(
        !sb.xdg_config().join("ferry/known_hosts").exists(),
        "an ssh-started session is pinned by ssh, not by first use"
    );
    // The remote server ends with the session.
    assert!(
        wait_until(Duration::from_secs(10), || oneshots_running(bin) == 0),
        "serve --oneshot still running after the put"
    );

    // get it back the same way.
    let back = sb.mkdir("back");
    let mut cmd = sb.ferry();
    ssh_env(&mut cmd);
    let out = run(
        cmd.args(["get"])
            .arg(format!("{target}:{}/tree", dest.display()))
            .arg(&back),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    assert_eq!(tree_digest(&back.join("tree")), want);
    assert!(wait_until(Duration::from_secs(10), || oneshots_running(
        bin
    ) == 0));

    // A remote host without ferry: a clear error naming the fix, nothing hangs.
    let mut cmd = sb.ferry();
    ssh_env(&mut cmd);
    cmd.env("FERRY_REMOTE_BIN", "/nonexistent/ferry");
    let out = run(
        cmd.arg("put")
            .arg(src.join("big.bin"))
            .arg(format!("{target}:{}/x/", dest.display())),
        CMD_TIMEOUT,
    );
    assert_ne!(out.code(), Some(0));
    assert!(
        out.stderr.contains("--remote-ferry") && out.stderr.contains("over ssh"),
        "{out:?}"
    );
}

#[test]
fn cp_between_two_ssh_started_sessions() {
    let sb = Sandbox::new();
    let Some(sshd) = Sshd::start(&sb, "cp_between_two_ssh_started_sessions") else {
        return;
    };
    let bin = env!("CARGO_BIN_EXE_ferry");
    let target = format!("{}@127.0.0.1", user());
    let src = sb.path("h1/tree");
    write_pattern(&src.join("big.bin"), 5 << 20, 3);
    for i in 0..20 {
        write_pattern(&src.join(format!("small/f{i}.dat")), 500 + i * 91, i + 7);
    }
    let dest = sb.mkdir("h2");
    // Each end is a `serve --oneshot --third-party` started over ssh, pinned by the key it
    // announced there; no daemon, token or known-hosts entry anywhere.
    let mut cmd = sb.ferry();
    cmd.env("FERRY_SSH", sshd.ssh_command())
        .env("FERRY_REMOTE_BIN", bin)
        .env_remove("FERRY_TOKEN");
    let out = run(
        cmd.args(["cp", "--json"])
            .arg(format!("{target}:{}", src.display()))
            .arg(format!("{target}:{}/", dest.display())),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    let report: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(report["files"], 21, "{report}");
    assert_eq!(tree_digest(&dest.join("tree")), tree_digest(&src));
    assert!(!sb.xdg_config().join("ferry/known_hosts").exists());
    assert!(
        wait_until(Duration::from_secs(10), || oneshots_running(bin) == 0),
        "serve --oneshot still running after the copy"
    );
}

/// `ferry sync` over ssh-started sessions: up with `--delete` (listings, the transfer and the
/// removals all served by the one `serve --oneshot` while its channel is open), a second run
/// that sends only the changed file, down, and between two ssh-started sessions.
#[test]
fn sync_over_ssh_started_sessions() {
    let sb = Sandbox::new();
    let Some(sshd) = Sshd::start(&sb, "sync_over_ssh_started_sessions") else {
        return;
    };
    let bin = env!("CARGO_BIN_EXE_ferry");
    let target = format!("{}@127.0.0.1", user());
    let src = sb.path("src");
    for i in 0..5 {
        write_pattern(&src.join(format!("d/f{i}.dat")), 1000 + i * 37, i + 1);
    }
    let mirror = sb.mkdir("mirror");
    write_pattern(&mirror.join("stale.dat"), 100, 9);
    let sync = |args: &[&str], from: String, to: String| {
        let mut cmd = sb.ferry();
        cmd.env("FERRY_SSH", sshd.ssh_command())
            .env("FERRY_REMOTE_BIN", bin)
            .env_remove("FERRY_TOKEN");
        run(
            cmd.args(["sync", "--json"]).args(args).arg(from).arg(to),
            CMD_TIMEOUT,
        )
    };
    let there = format!("{target}:{}", mirror.display());
    let out = sync(&["--delete"], src.display().to_string(), there.clone());
    assert_code(&out, 0);
    assert_eq!(tree_digest(&mirror), tree_digest(&src));
    assert!(!mirror.join("stale.dat").exists());

    write_pattern(&src.join("d/f2.dat"), 5000, 42);
    let out = sync(&[], src.display().to_string(), there.clone());
    assert_code(&out, 0);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["plan"]["send"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(tree_digest(&mirror), tree_digest(&src));

    let back = sb.path("back");
    assert_code(&sync(&[], there.clone(), back.display().to_string()), 0);
    assert_eq!(tree_digest(&back), tree_digest(&src));

    let other = sb.path("other");
    let out = sync(&[], there, format!("{target}:{}", other.display()));
    assert_code(&out, 0);
    assert_eq!(tree_digest(&other), tree_digest(&src));
    assert!(
        wait_until(Duration::from_secs(10), || oneshots_running(bin) == 0),
        "serve --oneshot still running after the syncs"
    );
}
