//! Latency histograms for `/metrics`: where an API request's time goes (its handler, its store
//! calls, the store's lock), so that a tail seen by a client can be placed without a special
//! build (docs/bench/NOTEBOOK.md, "Issue 40: the API's tail"). Atomics only: timing a request
//! costs two clock reads and two adds.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the buckets, seconds (Prometheus' `le`): around the 50 ms target.
pub const BUCKETS: [f64; 11] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 1.0,
];

/// Counts of durations by bucket, their sum and number.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Per bucket (not cumulative); the last is above every bound.
    counts: [AtomicU64; BUCKETS.len() + 1],
    sum_ns: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = BUCKETS
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(BUCKETS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// How many were observed.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// This histogram's lines in Prometheus' text format, under `name` with `labels` (each
    /// `key="value"`, already escaped); the `# HELP`/`# TYPE` lines are the caller's.
    pub fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0u64;
        for (i, bound) in BUCKETS.iter().enumerate() {
            cumulative += self.counts[i].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}"
            );
        }
        cumulative += self.counts[BUCKETS.len()].load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {cumulative}"
        );
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let braces = |s: &str| {
            if s.is_empty() {
                String::new()
            } else {
                format!("{{{s}}}")
            }
        };
        let _ = writeln!(out, "{name}_sum{} {sum}", braces(labels));
        let _ = writeln!(out, "{name}_count{} {cumulative}", braces(labels));
    }
}

/// Writes `# HELP` and `# TYPE ... histogram` for `name`.
pub fn header(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_the_sum_is_kept() {
        let h = Histogram::default();
        for ms in [0.5, 3.0, 3.0, 40.0, 2000.0] {
            h.observe(Duration::from_secs_f64(ms / 1000.0));
        }
        let mut out = String::new();
        h.render(&mut out, "x_seconds", "endpoint=\"a\"");
        assert!(out.contains("x_seconds_bucket{endpoint=\"a\",le=\"0.001\"} 1\n"));
        assert!(out.contains("x_seconds_bucket{endpoint=\"a\",le=\"0.005\"} 3\n"));
        assert!(out.contains("x_seconds_bucket{endpoint=\"a\",le=\"0.05\"} 4\n"));
        assert!(out.contains("x_seconds_bucket{endpoint=\"a\",le=\"1\"} 4\n"));
        assert!(out.contains("x_seconds_bucket{endpoint=\"a\",le=\"+Inf\"} 5\n"));
        assert!(out.contains("x_seconds_count{endpoint=\"a\"} 5\n"));
        let sum: f64 = out
            .lines()
            .find_map(|l| l.strip_prefix("x_seconds_sum{endpoint=\"a\"} "))
            .and_then(|v| v.parse().ok())
            .expect("a sum line");
        assert!((sum - 2.0465).abs() < 1e-6, "{sum}");
        assert_eq!(h.count(), 5);
    }

    #[test]
    fn no_labels_means_no_braces_on_sum_and_count() {
        let h = Histogram::default();
        h.observe(Duration::from_millis(7));
        let mut out = String::new();
        h.render(&mut out, "y_seconds", "");
        assert!(out.contains("y_seconds_bucket{le=\"0.01\"} 1\n"), "{out}");
        assert!(out.contains("y_seconds_count 1\n"), "{out}");
        assert!(out.contains("y_seconds_sum 0.007\n"), "{out}");
    }
}
