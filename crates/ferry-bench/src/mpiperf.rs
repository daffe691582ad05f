//! Multipath mode's ceiling: at each K, one `iperf3` per link, all K at once (server in s on
//! the link's address, client in c bound to its own), the sum of their receivers' steady
//! seconds. It tells the bed's and the machine's limit from ferry's: on a small host the K
//! links' forwarders and both ends share the cores.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use ferry_netem::{find_in_path, End, Topology};

use crate::iperf;
use crate::runner::{self, Server};

const PORT: u16 = 5300;

/// Whether iperf3 is installed.
pub fn installed() -> bool {
    find_in_path("iperf3").is_some()
}

/// How long each client sends: `secs` counted after `omit` not counted (slow start).
#[derive(Clone, Copy, Debug)]
pub struct Span {
    pub secs: u32,
    pub omit: u32,
}

/// The first K links' iperf3 goodput together, Mbit/s, and each link's, in link order; link i
/// ends at host `servers[i]`, K = `servers.len()`.
pub fn ceiling(
    t: &Topology,
    client: usize,
    servers_at: &[usize],
    span: Span,
    logs: &Path,
) -> Result<(f64, Vec<f64>)> {
    let bin = find_in_path("iperf3").context("no iperf3")?;
    let k = servers_at.len();
    let mut servers = Vec::new();
    for (i, &server) in servers_at.iter().enumerate() {
        let log = logs.join(format!("iperf3-k{k}-server{i}.out"));
        let f = fs::File::create(&log)?;
        let mut c = Command::new(&bin);
        c.args(["-s", "-1", "-J", "-B"])
            .arg(t.addr(i, End::B).to_string())
            .args(["-p", &(PORT + i as u16).to_string()])
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .process_group(0);
        servers.push(Server {
            name: format!("iperf3 server {i}"),
            child: t.spawn_in(server, c)?,
            log,
            own_log: None,
        });
    }
    // The servers listen within milliseconds; a client that comes too early fails, and says so.
    std::thread::sleep(Duration::from_millis(500));
    let mut clients = Vec::new();
    for i in 0..k {
        let mut c = Command::new(&bin);
        c.args(["-c", &t.addr(i, End::B).to_string()])
            .args(["-B", &t.addr(i, End::A).to_string()])
            .args(["-p", &(PORT + i as u16).to_string()])
            .args([
                "-t",
                &(span.secs + span.omit).to_string(),
                "-J",
                "--get-server-output",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        t.enter(client, &mut c)?;
        clients.push(c.spawn().context("starting iperf3 -c")?);
    }
    let mut per_link = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        let out = c.wait_with_output()?;
        let json = String::from_utf8_lossy(&out.stdout);
        let _ = fs::write(logs.join(format!("iperf3-k{k}-client{i}.json")), &*json);
        let r = iperf::parse(&json, false, f64::from(span.omit)).with_context(|| {
            format!(
                "iperf3 on link {i}: {}",
                runner::short(&String::from_utf8_lossy(&out.stderr))
            )
        })?;
        per_link.push(r.mean_mbps);
    }
    drop(servers);
    Ok((per_link.iter().sum(), per_link))
}
