//! Service mode (issue 40's bench): `ferry service` on one host and a `ferry serve` on each of
//! three server hosts, each behind its own emulated link (ferry-netem's `Topology`). N jobs, a
//! mix of small trees and single files, are submitted round robin over the links through the
//! HTTP API while a poller reads the API and `/metrics` and the service's RSS is sampled; every
//! job must end done with its destination identical to its source. Then one larger job runs on
//! one link that goes dark for a while and comes back, and must complete without anyone acting.
//! The bench records and reports; it asserts no timing.

use std::fs;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ferry_netem::{End, LinkConfig, Regime, Topology, TopologyConfig};
use ferry_service::api::SubmitRequest;
use ferry_service::client::Client;
use ferry_service::job::{now_ms, Job, State};
use hyper::Method;

use crate::data::{self, Digest};
use crate::mpgridftp::clear_dir;
use crate::plan::Dataset;
use crate::runner::{self, Server};
use crate::stop;
use crate::svcreport::{DarkOutcome, JobRow, Latencies, RssSample, SvcReport};
use crate::thirdparty::wait_ready;

/// The service's host is 0; server host i + 1 is at the far end of link i.
const SVC: usize = 0;
/// The emulated links, one per server.
pub const LINKS: usize = 3;
/// Each `ferry serve` listens on its link's address at this port.
const SERVE_PORT: u16 = 7100;
/// The service's API, on the service host's loopback (its own namespace).
const API: &str = "127.0.0.1:7080";
/// How often the poller (a dashboard: one connection kept open) reads the API.
const POLL_EVERY: Duration = Duration::from_millis(50);
/// How often a request on a new connection (as the CLI makes) is timed beside it: each of its
/// three endpoints about 270 times in an 80 s run (at 250 ms, some 110: a p99 that was the
/// second-worst request).
const FRESH_EVERY: Duration = Duration::from_millis(100);
/// How often the service's RSS is read.
const RSS_EVERY: Duration = Duration::from_secs(1);
/// The dark-link job runs this long before its link goes dark.
const DARK_AFTER: Duration = Duration::from_secs(2);
/// How long after the jobs phase the idle service's RSS is read.
const IDLE_READ_AFTER: Duration = Duration::from_secs(3);
/// Which link goes dark (the shortest: the job is still running when it does).
const DARK_LINK: usize = 0;

/// What a service run does.
pub struct SvcOptions {
    pub ferry: PathBuf,
    /// Data sets are made in `work/data`; the service's local root is `work/svc-local`, each
    /// server's root `work/svc-dest/s<i>`.
    pub work: PathBuf,
    pub out: PathBuf,
    pub jobs: usize,
    /// One RTT per link.
    pub rtts: Vec<Duration>,
    /// Each link's rate.
    pub rate: u64,
    pub regime: Regime,
    /// How long the dark link stays dark; zero skips the dark-link job.
    pub dark: Duration,
    /// The dark-link job's file.
    pub dark_bytes: u64,
    /// Bound on each phase's wait for its jobs to end.
    pub max_run: Duration,
    /// Which CPUs the service and its bed run on.
    pub placement: Placement,
}

/// Where the service and its bed run. The bed (the three `ferry serve`, the links' forwarder
/// threads, the bench's submitter and pollers) stands for other hosts and the service's
/// clients; shared, it takes the service's cores, and the API's tail is then mostly a wait
/// for a core (docs/bench/NOTEBOOK.md, "Issue 40: the service pinned off its bed").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// Every process on every CPU, as the scheduler places them (the bench's default, and
    /// its figures before placements).
    #[default]
    Shared,
    /// The service's process on `service`'s CPUs; the bench's threads (the links' forwarders
    /// and the API's clients among them) and the servers it starts on `bed`'s.
    Pinned {
        service: Vec<usize>,
        bed: Vec<usize>,
    },
}

impl Placement {
    /// From `--service-cpus` and `--bed-cpus`: both or neither, disjoint, each a CPU this
    /// process may run on.
    pub fn from_lists(service: Option<&str>, bed: Option<&str>) -> Result<Placement> {
        let (service, bed) = match (service, bed) {
            (None, None) => return Ok(Placement::Shared),
            (Some(s), Some(b)) => (
                parse_cpus(s).with_context(|| format!("--service-cpus {s:?}"))?,
                parse_cpus(b).with_context(|| format!("--bed-cpus {b:?}"))?,
            ),
            _ => {
                bail!("--service-cpus and --bed-cpus go together: the service's CPUs and its bed's")
            }
        };
        if let Some(c) = service.iter().find(|c| bed.contains(c)) {
            bail!("CPU {c} is in both --service-cpus and --bed-cpus: the bed is to stay off the service's CPUs");
        }
        let allowed = allowed_cpus()?;
        if let Some(c) = service.iter().chain(&bed).find(|c| !allowed.contains(c)) {
            bail!(
                "CPU {c}: not one this process may run on (it may run on {})",
                cpu_list(&allowed)
            );
        }
        Ok(Placement::Pinned { service, bed })
    }

    /// In words, for the report.
    pub fn describe(&self) -> String {
        match self {
            Placement::Shared => "shared: the service and its bed on every CPU".into(),
            Placement::Pinned { service, bed } => format!(
                "pinned: the service on CPU {}, its bed (servers, links, the bench's clients) on CPU {}",
                cpu_list(service),
                cpu_list(bed)
            ),
        }
    }
}

/// The most CPUs a list may name (glibc's `CPU_SETSIZE`).
const MAX_CPUS: usize = 1024;

/// A CPU list as taskset and the kernel write it: `0`, `0-3`, `0,2-3`; sorted, without
/// repeats. Anything else is an error that says why.
pub fn parse_cpus(s: &str) -> Result<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim) {
        let num = |t: &str| -> Result<usize> {
            let n: usize = t
                .parse()
                .map_err(|_| anyhow::anyhow!("{t:?} is not a CPU number"))?;
            if n >= MAX_CPUS {
                bail!("CPU {n}: CPUs are numbered below {MAX_CPUS}");
            }
            Ok(n)
        };
        if part.is_empty() {
            bail!("an empty entry: write CPUs as 0, 0-3 or 0,2-3");
        }
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a.trim())?, num(b.trim())?);
                if a > b {
                    bail!("{part:?}: a range goes from the lower CPU to the higher");
                }
                out.extend(a..=b);
            }
            None => out.push(num(part)?),
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// `cpus` as a list: `0-2,5`.
pub fn cpu_list(cpus: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

fn cpu_set(cpus: &[usize]) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is plain bits; all zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        // SAFETY: c < MAX_CPUS (parse_cpus), within the set's bits.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    set
}

/// The CPUs this process may run on.
fn allowed_cpus() -> Result<Vec<usize>> {
    // SAFETY: a zeroed set filled in by the kernel, its size given.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Err(std::io::Error::last_os_error()).context("sched_getaffinity");
    }
    // SAFETY: reading bits of an initialised set.
    Ok((0..MAX_CPUS)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Process `pid`'s `Cpus_allowed_list` (its main thread's), as /proc gives it.
fn allowed_list(pid: u32) -> Result<String> {
    let path = format!("/proc/{pid}/status");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|v| v.trim().to_owned())
        .with_context(|| format!("{path} has no Cpus_allowed_list"))
}

/// Puts thread `tid` (0: the calling one) on `cpus`.
fn set_affinity(tid: libc::pid_t, cpus: &[usize]) -> std::io::Result<()> {
    let set = cpu_set(cpus);
    // SAFETY: a valid set of the size given.
    if unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Puts every thread of this process on `cpus`; threads started later inherit it from the
/// thread that starts them, and processes from the thread that spawns them.
fn pin_this_process(cpus: &[usize]) -> Result<()> {
    for e in fs::read_dir("/proc/self/task").context("listing /proc/self/task")? {
        let name = e?.file_name();
        let Some(tid) = name.to_str().and_then(|t| t.parse::<libc::pid_t>().ok()) else {
            continue;
        };
        match set_affinity(tid, cpus) {
            Ok(()) => {}
            // A thread that ended since the listing.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(e) => return Err(e).with_context(|| format!("pinning thread {tid}")),
        }
    }
    Ok(())
}

impl SvcOptions {
    pub fn topology(&self) -> TopologyConfig {
        TopologyConfig {
            hosts: std::iter::once("svc".to_owned())
                .chain((1..=LINKS).map(|i| format!("s{i}")))
                .collect(),
            links: (0..LINKS)
                .map(|i| LinkConfig::new(SVC, i + 1, self.rtts[i], Some(self.rate)))
                .collect(),
            regime: self.regime,
        }
    }
}

/// The job mix, job j sending `mix()[mix_index(j)]`: small trees and single files of 1 to 4 MiB.
pub fn mix() -> Vec<Dataset> {
    let tree = Dataset::Tree {
        files: 10,
        file_bytes: 10 << 10,
    };
    vec![
        tree.clone(),
        Dataset::File { bytes: 1 << 20 },
        tree.clone(),
        Dataset::File { bytes: 2 << 20 },
        tree,
        Dataset::File { bytes: 4 << 20 },
    ]
}

/// Which of the mix job `j` sends: each link (job j goes over link j % 3) takes the whole mix
/// in turn, so that no link gets only the largest files.
fn mix_index(j: usize) -> usize {
    (j / LINKS) % mix().len()
}

/// Bytes the work directory must hold: the data sets, one copy of each job's data at its
/// server, the dark-link file and its copy (sources are hard links).
pub fn room_needed(o: &SvcOptions) -> u64 {
    let m = mix();
    let each: u64 = m.iter().map(Dataset::bytes).sum();
    let copies: u64 = (0..o.jobs).map(|j| m[mix_index(j)].bytes()).sum();
    each + copies + 2 * o.dark_bytes
}

/// The running bed: servers and service stop (on drop) before the namespaces go.
struct Bed {
    servers: Vec<Server>,
    service: Server,
    roots: Vec<PathBuf>,
    client: Client,
    topo: Topology,
}

impl Drop for Bed {
    fn drop(&mut self) {
        for r in &self.roots {
            let _ = clear_dir(r);
        }
    }
}

/// A link darkened for as long as this lives, lit again however the phase ends.
struct Dark<'t>(&'t Topology, usize);

impl Drop for Dark<'_> {
    fn drop(&mut self) {
        self.0.set_blackhole(self.1, false);
    }
}

/// Service mode's run and what it found.
pub struct SvcRunner<'a> {
    o: &'a SvcOptions,
    logs: PathBuf,
    pub report: SvcReport,
}

impl<'a> SvcRunner<'a> {
    pub fn new(o: &'a SvcOptions, report: SvcReport) -> Result<Self> {
        let logs = o.out.join("logs");
        fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
        Ok(SvcRunner { o, logs, report })
    }

    /// The data, the bed, the N jobs, the dark-link job. The bed is torn down however it ends.
    pub fn run(&mut self) -> Result<()> {
        if let Placement::Pinned { bed, .. } = &self.o.placement {
            // Before the bed starts: its forwarder threads, servers and clients inherit it.
            pin_this_process(bed)?;
        }
        let local = self.o.work.join("svc-local");
        let sets = self.prepare(&local)?;
        let bed = self.start_bed(&local)?;
        // Where the kernel lets each run, read back: the placement as it ran.
        let on = |pid: u32| allowed_list(pid).unwrap_or_else(|e| format!("not read: {e:#}"));
        self.report.cpus_service = on(bed.service.child.id());
        self.report.cpus_bed = on(std::process::id());
        let r = self.jobs_phase(&bed, &local, &sets);
        let r = r.and_then(|_| {
            if self.o.dark.is_zero() {
                return Ok(());
            }
            stop::check()?;
            self.dark_phase(&bed, &local)
        });
        // The queue empty again: whether what the jobs took was given back.
        std::thread::sleep(IDLE_READ_AFTER);
        self.report.rss_after_kib = rss_kib(bed.service.child.id());
        self.finish(bed);
        r
    }

    /// The mix's data sets (made once, kept) and the service's local root, emptied.
    fn prepare(&self, local: &Path) -> Result<Vec<(Dataset, PathBuf, Digest)>> {
        let mut sets: Vec<(Dataset, PathBuf, Digest)> = Vec::new();
        for ds in mix() {
            let made = sets.iter().find(|s| s.0 == ds).cloned();
            let set = match made {
                Some(s) => s,
                None => {
                    eprintln!("ferry-bench service: preparing {}", ds.label());
                    let (src, want) = data::ensure(&self.o.work.join("data"), &ds)?;
                    (ds, src, want)
                }
            };
            sets.push(set);
        }
        fs::create_dir_all(local).with_context(|| format!("creating {}", local.display()))?;
        clear_dir(local)?;
        Ok(sets)
    }

    fn finish(&mut self, mut bed: Bed) {
        let notes = &mut self.report.notes;
        notes.extend(bed.topo.notes().iter().cloned());
        for (link, e) in bed.topo.forwarder_errors() {
            notes.push(format!("link {link}: {e}"));
        }
        let all = bed
            .servers
            .iter_mut()
            .chain(std::iter::once(&mut bed.service));
        for s in all {
            if let Ok(Some(st)) = s.child.try_wait() {
                notes.push(format!("{} exited during the run ({st})", s.name));
            }
        }
    }

    fn start_bed(&self, local: &Path) -> Result<Bed> {
        let topo = Topology::up(self.o.topology()).context("the service topology")?;
        let state = self.o.out.join("ferry-state");
        // A fresh job database and servers' state each run (a reused --out keeps old ones).
        data::remove_path(&state)?;
        let mut servers = Vec::new();
        let mut roots = Vec::new();
        let mut endpoints = String::new();
        for link in 0..LINKS {
            let (s, root, token, fp) = self.serve(&topo, link, &state)?;
            endpoints.push_str(&format!(
                "[[endpoint]]\nserver = \"{}\"\ntoken = \"{token}\"\nfingerprint = \"{fp}\"\n\n",
                server_addr(&topo, link)
            ));
            servers.push(s);
            roots.push(root);
        }
        let svc_state = state.join("service");
        fs::create_dir_all(&svc_state)?;
        fs::write(svc_state.join("endpoints.toml"), endpoints)?;
        let token = self.token_add(&svc_state)?;
        let (service, fingerprint) = self.start_service(&topo, &svc_state, local)?;
        let client = Client {
            addr: API.into(),
            token,
            trust: ferry_service::tls::Trust::Pinned(
                fingerprint
                    .parse()
                    .with_context(|| format!("the service's fingerprint {fingerprint:?}"))?,
            ),
            timeout: Duration::from_secs(30),
            kept: None,
        };
        Ok(Bed {
            servers,
            service,
            roots,
            client,
            topo,
        })
    }

    /// `ferry serve` on link `link`'s server host with its own root, state and token; returns
    /// it, its root, token and fingerprint once it answers.
    fn serve(
        &self,
        topo: &Topology,
        link: usize,
        state: &Path,
    ) -> Result<(Server, PathBuf, String, String)> {
        let tag = format!("s{}", link + 1);
        let root = self.o.work.join("svc-dest").join(&tag);
        fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
        clear_dir(&root)?;
        let dir = state.join(format!("serve-{tag}"));
        fs::create_dir_all(&dir)?;
        let token_file = dir.join("token");
        let log = self.logs.join(format!("serve-{tag}.out"));
        let f = fs::File::create(&log)?;
        let addr = server_addr(topo, link);
        let mut c = Command::new(&self.o.ferry);
        c.env("FERRY_STATE_DIR", &dir)
            .env("XDG_CONFIG_HOME", dir.join("config"))
            .env_remove("FERRY_TOKEN")
            .arg("serve")
            .arg("--root")
            .arg(&root)
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--token-file")
            .arg(&token_file)
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .process_group(0);
        let name = format!("ferry serve {tag}");
        let child = topo
            .spawn_in(link + 1, c)
            .with_context(|| format!("starting {name}"))?;
        let mut server = Server {
            name,
            child,
            log,
            own_log: None,
        };
        let fp = wait_ready(topo, &mut server, addr, Duration::from_secs(20))?;
        let token = fs::read_to_string(&token_file)
            .with_context(|| format!("reading {}", token_file.display()))?
            .trim()
            .to_owned();
        Ok((server, root, token, fp))
    }

    /// `ferry token add` for the bench's own token on the service.
    fn token_add(&self, svc_state: &Path) -> Result<String> {
        let out = Command::new(&self.o.ferry)
            .args(["token", "add", "bench", "--tokens"])
            .arg(svc_state.join("tokens.toml"))
            .stdin(Stdio::null())
            .output()
            .context("running ferry token add")?;
        if !out.status.success() {
            bail!(
                "ferry token add: {}",
                runner::short(&String::from_utf8_lossy(&out.stderr))
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// `ferry service` on the service host; ready once its log gives its fingerprint and its
    /// API takes a connection.
    fn start_service(
        &self,
        topo: &Topology,
        svc_state: &Path,
        local: &Path,
    ) -> Result<(Server, String)> {
        let log = self.logs.join("service.out");
        let f = fs::File::create(&log)?;
        let mut c = Command::new(&self.o.ferry);
        c.env("FERRY_STATE_DIR", svc_state)
            .env("XDG_CONFIG_HOME", svc_state.join("config"))
            .env_remove("FERRY_TOKEN")
            .args(["service", "--listen", API, "--state"])
            .arg(svc_state)
            .arg("--local-root")
            .arg(local)
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .process_group(0);
        if let Placement::Pinned { service, .. } = &self.o.placement {
            let set = cpu_set(service);
            // SAFETY: sched_setaffinity is async-signal-safe; the set is built before the fork.
            unsafe {
                c.pre_exec(move || {
                    if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = topo.spawn_in(SVC, c).context("starting ferry service")?;
        let mut s = Server {
            name: "ferry service".into(),
            child,
            log,
            own_log: None,
        };
        let addr: SocketAddr = API.parse().expect("a socket address");
        let t0 = Instant::now();
        loop {
            let text = fs::read_to_string(&s.log).unwrap_or_default();
            let fp = text
                .lines()
                .find_map(|l| l.strip_prefix("ferry: certificate fingerprint "));
            let up = || TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok();
            if let Some(fp) = fp.map(|f| f.trim().to_owned()) {
                if topo.run_in(SVC, up).unwrap_or(false) {
                    return Ok((s, fp));
                }
            }
            if let Ok(Some(st)) = s.child.try_wait() {
                bail!("ferry service exited ({st}): {}", runner::short(&s.logs()));
            }
            if t0.elapsed() > Duration::from_secs(20) {
                bail!(
                    "ferry service not ready after 20 s: {}",
                    runner::short(&s.logs())
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// One job of the jobs phase: what it sends, over which link.
struct Planned {
    link: usize,
    /// Index into the mix.
    set: usize,
    source: String,
    dest: String,
}

/// What the jobs phase's tasks gathered.
struct PhaseOut {
    submit_ms: Vec<f64>,
    submit_errors: Vec<String>,
    /// Per planned job: its id, if the submit took.
    ids: Vec<Option<i64>>,
    /// Per planned job: its final state, if it could be read.
    jobs: Vec<Option<Job>>,
    submit_s: f64,
    wall_s: f64,
    timed_out: bool,
    lat: Latencies,
    rss: Vec<RssSample>,
    /// The service's RSS `IDLE_READ_AFTER` after the last job ended.
    rss_idle_kib: Option<u64>,
    /// The service's `/metrics` once every job ended: its own timing of the API's requests
    /// and of the store's lock, beside the client's.
    metrics_end: Option<String>,
}

/// What the poller and the sampler share with the phase.
#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    newest_id: AtomicI64,
    lat: Mutex<Latencies>,
}

impl SvcRunner<'_> {
    /// Each job's source (hard links of the mix's data under the local root) and link.
    fn plan_jobs(&self, local: &Path, sets: &[(Dataset, PathBuf, Digest)]) -> Result<Vec<Planned>> {
        let dir = local.join("jobs");
        fs::create_dir_all(&dir)?;
        let mut v = Vec::with_capacity(self.o.jobs);
        for j in 0..self.o.jobs {
            let set = mix_index(j);
            let name = format!("j{j}");
            link_copy(&sets[set].1, &dir.join(&name))?;
            v.push(Planned {
                link: j % LINKS,
                set,
                source: format!("/jobs/{name}"),
                dest: String::new(),
            });
        }
        Ok(v)
    }

    /// The N jobs: submitted, watched, waited for, then each checked against its source.
    fn jobs_phase(
        &mut self,
        bed: &Bed,
        local: &Path,
        sets: &[(Dataset, PathBuf, Digest)],
    ) -> Result<()> {
        let mut plan = self.plan_jobs(local, sets)?;
        for p in &mut plan {
            p.dest = format!("{}:/", server_addr(&bed.topo, p.link));
        }
        eprintln!(
            "ferry-bench service: submitting {} jobs over {LINKS} links",
            plan.len()
        );
        let client = bed.client.clone();
        let pid = bed.service.child.id();
        let max_run = self.o.max_run;
        let work: Vec<(String, String)> = plan
            .iter()
            .map(|p| (p.source.clone(), p.dest.clone()))
            .collect();
        let out = bed.topo.run_in(SVC, move || -> Result<PhaseOut> {
            runtime()?.block_on(run_jobs(client, work, pid, max_run))
        })??;
        self.record_jobs(bed, &plan, sets, out);
        Ok(())
    }

    /// The phase's figures into the report, each done job's destination verified.
    fn record_jobs(
        &mut self,
        bed: &Bed,
        plan: &[Planned],
        sets: &[(Dataset, PathBuf, Digest)],
        out: PhaseOut,
    ) {
        let r = &mut self.report;
        r.submit_s = out.submit_s;
        r.wall_s = out.wall_s;
        r.timed_out = out.timed_out;
        r.submit_ms = out.submit_ms;
        r.submit_errors = out.submit_errors;
        r.latencies = out.lat;
        r.rss = out.rss;
        r.rss_idle_kib = out.rss_idle_kib;
        if let Some(m) = &out.metrics_end {
            r.store_lock = crate::svcreport::lock_takes(m);
            let path = self.logs.join("service-metrics.txt");
            if let Err(e) = fs::write(&path, m) {
                r.notes.push(format!("{}: {e}", path.display()));
            }
        }
        for (j, p) in plan.iter().enumerate() {
            let (ds, _, want) = &sets[p.set];
            let mut row = JobRow {
                index: j,
                id: out.ids[j],
                link: p.link,
                dataset: ds.label(),
                ..Default::default()
            };
            match &out.jobs[j] {
                Some(job) => {
                    row.fill(job);
                    if job.state == State::Done {
                        let got = bed.roots[p.link].join(format!("j{j}"));
                        row.check(&got, want);
                    }
                }
                None if out.ids[j].is_some() => row.error = "its state could not be read".into(),
                None => row.error = "not submitted".into(),
            }
            r.rows.push(row);
        }
        r.summarize();
        eprintln!(
            "ferry-bench service: {} of {} jobs done and verified in {:.1} s",
            r.verified_jobs, r.jobs, r.wall_s
        );
    }

    /// One larger job over a link that goes dark for a while once it runs, then comes back.
    fn dark_phase(&mut self, bed: &Bed, local: &Path) -> Result<()> {
        let ds = Dataset::File {
            bytes: self.o.dark_bytes,
        };
        eprintln!("ferry-bench service: preparing {}", ds.label());
        let (src, want) = data::ensure(&self.o.work.join("data"), &ds)?;
        link_copy(&src, &local.join("dark"))?;
        let req = request(
            "/dark".into(),
            format!("{}:/", server_addr(&bed.topo, DARK_LINK)),
        );
        eprintln!(
            "ferry-bench service: the dark-link job ({}, link {DARK_LINK} dark for {} s)",
            ds.label(),
            self.o.dark.as_secs()
        );
        let (client, topo, o) = (&bed.client, &bed.topo, self.o);
        let mut outcome = topo.run_in(SVC, || -> Result<DarkOutcome> {
            runtime()?.block_on(dark_job(client, topo, &req, o.dark, o.max_run))
        })??;
        outcome.dataset = ds.label();
        outcome.link = DARK_LINK;
        if outcome.state == "done" {
            let mut row = JobRow::default();
            row.check(&bed.roots[DARK_LINK].join("dark"), &want);
            outcome.verified = row.verified;
            outcome.verify_error = row.error;
        }
        eprintln!(
            "ferry-bench service: the dark-link job ended {} after {} attempt(s), {:.1} s",
            outcome.state, outcome.attempts, outcome.total_s
        );
        self.report.dark = Some(outcome);
        Ok(())
    }
}

/// A runtime for the API's client, on the thread (and so in the namespace) that builds it:
/// its worker threads inherit the namespace.
fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("a runtime for the API client")
}

fn request(source: String, dest: String) -> SubmitRequest {
    SubmitRequest {
        sources: vec![source],
        dest,
        sync: None,
        priority: 0,
        deadline: None,
        label: "ferry-bench".into(),
    }
}

/// Submits every job (timing each), then waits, bounded by `max_run`, until `/metrics` counts
/// them all ended, while the poller and the RSS sampler run; then reads each job.
async fn run_jobs(
    client: Client,
    work: Vec<(String, String)>,
    pid: u32,
    max_run: Duration,
) -> Result<PhaseOut> {
    let shared = Arc::new(Shared::default());
    // The submitter and the poller each keep a connection open, as a script or a dashboard
    // would; the fresh poller makes a new one for each request, as the CLI does, and, as a
    // CLI is a process of its own, on a runtime of its own: on this one its requests also
    // timed the bench's other clients' work (encoding a submit, parsing a listing).
    let kept = |c: &Client| Client {
        kept: Some(Default::default()),
        ..c.clone()
    };
    let poller = tokio::spawn(poll(kept(&client), shared.clone()));
    let fresh = {
        let (client, shared) = (client.clone(), shared.clone());
        // A thread started here is in the service host's namespace, as this one is.
        std::thread::Builder::new()
            .name("fresh-poller".into())
            .spawn(move || -> Result<()> {
                runtime()?.block_on(poll_fresh(client, shared));
                Ok(())
            })
            .context("a thread for the fresh poller")?
    };
    let sampler = tokio::spawn(sample_rss(pid, shared.clone()));
    let client = kept(&client);
    let t0 = Instant::now();
    let (mut submit_ms, mut submit_errors, mut ids) = (Vec::new(), Vec::new(), Vec::new());
    for (source, dest) in work {
        let t = Instant::now();
        match client.submit(&request(source, dest)).await {
            Ok(job) => {
                submit_ms.push(ms(t.elapsed()));
                shared.newest_id.store(job.id, Ordering::Relaxed);
                ids.push(Some(job.id));
            }
            Err(e) => {
                submit_errors.push(e.to_string());
                ids.push(None);
            }
        }
    }
    let submit_s = t0.elapsed().as_secs_f64();
    let want = ids.iter().flatten().count() as u64;
    let mut timed_out = false;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if ended(&client).await.is_ok_and(|n| n >= want) {
            break;
        }
        // A service that died (its status has no VmRSS) ends no more jobs: not waited for.
        if t0.elapsed() > max_run || stop::check().is_err() || rss_kib(pid).is_none() {
            timed_out = true;
            break;
        }
    }
    let wall_s = t0.elapsed().as_secs_f64();
    shared.stop.store(true, Ordering::Relaxed);
    let _ = poller.await;
    match tokio::task::spawn_blocking(move || fresh.join()).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => bail!("the fresh poller: {e:#}"),
        _ => bail!("the fresh poller's thread panicked"),
    }
    let rss = sampler.await.unwrap_or_default();
    // Every job ended: what the service holds once idle (it gives back what they had in
    // flight when the last one ends).
    tokio::time::sleep(IDLE_READ_AFTER).await;
    let rss_idle_kib = rss_kib(pid);
    let metrics_end = client
        .request(Method::GET, "/metrics", Vec::new(), false)
        .await
        .ok()
        .map(|a| String::from_utf8_lossy(&a.body).into_owned());
    let mut jobs = Vec::with_capacity(ids.len());
    for id in &ids {
        jobs.push(match id {
            Some(id) => client.job(*id).await.ok(),
            None => None,
        });
    }
    let lat = std::mem::take(&mut *shared.lat.lock().expect("not poisoned"));
    Ok(PhaseOut {
        submit_ms,
        submit_errors,
        ids,
        jobs,
        submit_s,
        wall_s,
        timed_out,
        lat,
        rss,
        rss_idle_kib,
        metrics_end,
    })
}

/// Jobs done, failed or cancelled, as `/metrics` counts them.
async fn ended(client: &Client) -> Result<u64> {
    let a = client
        .request(Method::GET, "/metrics", Vec::new(), false)
        .await?;
    let text = String::from_utf8_lossy(&a.body);
    Ok(metric_ended(&text))
}

/// The sum of `ferry_service_jobs` over the final states in Prometheus text.
pub fn metric_ended(text: &str) -> u64 {
    ["done", "failed", "cancelled"]
        .iter()
        .filter_map(|st| {
            let key = format!("ferry_service_jobs{{state=\"{st}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(key.as_str()))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .sum()
}

/// Every `FRESH_EVERY` until stopped, each on a new TLS connection: the job list, the newest
/// job, `/metrics` in turn, timed under their names with " (new connection)".
async fn poll_fresh(client: Client, shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(FRESH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut turn = 0usize;
    while !shared.stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let t = Instant::now();
        let (name, r) = match turn % 3 {
            0 => ("GET /api/jobs", client.jobs(100).await.map(|_| ())),
            1 => {
                let id = shared.newest_id.load(Ordering::Relaxed).max(1);
                ("GET /api/jobs/{id}", client.job(id).await.map(|_| ()))
            }
            _ => ("GET /metrics", metrics_ok(&client).await),
        };
        turn += 1;
        shared.record(&format!("{name} (new connection)"), t, r);
    }
}

async fn metrics_ok(client: &Client) -> Result<(), ferry_service::ServiceError> {
    let a = client
        .request(Method::GET, "/metrics", Vec::new(), false)
        .await?;
    match a.status {
        200 => Ok(()),
        s => Err(ferry_service::ServiceError::Invalid(format!("status {s}"))),
    }
}

/// Every `POLL_EVERY` until stopped, over one kept connection: the job list, the newest job,
/// `/metrics`, each timed.
async fn poll(client: Client, shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(POLL_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !shared.stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let t = Instant::now();
        let r = client.jobs(100).await.map(|_| ());
        shared.record("GET /api/jobs", t, r);
        let id = shared.newest_id.load(Ordering::Relaxed);
        if id > 0 {
            let t = Instant::now();
            let r = client.job(id).await.map(|_| ());
            shared.record("GET /api/jobs/{id}", t, r);
        }
        let t = Instant::now();
        let r = metrics_ok(&client).await;
        shared.record("GET /metrics", t, r);
    }
}

impl Shared {
    fn record(&self, endpoint: &str, t: Instant, r: Result<(), ferry_service::ServiceError>) {
        let took = ms(t.elapsed());
        let mut lat = self.lat.lock().expect("not poisoned");
        match r {
            Ok(()) => lat.add(endpoint, took),
            Err(e) => lat.error(endpoint, e.to_string()),
        }
    }
}

/// The service's resident memory every `RSS_EVERY` until stopped.
async fn sample_rss(pid: u32, shared: Arc<Shared>) -> Vec<RssSample> {
    let t0 = Instant::now();
    let mut v = Vec::new();
    let mut tick = tokio::time::interval(RSS_EVERY);
    while !shared.stop.load(Ordering::Relaxed) {
        tick.tick().await;
        if let Some(kib) = rss_kib(pid) {
            v.push(RssSample {
                t_s: t0.elapsed().as_secs_f64(),
                rss_kib: kib,
            });
        }
    }
    v
}

/// VmRSS of process `pid`, KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The dark-link job: submitted, darkened `DARK_AFTER` into its run for `dark`, lit again,
/// and watched until it ends (bounded by `max_run`); what changed is kept as events.
async fn dark_job(
    client: &Client,
    topo: &Topology,
    req: &SubmitRequest,
    dark: Duration,
    max_run: Duration,
) -> Result<DarkOutcome> {
    let t0 = Instant::now();
    let id = client.submit(req).await?.id;
    let mut out = DarkOutcome {
        dark_s: dark.as_secs_f64(),
        ..Default::default()
    };
    let mut seen = None;
    loop {
        let j = watch_once(client, id, t0, &mut seen, &mut out.events).await?;
        if j.state != State::Queued || t0.elapsed() > max_run {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(DARK_AFTER).await;
    let j = watch_once(client, id, t0, &mut seen, &mut out.events).await?;
    if !j.state.is_final() {
        let guard = Dark(topo, DARK_LINK);
        topo.set_blackhole(DARK_LINK, true);
        out.events.push(format!(
            "{:.1} s: link {DARK_LINK} dark, {} of {} bytes moved",
            t0.elapsed().as_secs_f64(),
            j.bytes_done,
            j.bytes_total
        ));
        let until = Instant::now() + dark;
        while Instant::now() < until {
            tokio::time::sleep(Duration::from_secs(1).min(until - Instant::now())).await;
            watch_once(client, id, t0, &mut seen, &mut out.events).await?;
        }
        drop(guard);
        let j = client.job(id).await?;
        out.events.push(format!(
            "{:.1} s: link {DARK_LINK} back, {} of {} bytes moved",
            t0.elapsed().as_secs_f64(),
            j.bytes_done,
            j.bytes_total
        ));
    } else {
        out.events
            .push("the job ended before the link went dark: give it a larger file".into());
    }
    let lit = Instant::now();
    let job = loop {
        let j = watch_once(client, id, t0, &mut seen, &mut out.events).await?;
        if j.state.is_final() || t0.elapsed() > max_run + dark {
            break j;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    out.state = job.state.as_str().into();
    out.attempts = job.attempts;
    out.last_error = job.last_error.clone().unwrap_or_default();
    out.total_s = t0.elapsed().as_secs_f64();
    out.after_back_s = lit.elapsed().as_secs_f64();
    out.job_s = match (job.started_ms, job.finished_ms) {
        (_, Some(f)) => (f - job.created_ms) as f64 / 1000.0,
        _ => (now_ms() - job.created_ms) as f64 / 1000.0,
    };
    Ok(out)
}

/// Reads job `id`; a change of state, attempts or error since `seen` becomes an event.
async fn watch_once(
    client: &Client,
    id: i64,
    t0: Instant,
    seen: &mut Option<(State, u32, Option<String>)>,
    events: &mut Vec<String>,
) -> Result<Job> {
    let j = client.job(id).await?;
    let now = (j.state, j.attempts, j.last_error.clone());
    if seen.as_ref() != Some(&now) {
        events.push(format!(
            "{:.1} s: {}, attempt {}, {} of {} bytes{}",
            t0.elapsed().as_secs_f64(),
            j.state.as_str(),
            j.attempts,
            j.bytes_done,
            j.bytes_total,
            j.last_error
                .as_deref()
                .map(|e| format!(", error: {e}"))
                .unwrap_or_default()
        ));
        *seen = Some(now);
    }
    Ok(j)
}

/// `src` (a file or a tree) at `dst` as hard links: the jobs' sources cost no room.
fn link_copy(src: &Path, dst: &Path) -> Result<()> {
    data::remove_path(dst)?;
    let meta = fs::metadata(src).with_context(|| format!("reading {}", src.display()))?;
    if meta.is_file() {
        return fs::hard_link(src, dst).with_context(|| format!("linking {}", dst.display()));
    }
    fs::create_dir_all(dst)?;
    for e in fs::read_dir(src)? {
        let e = e?;
        link_copy(&e.path(), &dst.join(e.file_name()))?;
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The address and port of link `link`'s server.
fn server_addr(t: &Topology, link: usize) -> SocketAddr {
    SocketAddr::from((t.addr(link, End::B), SERVE_PORT))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> SvcOptions {
        SvcOptions {
            ferry: "ferry".into(),
            work: "/w".into(),
            out: "/o".into(),
            jobs: 1000,
            rtts: [20, 50, 100].map(Duration::from_millis).to_vec(),
            rate: 300_000_000,
            regime: Regime::Default,
            dark: Duration::from_secs(60),
            dark_bytes: 200 << 20,
            max_run: Duration::from_secs(900),
            placement: Placement::Shared,
        }
    }

    #[test]
    fn each_server_has_its_own_link_to_the_service() {
        let t = opts().topology();
        assert_eq!(t.hosts, ["svc", "s1", "s2", "s3"]);
        let l: Vec<_> = t
            .links
            .iter()
            .map(|l| (l.a, l.b, l.rtt.as_millis(), l.rate_bps))
            .collect();
        let r = Some(300_000_000);
        assert_eq!(l, [(0, 1, 20, r), (0, 2, 50, r), (0, 3, 100, r)]);
    }

    #[test]
    fn the_mix_is_small_trees_and_files_of_one_to_four_mib() {
        let m = mix();
        assert_eq!(
            m.iter()
                .filter(|d| matches!(d, Dataset::Tree { .. }))
                .count(),
            3
        );
        let files: Vec<u64> = m
            .iter()
            .filter_map(|d| match d {
                Dataset::File { bytes } => Some(*bytes >> 20),
                _ => None,
            })
            .collect();
        assert_eq!(files, [1, 2, 4]);
        let each: u64 = m.iter().map(Dataset::bytes).sum();
        let mut o = opts();
        o.jobs = 18;
        assert_eq!(room_needed(&o), 4 * each + 2 * (200 << 20));
        let per_link: Vec<Vec<usize>> = (0..LINKS)
            .map(|l| (0..18).filter(|j| j % LINKS == l).map(mix_index).collect())
            .collect();
        assert_eq!(per_link, vec![vec![0, 1, 2, 3, 4, 5]; 3]);
    }

    #[test]
    fn ended_jobs_are_read_from_the_metrics() {
        let text = "# TYPE ferry_service_jobs gauge\n\
                    ferry_service_jobs{state=\"queued\"} 5\n\
                    ferry_service_jobs{state=\"running\"} 2\n\
                    ferry_service_jobs{state=\"done\"} 40\n\
                    ferry_service_jobs{state=\"failed\"} 1\n\
                    ferry_service_jobs{state=\"cancelled\"} 0\n\
                    ferry_service_queue_depth 5\n";
        assert_eq!(metric_ended(text), 41);
        assert_eq!(metric_ended(""), 0);
    }
}
