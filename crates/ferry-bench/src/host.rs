//! Host mode: one host, loopback, no emulator. `ferry serve` on 127.0.0.1 (fresh state, the
//! client pinning its key), each data set put and got with ferry's defaults (TLS, BLAKE3) and
//! `--no-encrypt`, timed until durable, verified, with the CPU seconds of both ends; iperf3 and
//! `ferry probe net` as the host's and ferry's own memory-to-memory ceilings, and the peers that
//! run without namespaces (rsync's daemon) beside it. What it says is what limits ferry on a
//! many-core host, where a core, not the network, is the bottleneck.

use std::collections::HashMap;
use std::fs;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};

use crate::cpu;
use crate::data::{self, Digest};
use crate::hostreport::{HostCsv, HostRow, IPERF3, PROBE_NET};
use crate::iperf;
use crate::peers::{self, PeerServer};
use crate::plan::{Case, Dataset, Direction, Tool, GIB};
use crate::runner::{self, Server};

/// ferry's transport: its defaults, or plain TCP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Tls,
    Plain,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Tls => "tls",
            Transport::Plain => "plain",
        }
    }
    pub fn parse(s: &str) -> Result<Transport, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "tls" | "default" | "defaults" => Ok(Transport::Tls),
            "plain" | "no-encrypt" => Ok(Transport::Plain),
            o => Err(format!("unknown transport {o:?} (tls, plain)")),
        }
    }
}

/// What a host-mode run does.
pub struct HostOptions {
    pub ferry: PathBuf,
    /// Data sets in `work/data` (the server's root is `work`), destinations `work/put-dest`
    /// and `work/get-dest`.
    pub work: PathBuf,
    pub out: PathBuf,
    pub datasets: Vec<Dataset>,
    pub directions: Vec<Direction>,
    pub transports: Vec<Transport>,
    pub runs: u32,
    /// iperf3 -P counts; empty: no iperf3.
    pub iperf_streams: Vec<u16>,
    pub iperf_secs: u32,
    pub iperf_omit: u32,
    /// Seconds per point of `ferry probe net`; None: not run.
    pub probe_secs: Option<u32>,
    /// Peers to run beside ferry (those that need no namespace: rsync).
    pub peers: Vec<Tool>,
    pub max_run: Duration,
    pub verbose: bool,
    /// Move many-file destinations aside until the end, as the bed does ([`runner::make_dest`]:
    /// ext4's inode reuse); on tmpfs, where that does not matter and RAM is the space, they are
    /// deleted after each run.
    pub keep_aside: bool,
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A free TCP port on 127.0.0.1 (bound and released; the server binds it right after).
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn spawn(name: &str, mut cmd: Command, logs: &Path) -> Result<Server> {
    let log = logs.join(format!("{name}.out"));
    let f = fs::File::create(&log)?;
    cmd.stdin(Stdio::null())
        .stdout(f.try_clone()?)
        .stderr(f)
        .process_group(0);
    let child = cmd.spawn().with_context(|| format!("starting {name}"))?;
    Ok(Server {
        name: name.into(),
        child,
        log,
        own_log: None,
    })
}

/// Waits until `port` accepts and, if `want` is given, the server's log holds what it finds.
fn wait_ready<T>(
    s: &mut Server,
    port: u16,
    want: impl Fn(&str) -> Option<T>,
    secs: u64,
) -> Result<Option<T>> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let t0 = Instant::now();
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok() {
            let log = fs::read_to_string(&s.log).unwrap_or_default();
            if let Some(v) = want(&log) {
                return Ok(Some(v));
            }
        }
        if let Ok(Some(st)) = s.child.try_wait() {
            bail!("{} exited ({st}): {}", s.name, runner::short(&s.logs()));
        }
        if t0.elapsed() > Duration::from_secs(secs) {
            bail!(
                "{} not ready on port {port} after {secs} s: {}",
                s.name,
                runner::short(&s.logs())
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The certificate fingerprint `ferry serve` prints at start.
pub fn fingerprint_of(log: &str) -> Option<String> {
    let i = log.find("sha256:")?;
    let hex: String = log[i + 7..]
        .chars()
        .take_while(|c| c.is_ascii_hexdigit())
        .collect();
    (hex.len() == 64).then(|| format!("sha256:{hex}"))
}

/// The loopback `ferry serve` and how a client reaches it.
struct Ferry {
    server: Server,
    port: u16,
    token: String,
    fingerprint: String,
    /// The client's own state, config and pins (not the user's).
    client_env: Vec<(&'static str, PathBuf)>,
}

fn start_ferry(o: &HostOptions, logs: &Path) -> Result<Ferry> {
    let st = o.out.join("ferry-state");
    for d in ["server", "client", "config"] {
        fs::create_dir_all(st.join(d))?;
    }
    let port = free_port()?;
    let token_file = st.join("server/token");
    let mut c = Command::new(&o.ferry);
    // Fresh state for the server's key; plaintext allowed so one server serves both
    // transports (its TLS clients are served as without it).
    c.env("FERRY_STATE_DIR", st.join("server"))
        .env("XDG_CONFIG_HOME", st.join("config"))
        .arg("serve")
        .arg("--root")
        .arg(&o.work)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--token-file")
        .arg(&token_file)
        .arg("--allow-plaintext");
    let mut server = spawn("ferry-serve", c, logs)?;
    let fingerprint = wait_ready(&mut server, port, fingerprint_of, 20)?.unwrap_or_default();
    let token = fs::read_to_string(&token_file)
        .context("reading ferry's token file")?
        .trim()
        .to_owned();
    Ok(Ferry {
        server,
        port,
        token,
        fingerprint,
        client_env: vec![
            ("FERRY_STATE_DIR", st.join("client")),
            ("XDG_CONFIG_HOME", st.join("config")),
            ("FERRY_KNOWN_HOSTS", st.join("config/known_hosts")),
        ],
    })
}

impl Ferry {
    fn command(&self, bin: &Path) -> Command {
        let mut c = Command::new(bin);
        c.envs(self.client_env.iter().map(|(k, v)| (*k, v)))
            .env("FERRY_TOKEN", &self.token)
            .arg("-q");
        c
    }

    fn conn_args(&self, c: &mut Command, t: Transport) {
        match t {
            Transport::Tls => c.arg("--server-fingerprint").arg(&self.fingerprint),
            Transport::Plain => c.arg("--no-encrypt"),
        };
    }
}

/// The host-mode sweep.
pub struct HostRunner<'a> {
    o: &'a HostOptions,
    csv: HostCsv,
    pub rows: Vec<HostRow>,
    pub notes: Vec<String>,
    sources: HashMap<Dataset, (PathBuf, Digest)>,
    logs: PathBuf,
}

/// One ferry transfer to measure.
struct Job<'j> {
    ds: &'j Dataset,
    dir: Direction,
    transport: Transport,
    run: u32,
}

impl<'a> HostRunner<'a> {
    pub fn new(o: &'a HostOptions) -> Result<Self> {
        let logs = o.out.join("logs");
        fs::create_dir_all(&logs)?;
        Ok(HostRunner {
            o,
            csv: HostCsv::create(&o.out.join("results.csv"))?,
            rows: Vec::new(),
            notes: Vec::new(),
            sources: HashMap::new(),
            logs,
        })
    }

    fn record(&mut self, mut row: HostRow) -> Result<()> {
        crate::stop::check()?;
        row.per_gib();
        let what = if row.ok() {
            format!(
                "{:.3} GiB/s, CPU s/GiB client {} server {}",
                row.gibps,
                row.client_cpu_s_per_gib
                    .map_or("-".into(), |v| format!("{v:.2}")),
                row.server_cpu_s_per_gib
                    .map_or("-".into(), |v| format!("{v:.2}"))
            )
        } else {
            format!(
                "FAILED: {}",
                row.error.chars().take(160).collect::<String>()
            )
        };
        eprintln!(
            "ferry-bench host: {} {} {} {} s={} run {}: {what}",
            row.tool, row.transport, row.direction, row.dataset, row.streams, row.run
        );
        self.csv.push(&row)?;
        self.rows.push(row);
        Ok(())
    }

    /// Generates (or reuses) the data sets in `work/data`.
    pub fn prepare_data(&mut self) -> Result<()> {
        let dir = self.o.work.join("data");
        for ds in &self.o.datasets {
            crate::stop::check()?;
            let t0 = Instant::now();
            let (p, d) = data::ensure(&dir, ds)?;
            eprintln!(
                "ferry-bench host: data set {}: {} files, {} bytes ({:.1} s)",
                ds.label(),
                d.files,
                d.bytes,
                t0.elapsed().as_secs_f64()
            );
            self.sources.insert(ds.clone(), (p, d));
        }
        runner::sync_all();
        Ok(())
    }

    /// Runs everything: servers up, ceilings, then `runs` rounds of every transfer.
    pub fn run(&mut self) -> Result<()> {
        let mut ferry = start_ferry(self.o, &self.logs)?;
        let iperf = self.start_iperf3();
        let rsync = self.start_rsync();
        self.ceilings(&ferry, iperf.as_ref().map(|(_, p)| *p))?;
        for run in 1..=self.o.runs {
            for ds in &self.o.datasets {
                for &dir in &self.o.directions {
                    for &transport in &self.o.transports {
                        let job = Job {
                            ds,
                            dir,
                            transport,
                            run,
                        };
                        let row = self.ferry_run(&ferry, &job);
                        self.record(row)?;
                    }
                    if let Some((s, ps)) = &rsync {
                        let row = self.peer_run(s, ps, ds, dir, run);
                        self.record(row)?;
                    }
                }
            }
        }
        if let Ok(Some(st)) = ferry.server.child.try_wait() {
            self.notes
                .push(format!("ferry serve exited during the run ({st})"));
        }
        Ok(())
    }

    fn start_iperf3(&mut self) -> Option<(Server, u16)> {
        if self.o.iperf_streams.is_empty() {
            return None;
        }
        let Some(bin) = ferry_netem::find_in_path("iperf3") else {
            self.notes
                .push("iperf3 is not installed: no host ceiling (scripts/bench-deps.sh)".into());
            return None;
        };
        let res = free_port().and_then(|port| {
            let mut c = Command::new(bin);
            c.args(["-s", "-J", "-B", "127.0.0.1", "-p", &port.to_string()]);
            let mut s = spawn("iperf3-server", c, &self.logs)?;
            wait_ready(&mut s, port, |_| Some(()), 10)?;
            Ok((s, port))
        });
        res.map_err(|e| self.notes.push(format!("iperf3 server: {e:#}")))
            .ok()
    }

    fn start_rsync(&mut self) -> Option<(Server, PeerServer)> {
        let mut out = None;
        for &t in &self.o.peers {
            if t != Tool::Rsync {
                self.notes.push(format!(
                    "{t}: host mode drives only rsync's daemon among the peers"
                ));
                continue;
            }
            let info = peers::probe(t);
            if !info.installed {
                self.notes.push(format!("{t}: {}", info.note));
                continue;
            }
            let dir = self.o.out.join("rsync");
            let res = fs::create_dir_all(&dir)
                .map_err(anyhow::Error::from)
                .and_then(|_| peers::server_command(t, &self.o.work, "127.0.0.1", &dir, &self.logs))
                .and_then(|(c, ps)| {
                    let mut s = spawn("rsync", c, &self.logs)?;
                    s.own_log = ps.log.clone();
                    wait_ready(&mut s, ps.port, |_| Some(()), 15)?;
                    Ok((s, ps))
                });
            match res {
                Ok(v) => {
                    self.notes
                        .push(format!("rsync: {} ({})", info.version, info.note));
                    out = Some(v);
                }
                Err(e) => self.notes.push(format!("rsync daemon: {e:#}")),
            }
        }
        out
    }

    fn base_row(
        &self,
        tool: &str,
        transport: &str,
        dir: Direction,
        ds: Option<&Dataset>,
        run: u32,
    ) -> HostRow {
        HostRow {
            tool: tool.into(),
            transport: transport.into(),
            direction: dir.name().into(),
            dataset: ds.map_or("memory".into(), |d| d.label()),
            files: ds.map_or(0, |d| d.files()),
            bytes: ds.map_or(0, |d| d.bytes()),
            streams: 0,
            run,
            wall_s: 0.0,
            sync_s: 0.0,
            gibps: 0.0,
            client_cpu_s: None,
            server_cpu_s: None,
            client_cpu_s_per_gib: None,
            server_cpu_s_per_gib: None,
            verified: false,
            error: String::new(),
            started: now_unix(),
        }
    }

    /// `ferry probe net` per transport and direction, and iperf3 at each -P: once each.
    fn ceilings(&mut self, f: &Ferry, iperf_port: Option<u16>) -> Result<()> {
        if let Some(secs) = self.o.probe_secs {
            for &t in &self.o.transports {
                for &dir in &self.o.directions {
                    let row = self.probe_net(f, t, dir, secs);
                    self.record(row)?;
                }
            }
        }
        if let Some(port) = iperf_port {
            for &p in &self.o.iperf_streams {
                let row = self.iperf_run(port, p);
                self.record(row)?;
            }
        }
        Ok(())
    }

    fn probe_net(&self, f: &Ferry, t: Transport, dir: Direction, secs: u32) -> HostRow {
        let mut row = self.base_row(PROBE_NET, t.name(), dir, None, 1);
        let mut c = f.command(&self.o.ferry);
        c.args([
            "probe",
            "net",
            "--json",
            "--no-save",
            "--runs",
            "1",
            "--windows",
            "none",
        ])
        .args(["--seconds", &secs.to_string()])
        .arg(format!("127.0.0.1:{}", f.port));
        f.conn_args(&mut c, t);
        if dir == Direction::Get {
            c.arg("--download");
        }
        let res = cpu::run_measured(c, Duration::from_secs(secs as u64 * 12 + 60)).and_then(|m| {
            let _ = fs::write(
                self.logs
                    .join(format!("probe-net-{}-{}.json", t.name(), dir.name())),
                &m.outcome.stdout,
            );
            if !m.outcome.success {
                bail!(
                    "ferry probe net {}: {}",
                    m.outcome.code,
                    runner::short(&m.outcome.stderr)
                );
            }
            let v: serde_json::Value =
                serde_json::from_str(&m.outcome.stdout).context("probe net: no JSON")?;
            let best = v.get("best").context("probe net measured no point")?;
            let mbps = best
                .get("rate_mbps")
                .and_then(|x| x.as_f64())
                .unwrap_or(0.0);
            let streams = best.get("streams").and_then(|x| x.as_u64()).unwrap_or(0);
            Ok((mbps, streams as u16))
        });
        match res {
            Ok((mbps, streams)) => {
                row.gibps = mbps * 1e6 / 8.0 / GIB as f64;
                row.streams = streams;
                row.verified = true;
            }
            Err(e) => row.error = format!("{e:#}"),
        }
        row
    }

    fn iperf_run(&self, port: u16, p: u16) -> HostRow {
        let mut row = self.base_row(IPERF3, "tcp", Direction::Put, None, 1);
        row.streams = p;
        let secs = self.o.iperf_secs + self.o.iperf_omit;
        let mut c = Command::new("iperf3");
        c.args([
            "-c",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-J",
            "--get-server-output",
        ])
        .args(["-P", &p.to_string(), "-t", &secs.to_string()]);
        let res = cpu::run_measured(c, Duration::from_secs(secs as u64 + 60)).and_then(|m| {
            let r = iperf::parse(&m.outcome.stdout, false, self.o.iperf_omit as f64);
            if r.is_err() && !m.outcome.success {
                bail!(
                    "iperf3 {}: {}",
                    m.outcome.code,
                    runner::short(&m.outcome.stderr)
                );
            }
            Ok((r?, m.cpu_s))
        });
        match res {
            Ok((r, cpu_s)) => {
                row.bytes = r.bytes;
                row.wall_s = r.seconds;
                row.gibps = r.mean_mbps * 1e6 / 8.0 / GIB as f64;
                row.client_cpu_s = Some(cpu_s);
                row.verified = true;
            }
            Err(e) => row.error = format!("{e:#}"),
        }
        row
    }

    fn clear(&self, dest: &Path) -> Result<()> {
        if !self.o.keep_aside {
            data::remove_path(dest)?;
        }
        runner::make_dest(dest)
    }

    /// Local destination directory of a transfer (put: under the server's root).
    fn dest(&self, dir: Direction) -> PathBuf {
        self.o.work.join(match dir {
            Direction::Put => "put-dest",
            Direction::Get => "get-dest",
        })
    }

    fn ferry_run(&self, f: &Ferry, j: &Job<'_>) -> HostRow {
        let mut row = self.base_row("ferry", j.transport.name(), j.dir, Some(j.ds), j.run);
        let label = j.ds.label();
        let Some((src, want)) = self.sources.get(j.ds) else {
            row.error = "data set missing".into();
            return row;
        };
        let dest = self.dest(j.dir);
        if let Err(e) = self.clear(&dest) {
            row.error = format!("clearing the destination: {e:#}");
            return row;
        }
        let mut c = f.command(&self.o.ferry);
        let remote = format!("127.0.0.1:{}", f.port);
        match j.dir {
            Direction::Put => c.arg("put").arg(src).arg(format!("{remote}:/put-dest/")),
            Direction::Get => c
                .arg("get")
                .arg(format!("{remote}:/data/{label}"))
                .arg(format!("{}/", dest.display())),
        };
        c.arg("--json");
        f.conn_args(&mut c, j.transport);
        let pid = f.server.child.id();
        let report = self.logs.join(format!(
            "ferry-{}-{}-{label}-run{}.json",
            j.transport.name(),
            j.dir.name(),
            j.run
        ));
        self.measure(&mut row, c, pid, &dest, j.ds, &report);
        if row.error.is_empty() {
            let got = data::digest_path(&dest.join(&label));
            finish(&mut row, want, got);
        }
        row
    }

    /// Runs the client, times it until durable, and takes both ends' CPU seconds; leaves the
    /// verification to the caller.
    fn measure(
        &self,
        row: &mut HostRow,
        c: Command,
        server: u32,
        dest: &Path,
        ds: &Dataset,
        report: &Path,
    ) {
        if self.o.verbose {
            eprintln!("ferry-bench host: {c:?}");
        }
        runner::sync_all();
        let s0 = cpu::process_cpu_s(server);
        let m = match cpu::run_measured(c, runner::run_timeout(ds, self.o.max_run)) {
            Ok(m) => m,
            Err(e) => {
                row.error = format!("{e:#}");
                return;
            }
        };
        row.wall_s = m.outcome.wall.as_secs_f64();
        row.sync_s = runner::syncfs(dest).as_secs_f64();
        row.client_cpu_s = Some(m.cpu_s);
        let s1 = cpu::settled_cpu_s(server, Duration::from_secs(3));
        if let (Ok(a), Ok(b)) = (s0, s1) {
            row.server_cpu_s = Some((b - a).max(0.0));
        }
        let _ = fs::write(report, &m.outcome.stdout);
        if m.outcome.timed_out {
            row.error = format!("timed out after {:.0} s", row.wall_s);
        } else if !m.outcome.success {
            let mut msg = runner::short(&m.outcome.stderr);
            if msg.is_empty() {
                msg = runner::short(&m.outcome.stdout);
            }
            row.error = format!("{} {}: {msg}", row.tool, m.outcome.code);
        } else if skipped(&m.outcome.stdout) > 0 {
            row.error = "files were already at the destination: nothing was measured".into();
        }
    }

    fn peer_run(
        &self,
        s: &Server,
        ps: &PeerServer,
        ds: &Dataset,
        dir: Direction,
        run: u32,
    ) -> HostRow {
        let mut row = self.base_row(ps.tool.name(), "tcp", dir, Some(ds), run);
        let Some((_, want)) = self.sources.get(ds) else {
            row.error = "data set missing".into();
            return row;
        };
        let dest = self.dest(dir);
        if let Err(e) = self.clear(&dest) {
            row.error = format!("clearing the destination: {e:#}");
            return row;
        }
        let case = Case {
            tool: ps.tool,
            direction: dir,
            dataset: ds.clone(),
            streams: 1,
            block: None,
        };
        let c = match peers::client_command(ps, &case, "127.0.0.1", "127.0.0.1", &self.o.work) {
            Ok(c) => c,
            Err(e) => {
                row.error = format!("{e:#}");
                return row;
            }
        };
        let report = self.logs.join(format!(
            "{}-{}-{}-run{run}.out",
            ps.tool,
            dir.name(),
            ds.label()
        ));
        self.measure(&mut row, c, s.child.id(), &dest, ds, &report);
        if row.error.is_empty() {
            finish(&mut row, want, data::digest_path(&dest.join(ds.label())));
        }
        row
    }
}

/// Files ferry's `--json` report says it skipped (already there).
fn skipped(json: &str) -> u64 {
    serde_json::from_str::<serde_json::Value>(json)
        .ok()
        .and_then(|v| v.get("skipped").and_then(|x| x.as_u64()))
        .unwrap_or(0)
}

fn finish(row: &mut HostRow, want: &Digest, got: Result<Digest>) {
    match got {
        Ok(g) if &g == want => {
            row.verified = true;
            let t = row.wall_s + row.sync_s;
            if t > 0.0 {
                row.gibps = row.bytes as f64 / GIB as f64 / t;
            }
        }
        Ok(g) => {
            row.error = format!(
                "destination differs: {} files / {} bytes (source {} / {})",
                g.files, g.bytes, want.files, want.bytes
            )
        }
        Err(e) => row.error = format!("verifying: {e:#}"),
    }
}

/// Bytes the work directory must hold: every data set, the largest destination of each
/// direction, and the many-file destinations the sweep keeps aside until it ends
/// ([`runner::make_dest`]).
pub fn room_needed(o: &HostOptions) -> u64 {
    let per_ds = o.directions.len() as u64 * (o.transports.len() + o.peers.len()) as u64;
    let mut need = 0;
    let mut largest = 0;
    for ds in &o.datasets {
        need += ds.bytes();
        largest = largest.max(ds.bytes());
        if ds.files() > 2000 && o.keep_aside {
            need += ds.bytes() * per_ds * o.runs as u64;
        }
    }
    need + largest * o.directions.len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_from_the_server_log() {
        let hex = "ab".repeat(32);
        let log = format!("ferry serve: serving /w on 127.0.0.1:7070\n  key sha256:{hex}\n");
        assert_eq!(fingerprint_of(&log), Some(format!("sha256:{hex}")));
        assert_eq!(fingerprint_of("sha256:abc"), None);
        assert_eq!(fingerprint_of("nothing yet"), None);
    }

    #[test]
    fn transports_and_room() {
        assert_eq!(Transport::parse("TLS").unwrap(), Transport::Tls);
        assert_eq!(Transport::parse("no-encrypt").unwrap(), Transport::Plain);
        assert!(Transport::parse("ssl").is_err());
        let o = HostOptions {
            ferry: PathBuf::new(),
            work: PathBuf::new(),
            out: PathBuf::new(),
            datasets: vec![
                Dataset::File { bytes: GIB },
                Dataset::Tree {
                    files: 10_000,
                    file_bytes: 10 << 10,
                },
            ],
            directions: vec![Direction::Put, Direction::Get],
            transports: vec![Transport::Tls, Transport::Plain],
            runs: 5,
            iperf_streams: vec![],
            iperf_secs: 1,
            iperf_omit: 0,
            probe_secs: None,
            peers: vec![],
            max_run: Duration::from_secs(1),
            verbose: false,
            keep_aside: true,
        };
        let tree = 10_000 * (10 << 10);
        // Data, 2 × 2 × 5 kept tree copies, the largest copy per direction.
        assert_eq!(room_needed(&o), GIB + tree + 20 * tree + 2 * GIB);
        let tmpfs = HostOptions {
            keep_aside: false,
            ..o
        };
        assert_eq!(room_needed(&tmpfs), GIB + tree + 2 * GIB);
    }
}
