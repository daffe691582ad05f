//! The peer tools: what is installed, how each server is started inside the server namespace,
//! and the client command of a transfer.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use ferry_netem::find_in_path;
use serde::Serialize;

use crate::plan::{Case, Dataset, Direction, Tool};

pub const RSYNC_PORT: u16 = 8730;
pub const SSH_PORT: u16 = 2222;
pub const XROOTD_PORT: u16 = 1094;
pub const GRIDFTP_PORT: u16 = 2811;
/// The unprivileged user of the XRootD server (it refuses to run as root) and of GridFTP's
/// anonymous sessions.
pub const PEER_USER: &str = "nobody";

/// Whether a peer can run here, and its version.
#[derive(Clone, Debug, Serialize)]
pub struct PeerInfo {
    pub tool: Tool,
    pub installed: bool,
    pub version: String,
    /// Why it is not installed, or notes on how it runs.
    pub note: String,
}

fn first_line(prog: &Path, args: &[&str]) -> String {
    Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .ok()
        .map(|o| {
            let mut t = String::from_utf8_lossy(&o.stdout).into_owned();
            t.push_str(&String::from_utf8_lossy(&o.stderr));
            t.lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .unwrap_or("")
                .to_owned()
        })
        .unwrap_or_default()
}

/// Finds the programs a peer needs.
pub fn probe(tool: Tool) -> PeerInfo {
    let (progs, pkgs, how): (&[&str], &str, &str) = match tool {
        Tool::Rsync => (
            &["rsync"],
            "rsync",
            "rsync daemon (rsync://, no ssh) in the server namespace; `rsync -a -W`; one TCP stream",
        ),
        Tool::Scp => (
            &["scp", "ssh", "sshd", "ssh-keygen"],
            "openssh-client openssh-server",
            "own sshd on port 2222 in the server namespace, ed25519 keys made per run; scp's default cipher and SFTP mode; one TCP stream",
        ),
        Tool::Xrootd => (
            &["xrootd", "xrdcp"],
            "xrootd-server xrootd-client",
            "xrootd (no auth) as `nobody`; `xrdcp --streams N` for a file (at most 15), `-r --streams N --parallel N` for trees",
        ),
        Tool::Gridftp => (
            &["globus-url-copy", "globus-gridftp-server"],
            "globus-gass-copy-progs globus-gridftp-server-progs",
            "globus-gridftp-server in anonymous clear-text mode (ftp://, no GSI); `globus-url-copy -fast -p N` for a file, `-r -cd -fast -cc N` for trees",
        ),
        Tool::Ferry | Tool::Iperf3 => unreachable!("not a peer"),
    };
    let missing: Vec<&str> = progs
        .iter()
        .copied()
        .filter(|p| find_in_path(p).is_none())
        .collect();
    if !missing.is_empty() {
        return PeerInfo {
            tool,
            installed: false,
            version: String::new(),
            note: format!(
                "not installed: no {} (Debian: {pkgs}; `bash scripts/bench-deps.sh`)",
                missing.join(", ")
            ),
        };
    }
    let bin = |p: &str| find_in_path(p).expect("found above");
    let version = match tool {
        Tool::Rsync => first_line(&bin("rsync"), &["--version"]),
        Tool::Scp => first_line(&bin("ssh"), &["-V"]),
        Tool::Xrootd => format!("xrdcp {}", first_line(&bin("xrdcp"), &["--version"])),
        Tool::Gridftp => first_line(&bin("globus-url-copy"), &["-version"]),
        _ => String::new(),
    };
    PeerInfo {
        tool,
        installed: true,
        version,
        note: how.into(),
    }
}

/// What a started peer server needs to be remembered for its clients.
pub struct PeerServer {
    pub tool: Tool,
    pub port: u16,
    /// scp: the client's private key.
    pub key: Option<PathBuf>,
    /// The server's own log file, if it keeps one.
    pub log: Option<PathBuf>,
}

/// Writes configuration and returns the server command (to be run in the server namespace) for
/// `tool`, serving `work` on `addr`. `dir` is private scratch space (keys, configs); `logs` is
/// world-writable (XRootD writes its log there as `nobody`).
pub fn server_command(
    tool: Tool,
    work: &Path,
    addr: &str,
    dir: &Path,
    logs: &Path,
) -> Result<(Command, PeerServer)> {
    match tool {
        Tool::Rsync => {
            let conf = dir.join("rsyncd.conf");
            fs::write(
                &conf,
                format!(
                    "pid file = {d}/rsyncd.pid\nuse chroot = no\nlog file = {l}/rsyncd.log\n\
                     [w]\n    path = {w}\n    read only = no\n    uid = root\n    gid = root\n",
                    d = dir.display(),
                    l = logs.display(),
                    w = work.display()
                ),
            )?;
            let mut c = Command::new(find_in_path("rsync").context("rsync")?);
            c.arg("--daemon")
                .arg("--no-detach")
                .arg(format!("--config={}", conf.display()))
                .arg(format!("--address={addr}"))
                .arg(format!("--port={RSYNC_PORT}"));
            Ok((
                c,
                PeerServer {
                    tool,
                    port: RSYNC_PORT,
                    key: None,
                    log: Some(logs.join("rsyncd.log")),
                },
            ))
        }
        Tool::Scp => {
            let keygen = find_in_path("ssh-keygen").context("ssh-keygen")?;
            for k in ["host_key", "client_key"] {
                let p = dir.join(k);
                if !p.exists() {
                    let st = Command::new(&keygen)
                        .args(["-q", "-t", "ed25519", "-N", "", "-C", "ferry-bench", "-f"])
                        .arg(&p)
                        .stdin(Stdio::null())
                        .status()?;
                    if !st.success() {
                        bail!("ssh-keygen failed for {k}");
                    }
                }
            }
            fs::copy(dir.join("client_key.pub"), dir.join("authorized_keys"))?;
            // sshd's privilege separation directory.
            fs::create_dir_all("/run/sshd").context("creating /run/sshd")?;
            let conf = dir.join("sshd_config");
            fs::write(
                &conf,
                format!(
                    "ListenAddress {addr}\nPort {SSH_PORT}\nHostKey {d}/host_key\n\
                     PidFile {d}/sshd.pid\nAuthorizedKeysFile {d}/authorized_keys\n\
                     PermitRootLogin prohibit-password\nPasswordAuthentication no\n\
                     KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n\
                     UseDNS no\nSubsystem sftp internal-sftp\n",
                    d = dir.display()
                ),
            )?;
            let mut c = Command::new(find_in_path("sshd").context("sshd")?);
            c.arg("-D").arg("-e").arg("-f").arg(&conf);
            Ok((
                c,
                PeerServer {
                    tool,
                    port: SSH_PORT,
                    key: Some(dir.join("client_key")),
                    log: None,
                },
            ))
        }
        Tool::Xrootd => {
            let conf = dir.join("xrootd.cfg");
            let admin = logs.join("xrootd-admin");
            fs::create_dir_all(&admin)?;
            fs::set_permissions(&admin, fs::Permissions::from_mode(0o777))?;
            fs::write(
                &conf,
                format!(
                    "all.export /\noss.localroot {w}\nall.adminpath {a}\nall.pidpath {a}\n\
                     xrd.port {XROOTD_PORT}\n",
                    w = work.display(),
                    a = admin.display()
                ),
            )?;
            fs::set_permissions(&conf, fs::Permissions::from_mode(0o644))?;
            let mut c = Command::new(find_in_path("xrootd").context("xrootd")?);
            c.args(["-R", PEER_USER, "-n", "ferrybench", "-p"])
                .arg(XROOTD_PORT.to_string())
                .arg("-c")
                .arg(&conf)
                .arg("-l")
                .arg(logs.join("xrootd.log"));
            Ok((
                c,
                PeerServer {
                    tool,
                    port: XROOTD_PORT,
                    key: None,
                    // -n NAME puts the log in a subdirectory of that name.
                    log: Some(logs.join("ferrybench").join("xrootd.log")),
                },
            ))
        }
        Tool::Gridftp => {
            let mut c = Command::new(find_in_path("globus-gridftp-server").context("gridftp")?);
            // GLOBUS_HOSTNAME: the address it names in its PASV/SPAS replies; without it the
            // server resolves the machine's hostname (127.0.0.1 in /etc/hosts).
            c.env("GLOBUS_HOSTNAME", addr)
                .args([
                    "-p",
                    &GRIDFTP_PORT.to_string(),
                    "-aa",
                    "-anonymous-user",
                    PEER_USER,
                ])
                .args(["-d", "error,warn", "-l"])
                .arg(logs.join("gridftp.log"));
            Ok((
                c,
                PeerServer {
                    tool,
                    port: GRIDFTP_PORT,
                    key: None,
                    log: Some(logs.join("gridftp.log")),
                },
            ))
        }
        Tool::Ferry | Tool::Iperf3 => bail!("not a peer"),
    }
}

/// The client command of one peer transfer. `src` and `dest_dir` are absolute local paths;
/// on the server side the data set is `work/data/<label>` and puts land in `work/put-dest/`.
pub fn client_command(
    srv: &PeerServer,
    case: &Case,
    server_addr: &str,
    client_addr: &str,
    work: &Path,
) -> Result<Command> {
    let label = case.dataset.label();
    let tree = !matches!(case.dataset, Dataset::File { .. });
    let n = case.streams_used().max(1).to_string();
    let local_src = work.join("data").join(&label);
    let put_dir = work.join("put-dest");
    let get_dir = work.join("get-dest");
    let c = match srv.tool {
        Tool::Rsync => {
            let mut c = Command::new(find_in_path("rsync").context("rsync")?);
            c.args(["-a", "-W"]);
            let url = format!("rsync://{server_addr}:{}/w", srv.port);
            match case.direction {
                Direction::Put => c.arg(&local_src).arg(format!("{url}/put-dest/")),
                Direction::Get => c
                    .arg(format!("{url}/data/{label}"))
                    .arg(format!("{}/", get_dir.display())),
            };
            c
        }
        Tool::Scp => {
            let mut c = Command::new(find_in_path("scp").context("scp")?);
            c.args([
                "-q",
                "-r",
                "-F",
                "/dev/null",
                "-P",
                &srv.port.to_string(),
                "-i",
            ])
            .arg(srv.key.as_ref().context("no key")?)
            .args([
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "BatchMode=yes",
                "-o",
                "LogLevel=ERROR",
                "-o",
                "IdentitiesOnly=yes",
            ]);
            let remote = |p: &Path| format!("root@{server_addr}:{}", p.display());
            match case.direction {
                Direction::Put => c.arg(&local_src).arg(remote(&put_dir) + "/"),
                Direction::Get => c
                    .arg(remote(&work.join("data").join(&label)))
                    .arg(format!("{}/", get_dir.display())),
            };
            c
        }
        Tool::Xrootd => {
            let mut c = Command::new(find_in_path("xrdcp").context("xrdcp")?);
            // Fail fast instead of retrying for minutes.
            c.env("XRD_CONNECTIONRETRY", "1")
                .env("XRD_CONNECTIONWINDOW", "10")
                .env("XRD_REQUESTTIMEOUT", "600");
            c.args(["-N", "-f", "--streams", &n]);
            if tree {
                c.args(["-r", "--parallel", &n]);
            }
            let url = |p: &str| format!("root://{server_addr}:{}//{p}", srv.port);
            match (case.direction, tree) {
                (Direction::Put, false) => c.arg(&local_src).arg(url(&format!("put-dest/{label}"))),
                (Direction::Put, true) => c.arg(&local_src).arg(url("put-dest/")),
                (Direction::Get, false) => c
                    .arg(url(&format!("data/{label}")))
                    .arg(get_dir.join(&label)),
                (Direction::Get, true) => c
                    .arg(url(&format!("data/{label}")))
                    .arg(format!("{}/", get_dir.display())),
            };
            c
        }
        Tool::Gridftp => {
            let mut c = Command::new(find_in_path("globus-url-copy").context("globus-url-copy")?);
            c.env("GLOBUS_HOSTNAME", client_addr);
            c.arg("-fast");
            if tree {
                c.args(["-r", "-cd", "-cc", &n]);
            } else {
                c.args(["-p", &n]);
            }
            let slash = if tree { "/" } else { "" };
            let ftp = |p: &Path| format!("ftp://{server_addr}:{}{}{slash}", srv.port, p.display());
            let file = |p: &Path| format!("file://{}{slash}", p.display());
            match case.direction {
                Direction::Put => c.arg(file(&local_src)).arg(ftp(&put_dir.join(&label))),
                Direction::Get => c
                    .arg(ftp(&work.join("data").join(&label)))
                    .arg(file(&get_dir.join(&label))),
            };
            c
        }
        Tool::Ferry | Tool::Iperf3 => bail!("not a peer"),
    };
    Ok(c)
}
