//! The stream tuner: how many of the open data connections carry data. The policy is
//! [`crate::tune`] (docs/TUNING.md); this feeds it what the connections did.
//!
//! All data connections are opened at the start; the sender lets the first `active` of them
//! take frames and parks the others. Every 100 ms the tuner gets the bytes delivered over all
//! data connections, and nothing when the frame queue ran dry: a starved sender says nothing
//! about the stream count.

use std::collections::VecDeque;
use std::time::Duration;

use ferry_proto::{Load, TuneReport, TuneStep, MAX_TUNE_STEPS};

use crate::sample::{delivered, ConnSample, HostSample, TickVote, SAMPLES_PER_TICK, SAMPLE_EVERY};
use crate::tune::{Tuner, TunerConfig};

/// The stream count ferry used before auto-tuning, and the one the tuner is never slower than
/// on bulk data (BENCHMARKS.md: enough for 1 Gbit/s at 100 ms under a 4 MiB `tcp_wmem`).
pub const DEFAULT_STREAMS: u16 = 4;

/// Data connections an auto-tuned transfer opens (the server may allow fewer). Every one is a
/// TCP + TLS handshake, made in parallel at the start; 16 reach 10 Gbit/s at 50 ms with 4 MiB
/// windows, and beyond that the 2-core hosts we measured on lose more to contention than they gain.
pub const AUTO_MAX_STREAMS: u16 = 16;

// A sending server takes an auto-tuned get's connections beyond this count as ramp helpers.
const _: () = assert!(AUTO_MAX_STREAMS == ferry_proto::RAMP_HELPERS_FROM);

/// The most ramp helpers a transfer opens: with the 16 streams of a wide start, 56 connections,
/// what an idle server's clamp grants an auto-tuned session at its default cap of 512 (an
/// eighth of its free connection slots). A server that grants fewer refuses the rest, and the
/// blocks they carried go again on granted connections.
pub const MAX_RAMP_HELPERS: u16 = 40;

/// Round trips below which a transfer opens no ramp helpers: slow start is over in a few tens of
/// milliseconds there, and each helper is one more TCP and TLS handshake.
const RAMP_MIN_RTT: Duration = Duration::from_millis(20);

/// Ramp helpers for a transfer over a path remembered with this round-trip time and rate.
///
/// Why: a connection opens at the kernel's initial window of 10 segments and doubles per round
/// trip, so 16 streams need about four round trips to fill a 1 Gbit/s path at 100 ms, and that
/// ramp cost 0.2 s of line rate in a 9.2 s put of 1 GiB (docs/DESIGN.md). More connections fill
/// it sooner, but held to the end they lose it again: BBR paces each of many connections at a
/// small share, and their last blocks straggle (BENCHMARKS.md, "A wider start"). Helpers are
/// connections that carry only their first flights' worth, two blocks, and then park: the
/// ramp is shorter and the end is that of 16. Their bytes (about 1 MiB each at most) stay
/// within what the path carries in four round trips, the length of the ramp they fill, so a
/// slow or short path gets few or none. The round trip and rate are what an earlier transfer
/// to the same server measured and held (the client's `profiles.json`), so the first transfer
/// to a server opens none.
pub fn ramp_helpers(rtt: Duration, bytes_per_s: u64) -> u16 {
    if rtt < RAMP_MIN_RTT {
        return 0;
    }
    let four_round_trips = bytes_per_s as f64 * rtt.as_secs_f64() * 4.0;
    let n = (four_round_trips / f64::from(1u32 << 20)).floor();
    n.clamp(0.0, f64::from(MAX_RAMP_HELPERS)) as u16
}

/// The walk has found enough to tell a tree of small files from bulk data once it has this many
/// files (or it ended, or this much time passed).
const SHAPE_FILES: u64 = 64;
const SHAPE_WAIT: Duration = Duration::from_secs(1);

/// A tree of small files: below one block on average, each file is one frame that one stream
/// carries alone, and more streams mostly add flows that are each too thin to fill a window.
pub(crate) fn small_files(files: u64, bytes: u64, block_size: u32) -> bool {
    files > 0 && bytes / files < u64::from(block_size)
}

/// Files this small on average (a few initial TCP windows each) make a transfer that is
/// mostly slow start and a stream that holds one costs no straggler: such trees start on more
/// streams at long RTTs (`TunerConfig::for_tiny_files`). The mixed tree of the bench (1 KiB to
/// 8 MiB, 0.9 MiB on average, blocks of 8 MiB among them) is not one of them.
const TINY_FILE: u64 = 256 << 10;

pub(crate) fn tiny_files(files: u64, bytes: u64) -> bool {
    files > 0 && bytes / files <= TINY_FILE
}

/// How the sending side runs its streams.
#[derive(Clone, Copy, Debug, Default)]
pub struct StreamPlan {
    /// 0: fixed, every stream carries data. n: auto-tuned, starting with n.
    pub auto_start: u16,
    pub block_size: u32,
    /// Test hook: hold this many streams from the start and never tune.
    pub force: Option<u32>,
    /// Tune the reader threads (the sender's side of the storage).
    pub tune_storage: bool,
    /// `auto_start` is where an earlier search on this route settled: hold it rather than
    /// search again (bulk data only; see `TunerConfig::trusted_start`).
    pub settled_start: bool,
    /// Test hook: this data connection never writes its first block, as if its window had
    /// closed for good (what the endgame is for).
    pub stall: Option<usize>,
    /// The sending process ends with the session (a client's put): once its last block is
    /// queued it gives its idle memory back while the last bytes cross (`buf::drain`).
    pub drain_at_end: bool,
    /// The receiver takes `Tuned` before `Complete` (`Capabilities::EARLY_TUNED`): it goes
    /// out as soon as every block is on a connection, and again after `Complete`.
    pub early_tuned: bool,
    /// Ramp helpers: the last `helpers` data connections carry two blocks each at the start
    /// and then park for the session, outside the tuner's count ([`ramp_helpers`]): a put's
    /// client decides, a get's server takes them from the client (`RAMP_HELPERS`).
    pub helpers: u16,
    /// Network paths the data connections are spread over (connection i on path i mod
    /// `paths`): the tuner moves in multiples of it (`TunerConfig::with_unit`). 1: one path.
    pub paths: u16,
}

impl StreamPlan {
    pub fn from_opts(opts: &ferry_proto::TransferOpts) -> Self {
        Self {
            auto_start: opts.auto_start,
            block_size: opts.block_size,
            force: None,
            tune_storage: false,
            settled_start: false,
            stall: None,
            drain_at_end: false,
            early_tuned: false,
            helpers: 0,
            paths: 1,
        }
    }

    /// Frames queued for the data connections: two per stream that starts carrying data
    /// (at least two per default stream), so memory follows what is used, not what is open.
    pub fn queue_len(&self, streams: u16) -> usize {
        let streams = usize::from(streams.max(1));
        if self.auto_start == 0 {
            return streams * 2;
        }
        let start = usize::from(self.auto_start.max(DEFAULT_STREAMS));
        start.min(streams) * 2
    }
}

/// Share of the active streams' busy time held back by a window (send buffer or the peer's
/// receive window) from which more streams would each bring a window of their own, and fewer
/// would each take one away. At 100 ms under a 4 MiB `tcp_wmem`, 4 streams spend about 60% of
/// it there and 8 streams under 2%.
const ROOM_WINDOW_SHARE: f64 = 0.25;

/// Below [`ROOM_WINDOW_SHARE`] and from this share on, the streams are held only part of the
/// time: their windows are about what the path needs, and either way may pay. At 50 ms under
/// a 4 MiB `tcp_wmem`, 4 streams were held 7–14% of the time and ran near 900 Mbit/s, 8 near
/// 990 and 2 (held all the time, their two windows about the path's) near 960.
const ROOM_WINDOW_PART: f64 = 0.05;

/// Share of wall time the active streams may spend with nothing to send before the sender,
/// not the path, counts as their limit (TLS and framing on one core per stream).
const ROOM_IDLE_SHARE: f64 = 0.10;

/// The sender counts as having spare CPU below this share of its cores; and, for fewer
/// streams to pay, the host or the process counts as busy from it on.
const ROOM_CPU_SHARE: f64 = 0.75;

/// What the active streams did over some ticks, from their `TCP_INFO` counters.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct RoomSums {
    /// Wall time summed over the streams that were active, microseconds.
    wall_us: u64,
    /// Of it, time with data queued or in flight (`tcpi_busy_time`).
    busy_us: u64,
    /// Of that, time held back by the send buffer or the peer's receive window.
    window_us: u64,
    /// The process's CPU time, and the wall time over all cores, over the same ticks.
    cpu_us: u64,
    cores_us: u64,
    /// The whole host's busy and total CPU time over the same ticks (clock ticks), which
    /// counts a server on the same host and other jobs; zero where unknown.
    host_busy: u64,
    host_total: u64,
}

impl RoomSums {
    fn add(&mut self, o: &RoomSums) {
        self.wall_us += o.wall_us;
        self.busy_us += o.busy_us;
        self.window_us += o.window_us;
        self.cpu_us += o.cpu_us;
        self.cores_us += o.cores_us;
        self.host_busy += o.host_busy;
        self.host_total += o.host_total;
    }

    fn cpu_share(&self) -> f64 {
        if self.cores_us > 0 {
            self.cpu_us as f64 / self.cores_us as f64
        } else {
            0.0
        }
    }

    /// Whether fewer streams could pay ([`Tuner::set_room_down`]): the process or the host
    /// is busy, so each stream given up frees CPU (the host share counts a server on the
    /// same host; the process share a cgroup quota that the host's counters do not show).
    /// Otherwise the tuner goes no lower than `TunerConfig::min_spare`. `None` before any tick.
    fn room_down(&self) -> Option<bool> {
        if self.cores_us == 0 {
            return None;
        }
        let host = if self.host_total > 0 {
            self.host_busy as f64 / self.host_total as f64
        } else {
            0.0
        };
        Some(self.cpu_share().max(host) >= ROOM_CPU_SHARE)
    }

    /// Whether more streams could help ([`Tuner::set_room_up`]): the streams are held back by
    /// their windows, or they idle for want of data while the host has cores to spare (the
    /// work per stream, not the path, is the limit). Neither: they fill the path, and more
    /// would only queue. `None` when held back part of the time (either way may pay), and
    /// while nothing is known (no busy time counted: an old kernel, or nothing measured yet).
    fn room_up(&self) -> Option<bool> {
        if self.busy_us == 0 || self.wall_us == 0 {
            return None;
        }
        let window = self.window_us as f64 / self.busy_us as f64;
        let idle = 1.0 - (self.busy_us as f64 / self.wall_us as f64).min(1.0);
        let cpu = self.cpu_share();
        if window >= ROOM_WINDOW_SHARE || (idle >= ROOM_IDLE_SHARE && cpu < ROOM_CPU_SHARE) {
            Some(true)
        } else if window >= ROOM_WINDOW_PART {
            None
        } else {
            Some(false)
        }
    }
}

/// Keeps the last ticks' [`RoomSums`] of the streams that were active in them, so the tuner
/// decides on the same stretch of time it measured the rate over.
struct RoomMeter {
    /// Cumulative busy and window-limited time of every data socket at the previous tick.
    prev: Vec<(u64, u64)>,
    ticks: VecDeque<RoomSums>,
    len: usize,
    /// The previous tick's time and host sample.
    at: Duration,
    last: HostSample,
    /// Some socket reported busy time: the kernel has the counters.
    counted: bool,
}

impl RoomMeter {
    fn new(sockets: usize, len: usize, now: Duration, host: HostSample) -> Self {
        Self {
            prev: vec![(0, 0); sockets],
            ticks: VecDeque::with_capacity(len),
            len: len.max(1),
            at: now,
            last: host,
            counted: false,
        }
    }

    /// One tick: `conns[i]` is socket i's sample (if readable); the first `active` carry data.
    fn tick(
        &mut self,
        now: Duration,
        conns: &[Option<ConnSample>],
        active: usize,
        host: HostSample,
    ) {
        let wall_us = now.saturating_sub(self.at).as_micros() as u64;
        let (host_busy, host_total) = match (self.last.host, host.host) {
            (Some((b0, t0)), Some((b1, t1))) if t1 >= t0 && b1 >= b0 => (b1 - b0, t1 - t0),
            _ => (0, 0),
        };
        let mut sums = RoomSums {
            cpu_us: host.cpu.saturating_sub(self.last.cpu).as_micros() as u64,
            cores_us: wall_us * u64::from(host.cores),
            host_busy,
            host_total,
            ..RoomSums::default()
        };
        for (i, (conn, prev)) in conns.iter().zip(self.prev.iter_mut()).enumerate() {
            let Some(conn) = conn else { continue };
            if i < active {
                sums.wall_us += wall_us;
                sums.busy_us += conn.busy_us.saturating_sub(prev.0);
                sums.window_us += conn.window_us.saturating_sub(prev.1);
            }
            self.counted |= conn.busy_us > 0;
            *prev = (conn.busy_us, conn.window_us);
        }
        (self.at, self.last) = (now, host);
        if self.ticks.len() == self.len {
            self.ticks.pop_front();
        }
        self.ticks.push_back(sums);
    }

    fn room_up(&self) -> Option<bool> {
        if !self.counted {
            return None;
        }
        self.total().room_up()
    }

    fn room_down(&self) -> Option<bool> {
        self.total().room_down()
    }

    fn total(&self) -> RoomSums {
        let mut total = RoomSums::default();
        for t in &self.ticks {
            total.add(t);
        }
        total
    }
}

/// The sending side's stream tuner: the active count and how it got there.
pub struct StreamTuner {
    plan: StreamPlan,
    max: u32,
    rtt: Duration,
    active: u32,
    /// Data connections open (ramp helpers included).
    conns: usize,
    tuner: Option<Tuner>,
    /// Whether the tuner may still start (auto and not forced).
    tuning: bool,
    start: u32,
    small: bool,
    empty: TickVote,
    /// Started with the tuner, over one of its measurements.
    room: Option<RoomMeter>,
}

impl StreamTuner {
    /// A tuner over `conns` open data connections; `rtt` is the control connection's,
    /// measured after the handshake.
    pub fn new(plan: StreamPlan, conns: usize, rtt: Duration) -> Self {
        // Ramp helpers are not the tuner's to use.
        let max = conns.saturating_sub(usize::from(plan.helpers)).max(1) as u32;
        let auto = plan.auto_start > 0;
        let start = match plan.force {
            Some(n) => n.clamp(1, max),
            None if auto => u32::from(plan.auto_start).clamp(1, max),
            None => max,
        };
        Self {
            plan,
            max,
            rtt,
            active: start,
            conns,
            tuner: None,
            tuning: auto && plan.force.is_none(),
            start,
            small: false,
            empty: TickVote::default(),
            room: None,
        }
    }

    /// Connections that carry data now.
    pub fn active(&self) -> u32 {
        self.active
    }

    /// The server granted `n` connections, possibly fewer than were opened: the rest never
    /// carry data (the server refuses them).
    pub fn limit(&mut self, n: u32) {
        self.max = n.clamp(1, self.max);
        self.start = self.start.min(self.max);
        if self.active > self.max {
            self.set(self.max);
        }
    }

    fn set(&mut self, n: u32) {
        self.active = n.clamp(1, self.max);
    }

    /// Called every [`SAMPLE_EVERY`] with the time since the session started: whether the frame
    /// queue is empty now, what the walk has found so far (files, bytes), whether it has
    /// ended, each connection's sample by index, and the host's (asked for only when the
    /// tuner needs it, once per tick). The caller applies [`Self::active`] after it.
    pub fn on_sample(
        &mut self,
        now: Duration,
        queue_empty: bool,
        found: (u64, u64),
        walk_done: bool,
        conns: &[Option<ConnSample>],
        host: impl FnOnce() -> HostSample,
    ) {
        let vote = self.empty.push(queue_empty);
        if !self.tuning {
            return;
        }
        if self.tuner.is_none() {
            // Every sample, not every tick: a tree of tiny files at a long RTT changes its
            // start, and each round trip sooner counts in a transfer that short.
            self.begin(now, found, walk_done, host());
            return;
        }
        let Some(starved) = vote else {
            return;
        };
        let active = self.active as usize;
        let (Some(tuner), Some(room)) = (self.tuner.as_mut(), self.room.as_mut()) else {
            return;
        };
        let delivered = delivered(conns);
        room.tick(now, conns, active, host());
        // `None` (nothing counted, or held by the windows only part of the time) lets the
        // tuner search both ways; in either case the last measurement's evidence is stale.
        tuner.set_room_up(room.room_up());
        if let Some(down) = room.room_down() {
            tuner.set_room_down(down);
        }
        if starved {
            tuner.skip_interval(now, delivered);
        } else if let Some(action) = tuner.on_progress(now, delivered) {
            self.set(action.count());
        }
    }

    /// Starts the tuner once the walk has shown what it is sending. From 50 ms of round trip
    /// on, a transfer starts on the default once per 25 ms of it, at most four times: trees of
    /// tiny files search from there (`TunerConfig::for_tiny_files`), everything else holds it
    /// unless the route's profile remembers another search result (`TunerConfig::wide_start`).
    /// Trees of small files are flagged, so their short runs do not overwrite a route's
    /// profile (docs/bench/NOTEBOOK.md has why tiny trees no longer start on one stream).
    fn begin(
        &mut self,
        now: Duration,
        (files, bytes): (u64, u64),
        walk_done: bool,
        host: HostSample,
    ) {
        let shape_known = files >= SHAPE_FILES || (files > 0 && (walk_done || now >= SHAPE_WAIT));
        if !shape_known && now < 2 * SHAPE_WAIT {
            return;
        }
        self.small = small_files(files, bytes, self.plan.block_size);
        let (default, start) = (u32::from(DEFAULT_STREAMS).min(self.max), self.start);
        let mut cfg = TunerConfig {
            max: self.max,
            default,
            // What small files want says little about bulk data, and the other way round.
            trusted_start: self.plan.settled_start && !self.small,
            ..TunerConfig::streams_for_rtt(self.rtt)
        }
        .with_start(start);
        cfg = if tiny_files(files, bytes) {
            cfg.for_tiny_files(self.rtt)
        } else {
            cfg.wide_start(self.rtt)
        };
        cfg = cfg.with_unit(u32::from(self.plan.paths));
        let start = cfg.start;
        // The room signal covers the span of one measurement, as the rate does.
        let ticks = (cfg.interval * cfg.samples).as_millis()
            / (SAMPLE_EVERY * SAMPLES_PER_TICK).as_millis();
        match Tuner::new(cfg, now) {
            Ok(t) => {
                self.tuner = Some(t);
                self.room = Some(RoomMeter::new(self.conns, ticks as usize, now, host));
                self.start = start;
                self.set(start);
            }
            Err(_) => self.tuning = false,
        }
    }

    /// What the tuner did, with the sender's load.
    pub fn report(&self, sender: Load) -> TuneReport {
        let mut flags = 0;
        if self.plan.auto_start > 0 || self.plan.force.is_some() {
            flags |= TuneReport::AUTO;
        }
        if self.small {
            flags |= TuneReport::SMALL_FILES;
        }
        let (streams, steps) = match &self.tuner {
            Some(t) => {
                if t.settled() {
                    flags |= TuneReport::SETTLED;
                }
                let state = t.state();
                // The setting it holds (a probe in progress returns to it), once measured.
                let held = if state.best_rate > 0.0 {
                    state.best
                } else {
                    self.active
                };
                let skip = state.history.len().saturating_sub(MAX_TUNE_STEPS);
                let steps = state.history[skip..]
                    .iter()
                    .map(|s| TuneStep {
                        at_ms: u32::try_from(s.at.as_millis()).unwrap_or(u32::MAX),
                        streams: u16::try_from(s.value).unwrap_or(u16::MAX),
                        rate: s.rate.max(0.0) as u64,
                        noise_permille: (s.spread * 1000.0).round().clamp(0.0, 65535.0) as u16,
                        verdict: s.verdict.into(),
                    })
                    .collect();
                (held, steps)
            }
            None => (self.active, Vec::new()),
        };
        TuneReport {
            streams: u16::try_from(streams).unwrap_or(u16::MAX),
            start: u16::try_from(self.start).unwrap_or(u16::MAX),
            flags,
            sender,
            steps,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ramp_helpers_fill_four_round_trips_of_the_path() {
        let ms = Duration::from_millis;
        let gbit = 125_000_000; // 1 Gbit/s in bytes per second
                                // The bed's 1 Gbit/s at 100 ms: 50 MB in four round trips, more than the cap.
        assert_eq!(ramp_helpers(ms(100), gbit), MAX_RAMP_HELPERS);
        // At 50 ms, 25 MB: 23 helpers of 1 MiB.
        assert_eq!(ramp_helpers(ms(50), gbit), 23);
        // A slow path gets few, a short one none, an unknown rate none.
        assert_eq!(ramp_helpers(ms(100), gbit / 10), 4);
        assert_eq!(ramp_helpers(ms(19), gbit), 0);
        assert_eq!(ramp_helpers(ms(100), 0), 0);
        // No overflow at absurd rates or round trips.
        assert_eq!(
            ramp_helpers(Duration::from_secs(3600), u64::MAX),
            MAX_RAMP_HELPERS
        );
    }

    fn sums(wall: u64, busy: u64, window: u64, cpu: u64) -> RoomSums {
        RoomSums {
            wall_us: wall,
            busy_us: busy,
            window_us: window,
            cpu_us: cpu,
            cores_us: 1000,
            ..RoomSums::default()
        }
    }

    #[test]
    fn room_down_needs_a_busy_process_or_host() {
        // The tuned regime at 100 ms on the bed: sender at 10% of its cores, host at 45%.
        let quiet = RoomSums {
            host_busy: 45,
            host_total: 100,
            ..sums(1000, 1000, 0, 100)
        };
        assert_eq!(quiet.room_down(), Some(false));
        // A server on the same host keeps the cores busy: fewer streams free CPU.
        assert_eq!(
            RoomSums {
                host_busy: 90,
                ..quiet
            }
            .room_down(),
            Some(true)
        );
        // A cgroup quota: the process is at its cores' limit though the host is not.
        assert_eq!(sums(1000, 1000, 0, 800).room_down(), Some(true));
        // No host counters: the process alone decides; no ticks: nothing known.
        assert_eq!(sums(1000, 1000, 0, 100).room_down(), Some(false));
        assert_eq!(RoomSums::default().room_down(), None);
    }

    #[test]
    fn room_up_follows_what_tcp_says_limits_the_streams() {
        // Default regime at 100 ms: 4 streams send-buffer-limited 60% of their busy time.
        assert_eq!(sums(1000, 1000, 600, 100).room_up(), Some(true));
        // Tuned regime: always busy, never window-limited: the path is full.
        assert_eq!(sums(1000, 1000, 0, 100).room_up(), Some(false));
        assert_eq!(sums(1000, 995, 40, 100).room_up(), Some(false));
        // Default regime at 50 ms: 4 streams held 7–14% of the time. Their windows are about
        // what the path needs: fewer streams may carry as much, more may too.
        assert_eq!(sums(1000, 1000, 70, 100).room_up(), None);
        assert_eq!(sums(1000, 1000, 140, 100).room_up(), None);
        assert_eq!(sums(1000, 1000, 250, 100).room_up(), Some(true));
        // Idle for want of data with cores to spare: the work per stream is the limit.
        assert_eq!(sums(1000, 700, 0, 300).room_up(), Some(true));
        // Idle, but the host is busy: more streams would only contend for it.
        assert_eq!(sums(1000, 700, 0, 900).room_up(), Some(false));
        // Nothing counted (an old kernel, or no ticks yet): no evidence either way.
        assert_eq!(sums(1000, 0, 0, 100).room_up(), None);
        assert_eq!(RoomSums::default().room_up(), None);
    }

    #[test]
    fn room_meter_counts_only_active_streams_over_its_ticks() {
        let info = |busy: u64, window: u64| {
            Some(ConnSample {
                busy_us: busy,
                window_us: window,
                ..ConnSample::default()
            })
        };
        let ms = Duration::from_millis;
        let host = |h: Option<(u64, u64)>| HostSample {
            host: h,
            ..HostSample::default()
        };
        let mut m = RoomMeter::new(2, 2, ms(0), host(None));
        assert_eq!(m.room_up(), None);
        // Socket 1 is parked: its window-limited time must not count.
        m.tick(ms(100), &[info(1, 0), info(10, 10)], 1, host(None));
        assert!(m.counted);
        let t = *m.ticks.back().unwrap();
        assert_eq!((t.busy_us, t.window_us), (1, 0));
        // Deltas, not totals, once socket 1 is active too.
        m.tick(ms(200), &[info(2, 0), info(20, 15)], 2, host(None));
        let t = *m.ticks.back().unwrap();
        assert_eq!((t.busy_us, t.window_us), (11, 5));
        // Bounded: the oldest tick goes.
        m.tick(ms(300), &[info(3, 0), None], 2, host(None));
        assert_eq!(m.ticks.len(), 2);
        // Host CPU as deltas between ticks; a counter going backwards counts as unknown.
        m.tick(ms(400), &[info(3, 0), None], 2, host(Some((100, 1000))));
        m.tick(ms(500), &[info(3, 0), None], 2, host(Some((190, 1100))));
        let t = *m.ticks.back().unwrap();
        assert_eq!((t.host_busy, t.host_total), (90, 100));
        m.tick(ms(600), &[info(3, 0), None], 2, host(Some((10, 20))));
        let t = *m.ticks.back().unwrap();
        assert_eq!((t.host_busy, t.host_total), (0, 0));
        assert_eq!(m.room_down(), Some(true));
    }

    #[test]
    fn tiny_files_are_a_few_initial_windows_on_average() {
        assert!(tiny_files(10_000, 10_000 * 10_240));
        assert!(tiny_files(4, 4 * TINY_FILE));
        assert!(!tiny_files(1_000, 1_000 * 930_000));
        assert!(!tiny_files(0, 0));
    }

    #[test]
    fn small_files_are_below_a_block_on_average() {
        assert!(small_files(10_000, 10_000 * 10_240, 8 << 20));
        assert!(!small_files(1, 1 << 30, 8 << 20));
        // One large file among many small ones lifts the average above a block.
        assert!(!small_files(100, (1 << 30) + 99 * 10_240, 8 << 20));
        assert!(
            !small_files(0, 0, 8 << 20),
            "nothing found yet is not small"
        );
    }

    #[test]
    fn queue_follows_the_streams_that_start() {
        let fixed = StreamPlan {
            auto_start: 0,
            block_size: 1 << 20,
            force: None,
            tune_storage: false,
            settled_start: false,
            stall: None,
            drain_at_end: false,
            early_tuned: false,
            helpers: 0,
            paths: 1,
        };
        assert_eq!(fixed.queue_len(8), 16);
        let auto = StreamPlan {
            auto_start: 2,
            ..fixed
        };
        assert_eq!(auto.queue_len(16), 8);
        assert_eq!(auto.queue_len(2), 4);
        let big = StreamPlan {
            auto_start: 12,
            ..fixed
        };
        assert_eq!(big.queue_len(16), 24);
    }
}
