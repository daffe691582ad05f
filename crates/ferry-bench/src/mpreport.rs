//! Multipath mode's results: one row per timed put, and per K and data set the medians, the
//! rate as a share of K × one link's rate (the target is 0.9), the rate against K = 1's,
//! and how the bytes spread over the links.

use std::fmt::Write as _;

use ferry_units::stats::median_of;
use ferry_units::units::{format_bytes, format_mbps};
use serde::{Deserialize, Serialize};

use crate::data::Digest;
use crate::plan::Dataset;

/// The target: K links reach this share of K × one link's rate.
pub const TARGET: f64 = 0.9;

/// One timed put.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MpRow {
    /// 1-based round (0: the warm-up, not recorded).
    pub run: u32,
    /// "ferry" or "gridftp".
    pub tool: String,
    /// Paths (links) the put used.
    pub k: usize,
    /// The data set's label, e.g. "file-1GiB", "mixed-1000".
    pub dataset: String,
    pub files: u64,
    pub bytes: u64,
    /// Process start to exit.
    pub wall_s: f64,
    /// bytes × 8 / wall_s / 10⁶.
    pub mbit_s: f64,
    /// The destination has the source's files, sizes and BLAKE3.
    pub verified: bool,
    /// IP bytes each link of the topology delivered (both directions) while it ran, in link
    /// order; links above K carry nothing.
    pub link_bytes: Vec<u64>,
    /// From the put's `--json` tuning: streams carrying data at the end, connections opened,
    /// and what it names as the limit (network, storage, cpu); GridFTP's rows have none.
    pub streams: Option<u64>,
    pub connections: Option<u64>,
    /// A striped transfer's hosts, the coordinator first: data connections that carried
    /// blocks / opened, as `--json` reports them (the coordinator's from its tuning).
    #[serde(default)]
    pub host_connections: Vec<String>,
    pub bottleneck: String,
    pub error: String,
}

impl MpRow {
    pub fn new(run: u32, tool: &str, k: usize, ds: &Dataset, want: &Digest) -> MpRow {
        MpRow {
            run,
            tool: tool.into(),
            k,
            dataset: ds.label(),
            files: want.files,
            bytes: want.bytes,
            wall_s: 0.0,
            mbit_s: 0.0,
            verified: false,
            link_bytes: Vec::new(),
            streams: None,
            connections: None,
            host_connections: Vec::new(),
            bottleneck: String::new(),
            error: String::new(),
        }
    }

    pub fn ok(&self) -> bool {
        self.error.is_empty() && self.verified && self.mbit_s > 0.0
    }
}

/// iperf3 over the first K links at once.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MpCeiling {
    pub k: usize,
    /// The links' receivers' steady goodput together, Mbit/s.
    pub mbit_s: f64,
    /// Each link's, in link order.
    pub per_link: Vec<f64>,
}

/// One K on one data set, over its verified rows.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MpPoint {
    pub tool: String,
    pub dataset: String,
    pub k: usize,
    /// Rows that completed and verified, of those run.
    pub ok: usize,
    pub runs: usize,
    pub median_s: Option<f64>,
    pub median_mbit_s: Option<f64>,
    pub min_mbit_s: Option<f64>,
    pub max_mbit_s: Option<f64>,
    /// K × one link's rate, Mbit/s.
    pub target_mbit_s: f64,
    /// The median rate over K × one link's rate (the issue asks for ≥ [`TARGET`]).
    pub vs_links: Option<f64>,
    /// The median rate over the same tool's K = 1 on the same data set (None without one).
    pub vs_one_path: Option<f64>,
    /// A copy's median rate over the put's (tool "ferry") at the same K on the same data set
    /// (None for the put itself, GridFTP, or without a put figure).
    #[serde(default)]
    pub vs_put: Option<f64>,
    /// The median rate over iperf3's over the same K links (None without a ceiling).
    pub vs_iperf3: Option<f64>,
    /// Median IP bytes per link, in link order.
    pub link_bytes: Vec<u64>,
    /// The median of each link's share of all links' bytes.
    pub link_share: Vec<f64>,
    /// What the puts named as their limit, the most frequent (ties: the first met).
    pub bottleneck: String,
    pub median_streams: Option<f64>,
}

/// The bed as it ran.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MpBed {
    /// Links in the topology (the largest K).
    pub links: usize,
    pub rtt_ms: u64,
    /// Each link's rate, bit/s.
    pub rate_bps: u64,
    pub regime: String,
    /// Striped: link i goes to its own server host, all sharing one directory, and the put
    /// stripes over them (`--stripe-hosts`); else the K links join c to one server.
    #[serde(default)]
    pub striped: bool,
}

/// Everything a multipath run wrote to results.json.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MpReport {
    pub command: String,
    pub started: String,
    pub duration_s: f64,
    pub host: Vec<(String, String)>,
    /// Where the data and the destinations were, and their file system.
    pub storage: String,
    pub bed: MpBed,
    /// The K values, in the order each round ran them.
    pub paths: Vec<usize>,
    /// "ferry", and "gridftp" when it ran beside it.
    pub tools: Vec<String>,
    pub datasets: Vec<String>,
    pub runs: u32,
    /// One unrecorded put per K and data set ran first.
    pub warmup: bool,
    pub target: f64,
    /// iperf3 per K, measured once before the transfers (empty with --no-iperf3).
    pub ceilings: Vec<MpCeiling>,
    pub points: Vec<MpPoint>,
    pub rows: Vec<MpRow>,
    pub notes: Vec<String>,
}

fn med(v: impl Iterator<Item = f64>) -> Option<f64> {
    median_of(&v.collect::<Vec<_>>())
}

/// The most frequent of `v`, the first met on a tie; "" for none.
fn most_common(v: &[&str]) -> String {
    let mut best = ("", 0);
    for x in v {
        let n = v.iter().filter(|y| *y == x).count();
        if n > best.1 {
            best = (x, n);
        }
    }
    best.0.to_owned()
}

impl MpReport {
    /// Fills the points from the rows: one per tool, data set and K, in the order they ran.
    pub fn summarize(&mut self) {
        self.target = TARGET;
        self.points.clear();
        for tool in &self.tools {
            for ds in &self.datasets {
                for &k in &self.paths {
                    let p = self.point(tool, ds, k);
                    self.points.push(p);
                }
            }
        }
        let one: Vec<(String, String, Option<f64>)> = self
            .points
            .iter()
            .filter(|p| p.k == 1)
            .map(|p| (p.tool.clone(), p.dataset.clone(), p.median_mbit_s))
            .collect();
        let puts: Vec<(String, usize, Option<f64>)> = self
            .points
            .iter()
            .filter(|p| p.tool == "ferry")
            .map(|p| (p.dataset.clone(), p.k, p.median_mbit_s))
            .collect();
        for p in &mut self.points {
            let base = one
                .iter()
                .find(|(t, d, _)| *t == p.tool && *d == p.dataset)
                .and_then(|x| x.2);
            p.vs_one_path = match (p.median_mbit_s, base) {
                (Some(m), Some(b)) if b > 0.0 => Some(m / b),
                _ => None,
            };
            let put = puts
                .iter()
                .find(|(d, k, _)| *d == p.dataset && *k == p.k)
                .and_then(|x| x.2);
            p.vs_put = match (p.median_mbit_s, put) {
                (Some(m), Some(b)) if b > 0.0 && p.tool.starts_with("ferry-cp") => Some(m / b),
                _ => None,
            };
            let ceiling = self.ceilings.iter().find(|c| c.k == p.k).map(|c| c.mbit_s);
            p.vs_iperf3 = match (p.median_mbit_s, ceiling) {
                (Some(m), Some(c)) if c > 0.0 => Some(m / c),
                _ => None,
            };
        }
    }

    fn point(&self, tool: &str, ds: &str, k: usize) -> MpPoint {
        let all: Vec<&MpRow> = self
            .rows
            .iter()
            .filter(|r| r.tool == tool && r.dataset == ds && r.k == k)
            .collect();
        let ok: Vec<&MpRow> = all.iter().copied().filter(|r| r.ok()).collect();
        let rate = |r: &&MpRow| r.mbit_s;
        let links = ok.iter().map(|r| r.link_bytes.len()).max().unwrap_or(0);
        let link_bytes = (0..links)
            .map(|i| {
                let v = ok
                    .iter()
                    .map(|r| r.link_bytes.get(i).copied().unwrap_or(0) as f64);
                med(v).unwrap_or(0.0) as u64
            })
            .collect();
        let link_share = (0..links)
            .map(|i| {
                med(ok.iter().map(|r| {
                    let all: u64 = r.link_bytes.iter().sum();
                    r.link_bytes.get(i).copied().unwrap_or(0) as f64 / all.max(1) as f64
                }))
                .unwrap_or(0.0)
            })
            .collect();
        let median_mbit_s = med(ok.iter().map(rate));
        let target_mbit_s = k as f64 * self.bed.rate_bps as f64 / 1e6;
        let names: Vec<&str> = ok.iter().map(|r| r.bottleneck.as_str()).collect();
        MpPoint {
            tool: tool.to_owned(),
            dataset: ds.to_owned(),
            k,
            ok: ok.len(),
            runs: all.len(),
            median_s: med(ok.iter().map(|r| r.wall_s)),
            median_mbit_s,
            min_mbit_s: ok.iter().map(rate).reduce(f64::min),
            max_mbit_s: ok.iter().map(rate).reduce(f64::max),
            target_mbit_s,
            vs_links: median_mbit_s
                .filter(|_| target_mbit_s > 0.0)
                .map(|m| m / target_mbit_s),
            vs_one_path: None,
            vs_put: None,
            vs_iperf3: None,
            link_bytes,
            link_share,
            bottleneck: most_common(&names),
            median_streams: med(ok.iter().filter_map(|r| r.streams.map(|s| s as f64))),
        }
    }

    pub fn failed(&self) -> usize {
        self.rows.iter().filter(|r| !r.ok()).count()
    }
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "n/a".into(), f)
}

/// One point's table row.
fn table_row(p: &MpPoint) -> String {
    let spread = p
        .link_bytes
        .iter()
        .zip(&p.link_share)
        .take(p.k)
        .map(|(b, s)| format!("{} ({:.0}%)", format_bytes(*b), s * 100.0))
        .collect::<Vec<_>>()
        .join(" / ");
    format!(
        "| {} | {} | {} | {}/{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        p.tool,
        p.dataset,
        p.k,
        p.ok,
        p.runs,
        opt(p.median_s, |v| format!("{v:.2}")),
        opt(p.median_mbit_s, |v| format!("{v:.0}")),
        format_mbps(p.target_mbit_s),
        opt(p.vs_links, |v| format!("{v:.2}")),
        opt(p.vs_one_path, |v| format!("{v:.2}×")),
        opt(p.vs_put, |v| format!("{v:.2}×")),
        opt(p.vs_iperf3, |v| format!("{v:.2}")),
        if spread.is_empty() {
            "n/a".into()
        } else {
            spread
        },
        opt(p.median_streams, |v| format!("{v:.0}")),
        if p.bottleneck.is_empty() {
            "n/a"
        } else {
            &p.bottleneck
        },
    )
}

/// The short text printed at the end and kept as summary.md.
pub fn summary(r: &MpReport) -> String {
    let mut s = String::from("# ferry-bench multipath\n\n");
    let b = &r.bed;
    let links = format!(
        "{} link{} of {}, {} ms each",
        b.links,
        if b.links == 1 { "" } else { "s" },
        format_mbps(b.rate_bps as f64 / 1e6),
        b.rtt_ms,
    );
    let per_k = if b.striped {
        let _ = writeln!(
            s,
            "Bed: client c with {links}, link i to server s(i+1); the servers share one \
             directory; regime {}.",
            b.regime
        );
        "Per K: `ferry serve` on s1 and `ferry serve --stripe` on s2 to sK, each on its link, \
         `ferry put --stripe` to s1 over the others (K = 1: a plain put to s1)."
    } else {
        let _ = writeln!(
            s,
            "Bed: client c and server s joined by {links}; regime {}.",
            b.regime
        );
        "Per K: `ferry serve --listen` on s's address on each of the first K links, `ferry put \
         --bind` c's address on each (K = 1: a plain put over link 0)."
    };
    let copies: Vec<&str> = r
        .tools
        .iter()
        .filter_map(|t| t.strip_prefix("ferry-cp-"))
        .collect();
    let copies = if copies.is_empty() {
        String::new()
    } else {
        format!(
            " After each put, striped copies ({}) with a `ferry serve --third-party` on c, the \
             K servers (`--third-party` too) as one endpoint `site` of the client's config: \
             push `ferry cp c:/data/X site:/` (c's server sends, striped over them), pull \
             `ferry cp --pull site:/X c:/mp-cdest/` (c's server gets, striped from them); the \
             client runs in c; `vs put` is a copy's median over the put's at that K.",
            copies.join(", ")
        )
    };
    let _ = writeln!(
        s,
        "{per_k}{copies} Data: {}; {}. {} round{}{}, \
         each every data set at every K ({}); times are process start to exit, every \
         destination checked (files, sizes, BLAKE3).{}\n",
        r.datasets.join(", "),
        r.storage,
        r.runs,
        if r.runs == 1 { "" } else { "s" },
        if r.warmup {
            " after one unrecorded put per K and data set"
        } else {
            ""
        },
        r.paths
            .iter()
            .map(|k| format!("K={k}"))
            .collect::<Vec<_>>()
            .join(", "),
        if r.tools.iter().any(|t| t == "gridftp") {
            " GridFTP after ferry at each K: K = 1 one plain `globus-gridftp-server`; K > 1 a \
             front end (`-r`) and one data node (`-dn`) on each link, `globus-url-copy -stripe`; \
             `-fast -p 4`, trees `-r -cd -cc 4`; anonymous clear text."
        } else {
            ""
        },
    );
    s.push_str(
        "| tool | data | K | ok | median s | median Mbit/s | K × link | rate / (K × link) | \
         vs K=1 | vs put | vs iperf3 | bytes per link (share) | streams | bottleneck |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|\n",
    );
    for p in &r.points {
        s.push_str(&table_row(p));
        s.push('\n');
    }
    s.push('\n');
    for c in &r.ceilings {
        let _ = writeln!(
            s,
            "- iperf3 over {} link{} at once (one client per link, steady seconds): {:.0} Mbit/s ({})",
            c.k,
            if c.k == 1 { "" } else { "s" },
            c.mbit_s,
            c.per_link
                .iter()
                .map(|m| format!("{m:.0}"))
                .collect::<Vec<_>>()
                .join(" + ")
        );
    }
    let reached: Vec<String> = r
        .points
        .iter()
        .filter(|p| p.k > 1)
        .map(|p| {
            let v = p.vs_links.unwrap_or(0.0);
            format!(
                "{} {} K={}: {}",
                p.tool,
                p.dataset,
                p.k,
                if v >= r.target { "yes" } else { "no" }
            )
        })
        .collect();
    if !reached.is_empty() {
        let _ = writeln!(
            s,
            "- target (rate ≥ {:.1} × K × one link's): {}",
            r.target,
            reached.join("; ")
        );
    }
    for (k, v) in r.host.iter().filter(|(k, _)| k.starts_with("load")) {
        let _ = writeln!(s, "- {k}: {v}");
    }
    let failed = r.failed();
    if failed > 0 {
        let _ = writeln!(s, "- {failed} transfers failed (results.json, rows' error)");
    }
    for n in &r.notes {
        let _ = writeln!(s, "- {n}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(run: u32, k: usize, wall: f64, links: Vec<u64>) -> MpRow {
        let ds = Dataset::File { bytes: 1 << 30 };
        let want = Digest {
            files: 1,
            bytes: 1 << 30,
            blake3: String::new(),
        };
        let mut r = MpRow::new(run, "ferry", k, &ds, &want);
        r.wall_s = wall;
        r.mbit_s = (1u64 << 30) as f64 * 8.0 / wall / 1e6;
        r.verified = true;
        r.link_bytes = links;
        r.bottleneck = "network".into();
        r
    }

    #[test]
    fn points_come_from_the_verified_rows() {
        let g = 1u64 << 30;
        let mut r = MpReport {
            bed: MpBed {
                links: 2,
                rate_bps: 300_000_000,
                ..Default::default()
            },
            paths: vec![1, 2],
            tools: vec!["ferry".into()],
            datasets: vec!["file-1GiB".into()],
            rows: vec![
                row(1, 1, 30.0, vec![g, 0]),
                row(1, 2, 16.0, vec![g / 2, g / 2]),
                row(2, 1, 31.0, vec![g, 0]),
                row(2, 2, 15.0, vec![g / 4, 3 * g / 4]),
                row(3, 1, 29.0, vec![g, 0]),
                row(3, 2, 17.0, vec![g / 2, g / 2]),
            ],
            ..Default::default()
        };
        r.ceilings = vec![MpCeiling {
            k: 2,
            mbit_s: 580.0,
            per_link: vec![290.0, 290.0],
        }];
        let mut bad = row(4, 2, 1.0, vec![0, 0]);
        bad.error = "put exit 1".into();
        r.rows.push(bad);
        r.summarize();
        assert_eq!(r.points.len(), 2);
        let (one, two) = (&r.points[0], &r.points[1]);
        assert_eq!((one.k, one.ok, one.runs), (1, 3, 3));
        assert_eq!((two.k, two.ok, two.runs), (2, 3, 4));
        assert_eq!(two.median_s, Some(16.0));
        assert_eq!(two.target_mbit_s, 600.0);
        let want = g as f64 * 8.0 / 16.0 / 1e6 / 600.0;
        assert!((two.vs_links.unwrap() - want).abs() < 1e-9);
        assert!((two.vs_one_path.unwrap() - 30.0 / 16.0).abs() < 1e-9);
        assert!((two.vs_iperf3.unwrap() - g as f64 * 8.0 / 16.0 / 1e6 / 580.0).abs() < 1e-9);
        assert_eq!(one.vs_iperf3, None);
        assert_eq!(two.link_bytes, [g / 2, g / 2]);
        assert_eq!(two.link_share, [0.5, 0.5]);
        assert_eq!(one.link_share, [1.0, 0.0]);
        assert_eq!(two.bottleneck, "network");
        assert_eq!(r.failed(), 1);
        let text = summary(&r);
        assert!(
            text.contains("| ferry | file-1GiB | 2 | 3/4 | 16.00 | 537 |"),
            "{text}"
        );
        assert!(text.contains("ferry file-1GiB K=2: no"), "{text}");
        assert!(text.contains("1 transfers failed"), "{text}");
        assert!(
            text.contains("at once (one client per link, steady seconds): 580 Mbit/s (290 + 290)"),
            "{text}"
        );
    }

    #[test]
    fn a_copy_is_compared_with_the_put_at_its_k() {
        let g = 1u64 << 30;
        let tool = |mut r: MpRow, t: &str| {
            r.tool = t.into();
            r
        };
        let mut r = MpReport {
            bed: MpBed {
                links: 2,
                rate_bps: 300_000_000,
                striped: true,
                ..Default::default()
            },
            paths: vec![1, 2],
            tools: vec![
                "ferry".into(),
                "ferry-cp-push".into(),
                "ferry-cp-pull".into(),
            ],
            datasets: vec!["file-1GiB".into()],
            rows: vec![
                row(1, 1, 30.0, vec![g, 0]),
                row(1, 2, 16.0, vec![g / 2, g / 2]),
                tool(row(1, 1, 32.0, vec![g, 0]), "ferry-cp-push"),
                tool(row(1, 2, 20.0, vec![g / 4, 3 * g / 4]), "ferry-cp-push"),
                tool(row(1, 2, 16.0, vec![g / 2, g / 2]), "ferry-cp-pull"),
            ],
            ..Default::default()
        };
        r.summarize();
        let p = |t: &str, k: usize| {
            r.points
                .iter()
                .find(|p| p.tool == t && p.k == k)
                .unwrap()
                .clone()
        };
        assert_eq!(p("ferry", 2).vs_put, None);
        assert!((p("ferry-cp-push", 2).vs_put.unwrap() - 16.0 / 20.0).abs() < 1e-9);
        assert!((p("ferry-cp-push", 1).vs_put.unwrap() - 30.0 / 32.0).abs() < 1e-9);
        assert!((p("ferry-cp-pull", 2).vs_put.unwrap() - 1.0).abs() < 1e-9);
        // No pull at K = 1: no figure, and no ratio to K = 1 for the pull at 2.
        assert_eq!(p("ferry-cp-pull", 1).vs_put, None);
        assert_eq!(p("ferry-cp-pull", 2).vs_one_path, None);
        assert_eq!(p("ferry-cp-push", 2).link_share, [0.25, 0.75]);
        let text = summary(&r);
        assert!(text.contains("striped copies (push, pull)"), "{text}");
        assert!(
            text.contains("| ferry-cp-push | file-1GiB | 2 | 1/1 | 20.00 | 429 | 600 Mbit/s | 0.72 | 1.60× | 0.80× |"),
            "{text}"
        );
    }

    #[test]
    fn no_verified_rows_leave_the_figures_empty() {
        let mut r = MpReport {
            paths: vec![1],
            tools: vec!["gridftp".into()],
            datasets: vec![Dataset::File { bytes: 10 }.label()],
            rows: vec![MpRow::new(
                1,
                "gridftp",
                1,
                &Dataset::File { bytes: 10 },
                &Digest {
                    files: 1,
                    bytes: 10,
                    blake3: String::new(),
                },
            )],
            ..Default::default()
        };
        r.summarize();
        assert_eq!(r.points[0].median_s, None);
        assert_eq!(r.points[0].vs_links, None);
        let text = summary(&r);
        assert!(
            text.contains("| gridftp | file-10B | 1 | 0/1 | n/a |"),
            "{text}"
        );
    }
}
