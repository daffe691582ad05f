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
//!
//! `--copies push,pull` adds striped third-party copies to that bed, after the put at each K:
//! a `ferry serve --third-party` on c is the other end, the K servers are one endpoint `site`
//! (the client's `[endpoints.site]`). Pushed: `ferry cp c:/data/X site:/` (c's server sends,
//! striped over s1 to sK); pulled: `ferry cp --pull site:/X c:/mp-cdest/` (c's server gets,
//! striped from them). The client runs in c too; each figure is also a ratio to the put.

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
/// The copies' server on c listens on c's address on link 0, on this port.
const C_PORT: u16 = 7100;
/// The copies' endpoint name in each K's client config.
const ENDPOINT: &str = "site";

/// A striped third-party copy between c's server and the K servers (`--copies`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyCase {
    /// `ferry cp c:/data/X site:/`: c's server puts into s1, striped over s2 to sK.
    Push,
    /// `ferry cp --pull site:/X c:/dst/`: c's server gets from s1, striped over s2 to sK.
    Pull,
}

impl CopyCase {
    pub const ALL: [CopyCase; 2] = [CopyCase::Push, CopyCase::Pull];

    pub fn name(self) -> &'static str {
        match self {
            CopyCase::Push => "push",
            CopyCase::Pull => "pull",
        }
    }

    /// The tool column of its rows and points.
    pub fn tool(self) -> &'static str {
        match self {
            CopyCase::Push => "ferry-cp-push",
            CopyCase::Pull => "ferry-cp-pull",
        }
    }

    /// `push` or `pull`, anything else a message that lists them.
    pub fn parse(s: &str) -> Result<CopyCase, String> {
        CopyCase::ALL
            .into_iter()
            .find(|c| c.name() == s.trim())
            .ok_or_else(|| format!("--copies {s}: each case is push or pull"))
    }
}

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
    /// Striped copies after the put at each K (only with `stripe`), in this order.
    pub copies: Vec<CopyCase>,
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

impl KServer {
    /// Its hosts' addresses, the coordinator's first: the copies' endpoint.
    fn hosts(&self, topo: &Topology) -> Vec<SocketAddr> {
        std::iter::once(server_addr(topo, self.k, 0))
            .chain(self.stripes.iter().map(|x| x.1))
            .collect()
    }
}

/// The copies' other end: a `ferry serve --third-party` on c whose root is the work directory
/// (the data under `data/`, a pulled copy's destination `mp-cdest/`).
struct CServer {
    server: Server,
    addr: SocketAddr,
    token: String,
    fingerprint: String,
    /// Where pulled copies land, emptied before and after each.
    dest: PathBuf,
}

/// The running bed: the topology, one ferry server per K, and GridFTP's when it runs.
struct Bed {
    topo: Topology,
    servers: Vec<KServer>,
    grid: Vec<GridServers>,
    /// With `--copies`.
    c: Option<CServer>,
    state: PathBuf,
}

impl Drop for Bed {
    fn drop(&mut self) {
        // The servers stop after this; the topology's own drop then removes the namespaces.
        for s in &self.servers {
            let _ = clear_dir(&s.root);
        }
        if let Some(c) = &self.c {
            let _ = clear_dir(&c.dest);
        }
        for g in &self.grid {
            let _ = clear_dir(&g.root);
        }
    }
}

/// What one transfer runs: a ferry put, a striped ferry copy, or GridFTP, at one K.
#[derive(Clone, Copy)]
enum Target<'b> {
    Ferry(&'b KServer),
    Copy(&'b KServer, &'b CServer, CopyCase),
    Grid(&'b GridServers),
}

impl Target<'_> {
    fn k(&self) -> usize {
        match self {
            Target::Ferry(s) | Target::Copy(s, ..) => s.k,
            Target::Grid(g) => g.k,
        }
    }
    /// Where the data lands (checked, then emptied).
    fn root(&self) -> &Path {
        match self {
            Target::Ferry(s) | Target::Copy(s, _, CopyCase::Push) => &s.root,
            Target::Copy(_, c, CopyCase::Pull) => &c.dest,
            Target::Grid(g) => &g.root,
        }
    }
    /// What else the transfer fills (a pull's source, linked into the K servers' directory),
    /// emptied before and after it.
    fn also_clear(&self) -> Option<&Path> {
        match self {
            Target::Copy(s, _, CopyCase::Pull) => Some(&s.root),
            _ => None,
        }
    }
    fn tool(&self) -> &'static str {
        match self {
            Target::Ferry(_) => "ferry",
            Target::Copy(_, _, case) => case.tool(),
            Target::Grid(_) => "gridftp",
        }
    }
}

impl Bed {
    /// Every transfer of one round on one data set, K by K: the put, the copies, then GridFTP.
    fn targets<'b>(&'b self, copies: &[CopyCase]) -> Vec<Target<'b>> {
        let mut v = Vec::new();
        for s in &self.servers {
            v.push(Target::Ferry(s));
            if let Some(c) = &self.c {
                v.extend(copies.iter().map(|case| Target::Copy(s, c, *case)));
            }
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
                for t in bed.targets(&self.o.copies) {
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
                for t in bed.targets(&self.o.copies) {
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
        if let Some(c) = &mut bed.c {
            if let Ok(Some(st)) = c.server.child.try_wait() {
                let name = &c.server.name;
                self.notes
                    .push(format!("{name} exited during the run ({st})"));
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
        let c = match self.o.copies.is_empty() {
            true => None,
            false => Some(self.serve_c(&topo, &state, &servers)?),
        };
        Ok(Bed {
            topo,
            servers,
            grid,
            c,
            state,
        })
    }

    /// The copies' server on c, and each K's client config naming the K servers as one
    /// endpoint (with their token), as a user of a site of several hosts writes it.
    fn serve_c(&self, topo: &Topology, state: &Path, servers: &[KServer]) -> Result<CServer> {
        let dest = self.o.work.join("mp-cdest");
        fs::create_dir_all(&dest).with_context(|| format!("creating {}", dest.display()))?;
        clear_dir(&dest)?;
        let dir = state.join("serve-c");
        let token_file = dir.join("token");
        let addr = SocketAddr::from((topo.addr(0, End::A), C_PORT));
        let (server, fingerprint) = self.spawn_serve(
            topo,
            (CLIENT, "c"),
            &[addr],
            &self.o.work,
            (&dir, &token_file),
            &["--third-party"],
        )?;
        let token = read_token(&token_file)?;
        for s in servers {
            let config = self.cp_dir(state, s.k).join("config").join("ferry");
            fs::create_dir_all(&config)?;
            let file = config.join("config.toml");
            fs::write(&file, endpoint_config(&s.hosts(topo), &s.token))
                .with_context(|| format!("writing {}", file.display()))?;
        }
        Ok(CServer {
            server,
            addr,
            token,
            fingerprint,
            dest,
        })
    }

    /// The state and config of the copies' client at `k`.
    fn cp_dir(&self, state: &Path, k: usize) -> PathBuf {
        state.join(format!("cp-k{k}"))
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
        let token = read_token(&token_file)?;
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
        let mut flags = Vec::new();
        if link > 0 {
            flags.push("--stripe");
        }
        // The copies' ends: each host mints or honours grants (a stripe host too).
        if !self.o.copies.is_empty() {
            flags.push("--third-party");
        }
        let host = self.o.server_host(link);
        self.spawn_serve(topo, (host, &tag), listen, root, (&dir, token_file), &flags)
    }

    /// One `ferry serve` in `host` with its own state `dir`, listening on `listen` with
    /// `flags`; returns it and its key's fingerprint once it answers.
    fn spawn_serve(
        &self,
        topo: &Topology,
        (host, tag): (usize, &str),
        listen: &[SocketAddr],
        root: &Path,
        (dir, token_file): (&Path, &Path),
        flags: &[&str],
    ) -> Result<(Server, String)> {
        fs::create_dir_all(dir)?;
        let log = self.logs.join(format!("serve-{tag}.out"));
        let f = fs::File::create(&log)?;
        let mut c = Command::new(&self.o.ferry);
        c.env("FERRY_STATE_DIR", dir)
            .env("XDG_CONFIG_HOME", dir.join("config"))
            .env_remove("FERRY_TOKEN")
            .arg("serve")
            .arg("--root")
            .arg(root);
        for a in listen {
            c.arg("--listen").arg(a.to_string());
        }
        c.args(flags)
            .arg("--token-file")
            .arg(token_file)
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .process_group(0);
        let name = format!("ferry serve {tag}");
        let child = topo
            .spawn_in(host, c)
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
        let emptied = std::iter::once(t.root())
            .chain(t.also_clear())
            .try_for_each(clear_dir);
        if let Err(e) = emptied {
            row.error = format!("clearing the destination: {e:#}");
            return row;
        }
        let cmd = match t {
            Target::Ferry(s) => self.put_cmd(bed, s, src),
            Target::Copy(s, c, case) => self.cp_cmd(bed, (s, c, case), src, ds),
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
            match t {
                Target::Ferry(_) => read_report(&mut row, &out.stdout, false),
                Target::Copy(..) => read_report(&mut row, &out.stdout, true),
                Target::Grid(_) => {}
            }
            verify(&mut row, &t.root().join(ds.label()), want);
        }
        // Emptied now too, so that the work directory holds one destination at a time.
        for dir in std::iter::once(t.root()).chain(t.also_clear()) {
            if let Err(e) = clear_dir(dir) {
                fail_unless_failed(&mut row, e);
            }
        }
        row
    }

    /// `ferry cp` in the client's host between c's server and the K servers as endpoint
    /// `site`, with ferry's defaults. A pull's source is first linked into the K servers'
    /// directory (hard links: no copy, not timed).
    fn cp_cmd(
        &self,
        bed: &Bed,
        (s, c, case): (&KServer, &CServer, CopyCase),
        src: &Path,
        ds: &Dataset,
    ) -> Result<Command> {
        let dir = self.cp_dir(&bed.state, s.k);
        let mut cmd = Command::new(&self.o.ferry);
        cmd.env("FERRY_STATE_DIR", &dir)
            .env("XDG_CONFIG_HOME", dir.join("config"))
            .env("FERRY_KNOWN_HOSTS", dir.join("known_hosts"))
            .env_remove("FERRY_TOKEN")
            .arg("-q")
            .arg("cp")
            .arg("--json");
        let label = ds.label();
        match case {
            CopyCase::Push => {
                let rel = src.strip_prefix(&self.o.work).with_context(|| {
                    format!("{} is not under {}", src.display(), self.o.work.display())
                })?;
                cmd.arg("--source-token")
                    .arg(&c.token)
                    .arg("--source-fingerprint")
                    .arg(&c.fingerprint)
                    .arg("--dest-fingerprint")
                    .arg(&s.fingerprint)
                    .arg(format!("{}:/{}", c.addr, rel.display()))
                    .arg(format!("{ENDPOINT}:/"));
            }
            CopyCase::Pull => {
                link_tree(src, &s.root.join(&label))?;
                let into = c.dest.strip_prefix(&self.o.work).with_context(|| {
                    format!(
                        "{} is not under {}",
                        c.dest.display(),
                        self.o.work.display()
                    )
                })?;
                // --pull at K = 1 too, where the endpoint is one host: the same direction.
                cmd.arg("--pull")
                    .arg("--dest-token")
                    .arg(&c.token)
                    .arg("--dest-fingerprint")
                    .arg(&c.fingerprint)
                    .arg("--source-fingerprint")
                    .arg(&s.fingerprint)
                    .arg(format!("{ENDPOINT}:/{label}"))
                    .arg(format!("{}:/{}/", c.addr, into.display()));
            }
        }
        bed.topo.enter(CLIENT, &mut cmd)?;
        Ok(cmd)
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

/// The figures of ferry's `--json` report; a copy's are its transfer's (`source_report`: the
/// pushing source's put, or the pulling destination's get).
fn read_report(row: &mut MpRow, json: &str, copy: bool) {
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let t = match copy {
        true => &v["source_report"]["tuning"],
        false => &v["tuning"],
    };
    row.streams = t["streams"].as_u64();
    row.connections = t["connections"].as_u64();
    let stripes = match copy {
        true => &v["source_report"]["stripes"],
        false => &v["stripes"],
    };
    if let Some(hosts) = stripes.as_array().filter(|h| !h.is_empty()) {
        let n = |x: &serde_json::Value| x.as_u64().map_or("?".into(), |n| n.to_string());
        row.host_connections =
            std::iter::once(format!("{}/{}", n(&t["streams"]), n(&t["connections"])))
                .chain(
                    hosts
                        .iter()
                        .map(|h| format!("{}/{}", n(&h["carried"]), n(&h["connections"]))),
                )
                .collect();
    }
    row.bottleneck = t["bottleneck"].as_str().unwrap_or_default().into();
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

/// The token a server wrote at its start.
fn read_token(file: &Path) -> Result<String> {
    Ok(fs::read_to_string(file)
        .with_context(|| format!("reading {}", file.display()))?
        .trim()
        .to_owned())
}

/// A client config naming `hosts` (the coordinator first) as one endpoint with `token`.
fn endpoint_config(hosts: &[SocketAddr], token: &str) -> String {
    let list: Vec<String> = hosts.iter().map(|h| format!("\"{h}\"")).collect();
    format!(
        "[endpoints.{ENDPOINT}]\nhosts = [{}]\ntoken = \"{token}\"\n",
        list.join(", ")
    )
}

/// `to` made of hard links to `from`'s files (a file, or a tree's directories and files).
fn link_tree(from: &Path, to: &Path) -> Result<()> {
    let m = fs::symlink_metadata(from).with_context(|| format!("stat {}", from.display()))?;
    if !m.is_dir() {
        return fs::hard_link(from, to)
            .with_context(|| format!("linking {} to {}", to.display(), from.display()));
    }
    fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for e in fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let e = e?;
        link_tree(&e.path(), &to.join(e.file_name()))?;
    }
    Ok(())
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
            copies: Vec::new(),
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
    fn copy_cases_parse_and_a_bad_one_names_both() {
        assert_eq!(CopyCase::parse("push"), Ok(CopyCase::Push));
        assert_eq!(CopyCase::parse(" pull"), Ok(CopyCase::Pull));
        let e = CopyCase::parse("sideways").unwrap_err();
        assert!(
            e.contains("--copies sideways") && e.contains("push or pull"),
            "{e}"
        );
        assert_eq!(CopyCase::Push.tool(), "ferry-cp-push");
    }

    #[test]
    fn the_endpoint_names_every_host_coordinator_first() {
        let hosts: Vec<SocketAddr> = vec![
            "10.0.0.2:7002".parse().unwrap(),
            "10.0.1.2:7002".parse().unwrap(),
        ];
        assert_eq!(
            endpoint_config(&hosts, "tok"),
            "[endpoints.site]\nhosts = [\"10.0.0.2:7002\", \"10.0.1.2:7002\"]\ntoken = \"tok\"\n"
        );
    }

    #[test]
    fn a_tree_is_linked_not_copied() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        fs::create_dir_all(src.join("a/b")).unwrap();
        fs::write(src.join("top"), b"1").unwrap();
        fs::write(src.join("a/b/deep"), b"22").unwrap();
        link_tree(&src, &d.path().join("dst")).unwrap();
        let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
        for f in ["top", "a/b/deep"] {
            assert_eq!(ino(&src.join(f)), ino(&d.path().join("dst").join(f)), "{f}");
        }
        link_tree(&src.join("top"), &d.path().join("one")).unwrap();
        assert_eq!(fs::read(d.path().join("one")).unwrap(), b"1");
        assert!(link_tree(&d.path().join("missing"), &d.path().join("x")).is_err());
    }

    #[test]
    fn room_is_the_data_and_the_destinations() {
        let o = opts(vec![1, 2, 3]);
        let mixed = Dataset::Mixed { files: 1000 }.bytes();
        assert!(mixed < 1 << 30, "{mixed}");
        assert_eq!(room_needed(&o), (1u64 << 30) + mixed + (1 << 30));
    }
}
