//! Limits on who gets in. Connections that have not authenticated yet are counted per source
//! address, so that one address cannot take every connection slot with connections that never
//! log in (issue 35: 512 data `Hello`s for a random session, opened in 0.03 s, left `ferry ls`
//! from anywhere else `busy`).
//!
//! A connection counts from its accept until it has proven something: a control connection's
//! token was accepted, or a data connection joined a session with its secret. IPv6 addresses
//! count per /64, the block one host usually holds; an IPv4 address mapped into IPv6 counts as
//! the IPv4 address it is ([`host_of`]).
//!
//! Also here: the cap on sessions per token, and the brake on guessing tokens ([`LoginBrake`]).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The address one host is counted under: an IPv4 address as it is (also when mapped into
/// IPv6), an IPv6 address as its /64 prefix.
pub(crate) fn host_of(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V4(_) => addr,
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(a) & !((1u128 << 64) - 1))),
        },
    }
}

/// Counts of unauthenticated connections per address, with a cap on each.
pub(crate) struct PerAddress {
    cap: usize,
    counts: Mutex<HashMap<IpAddr, usize>>,
}

impl PerAddress {
    pub(crate) fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            cap: cap.max(1),
            counts: Mutex::default(),
        })
    }

    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// Counts one more connection from `ip`, or `None` if that address is at its cap. The
    /// count drops again when the returned guard does (authenticated, or closed).
    pub(crate) fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Unproven> {
        let key = host_of(ip);
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let n = counts.entry(key).or_insert(0);
        if *n >= self.cap {
            return None;
        }
        *n += 1;
        Some(Unproven {
            owner: self.clone(),
            key,
        })
    }

    /// Unauthenticated connections from `ip`'s address (or /64) now.
    #[cfg(test)]
    fn count(&self, ip: IpAddr) -> usize {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.get(&host_of(ip)).copied().unwrap_or(0)
    }
}

/// One connection counted as unauthenticated until this is dropped.
pub(crate) struct Unproven {
    owner: Arc<PerAddress>,
    key: IpAddr,
}

impl Drop for Unproven {
    fn drop(&mut self) {
        let mut counts = self.owner.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = counts.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                // No entry lingers for an address with nothing open: the map stays as large as
                // the connections are many.
                counts.remove(&self.key);
            }
        }
    }
}

/// Sessions running now per token name, with a cap on each (`max_sessions_per_token`).
pub(crate) struct PerToken {
    cap: usize,
    counts: Mutex<HashMap<String, usize>>,
}

impl PerToken {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            counts: Mutex::default(),
        }
    }

    /// Counts one more session of `token`, or `None` if it runs its most already. The count
    /// drops again when the returned guard does.
    pub(crate) fn enter(&self, token: &str) -> Option<TokenSession<'_>> {
        let mut map = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let n = map.entry(token.to_owned()).or_default();
        if *n >= self.cap {
            return None;
        }
        *n += 1;
        Some(TokenSession(self, token.to_owned()))
    }
}

/// Counts a session against its token's cap while it runs.
pub(crate) struct TokenSession<'a>(&'a PerToken, String);

impl Drop for TokenSession<'_> {
    fn drop(&mut self) {
        let mut map = self.0.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.1);
            }
        }
    }
}

/// Slows down guessing: after [`LoginBrake::FREE`] failures from one address, or
/// [`LoginBrake::FREE_NET`] from its network (IPv4 /24, IPv6 /64, so that rotating source
/// addresses does not help), each further attempt must wait twice as long as the last (1 s,
/// 2 s, … up to 5 min), and attempts inside the wait are refused without even checking the
/// token, so opening many connections in parallel does not help either. A successful login
/// clears nothing: a client holding one valid token must not earn free guesses at others.
/// Quiet entries are forgotten. Time is passed in, so the policy is tested without sleeping.
#[derive(Debug, Default)]
pub struct LoginBrake {
    by_addr: HashMap<IpAddr, Failures>,
    by_net: HashMap<IpAddr, Failures>,
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
}

/// The network an address is counted in as well: its /24 (IPv4) or /64 (IPv6).
pub fn network_of(addr: IpAddr) -> IpAddr {
    match host_of(addr) {
        IpAddr::V4(a) => {
            let [x, y, z, _] = a.octets();
            IpAddr::from([x, y, z, 0])
        }
        v6 => v6,
    }
}

impl LoginBrake {
    /// Failures allowed from one address before waits start: enough for a user fixing a typo.
    pub const FREE: u32 = 5;
    /// Failures allowed from one network (a site's hosts behind one /24 or /64 together).
    pub const FREE_NET: u32 = 20;
    const MAX_WAIT: Duration = Duration::from_secs(300);
    const FORGET: Duration = Duration::from_secs(3600);
    /// Entries remembered at most per table; beyond that the oldest are dropped, so a flood
    /// from many addresses cannot grow the tables without bound.
    const MAX_ADDRS: usize = 10_000;

    fn wait_for(count: u32, free: u32) -> Duration {
        if count < free {
            return Duration::ZERO;
        }
        let exp = (count - free).min(16);
        Duration::from_secs(1u64 << exp).min(Self::MAX_WAIT)
    }

    fn wait_in(
        table: &mut HashMap<IpAddr, Failures>,
        key: IpAddr,
        free: u32,
        now: Instant,
    ) -> Duration {
        let Some(f) = table.get(&key).copied() else {
            return Duration::ZERO;
        };
        if now.saturating_duration_since(f.last) > Self::FORGET {
            table.remove(&key);
            return Duration::ZERO;
        }
        (f.last + Self::wait_for(f.count, free)).saturating_duration_since(now)
    }

    /// `Err(wait)` if `addr` must wait before its next attempt.
    pub fn check(&mut self, addr: IpAddr, now: Instant) -> Result<(), Duration> {
        let wait = Self::wait_in(&mut self.by_addr, addr, Self::FREE, now).max(Self::wait_in(
            &mut self.by_net,
            network_of(addr),
            Self::FREE_NET,
            now,
        ));
        if wait.is_zero() {
            Ok(())
        } else {
            Err(wait)
        }
    }

    pub fn failed(&mut self, addr: IpAddr, now: Instant) {
        Self::count(&mut self.by_addr, addr, now);
        Self::count(&mut self.by_net, network_of(addr), now);
    }

    fn count(table: &mut HashMap<IpAddr, Failures>, key: IpAddr, now: Instant) {
        if table.len() >= Self::MAX_ADDRS && !table.contains_key(&key) {
            table.retain(|_, f| now.saturating_duration_since(f.last) <= Self::FORGET);
            if table.len() >= Self::MAX_ADDRS {
                if let Some(oldest) = table.iter().min_by_key(|(_, f)| f.last) {
                    let k = *oldest.0;
                    table.remove(&k);
                }
            }
        }
        let f = table.entry(key).or_insert(Failures {
            count: 0,
            last: now,
        });
        f.count = f.count.saturating_add(1);
        f.last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn capped_per_address_and_released_on_drop() {
        let u = PerAddress::new(2);
        let a = u.admit(ip("10.0.0.1")).unwrap();
        let _b = u.admit(ip("10.0.0.1")).unwrap();
        assert!(u.admit(ip("10.0.0.1")).is_none());
        // Another address has its own count.
        let _c = u.admit(ip("10.0.0.2")).unwrap();
        drop(a);
        assert_eq!(u.count(ip("10.0.0.1")), 1);
        assert!(u.admit(ip("10.0.0.1")).is_some());
        assert_eq!(u.count(ip("10.0.0.1")), 1, "the guard above was dropped");
    }

    #[test]
    fn ipv6_counts_per_slash_64_and_mapped_ipv4_as_ipv4() {
        let u = PerAddress::new(2);
        let _a = u.admit(ip("2001:db8:1:2::1")).unwrap();
        let _b = u.admit(ip("2001:db8:1:2:ffff::9")).unwrap();
        assert!(
            u.admit(ip("2001:db8:1:2:abcd::1")).is_none(),
            "same /64, other host bits"
        );
        assert!(u.admit(ip("2001:db8:1:3::1")).is_some(), "next /64");
        let _m = u.admit(ip("::ffff:192.0.2.7")).unwrap();
        let _v4 = u.admit(ip("192.0.2.7")).unwrap();
        assert!(u.admit(ip("192.0.2.7")).is_none());
    }

    #[test]
    fn no_entry_left_for_an_address_with_nothing_open() {
        let u = PerAddress::new(4);
        for i in 0..100u8 {
            drop(u.admit(IpAddr::from([10, 1, 0, i])).unwrap());
        }
        assert!(u.counts.lock().unwrap().is_empty());
    }

    #[test]
    fn login_brake_doubles_waits_and_forgets() {
        let mut b = LoginBrake::default();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        let t0 = Instant::now();
        for i in 0..LoginBrake::FREE {
            assert!(b.check(ip, t0).is_ok(), "attempt {i} is free");
            b.failed(ip, t0);
        }
        assert_eq!(b.check(ip, t0), Err(Duration::from_secs(1)));
        assert!(b.check(other, t0).is_ok(), "other addresses are not slowed");
        let t1 = t0 + Duration::from_secs(1);
        assert!(b.check(ip, t1).is_ok());
        b.failed(ip, t1);
        assert_eq!(b.check(ip, t1), Err(Duration::from_secs(2)));
        // Waits are capped.
        let mut t = t1;
        for _ in 0..40 {
            b.failed(ip, t);
            t += Duration::from_millis(1);
        }
        assert!(b.check(ip, t).unwrap_err() <= Duration::from_secs(300));
        // A long quiet period forgets.
        assert!(b.check(ip, t + Duration::from_secs(7200)).is_ok());
    }

    #[test]
    fn login_brake_counts_networks_too() {
        let v6 = |n: u128| IpAddr::V6(std::net::Ipv6Addr::from(n));
        let mut b = LoginBrake::default();
        let t0 = Instant::now();
        // Rotating addresses inside one /24 is braked once the network has failed enough.
        for i in 0..LoginBrake::FREE_NET {
            let ip = IpAddr::from([127, 0, 0, (i + 1) as u8]);
            assert!(b.check(ip, t0).is_ok(), "attempt {i} is free");
            b.failed(ip, t0);
        }
        assert!(b.check(IpAddr::from([127, 0, 0, 200]), t0).is_err());
        assert!(b.check(IpAddr::from([127, 0, 1, 1]), t0).is_ok());
        // IPv6: the /64 counts; another /64 does not.
        for i in 0..LoginBrake::FREE_NET {
            let ip = v6(0x2001_0db8_0000_0001_0000_0000_0000_0000u128 + u128::from(i));
            b.failed(ip, t0);
        }
        let same = v6(0x2001_0db8_0000_0001_ffff_0000_0000_0001u128);
        let other = v6(0x2001_0db8_0000_0002_0000_0000_0000_0001u128);
        assert!(b.check(same, t0).is_err());
        assert!(b.check(other, t0).is_ok());
        // An IPv4-mapped address is its IPv4 network.
        assert_eq!(
            network_of("::ffff:127.0.0.9".parse().unwrap()),
            IpAddr::from([127, 0, 0, 0])
        );
    }

    #[test]
    fn login_brake_table_is_bounded() {
        let mut b = LoginBrake::default();
        let t0 = Instant::now();
        for i in 0..(LoginBrake::MAX_ADDRS as u32 + 500) {
            b.failed(
                IpAddr::from(i.to_be_bytes()),
                t0 + Duration::from_micros(i as u64),
            );
        }
        assert!(b.by_addr.len() <= LoginBrake::MAX_ADDRS);
        assert!(b.by_net.len() <= LoginBrake::MAX_ADDRS);
    }
}
