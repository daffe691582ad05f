//! ferry-netem: a user-space WAN emulator for ferry's tests.
//!
//! Two network namespaces ("client" and "server" hosts) each get a TUN
//! device; a forwarder thread holding both TUN file descriptors moves raw
//! IP packets between them, per direction applying random loss, a
//! drop-tail queue, serialisation at the link rate and a one-way delay of
//! RTT/2. The kernels at both ends see the real RTT.
//!
//! A [`Topology`] does the same for N hosts joined by any number of links (several between
//! the same two hosts too), each link with its own RTT, rate, loss and forwarder thread.
//!
//! ```no_run
//! use ferry_netem::{can_run, BedConfig, Host, Regime, TestBed};
//! use std::time::Duration;
//!
//! // Without root, TUN or `ip`: says why and returns, or fails when `CI` is set.
//! let Some(()) = ferry_netem::needs("example", can_run()) else {
//!     return;
//! };
//! let bed = TestBed::up(BedConfig {
//!     rtt: Duration::from_millis(50),
//!     rate_bps: Some(1_000_000_000),
//!     loss: 0.0,
//!     mtu: 9000,
//!     regime: Regime::Default,
//!     queue_bytes: None,
//!     initial_window: None,
//!     fast_open: false,
//! })
//! .unwrap();
//! let out = bed
//!     .command(Host::Client, "ping")
//!     .args(["-c", "1", &bed.server_addr().to_string()])
//!     .output()
//!     .unwrap();
//! assert!(out.status.success());
//! bed.set_loss(1.0); // blackhole
//! println!("{}", serde_json::to_string(&bed.stats()).unwrap());
//! // dropping `bed` removes the namespaces and devices
//! ```

mod bed;
pub mod forward;
mod needs;
pub mod sched;
mod topology;

pub use bed::{
    can_run, delete_netns, find_in_path, list_netns, open_tun, reap_stale, regime_sysctls,
    BedConfig, BedOptions, Host, Regime, Stats, TestBed, CLIENT_ADDR, DEFAULT_WMEM_MAX, DEVICE,
    PREFIX_LEN, SERVER_ADDR, TUNED_BUF,
};
pub use forward::DirStats;
pub use needs::{in_ci, needs, MARKER_DIR_ENV};
pub use topology::{
    link_addr, link_device, End, LinkConfig, LinkStats, Topology, TopologyConfig, LINK_PREFIX_LEN,
    MAX_LINKS,
};

/// Puts the calling thread under SCHED_FIFO at `priority` (1..=99), or
/// back to normal scheduling with 0. Tests that time round trips through a
/// bed can use it for their probe threads, so that the measurement sees the
/// emulated link rather than CPU contention on a loaded machine.
pub fn set_thread_realtime(priority: i32) -> std::io::Result<()> {
    let (policy, prio) = if priority <= 0 {
        (libc::SCHED_OTHER, 0)
    } else {
        (libc::SCHED_FIFO, priority.min(99))
    };
    let p = libc::sched_param {
        sched_priority: prio,
    };
    // SAFETY: sched_setscheduler on the calling thread with a valid param.
    if unsafe { libc::sched_setscheduler(0, policy, &p) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Parses a loss probability: "0.01" or "1%".
pub fn parse_loss(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let v = match t.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|x| x / 100.0),
        None => t.parse::<f64>(),
    }
    .map_err(|_| format!("bad loss {s:?}"))?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("loss {s:?} out of 0..=1"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_units::units::{
        parse_bytes_tc as parse_bytes, parse_duration_tc as parse_duration,
        parse_rate_tc as parse_rate,
    };
    use std::time::Duration;

    #[test]
    fn parsing() {
        assert_eq!(parse_duration("50ms").unwrap(), Duration::from_millis(50));
        assert_eq!(parse_duration("50").unwrap(), Duration::from_millis(50));
        assert_eq!(parse_duration("0.1s").unwrap(), Duration::from_millis(100));
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert!(parse_duration("5 parsecs").is_err());
        assert_eq!(parse_rate("1gbit").unwrap(), Some(1_000_000_000));
        assert_eq!(parse_rate("200Mbit").unwrap(), Some(200_000_000));
        assert_eq!(parse_rate("1.5mbit").unwrap(), Some(1_500_000));
        assert_eq!(parse_rate("10mbps").unwrap(), Some(80_000_000));
        assert_eq!(parse_rate("unlimited").unwrap(), None);
        assert!(parse_rate("fast").is_err());
        assert_eq!(parse_bytes("12500000").unwrap(), 12_500_000);
        assert_eq!(parse_bytes("12.5M").unwrap(), 12_500_000);
        assert_eq!(parse_bytes("4MiB").unwrap(), 4 << 20);
        assert_eq!(parse_bytes("64k").unwrap(), 64_000);
        assert_eq!(parse_loss("0.01").unwrap(), 0.01);
        assert_eq!(parse_loss("10%").unwrap(), 0.1);
        assert!(parse_loss("2").is_err());
    }

    #[test]
    fn default_queue_is_one_bdp() {
        let c = BedConfig {
            rtt: Duration::from_millis(100),
            rate_bps: Some(1_000_000_000),
            ..Default::default()
        };
        assert_eq!(c.effective_queue_bytes(), 12_500_000);
        let c = BedConfig {
            rtt: Duration::ZERO,
            rate_bps: Some(1_000_000_000),
            ..Default::default()
        };
        assert_eq!(c.effective_queue_bytes(), 64 * 9000);
        let c = BedConfig {
            queue_bytes: Some(100),
            ..Default::default()
        };
        assert_eq!(c.effective_queue_bytes(), 9000);
    }
}
