//! The speed test: memory-to-memory throughput over ferry's own connections, what
//! `ferry probe net` measures each point of its sweep with. (Named apart from the `ferry-probe`
//! crate, which analyses the sweep, and the `ferry probe` command; the wire frames keep their
//! `Probe*` names.)
//!
//! The client sends `ProbeRequest` on an authenticated control connection; the server answers
//! `Ready` and the data connections join exactly as for a transfer (same TLS, same session
//! secret, same connection cap). Then one side writes `ProbeData` filler on every data
//! connection for the requested time and closes them; the other reads, checks the framing and
//! discards. Nothing touches a disk and nothing is digested. At the end the server sends
//! `ProbeResult`: what it counted per 100 ms interval and per data connection, plus, when it
//! was the sender, each socket's `TCP_INFO`. The client thus always has the receiver's
//! per-interval counts (its own or the server's) and the sender's view of the congestion
//! window, RTT under load and retransmits.
//!
//! Bounds on the server: at most [`MAX_PROBE_DURATION`] of sending (longer requests are
//! refused), at most `max_streams` data connections (fewer are granted, as for transfers), one
//! shared 256 KiB filler buffer plus one 256 KiB read buffer per connection, every wait
//! bounded by the duration plus [`DRAIN_GRACE`].

use std::time::Duration;

use ferry_core::Reporter;
use ferry_proto::{ErrorCode, Frame, ProbeStream, MAX_CONTROL_PAYLOAD};
use ferry_units::stats::{mean, median_of_positive};
use serde::Serialize;
use tokio::time::Instant;

pub use ferry_proto::ProbeDirection;

pub(crate) mod flow;

pub use flow::{
    DRAIN_GRACE, MAX_PROBE_DURATION, MIN_PROBE_DURATION, PROBE_FRAME_DATA, PROBE_INTERVAL,
};

use crate::client::{self, ClientConfig};
use crate::error::SessionError;
use crate::transport::conn::expect_frame;
use crate::transport::stream::Stream;
use crate::transport::tcp::tcp_info;
use flow::{run_streams, Buckets};

/// One measurement: which way, how many data connections, for how long, with which socket
/// buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbePoint {
    pub direction: ProbeDirection,
    pub streams: u16,
    /// The sending period (the receiver's rate is computed over part of it).
    pub duration: Duration,
    /// SO_SNDBUF/SO_RCVBUF on both ends; 0 = the kernel's autotuning.
    pub window: u32,
}

/// The sending side's view of one data connection.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct ProbeStreamReport {
    /// Bytes the sender wrote and the receiver counted on this connection.
    pub sent_bytes: u64,
    pub received_bytes: u64,
    /// Smoothed RTT under load (median of samples during the second half of the period).
    pub rtt_us: u32,
    pub min_rtt_us: u32,
    /// Congestion window in segments and the segment size (median of the same samples).
    pub snd_cwnd: u32,
    pub snd_mss: u32,
    /// Segments retransmitted over the connection's life.
    pub total_retrans: u32,
}

impl ProbeStreamReport {
    /// Congestion window in bytes.
    pub fn cwnd_bytes(&self) -> u64 {
        u64::from(self.snd_cwnd) * u64::from(self.snd_mss)
    }
}

/// What one probe measured.
#[derive(Clone, Debug, Serialize)]
pub struct ProbeResult {
    pub direction: &'static str,
    /// Data connections the server granted (at most what was asked for).
    pub streams: u16,
    pub window: u32,
    /// The sending period in seconds.
    pub seconds: f64,
    pub interval_ms: u16,
    /// The receiver's byte counts per interval, from the moment the data connections were up
    /// (the client's or the server's clock, whichever received).
    pub intervals: Vec<u64>,
    pub sent_bytes: u64,
    pub received_bytes: u64,
    /// The control connection's smoothed and minimum RTT before any data flowed (µs).
    pub rtt_idle_us: u32,
    pub rtt_idle_min_us: u32,
    pub per_stream: Vec<ProbeStreamReport>,
}

impl ProbeResult {
    /// The receiver's rate in Mbit/s over the intervals from `skip` to the end of the sending
    /// period (slow start excluded, like `iperf3 -O`). Falls back to the whole sending period
    /// when `skip` leaves nothing.
    pub fn rate_mbps(&self, skip: Duration) -> f64 {
        let width = f64::from(self.interval_ms.max(1)) / 1000.0;
        let end = ((self.seconds / width).floor() as usize).min(self.intervals.len());
        let start = ((skip.as_secs_f64() / width).ceil() as usize).min(end);
        let (start, end) = if start < end { (start, end) } else { (0, end) };
        if end == 0 {
            return 0.0;
        }
        let bytes: u64 = self.intervals[start..end].iter().sum();
        bytes as f64 * 8.0 / ((end - start) as f64 * width) / 1e6
    }

    /// Median smoothed RTT under load over the data connections, in ms (0 when unknown).
    pub fn rtt_load_ms(&self) -> f64 {
        median_of_positive(self.per_stream.iter().map(|s| f64::from(s.rtt_us) / 1000.0))
    }

    /// Retransmitted segments over all data connections.
    pub fn retransmits(&self) -> u64 {
        self.per_stream
            .iter()
            .map(|s| u64::from(s.total_retrans))
            .sum()
    }

    /// Mean congestion window per data connection, in bytes.
    pub fn cwnd_bytes(&self) -> f64 {
        let v: Vec<f64> = self
            .per_stream
            .iter()
            .map(|s| s.cwnd_bytes() as f64)
            .collect();
        mean(&v).unwrap_or(0.0)
    }
}

fn direction_name(d: ProbeDirection) -> &'static str {
    match d {
        ProbeDirection::ClientToServer => "client_to_server",
        ProbeDirection::ServerToClient => "server_to_client",
    }
}

/// Runs one probe against the server in `cfg` (token, TLS and pinning as for a transfer;
/// `cfg.opts` is ignored, `point` says what to measure). One session per call.
pub async fn run(
    cfg: &ClientConfig,
    point: &ProbePoint,
    reporter: &dyn Reporter,
) -> Result<ProbeResult, SessionError> {
    if !(MIN_PROBE_DURATION..=MAX_PROBE_DURATION).contains(&point.duration) {
        return Err(SessionError::Remote {
            code: ErrorCode::BAD_REQUEST,
            message: format!(
                "a probe runs {} ms to {} s",
                MIN_PROBE_DURATION.as_millis(),
                MAX_PROBE_DURATION.as_secs()
            ),
        });
    }
    let mut c = client::connect(cfg, reporter).await?;
    let idle = tcp_info(c.control.tcp()).unwrap_or_default();
    let mut cfg = cfg.clone();
    cfg.opts.streams = point.streams;
    cfg.opts.tcp_window = point.window;
    let request = Frame::ProbeRequest {
        direction: point.direction,
        streams: point.streams,
        duration_ms: point.duration.as_millis() as u32,
        window: point.window,
    };
    let (opts, data) = client::start(&cfg, &mut c, request).await?;
    let duration = point.duration;
    let buckets = Buckets::new(Instant::now(), duration + DRAIN_GRACE);
    let sending = point.direction == ProbeDirection::ClientToServer;
    let ours = match run_streams(data, sending, &buckets, duration).await {
        Ok(s) => s,
        Err(e) => {
            // The server may have said why (an Error on the control connection).
            let said = tokio::time::timeout(
                Duration::from_secs(1),
                expect_frame(&mut c.control, MAX_CONTROL_PAYLOAD, "control"),
            )
            .await;
            return Err(match said {
                Ok(Err(remote @ SessionError::Remote { .. })) => remote,
                _ => e,
            });
        }
    };
    let (interval_ms, intervals, theirs) =
        read_result(&mut c.control, DRAIN_GRACE + cfg.idle_timeout).await?;
    if theirs.len() != ours.len() {
        return Err(SessionError::Protocol(format!(
            "probe result covers {} data connections, {} were open",
            theirs.len(),
            ours.len()
        )));
    }
    let per_stream = if sending {
        pair(&ours, &theirs)
    } else {
        pair(&theirs, &ours)
    };
    let (interval_ms, intervals) = if sending {
        (interval_ms, intervals)
    } else {
        (PROBE_INTERVAL.as_millis() as u16, buckets.snapshot())
    };
    Ok(ProbeResult {
        direction: direction_name(point.direction),
        streams: opts.streams,
        window: point.window,
        seconds: duration.as_secs_f64(),
        interval_ms,
        intervals,
        sent_bytes: per_stream.iter().map(|s| s.sent_bytes).sum(),
        received_bytes: per_stream.iter().map(|s| s.received_bytes).sum(),
        rtt_idle_us: idle.rtt_us,
        rtt_idle_min_us: idle.min_rtt_us,
        per_stream,
    })
}

/// The server's `ProbeResult`: the width of its intervals, its counts, and its side of each
/// data connection.
async fn read_result(
    control: &mut Stream,
    wait: Duration,
) -> Result<(u16, Vec<u64>, Vec<ProbeStream>), SessionError> {
    let reply = tokio::time::timeout(wait, expect_frame(control, MAX_CONTROL_PAYLOAD, "control"))
        .await
        .map_err(|_| SessionError::Timeout("waiting for the probe result"))??;
    let Frame::ProbeResult {
        interval_ms,
        intervals,
        streams,
    } = reply
    else {
        return Err(SessionError::Protocol(format!(
            "expected ProbeResult, got {:?}",
            reply.frame_type()
        )));
    };
    Ok((interval_ms, intervals, streams))
}

/// Each data connection as both ends saw it: the sender's socket, the receiver's count.
fn pair(senders: &[ProbeStream], receivers: &[ProbeStream]) -> Vec<ProbeStreamReport> {
    senders
        .iter()
        .zip(receivers)
        .map(|(s, r)| ProbeStreamReport {
            sent_bytes: s.bytes,
            received_bytes: r.bytes,
            rtt_us: s.rtt_us,
            min_rtt_us: s.min_rtt_us,
            snd_cwnd: s.snd_cwnd,
            snd_mss: s.snd_mss,
            total_retrans: s.total_retrans,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(intervals: Vec<u64>, seconds: f64) -> ProbeResult {
        ProbeResult {
            direction: "client_to_server",
            streams: 1,
            window: 0,
            seconds,
            interval_ms: 100,
            intervals,
            sent_bytes: 0,
            received_bytes: 0,
            rtt_idle_us: 0,
            rtt_idle_min_us: 0,
            per_stream: Vec::new(),
        }
    }

    #[test]
    fn rate_skips_slow_start_and_the_drain() {
        // 1 s of ramp at 1 MB per interval, then 12.5 MB per interval (1 Gbit/s), then a
        // drain bucket after the sending period that must not count.
        let mut v = vec![1_000_000; 10];
        v.extend(vec![12_500_000; 30]);
        v.push(99_000_000);
        let r = result(v, 4.0);
        assert!((r.rate_mbps(Duration::from_secs(1)) - 1000.0).abs() < 1e-6);
        // Skipping everything falls back to the whole period.
        let all = r.rate_mbps(Duration::from_secs(10));
        assert!((all - (10.0 * 1e6 + 30.0 * 12.5e6) * 8.0 / 4.0 / 1e6).abs() < 1e-6);
        assert_eq!(result(vec![], 1.0).rate_mbps(Duration::ZERO), 0.0);
    }
}
