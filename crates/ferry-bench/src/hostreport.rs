//! Host mode's results: one CSV row per run (a transfer, or a memory-to-memory ceiling), medians
//! per point, and the summary table with each ferry figure's ratio to `ferry probe net` and to
//! iperf3 -P 8 on the same host in the same run.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use ferry_units::stats::median_of;
use serde::{Deserialize, Serialize};

use crate::plan::GIB;

pub const PROBE_NET: &str = "probe-net";
pub const IPERF3: &str = "iperf3";

/// One run of one point.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostRow {
    /// ferry, rsync, iperf3 or probe-net.
    pub tool: String,
    /// ferry and its probe: "tls" (its defaults) or "plain" (`--no-encrypt`); others "tcp".
    pub transport: String,
    pub direction: String,
    /// Data set label; "memory" for the ceilings.
    pub dataset: String,
    pub files: u64,
    pub bytes: u64,
    /// iperf3's -P; probe net: the best point's streams; 0: the tool's default.
    pub streams: u16,
    /// 1-based.
    pub run: u32,
    /// Client start to exit.
    pub wall_s: f64,
    /// syncfs of the destination after the client exited (what was not yet durable).
    pub sync_s: f64,
    /// bytes / (wall_s + sync_s) in GiB/s; a ceiling's own rate.
    pub gibps: f64,
    /// User + system seconds of the client process (wait4).
    pub client_cpu_s: Option<f64>,
    /// utime + stime (+ reaped children) growth of the server process over the run.
    pub server_cpu_s: Option<f64>,
    pub client_cpu_s_per_gib: Option<f64>,
    pub server_cpu_s_per_gib: Option<f64>,
    /// Sizes and contents of the destination matched the source (ceilings: the tool said so).
    pub verified: bool,
    pub error: String,
    /// Unix time the run started.
    pub started: u64,
}

impl HostRow {
    pub fn ok(&self) -> bool {
        self.error.is_empty() && self.verified && self.gibps > 0.0
    }

    /// Fills the per-GiB CPU figures from the totals.
    pub fn per_gib(&mut self) {
        let gib = self.bytes as f64 / GIB as f64;
        if gib > 0.0 {
            self.client_cpu_s_per_gib = self.client_cpu_s.map(|c| c / gib);
            self.server_cpu_s_per_gib = self.server_cpu_s.map(|c| c / gib);
        }
    }

    fn key(&self) -> (String, String, String, String, u16) {
        (
            self.dataset.clone(),
            self.direction.clone(),
            self.tool.clone(),
            self.transport.clone(),
            self.streams,
        )
    }
}

/// Medians of one point over its successful runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostMed {
    pub tool: String,
    pub transport: String,
    pub direction: String,
    pub dataset: String,
    pub bytes: u64,
    pub streams: u16,
    pub runs: u32,
    pub ok_runs: u32,
    pub gibps: f64,
    pub gibps_min: f64,
    pub gibps_max: f64,
    pub client_cpu_s_per_gib: Option<f64>,
    pub server_cpu_s_per_gib: Option<f64>,
    pub first_error: String,
}

impl HostMed {
    /// Client plus server CPU seconds per GiB, when both were measured.
    pub fn cpu_s_per_gib(&self) -> Option<f64> {
        Some(self.client_cpu_s_per_gib? + self.server_cpu_s_per_gib?)
    }
}

/// Medians per point, in the order points first appear in `rows`.
pub fn medians(rows: &[HostRow]) -> Vec<HostMed> {
    let mut keys = Vec::new();
    for r in rows {
        if !keys.contains(&r.key()) {
            keys.push(r.key());
        }
    }
    keys.iter()
        .map(|k| {
            let all: Vec<&HostRow> = rows.iter().filter(|r| &r.key() == k).collect();
            let ok: Vec<&HostRow> = all.iter().copied().filter(|r| r.ok()).collect();
            let rates: Vec<f64> = ok.iter().map(|r| r.gibps).collect();
            let opt = |f: fn(&HostRow) -> Option<f64>| {
                let v: Vec<f64> = ok.iter().filter_map(|r| f(r)).collect();
                median_of(&v)
            };
            HostMed {
                tool: k.2.clone(),
                transport: k.3.clone(),
                direction: k.1.clone(),
                dataset: k.0.clone(),
                bytes: all[0].bytes,
                streams: k.4,
                runs: all.len() as u32,
                ok_runs: ok.len() as u32,
                gibps: median_of(&rates).unwrap_or(0.0),
                gibps_min: rates.iter().copied().reduce(f64::min).unwrap_or(0.0),
                gibps_max: rates.iter().copied().fold(0.0, f64::max),
                client_cpu_s_per_gib: opt(|r| r.client_cpu_s_per_gib),
                server_cpu_s_per_gib: opt(|r| r.server_cpu_s_per_gib),
                first_error: all
                    .iter()
                    .find(|r| !r.error.is_empty())
                    .map(|r| r.error.clone())
                    .unwrap_or_default(),
            }
        })
        .collect()
}

/// `ferry probe net`'s rate for a transport and direction, if measured.
pub fn probe_ceiling(meds: &[HostMed], transport: &str, direction: &str) -> Option<f64> {
    meds.iter()
        .find(|m| m.tool == PROBE_NET && m.transport == transport && m.direction == direction)
        .filter(|m| m.ok_runs > 0)
        .map(|m| m.gibps)
}

/// iperf3's median at `streams` (-P), the same direction if measured, else any.
pub fn iperf_ceiling(meds: &[HostMed], streams: u16, direction: &str) -> Option<f64> {
    let at = |d: Option<&str>| {
        meds.iter()
            .find(|m| {
                m.tool == IPERF3
                    && m.streams == streams
                    && m.ok_runs > 0
                    && d.is_none_or(|d| m.direction == d)
            })
            .map(|m| m.gibps)
    };
    at(Some(direction)).or_else(|| at(None))
}

/// `a / b` when both are there and b is not zero.
pub fn ratio(a: f64, b: Option<f64>) -> Option<f64> {
    b.filter(|b| *b > 0.0).map(|b| a / b)
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map(|x| format!("{x:.prec$}"))
        .unwrap_or_else(|| "–".into())
}

/// Context printed above the tables.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct HostMeta {
    pub command: String,
    pub started: String,
    pub duration_s: f64,
    /// (name, value): cpu, cores, memory, kernel, load averages.
    pub host: Vec<(String, String)>,
    /// (what, where, file system type): the data sets, the put and get destinations.
    pub storage: Vec<(String, String, String)>,
    pub runs: u32,
    pub notes: Vec<String>,
}

/// The summary markdown.
pub fn summary(meds: &[HostMed], meta: &HostMeta) -> String {
    let mut s = String::from("# ferry-bench host mode (loopback)\n\n");
    for (k, v) in &meta.host {
        let _ = writeln!(s, "- {k}: {v}");
    }
    let _ = writeln!(
        s,
        "- started {}, took {:.0} s",
        meta.started, meta.duration_s
    );
    let _ = writeln!(s, "- command: `{}`", meta.command);
    for (what, path, fs) in &meta.storage {
        let _ = writeln!(s, "- {what}: {path} ({fs})");
    }
    let _ = writeln!(
        s,
        "\nMedians of {} runs per point. Transfers: GiB/s until the copy is durable (client \
         start to exit, plus a syncfs of the destination), every run verified (sizes and BLAKE3 \
         of every file). CPU: the client's user + system seconds (wait4) and the server \
         process's growth in /proc (utime + stime, sampled once it settles), per GiB moved. \
         `tls` is ferry's defaults (TLS, BLAKE3), `plain` is `--no-encrypt`.\n",
        meta.runs
    );
    let _ = writeln!(
        s,
        "## Ceilings (memory to memory)\n\n| tool | transport | direction | streams | GiB/s \
         | Gbit/s | ok runs |\n|---|---|---|---:|---:|---:|---:|"
    );
    for m in meds
        .iter()
        .filter(|m| m.tool == IPERF3 || m.tool == PROBE_NET)
    {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.2} | {:.1} | {}/{} |",
            if m.tool == IPERF3 {
                "iperf3"
            } else {
                "ferry probe net"
            },
            m.transport,
            m.direction,
            if m.streams == 0 {
                "best".into()
            } else {
                m.streams.to_string()
            },
            m.gibps,
            m.gibps * GIB as f64 * 8.0 / 1e9,
            m.ok_runs,
            m.runs
        );
    }
    let _ = writeln!(
        s,
        "\n## Transfers\n\n| data set | direction | tool | transport | GiB/s | min–max | client \
         CPU s/GiB | server CPU s/GiB | both | ÷ probe net | ÷ iperf3 -P 8 | ok runs |\n\
         |---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for m in meds
        .iter()
        .filter(|m| m.tool != IPERF3 && m.tool != PROBE_NET)
    {
        let probe = probe_ceiling(meds, &m.transport, &m.direction);
        let iperf = iperf_ceiling(meds, 8, &m.direction);
        let ok = m.ok_runs > 0;
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}/{} |",
            m.dataset,
            m.direction,
            m.tool,
            m.transport,
            if ok {
                format!("{:.2}", m.gibps)
            } else {
                "failed".into()
            },
            if ok {
                format!("{:.2}–{:.2}", m.gibps_min, m.gibps_max)
            } else {
                "–".into()
            },
            opt(m.client_cpu_s_per_gib, 2),
            opt(m.server_cpu_s_per_gib, 2),
            opt(m.cpu_s_per_gib(), 2),
            opt(ratio(m.gibps, probe).filter(|_| ok), 2),
            opt(ratio(m.gibps, iperf).filter(|_| ok), 2),
            m.ok_runs,
            m.runs
        );
    }
    let failed: Vec<&HostMed> = meds.iter().filter(|m| !m.first_error.is_empty()).collect();
    if !failed.is_empty() || !meta.notes.is_empty() {
        let _ = writeln!(s, "\n## Notes\n");
        for n in &meta.notes {
            let _ = writeln!(s, "- {n}");
        }
        for m in failed {
            let _ = writeln!(
                s,
                "- {} {} {} {}: {}",
                m.tool, m.transport, m.direction, m.dataset, m.first_error
            );
        }
    }
    s
}

/// Appends rows to results.csv as they come, so a stopped run keeps what it measured.
pub struct HostCsv(csv::Writer<std::fs::File>);

impl HostCsv {
    pub fn create(p: &Path) -> Result<HostCsv> {
        Ok(HostCsv(
            csv::Writer::from_path(p).with_context(|| format!("creating {}", p.display()))?,
        ))
    }
    pub fn push(&mut self, r: &HostRow) -> Result<()> {
        self.0.serialize(r)?;
        self.0.flush()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(
        tool: &str,
        transport: &str,
        dir: &str,
        ds: &str,
        gibps: f64,
        cpu: (f64, f64),
    ) -> HostRow {
        let mut r = HostRow {
            tool: tool.into(),
            transport: transport.into(),
            direction: dir.into(),
            dataset: ds.into(),
            files: 1,
            bytes: 2 * GIB,
            streams: 0,
            run: 1,
            wall_s: 1.0,
            sync_s: 0.0,
            gibps,
            client_cpu_s: Some(cpu.0),
            server_cpu_s: Some(cpu.1),
            client_cpu_s_per_gib: None,
            server_cpu_s_per_gib: None,
            verified: true,
            error: String::new(),
            started: 0,
        };
        r.per_gib();
        r
    }

    #[test]
    fn medians_ratios_and_table() {
        let mut rows = vec![
            row("ferry", "tls", "put", "file-2GiB", 1.0, (2.0, 3.0)),
            row("ferry", "tls", "put", "file-2GiB", 3.0, (4.0, 5.0)),
            row("ferry", "tls", "put", "file-2GiB", 2.0, (3.0, 4.0)),
            row("ferry", "plain", "put", "file-2GiB", 2.5, (1.0, 1.0)),
            row(PROBE_NET, "tls", "put", "memory", 4.0, (0.0, 0.0)),
            row(IPERF3, "tcp", "put", "memory", 8.0, (0.0, 0.0)),
        ];
        rows[5].streams = 8;
        let mut bad = row("ferry", "tls", "put", "file-2GiB", 9.0, (1.0, 1.0));
        bad.verified = false;
        bad.error = "destination differs".into();
        rows.push(bad);
        let meds = medians(&rows);
        assert_eq!(meds.len(), 4);
        let tls = &meds[0];
        assert_eq!(
            (tls.runs, tls.ok_runs),
            (4, 3),
            "the failed run counted, not used"
        );
        assert_eq!(tls.gibps, 2.0);
        assert_eq!((tls.gibps_min, tls.gibps_max), (1.0, 3.0));
        // 3 client and 4 server seconds over 2 GiB, the median run.
        assert_eq!(tls.client_cpu_s_per_gib, Some(1.5));
        assert_eq!(tls.server_cpu_s_per_gib, Some(2.0));
        assert_eq!(tls.cpu_s_per_gib(), Some(3.5));
        assert_eq!(tls.first_error, "destination differs");
        assert_eq!(probe_ceiling(&meds, "tls", "put"), Some(4.0));
        assert_eq!(probe_ceiling(&meds, "plain", "put"), None);
        assert_eq!(iperf_ceiling(&meds, 8, "get"), Some(8.0), "any direction");
        assert_eq!(iperf_ceiling(&meds, 4, "put"), None);
        assert_eq!(ratio(2.0, Some(4.0)), Some(0.5));
        assert_eq!(ratio(2.0, Some(0.0)), None);
        let meta = HostMeta {
            host: vec![("cores".into(), "16".into())],
            storage: vec![("data".into(), "/dev/shm/x".into(), "tmpfs".into())],
            runs: 4,
            ..Default::default()
        };
        let md = summary(&meds, &meta);
        assert!(md.contains("- cores: 16"), "{md}");
        assert!(md.contains("/dev/shm/x (tmpfs)"), "{md}");
        assert!(
            md.contains("| file-2GiB | put | ferry | tls | 2.00 | 1.00–3.00 | 1.50 | 2.00 | 3.50 | 0.50 | 0.25 | 3/4 |"),
            "{md}"
        );
        // plain has no probe of its own: no ratio, the iperf3 one stays.
        assert!(
            md.contains(
                "| ferry | plain | 2.50 | 2.50–2.50 | 0.50 | 0.50 | 1.00 | – | 0.31 | 1/1 |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| iperf3 | tcp | put | 8 | 8.00 | 68.7 | 1/1 |"),
            "{md}"
        );
        assert!(md.contains("destination differs"), "{md}");
    }

    #[test]
    fn csv_round_trip() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("results.csv");
        let mut w = HostCsv::create(&p).unwrap();
        let mut r = row("ferry", "tls", "get", "real-300", 1.25, (1.0, 2.0));
        r.server_cpu_s = None;
        r.per_gib();
        w.push(&r).unwrap();
        let back: Vec<HostRow> = csv::Reader::from_path(&p)
            .unwrap()
            .deserialize()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(back, vec![r]);
    }
}
