//! What a sweep runs: the links (rate × regime × RTT), and on each link the iperf3 points and
//! the transfer cases (tool × direction × data set × streams × block size). Pure: no I/O, so the
//! presets and the planner are unit-tested.

use std::collections::BTreeSet;
use std::fmt;

use ferry_netem::Regime;
use ferry_units::units::{parse_size_fractional, rate_label, size_label};
use serde::{Deserialize, Serialize};

pub use ferry_units::units::{GIB, KIB, MIB};

/// A program whose throughput is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tool {
    Ferry,
    Iperf3,
    Rsync,
    Scp,
    Xrootd,
    Gridftp,
}

impl Tool {
    pub const PEERS: [Tool; 4] = [Tool::Rsync, Tool::Scp, Tool::Xrootd, Tool::Gridftp];

    pub fn name(self) -> &'static str {
        match self {
            Tool::Ferry => "ferry",
            Tool::Iperf3 => "iperf3",
            Tool::Rsync => "rsync",
            Tool::Scp => "scp",
            Tool::Xrootd => "xrootd",
            Tool::Gridftp => "gridftp",
        }
    }

    pub fn parse(s: &str) -> Result<Tool, String> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "ferry" => Tool::Ferry,
            "iperf3" | "iperf" => Tool::Iperf3,
            "rsync" => Tool::Rsync,
            "scp" | "ssh" => Tool::Scp,
            "xrootd" | "xrdcp" | "xroot" => Tool::Xrootd,
            "gridftp" | "globus" | "globus-url-copy" => Tool::Gridftp,
            o => return Err(format!("unknown tool {o:?} (rsync, scp, xrootd, gridftp)")),
        })
    }

    pub fn is_peer(self) -> bool {
        Tool::PEERS.contains(&self)
    }

    /// Whether the tool can spread one transfer over several TCP connections.
    pub fn has_streams(self) -> bool {
        matches!(
            self,
            Tool::Ferry | Tool::Iperf3 | Tool::Xrootd | Tool::Gridftp
        )
    }

    /// The most streams the tool accepts (`xrdcp --streams` takes 1-15).
    pub fn max_streams(self) -> u16 {
        match self {
            Tool::Xrootd => 15,
            Tool::Rsync | Tool::Scp => 1,
            _ => u16::MAX,
        }
    }
}

impl fmt::Display for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Put,
    Get,
}

impl Direction {
    pub fn name(self) -> &'static str {
        match self {
            Direction::Put => "put",
            Direction::Get => "get",
        }
    }
    pub fn parse(s: &str) -> Result<Direction, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "put" => Ok(Direction::Put),
            "get" => Ok(Direction::Get),
            o => Err(format!("unknown direction {o:?} (put, get)")),
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

pub fn regime_name(r: Regime) -> &'static str {
    match r {
        Regime::Default => "default",
        Regime::Tuned => "tuned",
    }
}

pub fn parse_regime(s: &str) -> Result<Regime, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "default" => Ok(Regime::Default),
        "tuned" => Ok(Regime::Tuned),
        o => Err(format!("unknown regime {o:?} (default, tuned)")),
    }
}

/// What is transferred.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Dataset {
    /// One file of this many bytes.
    File { bytes: u64 },
    /// `files` files of `file_bytes` each, in subdirectories of at most 1,000.
    Tree { files: u64, file_bytes: u64 },
    /// `files` files with sizes log-uniform in 1 KiB..8 MiB, from a fixed seed.
    Mixed { files: u64 },
    /// A "real" tree (issue 37): `files` files, most under 16 KiB, some of tens to hundreds of
    /// KiB, a few over 8 MiB, from a fixed seed ([`real_sizes`]).
    Real { files: u64 },
}

/// Fixed seed of the mixed tree (sizes and contents).
pub const MIXED_SEED: u64 = 0x6665_7272_795f_6d78;
pub const MIXED_MIN: u64 = KIB;
pub const MIXED_MAX: u64 = 8 * MIB;

/// Fixed seed of the real tree's sizes.
pub const REAL_SEED: u64 = 0x6665_7272_795f_7274;
/// Files of the real tree when its spec names no count ("real").
pub const REAL_DEFAULT_FILES: u64 = 20_000;
/// Small files of the real tree: log-uniform in [`REAL_SMALL_MIN`, `REAL_SMALL_MAX`).
pub const REAL_SMALL_MIN: u64 = 256;
pub const REAL_SMALL_MAX: u64 = 16 * KIB;
/// Medium files: log-uniform in [16 KiB, 1 MiB], one in [`REAL_MEDIUM_EVERY`] on average.
pub const REAL_MEDIUM_MAX: u64 = MIB;
pub const REAL_MEDIUM_EVERY: u64 = 20;
/// Large files: log-uniform in (8 MiB, 32 MiB], one per [`REAL_LARGE_EVERY`] files (at least
/// one), at evenly spaced places.
pub const REAL_LARGE_MIN: u64 = 8 * MIB + 1;
pub const REAL_LARGE_MAX: u64 = 32 * MIB;
pub const REAL_LARGE_EVERY: u64 = 2000;

impl Dataset {
    pub fn label(&self) -> String {
        match self {
            Dataset::File { bytes } => format!("file-{}", size_label(*bytes)),
            Dataset::Tree { files, file_bytes } => {
                format!("tree-{files}x{}", size_label(*file_bytes))
            }
            Dataset::Mixed { files } => format!("mixed-{files}"),
            Dataset::Real { files } => format!("real-{files}"),
        }
    }

    /// Parses a label or a tree spec: "file-1GiB", "1G" (a file), "tree-10000x10KiB",
    /// "10000x10K", "mixed-1000", "mixed" (1,000 files), "real-5000", "real:5000", "real"
    /// (20,000 files).
    pub fn parse(s: &str) -> Result<Dataset, String> {
        let t = s.trim();
        if let Some(rest) = t.strip_prefix("real") {
            let rest = rest.trim_start_matches(['-', ':']);
            let files = if rest.is_empty() {
                REAL_DEFAULT_FILES
            } else {
                rest.replace(['_', ','], "")
                    .parse()
                    .map_err(|_| format!("bad real tree {s:?} (use real or real:5000)"))?
            };
            if files == 0 {
                return Err(format!("real tree {s:?}: no files"));
            }
            return Ok(Dataset::Real { files });
        }
        if let Some(rest) = t.strip_prefix("mixed") {
            let rest = rest.trim_start_matches(['-', ':']);
            let files = if rest.is_empty() {
                1000
            } else {
                rest.parse().map_err(|_| format!("bad mixed tree {s:?}"))?
            };
            return Ok(Dataset::Mixed { files });
        }
        let t2 = t.strip_prefix("tree-").unwrap_or(t);
        if let Some((n, size)) = t2.split_once('x') {
            let files = n
                .replace(['_', ','], "")
                .parse()
                .map_err(|_| format!("bad tree {s:?} (use 10000x10K)"))?;
            return Ok(Dataset::Tree {
                files,
                file_bytes: parse_size_fractional(size)?,
            });
        }
        let t3 = t.strip_prefix("file-").unwrap_or(t);
        Ok(Dataset::File {
            bytes: parse_size_fractional(t3)?,
        })
    }

    pub fn is_file(&self) -> bool {
        matches!(self, Dataset::File { .. })
    }

    /// Number of files.
    pub fn files(&self) -> u64 {
        match self {
            Dataset::File { .. } => 1,
            Dataset::Tree { files, .. } | Dataset::Mixed { files } | Dataset::Real { files } => {
                *files
            }
        }
    }

    /// Total bytes (for the mixed tree: from the same generator that writes it).
    pub fn bytes(&self) -> u64 {
        match self {
            Dataset::File { bytes } => *bytes,
            Dataset::Tree { files, file_bytes } => files * file_bytes,
            Dataset::Mixed { files } => mixed_sizes(*files).iter().sum(),
            Dataset::Real { files } => real_sizes(*files).iter().sum(),
        }
    }

    /// Sizes of its files in the order the generator writes them.
    pub fn sizes(&self) -> Vec<u64> {
        match self {
            Dataset::File { bytes } => vec![*bytes],
            Dataset::Tree { files, file_bytes } => vec![*file_bytes; *files as usize],
            Dataset::Mixed { files } => mixed_sizes(*files),
            Dataset::Real { files } => real_sizes(*files),
        }
    }
}

/// splitmix64: the seed expander of the generators.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// File sizes of the mixed tree: log-uniform in [1 KiB, 8 MiB], from [`MIXED_SEED`].
pub fn mixed_sizes(files: u64) -> Vec<u64> {
    let mut st = MIXED_SEED;
    let (lo, hi) = ((MIXED_MIN as f64).ln(), (MIXED_MAX as f64).ln());
    (0..files)
        .map(|_| {
            let u = (splitmix64(&mut st) >> 11) as f64 / (1u64 << 53) as f64;
            ((lo + u * (hi - lo)).exp().round() as u64).clamp(MIXED_MIN, MIXED_MAX)
        })
        .collect()
}

/// A uniform draw in [0, 1) from the generator.
fn unit(st: &mut u64) -> f64 {
    (splitmix64(st) >> 11) as f64 / (1u64 << 53) as f64
}

/// Log-uniform in [lo, hi].
fn log_uniform(st: &mut u64, lo: u64, hi: u64) -> u64 {
    let (a, b) = ((lo as f64).ln(), (hi as f64).ln());
    ((a + unit(st) * (b - a)).exp().round() as u64).clamp(lo, hi)
}

/// File sizes of the real tree, from [`REAL_SEED`]: what a source tree or a run directory
/// holds, mostly small files with a few large ones, the mix the ext4 figures met.
/// `files / REAL_LARGE_EVERY` (at least one) large files at evenly spaced places, about one in
/// [`REAL_MEDIUM_EVERY`] medium, the rest small (under 16 KiB).
pub fn real_sizes(files: u64) -> Vec<u64> {
    let mut st = REAL_SEED;
    let large = (files / REAL_LARGE_EVERY).max(1).min(files);
    let stride = files / large.max(1);
    (0..files)
        .map(|i| {
            let u = unit(&mut st);
            if stride > 0 && i % stride == stride / 2 && i / stride < large {
                log_uniform(&mut st, REAL_LARGE_MIN, REAL_LARGE_MAX)
            } else if u < 1.0 / REAL_MEDIUM_EVERY as f64 {
                log_uniform(&mut st, REAL_SMALL_MAX, REAL_MEDIUM_MAX)
            } else {
                log_uniform(&mut st, REAL_SMALL_MIN, REAL_SMALL_MAX - 1)
            }
        })
        .collect()
}

/// One emulated link (or the real path, for `--remote`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    /// bit/s; None = uncapped.
    pub rate_bps: Option<u64>,
    pub regime: Regime,
    pub rtt_ms: u32,
}

impl Link {
    pub fn rate_label(&self) -> String {
        rate_label(self.rate_bps)
    }
    pub fn label(&self) -> String {
        format!(
            "{}, {} ms, {} regime",
            self.rate_label(),
            self.rtt_ms,
            regime_name(self.regime)
        )
    }
}

/// One measured configuration, run `runs` times.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Case {
    pub tool: Tool,
    pub direction: Direction,
    pub dataset: Dataset,
    /// Requested streams; 0 = the tool's default (for ferry: its own defaults, no flag given).
    pub streams: u16,
    /// ferry's --block-size; None = its default (not passed). Always None for peers.
    pub block: Option<u64>,
}

impl Case {
    /// Streams actually passed to the tool (clamped to what it accepts).
    pub fn streams_used(&self) -> u16 {
        if self.streams == 0 {
            0
        } else {
            self.streams.min(self.tool.max_streams())
        }
    }
    pub fn block_label(&self) -> String {
        block_label(self.tool, self.block)
    }
}

pub fn block_label(tool: Tool, block: Option<u64>) -> String {
    match (tool, block) {
        (Tool::Ferry, None) => "default".into(),
        (Tool::Ferry, Some(b)) => size_label(b),
        _ => "-".into(),
    }
}

/// iperf3 memory-to-memory point on a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct IperfPoint {
    pub direction: Direction,
    pub streams: u16,
    /// `None`: time-based, slow start skipped — the path's steady-state ceiling. `Some(n)`:
    /// `iperf3 -n n`, timed like a ferry run (process wall clock) — what moving the same bytes
    /// from memory costs, with connection set-up and slow start included.
    #[serde(default)]
    pub bytes: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkPlan {
    pub link: Link,
    pub iperf: Vec<IperfPoint>,
    pub cases: Vec<Case>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub links: Vec<LinkPlan>,
    pub runs: u32,
}

/// What to sweep: a preset, then changed by flags.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    pub rtts_ms: Vec<u32>,
    pub rates: Vec<Option<u64>>,
    pub regimes: Vec<Regime>,
    pub directions: Vec<Direction>,
    /// Single-file data sets, then trees.
    pub datasets: Vec<Dataset>,
    pub streams: Vec<u16>,
    /// Stream counts for the peers that have streams (None: the same as `streams`).
    pub peer_streams: Option<Vec<u16>>,
    /// ferry block sizes; None = ferry's default. Trees run at the first one only.
    pub block_sizes: Vec<Option<u64>>,
    pub ferry: bool,
    pub peers: Vec<Tool>,
    pub iperf3: bool,
    pub runs: u32,
    /// Add the two target cases of the issue (ferry defaults, 1 Gbit/s, default regime, put).
    pub targets: bool,
}

pub const GBIT: u64 = 1_000_000_000;
/// The tree of target (2).
pub const TARGET_TREE: Dataset = Dataset::Tree {
    files: 10_000,
    file_bytes: 10 * KIB,
};
/// The single file with the same total bytes as [`TARGET_TREE`].
pub const TARGET_TREE_FILE: Dataset = Dataset::File {
    bytes: 10_000 * 10 * KIB,
};
pub const TARGET_FILE: Dataset = Dataset::File { bytes: GIB };
pub const TARGET_RTTS: [u32; 3] = [0, 50, 100];
pub const TARGET_TREE_RTT: u32 = 100;

impl Spec {
    /// A few minutes: RTT 0/50, default regime, 1 Gbit/s, put, 100 MiB file, streams 1/4/8,
    /// 16 MiB blocks, 2,000 × 10 KiB, n = 3, rsync and scp when installed.
    pub fn quick() -> Spec {
        Spec {
            rtts_ms: vec![0, 50],
            rates: vec![Some(GBIT)],
            regimes: vec![Regime::Default],
            directions: vec![Direction::Put],
            datasets: vec![
                Dataset::File { bytes: 100 * MIB },
                Dataset::Tree {
                    files: 2000,
                    file_bytes: 10 * KIB,
                },
            ],
            streams: vec![1, 4, 8],
            peer_streams: None,
            block_sizes: vec![Some(16 * MIB)],
            ferry: true,
            peers: vec![Tool::Rsync, Tool::Scp],
            iperf3: true,
            runs: 3,
            targets: false,
        }
    }

    /// The whole sweep of the issue (hours).
    pub fn full() -> Spec {
        Spec {
            rtts_ms: vec![0, 50, 100],
            rates: vec![Some(GBIT), None],
            regimes: vec![Regime::Default, Regime::Tuned],
            directions: vec![Direction::Put, Direction::Get],
            datasets: vec![
                Dataset::File { bytes: 35 * MIB },
                Dataset::File { bytes: 100 * MIB },
                Dataset::File { bytes: 500 * MIB },
                Dataset::File { bytes: GIB },
                TARGET_TREE,
                Dataset::Mixed { files: 1000 },
            ],
            streams: vec![1, 2, 3, 4, 8, 16],
            peer_streams: None,
            block_sizes: vec![Some(16 * MIB), Some(4 * MIB), Some(64 * MIB)],
            ferry: true,
            peers: Tool::PEERS.to_vec(),
            iperf3: true,
            runs: 3,
            targets: true,
        }
    }

    /// The default without a preset flag: the quick preset.
    pub fn tools(&self) -> Vec<Tool> {
        let mut v = Vec::new();
        if self.ferry {
            v.push(Tool::Ferry);
        }
        v.extend(self.peers.iter().copied());
        v
    }
}

fn push_unique<T: PartialEq>(v: &mut Vec<T>, x: T) {
    if !v.contains(&x) {
        v.push(x);
    }
}

/// Turns a spec into the ordered list of links and what runs on each.
pub fn plan(spec: &Spec) -> Plan {
    let mut links: Vec<LinkPlan> = Vec::new();
    for &rate in &spec.rates {
        for &regime in &spec.regimes {
            for &rtt in &spec.rtts_ms {
                let link = Link {
                    rate_bps: rate,
                    regime,
                    rtt_ms: rtt,
                };
                let mut lp = LinkPlan {
                    link,
                    iperf: Vec::new(),
                    cases: Vec::new(),
                };
                for &direction in &spec.directions {
                    if spec.iperf3 {
                        for s in iperf_streams(spec) {
                            push_unique(
                                &mut lp.iperf,
                                IperfPoint {
                                    direction,
                                    streams: s,
                                    bytes: None,
                                },
                            );
                        }
                    }
                    for tool in spec.tools() {
                        for ds in &spec.datasets {
                            let blocks: Vec<Option<u64>> = if tool != Tool::Ferry {
                                vec![None]
                            } else if ds.is_file() {
                                spec.block_sizes.clone()
                            } else {
                                spec.block_sizes.first().copied().into_iter().collect()
                            };
                            // Peers pay round trips per file: on trees they run only at the
                            // largest count (files in flight), or a sweep takes days.
                            let list = match (&spec.peer_streams, tool.is_peer()) {
                                (Some(p), true) => p,
                                _ => &spec.streams,
                            };
                            // 0 (ferry's defaults) is a ferry case only.
                            let list: Vec<u16> = if tool.is_peer() {
                                list.iter().copied().filter(|&s| s > 0).collect()
                            } else {
                                list.clone()
                            };
                            let streams: Vec<u16> = if !tool.has_streams() {
                                vec![1]
                            } else if tool.is_peer() && !ds.is_file() {
                                list.iter().max().copied().into_iter().collect()
                            } else {
                                list
                            };
                            for &s in &streams {
                                for &b in &blocks {
                                    push_unique(
                                        &mut lp.cases,
                                        Case {
                                            tool,
                                            direction,
                                            dataset: ds.clone(),
                                            streams: s,
                                            block: b,
                                        },
                                    );
                                }
                            }
                        }
                    }
                }
                links.push(lp);
            }
        }
    }
    if spec.targets {
        add_targets(&mut links, spec);
    }
    Plan {
        links,
        runs: spec.runs.max(1),
    }
}

/// The stream counts iperf3 runs at: ferry's fixed counts, so that each point has its ceiling
/// beside it; when ferry runs only with its own choice (`--streams 0`), 1, 2, 4 and 8, since a
/// table without a ceiling could not say how far from the path's rate any tool is.
fn iperf_streams(spec: &Spec) -> Vec<u16> {
    let fixed: Vec<u16> = spec.streams.iter().copied().filter(|&s| s > 0).collect();
    if fixed.is_empty() {
        vec![1, 2, 4, 8]
    } else {
        fixed
    }
}

/// The target links and cases: ferry with its defaults (no --streams, no --block-size), put,
/// 1 Gbit/s, default regime: 1 GiB at RTT 0/50/100; at 100 ms also the 10,000 × 10 KiB tree and
/// one file of the same bytes. iperf3 on each of those links, so the ceiling is known.
fn add_targets(links: &mut Vec<LinkPlan>, spec: &Spec) {
    for rtt in TARGET_RTTS {
        let link = Link {
            rate_bps: Some(GBIT),
            regime: Regime::Default,
            rtt_ms: rtt,
        };
        let idx = match links.iter().position(|l| l.link == link) {
            Some(i) => i,
            None => {
                links.push(LinkPlan {
                    link,
                    iperf: Vec::new(),
                    cases: Vec::new(),
                });
                links.len() - 1
            }
        };
        let lp = &mut links[idx];
        for s in iperf_streams(spec) {
            for bytes in [None, Some(TARGET_FILE.bytes())] {
                push_unique(
                    &mut lp.iperf,
                    IperfPoint {
                        direction: Direction::Put,
                        streams: s,
                        bytes,
                    },
                );
            }
        }
        // --no-ferry: only the ceilings (to complete another run's results).
        if !spec.ferry {
            continue;
        }
        let mut sets = vec![TARGET_FILE];
        if rtt == TARGET_TREE_RTT {
            sets.push(TARGET_TREE);
            sets.push(TARGET_TREE_FILE);
        }
        for dataset in sets {
            push_unique(
                &mut lp.cases,
                Case {
                    tool: Tool::Ferry,
                    direction: Direction::Put,
                    dataset,
                    streams: 0,
                    block: None,
                },
            );
        }
    }
}

impl Plan {
    pub fn datasets(&self) -> BTreeSet<Dataset> {
        self.links
            .iter()
            .flat_map(|l| l.cases.iter().map(|c| c.dataset.clone()))
            .collect()
    }

    pub fn runs_total(&self) -> usize {
        self.links
            .iter()
            .map(|l| (l.cases.len() + l.iperf.len()) * self.runs as usize)
            .sum()
    }

    /// A rough duration: bytes at 70% of the link (uncapped: 1.5 Gbit/s), 1.5 s per run,
    /// 2 ms per small file, iperf3 time, 3 s per link.
    pub fn estimate_secs(&self, iperf_secs: u32) -> f64 {
        let mut total = 0.0;
        for l in &self.links {
            let rate = l.link.rate_bps.unwrap_or(1_500_000_000) as f64 * 0.7;
            let rtt = l.link.rtt_ms as f64 / 1e3;
            total += 3.0;
            for c in &l.cases {
                let ds = &c.dataset;
                let slow = if c.tool.is_peer() { 2.0 } else { 1.0 };
                let per = ds.bytes() as f64 * 8.0 / rate * slow
                    + 1.5
                    + 10.0 * rtt
                    + ds.files() as f64 * 0.002;
                total += per * self.runs as f64;
            }
            total += l.iperf.len() as f64 * (iperf_secs as f64 + 1.5) * self.runs as f64;
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_labels() {
        assert_eq!(parse_size_fractional("35M").unwrap(), 35 * MIB);
        assert_eq!(parse_size_fractional("1G").unwrap(), GIB);
        assert_eq!(parse_size_fractional("10KiB").unwrap(), 10 * KIB);
        assert_eq!(parse_size_fractional("1.5g").unwrap(), 3 * GIB / 2);
        assert_eq!(parse_size_fractional("4096").unwrap(), 4096);
        assert!(parse_size_fractional("12 parsecs").is_err());
        assert!(parse_size_fractional("0").is_err());
        assert_eq!(size_label(GIB), "1GiB");
        assert_eq!(size_label(100 * MIB), "100MiB");
        assert_eq!(size_label(102_400_000), "100000KiB");
        assert_eq!(size_label(1000), "1000B");
        assert_eq!(TARGET_TREE.label(), "tree-10000x10KiB");
        assert_eq!(TARGET_TREE_FILE.label(), "file-100000KiB");
        assert_eq!(TARGET_TREE_FILE.bytes(), TARGET_TREE.bytes());
        for ds in [
            TARGET_TREE,
            TARGET_FILE,
            Dataset::Mixed { files: 300 },
            Dataset::File { bytes: 35 * MIB },
        ] {
            assert_eq!(Dataset::parse(&ds.label()).unwrap(), ds);
        }
        assert_eq!(
            Dataset::parse("2000x10K").unwrap(),
            Dataset::Tree {
                files: 2000,
                file_bytes: 10 * KIB
            }
        );
        assert_eq!(
            Dataset::parse("mixed").unwrap(),
            Dataset::Mixed { files: 1000 }
        );
        assert_eq!(
            Dataset::parse("100M").unwrap(),
            Dataset::File { bytes: 100 * MIB }
        );
        assert_eq!(rate_label(Some(GBIT)), "1gbit");
        assert_eq!(rate_label(Some(200_000_000)), "200mbit");
        assert_eq!(rate_label(None), "uncapped");
    }

    #[test]
    fn mixed_sizes_are_fixed_and_log_uniform() {
        let a = mixed_sizes(2000);
        assert_eq!(a, mixed_sizes(2000), "same seed, same sizes");
        assert!(a.iter().all(|&s| (MIXED_MIN..=MIXED_MAX).contains(&s)));
        // log-uniform: about a third of the files in each third of the log range
        // (1K-16K, 16K-512K, 512K-8M are 4, 5 and 4 doublings).
        let small = a.iter().filter(|&&s| s < 16 * KIB).count();
        let large = a.iter().filter(|&&s| s >= 512 * KIB).count();
        assert!((500..800).contains(&small), "{small}");
        assert!((500..800).contains(&large), "{large}");
        // Mean of log-uniform(1K, 8M) = (8M - 1K) / ln(8192) ≈ 0.93 MB.
        let mean = a.iter().sum::<u64>() as f64 / a.len() as f64;
        assert!((700e3..1200e3).contains(&mean), "{mean}");
    }

    #[test]
    fn real_tree_sizes_are_fixed_and_mostly_small() {
        let a = real_sizes(20_000);
        assert_eq!(a, real_sizes(20_000), "same seed, same sizes");
        assert_eq!(a.len(), 20_000);
        assert!(a
            .iter()
            .all(|&s| (REAL_SMALL_MIN..=REAL_LARGE_MAX).contains(&s)));
        let small = a.iter().filter(|&&s| s < 16 * KIB).count();
        let large = a.iter().filter(|&&s| s > 8 * MIB).count();
        let medium = a.len() - small - large;
        // Most under 16 KiB (about 95%), one in 20 medium, one per 2,000 over 8 MiB.
        assert!(small > 18_600, "{small}");
        assert!((800..1200).contains(&medium), "{medium}");
        assert_eq!(large, 10);
        assert!(
            a.iter().all(|&s| s <= MIB || s > 8 * MIB),
            "no size between"
        );
        // Tens to hundreds of MiB in all, so that it runs on a 2-core machine's disk.
        let total = Dataset::Real { files: 20_000 }.bytes();
        assert!((200 * MIB..800 * MIB).contains(&total), "{total}");
        // A small one still has a large file; the same count gives the same sizes.
        let b = real_sizes(300);
        assert_eq!(b.iter().filter(|&&s| s > 8 * MIB).count(), 1);
        assert_eq!(real_sizes(1).len(), 1);
        assert_eq!(Dataset::Real { files: 300 }.sizes(), b);
        assert_eq!(Dataset::Real { files: 300 }.files(), 300);
    }

    #[test]
    fn real_tree_specs() {
        assert_eq!(
            Dataset::parse("real").unwrap(),
            Dataset::Real {
                files: REAL_DEFAULT_FILES
            }
        );
        assert_eq!(
            Dataset::parse("real:5000").unwrap(),
            Dataset::Real { files: 5000 }
        );
        let ds = Dataset::Real { files: 1234 };
        assert_eq!(ds.label(), "real-1234");
        assert_eq!(Dataset::parse(&ds.label()).unwrap(), ds);
        assert!(Dataset::parse("real:0").is_err());
        assert!(Dataset::parse("real:many").is_err());
    }

    #[test]
    fn quick_preset_plan() {
        let p = plan(&Spec::quick());
        assert_eq!(p.runs, 3);
        let links: Vec<_> = p.links.iter().map(|l| l.link).collect();
        assert_eq!(
            links,
            vec![
                Link {
                    rate_bps: Some(GBIT),
                    regime: Regime::Default,
                    rtt_ms: 0
                },
                Link {
                    rate_bps: Some(GBIT),
                    regime: Regime::Default,
                    rtt_ms: 50
                }
            ]
        );
        for l in &p.links {
            // iperf3 at each stream count, put only.
            assert_eq!(
                l.iperf.iter().map(|i| i.streams).collect::<Vec<_>>(),
                vec![1, 4, 8]
            );
            assert!(l.iperf.iter().all(|i| i.direction == Direction::Put));
            let ferry: Vec<_> = l.cases.iter().filter(|c| c.tool == Tool::Ferry).collect();
            // 2 data sets x 3 stream counts x one block size.
            assert_eq!(ferry.len(), 6);
            assert!(ferry.iter().all(|c| c.block == Some(16 * MIB)));
            // rsync and scp: one stream, each data set.
            for peer in [Tool::Rsync, Tool::Scp] {
                let v: Vec<_> = l.cases.iter().filter(|c| c.tool == peer).collect();
                assert_eq!(v.len(), 2);
                assert!(v.iter().all(|c| c.streams == 1 && c.block.is_none()));
            }
            assert_eq!(l.cases.len(), 10);
        }
        assert_eq!(p.runs_total(), 2 * (10 + 3) * 3);
        assert_eq!(
            p.datasets().into_iter().collect::<Vec<_>>(),
            vec![
                Dataset::File { bytes: 100 * MIB },
                Dataset::Tree {
                    files: 2000,
                    file_bytes: 10 * KIB
                }
            ]
        );
        // "a few minutes"
        let est = p.estimate_secs(5);
        assert!(est < 600.0, "{est}");
    }

    #[test]
    fn zero_streams_is_ferrys_defaults_only() {
        let mut spec = Spec::quick();
        spec.streams = vec![0, 4];
        spec.peer_streams = None;
        spec.ferry = true;
        spec.peers = vec![Tool::Xrootd, Tool::Rsync];
        let p = plan(&spec);
        for l in &p.links {
            let streams = |t: Tool| -> Vec<u16> {
                l.cases
                    .iter()
                    .filter(|c| c.tool == t && c.dataset.is_file())
                    .map(|c| c.streams)
                    .collect()
            };
            assert_eq!(streams(Tool::Ferry), vec![0, 4]);
            assert_eq!(streams(Tool::Xrootd), vec![4]);
            assert_eq!(streams(Tool::Rsync), vec![1]);
            assert_eq!(
                l.iperf.iter().map(|i| i.streams).collect::<Vec<_>>(),
                vec![4]
            );
        }
    }

    #[test]
    fn full_preset_plan() {
        let p = plan(&Spec::full());
        // 2 rates x 2 regimes x 3 RTTs
        assert_eq!(p.links.len(), 12);
        let l = &p.links[0];
        let target_link = l.link.rate_bps == Some(GBIT) && l.link.regime == Regime::Default;
        // iperf3: 6 stream counts x 2 directions; on the targets' link also `-n 1GiB` (put)
        // at each stream count, the like-for-like ceiling of the 1 GiB target.
        let same_bytes = l.iperf.iter().filter(|i| i.bytes.is_some()).count();
        assert_eq!(same_bytes, if target_link { 6 } else { 0 });
        assert_eq!(l.iperf.len(), 12 + same_bytes);
        assert!(l
            .iperf
            .iter()
            .filter_map(|i| i.bytes)
            .all(|b| b == TARGET_FILE.bytes()));
        let ferry = l.cases.iter().filter(|c| c.tool == Tool::Ferry).count();
        // per direction: 4 files x 6 streams x 3 blocks + 2 trees x 6 streams (first block)
        let per_dir = 4 * 6 * 3 + 2 * 6;
        let targets = if target_link { 1 } else { 0 };
        assert_eq!(ferry, 2 * per_dir + targets);
        // xrootd and gridftp sweep streams, rsync and scp run once per data set.
        // (files at each stream count, trees at the largest)
        let x = l.cases.iter().filter(|c| c.tool == Tool::Xrootd).count();
        assert_eq!(x, 2 * (4 * 6 + 2));
        assert!(l
            .cases
            .iter()
            .filter(|c| c.tool == Tool::Gridftp && !c.dataset.is_file())
            .all(|c| c.streams == 16));
        let r = l.cases.iter().filter(|c| c.tool == Tool::Rsync).count();
        assert_eq!(r, 2 * 6);
        let x16 = l
            .cases
            .iter()
            .find(|c| c.tool == Tool::Xrootd && c.streams == 16)
            .unwrap();
        assert_eq!(x16.streams_used(), 15);
        // trees run at the first block size only
        assert!(l
            .cases
            .iter()
            .filter(|c| c.tool == Tool::Ferry && !c.dataset.is_file() && c.streams != 0)
            .all(|c| c.block == Some(16 * MIB)));
    }

    #[test]
    fn targets_add_default_cases_and_links() {
        let mut s = Spec::quick();
        s.targets = true;
        let p = plan(&s);
        // quick has RTT 0 and 50; targets add 100.
        let rtts: Vec<u32> = p.links.iter().map(|l| l.link.rtt_ms).collect();
        assert_eq!(rtts, vec![0, 50, 100]);
        for l in &p.links {
            let t: Vec<_> = l
                .cases
                .iter()
                .filter(|c| c.streams == 0 && c.block.is_none())
                .collect();
            let want = if l.link.rtt_ms == 100 { 3 } else { 1 };
            assert_eq!(t.len(), want, "{:?}", l.link);
            assert!(t.iter().all(|c| c.tool == Tool::Ferry));
            assert!(t.iter().any(|c| c.dataset == TARGET_FILE));
            assert!(!l.iperf.is_empty());
        }
        let l100 = &p.links[2];
        assert!(l100.cases.iter().any(|c| c.dataset == TARGET_TREE));
        assert!(l100.cases.iter().any(|c| c.dataset == TARGET_TREE_FILE));
        // the added link has only the target cases
        assert_eq!(l100.cases.len(), 3);
    }

    #[test]
    fn ferry_defaults_alone_still_get_a_ceiling() {
        // `--streams 0` (ferry's own choice only) once planned no iperf3 point at all, and a
        // get sweep's tables came out without a ceiling.
        let mut s = Spec::quick();
        s.streams = vec![0];
        s.directions = vec![Direction::Put, Direction::Get];
        let p = plan(&s);
        for l in &p.links {
            for d in [Direction::Put, Direction::Get] {
                let counts: Vec<u16> = l
                    .iperf
                    .iter()
                    .filter(|i| i.direction == d && i.bytes.is_none())
                    .map(|i| i.streams)
                    .collect();
                assert_eq!(counts, vec![1, 2, 4, 8], "{:?} {d:?}", l.link);
            }
        }
        // fixed counts are the ceiling's counts, as before
        s.streams = vec![0, 3, 16];
        let p = plan(&s);
        for l in &p.links {
            let counts: Vec<u16> = l
                .iperf
                .iter()
                .filter(|i| i.direction == Direction::Get)
                .map(|i| i.streams)
                .collect();
            assert_eq!(counts, vec![3, 16], "{:?}", l.link);
        }
    }

    #[test]
    fn no_ferry_no_iperf() {
        let mut s = Spec::quick();
        s.ferry = false;
        s.iperf3 = false;
        s.peers = vec![Tool::Xrootd];
        s.streams = vec![1, 2, 4];
        s.peer_streams = Some(vec![1, 16]);
        let p = plan(&s);
        for l in &p.links {
            assert!(l.iperf.is_empty());
            assert!(l.cases.iter().all(|c| c.tool == Tool::Xrootd));
            // the file at 1 and 16 streams, the tree at 16
            assert_eq!(l.cases.len(), 3);
        }
    }
}
