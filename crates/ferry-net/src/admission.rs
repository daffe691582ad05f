//! Connections that have not authenticated yet, counted per source address, so that one address
//! cannot take every connection slot with connections that never log in (issue 35: 512 data
//! `Hello`s for a random session, opened in 0.03 s, left `ferry ls` from anywhere else `busy`).
//!
//! A connection counts from its accept until it has proven something: a control connection's
//! token was accepted, or a data connection joined a session with its secret. IPv6 addresses
//! count per /64, the block one host usually holds; an IPv4 address mapped into IPv6 counts as
//! the IPv4 address it is.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// What connections are counted under: an IPv4 address, or an IPv6 /64 prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum AddrKey {
    V4(u32),
    V6Prefix(u64),
}

impl AddrKey {
    pub(crate) fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Self::V4(u32::from(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Self::V4(u32::from(v4)),
                None => Self::V6Prefix((u128::from(v6) >> 64) as u64),
            },
        }
    }
}

/// Counts of unauthenticated connections per address, with a cap on each.
pub(crate) struct PerAddress {
    cap: usize,
    counts: Mutex<HashMap<AddrKey, usize>>,
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
        let key = AddrKey::of(ip);
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
        counts.get(&AddrKey::of(ip)).copied().unwrap_or(0)
    }
}

/// One connection counted as unauthenticated until this is dropped.
pub(crate) struct Unproven {
    owner: Arc<PerAddress>,
    key: AddrKey,
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
}
