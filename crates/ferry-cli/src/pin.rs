//! Binds this process's threads to the NUMA node of the NIC a transfer uses
//! (`ferry_probe::placement`): once per client process, before its transfer starts, and at a
//! server's start when every address it listens on is on one node. Never fails a command:
//! what cannot be found or set is left as it is, and said at debug level.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::path::Path;
use std::sync::Once;

use ferry_probe::placement::{self, Placement};

/// The local address the kernel would send to `peer` from: a UDP socket "connected" to it
/// (no packet leaves).
fn local_addr_towards(peer: SocketAddr) -> Option<IpAddr> {
    let any: SocketAddr = if peer.is_ipv4() {
        "0.0.0.0:0".parse().ok()?
    } else {
        "[::]:0".parse().ok()?
    };
    let s = UdpSocket::bind(any).ok()?;
    s.connect(peer).ok()?;
    Some(s.local_addr().ok()?.ip())
}

/// The placement for traffic from `local`, if any.
fn plan(local: IpAddr) -> Result<Option<Placement>, String> {
    let allowed = placement::allowed_cpus().map_err(|e| format!("this process's CPUs: {e}"))?;
    let addrs = placement::read_ip_addrs()?;
    placement::plan(Path::new("/"), &addrs, local, &allowed)
}

fn bind(p: &Placement) {
    match placement::apply(&p.cpus) {
        Ok(n) => tracing::info!("threads bound to {p} ({n} threads)"),
        Err(e) => tracing::debug!("binding threads to {p}: {e}"),
    }
}

/// Before a client's transfer to `server` (`host:port`): binds the process once.
pub fn for_server(server: &str) {
    static ONCE: Once = Once::new();
    if placement::disabled() {
        return;
    }
    ONCE.call_once(|| {
        let Some(peer) = server.to_socket_addrs().ok().and_then(|mut a| a.next()) else {
            return;
        };
        let Some(local) = local_addr_towards(peer) else {
            return;
        };
        match plan(local) {
            Ok(Some(p)) => bind(&p),
            Ok(None) => {}
            Err(e) => tracing::debug!("NUMA placement towards {server}: {e}"),
        }
    });
}

/// At a server's start, listening on `addrs`: binds the process when every address is a
/// specific one on the same node. An unspecified address (`0.0.0.0`) takes sessions on any
/// NIC, so nothing is bound then.
pub fn for_listen(addrs: &[SocketAddr]) {
    if placement::disabled() || addrs.iter().any(|a| a.ip().is_unspecified()) {
        return;
    }
    let mut plans = Vec::new();
    for a in addrs {
        match plan(a.ip()) {
            Ok(Some(p)) => plans.push(p),
            Ok(None) => return,
            Err(e) => {
                tracing::debug!("NUMA placement for {a}: {e}");
                return;
            }
        }
    }
    if let Some(first) = plans.first() {
        if plans.iter().all(|p| p.cpus == first.cpus) {
            bind(first);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_address_towards_loopback_is_loopback() {
        let peer: SocketAddr = "127.0.0.1:7070".parse().unwrap();
        assert_eq!(local_addr_towards(peer), Some("127.0.0.1".parse().unwrap()));
    }

    #[test]
    fn loopback_and_unspecified_addresses_bind_nothing() {
        // Nothing to bind on loopback; the call returns at once and changes no CPU set.
        let before = placement::allowed_cpus().unwrap();
        for_listen(&["0.0.0.0:7070".parse().unwrap()]);
        for_listen(&["127.0.0.1:7070".parse().unwrap()]);
        for_server("127.0.0.1:7070");
        assert_eq!(placement::allowed_cpus().unwrap(), before);
    }
}
