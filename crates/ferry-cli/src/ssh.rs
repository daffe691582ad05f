//! Sessions started over ssh: `ferry put FILES USER@HOST:PATH` runs `ferry serve --oneshot` on
//! the remote host through the user's own ssh, reads the port, one-time token and certificate
//! fingerprint it prints on the ssh channel, and then connects to that port directly. The data
//! never passes through ssh (whose single stream and window are what make scp slow on long
//! paths); ssh only authenticates the user and carries the key that pins the TLS session.
//!
//! The announcement is one line on the remote's stdout:
//! `FERRY-ONESHOT 1 addr=IP port=N token=HEX fingerprint=sha256:HEX|none`. The remote server
//! exits when its stdin (the ssh channel) closes, which is what [`Oneshot::finish`] does.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use ferry_net::Fingerprint;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::args::ConnArgs;

pub const ANNOUNCE: &str = "FERRY-ONESHOT";

/// A running remote `ferry serve --oneshot`.
pub struct Oneshot {
    child: Child,
    /// `addr:port` to connect to.
    pub server: String,
    pub token: String,
    pub fingerprint: Option<Fingerprint>,
}

/// What the remote printed, parsed.
#[derive(Debug, PartialEq, Eq)]
pub struct Announcement {
    pub addr: Option<String>,
    pub port: u16,
    pub token: String,
    pub fingerprint: Option<Fingerprint>,
}

pub fn parse_announcement(line: &str) -> Result<Announcement> {
    let mut words = line.split_whitespace();
    if words.next() != Some(ANNOUNCE) || words.next() != Some("1") {
        bail!("unexpected first line from the remote ferry: `{line}`");
    }
    let (mut addr, mut port, mut token, mut fingerprint) = (None, None, None, None);
    for w in words {
        let (k, v) = w
            .split_once('=')
            .with_context(|| format!("bad field `{w}` in `{line}`"))?;
        match k {
            "addr" if !v.is_empty() => addr = Some(v.to_owned()),
            "port" => port = Some(v.parse::<u16>().context("bad port")?),
            "token" => token = Some(v.to_owned()),
            "fingerprint" if v == "none" => {}
            "fingerprint" => fingerprint = Some(v.parse::<Fingerprint>()?),
            _ => {} // fields of a newer version
        }
    }
    Ok(Announcement {
        addr,
        port: port.context("no port in the announcement")?,
        token: token.context("no token in the announcement")?,
        fingerprint,
    })
}

impl Oneshot {
    /// Starts the remote server and waits (bounded) for its announcement.
    /// `third_party`: the session is one end of a third-party copy (`serve --third-party`).
    pub async fn start(
        conn: &ConnArgs,
        target: &str,
        host: &str,
        wait: Duration,
        third_party: bool,
    ) -> Result<Self> {
        let (ssh, remote_ferry) = (conn.ssh_command(), conn.remote_bin());
        let mut words = ssh.split_whitespace();
        let program = words.next().context("--ssh is empty")?;
        let mut cmd = Command::new(program);
        cmd.args(words)
            .arg(target)
            .arg(&remote_ferry)
            .args(["serve", "--oneshot", "--quiet"]);
        if conn.no_encrypt {
            cmd.arg("--allow-plaintext");
        }
        if third_party {
            cmd.arg("--third-party");
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot run `{program}` (--ssh / FERRY_SSH)"))?;
        let stdout = child.stdout.take().context("no stdout from ssh")?;
        let mut lines = BufReader::new(stdout).lines();
        let line = match tokio::time::timeout(wait, lines.next_line()).await {
            Ok(Ok(Some(l))) => l,
            Ok(Ok(None)) | Ok(Err(_)) => {
                let status = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
                let status = match status {
                    Ok(Ok(s)) => s.to_string(),
                    _ => "still running".into(),
                };
                bail!(
                    "`{} {target} {} serve --oneshot` ended without announcing a port ({status}); \
                     is ferry installed there (--remote-ferry, FERRY_REMOTE_BIN)?",
                    ssh,
                    remote_ferry
                );
            }
            Err(_) => bail!(
                "no answer from `ferry serve --oneshot` on {target} within {} s",
                wait.as_secs()
            ),
        };
        let a = parse_announcement(&line)?;
        if !conn.no_encrypt && a.fingerprint.is_none() {
            bail!(
                "the remote ferry offered no TLS key; refusing to send unencrypted (--no-encrypt)"
            );
        }
        // The server's own idea of its address (from SSH_CONNECTION) works even when HOST is
        // an ssh alias that DNS does not know.
        let addr = a.addr.unwrap_or_else(|| host.to_owned());
        let server = if addr.contains(':') && !addr.starts_with('[') {
            format!("[{addr}]:{}", a.port)
        } else {
            format!("{addr}:{}", a.port)
        };
        // Keep reading stdout so the remote never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Self {
            child,
            server,
            token: a.token,
            fingerprint: a.fingerprint,
        })
    }

    /// Closes the ssh channel's stdin, which ends the remote server, and reaps ssh.
    pub async fn finish(mut self) {
        drop(self.child.stdin.take());
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcement_parses_and_rejects_junk() {
        let fp = ferry_net::Identity::generate().unwrap().fingerprint();
        let a = parse_announcement(&format!(
            "FERRY-ONESHOT 1 addr=10.0.0.5 port=40001 token=abc fingerprint={fp} future=x"
        ))
        .unwrap();
        assert_eq!(
            a,
            Announcement {
                addr: Some("10.0.0.5".into()),
                port: 40001,
                token: "abc".into(),
                fingerprint: Some(fp)
            }
        );
        let a =
            parse_announcement("FERRY-ONESHOT 1 addr= port=1 token=t fingerprint=none").unwrap();
        assert_eq!((a.addr, a.fingerprint), (None, None));
        assert!(parse_announcement("Welcome to Ubuntu").is_err());
        assert!(parse_announcement("FERRY-ONESHOT 1 token=t").is_err());
        assert!(parse_announcement("FERRY-ONESHOT 1 port=99999 token=t").is_err());
    }
}
