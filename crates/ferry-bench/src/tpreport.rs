//! Third-party mode's results: one row per timed transfer (a put between the two servers, or a
//! copy the client asked for), the medians of each, the copy's rate as a share of the put's,
//! and what the client's links carried during the copies as a share of the data.

use std::fmt::Write as _;

use ferry_units::stats::median_of;
use ferry_units::units::{format_bytes, format_mbps};
use serde::{Deserialize, Serialize};

/// The two things timed in each round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `ferry put` run in the source's host into the destination over their link: the
    /// baseline.
    Put,
    /// `ferry cp` run in the client's host: the source puts into the destination.
    Cp,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Put => "put",
            Kind::Cp => "cp",
        }
    }
}

/// One timed transfer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TpRow {
    /// 1-based round.
    pub run: u32,
    /// "put" or "cp".
    pub kind: String,
    pub bytes: u64,
    /// Process start to exit.
    pub wall_s: f64,
    /// bytes × 8 / wall_s / 10⁶.
    pub mbit_s: f64,
    /// The destination's file has the source's size and BLAKE3.
    pub verified: bool,
    /// IP bytes the client's two links delivered (both directions) while it ran.
    pub client_link_bytes: u64,
    /// IP bytes the servers' link delivered (both directions) while it ran.
    pub ab_link_bytes: u64,
    /// Streams the put (a copy: the source's put) carried data on at the end, from its report.
    pub streams: Option<u64>,
    /// Extra connections that carried only the first round trips (a put with a remembered
    /// path; a copy's source opens none).
    pub ramp_helpers: Option<u64>,
    pub error: String,
}

impl TpRow {
    pub fn new(run: u32, kind: Kind, bytes: u64) -> TpRow {
        TpRow {
            run,
            kind: kind.name().into(),
            bytes,
            wall_s: 0.0,
            mbit_s: 0.0,
            verified: false,
            client_link_bytes: 0,
            ab_link_bytes: 0,
            streams: None,
            ramp_helpers: None,
            error: String::new(),
        }
    }

    pub fn ok(&self) -> bool {
        self.error.is_empty() && self.verified && self.mbit_s > 0.0
    }

    /// What the client's links carried, as a share of the data.
    pub fn client_share(&self) -> f64 {
        self.client_link_bytes as f64 / self.bytes.max(1) as f64
    }
}

/// The bed as it ran.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TpBed {
    pub client_rtt_ms: u64,
    pub client_rate_bps: u64,
    pub ab_rtt_ms: u64,
    /// None: unlimited.
    pub ab_rate_bps: Option<u64>,
    pub regime: String,
}

/// Everything a third-party run wrote to results.json.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TpReport {
    pub command: String,
    pub started: String,
    pub duration_s: f64,
    pub host: Vec<(String, String)>,
    /// Where the data and the destination were, and their file system.
    pub storage: String,
    pub bed: TpBed,
    pub file: String,
    pub bytes: u64,
    pub runs: u32,
    /// One unrecorded put and copy ran first.
    pub warmup: bool,
    /// Medians over the transfers of each kind that completed and verified.
    pub put_median_s: Option<f64>,
    pub put_median_mbit_s: Option<f64>,
    pub cp_median_s: Option<f64>,
    pub cp_median_mbit_s: Option<f64>,
    /// The copy's median rate over the put's.
    pub cp_vs_put: Option<f64>,
    /// Client links' bytes over the data, the largest and the median over the copies.
    pub client_link_share_max: Option<f64>,
    pub client_link_share_median: Option<f64>,
    /// Computed, not run: the data at the client's link rate, as a copy relayed through the
    /// client would at best take (the two legs overlapping).
    pub through_client_s: f64,
    pub rows: Vec<TpRow>,
    pub notes: Vec<String>,
}

impl TpReport {
    /// Fills the medians, the ratio and the share from the rows.
    pub fn summarize(&mut self) {
        let ok = |k: Kind| -> Vec<&TpRow> {
            self.rows
                .iter()
                .filter(|r| r.kind == k.name() && r.ok())
                .collect()
        };
        let (puts, cps) = (ok(Kind::Put), ok(Kind::Cp));
        let med = |v: &[&TpRow], f: fn(&TpRow) -> f64| {
            median_of(&v.iter().map(|r| f(r)).collect::<Vec<_>>())
        };
        self.put_median_s = med(&puts, |r| r.wall_s);
        self.put_median_mbit_s = med(&puts, |r| r.mbit_s);
        self.cp_median_s = med(&cps, |r| r.wall_s);
        self.cp_median_mbit_s = med(&cps, |r| r.mbit_s);
        self.cp_vs_put = match (self.cp_median_mbit_s, self.put_median_mbit_s) {
            (Some(c), Some(p)) if p > 0.0 => Some(c / p),
            _ => None,
        };
        self.client_link_share_median = med(&cps, TpRow::client_share);
        self.client_link_share_max = cps.iter().map(|r| r.client_share()).reduce(f64::max);
        self.through_client_s = self.bytes as f64 * 8.0 / self.bed.client_rate_bps.max(1) as f64;
    }

    pub fn failed(&self) -> usize {
        self.rows.iter().filter(|r| !r.ok()).count()
    }
}

/// A link's rate in words: "20 Mbit/s", "1 Gbit/s", "uncapped".
fn rate(bps: Option<u64>) -> String {
    bps.map_or_else(|| "uncapped".into(), |b| format_mbps(b as f64 / 1e6))
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "n/a".into(), f)
}

/// The short text printed at the end and kept as summary.md.
pub fn summary(r: &TpReport) -> String {
    let mut s = String::from("# ferry-bench third-party copy\n\n");
    let b = &r.bed;
    let _ = writeln!(
        s,
        "Bed: client c with a {}, {} ms link to each of a and b; a–b {}, {} ms; regime {}.",
        rate(Some(b.client_rate_bps)),
        b.client_rtt_ms,
        rate(b.ab_rate_bps),
        b.ab_rtt_ms,
        b.regime
    );
    let _ = writeln!(
        s,
        "Data: {} ({} B), {}. {} round{}{}, each a `ferry put` run in a into b over a–b, then a \
         `ferry cp` run in c (a puts into b); times are process start to exit, every \
         destination checked (size and BLAKE3).\n",
        r.file,
        r.bytes,
        r.storage,
        r.runs,
        if r.runs == 1 { "" } else { "s" },
        if r.warmup {
            " after one unrecorded put and copy"
        } else {
            ""
        }
    );
    let _ = writeln!(
        s,
        "| | median s | median Mbit/s |\n|---|---:|---:|\n| put a→b | {} | {} |\n| cp (c asks) | {} | {} |\n",
        opt(r.put_median_s, |v| format!("{v:.2}")),
        opt(r.put_median_mbit_s, |v| format!("{v:.0}")),
        opt(r.cp_median_s, |v| format!("{v:.2}")),
        opt(r.cp_median_mbit_s, |v| format!("{v:.0}")),
    );
    let _ = writeln!(
        s,
        "- cp / put (rate): {}",
        opt(r.cp_vs_put, |v| format!("{:.1}%", v * 100.0))
    );
    let most = r
        .rows
        .iter()
        .filter(|x| x.kind == Kind::Cp.name() && x.ok())
        .map(|x| x.client_link_bytes)
        .max();
    let _ = writeln!(
        s,
        "- the client's links during a copy: {} of the data at most ({}), median {}",
        opt(r.client_link_share_max, |v| format!("{:.4}%", v * 100.0)),
        most.map_or_else(
            || "n/a".into(),
            |m| format!("{} of IP packets", format_bytes(m))
        ),
        opt(r.client_link_share_median, |v| format!("{:.4}%", v * 100.0)),
    );
    let _ = writeln!(
        s,
        "- through the client it would take {:.0} s ({:.1} min): computed (data bits / {}), \
         not run",
        r.through_client_s,
        r.through_client_s / 60.0,
        rate(Some(b.client_rate_bps))
    );
    let helpers: Vec<f64> = r
        .rows
        .iter()
        .filter(|x| x.kind == Kind::Put.name() && x.ok())
        .filter_map(|x| x.ramp_helpers.map(|h| h as f64))
        .collect();
    if let Some(h) = median_of(&helpers).filter(|h| *h > 0.0) {
        let _ = writeln!(
            s,
            "- the puts opened {h:.0} ramp helpers (median): a client's put on a path it \
             remembers does; a copy's source opens none"
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

    fn row(run: u32, kind: Kind, wall: f64, client: u64) -> TpRow {
        let mut r = TpRow::new(run, kind, 1 << 30);
        r.wall_s = wall;
        r.mbit_s = (1u64 << 30) as f64 * 8.0 / wall / 1e6;
        r.verified = true;
        r.client_link_bytes = client;
        r
    }

    #[test]
    fn medians_ratio_and_share_come_from_the_verified_rows() {
        let mut r = TpReport {
            bytes: 1 << 30,
            bed: TpBed {
                client_rate_bps: 20_000_000,
                ..Default::default()
            },
            rows: vec![
                row(1, Kind::Put, 10.0, 0),
                row(1, Kind::Cp, 10.5, 30_000),
                row(2, Kind::Put, 11.0, 0),
                row(2, Kind::Cp, 10.0, 20_000),
                row(3, Kind::Put, 9.0, 0),
                row(3, Kind::Cp, 11.0, 10_000),
            ],
            ..Default::default()
        };
        let mut bad = row(4, Kind::Cp, 1.0, 1 << 30);
        bad.error = "cp exit 1: refused".into();
        r.rows.push(bad);
        r.summarize();
        assert_eq!(r.put_median_s, Some(10.0));
        assert_eq!(r.cp_median_s, Some(10.5));
        let ratio = r.cp_vs_put.unwrap();
        assert!((ratio - 10.0 / 10.5).abs() < 1e-9, "{ratio}");
        let share = r.client_link_share_max.unwrap();
        assert!((share - 30_000.0 / (1u64 << 30) as f64).abs() < 1e-12);
        // 1 GiB at 20 Mbit/s: about 7 minutes.
        assert!(
            (r.through_client_s - 429.5).abs() < 0.1,
            "{}",
            r.through_client_s
        );
        assert_eq!(r.failed(), 1);
        let text = summary(&r);
        assert!(text.contains("cp / put (rate): 95.2%"), "{text}");
        assert!(text.contains("1 transfers failed"), "{text}");
    }

    #[test]
    fn no_verified_rows_leave_the_figures_empty() {
        let mut r = TpReport {
            rows: vec![TpRow::new(1, Kind::Put, 10)],
            ..Default::default()
        };
        r.summarize();
        assert_eq!(r.put_median_s, None);
        assert_eq!(r.cp_vs_put, None);
        assert_eq!(r.client_link_share_max, None);
        assert!(summary(&r).contains("cp / put (rate): n/a"));
    }
}
