//! Memory-to-memory throughput probe over ferry's own connections (`ferry probe net`).
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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ferry_core::Reporter;
use ferry_proto::{
    ErrorCode, Frame, FrameHeader, FrameType, ProbeStream, HEADER_LEN, MAX_CONTROL_PAYLOAD,
};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinSet;
use tokio::time::Instant;

pub use ferry_proto::ProbeDirection;

use crate::client::{self, ClientConfig};
use crate::conn::expect_frame;
use crate::error::SessionError;
use crate::stream::Stream;
use crate::tcp::tcp_info;

/// Longest sending period a server accepts.
pub const MAX_PROBE_DURATION: Duration = Duration::from_secs(30);
/// Shortest sending period: below this there is nothing to measure.
pub const MIN_PROBE_DURATION: Duration = Duration::from_millis(100);
/// Width of the buckets both sides count bytes in.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(100);
/// How long after the sending period a receiver keeps reading what is still in flight (send
/// buffers and queues drain in a few round trips) before it stops counting.
pub const DRAIN_GRACE: Duration = Duration::from_secs(5);
/// Filler bytes per `ProbeData` frame (announced as `Ready.block_size`).
pub const PROBE_FRAME_DATA: u32 = 256 << 10;

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
        median(self.per_stream.iter().map(|s| f64::from(s.rtt_us) / 1000.0))
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
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    }
}

/// Median of the positive values (0 = not measured), 0 if there are none.
fn median(it: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = it.filter(|x| *x > 0.0).collect();
    ferry_core::stats::median(&mut v).unwrap_or(0.0)
}

fn direction_name(d: ProbeDirection) -> &'static str {
    match d {
        ProbeDirection::ClientToServer => "client_to_server",
        ProbeDirection::ServerToClient => "server_to_client",
    }
}

/// One complete `ProbeData` frame, built once and written over and over.
fn filler() -> &'static Bytes {
    static FRAME: OnceLock<Bytes> = OnceLock::new();
    FRAME.get_or_init(|| {
        let mut out = BytesMut::new();
        Frame::ProbeData {
            data: Bytes::from(vec![0u8; PROBE_FRAME_DATA as usize]),
        }
        .encode(&mut out);
        out.freeze()
    })
}

/// Byte counts per interval since `t0`; late bytes land in the last bucket.
pub(crate) struct Buckets {
    t0: Instant,
    counts: Vec<AtomicU64>,
}

impl Buckets {
    pub(crate) fn new(t0: Instant, span: Duration) -> Arc<Self> {
        let n = span.as_millis().div_ceil(PROBE_INTERVAL.as_millis()).max(1) as usize;
        Arc::new(Self {
            t0,
            counts: (0..n.min(ferry_proto::MAX_PROBE_INTERVALS))
                .map(|_| AtomicU64::new(0))
                .collect(),
        })
    }

    fn add(&self, n: u64) {
        let i = (self.t0.elapsed().as_millis() / PROBE_INTERVAL.as_millis()) as usize;
        let i = i.min(self.counts.len() - 1);
        self.counts[i].fetch_add(n, Ordering::Relaxed);
    }

    /// The counts, without the empty buckets at the end.
    pub(crate) fn snapshot(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        while v.last() == Some(&0) {
            v.pop();
        }
        v
    }
}

/// Writes filler on `s` from `t0` until `t0 + duration`, then closes it. Returns the bytes
/// written and the socket's `TCP_INFO` (medians of samples from the second half).
async fn send_filler(
    mut s: Stream,
    buckets: Arc<Buckets>,
    duration: Duration,
) -> Result<ProbeStream, SessionError> {
    let frame = filler();
    let t0 = buckets.t0;
    let hard_stop = t0 + duration + DRAIN_GRACE;
    let mut bytes = 0u64;
    let mut samples: Vec<(u32, u32, u32)> = Vec::new();
    let mut next_sample = t0 + duration / 2;
    while t0.elapsed() < duration {
        tokio::time::timeout_at(hard_stop, s.write_all(frame))
            .await
            .map_err(|_| SessionError::Timeout("writing probe data (the receiver stalled)"))??;
        bytes += frame.len() as u64;
        buckets.add(frame.len() as u64);
        if Instant::now() >= next_sample {
            next_sample += Duration::from_millis(50);
            if let Some(i) = tcp_info(s.tcp()) {
                samples.push((i.rtt_us, i.snd_cwnd, i.snd_mss));
            }
        }
    }
    let last = tcp_info(s.tcp());
    if let (true, Some(i)) = (samples.is_empty(), &last) {
        samples.push((i.rtt_us, i.snd_cwnd, i.snd_mss));
    }
    let med = |f: fn(&(u32, u32, u32)) -> u32| {
        let mut v: Vec<u32> = samples.iter().map(f).collect();
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };
    let report = ProbeStream {
        bytes,
        rtt_us: med(|x| x.0),
        min_rtt_us: last.as_ref().map_or(0, |i| i.min_rtt_us),
        snd_cwnd: med(|x| x.1),
        snd_mss: med(|x| x.2),
        total_retrans: 0,
    };
    let _ = tokio::time::timeout_at(hard_stop, s.flush()).await;
    // Retransmits counted after the flush include the tail's.
    let retrans = tcp_info(s.tcp()).map_or(0, |i| i.total_retrans);
    let _ = tokio::time::timeout_at(hard_stop, s.shutdown()).await;
    Ok(ProbeStream {
        total_retrans: retrans,
        ..report
    })
}

/// Reads `ProbeData` frames from `s` until it ends or `deadline`, counting every byte into
/// `buckets`. Anything but `ProbeData` is a protocol error.
async fn receive_filler(
    mut s: Stream,
    buckets: Arc<Buckets>,
    deadline: Instant,
) -> Result<u64, SessionError> {
    let mut bytes = 0u64;
    let mut buf = vec![0u8; PROBE_FRAME_DATA as usize];
    let read = async {
        loop {
            let mut head = [0u8; HEADER_LEN];
            match s.read(&mut head[..1]).await {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                // A peer that closed without a TLS close_notify: what arrived still counts.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(SessionError::Io(e)),
            }
            s.read_exact(&mut head[1..]).await?;
            let header = FrameHeader::parse(&head)?;
            if header.ty != FrameType::PROBE_DATA {
                return Err(SessionError::Protocol(format!(
                    "unexpected {} frame on a probe's data connection",
                    header.ty.name()
                )));
            }
            bytes += HEADER_LEN as u64;
            buckets.add(HEADER_LEN as u64);
            let mut left = header.len as usize;
            while left > 0 {
                let n = s
                    .read(&mut buf[..left.min(PROBE_FRAME_DATA as usize)])
                    .await?;
                if n == 0 {
                    return Err(SessionError::Closed("probe data"));
                }
                left -= n;
                bytes += n as u64;
                buckets.add(n as u64);
            }
        }
    };
    match tokio::time::timeout_at(deadline, read).await {
        Ok(Ok(())) | Err(_) => Ok(bytes),
        Ok(Err(e)) => Err(e),
    }
}

/// Runs every data connection's side of the probe; returns per-connection results in order.
pub(crate) async fn run_streams(
    data: Vec<Stream>,
    sending: bool,
    buckets: &Arc<Buckets>,
    duration: Duration,
) -> Result<Vec<ProbeStream>, SessionError> {
    let mut set = JoinSet::new();
    let deadline = buckets.t0 + duration + DRAIN_GRACE;
    for (i, s) in data.into_iter().enumerate() {
        let b = buckets.clone();
        set.spawn(async move {
            let r = if sending {
                send_filler(s, b, duration).await
            } else {
                receive_filler(s, b, deadline)
                    .await
                    .map(|bytes| ProbeStream {
                        bytes,
                        ..ProbeStream::default()
                    })
            };
            (i, r)
        });
    }
    let mut out = Vec::new();
    while let Some(j) = set.join_next().await {
        match j {
            Ok((i, Ok(r))) => out.push((i, r)),
            Ok((_, Err(e))) => return Err(e),
            Err(e) => return Err(SessionError::Protocol(format!("probe task failed: {e}"))),
        }
    }
    out.sort_by_key(|(i, _)| *i);
    Ok(out.into_iter().map(|(_, r)| r).collect())
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
    let reply = tokio::time::timeout(
        DRAIN_GRACE + cfg.idle_timeout,
        expect_frame(&mut c.control, MAX_CONTROL_PAYLOAD, "control"),
    )
    .await
    .map_err(|_| SessionError::Timeout("waiting for the probe result"))??;
    let Frame::ProbeResult {
        interval_ms,
        intervals,
        streams: theirs,
    } = reply
    else {
        return Err(SessionError::Protocol(format!(
            "expected ProbeResult, got {:?}",
            reply.frame_type()
        )));
    };
    if theirs.len() != ours.len() {
        return Err(SessionError::Protocol(format!(
            "probe result covers {} data connections, {} were open",
            theirs.len(),
            ours.len()
        )));
    }
    let (senders, receivers) = if sending {
        (&ours, &theirs)
    } else {
        (&theirs, &ours)
    };
    let per_stream: Vec<ProbeStreamReport> = senders
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
        .collect();
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

    #[test]
    fn filler_is_one_probe_data_frame() {
        let f = filler();
        assert_eq!(f[0], FrameType::PROBE_DATA.0);
        assert_eq!(f.len(), HEADER_LEN + 4 + PROBE_FRAME_DATA as usize);
    }
}
