//! An online tuner for one concurrency knob (network streams, reader threads, writer threads).
//!
//! Sans-I/O: it never reads a clock, opens a socket or spawns a thread. The caller passes the
//! time since the transfer started and the total payload bytes delivered so far, and applies
//! the [`Action`]s it returns. That keeps the policy deterministic, so it can be tested against
//! the simulated path in [`sim`] in milliseconds instead of against a WAN in hours, and the same
//! code drives streams and storage threads. The state machine is documented in
//! `docs/TUNING.md`.
//!
//! The search is a hill climb on measured throughput: the best setting is not predictable from
//! the path alone (window caps, CPU contention, storage and cross traffic all move it; see
//! docs/bench/NOTEBOOK.md), but throughput against concurrency is close to unimodal, so probing
//! neighbours and keeping only clear gains finds the top in a handful of steps.

pub mod sim;

use std::collections::VecDeque;
use std::time::Duration;

use ferry_units::stats::median_and_spread;

/// Which knob a tuner drives; only used to label its actions and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Knob {
    Streams,
    Readers,
    Writers,
}

/// What the caller should change now. A change is assumed to take effect at the `now` of the
/// call that returned it: the tuner starts its warmup from there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    SetStreams(u32),
    SetReaders(u32),
    SetWriters(u32),
}

impl Action {
    fn new(knob: Knob, n: u32) -> Self {
        match knob {
            Knob::Streams => Action::SetStreams(n),
            Knob::Readers => Action::SetReaders(n),
            Knob::Writers => Action::SetWriters(n),
        }
    }

    /// The new value of the knob, whichever it is.
    pub fn count(self) -> u32 {
        match self {
            Action::SetStreams(n) | Action::SetReaders(n) | Action::SetWriters(n) => n,
        }
    }
}

/// A configuration the tuner cannot run with.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum TuneError {
    #[error("min ({min}) must be at least 1 and at most max ({max})")]
    Bounds { min: u32, max: u32 },
    #[error("{what} ({value}) is outside min..=max ({min}..={max})")]
    OutOfBounds {
        what: &'static str,
        value: u32,
        min: u32,
        max: u32,
    },
    #[error("the measurement interval must be longer than zero")]
    ZeroInterval,
    #[error("samples per step must be at least 1")]
    NoSamples,
    #[error("{what} ({value}) must be a finite number in 0..1")]
    Fraction { what: &'static str, value: f64 },
}

/// How the tuner measures and decides. Every field is public so a profile can override it;
/// use [`TunerConfig::streams_for_rtt`] or [`TunerConfig::storage`] to start from values that
/// suit the knob.
#[derive(Clone, Debug, PartialEq)]
pub struct TunerConfig {
    pub knob: Knob,
    pub min: u32,
    pub max: u32,
    /// The fixed default ferry would use untuned. The tuner never settles on a setting it
    /// measured slower than this one, and the default needs no margin to win a comparison:
    /// "never make a transfer slower than the fixed default" (issue 6).
    pub default: u32,
    /// Where to begin: a profile or a previous transfer on the same route (HARP's lesson:
    /// online search costs seconds, a good prior saves them). Usually the default.
    pub start: u32,
    /// `start` is where an earlier search on this route settled: hold it from the first
    /// measurement (probing neighbours, and searching again on drift, as when settled)
    /// instead of searching again. A full search takes four measurements or more (about 9 s
    /// at 50 ms), most of a 1 GiB transfer, and measures the default and a doubling that the
    /// earlier search already rejected. The default guarantee then rests on that search.
    pub trusted_start: bool,
    /// `start` is held ([`TunerConfig::trusted_start`]) without ever having been compared with
    /// the default (a wide start, [`TunerConfig::wide_start`]): the first probe down while
    /// settled measures the default itself, so a long transfer still ends no slower than it.
    pub check_default: bool,
    /// Length of one rate sample. Long enough to hold several blocks per stream, so counting
    /// bytes per block does not quantise the rate.
    pub interval: Duration,
    /// Time ignored after every change, so slow start of new streams (or the drain of removed
    /// ones) is not mistaken for the steady rate of the new setting (iperf3 -O).
    pub warmup: Duration,
    /// Samples per measurement; the median is taken, so one outlier interval cannot decide.
    pub samples: u32,
    /// Smallest relative gain that justifies a move. Noise adds to it (see `TUNING.md`).
    pub gain_threshold: f64,
    /// Utility discount per unit above the default (Falcon: more streams must pay for
    /// themselves, which keeps the tuner from taking bandwidth from neighbours for a sliver).
    pub unit_cost: f64,
    /// Relative change of the settled rate that means the path changed: search again.
    pub drift_threshold: f64,
    /// Settled measurements between probes of a neighbour (FTS3's ±1 steps).
    pub probe_every: u32,
    /// After a failed probe the wait for that direction doubles, up to this many times
    /// `probe_every`: an optimum that keeps being confirmed is probed less and less.
    pub max_backoff: u32,
    /// Steps kept in [`TunerState::history`].
    pub history: usize,
    /// The fewest units a search or probe goes to while the host has CPU to spare
    /// ([`Tuner::set_room_down`]`(false)`); a start or `min` below it is kept.
    pub min_spare: u32,
    /// Settings move in multiples of this ([`TunerConfig::with_unit`]): streams spread over
    /// several network paths, so that every path carries as many. 1: any setting.
    pub unit: u32,
}

/// A transfer at a long round trip starts on one default's worth of streams per this much
/// round-trip time ([`TunerConfig::for_tiny_files`], [`TunerConfig::wide_start`]), from two
/// steps on: 8 at 50 ms, 16 at 100 ms with the default of 4. Below two steps the extra streams
/// cost more CPU than the round trips they save: measured at 0 ms as 2–7% of a 1.05-s tree of
/// tiny files, and 8 streams lost 3% to 4 at 25 ms in both regimes.
pub const WIDE_START_RTT_STEP: Duration = Duration::from_millis(25);

/// The most defaults' worth of streams a wide start takes: 16 streams at 100 ms was the
/// longest round trip and the most streams measured; beyond it the rule would be a guess.
pub const WIDE_START_MAX_FACTOR: u32 = 4;

impl TunerConfig {
    /// Network streams on a path with this round-trip time. Warmup covers slow start up to a
    /// 64 MiB window (about 12 RTTs from a 10-segment initial window), the interval a few
    /// RTTs but not less than half a second, so per-block byte counts average out.
    pub fn streams_for_rtt(rtt: Duration) -> Self {
        let warmup = (rtt * 16).clamp(Duration::from_millis(500), Duration::from_secs(10));
        let interval = (rtt * 5).clamp(Duration::from_millis(500), Duration::from_secs(2));
        Self {
            knob: Knob::Streams,
            min: 1,
            max: 64,
            default: 4,
            start: 4,
            trusted_start: false,
            check_default: false,
            interval,
            warmup,
            samples: 3,
            gain_threshold: 0.05,
            unit_cost: 0.01,
            drift_threshold: 0.2,
            probe_every: 4,
            max_backoff: 8,
            history: 64,
            min_spare: 2,
            unit: 1,
        }
    }

    /// Reader or writer threads. Storage has no slow start, but queues and the page cache
    /// need a moment to reach a steady state after a change; it also usually wants fewer
    /// threads than the network, so the bounds are tighter.
    pub fn storage(knob: Knob) -> Self {
        Self {
            knob,
            max: 16,
            interval: Duration::from_millis(500),
            warmup: Duration::from_millis(500),
            min_spare: 1,
            unit: 1,
            ..Self::streams_for_rtt(Duration::ZERO)
        }
    }

    /// The same configuration starting from `start` (e.g. a remembered value for the route).
    pub fn with_start(mut self, start: u32) -> Self {
        self.start = start;
        self
    }

    /// The same configuration moving in multiples of `unit`: the data connections are spread
    /// over `unit` network paths (connection i on path i mod `unit`), and a count that is not
    /// a multiple leaves some paths with fewer streams than others, which then carry less (3
    /// paths of 300 Mbit/s at 4 streams: 395, 339 and 349 MB of 1 GiB). Every setting is
    /// rounded up to a multiple, within `max`.
    pub fn with_unit(mut self, unit: u32) -> Self {
        if unit <= 1 || self.max < unit {
            return self;
        }
        let top = self.max / unit * unit;
        let up = |n: u32| n.div_ceil(unit).saturating_mul(unit).clamp(unit, top);
        self.min = up(self.min);
        self.default = up(self.default);
        self.start = up(self.start);
        self.min_spare = up(self.min_spare);
        self.unit = unit;
        self
    }

    /// The same configuration for a tree of tiny files on a path with this round-trip time:
    /// from two [`WIDE_START_RTT_STEP`]s (50 ms) on, it starts on the default times the round
    /// trip in steps, at most [`WIDE_START_MAX_FACTOR`] times (8 at 50 ms, 12 at 75, 16 at 100).
    ///
    /// Such a transfer is mostly slow start: 10,000 × 10 KiB at 100 ms take about 2 s, less
    /// than the first measurement (warmup plus samples, 3.1 s), so where it starts is where it
    /// stays. Every doubling of the streams doubles the window they open with and saves one
    /// round trip of the ramp; streams in proportion to the round trip keep the number of
    /// round trips the ramp takes the same at every RTT (the window to open grows with it).
    /// With tiny files the extra streams cost no straggler either: a stream that is starved or
    /// parked holds one small file, not a block, and the send buffer holds at most 1 MiB that
    /// has not gone out (`TCP_NOTSENT_LOWAT`, ferry-net's `tcp::NOTSENT_LOWAT`; without that
    /// limit 16 streams lost 19% to 8 at 50 ms, with it 3%). At short round trips the ramp is
    /// free and the extra streams only cost CPU. Measured on the bed: docs/bench/NOTEBOOK.md,
    /// "Auto-tuning against fixed settings". A longer tree is measured and tuned from there
    /// like any transfer, the default included.
    pub fn for_tiny_files(mut self, rtt: Duration) -> Self {
        if let Some(wide) = self.wide(rtt) {
            self.start = self.start.max(wide);
        }
        self
    }

    /// The same configuration for any other transfer on a path with this round-trip time: from
    /// two [`WIDE_START_RTT_STEP`]s (50 ms) on, it starts on the default times the round trip
    /// in steps, as a tree of tiny files does, and holds it as if an earlier search had
    /// settled there ([`TunerConfig::trusted_start`]), probing neighbours while settled; the
    /// first probe down measures the default ([`TunerConfig::check_default`]).
    ///
    /// Why wide, and why held. At long round trips more streams open the path sooner (and in
    /// the one traced run of each dipped less mid-transfer), but once the windows are open
    /// fewer streams often carry as much: at 100 ms under a 4 MiB `tcp_wmem`, iperf3's 4
    /// streams ran at 994 Mbit/s from their second second on, and the 16 reached full rate
    /// about 0.2 s sooner. A measurement only sees the steady state, so a search from the
    /// default kept 4 and never saw what the ramp is worth; and it first spent 3 s probing 8,
    /// which on that path overflow the queue (the tuner measured them at 860–913 Mbit/s
    /// against 935–985 for 4). Held from the start, a 1 GiB get at
    /// 100 ms ran at 882–885 Mbit/s against 804–820 for the search and 838–862 for a fixed 4
    /// (8 streams at 50 ms: 928–938 against 865–879). A search from a wide start would not
    /// keep it: the default, needing no margin, wins on utility whenever the steady rates are
    /// this close, and stepping the streams down mid-transfer cost the remaining ones 3–14%
    /// of their rate for the next measurement (BENCHMARKS.md, "A wide start at long RTT").
    ///
    /// Not applied where the start is a remembered search result other than the wide count
    /// itself: that search compared its setting with the default on this route.
    pub fn wide_start(mut self, rtt: Duration) -> Self {
        let Some(wide) = self.wide(rtt) else {
            return self;
        };
        let remembered = self.trusted_start && self.start != wide;
        if remembered || self.start > wide || wide <= self.default {
            return self;
        }
        self.start = wide;
        self.trusted_start = true;
        self.check_default = true;
        self
    }

    /// The start at this round trip: the default once per [`WIDE_START_RTT_STEP`], at most
    /// [`WIDE_START_MAX_FACTOR`] times and never above `max`; `None` below two steps.
    fn wide(&self, rtt: Duration) -> Option<u32> {
        let steps = rtt.as_nanos() / WIDE_START_RTT_STEP.as_nanos();
        let factor = u32::try_from(steps)
            .unwrap_or(u32::MAX)
            .min(WIDE_START_MAX_FACTOR);
        (factor >= 2).then(|| self.default.saturating_mul(factor).min(self.max))
    }

    /// The same configuration holding `start`, where an earlier search settled (see
    /// [`TunerConfig::trusted_start`]).
    pub fn with_settled_start(mut self, start: u32) -> Self {
        self.start = start;
        self.trusted_start = true;
        self
    }

    pub fn validate(&self) -> Result<(), TuneError> {
        if self.min == 0 || self.min > self.max {
            return Err(TuneError::Bounds {
                min: self.min,
                max: self.max,
            });
        }
        for (what, value) in [("default", self.default), ("start", self.start)] {
            if !(self.min..=self.max).contains(&value) {
                return Err(TuneError::OutOfBounds {
                    what,
                    value,
                    min: self.min,
                    max: self.max,
                });
            }
        }
        if self.interval.is_zero() {
            return Err(TuneError::ZeroInterval);
        }
        if self.samples == 0 {
            return Err(TuneError::NoSamples);
        }
        for (what, value) in [
            ("gain_threshold", self.gain_threshold),
            ("unit_cost", self.unit_cost),
            ("drift_threshold", self.drift_threshold),
        ] {
            if !(value.is_finite() && (0.0..1.0).contains(&value)) {
                return Err(TuneError::Fraction { what, value });
            }
        }
        Ok(())
    }
}

impl Default for TunerConfig {
    /// Streams on a 50 ms path: the middle of the RTTs ferry is built for.
    fn default() -> Self {
        Self::streams_for_rtt(Duration::from_millis(50))
    }
}

/// Where the state machine is (table in `TUNING.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Measuring the starting setting.
    Baseline,
    /// Measuring a larger setting during a search.
    Up,
    /// Measuring a smaller setting during a search.
    Down,
    /// Holding the best setting and watching its rate.
    Settled,
    /// Measuring a neighbour of the best setting while settled.
    Probe,
}

/// What became of one measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The first measurement, or the first after the path changed.
    Baseline,
    /// Better than the best: it is the best now.
    Kept,
    /// Not better by enough: back to (or on to) something else.
    Rejected,
    /// The settled rate moved by more than `drift_threshold`: searching again.
    Drift,
}

impl From<Verdict> for ferry_proto::TuneVerdict {
    fn from(v: Verdict) -> Self {
        match v {
            Verdict::Baseline => Self::Baseline,
            Verdict::Kept => Self::Kept,
            Verdict::Rejected => Self::Rejected,
            Verdict::Drift => Self::Drift,
        }
    }
}

/// One measured step, for logs and `--json`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Step {
    /// When the measurement completed.
    pub at: Duration,
    pub value: u32,
    /// Median rate over the measurement, bytes per second (the mean of two medians for a step
    /// measured twice because its gain was inside the noise).
    pub rate: f64,
    /// Half-range of its samples relative to the median, or the two measurements' pooled noise
    /// (see `pool`): the noise it was judged against.
    pub spread: f64,
    pub verdict: Verdict,
}

/// A snapshot of the tuner for logs and `--json`.
#[derive(Clone, Debug, PartialEq)]
pub struct TunerState {
    pub knob: Knob,
    pub phase: Phase,
    pub current: u32,
    pub best: u32,
    /// Latest rate estimate of `best`, bytes per second (0 before the first measurement).
    pub best_rate: f64,
    /// When the tuner first settled.
    pub first_settled: Option<Duration>,
    /// Changes asked of the caller so far.
    pub changes: u64,
    /// The latest measured steps, oldest first, at most `history` of them.
    pub history: Vec<Step>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    Up,
    Down,
}

/// Doubling and halving find the region of the optimum in log steps from any start (TCP's
/// slow start does the same); fine steps then refine and track it (FTS3's ±1). A fine step is
/// an eighth of the setting, at least 1: at 20 streams a ±1 step changes the rate by about
/// 5%, no more than the threshold, so single steps could never climb there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stride {
    Double,
    Fine,
}

#[derive(Clone, Copy, Debug)]
struct Search {
    dir: Dir,
    stride: Stride,
    /// A step was kept in this search: a rejection then ends it instead of turning around.
    moved: bool,
    /// The default was measured in this search (the guarantee needs it).
    seen_default: bool,
    /// The current probe is the closing check of the default.
    closing: bool,
    /// The nearest setting in `dir` measured not better: the optimum lies before it, so the
    /// search bisects towards it instead of stepping past it.
    limit: Option<u32>,
}

/// The tuner. Feed it [`Tuner::on_progress`] regularly (every 100 ms or so, or on every
/// progress event) and apply what it returns.
#[derive(Clone, Debug)]
pub struct Tuner {
    cfg: TunerConfig,
    phase: Phase,
    current: u32,
    best: u32,
    best_rate: f64,
    /// Relative half-range of the samples behind `best_rate`: the noise the next comparison
    /// must beat on top of the threshold.
    best_spread: f64,
    search: Search,
    /// Start of the current measurement (the last change); samples begin after the warmup.
    since: Duration,
    /// Start of the interval being sampled: time and bytes.
    open: Option<(Duration, u64)>,
    samples: Vec<f64>,
    /// Settled measurements so far, and when a probe in each direction is next due.
    settled_count: u64,
    due: [u64; 2],
    backoff: [u32; 2],
    last_probe: Dir,
    first_settled: Option<Duration>,
    changes: u64,
    history: VecDeque<Step>,
    /// What evidence beyond the rate says of the setting just measured (see
    /// [`Tuner::set_room_up`]); `None`: nothing, search both ways.
    room_up: Option<bool>,
    /// Whether fewer units could pay (see [`Tuner::set_room_down`]); `None`: nothing known.
    room_down: Option<bool>,
    /// The first measurement (rate, spread) of a setting that looked better by the threshold
    /// but not by the noise: it is being measured once more before the verdict.
    confirming: Option<(f64, f64)>,
    /// The held start was never compared with the default: the next probe down goes there
    /// ([`TunerConfig::check_default`]).
    default_due: bool,
}

impl Tuner {
    /// A tuner whose knob is at `cfg.start` since `start`.
    pub fn new(cfg: TunerConfig, start: Duration) -> Result<Self, TuneError> {
        cfg.validate()?;
        let n = cfg.start;
        Ok(Self {
            phase: Phase::Baseline,
            current: n,
            best: n,
            best_rate: 0.0,
            best_spread: 0.0,
            search: Search {
                dir: Dir::Up,
                stride: Stride::Double,
                moved: false,
                seen_default: false,
                closing: false,
                limit: None,
            },
            since: start,
            open: None,
            samples: Vec::with_capacity(cfg.samples as usize),
            settled_count: 0,
            due: [cfg.probe_every as u64; 2],
            backoff: [1; 2],
            last_probe: Dir::Down,
            first_settled: None,
            changes: 0,
            history: VecDeque::with_capacity(cfg.history.min(1024)),
            room_up: None,
            room_down: None,
            confirming: None,
            default_due: cfg.trusted_start && cfg.check_default && n != cfg.default,
            cfg,
        })
    }

    /// Reports progress: `delivered` is the total payload bytes delivered since the start
    /// (monotonic; what matters is the difference between calls). Returns a change to apply
    /// now, if any. Calls may come at any rate; a call earlier than the previous one, or with
    /// fewer bytes, restarts the current interval instead of producing a bogus sample.
    pub fn on_progress(&mut self, now: Duration, delivered: u64) -> Option<Action> {
        if now < self.since + self.cfg.warmup {
            return None;
        }
        let Some((t0, b0)) = self.open else {
            self.open = Some((now, delivered));
            return None;
        };
        if now < t0 || delivered < b0 {
            self.open = Some((now, delivered));
            return None;
        }
        let dt = now - t0;
        if dt < self.cfg.interval {
            return None;
        }
        self.open = Some((now, delivered));
        self.samples
            .push((delivered - b0) as f64 / dt.as_secs_f64());
        if self.samples.len() < self.cfg.samples as usize {
            return None;
        }
        let (rate, spread) = median_and_spread(&mut self.samples);
        self.samples.clear();
        self.measured(now, rate, spread)
            .map(|n| Action::new(self.cfg.knob, n))
    }

    /// Discards the interval in progress: the bytes since the last call say nothing about the
    /// knob (the sender ran out of work, a retry reconnected, the walk stalled). Samples
    /// already taken are kept.
    pub fn skip_interval(&mut self, now: Duration, delivered: u64) {
        if self.open.is_some() {
            self.open = Some((now, delivered));
        }
    }

    /// Tells the tuner what evidence other than the rate says of the setting it is measuring.
    ///
    /// `true`: the setting is below what the path carries, so a larger one could help and a
    /// smaller one could not. For streams, TCP reports them held back by their windows (send
    /// buffer or the peer's receive window), so each stream brings a window of its own and
    /// each one removed takes its window away; or they idle for want of data while cores are
    /// free. A step down then costs a measurement at a fraction of the rate (2 → 1 streams at
    /// 50 ms under a 4 MiB `tcp_wmem` halved a mixed tree's rate for 2.4 s).
    ///
    /// `false`: the setting fills the path. An added stream only queues behind the others,
    /// and where the path's buffers are deep it is starved so badly that the blocks it took
    /// finish seconds after the rest (BENCHMARKS.md, "Auto-tuning against fixed settings":
    /// probes of 8 streams under 100 MiB buffers cost up to a third of a 1 GiB transfer).
    ///
    /// Searches and settled probes then skip the direction that cannot pay: no higher than the
    /// best or the default, whichever is larger, without room; no lower than the smaller of
    /// the two with it. The default stays reachable either way (the guarantee needs it).
    ///
    /// `None` (the default): the evidence says neither, so both directions are searched — the
    /// plain hill climb, for callers with no evidence, and for streams held back by their
    /// windows only part of the time, whose windows are about what the path needs: there
    /// fewer streams, each held all the time, can carry as much with less queueing (default
    /// regime at 50 ms: 4 streams held 7–14% of the time ran near 900 Mbit/s, 2 near 960).
    pub fn set_room_up(&mut self, room: Option<bool>) {
        self.room_up = room;
    }

    /// Tells the tuner whether fewer units than the setting being measured could pay back in
    /// CPU.
    ///
    /// `false`: the host has work to spare (for streams: neither the sender's process nor the
    /// host is near its cores), so searches and probes go no lower than
    /// [`TunerConfig::min_spare`] (2 streams), or the best if that is lower already. One
    /// stream can only win back CPU, and everything that stalls a flow — a loss recovery,
    /// BBR's ProbeRTT, its windows regrowing — then stalls the transfer. Measured on the bed
    /// (tuned regime, 100 ms, mixed tree): a search that kept 2 streams (930 Mbit/s) and
    /// probed 1 ran at 309 Mbit/s for 3.5 s, and the run ended at 590 against 849 for a fixed
    /// 8. Steps down to 2 stay: in the default regime at 50 ms, 2 streams measured 944–965
    /// Mbit/s against 879–907 for 4 (BENCHMARKS.md, "Auto-tuning against fixed settings").
    ///
    /// `true` (the units are busy: CPU may be the limit) or never told: down to `min`.
    pub fn set_room_down(&mut self, room: bool) {
        self.room_down = Some(room);
    }

    /// True once a search has ended and the tuner holds (or is briefly probing around) its
    /// best setting.
    pub fn settled(&self) -> bool {
        matches!(self.phase, Phase::Settled | Phase::Probe)
    }

    /// The value the knob has now, as far as the tuner knows.
    pub fn current(&self) -> u32 {
        self.current
    }

    /// The best value measured so far.
    pub fn best(&self) -> u32 {
        self.best
    }

    pub fn config(&self) -> &TunerConfig {
        &self.cfg
    }

    pub fn state(&self) -> TunerState {
        TunerState {
            knob: self.cfg.knob,
            phase: self.phase,
            current: self.current,
            best: self.best,
            best_rate: self.best_rate,
            first_settled: self.first_settled,
            changes: self.changes,
            history: self.history.iter().copied().collect(),
        }
    }

    /// One measurement of `self.current` is complete. Returns the new value, if it changes.
    fn measured(&mut self, now: Duration, rate: f64, spread: f64) -> Option<u32> {
        let n = self.current;
        if n == self.cfg.default && self.phase != Phase::Settled {
            self.search.seen_default = true;
            self.default_due = false;
        }
        let (rate, spread) = match self.phase {
            Phase::Up | Phase::Down | Phase::Probe => match self.confirming.take() {
                Some(first) => pool(first, (rate, spread)),
                None if self.promising(n, rate, spread) => {
                    // Keep sampling the same setting: no change, so no warmup either.
                    self.confirming = Some((rate, spread));
                    return None;
                }
                None => (rate, spread),
            },
            Phase::Baseline | Phase::Settled => (rate, spread),
        };
        match self.phase {
            Phase::Baseline => {
                self.record(now, n, rate, spread, Verdict::Baseline);
                self.take_best(n, rate, spread);
                if self.cfg.trusted_start {
                    return self.settle(now);
                }
                self.begin_search(now)
            }
            Phase::Up | Phase::Down => {
                if self.better(n, rate, spread) {
                    self.record(now, n, rate, spread, Verdict::Kept);
                    self.take_best(n, rate, spread);
                    self.search.moved = true;
                    if self.search.closing {
                        self.search.closing = false;
                        self.search.limit = None;
                    }
                    self.step(now)
                } else {
                    self.record(now, n, rate, spread, Verdict::Rejected);
                    if self.search.closing {
                        return self.finish(now);
                    }
                    self.search.limit = Some(n);
                    self.step(now)
                }
            }
            Phase::Settled => {
                let ratio = if self.best_rate > 0.0 {
                    rate / self.best_rate
                } else if rate > 0.0 {
                    f64::INFINITY
                } else {
                    1.0
                };
                let drift = self.cfg.drift_threshold;
                if ratio > 1.0 + drift || ratio < 1.0 / (1.0 + drift) {
                    self.record(now, n, rate, spread, Verdict::Drift);
                    self.take_best(n, rate, spread);
                    return self.begin_search(now);
                }
                // Follow slow changes without letting one measurement move the reference far.
                self.best_rate = (self.best_rate + rate) / 2.0;
                self.best_spread = (self.best_spread + spread) / 2.0;
                self.settled_count += 1;
                self.maybe_probe(now)
            }
            Phase::Probe => {
                let dir = self.search.dir;
                if self.better(n, rate, spread) {
                    self.record(now, n, rate, spread, Verdict::Kept);
                    self.take_best(n, rate, spread);
                    self.backoff = [1; 2];
                    self.search = Search {
                        dir,
                        stride: Stride::Fine,
                        moved: true,
                        seen_default: true,
                        closing: false,
                        limit: None,
                    };
                    self.phase = phase_of(dir);
                    self.step(now)
                } else {
                    self.record(now, n, rate, spread, Verdict::Rejected);
                    let i = dir as usize;
                    self.backoff[i] = (self.backoff[i] * 2).min(self.cfg.max_backoff.max(1));
                    self.due[i] = self.settled_count + self.wait(dir);
                    self.settle(now)
                }
            }
        }
    }

    fn take_best(&mut self, n: u32, rate: f64, spread: f64) {
        self.best = n;
        self.best_rate = rate;
        self.best_spread = spread;
    }

    /// Starts a search from the best setting: up first, because on a long fat path too few
    /// streams is the common loss; down if up does not pay.
    fn begin_search(&mut self, now: Duration) -> Option<u32> {
        self.search = Search {
            dir: Dir::Up,
            stride: Stride::Double,
            moved: false,
            seen_default: self.best == self.cfg.default,
            closing: false,
            limit: None,
        };
        self.backoff = [1; 2];
        // A search measures the default on its own (`finish`).
        self.default_due = false;
        self.step(now)
    }

    /// Moves one step from the best in the search direction: doubling or halving until a
    /// setting is rejected, then bisecting between the best and it. When a direction is
    /// exhausted, turns down if going up never paid, else ends the search.
    fn step(&mut self, now: Duration) -> Option<u32> {
        if let Some(t) = self.target() {
            self.phase = phase_of(self.search.dir);
            return self.set(now, t);
        }
        if self.search.dir == Dir::Up && !self.search.moved {
            self.search.dir = Dir::Down;
            self.search.limit = None;
            if let Some(t) = self.target() {
                self.phase = Phase::Down;
                return self.set(now, t);
            }
        }
        self.finish(now)
    }

    fn target(&self) -> Option<u32> {
        let s = self.search;
        match s.limit {
            None => self.next(self.best, s.dir, s.stride),
            // Bisection stops once the bracket is within half the best: closer settings
            // would differ by little more than the threshold, and the settled probes refine.
            Some(r) if r.abs_diff(self.best) * 2 > self.best => {
                let mid = ((self.best as u64 + r as u64) / 2) as u32;
                (mid != self.best && mid != r).then_some(mid)
            }
            Some(_) => None,
        }
    }

    /// Ends a search. If the default was never measured in it, it is measured first, so the
    /// tuner never settles somewhere it has not compared with the default.
    fn finish(&mut self, now: Duration) -> Option<u32> {
        let d = self.cfg.default;
        if !self.search.seen_default && self.best != d {
            self.search.seen_default = true;
            self.search.closing = true;
            self.search.dir = if d > self.best { Dir::Up } else { Dir::Down };
            self.phase = phase_of(self.search.dir);
            return self.set(now, d);
        }
        self.settle(now)
    }

    /// Holds the best setting. After a search both directions get a fresh wait; after a
    /// probe only the probed direction's wait changed (the caller set it).
    fn settle(&mut self, now: Duration) -> Option<u32> {
        if self.phase != Phase::Probe {
            self.due = [
                self.settled_count + self.wait(Dir::Up),
                self.settled_count + self.wait(Dir::Down),
            ];
        }
        self.phase = Phase::Settled;
        self.first_settled.get_or_insert(now);
        if self.current != self.best {
            self.set(now, self.best)
        } else {
            None
        }
    }

    fn wait(&self, dir: Dir) -> u64 {
        self.cfg.probe_every as u64 * self.backoff[dir as usize] as u64
    }

    /// While settled, tries a neighbour when one is due, alternating directions so both
    /// sides of the optimum stay known.
    fn maybe_probe(&mut self, now: Duration) -> Option<u32> {
        if self.cfg.probe_every == 0 {
            return None;
        }
        let first = match self.last_probe {
            Dir::Up => Dir::Down,
            Dir::Down => Dir::Up,
        };
        for dir in [first, self.last_probe] {
            if self.settled_count < self.due[dir as usize] {
                continue;
            }
            let default = self.cfg.default;
            let target = if dir == Dir::Down && self.default_due && self.best > default {
                Some(default)
            } else {
                self.next(self.best, dir, Stride::Fine)
            };
            if let Some(t) = target {
                self.last_probe = dir;
                self.search.dir = dir;
                self.phase = Phase::Probe;
                return self.set(now, t);
            }
        }
        None
    }

    /// The neighbour of `n` in `dir`, or None at a bound. Doubling and halving stop at the
    /// default on their way past it, so the default is always among the measured settings.
    fn next(&self, n: u32, dir: Dir, stride: Stride) -> Option<u32> {
        let (min, max, d) = (self.cfg.min, self.cfg.max, self.cfg.default);
        let (mut lo, hi) = match self.room_up {
            None => (min, max),
            Some(true) => (n.min(d).max(min), max),
            Some(false) => (min, n.max(d).min(max)),
        };
        if self.room_down == Some(false) {
            lo = lo.max(n.min(self.cfg.min_spare));
        }
        let t = match (dir, stride) {
            (Dir::Up, Stride::Fine) => n.saturating_add((n / 8).max(1)).min(hi),
            (Dir::Down, Stride::Fine) => n.saturating_sub((n / 8).max(1)).max(lo),
            (Dir::Up, Stride::Double) => {
                let t = n.saturating_mul(2).min(hi);
                if n < d && d < t {
                    d
                } else {
                    t
                }
            }
            (Dir::Down, Stride::Double) => {
                let t = (n / 2).max(lo);
                if t < d && d < n {
                    d
                } else {
                    t
                }
            }
        };
        let t = self.in_units(t, dir, (lo, hi));
        (t != n).then_some(t)
    }

    /// `t` rounded to a multiple of the unit, away from where the move came from (up when
    /// going up, down when going down), within `lo..=hi` where a multiple fits.
    fn in_units(&self, t: u32, dir: Dir, (lo, hi): (u32, u32)) -> u32 {
        let u = self.cfg.unit.max(1);
        if u == 1 {
            return t;
        }
        let rounded = match dir {
            Dir::Up => t.div_ceil(u).saturating_mul(u),
            Dir::Down => t / u * u,
        };
        if (lo..=hi).contains(&rounded) {
            rounded
        } else {
            t
        }
    }

    /// Whether `rate` measured at `n` beats the best. Rates are compared as utilities that
    /// discount units above the default; a move needs the threshold or the measured noise of
    /// both measurements, whichever is larger ([`Tuner::clears`]); the default needs no
    /// margin at all.
    fn better(&self, n: u32, rate: f64, spread: f64) -> bool {
        if rate <= 0.0 {
            return false;
        }
        if n == self.cfg.default {
            return self.utility(n, rate) >= self.utility(self.best, self.best_rate);
        }
        // Independent noise adds in quadrature; the plain sum overstated it by up to √2 and
        // rejected real gains (2 streams at 960 Mbit/s against 4 at 879).
        let margin = self.cfg.gain_threshold.max(spread.hypot(self.best_spread));
        self.clears(n, rate, margin)
    }

    /// Whether `rate` at `n` beats the best by `margin`.
    ///
    /// More units than the best must clear the margin and their cost, each on its own: the
    /// margin is there for the noise, the cost so that a unit pays for itself, and a gain that
    /// is beyond the noise and pays for its units needs nothing more. Compounded, a doubling
    /// from the default needed 9.3% (5% times four units' 1%): on the bed at 50 ms a get
    /// measured 8 streams at 994 Mbit/s ± 0.5% against 4 at 912 ± 2.0% (+9.1%), kept 4, and
    /// ended at 829 against 927 for a fixed 8 (BENCHMARKS.md, "Get against the peers").
    ///
    /// Fewer units than the best compare utilities against the margin, so that their credit
    /// lowers it (TUNING.md, "Why fewer units earn").
    fn clears(&self, n: u32, rate: f64, margin: f64) -> bool {
        let new = self.utility(n, rate);
        let old = self.utility(self.best, self.best_rate);
        if n > self.best {
            new >= old && rate >= self.best_rate * (1.0 + margin)
        } else {
            new >= old * (1.0 + margin)
        }
    }

    /// Whether `rate` at `n` beats the best by the threshold but not by the noise: one more
    /// measurement of `n` ([`pool`]) decides. Rejecting it outright made the outcome a coin
    /// toss where the gain was real, and the route's profile then kept the loser for every
    /// later transfer (BENCHMARKS.md, "Auto-tuning against fixed settings": the default regime
    /// at 50 ms, 92% or 98% of the best fixed setting from one run to the next).
    fn promising(&self, n: u32, rate: f64, spread: f64) -> bool {
        rate > 0.0 && !self.better(n, rate, spread) && self.clears(n, rate, self.cfg.gain_threshold)
    }

    /// Every unit costs (Falcon), below the default as above it: charged only above, a count
    /// below the default had to be 5% faster to be kept, and where the default is the count
    /// whose windows just overflow the path's queue (4 streams at 50 ms under a 4 MiB
    /// `tcp_wmem`: lossy, 900–940 Mbit/s, where 2 carry 980 loss-free) one measurement of a
    /// 4.5% gain held the default for good. The credit below the default stops at the gain
    /// threshold, so a count below it is kept only when measured faster than the best.
    fn utility(&self, n: u32, rate: f64) -> f64 {
        let per_unit = 1.0 + self.cfg.unit_cost;
        let d = self.cfg.default;
        if n >= d {
            rate / per_unit.powi((n - d).min(i32::MAX as u32) as i32)
        } else {
            let credit = per_unit.powi((d - n).min(64) as i32);
            rate * credit.min(1.0 + self.cfg.gain_threshold)
        }
    }

    fn set(&mut self, now: Duration, n: u32) -> Option<u32> {
        self.confirming = None;
        self.since = now;
        self.open = None;
        self.samples.clear();
        if n == self.current {
            return None;
        }
        self.current = n;
        self.changes += 1;
        Some(n)
    }

    fn record(&mut self, at: Duration, value: u32, rate: f64, spread: f64, verdict: Verdict) {
        if self.cfg.history == 0 {
            return;
        }
        if self.history.len() == self.cfg.history {
            self.history.pop_front();
        }
        self.history.push_back(Step {
            at,
            value,
            rate,
            spread,
            verdict,
        });
    }
}

fn phase_of(dir: Dir) -> Phase {
    match dir {
        Dir::Up => Phase::Up,
        Dir::Down => Phase::Down,
    }
}

/// Two measurements of one setting as one: the mean of their rates, with the noise of a mean of
/// two independent measurements (√(s1² + s2²) / 2: √2 steadier than either when they are
/// alike, but a noisy first look is not averaged away by a quiet second one), or their
/// disagreement if that is larger.
fn pool((r1, s1): (f64, f64), (r2, s2): (f64, f64)) -> (f64, f64) {
    let rate = (r1 + r2) / 2.0;
    let apart = if rate > 0.0 {
        (r1 - r2).abs() / (2.0 * rate)
    } else {
        0.0
    };
    (rate, (s1.hypot(s2) / 2.0).max(apart))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_second_look_does_not_average_away_a_noisy_first() {
        // 1120 ± 15%, then 1000 ± 1%: together 1060, and at least ±7.5%.
        let (rate, spread) = pool((1120.0, 0.15), (1000.0, 0.01));
        assert_eq!(rate, 1060.0);
        assert!(
            (spread - 0.15f64.hypot(0.01) / 2.0).abs() < 1e-12,
            "{spread}"
        );
        // Alike: √2 steadier than either.
        let (_, spread) = pool((1000.0, 0.04), (1000.0, 0.04));
        assert!((spread - 0.04 / std::f64::consts::SQRT_2).abs() < 1e-12);
        // Quiet but far apart: their disagreement is the noise.
        let (_, spread) = pool((1100.0, 0.0), (900.0, 0.0));
        assert!((spread - 0.1).abs() < 1e-12);
        // A zero rate is no division by zero.
        assert_eq!(pool((0.0, 0.0), (0.0, 0.0)), (0.0, 0.0));
    }

    #[test]
    fn over_three_paths_every_setting_is_a_multiple_of_three() {
        let cfg = TunerConfig::streams_for_rtt(Duration::from_millis(20)).with_unit(3);
        assert_eq!(
            (cfg.min, cfg.default, cfg.start, cfg.min_spare, cfg.max),
            (3, 6, 6, 3, 64)
        );
        let t = Tuner::new(cfg, Duration::ZERO).unwrap();
        assert_eq!(t.next(6, Dir::Up, Stride::Double), Some(12));
        assert_eq!(t.next(6, Dir::Up, Stride::Fine), Some(9));
        assert_eq!(t.next(12, Dir::Down, Stride::Double), Some(6));
        assert_eq!(t.next(6, Dir::Down, Stride::Fine), Some(3));
        assert_eq!(
            t.next(3, Dir::Down, Stride::Fine),
            None,
            "the least is one per path"
        );
        assert_eq!(
            t.next(63, Dir::Up, Stride::Fine),
            Some(64),
            "max itself when no multiple fits"
        );
        // One path: unchanged.
        let one = TunerConfig::streams_for_rtt(Duration::from_millis(20)).with_unit(1);
        assert_eq!(one, TunerConfig::streams_for_rtt(Duration::from_millis(20)));
    }

    #[test]
    fn fewer_streams_are_credited_up_to_the_threshold() {
        let cfg = TunerConfig::streams_for_rtt(Duration::from_millis(50));
        let mut t = Tuner::new(cfg, Duration::ZERO).unwrap();
        // One stream fewer than the default is worth 1%, two 2.01%; the credit stops at the
        // gain threshold however far below the default.
        assert_eq!(t.utility(4, 1000.0), 1000.0);
        assert!((t.utility(3, 1000.0) - 1010.0).abs() < 1e-9);
        assert!((t.utility(2, 1000.0) - 1020.1).abs() < 1e-9);
        assert!((t.utility(8, 1000.0) - 1000.0 / 1.01f64.powi(4)).abs() < 1e-9);
        t.cfg.default = 64;
        assert!((t.utility(1, 1000.0) - 1050.0).abs() < 1e-9);
    }

    /// A tuner at 50 ms searching down, at 2 streams, against a best (the default) measured
    /// at `best_rate` ± `best_spread`; one sample per measurement, no warmup.
    fn down_at_two(best_rate: f64, best_spread: f64) -> Tuner {
        let cfg = TunerConfig {
            warmup: Duration::ZERO,
            interval: Duration::from_secs(1),
            samples: 1,
            ..TunerConfig::streams_for_rtt(Duration::from_millis(50))
        };
        let mut t = Tuner::new(cfg, Duration::ZERO).unwrap();
        t.set_room_up(Some(false));
        t.set_room_down(false);
        t.best_rate = best_rate;
        t.best_spread = best_spread;
        t.phase = Phase::Down;
        t.search.dir = Dir::Down;
        t.current = 2;
        t.search.seen_default = true;
        t
    }

    #[test]
    fn two_streams_beat_a_lossy_default_by_less_than_the_threshold() {
        // The bed at 50 ms, default regime (BENCHMARKS.md, the issue-3 targets): the default
        // of 4 measured 942 ± 3.7%, 2 streams 984 ± 2.9%: 4.5% faster, which was rejected.
        // Credited 2% for two streams fewer, it clears the margin (√(3.7² + 2.9²) = 4.7%).
        let mut t = down_at_two(942.0, 0.037);
        assert!(t.better(2, 984.0, 0.029));
        // Still no move on a gain the credit alone would make: 2 streams 1% slower.
        assert!(!t.better(2, 932.0, 0.0));
        // Held at 2, the default takes over when it measures at least 2's utility.
        t.best = 2;
        t.best_rate = 984.0;
        assert!(!t.better(4, 984.0, 0.0));
        assert!(t.better(4, 1004.0, 0.0));
    }

    #[test]
    fn more_streams_clear_the_margin_and_their_cost_each_on_its_own() {
        // The bed at 50 ms, default regime, a get (BENCHMARKS.md, "Get against the peers"):
        // the default of 4 at 912 ± 2.0%, 8 streams at 994 ± 0.5% (+9.0%). Compounded, the
        // margin (5%) and four streams' cost (4.06%) asked for 9.3%.
        let cfg = TunerConfig::streams_for_rtt(Duration::from_millis(50));
        let mut t = Tuner::new(cfg, Duration::ZERO).unwrap();
        t.best_rate = 912.0;
        t.best_spread = 0.02;
        assert!(t.better(8, 994.0, 0.005));
        // Inside the threshold: rejected. Beyond it but inside the noise (√(5² + 2²) = 5.4%):
        // measured once more.
        assert!(!t.better(8, 950.0, 0.005));
        assert!(!t.promising(8, 950.0, 0.005));
        assert!(!t.better(8, 960.0, 0.05));
        assert!(t.promising(8, 960.0, 0.05));
        // Beyond the noise is not enough where the units cost more than the margin: from 8,
        // 16 streams pay 8.3% (eight more at 1%).
        t.best = 8;
        t.best_rate = 1000.0;
        t.best_spread = 0.0;
        assert!(!t.better(16, 1080.0, 0.0));
        assert!(t.better(16, 1083.0, 0.0));
        // Fewer streams than the best are judged as before, their credit against the margin.
        t.best = 4;
        t.best_rate = 942.0;
        t.best_spread = 0.037;
        assert!(t.better(2, 984.0, 0.029));
    }

    #[test]
    fn a_lucky_first_look_is_rejected_by_the_second() {
        // The reviewer's case: best 1000 ± 1%; 2 streams at 1120 ± 15% (inside the noise),
        // then 980 ± 1%. Pooled 1050 ± 7.5%, credited 2% for two streams fewer (1071), is
        // not better beyond that noise (1076).
        let mut t = down_at_two(1000.0, 0.01);
        assert!(t.promising(2, 1120.0, 0.15));
        assert_eq!(t.measured(Duration::from_secs(1), 1120.0, 0.15), None);
        assert_eq!(t.measured(Duration::from_secs(2), 980.0, 0.01), Some(4));
        let last = t.history.back().unwrap();
        assert_eq!(
            (last.value, last.verdict, last.rate),
            (2, Verdict::Rejected, 1050.0)
        );
    }
}
