//! Results: one CSV row per run, medians per point, the markdown summary with ratios to
//! iperf3 and to the best peer, and the two targets of the issue.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use ferry_units::stats::median_of;
use serde::{Deserialize, Serialize};

use crate::plan::{TARGET_FILE, TARGET_RTTS, TARGET_TREE, TARGET_TREE_FILE, TARGET_TREE_RTT};

/// One run of one point (also one iperf3 run).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub tool: String,
    pub direction: String,
    /// "1gbit", "uncapped", or "remote".
    pub rate: String,
    pub rtt_ms: u32,
    /// "default", "tuned", or "remote".
    pub regime: String,
    /// Data set label; "memory" for iperf3.
    pub dataset: String,
    pub files: u64,
    pub bytes: u64,
    /// Requested; 0 = the tool's default.
    pub streams: u16,
    /// Passed to the tool (xrdcp takes at most 15); 0 = its default.
    pub streams_used: u16,
    pub block: String,
    /// 1-based run index.
    pub run: u32,
    /// From starting the client to its exit, measured by the bench.
    pub wall_s: f64,
    /// A syncfs of the destination right after the client exited (what was not yet durable).
    pub sync_s: f64,
    /// The tool's own figure (ferry's JSON `seconds`), when it gives one.
    pub tool_s: Option<f64>,
    /// bytes × 8 / (wall_s + sync_s) / 1e6; for iperf3 the receiver's mean goodput.
    pub mbps: f64,
    /// bytes × 8 / tool_s / 1e6; for iperf3 the median 1-s interval.
    pub tool_mbps: Option<f64>,
    /// Size and BLAKE3 of the destination matched the source.
    pub verified: bool,
    pub error: String,
    /// Unix time the run started.
    pub started: u64,
    /// ferry only: seconds of its data phase until the rate over 1 s first came within 10% of
    /// the final rate (from its `--json` timeline; see [`ramp`]). Empty for short transfers.
    #[serde(default)]
    pub ramp_s: Option<f64>,
    /// iperf3 on a rate-limited bed: what the link can deliver to a TCP receiver, rate × MSS /
    /// MTU ([`crate::iperf::payload_capacity_mbps`]). The steady-state ceiling never exceeds it.
    #[serde(default)]
    pub link_mbps: Option<f64>,
}

impl Row {
    pub fn ok(&self) -> bool {
        self.error.is_empty() && self.verified && self.mbps > 0.0
    }
    fn key(&self) -> Key {
        Key {
            rate: self.rate.clone(),
            regime: self.regime.clone(),
            rtt_ms: self.rtt_ms,
            direction: self.direction.clone(),
            dataset: self.dataset.clone(),
            tool: self.tool.clone(),
            streams: self.streams,
            block: self.block.clone(),
        }
    }
}

/// Identity of a point.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Key {
    pub rate: String,
    pub regime: String,
    pub rtt_ms: u32,
    pub direction: String,
    pub dataset: String,
    pub tool: String,
    pub streams: u16,
    pub block: String,
}

impl Key {
    fn link(&self) -> (String, String, u32, String) {
        (
            self.rate.clone(),
            self.regime.clone(),
            self.rtt_ms,
            self.direction.clone(),
        )
    }
}

/// Medians of one point over its runs (failed runs are counted, not used).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Med {
    pub tool: String,
    pub direction: String,
    pub rate: String,
    pub rtt_ms: u32,
    pub regime: String,
    pub dataset: String,
    pub files: u64,
    pub bytes: u64,
    pub streams: u16,
    pub streams_used: u16,
    pub block: String,
    pub runs: u32,
    pub ok_runs: u32,
    pub mbps_median: f64,
    pub mbps_min: f64,
    pub mbps_max: f64,
    /// Median of wall_s + sync_s (the time until the data was durable).
    pub wall_s_median: f64,
    pub sync_s_median: f64,
    pub tool_s_median: Option<f64>,
    #[serde(default)]
    pub ramp_s_median: Option<f64>,
    /// The lowest [`Row::link_mbps`] of the point's runs.
    #[serde(default)]
    pub link_mbps: Option<f64>,
    pub all_verified: bool,
    pub first_error: String,
}

impl Med {
    pub fn key(&self) -> Key {
        Key {
            rate: self.rate.clone(),
            regime: self.regime.clone(),
            rtt_ms: self.rtt_ms,
            direction: self.direction.clone(),
            dataset: self.dataset.clone(),
            tool: self.tool.clone(),
            streams: self.streams,
            block: self.block.clone(),
        }
    }
    pub fn usable(&self) -> bool {
        self.ok_runs > 0
    }
}

pub fn medians(rows: &[Row]) -> Vec<Med> {
    let mut groups: BTreeMap<Key, Vec<&Row>> = BTreeMap::new();
    for r in rows {
        groups.entry(r.key()).or_default().push(r);
    }
    // Keep the order in which points were first run.
    let mut order: Vec<Key> = Vec::new();
    for r in rows {
        let k = r.key();
        if !order.contains(&k) {
            order.push(k);
        }
    }
    order
        .into_iter()
        .map(|k| {
            let g = &groups[&k];
            let ok: Vec<&&Row> = g.iter().filter(|r| r.ok()).collect();
            let mbps: Vec<f64> = ok.iter().map(|r| r.mbps).collect();
            let wall: Vec<f64> = ok.iter().map(|r| r.wall_s + r.sync_s).collect();
            let sync: Vec<f64> = ok.iter().map(|r| r.sync_s).collect();
            let tool_s: Vec<f64> = ok.iter().filter_map(|r| r.tool_s).collect();
            let ramp: Vec<f64> = ok.iter().filter_map(|r| r.ramp_s).collect();
            let first = g[0];
            Med {
                tool: k.tool.clone(),
                direction: k.direction.clone(),
                rate: k.rate.clone(),
                rtt_ms: k.rtt_ms,
                regime: k.regime.clone(),
                dataset: k.dataset.clone(),
                files: first.files,
                bytes: first.bytes,
                streams: k.streams,
                streams_used: first.streams_used,
                block: k.block.clone(),
                runs: g.len() as u32,
                ok_runs: ok.len() as u32,
                mbps_median: median_of(&mbps).unwrap_or(0.0),
                mbps_min: mbps.iter().copied().fold(f64::INFINITY, f64::min),
                mbps_max: mbps.iter().copied().fold(0.0, f64::max),
                wall_s_median: median_of(&wall).unwrap_or(0.0),
                sync_s_median: median_of(&sync).unwrap_or(0.0),
                tool_s_median: median_of(&tool_s),
                ramp_s_median: median_of(&ramp),
                link_mbps: ok
                    .iter()
                    .filter_map(|r| r.link_mbps)
                    .min_by(|a, b| a.total_cmp(b)),
                all_verified: g.iter().all(|r| r.verified),
                first_error: g
                    .iter()
                    .find(|r| !r.error.is_empty())
                    .map(|r| r.error.clone())
                    .unwrap_or_default(),
            }
        })
        .map(|mut m| {
            if !m.mbps_min.is_finite() || m.ok_runs == 0 {
                m.mbps_min = 0.0;
            }
            m
        })
        .collect()
}

pub fn write_csv<T: Serialize>(path: &Path, items: &[T]) -> Result<()> {
    let mut w = csv::Writer::from_path(path).with_context(|| format!("{}", path.display()))?;
    for it in items {
        w.serialize(it)?;
    }
    w.flush()?;
    Ok(())
}

pub fn read_rows(path: &Path) -> Result<Vec<Row>> {
    let mut r = csv::Reader::from_path(path).with_context(|| format!("{}", path.display()))?;
    r.deserialize()
        .collect::<Result<Vec<Row>, _>>()
        .with_context(|| format!("parsing {}", path.display()))
}

/// Appends rows to a CSV file as they come (header when the file is new), so that an
/// interrupted sweep keeps what it measured.
pub struct CsvLog {
    w: csv::Writer<std::fs::File>,
}

impl CsvLog {
    pub fn create(path: &Path) -> Result<CsvLog> {
        let f = std::fs::File::create(path).with_context(|| format!("{}", path.display()))?;
        Ok(CsvLog {
            w: csv::Writer::from_writer(f),
        })
    }
    pub fn push(&mut self, row: &Row) -> Result<()> {
        self.w.serialize(row)?;
        self.w.flush()?;
        Ok(())
    }
}

/// The steady-state ceiling of a link and direction: iperf3's best median, held to what the
/// link can carry where the bed says ([`Row::link_mbps`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ceiling {
    /// Mbit/s: the lower of `measured` and `link`.
    pub mbps: f64,
    /// The iperf3 stream count of the best median.
    pub streams: u16,
    /// iperf3's best median as measured.
    pub measured: f64,
    /// The link's payload capacity, when known.
    pub link: Option<f64>,
}

impl Ceiling {
    /// `-P 8`, and what held a measured figure to the link's capacity, if anything did.
    pub fn describe(&self) -> String {
        match self.held() {
            Some(why) => format!("-P {}; {why}", self.streams),
            None => format!("-P {}", self.streams),
        }
    }

    /// Why the ceiling is below the measured figure, if it is.
    pub fn held(&self) -> Option<String> {
        match self.link {
            Some(l) if self.measured > l => Some(format!(
                "measured {:.0}, more than the link carries: held to its {l:.1} (rate × MSS / MTU)",
                self.measured
            )),
            _ => None,
        }
    }
}

/// The steady-state ceiling on a link and direction (see [`Ceiling`]).
pub fn iperf_best(meds: &[Med], rate: &str, regime: &str, rtt: u32, dir: &str) -> Option<Ceiling> {
    ceiling_of(meds, "memory", rate, regime, rtt, dir)
}

/// The best median of an iperf3 data set on a link, held to the link's capacity, which the
/// link's steady-state rows carry (an `-n` run's wall clock can also exceed it: iperf3 ends
/// when its last byte is written, not delivered).
fn ceiling_of(
    meds: &[Med],
    dataset: &str,
    rate: &str,
    regime: &str,
    rtt: u32,
    dir: &str,
) -> Option<Ceiling> {
    let best = meds
        .iter()
        .filter(|m| iperf_of(m, dataset, rate, regime, rtt, dir))
        .max_by(|a, b| a.mbps_median.total_cmp(&b.mbps_median))?;
    let link = meds
        .iter()
        .filter(|m| iperf_of(m, "memory", rate, regime, rtt, dir))
        .filter_map(|m| m.link_mbps)
        .min_by(|a, b| a.total_cmp(b));
    Some(Ceiling {
        mbps: link.map_or(best.mbps_median, |l| best.mbps_median.min(l)),
        streams: best.streams,
        measured: best.mbps_median,
        link,
    })
}

/// Best `iperf3 -n BYTES` median, timed like a ferry run. The like-for-like ceiling for moving
/// one file of that size, set-up and slow start included (held like [`iperf_best`]).
pub fn iperf_same_bytes(
    meds: &[Med],
    bytes: u64,
    rate: &str,
    regime: &str,
    rtt: u32,
    dir: &str,
) -> Option<Ceiling> {
    let label = crate::iperf::same_bytes_label(bytes);
    ceiling_of(meds, &label, rate, regime, rtt, dir)
}

fn iperf_of(m: &Med, dataset: &str, rate: &str, regime: &str, rtt: u32, dir: &str) -> bool {
    m.tool == "iperf3"
        && m.dataset == dataset
        && m.usable()
        && m.rate == rate
        && m.regime == regime
        && m.rtt_ms == rtt
        && m.direction == dir
}

/// Best peer median for a link, direction and data set: (Mbit/s, tool, streams).
pub fn best_peer<'a>(meds: &'a [Med], k: &Key) -> Option<&'a Med> {
    meds.iter()
        .filter(|m| {
            m.tool != "ferry"
                && m.tool != "iperf3"
                && m.usable()
                && m.rate == k.rate
                && m.regime == k.regime
                && m.rtt_ms == k.rtt_ms
                && m.direction == k.direction
                && m.dataset == k.dataset
        })
        .max_by(|a, b| a.mbps_median.total_cmp(&b.mbps_median))
}

/// How long a transfer took to get going, from ferry's `--json` timeline (bytes per interval of
/// its data phase): the end of the first 1-s window whose rate is within 10% of the final rate,
/// and that final rate (bytes/s): the median 1-s rate over the second half of the transfer.
/// `None` when the timeline is shorter than 2 s (too short to tell a ramp from a tail).
pub fn ramp(interval_ms: u32, bytes: &[u64]) -> Option<(f64, f64)> {
    if interval_ms == 0 {
        return None;
    }
    let step = f64::from(interval_ms) / 1000.0;
    let w = ((1000 / interval_ms) as usize).max(1);
    if (bytes.len() as f64) * step < 2.0 || bytes.len() < 2 * w {
        return None;
    }
    // Rate of the window ending with interval i (i >= w - 1).
    let rate = |i: usize| bytes[i + 1 - w..=i].iter().sum::<u64>() as f64 / (w as f64 * step);
    let half = bytes.len() / 2;
    let late: Vec<f64> = (half.max(w - 1)..bytes.len()).map(rate).collect();
    let fin = median_of(&late)?;
    if fin <= 0.0 {
        return None;
    }
    let at = (w - 1..bytes.len()).find(|&i| rate(i) >= 0.9 * fin)?;
    Some(((at + 1) as f64 * step, fin))
}

/// Reads [`ramp`] from ferry's `--json` output.
pub fn ramp_of_json(v: &serde_json::Value) -> Option<f64> {
    let t = v.get("timeline")?;
    let interval = u32::try_from(t.get("interval_ms")?.as_u64()?).ok()?;
    let bytes: Vec<u64> = t
        .get("bytes")?
        .as_array()?
        .iter()
        .map(|b| b.as_u64())
        .collect::<Option<_>>()?;
    ramp(interval, &bytes).map(|(s, _)| s)
}

/// The auto-tuning target: at every point where ferry ran with its defaults and with fixed
/// stream counts, the defaults reach ≥ 95% of the best fixed count, and come within 10% of
/// their final rate within 5 s. One markdown table; empty when no point had both.
pub fn auto_table(meds: &[Med]) -> String {
    let mut out = String::new();
    let autos = meds
        .iter()
        .filter(|m| m.tool == "ferry" && m.streams == 0 && m.block == "default" && m.usable());
    for a in autos {
        let fixed = meds
            .iter()
            .filter(|m| {
                m.tool == "ferry"
                    && m.streams > 0
                    && m.usable()
                    && (m.block == "default" || m.block == a.block)
                    && (&m.rate, &m.regime, m.rtt_ms, &m.direction, &m.dataset)
                        == (&a.rate, &a.regime, a.rtt_ms, &a.direction, &a.dataset)
            })
            .max_by(|x, y| x.mbps_median.total_cmp(&y.mbps_median));
        let Some(best) = fixed else { continue };
        if out.is_empty() {
            out.push_str(
                "| link | data set | direction | default (auto) Mbit/s | best fixed Mbit/s (streams) | default / best | ≥ 95% | ramp to within 10% (s) | ≤ 5 s |\n|---|---|---|---|---|---|---|---|---|\n",
            );
        }
        let ratio = a.mbps_median / best.mbps_median;
        let verdict = |ok: bool| if ok { "yes" } else { "**no**" };
        let (ramp, ramp_ok) = match a.ramp_s_median {
            Some(r) => (format!("{r:.1}"), verdict(r <= 5.0)),
            // Shorter than two seconds of data: no ramp to tell from the tail.
            None => (format!("– ({:.1} s in all)", a.wall_s_median), "n/a"),
        };
        let _ = writeln!(
            out,
            "| {}, {} ms, {} | {} | {} | {:.0} ({:.0}–{:.0}) | {:.0} ({}) | {:.0}% | {} | {} | {} |",
            a.rate,
            a.rtt_ms,
            a.regime,
            a.dataset,
            a.direction,
            a.mbps_median,
            a.mbps_min,
            a.mbps_max,
            best.mbps_median,
            best.streams,
            ratio * 100.0,
            verdict(ratio >= 0.95),
            ramp,
            ramp_ok
        );
    }
    out
}

/// Outcome of one target check.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TargetCheck {
    pub name: String,
    /// None: not measured in this run.
    pub pass: Option<bool>,
    pub detail: String,
}

fn find<'a>(meds: &'a [Med], rtt: u32, dataset: &str) -> Option<&'a Med> {
    meds.iter().find(|m| {
        m.tool == "ferry"
            && m.rate == "1gbit"
            && m.regime == "default"
            && m.direction == "put"
            && m.rtt_ms == rtt
            && m.dataset == dataset
            && m.streams == 0
            && m.block == "default"
            && m.usable()
    })
}

/// ferry's median as a share of an iperf3 [`Ceiling`]: passes at ≥ 95%. `detail` words a
/// measured pair (ferry, ratio, ceiling); `no_ceiling` says why there is nothing to compare
/// with.
fn share_of(
    ferry: Option<&Med>,
    ceiling: Option<Ceiling>,
    no_ceiling: &str,
    detail: impl Fn(&Med, f64, &Ceiling) -> String,
) -> (Option<bool>, String) {
    match (ferry, ceiling) {
        (Some(f), Some(c)) => {
            let ratio = f.mbps_median / c.mbps;
            (Some(ratio >= 0.95), detail(f, ratio, &c))
        }
        (None, _) => (None, "not measured (run with --targets)".into()),
        (_, None) => (None, no_ceiling.into()),
    }
}

/// The targets, on the 1 Gbit/s emulated link, default regime, ferry's defaults, put:
/// (1) one 1 GiB file at ≥ 95% of iperf3's best at RTT 0, 50 and 100 ms; (2) 10,000 × 10 KiB at
/// 100 ms in ≤ 1.5 × the wall time of one file of the same bytes.
pub fn targets(meds: &[Med]) -> Vec<TargetCheck> {
    let mut out = Vec::new();
    for rtt in TARGET_RTTS {
        let name = format!("1 GiB file at {rtt} ms: ≥ 95% of iperf3's best");
        let f = find(meds, rtt, &TARGET_FILE.label());
        let ip = iperf_best(meds, "1gbit", "default", rtt, "put");
        let same = iperf_same_bytes(meds, TARGET_FILE.bytes(), "1gbit", "default", rtt, "put");
        let (pass, detail) = share_of(f, ip, "no iperf3 figure for this link", |f, ratio, c| {
            format!(
                "ferry {:.0} Mbit/s (min {:.0}, max {:.0}, n={}) = {:.1}% of iperf3 {:.0} Mbit/s ({})",
                f.mbps_median,
                f.mbps_min,
                f.mbps_max,
                f.ok_runs,
                ratio * 100.0,
                c.mbps,
                c.describe()
            )
        });
        out.push(TargetCheck { name, pass, detail });
        // The steady-state ceiling leaves out what every transfer of a finite size pays:
        // connection set-up and slow start. iperf3 moving the same bytes pays them too.
        let name = format!(
            "1 GiB file at {rtt} ms: ≥ 95% of iperf3 moving the same 1 GiB (like for like)"
        );
        let (pass, detail) = share_of(
            f,
            same,
            "no iperf3 -n figure for this link",
            |f, ratio, c| {
                format!(
                "ferry {:.0} Mbit/s = {:.1}% of iperf3 -n 1GiB -P {} {:.0} Mbit/s ({}both by process wall clock)",
                f.mbps_median,
                ratio * 100.0,
                c.streams,
                c.mbps,
                c.held().map(|h| format!("{h}; ")).unwrap_or_default()
            )
            },
        );
        out.push(TargetCheck { name, pass, detail });
    }
    let name =
        format!("10,000 × 10 KiB at {TARGET_TREE_RTT} ms: wall ≤ 1.5 × one file of the same bytes");
    let t = find(meds, TARGET_TREE_RTT, &TARGET_TREE.label());
    let f = find(meds, TARGET_TREE_RTT, &TARGET_TREE_FILE.label());
    let (pass, detail) = match (t, f) {
        (Some(t), Some(f)) => {
            let ratio = t.wall_s_median / f.wall_s_median;
            (
                Some(ratio <= 1.5),
                format!(
                    "tree {:.2} s vs one {} file {:.2} s = {:.2}×",
                    t.wall_s_median,
                    TARGET_TREE_FILE.label().trim_start_matches("file-"),
                    f.wall_s_median,
                    ratio
                ),
            )
        }
        _ => (None, "not measured (run with --targets)".into()),
    };
    out.push(TargetCheck { name, pass, detail });
    out
}

/// "timed out after 140 s" → 140.
pub fn timed_out_secs(error: &str) -> Option<f64> {
    error
        .strip_prefix("timed out after ")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn fmt_streams(m: &Med) -> String {
    if m.streams == 0 {
        "default".into()
    } else if m.streams_used != m.streams && m.streams_used != 0 {
        format!("{} (as {})", m.streams, m.streams_used)
    } else {
        m.streams.to_string()
    }
}

/// The markdown tables of medians, per link and direction.
pub fn summary_tables(meds: &[Med]) -> String {
    let mut s = String::new();
    let mut links: Vec<(String, String, u32, String)> = Vec::new();
    for m in meds {
        let l = m.key().link();
        if !links.contains(&l) {
            links.push(l);
        }
    }
    for (rate, regime, rtt, dir) in links {
        let here: Vec<&Med> = meds
            .iter()
            .filter(|m| {
                m.rate == rate && m.regime == regime && m.rtt_ms == rtt && m.direction == dir
            })
            .collect();
        let _ = writeln!(s, "\n### {dir}, {rate}, RTT {rtt} ms, {regime} regime\n");
        let ip = iperf_best(meds, &rate, &regime, rtt, &dir);
        let ips: Vec<&&Med> = here.iter().filter(|m| m.tool == "iperf3").collect();
        if !ips.is_empty() {
            let list: Vec<String> = ips
                .iter()
                .map(|m| {
                    let what = match m.dataset.strip_prefix("memory-") {
                        Some(size) => format!("-n {size} -P {}", m.streams),
                        None => format!("-P {}", m.streams),
                    };
                    if m.usable() {
                        format!("{what}: {:.0}", m.mbps_median)
                    } else {
                        format!("{what}: failed")
                    }
                })
                .collect();
            let _ = writeln!(
                s,
                "iperf3 memory to memory (Mbit/s, median): {}{}\n",
                list.join(", "),
                ip.map(|c| format!(" — best {:.0} ({})", c.mbps, c.describe()))
                    .unwrap_or_default()
            );
        }
        let _ = writeln!(
            s,
            "| data set | tool | streams | block | Mbit/s median | min–max | wall s | ok/runs | vs iperf3 best | vs best peer |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
        for m in here.iter().filter(|m| m.tool != "iperf3") {
            let vs_ip = match ip {
                Some(c) if m.usable() => format!("{:.0}%", m.mbps_median / c.mbps * 100.0),
                _ => "–".into(),
            };
            let vs_peer = match best_peer(meds, &m.key()) {
                Some(p) if m.usable() => format!(
                    "{:.2}× ({} {})",
                    m.mbps_median / p.mbps_median,
                    p.tool,
                    fmt_streams(p)
                ),
                _ => "–".into(),
            };
            let (med, range, wall) = if m.usable() {
                (
                    format!("{:.0}", m.mbps_median),
                    format!("{:.0}–{:.0}", m.mbps_min, m.mbps_max),
                    format!("{:.2}", m.wall_s_median),
                )
            } else if let Some(secs) = timed_out_secs(&m.first_error) {
                // A lower bound on the time, so an upper bound on the rate.
                let bound = m.bytes as f64 * 8.0 / secs / 1e6;
                (
                    format!("< {bound:.1}"),
                    format!("timed out after {secs:.0} s"),
                    format!("> {secs:.0}"),
                )
            } else {
                let e: String = m.first_error.chars().take(80).collect();
                ("FAILED".into(), e.replace('|', "/"), "–".into())
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {}/{} | {} | {} |",
                m.dataset,
                m.tool,
                fmt_streams(m),
                m.block,
                med,
                range,
                wall,
                m.ok_runs,
                m.runs,
                vs_ip,
                vs_peer
            );
        }
    }
    s
}

pub fn targets_markdown(checks: &[TargetCheck]) -> String {
    let mut s = String::from("| target | result | numbers |\n|---|---|---|\n");
    for c in checks {
        let r = match c.pass {
            Some(true) => "PASS",
            Some(false) => "MISS",
            None => "not measured",
        };
        let _ = writeln!(s, "| {} | {} | {} |", c.name, r, c.detail);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn row(tool: &str, rtt: u32, ds: &str, streams: u16, mbps: f64) -> Row {
        Row {
            tool: tool.into(),
            direction: "put".into(),
            rate: "1gbit".into(),
            rtt_ms: rtt,
            regime: "default".into(),
            dataset: ds.into(),
            files: 1,
            bytes: 1 << 30,
            streams,
            streams_used: streams,
            block: if tool == "ferry" {
                "default".into()
            } else {
                "-".into()
            },
            run: 1,
            wall_s: (1u64 << 30) as f64 * 8.0 / mbps / 1e6,
            sync_s: 0.0,
            tool_s: None,
            mbps,
            tool_mbps: None,
            verified: true,
            error: String::new(),
            started: 0,
            ramp_s: None,
            link_mbps: None,
        }
    }

    #[test]
    fn ramp_finds_when_the_rate_arrived() {
        // 250 ms intervals: 2 s of ramp (25, 50, 75, ... MB/s), then 8 s at 100 MB/s.
        let mut b: Vec<u64> = (1..=8).map(|i| i * 3_125_000).collect();
        b.extend(std::iter::repeat_n(25_000_000, 32));
        let (at, fin) = ramp(250, &b).unwrap();
        assert_eq!(fin, 100e6);
        // The window ending with interval 7 holds 15.6+18.8+21.9+25 = 81.3 MB (< 90% of the
        // final 100 MB/s); the one ending with interval 8, at 2.25 s, 90.6 MB: the first.
        assert_eq!(at, 2.25);
        // Flat from the start: the first full window.
        assert_eq!(ramp(250, &[25_000_000; 40]).unwrap().0, 1.0);
        // Too short to say, or nothing moved.
        assert_eq!(ramp(250, &[25_000_000; 7]), None);
        assert_eq!(ramp(250, &[0; 40]), None);
        assert_eq!(ramp(0, &[1; 40]), None);
        let v = serde_json::json!({"timeline": {"interval_ms": 250, "bytes": b}});
        assert_eq!(ramp_of_json(&v), Some(2.25));
        assert_eq!(ramp_of_json(&serde_json::json!({"seconds": 1.0})), None);
    }

    #[test]
    fn auto_against_the_best_fixed_count() {
        let mut rows = vec![
            row("ferry", 50, "file-1GiB", 1, 300.0),
            row("ferry", 50, "file-1GiB", 4, 800.0),
            row("ferry", 50, "file-1GiB", 8, 850.0),
            row("ferry", 100, "file-1GiB", 4, 700.0),
        ];
        let mut auto = row("ferry", 50, "file-1GiB", 0, 830.0);
        auto.ramp_s = Some(3.0);
        rows.push(auto);
        let mut slow = row("ferry", 100, "file-1GiB", 0, 600.0);
        slow.ramp_s = Some(6.5);
        rows.push(slow);
        // No fixed count measured for this one: not in the table.
        rows.push(row("ferry", 0, "file-1GiB", 0, 900.0));
        // Too short for a ramp: the table says how long it took in all.
        let mut short = row("ferry", 50, "tree-10000x10KiB", 0, 500.0);
        short.wall_s = 1.6;
        rows.push(short);
        rows.push(row("ferry", 50, "tree-10000x10KiB", 4, 520.0));
        let t = auto_table(&medians(&rows));
        assert!(
            t.contains("| 1gbit, 50 ms, default | file-1GiB | put | 830 (830–830) | 850 (8) | 98% | yes | 3.0 | yes |"),
            "{t}"
        );
        assert!(
            t.contains("| 1gbit, 100 ms, default | file-1GiB | put | 600 (600–600) | 700 (4) | 86% | **no** | 6.5 | **no** |"),
            "{t}"
        );
        assert!(!t.contains(" 0 ms"), "{t}");
        assert!(t.contains("| 96% | yes | – (1.6 s in all) | n/a |"), "{t}");
        assert_eq!(auto_table(&[]), "");
    }

    #[test]
    fn medians_skip_failed_runs_and_keep_order() {
        let mut rows = vec![
            row("iperf3", 0, "memory", 4, 990.0),
            row("ferry", 0, "file-1GiB", 0, 900.0),
            row("ferry", 0, "file-1GiB", 0, 950.0),
            row("ferry", 0, "file-1GiB", 0, 10.0),
            row("ferry", 0, "file-1GiB", 0, 960.0),
        ];
        rows[3].verified = false;
        rows[3].error = "digest mismatch".into();
        let m = medians(&rows);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].tool, "iperf3");
        let f = &m[1];
        assert_eq!((f.runs, f.ok_runs), (4, 3));
        assert_eq!(f.mbps_median, 950.0);
        assert_eq!(f.mbps_min, 900.0);
        assert_eq!(f.mbps_max, 960.0);
        assert!(!f.all_verified);
        assert_eq!(f.first_error, "digest mismatch");
        // all failed: usable() false, zeros
        let mut bad = row("scp", 0, "file-1GiB", 1, 100.0);
        bad.error = "timeout".into();
        let m = medians(&[bad]);
        assert!(!m[0].usable());
        assert_eq!(m[0].mbps_min, 0.0);
    }

    #[test]
    fn csv_round_trip() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("r.csv");
        let mut a = row("ferry", 50, "tree-10000x10KiB", 4, 123.5);
        a.tool_s = Some(1.25);
        a.error = "x, \"quoted\"\nline".into();
        let b = row("rsync", 50, "tree-10000x10KiB", 1, 55.0);
        let mut log = CsvLog::create(&p).unwrap();
        log.push(&a).unwrap();
        log.push(&b).unwrap();
        drop(log);
        let back = read_rows(&p).unwrap();
        assert_eq!(back, vec![a, b]);
        let meds = medians(&back);
        let mp = t.path().join("m.csv");
        write_csv(&mp, &meds).unwrap();
        let text = std::fs::read_to_string(&mp).unwrap();
        assert!(text.starts_with("tool,direction,rate,rtt_ms,regime,dataset,"));
        let n = csv::Reader::from_path(&mp).unwrap().records().count();
        assert_eq!(n, 2);
    }

    #[test]
    fn the_ceiling_is_held_to_what_the_link_carries() {
        let link = crate::iperf::payload_capacity_mbps(1_000_000_000, 9000, 8948);
        let mut rows = Vec::new();
        for (streams, mbps) in [(4, 990.0), (8, 998.0), (8, 1001.0), (8, 997.0)] {
            let mut r = row("iperf3", 50, "memory", streams, mbps);
            r.link_mbps = link;
            rows.push(r);
        }
        rows.push(row("ferry", 50, "file-1GiB", 0, 946.0));
        let meds = medians(&rows);
        // -P 8's median (998) is above the link's 994.2: the ceiling is the link.
        let c = iperf_best(&meds, "1gbit", "default", 50, "put").unwrap();
        assert_eq!((c.streams, c.measured), (8, 998.0));
        assert!((c.mbps - 994.222).abs() < 0.001, "{c:?}");
        assert!(c.describe().contains("measured 998"), "{}", c.describe());
        let t = targets(&meds);
        // 946 / 994.2 = 95.1%, where 946 / 998 would be 94.8%
        assert_eq!(t[2].pass, Some(true), "{}", t[2].detail);
        assert!(
            t[2].detail.contains("95.1% of iperf3 994"),
            "{}",
            t[2].detail
        );
        assert!(summary_tables(&meds).contains("| 95% |"));
        // An -n figure above the link is held to it as well (the steady rows carry the link).
        let mut same = rows.clone();
        same.push(row("iperf3", 50, "memory-1GiB", 8, 997.0));
        let c = iperf_same_bytes(&medians(&same), 1 << 30, "1gbit", "default", 50, "put").unwrap();
        assert!((c.mbps - 994.222).abs() < 0.001, "{c:?}");
        let t = targets(&medians(&same));
        assert!(t[3].detail.contains("measured 997"), "{}", t[3].detail);
        // Below the link, the measured figure stands; without a link figure, too.
        rows.retain(|r| r.tool != "iperf3" || r.streams != 8);
        let c = iperf_best(&medians(&rows), "1gbit", "default", 50, "put").unwrap();
        assert_eq!((c.mbps, c.streams), (990.0, 4));
        assert_eq!(c.describe(), "-P 4");
        // Off the bed (no link figure in any run) nothing holds it.
        let rows = [row("iperf3", 50, "memory", 8, 1001.0)];
        let c = iperf_best(&medians(&rows), "1gbit", "default", 50, "put").unwrap();
        assert_eq!((c.mbps, c.link), (1001.0, None));
    }

    #[test]
    fn summary_ratios_and_targets() {
        let mut rows = Vec::new();
        for rtt in [0, 50, 100] {
            rows.push(row("iperf3", rtt, "memory", 1, 500.0));
            rows.push(row("iperf3", rtt, "memory", 4, 980.0));
            let f = if rtt == 100 { 900.0 } else { 960.0 };
            rows.push(row("ferry", rtt, "file-1GiB", 0, f));
            rows.push(row("rsync", rtt, "file-1GiB", 1, 400.0));
            rows.push(row("scp", rtt, "file-1GiB", 1, 200.0));
        }
        // iperf3 moving the same 1 GiB, set-up and slow start included: below its steady state.
        rows.push(row("iperf3", 100, "memory-1GiB", 4, 920.0));
        let mut tree = row("ferry", 100, "tree-10000x10KiB", 0, 50.0);
        tree.wall_s = 3.0;
        tree.sync_s = 0.1;
        let mut same = row("ferry", 100, "file-100000KiB", 0, 500.0);
        same.wall_s = 2.0;
        rows.push(tree);
        rows.push(same);
        let meds = medians(&rows);
        let s = summary_tables(&meds);
        assert!(s.contains("### put, 1gbit, RTT 50 ms, default regime"));
        assert!(s.contains("best 980 (-P 4)"));
        // ferry 960 / iperf3 980 = 98%; / rsync 400 = 2.40x
        assert!(
            s.contains("| file-1GiB | ferry | default | default | 960 | 960–960 |"),
            "{s}"
        );
        assert!(s.contains("| 98% | 2.40× (rsync 1) |"), "{s}");
        // the best peer against itself
        assert!(s.contains("| 41% | 1.00× (rsync 1) |"), "{s}");
        // the -n figure is listed but never taken for the steady-state best
        assert!(s.contains("-n 1GiB -P 4: 920"), "{s}");
        assert!(s.contains("RTT 100 ms, default regime\n\niperf3"), "{s}");
        let t = targets(&meds);
        assert_eq!(t.len(), 7);
        assert_eq!(t[0].pass, Some(true));
        // no iperf3 -n at 0 and 50 ms
        assert_eq!(t[1].pass, None);
        assert_eq!(t[2].pass, Some(true));
        // 900 / 980 = 91.8%
        assert_eq!(t[4].pass, Some(false));
        assert!(t[4].detail.contains("91.8%"), "{}", t[4].detail);
        // 900 / 920 = 97.8%, like for like
        assert_eq!(t[5].pass, Some(true));
        assert!(t[5].detail.contains("97.8%"), "{}", t[5].detail);
        // 3.1 s vs 2.0 s = 1.55x
        assert_eq!(t[6].pass, Some(false));
        assert!(t[6].detail.contains("1.55×"), "{}", t[6].detail);
        let md = targets_markdown(&t);
        assert_eq!(md.matches("MISS").count(), 2);
        // nothing measured
        // a timed-out point shows a bound
        let mut slow = row("scp", 100, "file-1GiB", 1, 1.0);
        slow.error = "timed out after 100 s".into();
        slow.verified = false;
        let s = summary_tables(&medians(&[slow]));
        assert!(
            s.contains("| < 85.9 | timed out after 100 s | > 100 |"),
            "{s}"
        );
        let none = targets(&[]);
        assert!(none.iter().all(|c| c.pass.is_none()));
    }
}
