//! Bytes delivered per interval over a transfer: how fast it got going, and whether it held its
//! rate. `--json` reports it so that a benchmark can tell how long a transfer took to reach
//! its final rate (the auto-tuning target is "within 10% in the first 5 seconds"), which the
//! total bytes and seconds cannot show.

use std::time::Duration;

use serde::Serialize;

/// The resolution a transfer starts with.
pub const TIMELINE_INTERVAL: Duration = Duration::from_millis(250);

/// Intervals kept: past this the intervals are merged in pairs (twice as long, half as many),
/// so a transfer of any length costs at most this many numbers.
pub const MAX_INTERVALS: usize = 2400;

/// Payload bytes per interval since the data phase started (the sender counts what TCP says
/// reached the peer, acknowledged or selectively acknowledged; a receiver what its writers
/// had written).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Timeline {
    pub interval_ms: u32,
    /// Oldest first; the last, partial interval is not included.
    pub bytes: Vec<u64>,
    #[serde(skip)]
    counted: u64,
}

impl Timeline {
    pub fn new() -> Self {
        Self {
            interval_ms: TIMELINE_INTERVAL.as_millis() as u32,
            bytes: Vec::new(),
            counted: 0,
        }
    }

    fn interval(&self) -> Duration {
        Duration::from_millis(u64::from(self.interval_ms))
    }

    /// Whether an interval has ended by `elapsed` that is not recorded yet: callers sample
    /// their counter only then.
    pub fn due(&self, elapsed: Duration) -> bool {
        elapsed >= self.interval() * (self.bytes.len() as u32 + 1)
    }

    /// Records the running `total` at `elapsed`. Intervals that ended without a sample (a late
    /// tick) get nothing and the next one gets their bytes: the sum stays exact, and a
    /// scheduling hiccup shows as what it was.
    pub fn record(&mut self, elapsed: Duration, total: u64) {
        if !self.due(elapsed) {
            return;
        }
        // Two or more intervals ended since the last sample: all but the last get nothing.
        while self.due(elapsed.saturating_sub(self.interval())) {
            self.push(0);
        }
        self.push(total.saturating_sub(self.counted));
        self.counted = self.counted.max(total);
    }

    /// The rate the transfer held in its better intervals, in bytes per second: the upper
    /// quartile of its intervals. It says what the path carried once the transfer was going,
    /// which a short transfer's average (slow start and set-up included) understates; a
    /// quartile rather than the best, because a late sample moves one interval's bytes into
    /// the next (`record`) and makes one interval twice what was carried. `None` with fewer
    /// than four intervals.
    pub fn held_rate(&self) -> Option<u64> {
        if self.bytes.len() < 4 {
            return None;
        }
        let mut sorted = self.bytes.clone();
        sorted.sort_unstable();
        let upper = sorted[sorted.len() * 3 / 4];
        Some((upper as f64 * 1000.0 / f64::from(self.interval_ms.max(1))) as u64)
    }

    /// Appends one interval; a full timeline then merges in pairs (the count is even, so the
    /// merged intervals end exactly where the old ones did).
    fn push(&mut self, n: u64) {
        self.bytes.push(n);
        if self.bytes.len() >= MAX_INTERVALS {
            self.bytes = self.bytes.chunks(2).map(|c| c.iter().sum()).collect();
            self.interval_ms = self.interval_ms.saturating_mul(2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn records_deltas_per_interval() {
        let mut t = Timeline::new();
        assert!(!t.due(ms(100)));
        t.record(ms(100), 50); // not due: nothing recorded
        assert!(t.bytes.is_empty());
        t.record(ms(260), 100);
        t.record(ms(510), 300);
        assert_eq!(t.bytes, vec![100, 200]);
        // A late sample: the interval it skipped gets nothing, the sum stays exact.
        t.record(ms(1010), 700);
        assert_eq!(t.bytes, vec![100, 200, 0, 400]);
        assert_eq!(t.bytes.iter().sum::<u64>(), 700);
    }

    #[test]
    fn the_held_rate_is_the_upper_quartile() {
        let mut t = Timeline::new();
        assert_eq!(t.held_rate(), None);
        t.bytes = vec![10, 40, 100];
        assert_eq!(t.held_rate(), None, "three intervals say too little");
        // Slow start, then 100 per 250 ms, with a late sample's 0 and 200 in the middle:
        // neither the ramp nor the doubled interval is the answer.
        t.bytes = vec![10, 40, 100, 100, 0, 200, 100, 100];
        assert_eq!(t.held_rate(), Some(400));
        t.interval_ms = 1000;
        assert_eq!(t.held_rate(), Some(100));
    }

    #[test]
    fn long_transfers_merge_intervals_and_keep_the_sum() {
        let mut t = Timeline::new();
        let mut total = 0;
        let n = MAX_INTERVALS * 3;
        for i in 1..=n as u64 {
            total += i;
            t.record(ms(250 * i), total);
        }
        assert!(t.bytes.len() <= MAX_INTERVALS, "{}", t.bytes.len());
        assert_eq!(t.interval_ms, 1000);
        assert_eq!(t.bytes.iter().sum::<u64>(), total);
        // Still due at the merged resolution.
        assert!(!t.due(ms(250 * n as u64 + 100)));
        assert!(t.due(ms(250 * n as u64 + 1000)));
        // The first merged interval holds the first four of 250 ms.
        assert_eq!(t.bytes[0], 1 + 2 + 3 + 4);
    }
}
