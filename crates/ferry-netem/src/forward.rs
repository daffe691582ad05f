//! The forwarder: one thread that holds both TUN file descriptors and
//! moves raw IP packets between them through a per-direction delay line.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::sched::{Admit, Link, LinkParams, Rng};

/// Upper bound on poll sleeps, so that a stop request is seen promptly.
const MAX_SLEEP_NS: u64 = 20_000_000;
/// Packets read from one TUN per wake-up before looking at the other one.
const READ_BATCH: usize = 128;
/// Memory cap on packet buffers held by both directions together.
const MAX_HELD_BUFFER_BYTES: usize = 1 << 30;
/// Timed sleeps wake up ~40-80 us late on a VM, and much later after a long
/// idle period. A sleep longer than 2 * PRE_WAKE_NS therefore ends
/// PRE_WAKE_NS early, and a second, short sleep (which wakes up promptly)
/// ends SPIN_NS early; the rest is spent polling with a zero timeout.
const PRE_WAKE_NS: u64 = 250_000;
const SPIN_NS: u64 = 50_000;
/// Spinning is limited to this share of wall time (token bucket), so that
/// a busy link (releases every few tens of us) falls back to plain sleeps
/// instead of burning a core; sparse traffic gets precise releases.
const SPIN_SHARE_PERCENT: u64 = 5;
const SPIN_BUDGET_CAP_NS: u64 = 2_000_000;

/// Monotonic clock in nanoseconds (CLOCK_MONOTONIC, vDSO).
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Settings that may change while the forwarder runs.
#[derive(Debug)]
pub struct Control {
    loss_bits: AtomicU64,
    blackhole: AtomicBool,
    one_way_ns: AtomicU64,
    rate_bps: AtomicU64,
    queue_bytes: AtomicU64,
    stop: AtomicBool,
}

impl Control {
    pub fn new(loss: f64, one_way_ns: u64, rate_bps: u64, queue_bytes: u64) -> Self {
        Control {
            loss_bits: AtomicU64::new(loss.clamp(0.0, 1.0).to_bits()),
            blackhole: AtomicBool::new(false),
            one_way_ns: AtomicU64::new(one_way_ns),
            rate_bps: AtomicU64::new(rate_bps),
            queue_bytes: AtomicU64::new(queue_bytes),
            stop: AtomicBool::new(false),
        }
    }
    pub fn loss(&self) -> f64 {
        f64::from_bits(self.loss_bits.load(Relaxed))
    }
    pub fn set_loss(&self, loss: f64) {
        self.loss_bits
            .store(loss.clamp(0.0, 1.0).to_bits(), Relaxed);
    }
    pub fn blackhole(&self) -> bool {
        self.blackhole.load(Relaxed)
    }
    pub fn set_blackhole(&self, on: bool) {
        self.blackhole.store(on, Relaxed);
    }
    pub fn one_way_ns(&self) -> u64 {
        self.one_way_ns.load(Relaxed)
    }
    pub fn set_one_way_ns(&self, ns: u64) {
        self.one_way_ns.store(ns, Relaxed);
    }
    pub fn rate_bps(&self) -> u64 {
        self.rate_bps.load(Relaxed)
    }
    pub fn set_rate_bps(&self, bps: u64) {
        self.rate_bps.store(bps, Relaxed);
    }
    pub fn queue_bytes(&self) -> u64 {
        self.queue_bytes.load(Relaxed)
    }
    pub fn set_queue_bytes(&self, b: u64) {
        self.queue_bytes.store(b, Relaxed);
    }
    pub fn request_stop(&self) {
        self.stop.store(true, Relaxed);
    }
    fn params(&self) -> LinkParams {
        LinkParams {
            rate_bps: self.rate_bps(),
            one_way_ns: self.one_way_ns(),
            queue_bytes: self.queue_bytes(),
        }
    }
}

/// Release-lateness histogram bucket upper bounds, in microseconds.
pub const LATE_BUCKETS_US: [u64; 7] = [10, 50, 100, 250, 500, 1000, u64::MAX];

/// Counters of one direction, written by the forwarder thread only.
#[derive(Debug, Default)]
pub struct DirCounters {
    rx_packets: AtomicU64,
    rx_bytes: AtomicU64,
    tx_packets: AtomicU64,
    tx_bytes: AtomicU64,
    drop_loss: AtomicU64,
    drop_queue: AtomicU64,
    drop_memory: AtomicU64,
    write_errors: AtomicU64,
    max_backlog_bytes: AtomicU64,
    max_held_bytes: AtomicU64,
    late_sum_ns: AtomicU64,
    late_max_ns: AtomicU64,
    late_hist: [AtomicU64; 7],
}

fn bump(a: &AtomicU64, by: u64) {
    // Single writer: a plain load/store pair is enough and cheaper than RMW.
    a.store(a.load(Relaxed).wrapping_add(by), Relaxed);
}
fn raise(a: &AtomicU64, v: u64) {
    if v > a.load(Relaxed) {
        a.store(v, Relaxed);
    }
}

/// A snapshot of one direction's counters.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct DirStats {
    /// Packets/bytes read from the sending side's TUN.
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Packets/bytes delivered to the receiving side's TUN.
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// Dropped by random loss (or the blackhole).
    pub drop_loss: u64,
    /// Dropped by the drop-tail queue limit.
    pub drop_queue: u64,
    /// Dropped because the forwarder's packet memory cap was reached.
    pub drop_memory: u64,
    /// Writes into the receiving TUN that failed.
    pub write_errors: u64,
    /// Largest queue backlog seen (bytes waiting for serialisation).
    pub max_backlog_bytes: u64,
    /// Largest number of bytes held (queue + delay line).
    pub max_held_bytes: u64,
    /// Mean and max lateness of releases versus their scheduled time, us.
    pub late_mean_us: f64,
    pub late_max_us: f64,
    /// Histogram of release lateness: counts of releases later than the
    /// previous bound and at most <=10us, <=50us, <=100us, <=250us,
    /// <=500us, <=1ms, >1ms.
    pub late_hist: [u64; 7],
}

impl DirCounters {
    pub fn snapshot(&self) -> DirStats {
        let tx = self.tx_packets.load(Relaxed);
        let mut hist = [0u64; 7];
        for (h, a) in hist.iter_mut().zip(self.late_hist.iter()) {
            *h = a.load(Relaxed);
        }
        DirStats {
            rx_packets: self.rx_packets.load(Relaxed),
            rx_bytes: self.rx_bytes.load(Relaxed),
            tx_packets: tx,
            tx_bytes: self.tx_bytes.load(Relaxed),
            drop_loss: self.drop_loss.load(Relaxed),
            drop_queue: self.drop_queue.load(Relaxed),
            drop_memory: self.drop_memory.load(Relaxed),
            write_errors: self.write_errors.load(Relaxed),
            max_backlog_bytes: self.max_backlog_bytes.load(Relaxed),
            max_held_bytes: self.max_held_bytes.load(Relaxed),
            late_mean_us: if tx == 0 {
                0.0
            } else {
                self.late_sum_ns.load(Relaxed) as f64 / tx as f64 / 1000.0
            },
            late_max_us: self.late_max_ns.load(Relaxed) as f64 / 1000.0,
            late_hist: hist,
        }
    }
}

/// The forwarder thread's control, counters and scheduling facts, shared with its owner
/// (the test bed), which steers it and reads its statistics.
#[derive(Debug)]
pub struct ForwarderState {
    pub control: Control,
    /// Client -> server.
    pub c2s: DirCounters,
    /// Server -> client.
    pub s2c: DirCounters,
    /// Linux thread id of the forwarder (0 until it started).
    pub tid: AtomicU64,
    /// CPU time of the forwarder thread, refreshed about every 100 ms
    /// and when it stops.
    pub cpu_ns: AtomicU64,
    pub running: AtomicBool,
    /// Whether the forwarder got SCHED_FIFO.
    pub realtime: AtomicBool,
}

impl ForwarderState {
    pub fn new(control: Control) -> Self {
        ForwarderState {
            control,
            c2s: DirCounters::default(),
            s2c: DirCounters::default(),
            tid: AtomicU64::new(0),
            cpu_ns: AtomicU64::new(0),
            running: AtomicBool::new(false),
            realtime: AtomicBool::new(false),
        }
    }
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

struct Packet {
    buf: Box<[u8]>,
    len: usize,
    release: u64,
}

struct Dir<'a> {
    in_fd: RawFd,
    out_fd: RawFd,
    link: Link,
    queue: VecDeque<Packet>,
    held_bytes: u64,
    counters: &'a DirCounters,
}

struct Pool {
    free: Vec<Box<[u8]>>,
    buf_size: usize,
    allocated: usize,
    max_buffers: usize,
}

impl Pool {
    fn get(&mut self) -> Option<Box<[u8]>> {
        if let Some(b) = self.free.pop() {
            return Some(b);
        }
        if self.allocated >= self.max_buffers {
            return None;
        }
        self.allocated += 1;
        Some(vec![0u8; self.buf_size].into_boxed_slice())
    }
    fn put(&mut self, b: Box<[u8]>) {
        self.free.push(b);
    }
}

impl Dir<'_> {
    fn new(in_fd: RawFd, out_fd: RawFd, counters: &DirCounters) -> Dir<'_> {
        Dir {
            in_fd,
            out_fd,
            link: Link::new(),
            queue: VecDeque::new(),
            held_bytes: 0,
            counters,
        }
    }

    fn release_due(&mut self, now: u64, pool: &mut Pool) {
        while let Some(head) = self.queue.front() {
            if head.release > now {
                break;
            }
            let p = self.queue.pop_front().expect("front exists");
            // Lateness of the start of delivery (the write below also runs
            // the receiving host's network stack, which is not our delay).
            let late = mono_ns().saturating_sub(p.release);
            // SAFETY: buffer valid for p.len bytes.
            let n = unsafe { libc::write(self.out_fd, p.buf.as_ptr().cast(), p.len) };
            let c = self.counters;
            if n < 0 {
                bump(&c.write_errors, 1);
            } else {
                bump(&c.tx_packets, 1);
                bump(&c.tx_bytes, p.len as u64);
                bump(&c.late_sum_ns, late);
                raise(&c.late_max_ns, late);
                let us = late / 1000;
                let b = LATE_BUCKETS_US.iter().position(|&ub| us < ub).unwrap_or(6);
                bump(&c.late_hist[b], 1);
            }
            self.held_bytes -= p.len as u64;
            pool.put(p.buf);
        }
    }

    /// Reads up to READ_BATCH packets; returns true if the fd may have more.
    fn ingest(
        &mut self,
        control: &Control,
        rng: &mut Rng,
        pool: &mut Pool,
        scratch: &mut [u8],
    ) -> bool {
        let c = self.counters;
        for _ in 0..READ_BATCH {
            let buf = pool.get();
            let (ptr, cap) = match &buf {
                Some(b) => (b.as_ptr() as *mut u8, b.len()),
                None => (scratch.as_mut_ptr(), scratch.len()),
            };
            // SAFETY: ptr valid for cap bytes; buffers are not aliased.
            let n = unsafe { libc::read(self.in_fd, ptr.cast(), cap) };
            if n <= 0 {
                if let Some(b) = buf {
                    pool.put(b);
                }
                return false;
            }
            let len = n as usize;
            let now = mono_ns();
            bump(&c.rx_packets, 1);
            bump(&c.rx_bytes, len as u64);
            let Some(buf) = buf else {
                bump(&c.drop_memory, 1);
                continue;
            };
            let loss = if control.blackhole() {
                1.0
            } else {
                control.loss()
            };
            if rng.chance(loss) {
                bump(&c.drop_loss, 1);
                pool.put(buf);
                continue;
            }
            let params = control.params();
            match self.link.admit(now, len, &params) {
                Admit::QueueFull => {
                    bump(&c.drop_queue, 1);
                    pool.put(buf);
                }
                Admit::Release(release) => {
                    raise(
                        &c.max_backlog_bytes,
                        self.link.backlog_bytes(now, params.rate_bps),
                    );
                    self.held_bytes += len as u64;
                    raise(&c.max_held_bytes, self.held_bytes);
                    self.queue.push_back(Packet { buf, len, release });
                }
            }
        }
        true
    }
}

/// Runs the forwarder on the current thread until `shared.control` asks it
/// to stop. `client` and `server` are the TUN fds of the two hosts
/// (non-blocking, IFF_TUN | IFF_NO_PI).
pub fn run(
    client: OwnedFd,
    server: OwnedFd,
    mtu: u32,
    seed: u64,
    rt_priority: Option<i32>,
    shared: Arc<ForwarderState>,
) -> io::Result<()> {
    enter_thread(rt_priority, &shared);
    shared.running.store(true, Relaxed);
    let buf_size = mtu as usize + 128;
    let mut pool = Pool {
        free: Vec::new(),
        buf_size,
        allocated: 0,
        max_buffers: (MAX_HELD_BUFFER_BYTES / buf_size).max(64),
    };
    let mut scratch = vec![0u8; 65536];
    let mut rng = Rng::new(seed);
    let (cfd, sfd) = (client.as_raw_fd(), server.as_raw_fd());
    let mut dirs = [
        Dir::new(cfd, sfd, &shared.c2s),
        Dir::new(sfd, cfd, &shared.s2c),
    ];
    let mut fds = [cfd, sfd].map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    let mut last_cpu = 0u64;
    let mut more = [false; 2];
    let control = &shared.control;
    let mut spin = Spin::new(mono_ns());
    while !control.stop.load(Relaxed) {
        let now = mono_ns();
        spin.refill(now);
        for d in dirs.iter_mut() {
            d.release_due(now, &mut pool);
        }
        if now.saturating_sub(last_cpu) > 100_000_000 {
            shared.cpu_ns.store(thread_cpu_ns(), Relaxed);
            last_cpu = now;
        }
        let timeout_ns = if more[0] || more[1] {
            0
        } else {
            let next = dirs
                .iter()
                .filter_map(|d| d.queue.front().map(|p| p.release))
                .min();
            spin.timeout_ns(next)
        };
        match poll(&mut fds, timeout_ns) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                shared.running.store(false, Relaxed);
                return Err(e);
            }
        }
        for i in 0..2 {
            more[i] = fds[i].revents & libc::POLLIN != 0
                && dirs[i].ingest(control, &mut rng, &mut pool, &mut scratch);
        }
    }
    shared.cpu_ns.store(thread_cpu_ns(), Relaxed);
    shared.running.store(false, Relaxed);
    Ok(())
}

/// Readies the forwarder's thread: timer slack, its tid for the stats, and the real-time
/// priority when asked for.
fn enter_thread(rt_priority: Option<i32>, shared: &ForwarderState) {
    // SAFETY: plain syscalls on this thread.
    unsafe {
        // Wake up from timed sleeps with ~no slack (default is 50 us).
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
        shared.tid.store(libc::gettid() as u64, Relaxed);
        if let Some(prio) = rt_priority {
            // Real-time priority keeps releases on time when builds or the
            // test's own processes load every core. The loop mostly sleeps
            // and spins at most SPIN_SHARE_PERCENT, so it cannot hog a core.
            let p = libc::sched_param {
                sched_priority: prio,
            };
            if libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) == 0 {
                shared.realtime.store(true, Relaxed);
            }
        }
    }
}

/// Waits up to `timeout_ns` for either TUN fd to be readable. A failed fd is an error, as is
/// a failed `ppoll` (`Interrupted` included: the caller polls again).
fn poll(fds: &mut [libc::pollfd; 2], timeout_ns: u64) -> io::Result<()> {
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: fds is a valid array of 2 pollfds; ts valid.
    let r = unsafe { libc::ppoll(fds.as_mut_ptr(), 2, &ts, std::ptr::null()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    for fd in fds.iter() {
        let rev = fd.revents;
        if rev & (libc::POLLERR | libc::POLLNVAL) != 0 {
            return Err(io::Error::other(format!(
                "TUN fd {} failed (revents {rev:#x})",
                fd.fd
            )));
        }
    }
    Ok(())
}

/// A token bucket of busy-wait time: releases due within [`SPIN_NS`] are waited for by
/// spinning, at most [`SPIN_SHARE_PERCENT`] of the time, so the loop cannot hog a core.
struct Spin {
    budget: u64,
    last_update: u64,
    spinning_since: Option<u64>,
}

impl Spin {
    fn new(now: u64) -> Self {
        Self {
            budget: SPIN_BUDGET_CAP_NS,
            last_update: now,
            spinning_since: None,
        }
    }

    /// Adds the share of the time since the last call, and takes out the last spin.
    fn refill(&mut self, now: u64) {
        self.budget = (self.budget + (now - self.last_update) * SPIN_SHARE_PERCENT / 100)
            .min(SPIN_BUDGET_CAP_NS);
        self.last_update = now;
        if let Some(t) = self.spinning_since.take() {
            self.budget = self.budget.saturating_sub(now - t);
        }
    }

    /// How long to wait for the next release (`next`, if any packet is held): sleep until
    /// shortly before it, then spin if the budget allows.
    fn timeout_ns(&mut self, next: Option<u64>) -> u64 {
        let Some(t) = next else {
            return MAX_SLEEP_NS;
        };
        let now = mono_ns();
        let r = t.saturating_sub(now);
        let can_spin = self.budget > SPIN_NS;
        if r > 2 * PRE_WAKE_NS {
            (r - PRE_WAKE_NS).min(MAX_SLEEP_NS)
        } else if !can_spin {
            r
        } else if r > SPIN_NS {
            r - SPIN_NS
        } else {
            self.spinning_since = Some(now);
            0
        }
    }
}
