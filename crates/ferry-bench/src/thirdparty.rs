//! Third-party mode (issue 38): a `ferry cp` between two servers against a put between the same
//! two, on a three-host topology (ferry-netem's `Topology`). The client `c` has a slow link to
//! each server, `a` and `b` a fast one between them. Each round times a `ferry put` run in `a`
//! into `b` over their link, then a `ferry cp` run in `c` that has `a` put into `b`; both are
//! verified, and the links count what the client's side carried during each. What it shows:
//! whether a copy runs at the servers' own rate while the client's links carry control only.

use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ferry_netem::{End, LinkConfig, Regime, Topology, TopologyConfig};

use crate::data::{self, Digest};
use crate::host::fingerprint_of;
use crate::plan::Dataset;
use crate::runner::{self, Server};
use crate::stop;
use crate::tpreport::{Kind, TpRow};

/// Hosts, in the topology's order: the client, the source, the destination.
const HOSTS: [&str; 3] = ["c", "a", "b"];
const CLIENT: usize = 0;
const SOURCE: usize = 1;
const DEST: usize = 2;
/// Links: c–a and c–b (the client's), a–b (the servers').
const LINK_CA: usize = 0;
const LINK_CB: usize = 1;
const LINK_AB: usize = 2;
/// The issue's client links: 20 Mbit/s, 20 ms to each server.
pub const CLIENT_RTT: Duration = Duration::from_millis(20);
pub const CLIENT_RATE: u64 = 20_000_000;
/// Both servers listen on every address of their own namespace.
const PORT: u16 = 7000;

/// What a third-party run does.
pub struct TpOptions {
    pub ferry: PathBuf,
    /// The file is kept in `work/data` (the source's root, shared with the other modes' data
    /// sets); the destination's root is `work/tp-dest`, emptied before each transfer.
    pub work: PathBuf,
    pub out: PathBuf,
    pub bytes: u64,
    pub runs: u32,
    pub ab_rtt: Duration,
    pub ab_rate: Option<u64>,
    pub regime: Regime,
    /// One unrecorded put and copy first, so that the first recorded round does not alone
    /// meet cold servers, a path neither end has tuned on, and a cold destination.
    pub warmup: bool,
    pub max_run: Duration,
    pub verbose: bool,
}

impl TpOptions {
    pub fn dataset(&self) -> Dataset {
        Dataset::File { bytes: self.bytes }
    }

    fn topology(&self) -> TopologyConfig {
        TopologyConfig {
            hosts: HOSTS.iter().map(|h| (*h).to_owned()).collect(),
            links: vec![
                LinkConfig::new(CLIENT, SOURCE, CLIENT_RTT, Some(CLIENT_RATE)),
                LinkConfig::new(CLIENT, DEST, CLIENT_RTT, Some(CLIENT_RATE)),
                LinkConfig::new(SOURCE, DEST, self.ab_rtt, self.ab_rate),
            ],
            regime: self.regime,
        }
    }
}

/// A `ferry serve --third-party` in one host of the topology.
struct TpServer {
    server: Server,
    token: String,
    fingerprint: String,
}

/// The running bed: the topology, both servers, and where each client keeps its state.
struct Bed {
    topo: Topology,
    source: TpServer,
    dest: TpServer,
    state: PathBuf,
    dest_root: PathBuf,
}

impl Drop for Bed {
    fn drop(&mut self) {
        // The servers (fields) stop after this; the topology's own drop then removes the
        // namespaces and anything left in them.
        let _ = clear_dir(&self.dest_root);
    }
}

/// Removes everything in `dir` (the destination's root: the file, and any partial copies).
fn clear_dir(dir: &Path) -> Result<()> {
    for e in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        data::remove_path(&e?.path())?;
    }
    Ok(())
}

/// Third-party mode's rounds and what they found.
pub struct TpRunner<'a> {
    o: &'a TpOptions,
    logs: PathBuf,
    pub rows: Vec<TpRow>,
    pub notes: Vec<String>,
}

impl<'a> TpRunner<'a> {
    pub fn new(o: &'a TpOptions) -> Result<Self> {
        let logs = o.out.join("logs");
        fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
        Ok(TpRunner {
            o,
            logs,
            rows: Vec::new(),
            notes: Vec::new(),
        })
    }

    /// The file, the bed, the warm-up, then `runs` rounds of a put and a copy. The bed is torn
    /// down (servers, namespaces, the destination's files) however it ends.
    pub fn run(&mut self) -> Result<()> {
        let ds = self.o.dataset();
        eprintln!("ferry-bench third-party: preparing {}", ds.label());
        let (src, want) = data::ensure(&self.o.work.join("data"), &ds)?;
        let mut bed = self.start_bed()?;
        if self.o.warmup {
            for kind in [Kind::Put, Kind::Cp] {
                stop::check()?;
                let r = self.transfer(&bed, kind, 0, &src, &want);
                if !r.ok() {
                    bail!("warm-up {}: {}", kind.name(), r.error);
                }
            }
        }
        for run in 1..=self.o.runs {
            for kind in [Kind::Put, Kind::Cp] {
                stop::check()?;
                let r = self.transfer(&bed, kind, run, &src, &want);
                eprintln!(
                    "ferry-bench third-party: run {run}/{} {:<3} {}",
                    self.o.runs,
                    kind.name(),
                    if r.ok() {
                        format!(
                            "{:.2} s, {:.0} Mbit/s, client links {} B",
                            r.wall_s, r.mbit_s, r.client_link_bytes
                        )
                    } else {
                        format!("failed: {}", r.error)
                    }
                );
                self.rows.push(r);
            }
        }
        self.notes.extend(bed.topo.notes().iter().cloned());
        for (link, e) in bed.topo.forwarder_errors() {
            self.notes.push(format!("link {link}: {e}"));
        }
        for (who, s) in [("a", &mut bed.source), ("b", &mut bed.dest)] {
            // A server that died mid-run fails the transfers after it; this says why.
            if let Ok(Some(st)) = s.server.child.try_wait() {
                self.notes
                    .push(format!("ferry serve in {who} exited during the run ({st})"));
            }
        }
        Ok(())
    }

    fn start_bed(&self) -> Result<Bed> {
        let dest_root = self.o.work.join("tp-dest");
        fs::create_dir_all(&dest_root)?;
        clear_dir(&dest_root)?;
        let topo = Topology::up(self.o.topology()).context("the three-host topology")?;
        let state = self.o.out.join("ferry-state");
        let source = self.serve(&topo, SOURCE, &self.o.work.join("data"), &state)?;
        let dest = self.serve(&topo, DEST, &dest_root, &state)?;
        Ok(Bed {
            topo,
            source,
            dest,
            state,
            dest_root,
        })
    }

    /// `ferry serve --third-party` in `host`, with its own state and token file, ready once
    /// the client's host reaches it and its log gives its key.
    fn serve(&self, topo: &Topology, host: usize, root: &Path, state: &Path) -> Result<TpServer> {
        let name = HOSTS[host];
        let dir = state.join(format!("serve-{name}"));
        fs::create_dir_all(&dir)?;
        let token_file = dir.join("token");
        let log = self.logs.join(format!("serve-{name}.out"));
        let f = fs::File::create(&log)?;
        let mut c = Command::new(&self.o.ferry);
        c.env("FERRY_STATE_DIR", &dir)
            .env("XDG_CONFIG_HOME", dir.join("config"))
            .env_remove("FERRY_TOKEN")
            .arg("serve")
            .arg("--root")
            .arg(root)
            .arg("--listen")
            .arg(format!("0.0.0.0:{PORT}"))
            .arg("--token-file")
            .arg(&token_file)
            .arg("--third-party")
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .process_group(0);
        let child = topo
            .spawn_in(host, c)
            .with_context(|| format!("starting ferry serve in {name}"))?;
        let mut server = Server {
            name: format!("ferry serve in {name}"),
            child,
            log,
            own_log: None,
        };
        let link = if host == SOURCE { LINK_CA } else { LINK_CB };
        let addr = SocketAddr::from((topo.addr(link, End::B), PORT));
        let fingerprint = wait_ready(topo, &mut server, addr, Duration::from_secs(20))?;
        let token = fs::read_to_string(&token_file)
            .with_context(|| format!("reading {}", token_file.display()))?
            .trim()
            .to_owned();
        Ok(TpServer {
            server,
            token,
            fingerprint,
        })
    }

    /// One timed transfer of `kind` into an empty destination, verified.
    fn transfer(&self, bed: &Bed, kind: Kind, run: u32, src: &Path, want: &Digest) -> TpRow {
        let mut row = TpRow::new(run, kind, want.bytes);
        if let Err(e) = clear_dir(&bed.dest_root) {
            row.error = format!("clearing the destination: {e:#}");
            return row;
        }
        let cmd = match kind {
            Kind::Put => self.put_cmd(bed, src),
            Kind::Cp => self.cp_cmd(bed, &self.o.dataset().label()),
        };
        let cmd = match cmd {
            Ok(c) => c,
            Err(e) => {
                row.error = format!("{e:#}");
                return row;
            }
        };
        if self.o.verbose {
            eprintln!("ferry-bench third-party: {cmd:?}");
        }
        runner::sync_all();
        let before = link_bytes(&bed.topo);
        let out = runner::run_timed(cmd, runner::run_timeout(&self.o.dataset(), self.o.max_run));
        let after = link_bytes(&bed.topo);
        row.client_link_bytes = (after.0 - before.0) + (after.1 - before.1);
        row.ab_link_bytes = after.2 - before.2;
        let out = match out {
            Ok(o) => o,
            Err(e) => {
                row.error = format!("{e:#}");
                return row;
            }
        };
        row.wall_s = out.wall.as_secs_f64();
        let name = format!("{}-run{run}.json", kind.name());
        let _ = fs::write(self.logs.join(name), &out.stdout);
        if out.timed_out {
            row.error = format!("timed out after {:.0} s", row.wall_s);
        } else if !out.success {
            let mut msg = runner::short(&out.stderr);
            if msg.is_empty() {
                msg = runner::short(&out.stdout);
            }
            row.error = format!("{} {}: {msg}", kind.name(), out.code);
        } else {
            self.check(&mut row, kind, &out.stdout, bed, want);
        }
        row
    }

    /// The report's figures, then the destination against the source: size, then BLAKE3.
    fn check(&self, row: &mut TpRow, kind: Kind, json: &str, bed: &Bed, want: &Digest) {
        let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
        let put = match kind {
            Kind::Put => &v,
            Kind::Cp => &v["source_report"],
        };
        row.streams = put["tuning"]["streams"].as_u64();
        row.ramp_helpers = put["tuning"]["ramp_helpers"].as_u64();
        if v["skipped"].as_u64().unwrap_or(0) > 0 {
            row.error = "the file was already at the destination: nothing was measured".into();
            return;
        }
        let got = bed.dest_root.join(self.o.dataset().label());
        match fs::metadata(&got) {
            Ok(m) if m.len() == want.bytes => {}
            Ok(m) => {
                row.error = format!("destination holds {} of {} bytes", m.len(), want.bytes);
                return;
            }
            Err(e) => {
                row.error = format!("no destination file {}: {e}", got.display());
                return;
            }
        }
        match data::digest_path(&got) {
            Ok(d) if &d == want => {
                row.verified = true;
                if row.wall_s > 0.0 {
                    row.mbit_s = want.bytes as f64 * 8.0 / row.wall_s / 1e6;
                }
            }
            Ok(d) => row.error = format!("BLAKE3 differs: {} (source {})", d.blake3, want.blake3),
            Err(e) => row.error = format!("verifying: {e:#}"),
        }
    }

    /// A ferry client with its own state, config and pins under the run's output directory.
    fn client(&self, bed: &Bed, who: &str) -> Command {
        let dir = bed.state.join(who);
        let mut c = Command::new(&self.o.ferry);
        c.env("FERRY_STATE_DIR", &dir)
            .env("XDG_CONFIG_HOME", dir.join("config"))
            .env("FERRY_KNOWN_HOSTS", dir.join("known_hosts"))
            .env_remove("FERRY_TOKEN")
            .arg("-q");
        c
    }

    /// The baseline: `ferry put` in the source's host into the destination over the a–b link,
    /// with ferry's defaults (its own remembered path included, as a user's put would).
    fn put_cmd(&self, bed: &Bed, src: &Path) -> Result<Command> {
        let mut c = self.client(bed, "put-client");
        c.env("FERRY_TOKEN", &bed.dest.token)
            .arg("put")
            .arg(src)
            .arg(format!("{}:/", dest_on_ab(&bed.topo)))
            .arg("--json")
            .arg("--server-fingerprint")
            .arg(&bed.dest.fingerprint);
        bed.topo.enter(SOURCE, &mut c)?;
        Ok(c)
    }

    /// `ferry cp` in the client's host: each server by its address on the client's link, the
    /// destination as the source reaches it (`--dest-addr`, on the a–b link).
    fn cp_cmd(&self, bed: &Bed, file: &str) -> Result<Command> {
        let t = &bed.topo;
        let mut c = self.client(bed, "cp-client");
        c.arg("cp")
            .arg("--json")
            .arg("--source-token")
            .arg(&bed.source.token)
            .arg("--dest-token")
            .arg(&bed.dest.token)
            .arg("--source-fingerprint")
            .arg(&bed.source.fingerprint)
            .arg("--dest-fingerprint")
            .arg(&bed.dest.fingerprint)
            .arg("--dest-addr")
            .arg(dest_on_ab(t))
            .arg(format!("{}:{PORT}:/{file}", t.addr(LINK_CA, End::B)))
            .arg(format!("{}:{PORT}:/", t.addr(LINK_CB, End::B)));
        t.enter(CLIENT, &mut c)?;
        Ok(c)
    }
}

/// The destination's address and port on the a–b link.
fn dest_on_ab(t: &Topology) -> String {
    let b: Ipv4Addr = t.addr(LINK_AB, End::B);
    format!("{b}:{PORT}")
}

/// IP bytes delivered so far on c–a, c–b and a–b.
fn link_bytes(t: &Topology) -> (u64, u64, u64) {
    (
        t.link_stats(LINK_CA).delivered_bytes(),
        t.link_stats(LINK_CB).delivered_bytes(),
        t.link_stats(LINK_AB).delivered_bytes(),
    )
}

/// Waits until `addr` accepts from the client's host and the server's log gives its key.
pub(crate) fn wait_ready(
    t: &Topology,
    s: &mut Server,
    addr: SocketAddr,
    limit: Duration,
) -> Result<String> {
    let t0 = Instant::now();
    loop {
        let up = t
            .run_in(CLIENT, || {
                TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok()
            })
            .unwrap_or(false);
        if up {
            if let Some(fp) = fingerprint_of(&fs::read_to_string(&s.log).unwrap_or_default()) {
                return Ok(fp);
            }
        }
        if let Ok(Some(st)) = s.child.try_wait() {
            bail!("{} exited ({st}): {}", s.name, runner::short(&s.logs()));
        }
        if t0.elapsed() > limit {
            bail!(
                "{} not ready at {addr} after {} s: {}",
                s.name,
                limit.as_secs(),
                runner::short(&s.logs())
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Bytes the work directory must hold: the file (if not made yet) and one destination.
pub fn room_needed(o: &TpOptions) -> u64 {
    2 * o.bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bed_is_the_issues() {
        let o = TpOptions {
            ferry: "ferry".into(),
            work: "/w".into(),
            out: "/o".into(),
            bytes: 1 << 30,
            runs: 3,
            ab_rtt: Duration::from_millis(50),
            ab_rate: Some(1_000_000_000),
            regime: Regime::Default,
            warmup: true,
            max_run: Duration::from_secs(900),
            verbose: false,
        };
        let t = o.topology();
        assert_eq!(t.hosts, ["c", "a", "b"]);
        let l: Vec<_> = t
            .links
            .iter()
            .map(|l| (l.a, l.b, l.rtt.as_millis(), l.rate_bps))
            .collect();
        assert_eq!(
            l,
            [
                (0, 1, 20, Some(20_000_000)),
                (0, 2, 20, Some(20_000_000)),
                (1, 2, 50, Some(1_000_000_000)),
            ]
        );
        assert_eq!(o.dataset().label(), "file-1GiB");
        assert_eq!(room_needed(&o), 2 << 30);
    }
}
