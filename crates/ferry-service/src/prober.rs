//! Scheduled path measurements (IEPM-BW style): every `every`, each link (a server of the
//! endpoints) is measured with ferry-net's memory-to-memory probe (`speedtest::run`, what
//! `ferry probe net` runs; never the binary) for a short `duration`, one link at a time. A link
//! with a job running on it is skipped and tried again a little later, and no job starts on a
//! link while it is probed, so a probe neither measures nor slows a transfer. Each probe adds
//! a `probe` sample (rate, RTT, loss) to the link's history; a failed one is only logged.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::NoReporter;
use ferry_net::speedtest::{self, ProbeDirection, ProbePoint, ProbeResult};
use tokio::time::Instant;

use crate::history::{LinkSample, Source};
use crate::job::now_ms;
use crate::scheduler::Scheduler;

/// The longest wait before a skipped link (a job ran on it) is tried again.
const RETRY_BUSY: Duration = Duration::from_secs(10);
/// How long a probe may take beyond its sending period (connecting, the result) before it is
/// given up.
const PROBE_GRACE: Duration = Duration::from_secs(30);

/// When and how the links are measured.
#[derive(Clone, Debug)]
pub struct ProbeSchedule {
    /// Time between two probes of a link.
    pub every: Duration,
    /// Each probe's sending period.
    pub duration: Duration,
}

impl ProbeSchedule {
    /// A short probe: long enough to leave slow start behind on most paths, short enough to
    /// cost a busy link little.
    pub const DEFAULT_DURATION: Duration = Duration::from_secs(2);
}

/// Probes the links on `schedule` until `shutdown` resolves; the first round starts at once.
pub async fn run(
    scheduler: Arc<Scheduler>,
    schedule: ProbeSchedule,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let links: Vec<String> = scheduler
        .runner()
        .endpoints
        .servers()
        .map(str::to_owned)
        .collect();
    if links.is_empty() {
        return shutdown.await;
    }
    let start = Instant::now();
    let mut due: HashMap<String, Instant> = links.iter().map(|l| (l.clone(), start)).collect();
    let retry = schedule.every.min(RETRY_BUSY);
    loop {
        let now = Instant::now();
        for link in &links {
            if due[link] > now {
                continue;
            }
            let next = match scheduler.claim_link(link) {
                None => Instant::now() + retry,
                Some(claim) => {
                    tokio::select! {
                        _ = &mut shutdown => return,
                        _ = probe(&scheduler, claim.link(), schedule.duration) => {}
                    }
                    drop(claim);
                    Instant::now() + schedule.every
                }
            };
            due.insert(link.clone(), next);
        }
        let wake = due.values().min().copied().unwrap_or(now + schedule.every);
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// One probe of `link`, its sample recorded.
async fn probe(scheduler: &Scheduler, link: &str, duration: Duration) {
    let cfg = match scheduler.runner().probe_client(link) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("probing {link}: {}", e.message);
            return;
        }
    };
    let point = ProbePoint {
        direction: ProbeDirection::ClientToServer,
        streams: ferry_net::DEFAULT_STREAMS,
        duration,
        window: 0,
    };
    let r = tokio::time::timeout(
        duration + PROBE_GRACE,
        speedtest::run(&cfg, &point, &NoReporter),
    )
    .await;
    let r = match r {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return tracing::warn!("probing {link}: {e}"),
        Err(_) => return tracing::warn!("probing {link}: no result in time"),
    };
    let s = sample(&r, duration);
    if let Err(e) = scheduler.store().add_link_sample(link, &s) {
        tracing::warn!("probing {link}: recording the sample: {e}");
    }
}

/// A probe's result as a link sample: the receiver's rate after the first fifth of the period
/// (slow start), the idle RTT of the control connection (else the one under load), and the
/// share of segments the sender retransmitted; what the probe did not measure is `None`.
pub fn sample(r: &ProbeResult, duration: Duration) -> LinkSample {
    let rate = r.rate_mbps(duration / 5) * 1e6 / 8.0;
    let rtt_ms = if r.rtt_idle_us > 0 {
        Some(f64::from(r.rtt_idle_us) / 1000.0)
    } else {
        Some(r.rtt_load_ms()).filter(|x| *x > 0.0)
    };
    let segments: f64 = r
        .per_stream
        .iter()
        .filter(|s| s.snd_mss > 0)
        .map(|s| s.sent_bytes as f64 / f64::from(s.snd_mss))
        .sum();
    let loss = (segments >= 1.0).then(|| (r.retransmits() as f64 / segments).min(1.0));
    LinkSample {
        t_ms: now_ms(),
        rate,
        rtt_ms,
        loss,
        source: Source::Probe,
        job: None,
    }
}

#[cfg(test)]
mod tests {
    use ferry_net::speedtest::ProbeStreamReport;

    use super::*;

    fn result(per_stream: Vec<ProbeStreamReport>, rtt_idle_us: u32) -> ProbeResult {
        ProbeResult {
            direction: "client_to_server",
            streams: 1,
            window: 0,
            seconds: 1.0,
            interval_ms: 100,
            // 1 MB per 100 ms: 10 MB/s.
            intervals: vec![1_000_000; 10],
            sent_bytes: 0,
            received_bytes: 0,
            rtt_idle_us,
            rtt_idle_min_us: 0,
            per_stream,
        }
    }

    #[test]
    fn a_probe_result_becomes_rate_rtt_and_loss() {
        let s = ProbeStreamReport {
            sent_bytes: 1000 * 1448,
            snd_mss: 1448,
            total_retrans: 10,
            rtt_us: 4000,
            ..Default::default()
        };
        let got = sample(&result(vec![s.clone()], 2500), Duration::from_secs(1));
        assert!((got.rate - 10e6).abs() < 1.0, "{got:?}");
        assert_eq!(got.rtt_ms, Some(2.5));
        assert_eq!(got.loss, Some(0.01));
        assert_eq!((got.source, got.job), (Source::Probe, None));
        // No idle RTT: the one under load; no sender's view: no loss.
        let got = sample(&result(vec![s], 0), Duration::from_secs(1));
        assert_eq!(got.rtt_ms, Some(4.0));
        let got = sample(&result(vec![], 0), Duration::from_secs(1));
        assert_eq!((got.rtt_ms, got.loss), (None, None));
    }
}
