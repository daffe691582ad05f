//! A simulated path for testing and benchmarking the tuner without a network.
//!
//! The model is deliberately small: it has exactly the effects that move the best stream count
//! in docs/bench/NOTEBOOK.md, and nothing else. Throughput with `n` streams is the least of
//!
//! - the bottleneck link, `link`;
//! - the window cap, `n × window / rtt` (one stream cannot have more than its send buffer in
//!   flight: 4 MiB at 100 ms is 335 Mbit/s);
//! - the hosts, `core_rate × min(n, cores) × (1 − contention)^(n − cores)`: workers beyond the
//!   core count cost context switches and cache misses (16 streams were slower than 8 on the
//!   2-core bench VM);
//!
//! each stream added ramps up from a 10-segment window, doubling every RTT (slow start), and
//! optional noise multiplies the rate by a factor in `1 ± amplitude` that changes every
//! `period`. Changes of the path at given times model cross traffic, a smaller window or a
//! busy host. Deterministic: the noise comes from a seeded splitmix64.

use std::time::Duration;

use super::{Action, Tuner};

/// One stream's initial window: 10 segments of 1448 bytes (RFC 6928).
const INITIAL_WINDOW: f64 = 10.0 * 1448.0;

/// Integration step: fine enough for slow start at 1 ms RTT to look smooth in a 100 ms tick.
const MAX_STEP: Duration = Duration::from_millis(5);

/// A path and the hosts at its ends. Rates in bytes per second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Path {
    pub link: f64,
    pub rtt: Duration,
    /// Bytes one stream can have in flight; infinite for no cap.
    pub window: f64,
    /// What one worker (core) can process per second: hashing, copying, syscalls.
    pub core_rate: f64,
    pub cores: u32,
    /// Fraction of throughput lost per worker beyond `cores`.
    pub contention: f64,
}

/// Bits per second to bytes per second.
pub fn gbit(g: f64) -> f64 {
    g * 1e9 / 8.0
}

/// Bytes per second to Mbit/s, for messages.
pub fn mbit(bytes_per_s: f64) -> f64 {
    bytes_per_s * 8.0 / 1e6
}

impl Path {
    /// A WAN path with ample CPU on both ends (8 cores at 10 Gbit/s each, 2% per extra worker).
    pub fn wan(link: f64, rtt: Duration, window: f64) -> Self {
        Self {
            link,
            rtt,
            window,
            core_rate: gbit(10.0),
            cores: 8,
            contention: 0.02,
        }
    }

    /// A storage device that reaches `device` bytes/s with `saturate_at` threads (each thread
    /// keeps one request in flight) and loses `contention` per thread beyond that (seeks,
    /// lock contention). Modelled as a path with a tiny RTT and a per-thread cap.
    pub fn storage(device: f64, saturate_at: u32, contention: f64) -> Self {
        let rtt = Duration::from_millis(1);
        Self {
            link: device,
            rtt,
            window: device / saturate_at as f64 * rtt.as_secs_f64(),
            core_rate: device / saturate_at as f64,
            cores: saturate_at,
            contention,
        }
    }

    /// The steady rate with `n` streams once slow start is over.
    pub fn steady(&self, n: u32) -> f64 {
        if n == 0 {
            return 0.0;
        }
        let net = (n as f64 * self.per_stream()).min(self.link);
        net.min(self.hosts(n))
    }

    /// The best steady rate over `1..=max` streams, and the smallest count that reaches it.
    pub fn best(&self, max: u32) -> (u32, f64) {
        let mut best = (1, self.steady(1));
        for n in 2..=max {
            let r = self.steady(n);
            if r > best.1 {
                best = (n, r);
            }
        }
        best
    }

    /// Whether TCP would say more than `n` streams could help, and fewer could not, once slow
    /// start is over ([`Tuner::set_room_up`]): they are held back by their windows (send-buffer-
    /// or receive-window-limited time), or each is held back by the core working for it while
    /// cores are left (the streams idle for want of data, the host is not busy).
    pub fn room_up(&self, n: u32) -> bool {
        let net = n as f64 * self.per_stream();
        let windows = net < self.link.min(self.hosts(n));
        let cores = self.hosts(n) < self.link.min(net) && n < self.cores;
        n == 0 || windows || cores
    }

    /// Whether fewer than `n` streams could pay ([`Tuner::set_room_down`]): the hosts, not
    /// the link or the windows, set the rate, so each stream given up frees a worker. In this
    /// model nothing else makes fewer streams faster.
    pub fn room_down(&self, n: u32) -> bool {
        let net = n as f64 * self.per_stream();
        self.hosts(n) <= self.link.min(net)
    }

    fn per_stream(&self) -> f64 {
        if self.rtt.is_zero() {
            f64::INFINITY
        } else {
            self.window / self.rtt.as_secs_f64()
        }
    }

    fn hosts(&self, n: u32) -> f64 {
        let busy = n.min(self.cores) as f64;
        let extra = n.saturating_sub(self.cores);
        self.core_rate * busy * (1.0 - self.contention).powi(extra.min(10_000) as i32)
    }

    /// What a stream `age` old can carry: slow start doubles from the initial window each RTT.
    fn ramp(&self, age: Duration) -> f64 {
        let per = self.per_stream();
        if self.rtt.is_zero() {
            return per;
        }
        let rtts = age.as_secs_f64() / self.rtt.as_secs_f64();
        if rtts > 40.0 {
            return per;
        }
        (INITIAL_WINDOW / self.rtt.as_secs_f64() * rtts.exp2()).min(per)
    }
}

/// A path being driven in simulated time.
#[derive(Clone, Debug)]
pub struct Sim {
    path: Path,
    changes: Vec<(Duration, Path)>,
    /// Birth time of each stream, oldest first.
    streams: Vec<Duration>,
    now: Duration,
    delivered: f64,
    noise: f64,
    period: Duration,
    rng: u64,
    factor: f64,
    next_draw: Duration,
}

impl Sim {
    /// A path with `n` streams opened at time zero.
    pub fn new(path: Path, n: u32) -> Self {
        Self {
            path,
            changes: Vec::new(),
            streams: vec![Duration::ZERO; n as usize],
            now: Duration::ZERO,
            delivered: 0.0,
            noise: 0.0,
            period: Duration::from_secs(1),
            rng: 0,
            factor: 1.0,
            next_draw: Duration::ZERO,
        }
    }

    /// Multiplies the rate by a factor in `1 ± amplitude`, drawn anew every `period`.
    pub fn with_noise(mut self, amplitude: f64, period: Duration, seed: u64) -> Self {
        self.noise = amplitude;
        self.period = period.max(Duration::from_millis(1));
        self.rng = seed;
        self
    }

    /// From `at` on, the path is `path`.
    pub fn with_change(mut self, at: Duration, path: Path) -> Self {
        self.changes.push((at, path));
        self.changes.sort_by_key(|c| c.0);
        self
    }

    /// The path as it is now.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn streams(&self) -> u32 {
        self.streams.len() as u32
    }

    pub fn now(&self) -> Duration {
        self.now
    }

    /// Opens or closes streams now. New streams start in slow start; the youngest are closed
    /// first (they carry the least).
    pub fn set_streams(&mut self, n: u32) {
        self.streams.resize(n as usize, self.now);
    }

    /// Runs the path until `to` and returns the total bytes delivered since time zero.
    pub fn advance(&mut self, to: Duration) -> u64 {
        while self.now < to {
            let mut end = (self.now + MAX_STEP).min(to);
            if let Some(&(at, _)) = self.changes.first() {
                if at > self.now {
                    end = end.min(at);
                }
            }
            let dt = end - self.now;
            self.delivered += self.rate() * dt.as_secs_f64();
            self.now = end;
            while let Some(&(at, p)) = self.changes.first() {
                if at > self.now {
                    break;
                }
                self.path = p;
                self.changes.remove(0);
            }
        }
        self.delivered()
    }

    pub fn delivered(&self) -> u64 {
        self.delivered as u64
    }

    /// [`Path::room_up`] for the streams open now, at their steady rate (a young stream in
    /// slow start is limited by its congestion window, which TCP counts as neither; the model
    /// ignores that difference).
    pub fn room_up(&self) -> bool {
        self.path.room_up(self.streams())
    }

    /// [`Path::room_down`] for the streams open now.
    pub fn room_down(&self) -> bool {
        self.path.room_down(self.streams())
    }

    /// The rate at this instant, noise included.
    pub fn rate(&mut self) -> f64 {
        if self.noise > 0.0 && self.now >= self.next_draw {
            let u = (splitmix64(&mut self.rng) >> 11) as f64 / (1u64 << 53) as f64;
            self.factor = 1.0 + self.noise * (2.0 * u - 1.0);
            self.next_draw = self.now + self.period;
        }
        let n = self.streams.len() as u32;
        let window: f64 = self
            .streams
            .iter()
            .map(|&born| self.path.ramp(self.now - born))
            .sum();
        window.min(self.path.link).min(self.path.hosts(n)) * self.factor
    }
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce5_e9b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One tick of a simulated run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub at: Duration,
    pub streams: u32,
    pub delivered: u64,
}

/// What happened in a simulated run.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    pub points: Vec<Point>,
    /// Every change the tuner asked for: when, and the new value.
    pub actions: Vec<(Duration, u32)>,
}

impl Trace {
    /// Mean rate between two times, in bytes per second, from the ticks nearest to them.
    pub fn rate(&self, from: Duration, to: Duration) -> f64 {
        let at = |t: Duration| {
            let i = self.points.partition_point(|p| p.at < t);
            self.points[i.min(self.points.len() - 1)]
        };
        let (a, b) = (at(from), at(to));
        if b.at <= a.at {
            return 0.0;
        }
        (b.delivered - a.delivered) as f64 / (b.at - a.at).as_secs_f64()
    }

    /// Changes asked for at or after `t`.
    pub fn actions_after(&self, t: Duration) -> usize {
        self.actions.iter().filter(|a| a.0 >= t).count()
    }
}

/// Drives `tuner` against `sim` every `tick` until `until`, applying every action at once and
/// telling it whether more streams could help, the way an engine does on its progress
/// timer.
pub fn run(tuner: &mut Tuner, sim: &mut Sim, tick: Duration, until: Duration) -> Trace {
    let mut trace = Trace::default();
    let mut now = sim.now();
    trace.points.push(Point {
        at: now,
        streams: sim.streams(),
        delivered: sim.delivered(),
    });
    while now < until {
        now = (now + tick).min(until);
        let delivered = sim.advance(now);
        tuner.set_room_up(Some(sim.room_up()));
        tuner.set_room_down(sim.room_down());
        if let Some(a) = tuner.on_progress(now, delivered) {
            let n = Action::count(a);
            sim.set_streams(n);
            trace.actions.push((now, n));
        }
        trace.points.push(Point {
            at: now,
            streams: sim.streams(),
            delivered,
        });
    }
    trace
}
