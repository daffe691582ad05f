//! Runs a plan: per link a bed (or the remote host), the servers inside its server namespace,
//! iperf3, then every case `runs` times (in rounds, so that drift spreads over all cases), each
//! run timed, synced and verified.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use ferry_netem::{BedConfig, Host, TestBed, CLIENT_ADDR, SERVER_ADDR};

use crate::data::{self, Digest};
use crate::iperf;
use crate::peers::{self, PeerInfo, PeerServer};
use crate::plan::{regime_name, Case, Dataset, Direction, IperfPoint, Link, Plan, Tool};
use crate::report::{CsvLog, Row};

pub const FERRY_PORT: u16 = 7070;
pub const IPERF_PORT: u16 = 5201;

/// Where the other end is.
#[derive(Clone, Debug)]
pub enum Target {
    /// The emulated WAN bed, one per link.
    Bed,
    /// A real `ferry serve` at host:port (ferry only).
    Remote {
        host: String,
        port: u16,
        token: String,
        /// An `iperf3 -s -J` there, if any.
        iperf3: Option<(String, u16)>,
    },
}

pub struct Options {
    pub ferry: PathBuf,
    /// Data sets in `work/data`, destinations `work/put-dest` and `work/get-dest`.
    pub work: PathBuf,
    pub out: PathBuf,
    pub target: Target,
    pub iperf_secs: u32,
    pub iperf_omit: u32,
    pub drop_caches: bool,
    /// One unrecorded ferry transfer per data set and direction before a link's first round
    /// (see [`Runner::warm_up`]).
    pub warmup: bool,
    pub verbose: bool,
    /// Longest a single run may take; a case that times out is not run again.
    pub max_run: Duration,
    /// The bed's routes start connections at this many segments (`ferry-netem up
    /// --initial-window`); None: the kernel's 10.
    pub initial_window: Option<u32>,
    /// Both bed hosts allow TCP Fast Open (`ferry-netem up --tcp-fastopen`).
    pub fast_open: bool,
    /// The bed server's `--catalog` (`--server-catalog`); None: serve's default.
    pub server_catalog: Option<String>,
}

/// Streams of the warm-up transfer: ferry's fixed default, so no profile is written.
const WARMUP_STREAMS: u16 = 4;

/// Per-process bookkeeping of a sweep.
pub struct Runner<'a> {
    opts: &'a Options,
    plan: &'a Plan,
    log: CsvLog,
    pub rows: Vec<Row>,
    sources: HashMap<Dataset, (PathBuf, Digest)>,
    pub peers: BTreeMap<Tool, PeerInfo>,
    /// Things worth saying in the summary (setup failures, bed notes).
    pub notes: Vec<String>,
    done: usize,
    total: usize,
    started: Instant,
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Output of a finished (or killed) client.
pub struct Outcome {
    pub success: bool,
    pub code: String,
    pub stdout: String,
    pub stderr: String,
    pub wall: Duration,
    pub timed_out: bool,
}

/// Runs `cmd` (its own process group), killing the group after `timeout`.
pub fn run_timed(mut cmd: Command, timeout: Duration) -> Result<Outcome> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let t0 = Instant::now();
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    let pid = child.id() as i32;
    let (tx, dog) = watchdog(pid, timeout);
    let out = child.wait_with_output()?;
    let wall = t0.elapsed();
    let _ = tx.send(());
    let timed_out = dog.join().unwrap_or(false);
    Ok(Outcome {
        success: out.status.success() && !timed_out,
        code: match out.status.code() {
            Some(c) => format!("exit {c}"),
            None => "killed".into(),
        },
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        wall,
        timed_out,
    })
}

/// Kills the process group `pid` once `timeout` has passed or the sweep is being stopped,
/// unless told first (a send on the returned channel, once the child is reaped). The thread
/// returns whether the timeout killed it.
pub(crate) fn watchdog(
    pid: i32,
    timeout: Duration,
) -> (mpsc::Sender<()>, std::thread::JoinHandle<bool>) {
    let (tx, rx) = mpsc::channel::<()>();
    let dog = std::thread::spawn(move || {
        // Wakes every 100 ms to see whether the sweep is being stopped.
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left.min(Duration::from_millis(100))) {
                Err(mpsc::RecvTimeoutError::Timeout)
                    if left.is_zero() || crate::stop::requested() =>
                {
                    // SAFETY: kill(2) on the child's process group.
                    unsafe { libc::kill(-pid, libc::SIGKILL) };
                    return left.is_zero();
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                _ => return false,
            }
        }
    });
    (tx, dog)
}

pub(crate) fn short(s: &str) -> String {
    let t: String = s
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" / ");
    if t.chars().count() > 300 {
        t.chars().take(300).collect::<String>() + "…"
    } else {
        t
    }
}

/// syncfs(2) of the file system holding `p`; returns how long it took.
pub(crate) fn syncfs(p: &Path) -> Duration {
    let t0 = Instant::now();
    if let Ok(f) = fs::File::open(p) {
        use std::os::fd::AsRawFd;
        // SAFETY: syncfs on an open fd.
        unsafe { libc::syncfs(f.as_raw_fd()) };
    }
    t0.elapsed()
}

pub(crate) fn sync_all() {
    // SAFETY: sync(2) has no arguments.
    unsafe { libc::sync() };
}

fn drop_page_cache() {
    sync_all();
    let _ = fs::write("/proc/sys/vm/drop_caches", "1");
}

/// A server process (inside the bed, or on loopback in host mode), stopped on drop.
pub(crate) struct Server {
    pub(crate) name: String,
    pub(crate) child: Child,
    pub(crate) log: PathBuf,
    /// The server's own log, when it writes one beside stdout/stderr.
    pub(crate) own_log: Option<PathBuf>,
}

impl Server {
    pub(crate) fn logs(&self) -> String {
        let mut t = fs::read_to_string(&self.log).unwrap_or_default();
        if let Some(p) = &self.own_log {
            t.push('\n');
            t.push_str(&fs::read_to_string(p).unwrap_or_default());
        }
        let lines: Vec<&str> = t.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(4)..].join("\n")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let pid = self.child.id() as i32;
        // SAFETY: signals to our own child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(3) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `/etc/netns/<ns>/{hosts,resolv.conf}`, which `ip netns exec` bind-mounts over /etc: names
/// for the two addresses and no unreachable DNS server (GridFTP looks addresses up and would
/// wait for DNS). Removed on drop.
struct NetnsEtc(Vec<PathBuf>);

impl NetnsEtc {
    fn create(bed: &TestBed) -> Result<NetnsEtc> {
        let mut dirs = Vec::new();
        // XRootD resolves the machine's host name: give it the namespace's own address.
        let hostname = read_hostname();
        for h in [Host::Client, Host::Server] {
            let d = Path::new("/etc/netns").join(bed.netns(h));
            fs::create_dir_all(&d)?;
            dirs.push(d.clone());
            let own = bed.addr(h);
            fs::write(
                d.join("hosts"),
                format!(
                    "127.0.0.1 localhost\n{own} {hostname}\n{CLIENT_ADDR} ferry-bench-client\n{SERVER_ADDR} ferry-bench-server\n"
                ),
            )?;
            fs::write(d.join("resolv.conf"), "options timeout:1 attempts:1\n")?;
        }
        Ok(NetnsEtc(dirs))
    }
}

impl Drop for NetnsEtc {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = fs::remove_dir_all(d);
        }
    }
}

fn read_hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Removes /etc/netns entries of beds whose process is gone.
fn reap_netns_etc() {
    let Ok(rd) = fs::read_dir("/etc/netns") else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let mut parts = name.split('-');
        if let (Some("fnm"), Some(pid)) = (parts.next(), parts.next()) {
            if let Ok(pid) = pid.parse::<u32>() {
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    let _ = fs::remove_dir_all(e.path());
                }
            }
        }
    }
}

fn wait_port(bed: &TestBed, port: u16, server: &mut Server, secs: u64) -> Result<()> {
    let addr = SocketAddr::from((SERVER_ADDR, port));
    let t0 = Instant::now();
    loop {
        let ok = bed
            .run_in(Host::Client, || {
                TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
            })
            .unwrap_or(false);
        if ok {
            return Ok(());
        }
        if let Ok(Some(st)) = server.child.try_wait() {
            bail!("{} exited ({st}): {}", server.name, short(&server.logs()));
        }
        if t0.elapsed() > Duration::from_secs(secs) {
            let log = server.logs();
            bail!(
                "{} does not accept on port {port} after {secs} s: {}",
                server.name,
                short(&log)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn spawn_server(bed: &TestBed, name: &str, cmd: &Command, logs: &Path) -> Result<Server> {
    let log = logs.join(format!("{name}.out"));
    let f = fs::File::create(&log)?;
    let mut c = bed.wrap(Host::Server, cmd);
    c.stdin(Stdio::null())
        .stdout(f.try_clone()?)
        .stderr(f)
        .process_group(0);
    let child = c.spawn().with_context(|| format!("starting {name}"))?;
    Ok(Server {
        name: name.into(),
        child,
        log,
        own_log: None,
    })
}

/// Timeout of one run: generous (a peer at 100 ms RTT can be slow), at most `cap`.
pub(crate) fn run_timeout(ds: &Dataset, cap: Duration) -> Duration {
    (Duration::from_secs(90)
        + Duration::from_secs_f64(ds.bytes() as f64 / 2e6)
        + Duration::from_millis(20 * ds.files()))
    .min(cap)
}

/// Destinations of earlier runs are moved aside, not deleted, until the sweep ends: right after
/// tens of thousands of deletions ext4 allocates new inodes slowly (it avoids reusing recently
/// freed ones for a while), which made a tree of small files measure 3× slower than into a
/// fresh directory: a property of the bench, not of the tool measured.
/// Deletes the destinations `make_dest` moved aside under `dir` (recursively one level of
/// directories below it, where the destinations live), at the end of a sweep.
pub fn empty_trash(dir: &Path) {
    fn walk(dir: &Path, depth: u32) {
        let Ok(rd) = fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let trash = e.file_name().to_string_lossy().starts_with(".bench-trash-");
            if trash {
                let _ = data::remove_path(&p);
            } else if depth > 0 && e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&p, depth - 1);
            }
        }
    }
    walk(dir, 2);
}

pub(crate) fn make_dest(p: &Path) -> Result<()> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    // Only many-file destinations: large files free few inodes, and keeping them would fill
    // the disk over a sweep.
    fn entries(p: &Path, budget: &mut u32) {
        let Ok(rd) = fs::read_dir(p) else { return };
        for e in rd.flatten() {
            if *budget == 0 {
                return;
            }
            *budget -= 1;
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                entries(&e.path(), budget);
            }
        }
    }
    let mut budget = 2000;
    entries(p, &mut budget);
    if budget == 0 {
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = p.file_name().map(|s| s.to_string_lossy().into_owned());
        let aside = p.with_file_name(format!(
            ".bench-trash-{}-{}-{n}",
            name.unwrap_or_default(),
            std::process::id()
        ));
        if fs::rename(p, &aside).is_err() {
            data::remove_path(p)?;
        }
    } else {
        data::remove_path(p)?;
    }
    fs::create_dir_all(p)?;
    // Peers' servers write as `nobody` (XRootD, GridFTP anonymous).
    fs::set_permissions(p, fs::Permissions::from_mode(0o777))?;
    Ok(())
}

/// Link identity as it appears in the CSV.
fn link_cols(link: Option<&Link>) -> (String, u32, String) {
    match link {
        Some(l) => (l.rate_label(), l.rtt_ms, regime_name(l.regime).into()),
        None => ("remote".into(), 0, "remote".into()),
    }
}

impl<'a> Runner<'a> {
    pub fn new(opts: &'a Options, plan: &'a Plan, peers: BTreeMap<Tool, PeerInfo>) -> Result<Self> {
        let log = CsvLog::create(&opts.out.join("results.csv"))?;
        let total = plan.runs_total();
        Ok(Runner {
            opts,
            plan,
            log,
            rows: Vec::new(),
            sources: HashMap::new(),
            peers,
            notes: Vec::new(),
            done: 0,
            total,
            started: Instant::now(),
        })
    }

    fn record(&mut self, row: Row) -> Result<()> {
        // A run cut short by the stop measured nothing: it is not recorded.
        crate::stop::check()?;
        self.done += 1;
        let el = self.started.elapsed().as_secs_f64();
        let eta = if self.done > 0 {
            el / self.done as f64 * (self.total.saturating_sub(self.done)) as f64
        } else {
            0.0
        };
        let status = if row.ok() {
            format!("{:8.1} Mbit/s", row.mbps)
        } else {
            format!(
                "FAILED: {}",
                row.error.chars().take(120).collect::<String>()
            )
        };
        eprintln!(
            "[{}/{} {:.0}s, eta {:.0}s] {} {} {} {}ms {} {} s={} b={} run {}: {}",
            self.done,
            self.total,
            el,
            eta,
            row.tool,
            row.direction,
            row.rate,
            row.rtt_ms,
            row.regime,
            row.dataset,
            row.streams,
            row.block,
            row.run,
            status
        );
        self.log.push(&row)?;
        self.rows.push(row);
        Ok(())
    }

    /// Generates (or reuses) every data set of the plan.
    pub fn prepare_data(&mut self) -> Result<()> {
        let dir = self.opts.work.join("data");
        fs::create_dir_all(&dir)?;
        // Peers' servers read the data as `nobody`.
        for p in [&self.opts.work, &dir] {
            let mode = fs::metadata(p)?.permissions().mode();
            fs::set_permissions(p, fs::Permissions::from_mode(mode | 0o755))?;
        }
        for ds in self.plan.datasets() {
            crate::stop::check()?;
            let t0 = Instant::now();
            eprintln!("ferry-bench: data set {} ...", ds.label());
            let (p, d) = data::ensure(&dir, &ds)?;
            eprintln!(
                "ferry-bench: data set {}: {} files, {} bytes, blake3 {} ({:.1} s)",
                ds.label(),
                d.files,
                d.bytes,
                &d.blake3[..16],
                t0.elapsed().as_secs_f64()
            );
            self.sources.insert(ds, (p, d));
        }
        sync_all();
        Ok(())
    }

    pub fn run(&mut self) -> Result<()> {
        match self.opts.target.clone() {
            Target::Bed => {
                reap_netns_etc();
                for lp in &self.plan.links {
                    crate::stop::check()?;
                    if let Err(e) = self.run_link(lp.link, &lp.iperf, &lp.cases) {
                        crate::stop::check()?;
                        let msg = format!("link {}: {e:#}", lp.link.label());
                        eprintln!("ferry-bench: {msg}");
                        self.notes.push(msg);
                    }
                }
            }
            Target::Remote { .. } => {
                // One "link": the real path. Cases of every planned link are the same set.
                let mut iperf: Vec<IperfPoint> = Vec::new();
                let mut cases: Vec<Case> = Vec::new();
                for lp in &self.plan.links {
                    for i in &lp.iperf {
                        if !iperf.contains(i) {
                            iperf.push(*i);
                        }
                    }
                    for c in &lp.cases {
                        if c.tool == Tool::Ferry && !cases.contains(c) {
                            cases.push(c.clone());
                        }
                    }
                }
                let with_iperf = matches!(
                    &self.opts.target,
                    Target::Remote {
                        iperf3: Some(_),
                        ..
                    }
                );
                let ni = if with_iperf { iperf.len() } else { 0 };
                self.total = (ni + cases.len()) * self.plan.runs as usize;
                self.run_remote(&iperf, &cases)?;
            }
        }
        Ok(())
    }

    fn run_link(&mut self, link: Link, iperf_pts: &[IperfPoint], cases: &[Case]) -> Result<()> {
        let opts = self.opts;
        eprintln!("ferry-bench: link {}", link.label());
        let bed = TestBed::up(BedConfig {
            rtt: Duration::from_millis(link.rtt_ms as u64),
            rate_bps: link.rate_bps,
            loss: 0.0,
            mtu: 9000,
            regime: link.regime,
            queue_bytes: None,
            initial_window: opts.initial_window,
            fast_open: opts.fast_open,
        })?;
        for n in bed.notes() {
            let n = format!("bed {}: {n}", link.label());
            if !self.notes.contains(&n) {
                self.notes.push(n);
            }
        }
        let tag = format!(
            "{}-{}ms-{}",
            link.rate_label(),
            link.rtt_ms,
            regime_name(link.regime)
        );
        let logs = opts.out.join("logs").join(&tag);
        fs::create_dir_all(&logs)?;
        fs::set_permissions(&logs, fs::Permissions::from_mode(0o777))?;
        let scratch = tempfile::Builder::new().prefix("ferry-bench-").tempdir()?;
        fs::set_permissions(scratch.path(), fs::Permissions::from_mode(0o755))?;
        let tools: Vec<Tool> = {
            let mut t: Vec<Tool> = cases.iter().map(|c| c.tool).collect();
            t.sort();
            t.dedup();
            t
        };
        let _etc = if tools.contains(&Tool::Gridftp) {
            Some(NetnsEtc::create(&bed)?)
        } else {
            None
        };
        let server_addr = SERVER_ADDR.to_string();
        let mut servers: Vec<Server> = Vec::new();

        // ferry serve
        let mut token = String::new();
        if tools.contains(&Tool::Ferry) {
            let token_file = scratch.path().join("ferry-token");
            let mut c = Command::new(&opts.ferry);
            c.arg("-q")
                .arg("serve")
                .arg("--root")
                .arg(&opts.work)
                .arg("--listen")
                .arg(format!("{server_addr}:{FERRY_PORT}"))
                .arg("--token-file")
                .arg(&token_file);
            if let Some(catalog) = &opts.server_catalog {
                c.arg("--catalog").arg(catalog);
            }
            let mut s = spawn_server(&bed, "ferry-serve", &c, &logs)?;
            wait_port(&bed, FERRY_PORT, &mut s, 15)?;
            servers.push(s);
            token = fs::read_to_string(&token_file)
                .context("reading ferry's token file")?
                .trim()
                .to_owned();
        }
        // iperf3 -s
        let mut iperf_ok = false;
        if !iperf_pts.is_empty() {
            match ferry_netem::find_in_path("iperf3") {
                None => self.notes.push(
                    "iperf3 is not installed: no ceiling measured (scripts/bench-deps.sh)".into(),
                ),
                Some(bin) => {
                    let mut c = Command::new(bin);
                    c.args(["-s", "-J", "-p", &IPERF_PORT.to_string()]);
                    let mut s = spawn_server(&bed, "iperf3-server", &c, &logs)?;
                    match wait_port(&bed, IPERF_PORT, &mut s, 10) {
                        Ok(()) => {
                            servers.push(s);
                            iperf_ok = true;
                        }
                        Err(e) => self.notes.push(format!("{tag}: iperf3 server: {e:#}")),
                    }
                }
            }
        }
        // peers
        let mut peer_servers: BTreeMap<Tool, PeerServer> = BTreeMap::new();
        for &t in tools.iter().filter(|t| t.is_peer()) {
            let installed = self.peers.get(&t).is_some_and(|p| p.installed);
            if !installed {
                let skipped = cases.iter().filter(|c| c.tool == t).count();
                self.total = self.total.saturating_sub(skipped * self.plan.runs as usize);
                continue;
            }
            let dir = scratch.path().join(t.name());
            fs::create_dir_all(&dir)?;
            let res = peers::server_command(t, &opts.work, &server_addr, &dir, &logs).and_then(
                |(cmd, ps)| {
                    let mut s = spawn_server(&bed, t.name(), &cmd, &logs)?;
                    s.own_log = ps.log.clone();
                    wait_port(&bed, ps.port, &mut s, 15)?;
                    Ok((s, ps))
                },
            );
            match res {
                Ok((s, ps)) => {
                    servers.push(s);
                    peer_servers.insert(t, ps);
                }
                Err(e) => {
                    let skipped = cases.iter().filter(|c| c.tool == t).count();
                    self.total = self.total.saturating_sub(skipped * self.plan.runs as usize);
                    let msg = format!("{t} server could not be started on {tag}: {e:#}");
                    eprintln!("ferry-bench: {msg}");
                    self.notes.push(msg);
                }
            }
        }

        if !iperf_ok {
            self.total = self
                .total
                .saturating_sub(iperf_pts.len() * self.plan.runs as usize);
        }
        let (rate, rtt, regime) = link_cols(Some(&link));
        self.warm_up(cases, |r, c| {
            r.ferry_run(
                Some(&bed),
                &server_addr,
                FERRY_PORT,
                &token,
                c,
                0,
                (&rate, rtt, &regime),
            )
        });
        let mut timed_out: Vec<Case> = Vec::new();
        for round in 1..=self.plan.runs {
            if iperf_ok {
                for p in iperf_pts {
                    let row = self.iperf_run(
                        Some(&bed),
                        &server_addr,
                        IPERF_PORT,
                        p,
                        round,
                        (&rate, rtt, &regime),
                    );
                    self.record(row)?;
                }
            }
            for case in cases {
                if timed_out.contains(case) {
                    continue;
                }
                let row = match case.tool {
                    Tool::Ferry => self.ferry_run(
                        Some(&bed),
                        &server_addr,
                        FERRY_PORT,
                        &token,
                        case,
                        round,
                        (&rate, rtt, &regime),
                    ),
                    t if t.is_peer() => match peer_servers.get(&t) {
                        Some(ps) => self.peer_run(&bed, ps, case, round, (&rate, rtt, &regime)),
                        None => continue,
                    },
                    _ => continue,
                };
                if row.error.starts_with("timed out") {
                    let left = (self.plan.runs - round) as usize;
                    self.total = self.total.saturating_sub(left);
                    timed_out.push(case.clone());
                }
                self.record(row)?;
            }
        }
        drop(servers);
        let stats = bed.down()?;
        let mut f = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(opts.out.join("beds.jsonl"))?;
        writeln!(f, "{}", serde_json::to_string(&stats)?)?;
        Ok(())
    }

    fn base_row(&self, tool: Tool, case: Option<&Case>, run: u32, l: (&str, u32, &str)) -> Row {
        let (dataset, files, bytes, dir, streams, used, block) = match case {
            Some(c) => (
                c.dataset.label(),
                c.dataset.files(),
                c.dataset.bytes(),
                c.direction.name().to_owned(),
                c.streams,
                c.streams_used(),
                c.block_label(),
            ),
            None => ("memory".into(), 0, 0, "put".into(), 0, 0, "-".into()),
        };
        Row {
            tool: tool.name().into(),
            direction: dir,
            rate: l.0.into(),
            rtt_ms: l.1,
            regime: l.2.into(),
            dataset,
            files,
            bytes,
            streams,
            streams_used: used,
            block,
            run,
            wall_s: 0.0,
            sync_s: 0.0,
            tool_s: None,
            mbps: 0.0,
            tool_mbps: None,
            verified: false,
            error: String::new(),
            started: now_unix(),
            ramp_s: None,
            link_mbps: None,
        }
    }

    fn iperf_run(
        &self,
        bed: Option<&TestBed>,
        host: &str,
        port: u16,
        p: &IperfPoint,
        run: u32,
        l: (&str, u32, &str),
    ) -> Row {
        let mut row = self.base_row(Tool::Iperf3, None, run, l);
        row.direction = p.direction.name().into();
        row.streams = p.streams;
        row.streams_used = p.streams;
        let secs = self.opts.iperf_secs + self.opts.iperf_omit;
        let mut cmd = match bed {
            Some(b) => b.command(Host::Client, "iperf3"),
            None => Command::new("iperf3"),
        };
        cmd.args([
            "-c",
            host,
            "-p",
            &port.to_string(),
            "-J",
            "--get-server-output",
        ])
        .args(["-P", &p.streams.to_string()]);
        let reverse = p.direction == Direction::Get;
        if reverse {
            cmd.arg("-R");
        }
        if let Some(n) = p.bytes {
            cmd.args(["-n", &n.to_string()]);
            row.dataset = iperf::same_bytes_label(n);
            let res = run_timed(cmd, Duration::from_secs(600)).and_then(|o| {
                if !o.success {
                    bail!("iperf3 {}: {}", o.code, short(&o.stderr));
                }
                let (sent, got) = iperf::sent_received_bytes(&o.stdout)?;
                // The receiver's count stops when the test ends, with the last bytes still in
                // flight; the process exits a round trip later, when they have arrived.
                if sent < n || got < n - n / 32 {
                    bail!("iperf3 -n {n} sent {sent} bytes, of which {got} were counted received");
                }
                Ok(o.wall)
            });
            match res {
                Ok(wall) => {
                    row.bytes = n;
                    row.wall_s = wall.as_secs_f64();
                    row.mbps = n as f64 * 8.0 / row.wall_s / 1e6;
                    row.verified = true;
                }
                Err(e) => row.error = format!("{e:#}"),
            }
            return row;
        }
        cmd.args(["-t", &secs.to_string()]);
        let res = run_timed(cmd, Duration::from_secs(secs as u64 + 60)).and_then(|o| {
            let r = iperf::parse(&o.stdout, reverse, self.opts.iperf_omit as f64);
            if r.is_err() && !o.success {
                bail!("iperf3 {}: {}", o.code, short(&o.stderr));
            }
            r
        });
        match res {
            Ok(r) => {
                row.bytes = r.bytes;
                row.wall_s = r.seconds;
                row.mbps = r.mean_mbps;
                row.tool_mbps = Some(r.median_mbps);
                row.verified = true;
                row.link_mbps = bed.and_then(|b| {
                    let c = b.config();
                    iperf::payload_capacity_mbps(c.rate_bps?, c.mtu, r.mss?)
                });
            }
            Err(e) => row.error = format!("{e:#}"),
        }
        row
    }

    /// Runs each ferry data set and direction of `cases` once, unrecorded, with the default
    /// fixed stream count (which writes no client profile).
    ///
    /// Why: cases run in the same order every round, so without it the first ferry case of a
    /// link — `--streams 0`, ferry's defaults, the one the issue-6 table is about — alone met a
    /// cold server, destination and page cache. In the 10,000-file sweeps of 2026-11-22 that
    /// first run was the slowest of its point in 12 of 13 points at 0 and 25 ms (6–18% below
    /// the best other run), 9 of 12 at 50 ms (up to 30%) and 7 of 13 at 100 ms (up to 9%): a
    /// 1.5-s transfer has no time to amortise it, and the medians leaned against the defaults.
    fn warm_up(&self, cases: &[Case], mut run: impl FnMut(&Self, &Case) -> Row) {
        if !self.opts.warmup {
            return;
        }
        let mut seen = Vec::new();
        for case in cases.iter().filter(|c| c.tool == Tool::Ferry) {
            let key = (case.direction, case.dataset.label());
            if seen.contains(&key) {
                continue;
            }
            seen.push(key);
            let warm = Case {
                streams: WARMUP_STREAMS,
                block: None,
                ..case.clone()
            };
            let row = run(self, &warm);
            let what = format!("{} {}", warm.direction.name(), warm.dataset.label());
            if row.ok() {
                eprintln!(
                    "ferry-bench: warm-up {what}: {:.0} Mbit/s (not recorded)",
                    row.mbps
                );
            } else {
                eprintln!(
                    "ferry-bench: warm-up {what} failed (not recorded): {}",
                    row.error
                );
            }
        }
    }

    fn before_run(&self) {
        if self.opts.drop_caches {
            drop_page_cache();
        } else {
            sync_all();
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn ferry_run(
        &self,
        bed: Option<&TestBed>,
        host: &str,
        port: u16,
        token: &str,
        case: &Case,
        run: u32,
        l: (&str, u32, &str),
    ) -> Row {
        let mut row = self.base_row(Tool::Ferry, Some(case), run, l);
        let remote = bed.is_none();
        let label = case.dataset.label();
        let (src_digest, local_src) = match self.sources.get(&case.dataset) {
            Some((p, d)) => (d.clone(), p.clone()),
            None => {
                row.error = "data set missing".into();
                return row;
            }
        };
        // Server-side paths, relative to the server's root.
        let base = if remote { "/ferry-bench" } else { "" };
        let (dest_local, final_local) = match case.direction {
            Direction::Put => {
                let d = self.opts.work.join("put-dest");
                (d.clone(), d.join(&label))
            }
            Direction::Get => {
                let d = self.opts.work.join("get-dest");
                (d.clone(), d.join(&label))
            }
        };
        if !(remote && case.direction == Direction::Put) {
            if let Err(e) = make_dest(&dest_local) {
                row.error = format!("clearing the destination: {e:#}");
                return row;
            }
        }
        let mut cmd = match bed {
            Some(b) => b.command(Host::Client, &self.opts.ferry),
            None => Command::new(&self.opts.ferry),
        };
        cmd.env("FERRY_TOKEN", token).arg("-q");
        match case.direction {
            Direction::Put => cmd
                .arg("put")
                .arg(&local_src)
                .arg(format!("{host}:{port}:{base}/put-dest/")),
            Direction::Get => cmd
                .arg("get")
                .arg(format!("{host}:{port}:{base}/data/{label}"))
                .arg(format!("{}/", dest_local.display())),
        };
        cmd.arg("--json");
        if remote && case.direction == Direction::Put {
            cmd.arg("--overwrite");
        }
        if case.streams != 0 {
            cmd.args(["--streams", &case.streams.to_string()]);
        }
        if let Some(b) = case.block {
            cmd.args(["--block-size", &b.to_string()]);
        }
        if !remote {
            // Every bed's server has the same address: one profile store per link, so that
            // what the tuner learnt at one RTT is not the start at another (a real route keeps
            // its RTT). The server's key and the pin stay shared.
            let dir = self
                .opts
                .out
                .join("ferry-state")
                .join("clients")
                .join(format!("{}-{}ms-{}", row.rate, row.rtt_ms, row.regime));
            let _ = fs::create_dir_all(&dir);
            cmd.env("FERRY_STATE_DIR", dir);
        }
        if remote && case.direction == Direction::Put {
            // The server still has the last run's copy: a new mtime makes this run send it all.
            if let Err(e) = data::restamp(&local_src, SystemTime::now()) {
                row.error = format!("{e:#}");
                return row;
            }
        }
        self.before_run();
        let out = match run_timed(cmd, run_timeout(&case.dataset, self.opts.max_run)) {
            Ok(o) => o,
            Err(e) => {
                row.error = format!("{e:#}");
                return row;
            }
        };
        row.wall_s = out.wall.as_secs_f64();
        if !remote || case.direction == Direction::Get {
            row.sync_s = syncfs(&dest_local).as_secs_f64();
        }
        // ferry's own report (tuning steps, timeline, per-stream TCP_INFO) for a closer look.
        let report = self.opts.out.join("logs").join(format!(
            "ferry-{}-{}ms-{}-{}-{}-s{}-{}-run{run}.json",
            row.rate, row.rtt_ms, row.regime, row.direction, label, case.streams, row.block
        ));
        let _ = fs::write(report, &out.stdout);
        let json = serde_json::from_str::<serde_json::Value>(&out.stdout).ok();
        if let Some(v) = &json {
            row.tool_s = v.get("seconds").and_then(|x| x.as_f64());
            row.ramp_s = crate::report::ramp_of_json(v);
            if let (Some(s), Some(b)) = (row.tool_s, v.get("bytes").and_then(|x| x.as_u64())) {
                if s > 0.0 {
                    row.tool_mbps = Some(b as f64 * 8.0 / s / 1e6);
                }
            }
        }
        if out.timed_out {
            row.error = format!("timed out after {:.0} s", out.wall.as_secs_f64());
            return row;
        }
        if !out.success {
            row.error = format!("ferry {}: {}", out.code, short(&out.stderr));
            return row;
        }
        // A run that found its data already there measured nothing: say so rather than report
        // a rate (a destination that was not emptied makes ferry skip or resume).
        if let Some(v) = &json {
            let skipped = v.get("skipped").and_then(|x| x.as_u64()).unwrap_or(0);
            if skipped > 0 {
                row.error = format!(
                    "{skipped} files were already at the destination: nothing was measured"
                );
                return row;
            }
        }
        // Verify what arrived.
        let got = if remote && case.direction == Direction::Put {
            self.fetch_back(host, port, token, &label)
        } else {
            data::digest_path(&final_local)
        };
        self.finish(&mut row, &src_digest, got);
        row
    }

    /// After a remote put: fetch the copy back (not timed) and digest it.
    fn fetch_back(&self, host: &str, port: u16, token: &str, label: &str) -> Result<Digest> {
        let d = self.opts.work.join("verify");
        make_dest(&d)?;
        let mut cmd = Command::new(&self.opts.ferry);
        cmd.env("FERRY_TOKEN", token)
            .arg("-q")
            .arg("get")
            .arg(format!("{host}:{port}:/ferry-bench/put-dest/{label}"))
            .arg(format!("{}/", d.display()));
        let o = run_timed(cmd, Duration::from_secs(3600))?;
        if !o.success {
            bail!("fetching the copy back to verify it: {}", short(&o.stderr));
        }
        let dg = data::digest_path(&d.join(label));
        let _ = data::remove_path(&d);
        dg
    }

    fn finish(&self, row: &mut Row, want: &Digest, got: Result<Digest>) {
        match got {
            Ok(g) if &g == want => {
                row.verified = true;
                let t = row.wall_s + row.sync_s;
                row.mbps = row.bytes as f64 * 8.0 / t / 1e6;
            }
            Ok(g) => {
                row.error = format!(
                    "destination differs: {} files / {} bytes / blake3 {}… (source {} / {} / {}…)",
                    g.files,
                    g.bytes,
                    &g.blake3[..12],
                    want.files,
                    want.bytes,
                    &want.blake3[..12]
                )
            }
            Err(e) => row.error = format!("verifying: {e:#}"),
        }
    }

    fn peer_run(
        &self,
        bed: &TestBed,
        ps: &PeerServer,
        case: &Case,
        run: u32,
        l: (&str, u32, &str),
    ) -> Row {
        let mut row = self.base_row(case.tool, Some(case), run, l);
        let label = case.dataset.label();
        let Some((_, src_digest)) = self.sources.get(&case.dataset).cloned() else {
            row.error = "data set missing".into();
            return row;
        };
        let dest = self.opts.work.join(match case.direction {
            Direction::Put => "put-dest",
            Direction::Get => "get-dest",
        });
        if let Err(e) = make_dest(&dest) {
            row.error = format!("clearing the destination: {e:#}");
            return row;
        }
        let cmd = match peers::client_command(
            ps,
            case,
            &SERVER_ADDR.to_string(),
            &CLIENT_ADDR.to_string(),
            &self.opts.work,
        ) {
            Ok(c) => c,
            Err(e) => {
                row.error = format!("{e:#}");
                return row;
            }
        };
        let cmd = bed.wrap(Host::Client, &cmd);
        if self.opts.verbose {
            eprintln!("ferry-bench: {cmd:?}");
        }
        self.before_run();
        let out = match run_timed(cmd, run_timeout(&case.dataset, self.opts.max_run)) {
            Ok(o) => o,
            Err(e) => {
                row.error = format!("{e:#}");
                return row;
            }
        };
        row.wall_s = out.wall.as_secs_f64();
        row.sync_s = syncfs(&dest).as_secs_f64();
        if out.timed_out {
            row.error = format!("timed out after {:.0} s", out.wall.as_secs_f64());
            return row;
        }
        if !out.success {
            let mut msg = short(&out.stderr);
            if msg.is_empty() {
                msg = short(&out.stdout);
            }
            row.error = format!("{} {}: {msg}", case.tool, out.code);
            return row;
        }
        let got = data::digest_path(&dest.join(&label));
        self.finish(&mut row, &src_digest, got);
        row
    }

    fn run_remote(&mut self, iperf_pts: &[IperfPoint], cases: &[Case]) -> Result<()> {
        let Target::Remote {
            host,
            port,
            token,
            iperf3,
        } = self.opts.target.clone()
        else {
            unreachable!()
        };
        // Gets need the data sets on the server: upload them once (not timed).
        let gets: Vec<Dataset> = {
            let mut v: Vec<Dataset> = cases
                .iter()
                .filter(|c| c.direction == Direction::Get)
                .map(|c| c.dataset.clone())
                .collect();
            v.sort();
            v.dedup();
            v
        };
        for ds in gets {
            let (p, _) = self.sources[&ds].clone();
            eprintln!("ferry-bench: uploading {} for the get cases", ds.label());
            let mut cmd = Command::new(&self.opts.ferry);
            cmd.env("FERRY_TOKEN", &token)
                .arg("-q")
                .arg("put")
                .arg(&p)
                .arg(format!("{host}:{port}:/ferry-bench/data/"))
                .arg("--skip-existing");
            let o = run_timed(cmd, Duration::from_secs(7200))?;
            if !o.success {
                return Err(anyhow!(
                    "uploading {} to {host}:{port}: {}",
                    ds.label(),
                    short(&o.stderr)
                ));
            }
        }
        // ferry's own reports go here, as on a bed (`ferry_run` writes one per run).
        fs::create_dir_all(self.opts.out.join("logs"))?;
        let l = link_cols(None);
        self.warm_up(cases, |r, c| {
            r.ferry_run(None, &host, port, &token, c, 0, (&l.0, l.1, &l.2))
        });
        for round in 1..=self.plan.runs {
            if let Some((ih, ip)) = &iperf3 {
                for p in iperf_pts {
                    let row = self.iperf_run(None, ih, *ip, p, round, (&l.0, l.1, &l.2));
                    self.record(row)?;
                }
            }
            for case in cases {
                let row = self.ferry_run(None, &host, port, &token, case, round, (&l.0, l.1, &l.2));
                self.record(row)?;
            }
        }
        Ok(())
    }
}
