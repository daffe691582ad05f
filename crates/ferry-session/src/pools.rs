//! The storage tuner: how many reader threads (on the sender) or writer threads (on the
//! receiver) work. Tuned on its own, apart from the streams: it acts only in intervals where
//! its pool is what holds the transfer back — the sender's frame queue ran dry (reading is
//! slower than sending), or the receiver's writer queue was full (storing is slower than
//! receiving) — and holds still otherwise, so the network's variations never move it.

use std::time::Duration;

use ferry_proto::TuneVerdict;

use crate::sample::TickVote;
use crate::tune::{Knob, Tuner, TunerConfig};

/// Storage threads a pool starts with when nothing better is known (ferry's fixed default
/// before they were tuned), and the most an auto-tuned pool may use.
pub const DEFAULT_STORAGE_THREADS: u32 = 4;
pub const AUTO_MAX_STORAGE_THREADS: u32 = 16;

/// The most threads a pool that starts with `start` may use: with `tune`, room to grow to
/// [`AUTO_MAX_STORAGE_THREADS`].
pub fn pool_max(start: u32, tune: bool) -> u32 {
    let start = start.max(1);
    if tune {
        start.max(AUTO_MAX_STORAGE_THREADS)
    } else {
        start
    }
}

/// One end's reader or writer pool tuner (`Knob::Readers` on the sender, `Knob::Writers` on
/// the receiver).
pub struct PoolTuner {
    tuner: Option<Tuner>,
    start: u32,
    threads: u32,
    hot: TickVote,
}

impl PoolTuner {
    /// A pool working `start` threads of at most `max`; `tune`: run the tuner (else the count
    /// stays as set).
    pub fn new(knob: Knob, start: u32, max: u32, tune: bool) -> Self {
        let tuner = tune
            .then(|| {
                let cfg = TunerConfig {
                    max,
                    default: DEFAULT_STORAGE_THREADS.min(max),
                    ..TunerConfig::storage(knob)
                }
                .with_start(start);
                Tuner::new(cfg, Duration::ZERO).ok()
            })
            .flatten();
        Self {
            tuner,
            start,
            threads: start,
            hot: TickVote::default(),
        }
    }

    /// Called every sample with the time since the session started: whether the pool is the
    /// bottleneck now (`hot`), and the bytes it has moved so far. Returns the new thread
    /// count when it changes.
    pub fn on_sample(&mut self, now: Duration, hot: bool, done: u64) -> Option<u32> {
        let holding_back = self.hot.push(hot)?;
        let tuner = self.tuner.as_mut()?;
        if !holding_back {
            tuner.skip_interval(now, done);
            return None;
        }
        let n = tuner.on_progress(now, done)?.count();
        self.threads = n;
        Some(n)
    }

    /// Whether more threads could help, as far as anything besides the rate shows
    /// ([`Tuner::set_room_up`]); `None`: no opinion.
    pub fn set_room_up(&mut self, room: Option<bool>) {
        if let Some(t) = self.tuner.as_mut() {
            t.set_room_up(room);
        }
    }

    /// Threads working now: the setting the tuner holds once it has measured one.
    pub fn threads(&self) -> u32 {
        let measured = self
            .tuner
            .as_ref()
            .map(Tuner::state)
            .filter(|s| s.best_rate > 0.0);
        measured.map_or(self.threads, |s| s.best)
    }

    pub fn report(&self) -> ThreadReport {
        let steps = self
            .tuner
            .as_ref()
            .map(|t| {
                t.state()
                    .history
                    .iter()
                    .map(|s| ThreadStep {
                        at_s: s.at.as_secs_f64(),
                        threads: s.value,
                        mib_per_s: s.rate / f64::from(1u32 << 20),
                        verdict: TuneVerdict::from(s.verdict).name(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        ThreadReport {
            threads: self.threads(),
            start: self.start,
            tuned: self.tuner.is_some(),
            steps,
        }
    }
}

/// What one end's storage-thread tuner did (reported by the end that ran it).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ThreadReport {
    /// Threads working at the end.
    pub threads: u32,
    pub start: u32,
    /// Whether a tuner ran (else the count was fixed).
    pub tuned: bool,
    /// The tuner's measurements (intervals where the pool held the transfer back), oldest first.
    pub steps: Vec<ThreadStep>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct ThreadStep {
    pub at_s: f64,
    pub threads: u32,
    pub mib_per_s: f64,
    /// `baseline`, `kept`, `rejected` or `drift`.
    pub verdict: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SAMPLE_EVERY;

    /// A pool of `start` threads at most `pool_max(start, tune)`, as a driver makes one.
    fn pool(knob: Knob, start: u32, tune: bool) -> PoolTuner {
        PoolTuner::new(knob, start, pool_max(start, tune), tune)
    }

    /// Drives a pool for `secs` of simulated time against a disk whose rate for `n` threads is
    /// `rate(n)`; `hot`: whether the pool holds the transfer back. Returns the threads working
    /// at the end, as the driver's gate would hold them.
    fn run(ctl: &mut PoolTuner, secs: u32, hot: bool, rate: impl Fn(u32) -> f64) -> u32 {
        let (mut done, mut active) = (0u64, ctl.threads());
        for i in 1..=secs * 40 {
            done += (rate(active) * SAMPLE_EVERY.as_secs_f64()) as u64;
            if let Some(n) = ctl.on_sample(SAMPLE_EVERY * i, hot, done) {
                active = n;
            }
        }
        active
    }

    /// A disk that is fastest with 2 threads (seeks cost beyond).
    fn two_best(n: u32) -> f64 {
        let n = f64::from(n);
        if n <= 2.0 {
            100e6 * n
        } else {
            200e6 * (1.0 - 0.08 * (n - 2.0))
        }
    }

    #[test]
    fn writers_settle_where_the_disk_is_fastest_when_they_hold_the_transfer_back() {
        let mut ctl = pool(Knob::Writers, 4, true);
        run(&mut ctl, 30, true, two_best);
        let r = ctl.report();
        assert!(r.tuned && r.start == 4);
        assert_eq!(r.threads, 2, "{:?}", r.steps);
        assert!(r.steps.iter().any(|s| s.verdict == "kept"), "{:?}", r.steps);
        // Never probed beyond what the pool may use.
        assert!(r
            .steps
            .iter()
            .all(|s| s.threads <= AUTO_MAX_STORAGE_THREADS));
    }

    /// A disk that rewards threads up to 16 draws the writers up from the default; told that
    /// more cannot help (one file open, the receiver's driver), they stay at or below it.
    #[test]
    fn writers_stay_at_the_default_when_told_more_cannot_help() {
        let go = |room: Option<bool>| {
            let mut ctl = pool(Knob::Writers, 4, true);
            ctl.set_room_up(room);
            run(&mut ctl, 30, true, |n| 50e6 * f64::from(n));
            ctl.report()
        };
        let free = go(None);
        assert!(free.threads > 4, "{:?}", free.steps);
        let capped = go(Some(false));
        assert!(
            capped.steps.iter().all(|s| s.threads <= 4),
            "{:?}",
            capped.steps
        );
        assert_eq!(capped.threads, 4, "{:?}", capped.steps);
    }

    #[test]
    fn pools_hold_still_while_the_network_is_the_bottleneck_or_when_fixed() {
        let mut ctl = pool(Knob::Readers, 4, true);
        assert_eq!(run(&mut ctl, 30, false, two_best), 4);
        assert!(ctl.report().steps.is_empty());
        assert_eq!(pool_max(3, false), 3);
        let mut ctl = pool(Knob::Readers, 3, false);
        let active = run(&mut ctl, 30, true, two_best);
        let r = ctl.report();
        assert_eq!((active, r.threads, r.tuned), (3, 3, false));
    }
}
