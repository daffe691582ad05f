//! ferry-bench: ferry's throughput against streams, RTT, TCP regime, file size and block size on
//! the emulated WAN bed (or against a real `ferry serve`), with iperf3 as the ceiling and the
//! peer tools Debian packages (rsync, scp, XRootD, GridFTP) side by side; or, with `--mode host`,
//! one host alone over loopback, where the cores are the limit (see [`host`]); or, with `--mode
//! third-party`, `ferry cp` between two servers against a put between them (see [`thirdparty`]);
//! or, with `--mode multipath`, one put over K parallel links against one link (see
//! [`multipath`]); or, with `--mode service`, `ferry service` running many jobs over three
//! links while its API is read, and one job over a link that goes dark (see [`service`]); or,
//! with `--mode catalog`, the catalog at 1 and 10 million files (see [`catalog`]).
//! See docs/bench/NOTEBOOK.md.

mod catalog;
mod cpu;
mod data;
mod host;
mod hostreport;
mod iperf;
mod mpgridftp;
mod mpiperf;
mod mpreport;
mod multipath;
mod peers;
mod plan;
mod plot;
mod report;
mod runner;
mod service;
mod stop;
mod storage;
mod svcreport;
mod thirdparty;
mod tpreport;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde::{Deserialize, Serialize};

use ferry_units::units::{parse_duration_tc, parse_rate_tc, parse_size_fractional};
use plan::{parse_regime, Dataset, Direction, Spec, Tool};
use runner::{Options, Runner, Target};

#[derive(Parser, Debug)]
#[command(
    name = "ferry-bench",
    about = "Benchmark sweep: ferry (and peers) against streams, RTT, TCP regime, file and block size, with iperf3 as the ceiling",
    after_help = "Presets: --quick (the default; a few minutes) and --full (hours). Any list flag \
                  replaces the preset's list. Run as root from the repository root after \
                  `cargo build --release -p ferry-cli` and `bash scripts/bench-deps.sh`."
)]
struct Cli {
    /// bed: the emulated WAN (the default). host: this host alone, over loopback, no emulator:
    /// ferry (TLS and --no-encrypt) put and get with both ends' CPU seconds per GiB, iperf3 -P
    /// 1/4/8 and `ferry probe net` as ceilings, rsync's daemon beside it; defaults --sizes 1G,
    /// --trees 64x64M,10000x10K,real, --direction put,get, --runs 5, --peers rsync.
    /// third-party: `ferry cp` run by a client on a 20 Mbit/s, 20 ms link to each of two servers
    /// against a put between the servers (their link: --rtt, default 50 ms; --rate, default
    /// 1gbit; --regime, default default); one file of --sizes (default 1G), --runs 3, after one
    /// unrecorded put and copy (--no-warmup skips them).
    /// multipath: `ferry put --bind` over K parallel links between one client and one server
    /// (K from --paths, default 1,2,3; each link --rate, default 300mbit, --rtt, default 20ms;
    /// --regime, default default) against K × one link's rate; one file of --sizes (default 1G)
    /// and the trees of --trees (default mixed), --runs 3, every K in each round, after one
    /// unrecorded put per K and data set (--no-warmup skips them); GridFTP striped over the
    /// same links beside ferry when installed (--peers none skips it); first, per K, iperf3 over
    /// the K links at once, --iperf3-secs (default 8) after --iperf3-omit (--no-iperf3 skips it).
    /// service: `ferry service` and three `ferry serve`, each behind its own link (--rate,
    /// default 300mbit; --rtt, three values, default 20ms,50ms,100ms); --jobs jobs (small trees
    /// and 1-4 MiB files) submitted round robin over the links through the API while it is
    /// polled, every file verified; then one --dark-size job over a link dark for --dark-secs.
    /// catalog: a catalog of --files registered objects (default 1M; 1M,10M for both) on each of
    /// --backends (default sqlite,postgres) under --work (default target/bench/work), a
    /// loopback `ferry serve` on it, and `find --meta`, `stat`, `rm -r` of 100,000 files and the
    /// server's start timed against issue 39's targets; --runs rm -r runs and starts (default
    /// 3), --stats (default 500) and --finds (default 50).
    #[arg(long, default_value = "bed", value_parser = ["bed", "host", "third-party", "multipath", "service", "catalog"])]
    mode: String,
    /// Catalog mode: registered objects per catalog, e.g. 1M,10M.
    #[arg(long, value_delimiter = ',')]
    files: Option<Vec<String>>,
    /// Catalog mode: sqlite, postgres.
    #[arg(long, value_delimiter = ',')]
    backends: Option<Vec<String>>,
    /// Catalog mode: stat samples (default 500).
    #[arg(long)]
    stats: Option<usize>,
    /// Catalog mode: find samples of each kind (default 50).
    #[arg(long)]
    finds: Option<usize>,
    /// Service mode: jobs submitted (default 1000).
    #[arg(long)]
    jobs: Option<usize>,
    /// Service mode: seconds the dark-link job's link stays dark (default 60; 0 skips that job).
    #[arg(long)]
    dark_secs: Option<u64>,
    /// Service mode: the dark-link job's file (default 200M).
    #[arg(long)]
    dark_size: Option<String>,
    /// Service mode: the CPUs `ferry service` runs on (a list: 0, 0-1, 0,2); with --bed-cpus,
    /// the bed (servers, links, the bench's clients: other hosts) runs on the others. Without
    /// both, everything shares every CPU.
    #[arg(long)]
    service_cpus: Option<String>,
    /// Service mode: the CPUs of the bed (see --service-cpus); disjoint from the service's.
    #[arg(long)]
    bed_cpus: Option<String>,
    /// Multipath mode: the K values, links between the client and the server (default 1,2,3).
    #[arg(long, value_delimiter = ',')]
    paths: Option<Vec<usize>>,
    /// Multipath mode: the K links go to K servers that share one directory, and the put
    /// stripes over them (`put --stripe`) instead of binding K addresses to one server.
    #[arg(long)]
    stripe_hosts: bool,
    /// Multipath mode with --stripe-hosts: striped third-party copies after each K's put,
    /// push (`ferry cp c:/X site:/`, c's server sends) and/or pull (`ferry cp --pull site:/X
    /// c:/dst/`, c's server gets), between a `ferry serve --third-party` on the client's host
    /// and the K servers as one endpoint.
    #[arg(long, value_delimiter = ',')]
    copies: Option<Vec<String>>,
    /// Host mode: ferry's transports, tls (its defaults: TLS, BLAKE3) and plain (--no-encrypt).
    #[arg(long, value_delimiter = ',')]
    transports: Option<Vec<String>>,
    /// Host mode: iperf3's -P counts (default 1,4,8).
    #[arg(long, value_delimiter = ',')]
    iperf3_streams: Option<Vec<u16>>,
    /// Host mode: do not run `ferry probe net` (ferry's own memory-to-memory ceiling).
    #[arg(long)]
    no_probe_net: bool,
    /// Host mode: seconds per point of `ferry probe net` (default 2).
    #[arg(long, default_value_t = 2)]
    probe_secs: u32,
    /// RTT 0/50 ms, 1 Gbit/s, default regime, put, 100 MiB and 2,000 × 10 KiB, streams 1/4/8,
    /// 16 MiB blocks, n = 3, rsync and scp when installed. The default.
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// Everything: RTT 0/50/100, 1 Gbit/s and uncapped, default and tuned, put and get,
    /// 35M/100M/500M/1G, 10,000 × 10 KiB and the mixed tree, streams 1/2/3/4/8/16, blocks
    /// 16M/4M/64M, all peers, the targets. Hours.
    #[arg(long)]
    full: bool,
    /// RTTs in ms, e.g. 0,50,100.
    #[arg(long, value_delimiter = ',')]
    rtt: Option<Vec<String>>,
    /// Link rates: 1gbit, 200mbit, unlimited.
    #[arg(long, value_delimiter = ',')]
    rate: Option<Vec<String>>,
    /// TCP regimes: default, tuned.
    #[arg(long, value_delimiter = ',')]
    regime: Option<Vec<String>>,
    /// put, get.
    #[arg(long, value_delimiter = ',')]
    direction: Option<Vec<String>>,
    /// Single-file sizes (binary units): 35M,100M,500M,1G,5G; "none" for no single file.
    #[arg(long, value_delimiter = ',')]
    sizes: Option<Vec<String>>,
    /// Trees: 10000x10K, 2000x10K, mixed (1,000 files, log-uniform 1 KiB–8 MiB), mixed:300,
    /// real (20,000 files, most under 16 KiB, a few over 8 MiB), real:2000; "none" for no tree.
    #[arg(long, value_delimiter = ',')]
    trees: Option<Vec<String>>,
    /// Stream counts, e.g. 1,2,3,4,8,16; 0 runs ferry with its defaults (no --streams: auto),
    /// against which the others are the fixed settings (summary.md: "Auto-tuning").
    #[arg(long, value_delimiter = ',')]
    streams: Option<Vec<u16>>,
    /// Stream counts for the peers with streams (xrootd, gridftp), if not those of --streams.
    #[arg(long, value_delimiter = ',')]
    peer_streams: Option<Vec<u16>>,
    /// ferry block sizes: 4M,16M,64M or "default" (ferry's own). Trees use the first.
    #[arg(long, value_delimiter = ',')]
    block_sizes: Option<Vec<String>>,
    /// Peer tools: rsync, scp, xrootd, gridftp, "all" or "none". Those not installed are
    /// reported, not run.
    #[arg(long, value_delimiter = ',')]
    peers: Option<Vec<String>>,
    /// Do not run ferry (peers and iperf3 only).
    #[arg(long)]
    no_ferry: bool,
    /// Do not measure the iperf3 ceiling.
    #[arg(long)]
    no_iperf3: bool,
    /// Runs per point (the median is reported, with min and max).
    #[arg(long)]
    runs: Option<u32>,
    /// Add the issue's two targets (ferry defaults, put, 1 Gbit/s, default regime: 1 GiB at RTT
    /// 0/50/100; 10,000 × 10 KiB and one file of the same bytes at 100 ms).
    #[arg(long)]
    targets: bool,
    /// Results directory (default target/bench/<UTC timestamp>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Where data sets are kept between invocations and destinations are written (default
    /// target/bench/work, on disk).
    #[arg(long)]
    work: Option<PathBuf>,
    /// Keep data and destinations on tmpfs (/dev/shm) to isolate the network from the disk.
    #[arg(long, conflicts_with = "work")]
    tmpfs: bool,
    /// Bed mode: the bed's server runs with `ferry serve --catalog VALUE` (`none`, a SQLite
    /// file, or a PostgreSQL conninfo reachable from the server's namespace, e.g. a unix
    /// socket's `host=/dir`); not given: serve's default (SQLite in its state directory).
    #[arg(long)]
    server_catalog: Option<String>,
    /// Before each run, drop the page cache (echo 1 > /proc/sys/vm/drop_caches): sources are read
    /// from disk. Affects everything else on the machine.
    #[arg(long)]
    drop_caches: bool,
    /// Skip the warm-up: by default each link starts with one unrecorded ferry transfer of each
    /// data set (fixed default streams, so no profile is written), so that the first recorded
    /// case does not alone pay for a cold server and destination.
    #[arg(long)]
    no_warmup: bool,
    /// The ferry binary (default: next to ferry-bench, else target/release/ferry).
    #[arg(long)]
    ferry: Option<PathBuf>,
    /// Seconds iperf3 measures after the slow-start seconds it skips (default 10; quick 5).
    #[arg(long)]
    iperf3_secs: Option<u32>,
    /// Leading seconds of each iperf3 run not counted (slow start).
    #[arg(long, default_value_t = 2)]
    iperf3_omit: u32,
    /// Run against a real `ferry serve` at HOST:PORT instead of the bed (ferry only; its root
    /// gets /ferry-bench/{data,put-dest}).
    #[arg(long)]
    remote: Option<String>,
    /// Token for --remote (else FERRY_TOKEN, else --token-file).
    #[arg(long, env = "FERRY_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// An `iperf3 -s -J` on the remote host, HOST:PORT, for the ceiling.
    #[arg(long)]
    remote_iperf3: Option<String>,
    /// Print the plan and an estimate of its duration, run nothing.
    #[arg(long)]
    dry_run: bool,
    /// Remake medians.csv, summary.md and the plots from DIR/results.csv.
    #[arg(long, value_name = "DIR")]
    replot: Option<PathBuf>,
    /// Longest one run may take (seconds); a case that times out is not run again, and its
    /// row says so. Peers that pay round trips per file need this on trees at high RTT.
    #[arg(long, default_value_t = 900)]
    max_run_secs: u64,
    /// Start the bed's connections at N segments: both hosts' route gets `initcwnd N initrwnd
    /// N`, a transfer node's own setting (what `ferry probe host` advises on long paths), not
    /// the issue's default conditions. Default: the kernel's 10.
    #[arg(long, value_name = "N")]
    initial_window: Option<u32>,
    /// Enable TCP Fast Open on both bed hosts (`net.ipv4.tcp_fastopen=3`), a transfer node's own
    /// setting (what `ferry probe host` advises on long paths), not the issue's default
    /// conditions: ferry's connections then carry their TLS hello in the SYN. Default: the
    /// kernel's (client side only, so no connection does).
    #[arg(long)]
    tcp_fastopen: bool,
    /// Print each peer command.
    #[arg(short, long)]
    verbose: bool,
}

/// Context of a sweep, saved as meta.json so that --replot can rewrite the summary.
#[derive(Serialize, Deserialize, Default)]
struct Meta {
    command: String,
    started: String,
    finished: String,
    duration_s: f64,
    machine: Vec<(String, String)>,
    storage: String,
    runs: u32,
    peers: Vec<(String, bool, String, String)>,
    notes: Vec<String>,
    /// `--initial-window`: the bed's routes' initcwnd/initrwnd (None: the kernel's).
    #[serde(default)]
    initial_window: Option<u32>,
    /// `--tcp-fastopen`: both bed hosts allow TCP Fast Open.
    #[serde(default)]
    fast_open: bool,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `YYYYMMDD-HHMMSS` (UTC), for directory names.
fn stamp(secs: u64) -> String {
    human_time(secs)
        .trim_end_matches(" UTC")
        .replace(['-', ':'], "")
        .replace(' ', "-")
}

fn human_time(secs: u64) -> String {
    format!("{} UTC", ferry_probe::net::utc_text(secs as i64, ' '))
}

fn read_trim(p: &str) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn machine() -> Vec<(String, String)> {
    let mut m = Vec::new();
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpu
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
        .unwrap_or_else(|| "?".into());
    let cores = cpu.lines().filter(|l| l.starts_with("processor")).count();
    let flags = cpu
        .lines()
        .find(|l| l.starts_with("flags"))
        .unwrap_or_default();
    let simd: Vec<&str> = ["avx2", "avx512f", "aes", "sha_ni"]
        .into_iter()
        .filter(|f| flags.split_whitespace().any(|x| x == *f))
        .collect();
    m.push((
        "cpu".into(),
        format!("{model} × {cores} ({})", simd.join(", ")),
    ));
    let mem = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    if let Some(l) = mem.lines().find(|l| l.starts_with("MemTotal")) {
        let kb: f64 = l
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        m.push(("memory".into(), format!("{:.1} GiB", kb / 1024.0 / 1024.0)));
    }
    m.push(("kernel".into(), read_trim("/proc/sys/kernel/osrelease")));
    for k in [
        "net.ipv4.tcp_congestion_control",
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_wmem",
        "net.core.rmem_max",
        "net.core.wmem_max",
        "net.core.default_qdisc",
    ] {
        m.push((
            format!("{k} (host)"),
            read_trim(&format!("/proc/sys/{}", k.replace('.', "/"))),
        ));
    }
    m.push(("load average at start".into(), read_trim("/proc/loadavg")));
    m
}

fn parse_rtt(s: &str) -> Result<u32> {
    let d = parse_duration_tc(s).map_err(anyhow::Error::msg)?;
    Ok(d.as_millis() as u32)
}

fn build_spec(cli: &Cli) -> Result<Spec> {
    let mut s = if cli.full {
        Spec::full()
    } else {
        Spec::quick()
    };
    if let Some(v) = &cli.rtt {
        s.rtts_ms = v.iter().map(|x| parse_rtt(x)).collect::<Result<_>>()?;
    }
    if let Some(v) = &cli.rate {
        s.rates = v
            .iter()
            .map(|x| parse_rate_tc(x).map_err(anyhow::Error::msg))
            .collect::<Result<_>>()?;
    }
    if let Some(v) = &cli.regime {
        s.regimes = v
            .iter()
            .map(|x| parse_regime(x).map_err(anyhow::Error::msg))
            .collect::<Result<_>>()?;
    }
    if let Some(v) = &cli.direction {
        s.directions = v
            .iter()
            .map(|x| Direction::parse(x).map_err(anyhow::Error::msg))
            .collect::<Result<_>>()?;
    }
    if cli.sizes.is_some() || cli.trees.is_some() {
        let files: Vec<Dataset> = match &cli.sizes {
            Some(v) if v.iter().any(|x| x == "none") => vec![],
            Some(v) => v
                .iter()
                .map(|x| {
                    parse_size_fractional(x)
                        .map_err(String::from)
                        .map(|bytes| Dataset::File { bytes })
                })
                .collect::<Result<_, String>>()
                .map_err(anyhow::Error::msg)?,
            None => s.datasets.iter().filter(|d| d.is_file()).cloned().collect(),
        };
        let trees: Vec<Dataset> = match &cli.trees {
            Some(v) if v.iter().any(|x| x == "none") => vec![],
            Some(v) => v
                .iter()
                .map(|x| Dataset::parse(x))
                .collect::<Result<_, String>>()
                .map_err(anyhow::Error::msg)?,
            None => s
                .datasets
                .iter()
                .filter(|d| !d.is_file())
                .cloned()
                .collect(),
        };
        if trees.iter().any(|d| d.is_file()) {
            bail!("--trees takes trees (10000x10K, mixed); single files go in --sizes");
        }
        s.datasets = files.into_iter().chain(trees).collect();
    }
    if let Some(v) = &cli.streams {
        if v.is_empty() {
            bail!("--streams: no counts");
        }
        s.streams = v.clone();
    }
    if let Some(v) = &cli.peer_streams {
        if v.is_empty() || v.contains(&0) {
            bail!("--peer-streams: counts start at 1");
        }
        s.peer_streams = Some(v.clone());
    }
    if let Some(v) = &cli.block_sizes {
        s.block_sizes = v
            .iter()
            .map(|x| {
                if x == "default" {
                    Ok(None)
                } else {
                    parse_size_fractional(x)
                        .map_err(String::from)
                        .map(Some)
                        .map_err(anyhow::Error::msg)
                }
            })
            .collect::<Result<_>>()?;
    }
    if let Some(v) = &cli.peers {
        s.peers = if v.iter().any(|x| x == "none") {
            vec![]
        } else if v.iter().any(|x| x == "all") {
            Tool::PEERS.to_vec()
        } else {
            v.iter()
                .map(|x| Tool::parse(x).map_err(anyhow::Error::msg))
                .collect::<Result<_>>()?
        };
    }
    if cli.no_ferry {
        s.ferry = false;
    }
    if cli.no_iperf3 {
        s.iperf3 = false;
    }
    if let Some(r) = cli.runs {
        s.runs = r.max(1);
    }
    if cli.targets {
        s.targets = true;
    }
    if s.datasets.is_empty() && !s.targets {
        bail!("nothing to transfer: no --sizes and no --trees");
    }
    Ok(s)
}

fn find_ferry(cli: &Cli) -> Result<PathBuf> {
    if let Some(p) = &cli.ferry {
        if p.is_file() {
            return Ok(p.canonicalize()?);
        }
        bail!("--ferry {}: no such file", p.display());
    }
    let mut cands: Vec<PathBuf> = Vec::new();
    if let Ok(p) = std::env::var("FERRY_BIN") {
        cands.push(p.into());
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(d) = exe.parent() {
            cands.push(d.join("ferry"));
        }
    }
    cands.push("target/release/ferry".into());
    for c in &cands {
        if c.is_file() {
            return Ok(c.canonicalize()?);
        }
    }
    if let Some(p) = ferry_netem::find_in_path("ferry") {
        return Ok(p);
    }
    bail!(
        "no ferry binary (tried {}); build it with `cargo build --release -p ferry-cli` or pass --ferry PATH",
        cands
            .iter()
            .map(|c| c.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn print_plan(p: &plan::Plan, iperf_secs: u32, verbose: bool) {
    eprintln!(
        "ferry-bench: {} links, {} runs in all ({} per point), about {:.0} min",
        p.links.len(),
        p.runs_total(),
        p.runs,
        p.estimate_secs(iperf_secs) / 60.0
    );
    for l in &p.links {
        eprintln!(
            "  {}: {} iperf3 points, {} cases",
            l.link.label(),
            l.iperf.len(),
            l.cases.len()
        );
        if verbose {
            for c in &l.cases {
                eprintln!(
                    "    {} {} {} streams={} block={}",
                    c.tool,
                    c.direction,
                    c.dataset.label(),
                    c.streams,
                    c.block_label()
                );
            }
        }
    }
}

fn write_outputs(out: &Path, rows: &[report::Row], meta: &Meta) -> Result<()> {
    let meds = report::medians(rows);
    report::write_csv(&out.join("medians.csv"), &meds)?;
    let plots_dir = out.join("plots");
    let plots = match plot::plot_all(&meds, &plots_dir, meta.runs) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("ferry-bench: plots: {e:#}");
            Vec::new()
        }
    };
    let checks = report::targets(&meds);
    let mut s = String::new();
    let _ = writeln!(s, "# ferry-bench results\n");
    let _ = writeln!(s, "Command: `{}`\n", meta.command);
    let _ = writeln!(
        s,
        "Started {}, finished {} ({:.1} min). Each point ran {} times; the tables give the median \
         (and min–max) of the runs that completed and verified. The machine is shared with other \
         work, so single runs are noisy.\n",
        meta.started,
        meta.finished,
        meta.duration_s / 60.0,
        meta.runs
    );
    let _ = writeln!(s, "## Machine\n");
    for (k, v) in &meta.machine {
        let _ = writeln!(s, "- {k}: `{v}`");
    }
    let _ = writeln!(s, "- storage: {}", meta.storage);
    if let Some(w) = meta.initial_window {
        let _ = writeln!(
            s,
            "- the bed's routes: `initcwnd {w} initrwnd {w}` on both hosts (`--initial-window`; \
             the kernel's default is 10)"
        );
    }
    if meta.fast_open {
        let _ = writeln!(
            s,
            "- the bed's hosts: `net.ipv4.tcp_fastopen=3` on both (`--tcp-fastopen`; the \
             kernel's default, 1, lets no connection carry data in its SYN)"
        );
    }
    let _ = writeln!(
        s,
        "\nMbit/s = bytes × 8 / (wall time of the client + a syncfs of the destination right \
         after it exits) / 10⁶: the time until the data is durable, for every tool (ferry syncs \
         before it renames, so its syncfs is ~0; peers that do not sync pay it there). Sources \
         are generated once and stay in the page cache; `sync` runs before every run; the \
         destination is emptied between runs. Unless `--no-warmup`, each link begins with \
         one unrecorded ferry transfer of each data set (4 fixed streams), so the first \
         recorded case is not alone in meeting a cold server and destination. iperf3: \
         receiver's goodput, the first seconds (slow start) not counted.\n"
    );
    let mut routes = meta
        .initial_window
        .map(|w| format!("; routes' initial window {w}, not the kernel's 10"))
        .unwrap_or_default();
    if meta.fast_open {
        routes.push_str("; TCP Fast Open on both hosts");
    }
    let _ = writeln!(
        s,
        "## Targets (ferry defaults, put, 1 Gbit/s, default regime{routes})\n"
    );
    let _ = writeln!(s, "{}", report::targets_markdown(&checks));
    let auto = report::auto_table(&meds);
    if !auto.is_empty() {
        let _ = writeln!(
            s,
            "## Auto-tuning (ferry's defaults against its best fixed stream count)\n\n\
             Target: ≥ 95% of the best fixed count, and within 10% of the final rate in the \
             first 5 s of the data phase (ramp: end of the first 1-s window at ≥ 90% of the \
             median 1-s rate of the transfer's second half, from ferry's `--json` timeline).\n"
        );
        let _ = writeln!(s, "{auto}");
    }
    if !meta.peers.is_empty() {
        let _ = writeln!(
            s,
            "## Peers\n\n| tool | status | version | how it runs |\n|---|---|---|---|"
        );
        for (t, ok, v, note) in &meta.peers {
            let st = if *ok { "installed" } else { "not run" };
            let _ = writeln!(s, "| {t} | {st} | {v} | {note} |");
        }
        let _ = writeln!(s);
    }
    if !meta.notes.is_empty() {
        let _ = writeln!(s, "## Notes\n");
        for n in &meta.notes {
            let _ = writeln!(s, "- {n}");
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(s, "## Medians\n");
    let _ = writeln!(
        s,
        "`streams` default / `block` default = ferry's own defaults (no flag). \"vs best peer\": \
         this median over the best peer's median for the same link, direction and data set."
    );
    s.push_str(&report::summary_tables(&meds));
    if !plots.is_empty() {
        let _ = writeln!(s, "\n## Plots\n");
        for p in &plots {
            let rel = p.strip_prefix(out).unwrap_or(p);
            let _ = writeln!(s, "![{0}]({0})\n", rel.display());
        }
    }
    std::fs::write(out.join("summary.md"), s)?;
    std::fs::write(
        out.join("targets.json"),
        serde_json::to_string_pretty(&checks)?,
    )?;
    eprintln!("\n{}", report::targets_markdown(&checks));
    eprintln!(
        "ferry-bench: wrote {}/{{results.csv,medians.csv,summary.md}} and {} plots",
        out.display(),
        plots.len()
    );
    Ok(())
}

fn run(cli: Cli) -> Result<ExitCode> {
    if let Some(dir) = &cli.replot {
        let rows = report::read_rows(&dir.join("results.csv"))?;
        let mut meta: Meta = std::fs::read_to_string(dir.join("meta.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        meta.runs = meta.runs.max(rows.iter().map(|r| r.run).max().unwrap_or(1));
        write_outputs(dir, &rows, &meta)?;
        return Ok(ExitCode::SUCCESS);
    }
    if cli.mode == "host" {
        return run_host(&cli);
    }
    if cli.mode == "third-party" {
        return run_third_party(&cli);
    }
    if cli.mode == "multipath" {
        return run_multipath(&cli);
    }
    if cli.mode == "service" {
        return run_service(&cli);
    }
    if cli.mode == "catalog" {
        return run_catalog(&cli);
    }
    if cli.files.is_some() || cli.backends.is_some() || cli.stats.is_some() || cli.finds.is_some() {
        bail!("--files, --backends, --stats and --finds apply to --mode catalog only");
    }
    if cli.jobs.is_some()
        || cli.dark_secs.is_some()
        || cli.dark_size.is_some()
        || cli.service_cpus.is_some()
        || cli.bed_cpus.is_some()
    {
        bail!(
            "--jobs, --dark-secs, --dark-size, --service-cpus and --bed-cpus apply to --mode service only"
        );
    }
    let spec = build_spec(&cli)?;
    let iperf_secs = cli.iperf3_secs.unwrap_or(if cli.full { 10 } else { 5 });
    let plan = plan::plan(&spec);
    print_plan(&plan, iperf_secs, cli.verbose || cli.dry_run);
    if cli.dry_run {
        return Ok(ExitCode::SUCCESS);
    }
    let target = match &cli.remote {
        None => {
            if let Err(why) = ferry_netem::can_run() {
                eprintln!("ferry-bench: the emulated bed cannot run here: {why}");
                return Ok(ExitCode::from(2));
            }
            Target::Bed
        }
        Some(r) => {
            let (host, port) = r.rsplit_once(':').context("--remote HOST:PORT")?;
            let port: u16 = port.parse().context("--remote HOST:PORT: bad port")?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let host = if host.contains(':') {
                format!("[{host}]")
            } else {
                host.to_owned()
            };
            let token = match (&cli.token, &cli.token_file) {
                (Some(t), _) => t.clone(),
                (None, Some(f)) => std::fs::read_to_string(f)
                    .with_context(|| format!("reading {}", f.display()))?
                    .trim()
                    .to_owned(),
                (None, None) => bail!("--remote needs --token, FERRY_TOKEN or --token-file"),
            };
            let iperf3 = match &cli.remote_iperf3 {
                Some(s) => {
                    let (h, p) = s.rsplit_once(':').context("--remote-iperf3 HOST:PORT")?;
                    Some((
                        h.to_owned(),
                        p.parse().context("--remote-iperf3: bad port")?,
                    ))
                }
                None => None,
            };
            Target::Remote {
                host,
                port,
                token,
                iperf3,
            }
        }
    };
    let ferry = find_ferry(&cli)?;
    let started = now_secs();
    let out = cli
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("target/bench").join(stamp(started)));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let out = out.canonicalize()?;
    if cli.remote.is_none() {
        // The bed's servers keep their TLS key here, and the clients pin it here, rather than
        // in the user's own state and known-hosts files (every bed's server has the same
        // address). Set before any thread starts; children inherit it.
        std::env::set_var("FERRY_STATE_DIR", out.join("ferry-state"));
        std::env::set_var("FERRY_KNOWN_HOSTS", out.join("ferry-state/known_hosts"));
    }
    let (work, tmp_work) = work_dir(&cli)?;
    let fs = storage::fs_type(&work).unwrap_or_else(|e| format!("file system unknown: {e:#}"));
    // Data sets not yet made, and one copy of the largest at each destination.
    let largest = plan
        .datasets()
        .iter()
        .map(Dataset::bytes)
        .max()
        .unwrap_or(0);
    let need = plan.datasets().iter().map(Dataset::bytes).sum::<u64>()
        + largest * spec.directions.len() as u64;
    let room = storage::check_room(
        &work,
        &fs,
        storage::free_bytes(&work).unwrap_or(u64::MAX),
        need,
    )?;
    eprintln!("ferry-bench: {room}");
    let storage = if cli.tmpfs {
        format!("{fs} ({}), both ends", work.display())
    } else {
        format!("{fs} ({}), both ends share it", work.display())
    } + if cli.drop_caches {
        "; page cache dropped before every run"
    } else {
        "; sources warm in the page cache"
    };
    let mut peer_infos = BTreeMap::new();
    if matches!(target, Target::Bed) {
        for &t in &spec.peers {
            let info = peers::probe(t);
            if !info.installed {
                eprintln!("ferry-bench: {t}: {}", info.note);
            }
            peer_infos.insert(t, info);
        }
    } else if !spec.peers.is_empty() {
        eprintln!("ferry-bench: --remote runs ferry only; peers skipped");
    }
    let opts = Options {
        ferry: ferry.clone(),
        work: work.clone(),
        out: out.clone(),
        target: target.clone(),
        iperf_secs,
        iperf_omit: cli.iperf3_omit,
        drop_caches: cli.drop_caches,
        warmup: !cli.no_warmup,
        verbose: cli.verbose,
        max_run: std::time::Duration::from_secs(cli.max_run_secs.max(1)),
        initial_window: cli.initial_window,
        fast_open: cli.tcp_fastopen,
        server_catalog: cli.server_catalog.clone(),
    };
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let mut meta = Meta {
        command,
        started: human_time(started),
        machine: machine(),
        storage,
        runs: plan.runs,
        initial_window: cli.initial_window,
        fast_open: cli.tcp_fastopen,
        ..Default::default()
    };
    meta.machine
        .push(("ferry binary".into(), ferry.display().to_string()));
    if let Target::Remote { host, port, .. } = &target {
        meta.machine
            .push(("remote".into(), format!("{host}:{port} (real network)")));
    }
    let t0 = Instant::now();
    let mut runner = Runner::new(&opts, &plan, peer_infos)?;
    let result = runner.prepare_data().and_then(|_| runner.run());
    runner::empty_trash(&opts.work);
    if let Err(e) = &result {
        eprintln!("ferry-bench: {e:#}");
        runner.notes.push(format!("sweep stopped: {e:#}"));
    }
    meta.finished = human_time(now_secs());
    meta.duration_s = t0.elapsed().as_secs_f64();
    meta.machine
        .push(("load average at end".into(), read_trim("/proc/loadavg")));
    meta.peers = runner
        .peers
        .values()
        .map(|p| {
            (
                p.tool.name().to_owned(),
                p.installed,
                p.version.clone(),
                p.note.clone(),
            )
        })
        .collect();
    meta.notes = runner.notes.clone();
    std::fs::write(out.join("meta.json"), serde_json::to_string_pretty(&meta)?)?;
    write_outputs(&out, &runner.rows, &meta)?;
    if let Some(w) = tmp_work {
        let _ = data::remove_path(&w);
    }
    let failed = runner.rows.iter().filter(|r| !r.ok()).count();
    if failed > 0 {
        eprintln!("ferry-bench: {failed} runs failed (see results.csv, error column)");
    }
    Ok(if result.is_err() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The work directory: `--work`, else target/bench/work on the real file system; with
/// `--tmpfs` one under /dev/shm for this process (returned twice: it is removed at the end).
fn work_dir(cli: &Cli) -> Result<(PathBuf, Option<PathBuf>)> {
    let (work, tmp_work) = if cli.tmpfs {
        reap_tmpfs_work(Path::new(TMPFS));
        let w = PathBuf::from(format!("{TMPFS}/ferry-bench-{}", std::process::id()));
        (w.clone(), Some(w))
    } else {
        (
            cli.work
                .clone()
                .unwrap_or_else(|| PathBuf::from("target/bench/work")),
            None,
        )
    };
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let work = work.canonicalize()?;
    Ok((work, tmp_work))
}

/// Flags of the bed only, refused in host mode rather than ignored.
fn bed_only_flags(cli: &Cli) -> Vec<&'static str> {
    let mut v = Vec::new();
    let mut bad = |set: bool, name: &'static str| {
        if set {
            v.push(name)
        }
    };
    bad(cli.full, "--full");
    bad(cli.rtt.is_some(), "--rtt");
    bad(cli.rate.is_some(), "--rate");
    bad(cli.regime.is_some(), "--regime");
    bad(cli.streams.is_some(), "--streams");
    bad(cli.peer_streams.is_some(), "--peer-streams");
    bad(cli.block_sizes.is_some(), "--block-sizes");
    bad(cli.no_ferry, "--no-ferry");
    bad(cli.targets, "--targets");
    bad(cli.remote.is_some(), "--remote");
    bad(cli.replot.is_some(), "--replot");
    bad(cli.drop_caches, "--drop-caches");
    bad(cli.initial_window.is_some(), "--initial-window");
    bad(cli.tcp_fastopen, "--tcp-fastopen");
    bad(cli.paths.is_some(), "--paths");
    bad(cli.stripe_hosts, "--stripe-hosts");
    bad(cli.copies.is_some(), "--copies");
    v
}

fn parse_list<T>(v: &[String], f: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>> {
    v.iter().map(|x| f(x).map_err(anyhow::Error::msg)).collect()
}

/// Host mode's options from the command line (its own defaults where a flag is not given).
fn host_options(cli: &Cli, work: PathBuf, out: PathBuf) -> Result<host::HostOptions> {
    let keep_aside = storage::fs_type(&work).map_or(true, |t| t != "tmpfs");
    let sizes = cli.sizes.clone().unwrap_or_else(|| vec!["1G".into()]);
    let trees = cli
        .trees
        .clone()
        .unwrap_or_else(|| vec!["64x64M".into(), "10000x10K".into(), "real".into()]);
    let mut datasets = Vec::new();
    if !sizes.iter().any(|x| x == "none") {
        for x in &sizes {
            let bytes = parse_size_fractional(x).map_err(anyhow::Error::msg)?;
            datasets.push(Dataset::File { bytes });
        }
    }
    if !trees.iter().any(|x| x == "none") {
        let t = parse_list(&trees, Dataset::parse)?;
        if t.iter().any(Dataset::is_file) {
            bail!("--trees takes trees (64x64M, 10000x10K, real:5000); single files go in --sizes");
        }
        datasets.extend(t);
    }
    if datasets.is_empty() {
        bail!("nothing to transfer: no --sizes and no --trees");
    }
    let directions = match &cli.direction {
        Some(v) => parse_list(v, Direction::parse)?,
        None => vec![Direction::Put, Direction::Get],
    };
    let transports = match &cli.transports {
        Some(v) => parse_list(v, host::Transport::parse)?,
        None => vec![host::Transport::Tls, host::Transport::Plain],
    };
    let peers = match &cli.peers {
        Some(v) if v.iter().any(|x| x == "none") => vec![],
        Some(v) => parse_list(v, Tool::parse)?,
        None => vec![Tool::Rsync],
    };
    let iperf_streams = if cli.no_iperf3 {
        vec![]
    } else {
        cli.iperf3_streams.clone().unwrap_or_else(|| vec![1, 4, 8])
    };
    if iperf_streams.contains(&0) || directions.is_empty() || transports.is_empty() {
        bail!("--iperf3-streams start at 1; --direction and --transports need one each");
    }
    Ok(host::HostOptions {
        ferry: find_ferry(cli)?,
        work,
        out,
        datasets,
        directions,
        transports,
        runs: cli.runs.unwrap_or(5).max(1),
        iperf_streams,
        iperf_secs: cli.iperf3_secs.unwrap_or(3),
        iperf_omit: cli.iperf3_omit.min(5),
        probe_secs: (!cli.no_probe_net).then_some(cli.probe_secs.clamp(1, 30)),
        peers,
        max_run: std::time::Duration::from_secs(cli.max_run_secs.max(1)),
        verbose: cli.verbose,
        keep_aside,
    })
}

/// The host's lines of the host-mode summary: CPU, cores, memory, kernel, load.
fn host_lines() -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = machine()
        .into_iter()
        .filter(|(k, _)| !k.ends_with("(host)"))
        .collect();
    let n = std::thread::available_parallelism().map_or(0, |n| n.get());
    v.insert(1, ("nproc".into(), n.to_string()));
    v
}

/// `--mode host`: see [`host`].
fn run_host(cli: &Cli) -> Result<ExitCode> {
    let bad = bed_only_flags(cli);
    if !bad.is_empty() {
        bail!("--mode host: {} apply to the bed only", bad.join(", "));
    }
    let started = now_secs();
    let out = cli
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("target/bench").join(format!("host-{}", stamp(started))));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let out = out.canonicalize()?;
    let (work, tmp_work) = work_dir(cli)?;
    let fs = storage::fs_type(&work).unwrap_or_else(|e| format!("unknown: {e:#}"));
    let checked = host_options(cli, work.clone(), out.clone()).and_then(|o| {
        let free = storage::free_bytes(&work).unwrap_or(u64::MAX);
        let room = storage::check_room(&work, &fs, free, host::room_needed(&o))?;
        eprintln!("ferry-bench host: {room}");
        Ok(o)
    });
    let o = match checked {
        Ok(o) => o,
        Err(e) => {
            // A /dev/shm directory of this process holds RAM: not left for the next run to reap.
            if let Some(w) = &tmp_work {
                let _ = data::remove_path(w);
            }
            return Err(e);
        }
    };
    let mut meta = hostreport::HostMeta {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        started: human_time(started),
        host: host_lines(),
        runs: o.runs,
        ..Default::default()
    };
    meta.host
        .push(("ferry binary".into(), o.ferry.display().to_string()));
    let t0 = Instant::now();
    let mut r = host::HostRunner::new(&o)?;
    let result = r.prepare_data().and_then(|_| r.run());
    runner::empty_trash(&work);
    if let Err(e) = &result {
        eprintln!("ferry-bench host: {e:#}");
        r.notes.push(format!("stopped: {e:#}"));
    }
    for (what, sub) in [
        ("data sets (put's source, get's server side)", "data"),
        ("put destination (server side)", "put-dest"),
        ("get destination (client side)", "get-dest"),
    ] {
        let p = work.join(sub);
        let ty = storage::fs_type(&p).unwrap_or_else(|_| fs.clone());
        meta.storage
            .push((what.into(), p.display().to_string(), ty));
    }
    meta.duration_s = t0.elapsed().as_secs_f64();
    meta.host
        .push(("load average at end".into(), read_trim("/proc/loadavg")));
    meta.notes = r.notes.clone();
    let meds = hostreport::medians(&r.rows);
    let md = hostreport::summary(&meds, &meta);
    std::fs::write(out.join("summary.md"), &md)?;
    std::fs::write(out.join("meta.json"), serde_json::to_string_pretty(&meta)?)?;
    if let Some(w) = tmp_work {
        let _ = data::remove_path(&w);
    }
    println!("{md}");
    eprintln!(
        "ferry-bench host: wrote {}/{{results.csv,summary.md}}",
        out.display()
    );
    let failed = r.rows.iter().filter(|x| !x.ok()).count();
    if failed > 0 {
        eprintln!("ferry-bench host: {failed} runs failed (see results.csv, error column)");
    }
    Ok(if result.is_err() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Flags the third-party and multipath modes have no use for, refused rather than ignored.
fn third_party_bad_flags(cli: &Cli) -> Vec<&'static str> {
    let mut v = Vec::new();
    let mut bad = |set: bool, name: &'static str| {
        if set {
            v.push(name)
        }
    };
    bad(cli.quick, "--quick");
    bad(cli.full, "--full");
    bad(cli.transports.is_some(), "--transports");
    bad(cli.iperf3_streams.is_some(), "--iperf3-streams");
    bad(cli.no_probe_net, "--no-probe-net");
    bad(cli.direction.is_some(), "--direction");
    bad(cli.streams.is_some(), "--streams");
    bad(cli.peer_streams.is_some(), "--peer-streams");
    bad(cli.block_sizes.is_some(), "--block-sizes");
    bad(cli.peers.is_some(), "--peers");
    bad(cli.no_ferry, "--no-ferry");
    bad(cli.no_iperf3, "--no-iperf3");
    bad(cli.iperf3_secs.is_some(), "--iperf3-secs");
    bad(cli.targets, "--targets");
    bad(cli.remote.is_some(), "--remote");
    bad(cli.remote_iperf3.is_some(), "--remote-iperf3");
    bad(cli.token_file.is_some(), "--token-file");
    bad(cli.dry_run, "--dry-run");
    bad(cli.drop_caches, "--drop-caches");
    bad(cli.initial_window.is_some(), "--initial-window");
    bad(cli.tcp_fastopen, "--tcp-fastopen");
    bad(cli.server_catalog.is_some(), "--server-catalog");
    v
}

/// Flags the third-party mode refuses beyond those (the multipath mode takes these).
fn third_party_only_bad_flags(cli: &Cli) -> Vec<&'static str> {
    let mut v = third_party_bad_flags(cli);
    if cli.trees.is_some() {
        v.push("--trees");
    }
    if cli.paths.is_some() {
        v.push("--paths");
    }
    if cli.stripe_hosts {
        v.push("--stripe-hosts");
    }
    if cli.copies.is_some() {
        v.push("--copies");
    }
    v
}

/// `--copies`: push and/or pull, each once, on the striped bed only.
fn multipath_copies(cli: &Cli) -> Result<Vec<multipath::CopyCase>> {
    let Some(list) = &cli.copies else {
        return Ok(Vec::new());
    };
    if !cli.stripe_hosts {
        bail!("--copies: the copies run on the striped bed; add --stripe-hosts");
    }
    let mut v = Vec::new();
    for s in list {
        let c = multipath::CopyCase::parse(s).map_err(anyhow::Error::msg)?;
        if v.contains(&c) {
            bail!("--copies: {} appears twice", c.name());
        }
        v.push(c);
    }
    if v.is_empty() {
        bail!("--copies: name push, pull or both");
    }
    Ok(v)
}

/// The one value of a list flag in the third-party and multipath modes, or its default.
fn one_value<'a>(v: &'a Option<Vec<String>>, flag: &str, default: &'a str) -> Result<&'a str> {
    match v.as_deref() {
        None => Ok(default),
        Some([x]) => Ok(x),
        Some(_) => bail!("{flag} takes one value in this mode"),
    }
}

/// Third-party mode's options from the command line (the issue's bed where a flag is not
/// given).
fn third_party_options(cli: &Cli, work: PathBuf, out: PathBuf) -> Result<thirdparty::TpOptions> {
    let size = one_value(&cli.sizes, "--sizes", "1G")?;
    let bytes = parse_size_fractional(size).map_err(|e| anyhow::anyhow!("--sizes {size}: {e}"))?;
    if bytes == 0 {
        bail!("--sizes: the file needs at least one byte");
    }
    let rtt = one_value(&cli.rtt, "--rtt", "50ms")?;
    let ab_rtt = parse_duration_tc(rtt).map_err(|e| anyhow::anyhow!("--rtt {rtt}: {e}"))?;
    let rate = one_value(&cli.rate, "--rate", "1gbit")?;
    let ab_rate = parse_rate_tc(rate).map_err(|e| anyhow::anyhow!("--rate {rate}: {e}"))?;
    let regime =
        parse_regime(one_value(&cli.regime, "--regime", "default")?).map_err(anyhow::Error::msg)?;
    Ok(thirdparty::TpOptions {
        ferry: find_ferry(cli)?,
        work,
        out,
        bytes,
        runs: cli.runs.unwrap_or(3).max(1),
        ab_rtt,
        ab_rate,
        regime,
        warmup: !cli.no_warmup,
        max_run: std::time::Duration::from_secs(cli.max_run_secs.max(1)),
        verbose: cli.verbose,
    })
}

/// `--mode third-party`: see [`thirdparty`].
fn run_third_party(cli: &Cli) -> Result<ExitCode> {
    let bad = third_party_only_bad_flags(cli);
    if !bad.is_empty() {
        bail!("--mode third-party: {} do not apply", bad.join(", "));
    }
    let started = now_secs();
    let out = cli.out.clone().unwrap_or_else(|| {
        PathBuf::from("target/bench").join(format!("third-party-{}", stamp(started)))
    });
    // Bad values are refused before anything is made or started.
    third_party_options(cli, out.clone(), out.clone())?;
    if let Err(why) = ferry_netem::can_run() {
        eprintln!("ferry-bench: the emulated bed cannot run here: {why}");
        return Ok(ExitCode::from(2));
    }
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let out = out.canonicalize()?;
    let (work, tmp_work) = work_dir(cli)?;
    let result = third_party_in(cli, &work, &out, started);
    // A /dev/shm directory of this process holds RAM: removed however the run ended.
    if let Some(w) = tmp_work {
        let _ = data::remove_path(&w);
    }
    result
}

fn third_party_in(cli: &Cli, work: &Path, out: &Path, started: u64) -> Result<ExitCode> {
    let fs = storage::fs_type(work).unwrap_or_else(|e| format!("unknown: {e:#}"));
    let o = third_party_options(cli, work.to_path_buf(), out.to_path_buf())?;
    let free = storage::free_bytes(work).unwrap_or(u64::MAX);
    let room = storage::check_room(work, &fs, free, thirdparty::room_needed(&o))?;
    eprintln!("ferry-bench third-party: {room}");
    let mut report = tpreport::TpReport {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        started: human_time(started),
        host: host_lines(),
        storage: format!("{} ({fs}), both servers", work.display()),
        bed: tpreport::TpBed {
            client_rtt_ms: thirdparty::CLIENT_RTT.as_millis() as u64,
            client_rate_bps: thirdparty::CLIENT_RATE,
            ab_rtt_ms: o.ab_rtt.as_millis() as u64,
            ab_rate_bps: o.ab_rate,
            regime: plan::regime_name(o.regime).into(),
        },
        file: o.dataset().label(),
        bytes: o.bytes,
        runs: o.runs,
        warmup: o.warmup,
        ..Default::default()
    };
    report
        .host
        .push(("ferry binary".into(), o.ferry.display().to_string()));
    let t0 = Instant::now();
    let mut r = thirdparty::TpRunner::new(&o)?;
    let result = r.run();
    if let Err(e) = &result {
        eprintln!("ferry-bench third-party: {e:#}");
        r.notes.push(format!("stopped: {e:#}"));
    }
    report.duration_s = t0.elapsed().as_secs_f64();
    report
        .host
        .push(("load average at end".into(), read_trim("/proc/loadavg")));
    report.rows = std::mem::take(&mut r.rows);
    report.notes = std::mem::take(&mut r.notes);
    report.summarize();
    let md = tpreport::summary(&report);
    std::fs::write(out.join("summary.md"), &md)?;
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    println!("{md}");
    eprintln!(
        "ferry-bench third-party: wrote {}/{{results.json,summary.md}}",
        out.display()
    );
    let failed = report.failed();
    if failed > 0 {
        eprintln!("ferry-bench third-party: {failed} transfers failed (results.json, rows' error)");
    }
    Ok(if result.is_err() || failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Multipath mode's data sets: one file of --sizes (default 1G; "none": no file) and the trees
/// of --trees (default mixed; "none": no tree).
fn multipath_datasets(cli: &Cli) -> Result<Vec<Dataset>> {
    let mut v = Vec::new();
    let size = one_value(&cli.sizes, "--sizes", "1G")?;
    if size != "none" {
        let bytes =
            parse_size_fractional(size).map_err(|e| anyhow::anyhow!("--sizes {size}: {e}"))?;
        if bytes == 0 {
            bail!("--sizes: the file needs at least one byte");
        }
        v.push(Dataset::File { bytes });
    }
    let trees = cli.trees.clone().unwrap_or_else(|| vec!["mixed".into()]);
    if !trees.iter().any(|t| t == "none") {
        for t in &trees {
            v.push(Dataset::parse(t).map_err(|e| anyhow::anyhow!("--trees {t}: {e}"))?);
        }
    }
    if v.is_empty() {
        bail!("--mode multipath: --sizes none and --trees none leave nothing to send");
    }
    Ok(v)
}

/// Multipath mode's options from the command line (the issue's bed where a flag is not given).
fn multipath_options(cli: &Cli, work: PathBuf, out: PathBuf) -> Result<multipath::MpOptions> {
    let paths = cli.paths.clone().unwrap_or_else(|| vec![1, 2, 3]);
    if let Some(k) = paths
        .iter()
        .find(|k| **k == 0 || **k > multipath::MAX_PATHS)
    {
        bail!("--paths {k}: each K is 1 to {}", multipath::MAX_PATHS);
    }
    let mut seen = Vec::new();
    for k in &paths {
        if seen.contains(k) {
            bail!("--paths: {k} appears twice");
        }
        seen.push(*k);
    }
    let rtt = one_value(&cli.rtt, "--rtt", "20ms")?;
    let rtt = parse_duration_tc(rtt).map_err(|e| anyhow::anyhow!("--rtt {rtt}: {e}"))?;
    let rate_s = one_value(&cli.rate, "--rate", "300mbit")?;
    let rate = parse_rate_tc(rate_s)
        .map_err(|e| anyhow::anyhow!("--rate {rate_s}: {e}"))?
        .ok_or_else(|| anyhow::anyhow!("--rate {rate_s}: the links need a rate to compare with"))?;
    let regime =
        parse_regime(one_value(&cli.regime, "--regime", "default")?).map_err(anyhow::Error::msg)?;
    let gridftp = match cli.peers.as_deref() {
        None => mpgridftp::installed(),
        Some([p]) if p == "none" => false,
        Some([p]) if p == "gridftp" => {
            if !mpgridftp::installed() {
                bail!(
                    "--peers gridftp: globus-gridftp-server or globus-url-copy is not installed \
                     (`bash scripts/bench-deps.sh`)"
                );
            }
            true
        }
        Some(_) => bail!("--mode multipath: --peers takes gridftp or none"),
    };
    // GridFTP stripes over several hosts only with a front end and data nodes set up for it
    // (`-r`/`-dn`), which the bed does not build: compared on the two-host bed alone.
    if cli.stripe_hosts && cli.peers.as_deref().is_some_and(|p| p == ["gridftp"]) {
        bail!("--stripe-hosts: GridFTP is compared on the two-host bed only (without it)");
    }
    let gridftp = gridftp && !cli.stripe_hosts;
    Ok(multipath::MpOptions {
        ferry: find_ferry(cli)?,
        work,
        out,
        datasets: multipath_datasets(cli)?,
        paths,
        rtt,
        rate,
        regime,
        runs: cli.runs.unwrap_or(3).max(1),
        warmup: !cli.no_warmup,
        max_run: std::time::Duration::from_secs(cli.max_run_secs.max(1)),
        verbose: cli.verbose,
        gridftp,
        iperf3: (!cli.no_iperf3 && mpiperf::installed()).then_some(mpiperf::Span {
            secs: cli.iperf3_secs.unwrap_or(8).max(1),
            omit: cli.iperf3_omit,
        }),
        stripe: cli.stripe_hosts,
        copies: multipath_copies(cli)?,
    })
}

/// `--mode multipath`: see [`multipath`].
fn run_multipath(cli: &Cli) -> Result<ExitCode> {
    let mut bad = third_party_bad_flags(cli);
    bad.retain(|f| !["--peers", "--no-iperf3", "--iperf3-secs"].contains(f));
    if !bad.is_empty() {
        bail!("--mode multipath: {} do not apply", bad.join(", "));
    }
    let started = now_secs();
    let out = cli.out.clone().unwrap_or_else(|| {
        PathBuf::from("target/bench").join(format!("multipath-{}", stamp(started)))
    });
    // Bad values are refused before anything is made or started.
    multipath_options(cli, out.clone(), out.clone())?;
    if let Err(why) = ferry_netem::can_run() {
        eprintln!("ferry-bench: the emulated bed cannot run here: {why}");
        return Ok(ExitCode::from(2));
    }
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let out = out.canonicalize()?;
    let (work, tmp_work) = work_dir(cli)?;
    let result = multipath_in(cli, &work, &out, started);
    // A /dev/shm directory of this process holds RAM: removed however the run ended.
    if let Some(w) = tmp_work {
        let _ = data::remove_path(&w);
    }
    result
}

fn multipath_in(cli: &Cli, work: &Path, out: &Path, started: u64) -> Result<ExitCode> {
    let fs = storage::fs_type(work).unwrap_or_else(|e| format!("unknown: {e:#}"));
    let o = multipath_options(cli, work.to_path_buf(), out.to_path_buf())?;
    let free = storage::free_bytes(work).unwrap_or(u64::MAX);
    let room = storage::check_room(work, &fs, free, multipath::room_needed(&o))?;
    eprintln!("ferry-bench multipath: {room}");
    let mut report = mpreport::MpReport {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        started: human_time(started),
        host: host_lines(),
        storage: format!("{} ({fs}), both ends", work.display()),
        bed: mpreport::MpBed {
            links: o.paths.iter().copied().max().unwrap_or(1),
            rtt_ms: o.rtt.as_millis() as u64,
            rate_bps: o.rate,
            regime: plan::regime_name(o.regime).into(),
            striped: o.stripe,
        },
        paths: o.paths.clone(),
        tools: std::iter::once("ferry")
            .chain(o.copies.iter().map(|c| c.tool()))
            .chain(o.gridftp.then_some("gridftp"))
            .map(String::from)
            .collect(),
        datasets: o.datasets.iter().map(Dataset::label).collect(),
        runs: o.runs,
        warmup: o.warmup,
        ..Default::default()
    };
    report
        .host
        .push(("ferry binary".into(), o.ferry.display().to_string()));
    let t0 = Instant::now();
    let mut r = multipath::MpRunner::new(&o)?;
    let result = r.run();
    if let Err(e) = &result {
        eprintln!("ferry-bench multipath: {e:#}");
        r.notes.push(format!("stopped: {e:#}"));
    }
    report.duration_s = t0.elapsed().as_secs_f64();
    report
        .host
        .push(("load average at end".into(), read_trim("/proc/loadavg")));
    report.rows = std::mem::take(&mut r.rows);
    report.ceilings = std::mem::take(&mut r.ceilings);
    report.notes = std::mem::take(&mut r.notes);
    report.summarize();
    let md = mpreport::summary(&report);
    std::fs::write(out.join("summary.md"), &md)?;
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    println!("{md}");
    eprintln!(
        "ferry-bench multipath: wrote {}/{{results.json,summary.md}}",
        out.display()
    );
    let failed = report.failed();
    if failed > 0 {
        eprintln!("ferry-bench multipath: {failed} transfers failed (results.json, rows' error)");
    }
    Ok(if result.is_err() || failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Service mode's options from the command line (the issue's bed where a flag is not given).
fn service_options(cli: &Cli, work: PathBuf, out: PathBuf) -> Result<service::SvcOptions> {
    let rtts = cli
        .rtt
        .clone()
        .unwrap_or_else(|| vec!["20ms".into(), "50ms".into(), "100ms".into()]);
    if rtts.len() != service::LINKS {
        bail!(
            "--rtt: service mode takes {} RTTs, one per link",
            service::LINKS
        );
    }
    let rtts = rtts
        .iter()
        .map(|r| parse_duration_tc(r).map_err(|e| anyhow::anyhow!("--rtt {r}: {e}")))
        .collect::<Result<Vec<_>>>()?;
    let rate_s = one_value(&cli.rate, "--rate", "300mbit")?;
    let rate = parse_rate_tc(rate_s)
        .map_err(|e| anyhow::anyhow!("--rate {rate_s}: {e}"))?
        .ok_or_else(|| anyhow::anyhow!("--rate {rate_s}: the links need a rate"))?;
    let regime =
        parse_regime(one_value(&cli.regime, "--regime", "default")?).map_err(anyhow::Error::msg)?;
    let jobs = cli.jobs.unwrap_or(1000);
    if jobs == 0 {
        bail!("--jobs: at least one job");
    }
    let size = cli.dark_size.as_deref().unwrap_or("200M");
    let dark_bytes =
        parse_size_fractional(size).map_err(|e| anyhow::anyhow!("--dark-size {size}: {e}"))?;
    if dark_bytes == 0 {
        bail!("--dark-size: the file needs at least one byte");
    }
    Ok(service::SvcOptions {
        ferry: find_ferry(cli)?,
        work,
        out,
        jobs,
        rtts,
        rate,
        regime,
        dark: std::time::Duration::from_secs(cli.dark_secs.unwrap_or(60)),
        dark_bytes,
        max_run: std::time::Duration::from_secs(cli.max_run_secs.max(1)),
        placement: service::Placement::from_lists(
            cli.service_cpus.as_deref(),
            cli.bed_cpus.as_deref(),
        )?,
    })
}

/// `--mode service`: see [`service`].
fn run_catalog(cli: &Cli) -> Result<ExitCode> {
    let started = now_secs();
    let out = cli.out.clone().unwrap_or_else(|| {
        PathBuf::from("target/bench").join(format!("catalog-{}", stamp(started)))
    });
    let files = match &cli.files {
        Some(v) => v
            .iter()
            .map(|s| catalog::parse_count(s))
            .collect::<Result<Vec<_>>>()?,
        None => vec![1_000_000],
    };
    let backends = match &cli.backends {
        Some(v) => v
            .iter()
            .map(|s| catalog::Backend::parse(s))
            .collect::<Result<Vec<_>>>()?,
        None => vec![catalog::Backend::Sqlite, catalog::Backend::Postgres],
    };
    if cli.tmpfs {
        bail!("--mode catalog: the catalogs belong on disk (--work), not tmpfs");
    }
    let o = catalog::CatOptions {
        ferry: find_ferry(cli)?,
        work: PathBuf::new(),
        out: out.clone(),
        files,
        backends,
        runs: cli.runs.unwrap_or(3),
        stats: cli.stats.unwrap_or(500),
        finds: cli.finds.unwrap_or(50),
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let (work, _) = work_dir(cli)?;
    let o = catalog::CatOptions {
        out: out.canonicalize()?,
        work: work.join("catalog"),
        ..o
    };
    let report = catalog::run(&o)?;
    println!("{report}");
    eprintln!("ferry-bench catalog: results in {}", o.out.display());
    Ok(ExitCode::SUCCESS)
}

fn run_service(cli: &Cli) -> Result<ExitCode> {
    let mut bad = third_party_only_bad_flags(cli);
    for (set, name) in [
        (cli.sizes.is_some(), "--sizes"),
        (cli.runs.is_some(), "--runs"),
        (cli.no_warmup, "--no-warmup"),
    ] {
        if set {
            bad.push(name);
        }
    }
    if !bad.is_empty() {
        bail!("--mode service: {} do not apply", bad.join(", "));
    }
    let started = now_secs();
    let out = cli.out.clone().unwrap_or_else(|| {
        PathBuf::from("target/bench").join(format!("service-{}", stamp(started)))
    });
    // Bad values are refused before anything is made or started.
    service_options(cli, out.clone(), out.clone())?;
    if let Err(why) = ferry_netem::can_run() {
        eprintln!("ferry-bench: the emulated bed cannot run here: {why}");
        return Ok(ExitCode::from(2));
    }
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let out = out.canonicalize()?;
    let (work, tmp_work) = work_dir(cli)?;
    let result = service_in(cli, &work, &out, started);
    // A /dev/shm directory of this process holds RAM: removed however the run ended.
    if let Some(w) = tmp_work {
        let _ = data::remove_path(&w);
    }
    result
}

fn service_in(cli: &Cli, work: &Path, out: &Path, started: u64) -> Result<ExitCode> {
    let fs = storage::fs_type(work).unwrap_or_else(|e| format!("unknown: {e:#}"));
    let o = service_options(cli, work.to_path_buf(), out.to_path_buf())?;
    let free = storage::free_bytes(work).unwrap_or(u64::MAX);
    let room = storage::check_room(work, &fs, free, service::room_needed(&o))?;
    eprintln!("ferry-bench service: {room}");
    let mut report = svcreport::SvcReport {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        started: human_time(started),
        host: host_lines(),
        storage: format!("{} ({fs}), all hosts", work.display()),
        bed: svcreport::SvcBed {
            rtt_ms: o.rtts.iter().map(|r| r.as_millis() as u64).collect(),
            rate_bps: o.rate,
            regime: plan::regime_name(o.regime).into(),
        },
        jobs: o.jobs,
        placement: o.placement.describe(),
        ..Default::default()
    };
    report
        .host
        .push(("ferry binary".into(), o.ferry.display().to_string()));
    let t0 = Instant::now();
    let mut r = service::SvcRunner::new(&o, report)?;
    let result = r.run();
    let mut report = r.report;
    if let Err(e) = &result {
        eprintln!("ferry-bench service: {e:#}");
        report.notes.push(format!("stopped: {e:#}"));
    }
    report.duration_s = t0.elapsed().as_secs_f64();
    report
        .host
        .push(("load average at end".into(), read_trim("/proc/loadavg")));
    report.summarize();
    let md = report.write(out)?;
    println!("{md}");
    eprintln!(
        "ferry-bench service: wrote {}/{{summary.md,results.json,jobs.csv,api.csv,rss.csv}}",
        out.display()
    );
    Ok(if result.is_err() || !report.all_ok() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Where `--tmpfs` keeps data sets and destinations, one directory per bench process.
const TMPFS: &str = "/dev/shm";

/// Removes `ferry-bench-<pid>` directories under `dir` whose process is gone. A bench that was
/// killed (SIGKILL, or SIGTERM mid-run) cannot remove its own, and each holds gigabytes of
/// RAM-backed data; the next run cleans up after it, as ferry-netem does with namespaces.
fn reap_tmpfs_work(dir: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return removed;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("ferry-bench-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let alive = pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists();
        if !alive && e.file_type().is_ok_and(|t| t.is_dir()) {
            let p = e.path();
            if std::fs::remove_dir_all(&p).is_ok() {
                eprintln!(
                    "ferry-bench: removed {} (left by a bench that is gone)",
                    p.display()
                );
                removed.push(p);
            }
        }
    }
    removed
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    stop::install();
    match run(cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ferry-bench: {e:#}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn verify_cli() {
        Cli::command().debug_assert();
    }

    #[test]
    fn tmpfs_work_of_gone_benches_is_reaped_and_nothing_else() {
        let d = tempfile::tempdir().unwrap();
        // Above any pid_max Linux allows (2^22), so never a live process.
        let gone = d.path().join("ferry-bench-999999999");
        std::fs::create_dir_all(gone.join("data/tree")).unwrap();
        std::fs::write(gone.join("data/tree/f"), b"x").unwrap();
        let keep = [
            format!("ferry-bench-{}", std::process::id()),
            "ferry-bench-1".to_owned(),
            "ferry-bench-abc".to_owned(),
            "other-999999999".to_owned(),
        ];
        for k in &keep {
            std::fs::create_dir(d.path().join(k)).unwrap();
        }
        std::fs::write(d.path().join("ferry-bench-999999998"), b"a file").unwrap();
        assert_eq!(reap_tmpfs_work(d.path()), vec![gone.clone()]);
        assert!(!gone.exists());
        for k in &keep {
            assert!(d.path().join(k).is_dir(), "{k} kept");
        }
        assert!(d.path().join("ferry-bench-999999998").is_file());
        assert!(reap_tmpfs_work(&d.path().join("missing")).is_empty());
    }

    fn service(args: &[&str]) -> Result<service::SvcOptions> {
        let mut v = vec!["ferry-bench", "--mode", "service", "--ferry", "/bin/true"];
        v.extend_from_slice(args);
        service_options(&Cli::try_parse_from(v)?, "/w".into(), "/o".into())
    }

    #[test]
    fn service_mode_defaults_to_the_issues_bed_and_takes_its_flags() {
        let o = service(&[]).unwrap();
        assert_eq!(o.jobs, 1000);
        let rtts: Vec<u128> = o.rtts.iter().map(|r| r.as_millis()).collect();
        assert_eq!(rtts, [20, 50, 100]);
        assert_eq!(o.rate, 300_000_000);
        assert_eq!((o.dark.as_secs(), o.dark_bytes), (60, 200 << 20));
        let o = service(&["--jobs", "12", "--dark-secs", "0", "--dark-size", "24M"]).unwrap();
        assert_eq!((o.jobs, o.dark.as_secs(), o.dark_bytes), (12, 0, 24 << 20));
        let o = service(&["--rtt", "1ms,2ms,3ms", "--rate", "50mbit"]).unwrap();
        assert_eq!(o.rtts[2].as_millis(), 3);
        assert_eq!(o.rate, 50_000_000);
        for bad in [
            &["--jobs", "0"][..],
            &["--rtt", "20ms"],
            &["--dark-size", "0"],
        ] {
            assert!(service(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn service_mode_places_the_service_and_its_bed_apart_or_says_why_not() {
        assert_eq!(
            service(&[]).map(|o| o.placement).unwrap(),
            service::Placement::Shared
        );
        let e = refused(&["--service-cpus", "0", "--bed-cpus", "0"]);
        assert!(e.contains("CPU 0 is in both"), "{e}");
        let e = refused(&["--service-cpus", "0"]);
        assert!(e.contains("go together"), "{e}");
        let e = refused(&["--bed-cpus", "0"]);
        assert!(e.contains("go together"), "{e}");
        for (list, why) in [
            ("1-0", "from the lower CPU"),
            ("x", "not a CPU number"),
            ("0,,1", "an empty entry"),
            ("", "an empty entry"),
            ("5000", "numbered below 1024"),
            ("0-x", "not a CPU number"),
        ] {
            let e = refused(&["--service-cpus", list, "--bed-cpus", "1000"]);
            assert!(
                e.contains("--service-cpus") && e.contains(why),
                "{list:?}: {e}"
            );
        }
        // A CPU this process may not run on: 1023 on any host this runs on.
        let e = refused(&["--service-cpus", "0", "--bed-cpus", "1023"]);
        assert!(
            e.contains("CPU 1023: not one this process may run on"),
            "{e}"
        );
        // The CPUs this process may run on, split in two where it has two.
        let allowed = std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|l| {
                l.strip_prefix("Cpus_allowed_list:")
                    .map(|v| v.trim().to_owned())
            })
            .unwrap();
        let cpus = service::parse_cpus(&allowed).unwrap();
        assert_eq!(service::cpu_list(&cpus), allowed.replace(' ', ""));
        if let [first, rest @ ..] = &cpus[..] {
            if !rest.is_empty() {
                let bed = service::cpu_list(rest);
                let o = service(&["--service-cpus", &first.to_string(), "--bed-cpus", &bed]);
                assert_eq!(
                    o.map(|o| o.placement).unwrap(),
                    service::Placement::Pinned {
                        service: vec![*first],
                        bed: rest.to_vec()
                    }
                );
            }
        }
        assert_eq!(service::parse_cpus("3,0-1, 1").unwrap(), [0, 1, 3]);
        assert_eq!(service::cpu_list(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
    }

    /// Why service mode refuses `args`.
    fn refused(args: &[&str]) -> String {
        match service(args) {
            Ok(_) => panic!("{args:?} accepted"),
            Err(e) => format!("{e:#}"),
        }
    }

    fn spec(args: &[&str]) -> Result<Spec> {
        let mut v = vec!["ferry-bench"];
        v.extend_from_slice(args);
        build_spec(&Cli::try_parse_from(v)?)
    }

    #[test]
    fn flags_change_the_preset() {
        assert_eq!(spec(&[]).unwrap(), Spec::quick());
        assert_eq!(spec(&["--full"]).unwrap(), Spec::full());
        let s = spec(&[
            "--rtt",
            "0,20ms",
            "--sizes",
            "10M",
            "--trees",
            "none",
            "--streams",
            "1,2",
            "--runs",
            "1",
            "--peers",
            "none",
            "--rate",
            "unlimited,200mbit",
            "--block-sizes",
            "default,4M",
            "--direction",
            "get",
        ])
        .unwrap();
        assert_eq!(s.rtts_ms, vec![0, 20]);
        assert_eq!(s.datasets, vec![Dataset::File { bytes: 10 << 20 }]);
        assert_eq!(s.streams, vec![1, 2]);
        assert_eq!(s.runs, 1);
        assert!(s.peers.is_empty());
        assert_eq!(s.rates, vec![None, Some(200_000_000)]);
        assert_eq!(s.block_sizes, vec![None, Some(4 << 20)]);
        assert_eq!(s.directions, vec![Direction::Get]);
        // --trees alone keeps the preset's files
        let s = spec(&["--trees", "mixed:50"]).unwrap();
        assert_eq!(
            s.datasets,
            vec![
                Dataset::File { bytes: 100 << 20 },
                Dataset::Mixed { files: 50 }
            ]
        );
        assert!(spec(&["--trees", "1G"]).is_err());
        // 0 is ferry with its defaults, next to fixed counts.
        assert_eq!(spec(&["--streams", "0,4"]).unwrap().streams, vec![0, 4]);
        assert!(spec(&["--sizes", "none", "--trees", "none"]).is_err());
        assert_eq!(
            spec(&["--peers", "all"]).unwrap().peers,
            Tool::PEERS.to_vec()
        );
        assert!(spec(&["--quick", "--full"]).is_err());
    }

    fn multipath(args: &[&str]) -> Result<multipath::MpOptions> {
        let mut v = vec!["ferry-bench", "--mode", "multipath", "--ferry", "/bin/true"];
        v.extend_from_slice(args);
        multipath_options(&Cli::try_parse_from(v)?, "/w".into(), "/o".into())
    }

    #[test]
    fn copies_are_parsed_in_order_on_the_striped_bed_only() {
        use multipath::CopyCase::{Pull, Push};
        assert!(multipath(&[]).unwrap().copies.is_empty());
        let o = multipath(&["--stripe-hosts", "--copies", "pull,push"]).unwrap();
        assert_eq!(o.copies, [Pull, Push]);
        assert!(o.stripe);
        let o = multipath(&["--stripe-hosts", "--copies", "push"]).unwrap();
        assert_eq!(o.copies, [Push]);
        for (args, says) in [
            (&["--copies", "push"][..], "add --stripe-hosts"),
            (
                &["--stripe-hosts", "--copies", "push,sideways"],
                "--copies sideways",
            ),
            (
                &["--stripe-hosts", "--copies", "pull,pull"],
                "pull appears twice",
            ),
        ] {
            let Err(e) = multipath(args) else {
                panic!("{args:?} was taken");
            };
            let e = format!("{e:#}");
            assert!(e.contains(says), "{args:?}: {e}");
        }
    }

    #[test]
    fn timestamps() {
        assert_eq!(stamp(0), "19700101-000000");
        assert_eq!(stamp(1_700_000_000), "20231114-221320");
        assert_eq!(human_time(1_700_000_000), "2023-11-14 22:13:20 UTC");
    }
}
