//! The driver's side of tuning: it measures (`TCP_INFO` of each data socket, this process's and
//! the host's CPU) and applies (the stream gate, the reader and writer pools' gates) what the
//! session's tuners decide (`ferry_session::streams`, `ferry_session::pools`; docs/TUNING.md).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::gate::Gate;
use ferry_proto::Load;
use ferry_session::pools::pool_max;
use ferry_session::{ConnSample, HostSample};
use tokio::sync::watch;

use crate::stream::Stream;
use crate::tcp::{tcp_info_fd, TcpInfo};

pub use ferry_session::load::bottleneck;
pub use ferry_session::pools::{
    ThreadReport, ThreadStep, AUTO_MAX_STORAGE_THREADS, DEFAULT_STORAGE_THREADS,
};
pub use ferry_session::streams::{
    ramp_helpers, StreamPlan, AUTO_MAX_STREAMS, DEFAULT_STREAMS, MAX_RAMP_HELPERS,
};
pub(crate) use ferry_session::SAMPLE_EVERY;

/// Process CPU time, user plus system (`getrusage(RUSAGE_SELF)`).
pub(crate) fn process_cpu() -> Duration {
    // SAFETY: `usage` is a writable rusage; getrusage only writes into it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// The host's CPU time since boot, busy and in all, in clock ticks (`/proc/stat`'s first
/// line: busy is everything but idle and iowait). None where it cannot be read.
pub(crate) fn host_cpu() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse_host_cpu(stat.lines().next()?)
}

fn parse_host_cpu(line: &str) -> Option<(u64, u64)> {
    let mut fields = line.split_ascii_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    // user nice system idle iowait irq softirq steal; guest time is already in user.
    let v: Vec<u64> = fields
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    if v.len() < 5 {
        return None;
    }
    let total: u64 = v.iter().sum();
    Some((total - v[3] - v[4], total))
}

/// Cores this process may run on (affinity and cgroup quota included).
pub(crate) fn cores() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

fn permille(part: f64) -> u16 {
    (part.clamp(0.0, 1.0) * 1000.0).round() as u16
}

/// Samples one end's queue towards the network (see [`Load`]) and its CPU time.
pub(crate) struct LoadMeter {
    t0: Instant,
    cpu0: Duration,
    samples: u64,
    empty: u64,
    full: u64,
}

impl LoadMeter {
    pub(crate) fn start() -> Self {
        Self {
            t0: Instant::now(),
            cpu0: process_cpu(),
            samples: 0,
            empty: 0,
            full: 0,
        }
    }

    pub(crate) fn sample(&mut self, empty: bool, full: bool) {
        self.samples += 1;
        self.empty += u64::from(empty);
        self.full += u64::from(full);
    }

    pub(crate) fn load(&self) -> Load {
        let wall = self.t0.elapsed().as_secs_f64() * f64::from(cores());
        let cpu = process_cpu().saturating_sub(self.cpu0).as_secs_f64();
        let share = |n: u64| n as f64 / self.samples.max(1) as f64;
        Load {
            cpu_permille: permille(if wall > 0.0 { cpu / wall } else { 0.0 }),
            starved_permille: permille(share(self.empty)),
            blocked_permille: permille(share(self.full)),
            threads: 0,
        }
    }
}

/// What the session's tuners and endgame need of a connection's `TCP_INFO`.
pub(crate) fn conn_sample(info: &TcpInfo) -> ConnSample {
    ConnSample {
        delivered: info.delivered(),
        unacked: info.unacked_bytes(),
        send_rate: info.send_rate(),
        busy_us: info.busy_us,
        window_us: info.sndbuf_limited_us + info.rwnd_limited_us,
    }
}

/// This process and its host now, for the stream tuner.
pub(crate) fn host_sample() -> HostSample {
    HostSample {
        cpu: process_cpu(),
        host: host_cpu(),
        cores: cores(),
    }
}

/// A reader or writer pool's gate: `start` threads working; with `tune`, room to grow to
/// the host's cores, at least [`AUTO_MAX_STORAGE_THREADS`]; never more than `most`.
pub(crate) fn storage_gate(start: usize, tune: bool, most: usize) -> Arc<Gate> {
    let most = u32::try_from(most).unwrap_or(u32::MAX).max(1);
    let start = u32::try_from(start).unwrap_or(u32::MAX).clamp(1, most);
    let max = if tune {
        pool_max(start, tune).max(cores()).min(most)
    } else {
        start
    };
    Arc::new(Gate::new(start, max))
}

/// The sending end's data sockets as its driver samples them, and the `watch` of the active
/// count the stream tasks follow (the session's stream tuner sets it).
pub(crate) struct DataSockets {
    active: watch::Sender<u32>,
    /// Duplicates of the data sockets, by connection index (`None` if one could not be
    /// made): sampled while the stream tasks own the connections, and they keep the
    /// descriptor numbers from being reused before the session ends.
    socks: Vec<Option<OwnedFd>>,
}

impl DataSockets {
    /// Over `data`, `active` of them carrying data; with the receiver for the stream tasks.
    pub(crate) fn new(data: &[Stream], active: u32) -> (Self, watch::Receiver<u32>) {
        let socks = data
            .iter()
            .map(|s| s.tcp().as_fd().try_clone_to_owned().ok())
            .collect();
        let (active, rx) = watch::channel(active);
        (Self { active, socks }, rx)
    }

    /// Tells the stream tasks how many carry data.
    pub(crate) fn publish(&self, n: u32) {
        self.active
            .send_if_modified(|a| std::mem::replace(a, n) != n);
    }

    /// What the kernel says about each data connection now, by index.
    pub(crate) fn infos(&self) -> Vec<Option<TcpInfo>> {
        self.socks
            .iter()
            .map(|s| s.as_ref().and_then(|s| tcp_info_fd(s.as_fd())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_cpu_reads_the_first_line_of_proc_stat() {
        let line = "cpu  100 5 50 800 40 3 2 0 7 0";
        assert_eq!(parse_host_cpu(line), Some((160, 1000)));
        assert_eq!(parse_host_cpu("cpu0 1 2 3 4 5"), None);
        assert_eq!(parse_host_cpu("cpu 1 2 x 4 5"), None);
        assert_eq!(parse_host_cpu("cpu 1 2 3"), None);
        assert_eq!(parse_host_cpu(""), None);
        if let Some((busy, total)) = host_cpu() {
            assert!(busy <= total && total > 0);
        }
    }
}
