//! The scheduling math of one direction of the emulated link, with no I/O.
//!
//! A packet that arrives at `now` is first subjected to random loss (by the
//! caller), then to the drop-tail queue, then serialised onto the link at
//! the link rate and finally delayed by the one-way propagation delay:
//!
//! ```text
//! start    = max(now, link_free)          // wait behind earlier packets
//! tx_done  = start + len * 8 / rate       // serialisation
//! release  = tx_done + one_way_delay      // propagation
//! ```
//!
//! The bytes still waiting for (or in) serialisation are exactly
//! `(link_free - now) * rate / 8`, which is what the drop-tail limit is
//! applied to. Packets already serialised are "on the wire" and never
//! count against the queue.

pub const NS_PER_SEC: u64 = 1_000_000_000;

/// Time to serialise `bytes` at `rate_bps` bits per second, in nanoseconds,
/// rounded to the nearest nanosecond. `rate_bps == 0` means unlimited.
pub fn serialisation_ns(bytes: usize, rate_bps: u64) -> u64 {
    if rate_bps == 0 {
        return 0;
    }
    let bits = bytes as u128 * 8 * NS_PER_SEC as u128;
    ((bits + rate_bps as u128 / 2) / rate_bps as u128) as u64
}

/// Bytes the link transmits in `ns` nanoseconds at `rate_bps` (rounded up).
pub fn bytes_in_ns(ns: u64, rate_bps: u64) -> u64 {
    if rate_bps == 0 {
        return 0;
    }
    let bits = ns as u128 * rate_bps as u128;
    bits.div_ceil(8 * NS_PER_SEC as u128) as u64
}

/// Bandwidth-delay product in bytes for a rate and a round-trip time.
pub fn bdp_bytes(rate_bps: u64, rtt_ns: u64) -> u64 {
    bytes_in_ns(rtt_ns, rate_bps)
}

/// Parameters read for each packet (they may change at run time).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkParams {
    /// Link rate in bits per second; 0 = unlimited (no serialisation, no queue).
    pub rate_bps: u64,
    /// One-way propagation delay in nanoseconds (RTT / 2).
    pub one_way_ns: u64,
    /// Drop-tail limit on the bytes waiting for serialisation.
    pub queue_bytes: u64,
}

/// State of one direction of the link.
#[derive(Clone, Debug, Default)]
pub struct Link {
    /// When the link finishes serialising everything admitted so far.
    link_free: u64,
    /// Release time of the last admitted packet; releases never go
    /// backwards, so a delay lowered at run time cannot reorder packets.
    last_release: u64,
}

/// Outcome of offering a packet to the link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Deliver at this time (ns, same clock as `now`).
    Release(u64),
    /// The queue was full: drop-tail.
    QueueFull,
}

impl Link {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes waiting for (or in) serialisation at `now`.
    pub fn backlog_bytes(&self, now: u64, rate_bps: u64) -> u64 {
        bytes_in_ns(self.link_free.saturating_sub(now), rate_bps)
    }

    /// Offers a packet of `len` bytes arriving at `now`.
    pub fn admit(&mut self, now: u64, len: usize, p: &LinkParams) -> Admit {
        let tx_done = if p.rate_bps == 0 {
            now
        } else {
            let backlog = self.backlog_bytes(now, p.rate_bps);
            if backlog + len as u64 > p.queue_bytes {
                return Admit::QueueFull;
            }
            let start = self.link_free.max(now);
            let done = start + serialisation_ns(len, p.rate_bps);
            self.link_free = done;
            done
        };
        let release = (tx_done + p.one_way_ns).max(self.last_release);
        self.last_release = release;
        Admit::Release(release)
    }
}

/// xorshift64* — small, fast and good enough to draw loss decisions.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        // splitmix64 scramble so that small seeds give good states; never 0.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Rng(if z == 0 { 1 } else { z })
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `p` (p <= 0: never, p >= 1: always).
    pub fn chance(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            false
        } else if p >= 1.0 {
            true
        } else {
            self.next_f64() < p
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn params(rate_bps: u64, one_way_ns: u64, queue_bytes: u64) -> LinkParams {
        LinkParams {
            rate_bps,
            one_way_ns,
            queue_bytes,
        }
    }

    #[test]
    fn serialisation_times() {
        // 9000 bytes at 1 Gbit/s = 72 us; 1500 bytes at 100 Mbit/s = 120 us.
        assert_eq!(serialisation_ns(9000, 1_000_000_000), 72_000);
        assert_eq!(serialisation_ns(1500, 100_000_000), 120_000);
        assert_eq!(serialisation_ns(1, 3), 2_666_666_667);
        assert_eq!(serialisation_ns(9000, 0), 0);
        assert_eq!(bytes_in_ns(72_000, 1_000_000_000), 9000);
        assert_eq!(bdp_bytes(1_000_000_000, 100 * MS), 12_500_000);
    }

    #[test]
    fn delay_only_link() {
        let mut l = Link::new();
        let p = params(0, 25 * MS, 0);
        assert_eq!(l.admit(1000, 9000, &p), Admit::Release(1000 + 25 * MS));
        // Unlimited rate: back-to-back packets are not spaced out.
        assert_eq!(l.admit(1000, 9000, &p), Admit::Release(1000 + 25 * MS));
        assert_eq!(l.admit(5000, 64, &p), Admit::Release(5000 + 25 * MS));
    }

    #[test]
    fn rate_spaces_back_to_back_packets() {
        let mut l = Link::new();
        let p = params(1_000_000_000, 50 * MS, 1 << 30);
        // Three 9000-byte packets at t=0: done at 72, 144, 216 us, +50 ms.
        for k in 1..=3u64 {
            assert_eq!(l.admit(0, 9000, &p), Admit::Release(k * 72_000 + 50 * MS));
        }
        // A packet arriving after the link went idle starts immediately.
        assert_eq!(l.admit(MS, 9000, &p), Admit::Release(MS + 72_000 + 50 * MS));
    }

    #[test]
    fn long_run_rate_is_exact() {
        // 10_000 back-to-back 1500-byte packets at 200 Mbit/s take 0.6 s.
        let mut l = Link::new();
        let p = params(200_000_000, 0, u64::MAX);
        let mut last = 0;
        for _ in 0..10_000 {
            if let Admit::Release(t) = l.admit(0, 1500, &p) {
                last = t;
            }
        }
        assert_eq!(last, 600 * MS);
    }

    #[test]
    fn drop_tail_queue() {
        let mut l = Link::new();
        // 8 Mbit/s = 1 byte/us; queue of 3000 bytes.
        let p = params(8_000_000, 0, 3000);
        assert_eq!(l.admit(0, 1000, &p), Admit::Release(1_000_000));
        assert_eq!(l.admit(0, 1000, &p), Admit::Release(2_000_000));
        assert_eq!(l.admit(0, 1000, &p), Admit::Release(3_000_000));
        assert_eq!(l.backlog_bytes(0, p.rate_bps), 3000);
        assert_eq!(l.admit(0, 1, &p), Admit::QueueFull);
        // After 500 us, 500 bytes have drained: a 500-byte packet fits, 501 not.
        assert_eq!(l.admit(500_000, 501, &p), Admit::QueueFull);
        assert_eq!(l.admit(500_000, 500, &p), Admit::Release(3_500_000));
        // The drops did not move the link.
        assert_eq!(l.backlog_bytes(3_500_000, p.rate_bps), 0);
    }

    #[test]
    fn lowering_delay_never_reorders() {
        let mut l = Link::new();
        assert_eq!(
            l.admit(0, 100, &params(0, 50 * MS, 0)),
            Admit::Release(50 * MS)
        );
        assert_eq!(l.admit(MS, 100, &params(0, 0, 0)), Admit::Release(50 * MS));
        assert_eq!(
            l.admit(60 * MS, 100, &params(0, 0, 0)),
            Admit::Release(60 * MS)
        );
    }

    #[test]
    fn rng_loss_rate() {
        let mut r = Rng::new(42);
        let n = 200_000;
        let hits = (0..n).filter(|_| r.chance(0.1)).count() as f64;
        let sigma = (n as f64 * 0.1 * 0.9).sqrt();
        assert!((hits - n as f64 * 0.1).abs() < 4.0 * sigma, "hits {hits}");
        assert!(!Rng::new(1).chance(0.0));
        assert!(Rng::new(1).chance(1.0));
        let x = Rng::new(7).next_f64();
        assert!((0.0..1.0).contains(&x));
    }
}
