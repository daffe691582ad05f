//! The data connections' side of a speed test, the same for client and server: `ProbeData`
//! filler written for the sending period, or read and counted per interval.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ferry_proto::{Frame, FrameHeader, FrameType, ProbeStream, HEADER_LEN};
use ferry_units::stats::upper_median;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::error::SessionError;
use crate::transport::stream::Stream;
use crate::transport::tcp::tcp_info;

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
    // The upper median: a sampled value, never an average of two.
    let med = |f: fn(&(u32, u32, u32)) -> u32| {
        let mut v: Vec<f64> = samples.iter().map(|x| f64::from(f(x))).collect();
        upper_median(&mut v).map_or(0, |m| m as u32)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filler_is_one_probe_data_frame() {
        let f = filler();
        assert_eq!(f[0], FrameType::PROBE_DATA.0);
        assert_eq!(f.len(), HEADER_LEN + 4 + PROBE_FRAME_DATA as usize);
    }
}
