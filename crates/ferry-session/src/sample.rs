//! What the driver measures and hands to the session at each sample: the kernel's view of each
//! data connection and the host's CPU counters. The session never reads them itself.

use std::time::Duration;

/// How often each end samples its queues, its connections and its clock.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(25);

/// Samples per tuner tick: the tuners see progress every 100 ms.
pub(crate) const SAMPLES_PER_TICK: u32 = 4;

/// One data connection at a sample, from its `TCP_INFO`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnSample {
    /// Payload bytes that reached the peer, acknowledged or selectively acknowledged: the
    /// tuner's and the timeline's count (`bytes_acked` alone stalls while a hole is repaired).
    pub delivered: u64,
    /// Bytes the kernel still holds: not yet sent, or sent and not yet acknowledged.
    pub unacked: u64,
    /// What the connection can send now, bytes per second (0: unknown).
    pub send_rate: u64,
    /// Microseconds with data in flight (`tcpi_busy_time`), and of those, held back by a
    /// window (the send buffer or the peer's receive window). 0 on old kernels.
    pub busy_us: u64,
    pub window_us: u64,
}

/// The host at a sample: this process's CPU time, the host's busy and total CPU time (clock
/// ticks since boot; `None` where unknown), and the cores this process may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostSample {
    pub cpu: Duration,
    pub host: Option<(u64, u64)>,
    pub cores: u32,
}

impl Default for HostSample {
    fn default() -> Self {
        Self {
            cpu: Duration::ZERO,
            host: None,
            cores: 1,
        }
    }
}

/// Payload bytes delivered over all the connections sampled.
pub fn delivered(conns: &[Option<ConnSample>]) -> u64 {
    conns
        .iter()
        .flatten()
        .map(|c| c.delivered)
        .fold(0, u64::saturating_add)
}

/// Majority vote of a yes/no condition over the samples of one tuner tick: a queue that was
/// empty (or full) in at least half of them.
#[derive(Default)]
pub(crate) struct TickVote {
    samples: u32,
    yes: u32,
}

impl TickVote {
    /// Counts one sample; at the end of a tick, the vote (and a fresh count).
    pub(crate) fn push(&mut self, yes: bool) -> Option<bool> {
        self.samples += 1;
        self.yes += u32::from(yes);
        if self.samples < SAMPLES_PER_TICK {
            return None;
        }
        let vote = self.yes * 2 >= self.samples;
        *self = Self::default();
        Some(vote)
    }
}
