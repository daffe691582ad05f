//! Service mode's results: each job's outcome and verification, the API's latency under the
//! load by endpoint, the service's resident memory over the run, and the dark-link job's
//! story; written as summary.md, results.json and jobs.csv, api.csv and rss.csv.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use ferry_service::job::{Job, State};
use ferry_units::units::format_bytes;
use serde::{Deserialize, Serialize};

use crate::data::{self, Digest};

/// The bed as the report describes it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SvcBed {
    pub rtt_ms: Vec<u64>,
    pub rate_bps: u64,
    pub regime: String,
}

/// One job of the jobs phase.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct JobRow {
    /// Its place in the submission order (job j went over link j % 3).
    pub index: usize,
    pub id: Option<i64>,
    pub link: usize,
    pub dataset: String,
    pub state: String,
    pub attempts: u32,
    /// Submitted to ended, by the service's clock.
    pub wall_s: f64,
    /// Started (last attempt's first start) to ended.
    pub run_s: f64,
    pub files: u64,
    pub bytes: u64,
    /// Done, and the destination has the source's files, sizes and BLAKE3.
    pub verified: bool,
    pub error: String,
}

impl JobRow {
    /// The job's state and figures as the service reports them.
    pub fn fill(&mut self, j: &Job) {
        self.state = j.state.as_str().into();
        self.attempts = j.attempts;
        if let Some(f) = j.finished_ms {
            self.wall_s = (f - j.created_ms) as f64 / 1000.0;
            if let Some(s) = j.started_ms {
                self.run_s = (f - s) as f64 / 1000.0;
            }
        }
        if j.state != State::Done {
            self.error = j
                .last_error
                .clone()
                .unwrap_or_else(|| format!("ended {}", j.state.as_str()));
        }
    }

    /// The destination `got` against the source's digest.
    pub fn check(&mut self, got: &Path, want: &Digest) {
        match data::digest_path(got) {
            Ok(d) if &d == want => {
                self.verified = true;
                self.files = d.files;
                self.bytes = d.bytes;
            }
            Ok(d) => {
                self.error = format!(
                    "destination differs: {} files, {} bytes, BLAKE3 {} (source {}, {}, {})",
                    d.files, d.bytes, d.blake3, want.files, want.bytes, want.blake3
                )
            }
            Err(e) => self.error = format!("verifying {}: {e:#}", got.display()),
        }
    }
}

/// Request latencies (ms) and errors, by endpoint.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Latencies {
    pub ms: BTreeMap<String, Vec<f64>>,
    pub errors: BTreeMap<String, Vec<String>>,
}

impl Latencies {
    pub fn add(&mut self, endpoint: &str, ms: f64) {
        self.ms.entry(endpoint.into()).or_default().push(ms);
    }
    pub fn error(&mut self, endpoint: &str, e: String) {
        self.errors.entry(endpoint.into()).or_default().push(e);
    }
}

/// One endpoint's latency figures.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencyStats {
    pub endpoint: String,
    pub requests: usize,
    pub errors: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// The `q` quantile (nearest rank) of `v`; 0 when empty.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

pub fn stats(endpoint: &str, ms: &[f64], errors: usize) -> LatencyStats {
    LatencyStats {
        endpoint: endpoint.into(),
        requests: ms.len() + errors,
        errors,
        p50_ms: quantile(ms, 0.5),
        p99_ms: quantile(ms, 0.99),
        max_ms: ms.iter().copied().fold(0.0, f64::max),
    }
}

/// One reading of the service's resident memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RssSample {
    /// Seconds since the first submit.
    pub t_s: f64,
    pub rss_kib: u64,
}

/// The service's memory over the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RssSummary {
    pub start_kib: u64,
    pub peak_kib: u64,
    pub end_kib: u64,
    /// Least-squares slope over all samples, KiB a minute.
    pub slope_kib_min: f64,
    /// The same over the second half of the samples (after the queue's growth).
    pub late_slope_kib_min: f64,
    /// The median of the first half of the samples, and of the second: flat memory has them
    /// close.
    #[serde(default)]
    pub first_half_median_kib: u64,
    #[serde(default)]
    pub second_half_median_kib: u64,
}

/// Least-squares slope of RSS against time, KiB a minute; 0 with fewer than two samples.
pub fn slope(s: &[RssSample]) -> f64 {
    if s.len() < 2 {
        return 0.0;
    }
    let n = s.len() as f64;
    let mt = s.iter().map(|x| x.t_s).sum::<f64>() / n;
    let mr = s.iter().map(|x| x.rss_kib as f64).sum::<f64>() / n;
    let cov: f64 = s
        .iter()
        .map(|x| (x.t_s - mt) * (x.rss_kib as f64 - mr))
        .sum();
    let var: f64 = s.iter().map(|x| (x.t_s - mt).powi(2)).sum();
    if var == 0.0 {
        0.0
    } else {
        cov / var * 60.0
    }
}

/// The median (nearest rank) of the samples' RSS; 0 when empty.
fn median_kib(s: &[RssSample]) -> u64 {
    let v: Vec<f64> = s.iter().map(|x| x.rss_kib as f64).collect();
    quantile(&v, 0.5) as u64
}

pub fn rss_summary(s: &[RssSample]) -> RssSummary {
    let (first, second) = s.split_at(s.len() / 2);
    RssSummary {
        first_half_median_kib: median_kib(first),
        second_half_median_kib: median_kib(second),
        start_kib: s.first().map_or(0, |x| x.rss_kib),
        peak_kib: s.iter().map(|x| x.rss_kib).max().unwrap_or(0),
        end_kib: s.last().map_or(0, |x| x.rss_kib),
        slope_kib_min: slope(s),
        late_slope_kib_min: slope(&s[s.len() / 2..]),
    }
}

/// The dark-link job's story.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DarkOutcome {
    pub dataset: String,
    pub link: usize,
    pub dark_s: f64,
    /// Its final state ("done" when it completed without anyone acting).
    pub state: String,
    pub attempts: u32,
    pub last_error: String,
    /// Submit to end, by the bench's clock.
    pub total_s: f64,
    /// Submitted to ended, by the service's clock.
    pub job_s: f64,
    /// The link back to the job's end.
    pub after_back_s: f64,
    pub verified: bool,
    pub verify_error: String,
    /// What the bench saw change, in order, with seconds since the submit.
    pub events: Vec<String>,
}

/// The job store lock's figures from `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LockTakes {
    pub takes: u64,
    pub wait_s: f64,
    pub hold_s: f64,
}

/// The store lock's takes and total wait and hold from a `/metrics` text; `None` without them.
pub fn lock_takes(metrics: &str) -> Option<LockTakes> {
    let value = |name: &str| {
        metrics.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == name).then(|| v.trim().parse::<f64>().ok())?
        })
    };
    Some(LockTakes {
        takes: value("ferry_service_store_lock_wait_seconds_count")? as u64,
        wait_s: value("ferry_service_store_lock_wait_seconds_sum")?,
        hold_s: value("ferry_service_store_lock_hold_seconds_sum")?,
    })
}

/// A service run's results.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SvcReport {
    pub command: String,
    pub started: String,
    pub host: Vec<(String, String)>,
    pub storage: String,
    pub bed: SvcBed,
    pub jobs: usize,
    /// Where the service and its bed ran (`Placement::describe`).
    #[serde(default)]
    pub placement: String,
    /// The CPUs the kernel let the service's process, and the bench's (the bed's), run on.
    #[serde(default)]
    pub cpus_service: String,
    #[serde(default)]
    pub cpus_bed: String,
    /// The store lock's takes over the run, and their wait and hold (seconds in all), from
    /// the service's `/metrics` once every job of the jobs phase ended.
    #[serde(default)]
    pub store_lock: Option<LockTakes>,
    pub submitted: usize,
    pub done: usize,
    pub failed: usize,
    /// Jobs not ended when the wait's bound ran out, or whose state could not be read.
    pub unfinished: usize,
    pub verified_jobs: usize,
    pub verified_files: u64,
    pub verified_bytes: u64,
    /// Jobs that needed more than one attempt.
    pub retried: usize,
    /// The first submit to the last job's end.
    pub wall_s: f64,
    /// The first submit to the last.
    pub submit_s: f64,
    pub timed_out: bool,
    pub submit_ms: Vec<f64>,
    pub submit_errors: Vec<String>,
    pub latencies: Latencies,
    pub api: Vec<LatencyStats>,
    pub rss: Vec<RssSample>,
    pub memory: RssSummary,
    /// The service's RSS 3 s after the jobs phase's last job ended.
    #[serde(default)]
    pub rss_idle_kib: Option<u64>,
    /// The service's RSS at the end of the run, 3 s after every job ended (the dark-link one
    /// included).
    pub rss_after_kib: Option<u64>,
    pub dark: Option<DarkOutcome>,
    pub rows: Vec<JobRow>,
    pub duration_s: f64,
    pub notes: Vec<String>,
}

impl SvcReport {
    /// The counts and figures from the rows, latencies and samples.
    pub fn summarize(&mut self) {
        let rows = &self.rows;
        self.submitted = rows.iter().filter(|r| r.id.is_some()).count();
        self.done = rows.iter().filter(|r| r.state == "done").count();
        self.failed = rows
            .iter()
            .filter(|r| r.state == "failed" || r.state == "cancelled")
            .count();
        self.unfinished = self.submitted - self.done - self.failed;
        let ok = rows.iter().filter(|r| r.verified);
        self.verified_jobs = ok.clone().count();
        self.verified_files = ok.clone().map(|r| r.files).sum();
        self.verified_bytes = ok.map(|r| r.bytes).sum();
        self.retried = rows.iter().filter(|r| r.attempts > 1).count();
        let mut api = vec![stats(
            "POST /api/jobs (submit)",
            &self.submit_ms,
            self.submit_errors.len(),
        )];
        for (ep, ms) in &self.latencies.ms {
            let errors = self.latencies.errors.get(ep).map_or(0, Vec::len);
            api.push(stats(ep, ms, errors));
        }
        for (ep, e) in &self.latencies.errors {
            if !self.latencies.ms.contains_key(ep) {
                api.push(stats(ep, &[], e.len()));
            }
        }
        self.api = api;
        self.memory = rss_summary(&self.rss);
    }

    /// Every job done and verified, and the dark-link job (if run) done and verified.
    pub fn all_ok(&self) -> bool {
        self.jobs > 0
            && self.verified_jobs == self.jobs
            && self.dark.as_ref().is_none_or(|d| d.verified)
    }

    /// summary.md, results.json and the CSVs into `out`.
    pub fn write(&self, out: &Path) -> Result<String> {
        let md = summary(self);
        std::fs::write(out.join("summary.md"), &md)?;
        std::fs::write(
            out.join("results.json"),
            serde_json::to_string_pretty(self)?,
        )?;
        let mut w = csv::Writer::from_path(out.join("jobs.csv"))?;
        for r in &self.rows {
            w.serialize(r)?;
        }
        w.flush()?;
        let mut w = csv::Writer::from_path(out.join("api.csv"))?;
        for s in &self.api {
            w.serialize(s)?;
        }
        w.flush()?;
        let mut w = csv::Writer::from_path(out.join("rss.csv"))?;
        for s in &self.rss {
            w.serialize(s)?;
        }
        w.flush()?;
        Ok(md)
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// The report as Markdown.
pub fn summary(r: &SvcReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# ferry-bench service: {} jobs over 3 links\n", r.jobs);
    let _ = writeln!(
        s,
        "`{}`, started {}, {:.0} s in all.\n",
        r.command, r.started, r.duration_s
    );
    let rtts: Vec<String> = r.bed.rtt_ms.iter().map(|m| format!("{m} ms")).collect();
    let _ = writeln!(
        s,
        "Bed: `ferry service` on one host, a `ferry serve` on each of three hosts behind its own \
         emulated link ({} Mbit/s; RTT {}; {} regime). Storage: {}.\n",
        r.bed.rate_bps / 1_000_000,
        rtts.join(", "),
        r.bed.regime,
        r.storage
    );
    let _ = writeln!(
        s,
        "Placement: {} (the kernel's CPU lists: service {}, bench and bed {}).\n",
        r.placement, r.cpus_service, r.cpus_bed
    );
    jobs_section(&mut s, r);
    api_section(&mut s, r);
    if let Some(l) = &r.store_lock {
        let _ = writeln!(
            s,
            "Job store lock over the run (the service's `/metrics` at the jobs phase's end): {} \
             takes, {:.2} s waited, {:.2} s held in all.\n",
            l.takes, l.wait_s, l.hold_s
        );
    }
    memory_section(&mut s, r);
    dark_section(&mut s, r);
    let _ = writeln!(s, "## Host\n");
    for (k, v) in &r.host {
        let _ = writeln!(s, "- {k}: {v}");
    }
    if !r.notes.is_empty() {
        let _ = writeln!(s, "\n## Notes\n");
        for n in &r.notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    s
}

fn jobs_section(s: &mut String, r: &SvcReport) {
    let _ = writeln!(s, "## Jobs\n");
    let verdict = if r.verified_jobs == r.jobs {
        "every job done and verified"
    } else {
        "NOT every job done and verified"
    };
    let _ = writeln!(
        s,
        "{} of {} jobs done and verified ({verdict}): {} files, {}; {} failed, {} unfinished, \
         {} submits refused, {} needed more than one attempt. Submitting took {:.1} s; the \
         first submit to the last job's end {:.1} s{}.\n",
        r.verified_jobs,
        r.jobs,
        r.verified_files,
        format_bytes(r.verified_bytes),
        r.failed,
        r.unfinished,
        r.submit_errors.len(),
        r.retried,
        r.submit_s,
        r.wall_s,
        if r.timed_out {
            " (the wait's bound ran out)"
        } else {
            ""
        }
    );
    let bad: Vec<&JobRow> = r.rows.iter().filter(|x| !x.verified).collect();
    for row in bad.iter().take(10) {
        let _ = writeln!(
            s,
            "- job {} (#{:?}, link {}, {}): {} — {}",
            row.index, row.id, row.link, row.dataset, row.state, row.error
        );
    }
    if let Some(e) = r.submit_errors.first() {
        let _ = writeln!(s, "- a refused submit: {e}");
    }
    if !bad.is_empty() || !r.submit_errors.is_empty() {
        s.push('\n');
    }
}

fn api_section(s: &mut String, r: &SvcReport) {
    let _ = writeln!(
        s,
        "## API latency under the load\n\nFrom the service's host while the jobs ran: the \
         submits and a poller (every 50 ms: the list, the newest job, `/metrics`) each over one \
         TLS connection kept open, as a script or a dashboard would; beside them, every 100 ms, \
         one of the three on a new TLS connection from a client of its own, as the CLI makes \
         (\"(new connection)\").\n"
    );
    let _ = writeln!(
        s,
        "| endpoint | requests | errors | p50 ms | p99 ms | max ms |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|");
    for a in &r.api {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.1} | {:.1} | {:.1} |",
            a.endpoint, a.requests, a.errors, a.p50_ms, a.p99_ms, a.max_ms
        );
    }
    for (ep, e) in &r.latencies.errors {
        if let Some(first) = e.first() {
            let _ = writeln!(s, "\n{ep}: {} errors, the first: {first}", e.len());
        }
    }
    s.push('\n');
}

fn memory_section(s: &mut String, r: &SvcReport) {
    let m = &r.memory;
    let _ = writeln!(
        s,
        "## Service memory (VmRSS, every second)\n\nWhile the jobs ran, {} samples: start {}, \
         peak {}, end {}; median {} over the first half of the samples, {} over the second; \
         slope {:.0} KiB/min over the run, {:.0} KiB/min over its second half. Idle, 3 s \
         after the last job ended: {}. At the end of the run, 3 s after every job ended (the \
         dark-link one included): {}.\n",
        r.rss.len(),
        mib(m.start_kib),
        mib(m.peak_kib),
        mib(m.end_kib),
        mib(m.first_half_median_kib),
        mib(m.second_half_median_kib),
        m.slope_kib_min,
        m.late_slope_kib_min,
        r.rss_idle_kib.map_or("not read".into(), mib),
        r.rss_after_kib.map_or("not read".into(), mib)
    );
}

fn dark_section(s: &mut String, r: &SvcReport) {
    let Some(d) = &r.dark else {
        let _ = writeln!(s, "## Dark link\n\nNot run.\n");
        return;
    };
    let verdict = if d.state == "done" && d.verified {
        "completed without intervention and verified"
    } else {
        "did NOT complete"
    };
    let _ = writeln!(
        s,
        "## Dark link\n\nOne job of {} over link {}, dark for {:.0} s from 2 s into its run: \
         {verdict}. State {}, {} attempt(s), {:.1} s from submit to end ({:.1} s after the link \
         came back).{}{}\n",
        d.dataset,
        d.link,
        d.dark_s,
        d.state,
        d.attempts,
        d.total_s,
        d.after_back_s,
        if d.last_error.is_empty() {
            String::new()
        } else {
            format!(" Last error: `{}`.", d.last_error)
        },
        if d.verify_error.is_empty() {
            String::new()
        } else {
            format!(" Verifying: {}.", d.verify_error)
        }
    );
    for e in &d.events {
        let _ = writeln!(s, "- {e}");
    }
    s.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_locks_takes_are_read_from_metrics_or_not_at_all() {
        let m = "# TYPE x histogram\n\
                 ferry_service_store_lock_wait_seconds_bucket{le=\"+Inf\"} 12\n\
                 ferry_service_store_lock_wait_seconds_sum 0.5\n\
                 ferry_service_store_lock_wait_seconds_count 12\n\
                 ferry_service_store_lock_hold_seconds_sum 1.25\n\
                 ferry_service_store_lock_hold_seconds_count 12\n";
        assert_eq!(
            lock_takes(m),
            Some(LockTakes {
                takes: 12,
                wait_s: 0.5,
                hold_s: 1.25
            })
        );
        assert_eq!(lock_takes(""), None);
        assert_eq!(
            lock_takes(&m.replace("_hold_seconds_sum 1.25", "_hold_seconds_sum x")),
            None
        );
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&[3.0], 0.99), 3.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    #[test]
    fn the_slope_is_kib_a_minute() {
        let s: Vec<RssSample> = (0..10)
            .map(|i| RssSample {
                t_s: f64::from(i),
                rss_kib: 1000 + 2 * i as u64,
            })
            .collect();
        assert!((slope(&s) - 120.0).abs() < 1e-9, "{}", slope(&s));
        let m = rss_summary(&s);
        assert_eq!((m.start_kib, m.peak_kib, m.end_kib), (1000, 1018, 1018));
        // Halves of 5 samples: 1000..1008 and 1010..1018, their middles.
        assert_eq!(
            (m.first_half_median_kib, m.second_half_median_kib),
            (1004, 1014)
        );
        assert_eq!(slope(&s[..1]), 0.0);
    }

    #[test]
    fn counts_come_from_the_rows() {
        let row = |state: &str, verified: bool| JobRow {
            id: Some(1),
            state: state.into(),
            verified,
            files: 10,
            bytes: 100,
            attempts: 1,
            ..Default::default()
        };
        let mut r = SvcReport {
            jobs: 4,
            rows: vec![
                row("done", true),
                row("done", true),
                row("failed", false),
                row("running", false),
            ],
            submit_ms: vec![1.0, 2.0],
            ..Default::default()
        };
        r.summarize();
        assert_eq!((r.submitted, r.done, r.failed, r.unfinished), (4, 2, 1, 1));
        assert_eq!(
            (r.verified_jobs, r.verified_files, r.verified_bytes),
            (2, 20, 200)
        );
        assert!(!r.all_ok());
        assert_eq!(r.api[0].requests, 2);
        assert!(summary(&r).contains("NOT every job done and verified"));
    }
}
