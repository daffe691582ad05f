//! Multipath mode (issue 38, striping): one client and one server joined by K parallel links
//! (ferry-netem's `Topology`, like two or three network cards each). For each K of `--paths`
//! a `ferry serve` listens on the server's address on each of the first K links, and the client
//! puts with `--bind` its address on each (K = 1: a plain put over link 0, the baseline). Each
//! round runs every K in turn on every data set, so that the K values meet the same machine
//! conditions; the links count what each carried. GridFTP, striped over the same links, runs
//! beside it when installed ([`mpgridftp`]). What it shows: whether K links give K times one
//! link's rate.
//!
//! With `--stripe-hosts` the K links go to K server hosts instead (s1 to sK, one link each),
//! whose servers share one directory, as the hosts of one site share a parallel file system:
//! s1 coordinates, s2 to sK run `serve --stripe`, and the client puts to s1 with `--stripe`
//! over the others (issue 38's striped transfers; K = 1 is the same plain put).

use std::fs;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use ferry_netem::{End, LinkConfig, Regime, Topology, TopologyConfig};

use crate::data::{self, Digest};
use crate::mpgridftp::{self, clear_dir, GridServers};
use crate::mpiperf;
use crate::mpreport::{MpCeiling, MpRow};
use crate::plan::Dataset;
use crate::runner::{self, Server};
use crate::stop;
use crate::thirdparty::wait_ready;

/// Hosts, in the topology's order: the client, the server (s1 with `--stripe-hosts`, then s2...).
const HOSTS: [&str; 2] = ["c", "s"];
const CLIENT: usize = 0;
const SERVER: usize = 1;
/// The server for K paths listens on `BASE_PORT + K` on each of the first K links.
const BASE_PORT: u16 = 7000;
/// The most links a run may ask for: enough for the K = 3 and a margin.
pub const MAX_PATHS: usize = 8;

/// What a multipath run does.
pub struct MpOptions {
    pub ferry: PathBuf,
    /// Data sets are kept in `work/data` (shared with the other modes); each K's server writes
    /// into `work/mp-dest/k<K>`, emptied before each transfer.
    pub work: PathBuf,
    pub out: PathBuf,
    /// The file and/or the tree, in the order each round runs them.
    pub datasets: Vec<Dataset>,
    /// The K values, in the order each round runs them.
    pub paths: Vec<usize>,
    pub rtt: Duration,
    /// Each link's rate.
    pub rate: u64,
    pub regime: Regime,
    pub runs: u32,
    /// One unrecorded put per K and data set first, so that the first recorded round does not
    /// alone meet a cold server, a path the client has not tuned on, and a cold destination.
    pub warmup: bool,
    pub max_run: Duration,
    pub verbose: bool,
    /// Run GridFTP (striped for K > 1) after ferry at each K.
    pub gridftp: bool,
    /// Measure iperf3 over the K links at once, per K, before the transfers, for this long.
    pub iperf3: Option<mpiperf::Span>,
    /// Link i goes to server host i (all sharing one directory) and the put stripes over them.
    pub stripe: bool,
}

impl MpOptions {
    fn links(&self) -> usize {
        self.paths.iter().copied().max().unwrap_or(1)
    }

    fn topology(&self) -> TopologyConfig {
        let hosts = if self.stripe {
            std::iter::once("c".to_owned())
                .chain((1..=self.links()).map(|i| format!("s{i}")))
                .collect()
        } else {
            HOSTS.iter().map(|h| (*h).to_owned()).collect()
        };
        TopologyConfig {
            hosts,
            links: (0..self.links())
                .map(|i| LinkConfig::new(CLIENT, self.server_host(i), self.rtt, Some(self.rate)))
                .collect(),
            regime: self.regime,
        }
    }

    /// The host at the server end of link `link`.
    fn server_host(&self, link: usize) -> usize {
        if self.stripe {
            SERVER + link
        } else {
            SERVER
        }
    }
}

/// The `ferry serve` of one K: listening on the first K links; striped, listening on link 0,
/// with a `serve --stripe` on each other link's host.
struct KServer {
    k: usize,
    server: Server,
    token: String,
    fingerprint: String,
    root: PathBuf,
    /// Striped: the stripe hosts' servers and addresses, links 1 to K-1.
    stripes: Vec<(Server, SocketAddr)>,
}

/// The running bed: the topology, one ferry server per K, and GridFTP's when it runs.
struct Bed {
    topo: Topology,
    servers: Vec<KServer>,
    grid: Vec<GridServers>,
    state: PathBuf,
}

impl Drop for Bed {
    fn drop(&mut self) {
        // The servers stop after this; the topology's own drop then removes the namespaces.
        for s in &self.servers {
            let _ = clear_dir(&s.root);
        }
        for g in &self.grid {
            let _ = clear_dir(&g.root);
        }
    }
}

/// What one transfer runs: ferry or GridFTP, at one K.
#[derive(Clone, Copy)]
enum Target<'b> {
    Ferry(&'b KServer),
    Grid(&'b GridServers),
}

impl Target<'_> {
    fn k(&self) -> usize {
        match self {
            Target::Ferry(s) => s.k,
            Target::Grid(g) => g.k,
        }
    }
    fn root(&self) -> &Path {
        match self {
            Target::Ferry(s) => &s.root,
            Target::Grid(g) => &g.root,
        }
    }
    fn tool(&self) -> &'static str {
        match self {
            Target::Ferry(_) => "ferry",
            Target::Grid(_) => "gridftp",
        }
    }
}

impl Bed {
    /// Every transfer of one round on one data set, K by K, ferry then GridFTP at each.
    fn targets(&self) -> Vec<Target<'_>> {
        let mut v = Vec::new();
        for s in &self.servers {
            v.push(Target::Ferry(s));
            if let Some(g) = self.grid.iter().find(|g| g.k == s.k) {
                v.push(Target::Grid(g));
            }
        }
        v
    }
}

/// Multipath mode's rounds and what they found.
pub struct MpRunner<'a> {
    o: &'a MpOptions,
    logs: PathBuf,
    pub rows: Vec<MpRow>,
    pub ceilings: Vec<MpCeiling>,
    pub notes: Vec<String>,
}

impl<'a> MpRunner<'a> {
    pub fn new(o: &'a MpOptions) -> Result<Self> {
        let logs = o.out.join("logs");
        fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
        Ok(MpRunner {
            o,
            logs,
            rows: Vec::new(),
            ceilings: Vec::new(),
            notes: Vec::new(),
        })
    }

    /// The data sets, the bed, the warm-up, then `runs` rounds of every data set at every K.
    /// The bed is torn down (servers, namespaces, destinations) however it ends.
    pub fn run(&mut self) -> Result<()> {
        let mut sets = Vec::new();
        for ds in &self.o.datasets {
            eprintln!("ferry-bench multipath: preparing {}", ds.label());
            let (src, want) = data::ensure(&self.o.work.join("data"), ds)?;
            sets.push((ds.clone(), src, want));
        }
        let bed = self.start_bed()?;
        if let Some(span) = self.o.iperf3 {
            self.measure_ceilings(&bed, span);
        }
        if self.o.warmup {
            for (ds, src, want) in &sets {
                for t in bed.targets() {
                    stop::check()?;
                    let r = self.transfer(&bed, t, 0, ds, src, want);
                    if !r.ok() {
                        bail!("warm-up {} K={} {}: {}", r.tool, r.k, ds.label(), r.error);
                    }
                }
            }
        }
        for run in 1..=self.o.runs {
            for (ds, src, want) in &sets {
                for t in bed.targets() {
                    stop::check()?;
                    let r = self.transfer(&bed, t, run, ds, src, want);
                    self.say(&r);
                    self.rows.push(r);
                }
            }
        }
        self.finish(bed);
        Ok(())
    }

    /// iperf3 over the first K links at once, for each K; a failure is a note, not a stop.
    fn measure_ceilings(&mut self, bed: &Bed, span: mpiperf::Span) {
        let servers: Vec<usize> = (0..self.o.links()).map(|i| self.o.server_host(i)).collect();
        for &k in &self.o.paths {
            match mpiperf::ceiling(&bed.topo, CLIENT, &servers[..k], span, &self.logs) {
                Ok((mbit_s, per_link)) => {
                    eprintln!(
                        "ferry-bench multipath: iperf3 over {k} link(s) at once: \
                         {mbit_s:.0} Mbit/s {per_link:.0?}"
                    );
                    self.ceilings.push(MpCeiling {
                        k,
                        mbit_s,
                        per_link,
                    });
                }
                Err(e) => self.notes.push(format!("iperf3 at K={k}: {e:#}")),
            }
        }
    }

    fn say(&self, r: &MpRow) {
        let what = if r.ok() {
            format!(
                "{:.2} s, {:.0} Mbit/s, links {:?} B",
                r.wall_s, r.mbit_s, r.link_bytes
            )
        } else {
            format!("failed: {}", r.error)
        };
        eprintln!(
            "ferry-bench multipath: run {}/{} {} K={} {}: {what}",
            r.run, self.o.runs, r.tool, r.k, r.dataset
        );
    }

    /// The topology's notes and anything that died during the run.
    fn finish(&mut self, mut bed: Bed) {
        self.notes.extend(bed.topo.notes().iter().cloned());
        for (link, e) in bed.topo.forwarder_errors() {
            self.notes.push(format!("link {link}: {e}"));
        }
        for s in &mut bed.servers {
            // A server that died mid-run fails the transfers after it; this says why.
            let k = s.k;
            let all = std::iter::once(&mut s.server).chain(s.stripes.iter_mut().map(|x| &mut x.0));
            for server in all {
                if let Ok(Some(st)) = server.child.try_wait() {
                    let name = &server.name;
                    self.notes
                        .push(format!("{name} (K={k}) exited during the run ({st})"));
                }
            }
        }
        for g in &mut bed.grid {
            if let Some(n) = g.exited() {
                self.notes.push(n);
            }
        }
    }

    fn start_bed(&self) -> Result<Bed> {
        let topo = Topology::up(self.o.topology()).context("the multipath topology")?;
        let state = self.o.out.join("ferry-state");
        let mut servers = Vec::new();
        let mut grid = Vec::new();
        for &k in &self.o.paths {
            servers.push(self.serve(&topo, k, &state)?);
            if self.o.gridftp {
                let g = mpgridftp::start(&topo, SERVER, CLIENT, k, &self.o.work, &self.logs)
                    .with_context(|| format!("GridFTP for K={k}"))?;
                grid.push(g);
            }
        }
        Ok(Bed {
            topo,
            servers,
            grid,
            state,
        })
    }

    /// `ferry serve` in the server's host on its address on each of the first `k` links (only
    /// link 0's when striped, then a `serve --stripe` on each other link's host), with its own
    /// state, token and root; ready once the client reaches it and its log gives its key.
    fn serve(&self, topo: &Topology, k: usize, state: &Path) -> Result<KServer> {
        let root = self.o.work.join("mp-dest").join(format!("k{k}"));
        fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
        clear_dir(&root)?;
        let token_file = state.join(format!("serve-k{k}")).join("token");
        let listen: Vec<SocketAddr> = if self.o.stripe {
            vec![server_addr(topo, k, 0)]
        } else {
            (0..k).map(|i| server_addr(topo, k, i)).collect()
        };
        let (server, fingerprint) =
            self.serve_one(topo, (k, 0), &listen, &root, (state, &token_file))?;
        let mut stripes = Vec::new();
        if self.o.stripe {
            for i in 1..k {
                // The same token file: one site's servers take the same tokens.
                let addr = server_addr(topo, k, i);
                let (s, _) = self.serve_one(topo, (k, i), &[addr], &root, (state, &token_file))?;
                stripes.push((s, addr));
            }
        }
        let token = fs::read_to_string(&token_file)
            .with_context(|| format!("reading {}", token_file.display()))?
            .trim()
            .to_owned();
        Ok(KServer {
            k,
            server,
            token,
            fingerprint,
            root,
            stripes,
        })
    }

    /// One `ferry serve` for `k` on link `link`'s server host (a stripe host for link > 0),
    /// listening on `listen`; returns it and its key's fingerprint once it answers.
    fn serve_one(
        &self,
        topo: &Topology,
        (k, link): (usize, usize),
        listen: &[SocketAddr],
        root: &Path,
        (state, token_file): (&Path, &Path),
    ) -> Result<(Server, String)> {
        let tag = if link == 0 {
            format!("k{k}")
        } else {
            format!("k{k}-stripe{link}")
        };
        let dir = state.join(format!("serve-{tag}"));
        fs::create_dir_all(&dir)?;
        let log = self.logs.join(format!("serve-{tag}.out"));
        let f = fs::File::create(&log)?;
        let mut c = Command::new(&self.o.ferry);
        c.env("FERRY_STATE_DIR", &dir)
            .env("XDG_CONFIG_HOME", dir.join("config"))
            .env_remove("FERRY_TOKEN")
            .arg("serve")
            .arg("--root")
            .arg(root);
        for a in listen {
            c.arg("--listen").arg(a.to_string());
        }
        if link > 0 {
            c.arg("--stripe");
        }
        c.arg("--token-file")
            .arg(token_file)
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .process_group(0);
        let name = format!("ferry serve {tag}");
        let child = topo
            .spawn_in(self.o.server_host(link), c)
            .with_context(|| format!("starting {name}"))?;
        let mut server = Server {
            name,
            child,
            log,
            own_log: None,
        };
        let last = *listen.last().context("no address to listen on")?;
        let fingerprint = wait_ready(topo, &mut server, last, Duration::from_secs(20))?;
        Ok((server, fingerprint))
    }

    /// One timed put of `ds` by `t` into an empty destination, verified.
    fn transfer(
        &self,
        bed: &Bed,
        t: Target<'_>,
        run: u32,
        ds: &Dataset,
        src: &Path,
        want: &Digest,
    ) -> MpRow {
        let mut row = MpRow::new(run, t.tool(), t.k(), ds, want);
        if let Err(e) = clear_dir(t.root()) {
            row.error = format!("clearing the destination: {e:#}");
            return row;
        }
        let cmd = match t {
            Target::Ferry(s) => self.put_cmd(bed, s, src),
            Target::Grid(g) => mpgridftp::client_cmd(&bed.topo, CLIENT, g, src, ds),
        };
        let cmd = match cmd {
            Ok(c) => c,
            Err(e) => {
                row.error = format!("{e:#}");
                return row;
            }
        };
        if self.o.verbose {
            eprintln!("ferry-bench multipath: {cmd:?}");
        }
        runner::sync_all();
        let before = link_bytes(&bed.topo);
        let out = runner::run_timed(cmd, runner::run_timeout(ds, self.o.max_run));
        let after = link_bytes(&bed.topo);
        row.link_bytes = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        let out = match out {
            Ok(o) => o,
            Err(e) => {
                row.error = format!("{e:#}");
                return row;
            }
        };
        row.wall_s = out.wall.as_secs_f64();
        let name = format!("{}-k{}-{}-run{run}.out", t.tool(), t.k(), ds.label());
        let _ = fs::write(
            self.logs.join(name),
            format!("{}{}", out.stdout, out.stderr),
        );
        if out.timed_out {
            row.error = format!("timed out after {:.0} s", row.wall_s);
        } else if !out.success {
            let mut msg = runner::short(&out.stderr);
            if msg.is_empty() {
                msg = runner::short(&out.stdout);
            }
            row.error = format!("{} {}: {msg}", t.tool(), out.code);
        } else {
            if let Target::Ferry(_) = t {
                read_report(&mut row, &out.stdout);
            }
            verify(&mut row, &t.root().join(ds.label()), want);
        }
        // Emptied now too, so that the work directory holds one destination at a time.
        if let Err(e) = clear_dir(t.root()) {
            fail_unless_failed(&mut row, e);
        }
        row
    }

    /// `ferry put` in the client's host with ferry's defaults (its remembered path included, as
    /// a user's put would): K > 1 binds its address on each of the first K links.
    fn put_cmd(&self, bed: &Bed, s: &KServer, src: &Path) -> Result<Command> {
        let dir = bed.state.join(format!("client-k{}", s.k));
        let mut c = Command::new(&self.o.ferry);
        c.env("FERRY_STATE_DIR", &dir)
            .env("XDG_CONFIG_HOME", dir.join("config"))
            .env("FERRY_KNOWN_HOSTS", dir.join("known_hosts"))
            .env("FERRY_TOKEN", &s.token)
            .arg("-q")
            .arg("put")
            .arg("--json")
            .arg("--server-fingerprint")
            .arg(&s.fingerprint);
        if !s.stripes.is_empty() {
            let hosts: Vec<String> = s.stripes.iter().map(|x| x.1.to_string()).collect();
            c.arg("--stripe").arg(hosts.join(","));
        } else if s.k > 1 {
            for i in 0..s.k {
                c.arg("--bind").arg(bed.topo.addr(i, End::A).to_string());
            }
        }
        c.arg(src)
            .arg(format!("{}:/", server_addr(&bed.topo, s.k, 0)));
        bed.topo.enter(CLIENT, &mut c)?;
        Ok(c)
    }
}

/// The figures of ferry's `--json` report.
fn read_report(row: &mut MpRow, json: &str) {
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    row.streams = v["tuning"]["streams"].as_u64();
    row.connections = v["tuning"]["connections"].as_u64();
    row.bottleneck = v["tuning"]["bottleneck"]
        .as_str()
        .unwrap_or_default()
        .into();
    if v["skipped"].as_u64().unwrap_or(0) > 0 {
        row.error = "the data was already at the destination: nothing was measured".into();
    }
}

/// The destination against the source: files, sizes, BLAKE3.
fn verify(row: &mut MpRow, got: &Path, want: &Digest) {
    if !row.error.is_empty() {
        return;
    }
    match data::digest_path(got) {
        Ok(d) if &d == want => {
            row.verified = true;
            if row.wall_s > 0.0 {
                row.mbit_s = want.bytes as f64 * 8.0 / row.wall_s / 1e6;
            }
        }
        Ok(d) => {
            row.error = format!(
                "destination differs: {} files, {} bytes, BLAKE3 {} (source {}, {}, {})",
                d.files, d.bytes, d.blake3, want.files, want.bytes, want.blake3
            )
        }
        Err(e) => row.error = format!("verifying {}: {e:#}", got.display()),
    }
}

/// The address and port of the K-path server on link `link`.
fn server_addr(t: &Topology, k: usize, link: usize) -> SocketAddr {
    SocketAddr::from((t.addr(link, End::B), BASE_PORT + k as u16))
}

/// IP bytes each link delivered so far, both directions.
fn link_bytes(t: &Topology) -> Vec<u64> {
    t.stats().iter().map(|s| s.delivered_bytes()).collect()
}

/// A destination that could not be emptied fails the row (the next transfer would meet it).
fn fail_unless_failed(row: &mut MpRow, e: anyhow::Error) {
    if row.error.is_empty() {
        row.error = format!("emptying the destination: {e:#}");
    }
}

/// Bytes the work directory must hold: the data sets (if not made yet) and the largest one's
/// copy (each destination is emptied after its transfer).
pub fn room_needed(o: &MpOptions) -> u64 {
    let all: u64 = o.datasets.iter().map(Dataset::bytes).sum();
    all + o.datasets.iter().map(Dataset::bytes).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(paths: Vec<usize>) -> MpOptions {
        MpOptions {
            ferry: "ferry".into(),
            work: "/w".into(),
            out: "/o".into(),
            datasets: vec![
                Dataset::File { bytes: 1 << 30 },
                Dataset::Mixed { files: 1000 },
            ],
            paths,
            rtt: Duration::from_millis(20),
            rate: 300_000_000,
            regime: Regime::Default,
            runs: 3,
            warmup: true,
            max_run: Duration::from_secs(900),
            verbose: false,
            gridftp: false,
            iperf3: None,
            stripe: false,
        }
    }

    #[test]
    fn the_bed_has_as_many_links_as_the_largest_k() {
        let o = opts(vec![1, 3, 2]);
        let t = o.topology();
        assert_eq!(t.hosts, ["c", "s"]);
        let l: Vec<_> = t
            .links
            .iter()
            .map(|l| (l.a, l.b, l.rtt.as_millis(), l.rate_bps))
            .collect();
        assert_eq!(l, [(0, 1, 20, Some(300_000_000)); 3]);
        assert_eq!(opts(vec![1]).topology().links.len(), 1);
    }

    #[test]
    fn a_striped_bed_gives_each_link_its_own_server_host() {
        let mut o = opts(vec![1, 3]);
        o.stripe = true;
        let t = o.topology();
        assert_eq!(t.hosts, ["c", "s1", "s2", "s3"]);
        let l: Vec<_> = t.links.iter().map(|l| (l.a, l.b)).collect();
        assert_eq!(l, [(0, 1), (0, 2), (0, 3)]);
    }

    #[test]
    fn room_is_the_data_and_the_destinations() {
        let o = opts(vec![1, 2, 3]);
        let mixed = Dataset::Mixed { files: 1000 }.bytes();
        assert!(mixed < 1 << 30, "{mixed}");
        assert_eq!(room_needed(&o), (1u64 << 30) + mixed + (1 << 30));
    }
}
