//! Where a transfer's threads run on a host of several NUMA nodes: on the node of the NIC that
//! carries it. Reading a block into memory on one socket and sending it from a NIC on the
//! other crosses the interconnect twice per byte; data transfer nodes are routinely bound to
//! the NIC's node by hand (`numactl`), and ferry does it itself so that nobody has to.
//!
//! [`choose`] is the rule, pure; [`plan`] reads the host (`ip -j addr`, sysfs beneath a root
//! for tests, the process's allowed CPUs); [`apply`] binds every thread of the process, and
//! threads started later inherit it from whichever thread starts them. A host of one node, a
//! virtual or bonded interface whose node the kernel does not give, or a NIC node that shares
//! no CPU with what the process may use (a cgroup or `taskset` set it) leaves everything as
//! it is. `FERRY_NO_PIN=1` turns it off.

use std::net::IpAddr;
use std::path::Path;

use serde::Serialize;

use crate::cpulist::format_cpulist;
use crate::host::{device_numa_node, read_numa, NumaNode};
use crate::sys::Sys;

/// The environment variable that turns pinning off.
pub const NO_PIN_ENV: &str = "FERRY_NO_PIN";

/// Threads bound to the node of the interface a transfer uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placement {
    pub interface: String,
    pub node: u32,
    pub cpus: Vec<usize>,
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NUMA node {} ({}), CPUs {}",
            self.node,
            self.interface,
            format_cpulist(&self.cpus)
        )
    }
}

/// The CPUs to bind to: the NIC's node's CPUs that the process may use, when the host has
/// more than one node and binding changes anything; `None` otherwise.
pub fn choose(nodes: &[NumaNode], nic_node: Option<u32>, allowed: &[usize]) -> Option<Vec<usize>> {
    if nodes.iter().filter(|n| !n.cpus.is_empty()).count() < 2 {
        return None;
    }
    let node = nodes.iter().find(|n| Some(n.id) == nic_node)?;
    let cpus: Vec<usize> = node
        .cpus
        .iter()
        .copied()
        .filter(|c| allowed.contains(c))
        .collect();
    let mut all = allowed.to_vec();
    all.sort_unstable();
    all.dedup();
    (!cpus.is_empty() && cpus != all).then_some(cpus)
}

/// The interface that holds `addr`, from the JSON of `ip -j addr show`. `Err` when the text is
/// not that JSON.
pub fn interface_holding(ip_addr_json: &str, addr: IpAddr) -> Result<Option<String>, String> {
    let v: serde_json::Value = serde_json::from_str(ip_addr_json)
        .map_err(|e| format!("not the JSON of `ip -j addr`: {e}"))?;
    let links = v
        .as_array()
        .ok_or("not the JSON of `ip -j addr`: no list")?;
    for link in links {
        let Some(name) = link["ifname"].as_str() else {
            continue;
        };
        let holds = link["addr_info"].as_array().is_some_and(|infos| {
            infos.iter().any(|i| {
                i["local"]
                    .as_str()
                    .and_then(|s| s.parse::<IpAddr>().ok())
                    .is_some_and(|a| a == canonical(addr))
            })
        });
        if holds {
            return Ok(Some(name.to_owned()));
        }
    }
    Ok(None)
}

/// An IPv4 address seen through an IPv6 socket (`::ffff:a.b.c.d`) as the IPv4 it is.
fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// Where threads carrying traffic from the local address `local` should run; `Ok(None)` when
/// nothing is to be bound (see the module's doc). `sys_root` is `/` except in tests;
/// `ip_addr_json` the output of `ip -j addr show` (see [`read_ip_addrs`]).
pub fn plan(
    sys_root: &Path,
    ip_addr_json: &str,
    local: IpAddr,
    allowed: &[usize],
) -> Result<Option<Placement>, String> {
    if local.is_loopback() || local.is_unspecified() {
        return Ok(None);
    }
    let Some(interface) = interface_holding(ip_addr_json, local)? else {
        return Ok(None);
    };
    let mut sys = Sys::new(sys_root);
    let nodes = read_numa(&mut sys);
    let dev = sys.path(&format!("/sys/class/net/{interface}/device"));
    if !dev.exists() {
        return Ok(None); // virtual: veth, bridge, bond, VLAN
    }
    let (_, node) = device_numa_node(&sys, &dev);
    Ok(choose(&nodes, node, allowed).map(|cpus| Placement {
        interface,
        node: node.unwrap_or_default(),
        cpus,
    }))
}

/// `ip -j addr show`'s output. `Err` says why not.
pub fn read_ip_addrs() -> Result<String, String> {
    let ip = crate::routes::find_ip(
        std::env::var_os("PATH").as_deref(),
        crate::routes::is_executable,
    )
    .ok_or("no `ip` (iproute2) to find the interface")?;
    let out = std::process::Command::new(ip)
        .args(["-j", "addr", "show"])
        .output()
        .map_err(|e| format!("`ip -j addr show` could not run: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`ip -j addr show` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The CPUs this process may run on.
pub fn allowed_cpus() -> std::io::Result<Vec<usize>> {
    let set = rustix::thread::sched_getaffinity(None)?;
    Ok((0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&c| set.is_set(c))
        .collect())
}

/// Binds every thread of this process to `cpus`; returns how many were bound. Threads that
/// end meanwhile are passed over; threads started later inherit the binding from their
/// starter.
pub fn apply(cpus: &[usize]) -> std::io::Result<usize> {
    let mut set = rustix::thread::CpuSet::new();
    for &c in cpus {
        if c < rustix::thread::CpuSet::MAX_CPU {
            set.set(c);
        }
    }
    let mut bound = 0;
    for e in std::fs::read_dir("/proc/self/task")? {
        let Some(tid) = e?
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
            .and_then(rustix::process::Pid::from_raw)
        else {
            continue;
        };
        match rustix::thread::sched_setaffinity(Some(tid), &set) {
            Ok(()) => bound += 1,
            Err(rustix::io::Errno::SRCH) => {} // ended meanwhile
            Err(e) => return Err(e.into()),
        }
    }
    Ok(bound)
}

/// Whether pinning is turned off (`FERRY_NO_PIN` set to anything but empty or `0`).
pub fn disabled() -> bool {
    std::env::var_os(NO_PIN_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u32, cpus: std::ops::Range<usize>) -> NumaNode {
        NumaNode {
            id,
            cpus: cpus.collect(),
            mem_total: None,
        }
    }

    #[test]
    fn the_nics_node_is_chosen_within_what_the_process_may_use() {
        let nodes = [node(0, 0..8), node(1, 8..16)];
        let all: Vec<usize> = (0..16).collect();
        assert_eq!(choose(&nodes, Some(1), &all), Some((8..16).collect()));
        assert_eq!(choose(&nodes, Some(0), &all), Some((0..8).collect()));
        // A cgroup that allows 6-11: the NIC's node's share of it.
        let some: Vec<usize> = (6..12).collect();
        assert_eq!(choose(&nodes, Some(1), &some), Some((8..12).collect()));
        // Already inside the node: nothing to change.
        let inside: Vec<usize> = (8..12).collect();
        assert_eq!(choose(&nodes, Some(1), &inside), None);
        // No CPU of the node allowed, the node unknown or not listed: left alone.
        assert_eq!(choose(&nodes, Some(1), &[0, 1]), None);
        assert_eq!(choose(&nodes, None, &all), None);
        assert_eq!(choose(&nodes, Some(7), &all), None);
    }

    #[test]
    fn one_node_or_a_memory_only_node_is_nothing_to_choose() {
        let all: Vec<usize> = (0..8).collect();
        assert_eq!(choose(&[node(0, 0..8)], Some(0), &all), None);
        assert_eq!(choose(&[node(0, 0..8), node(1, 0..0)], Some(0), &all), None);
        assert_eq!(choose(&[], Some(0), &all), None);
    }

    const IP_ADDR: &str = r#"[
      {"ifindex":1,"ifname":"lo","addr_info":[{"family":"inet","local":"127.0.0.1"}]},
      {"ifindex":2,"ifname":"eno1","addr_info":[{"family":"inet","local":"192.0.2.10"},
        {"family":"inet6","local":"2001:db8::10"}]},
      {"ifindex":3,"ifname":"ens2f0","addr_info":[{"family":"inet","local":"198.51.100.7"}]},
      {"ifindex":4,"ifname":"veth0","addr_info":[{"family":"inet","local":"10.9.0.1"}]},
      {"ifindex":5,"ifname":"noaddr"}
    ]"#;

    #[test]
    fn the_interface_holding_an_address_is_found() {
        let find = |a: &str| interface_holding(IP_ADDR, a.parse().unwrap()).unwrap();
        assert_eq!(find("198.51.100.7").as_deref(), Some("ens2f0"));
        assert_eq!(find("2001:db8::10").as_deref(), Some("eno1"));
        assert_eq!(find("::ffff:192.0.2.10").as_deref(), Some("eno1"));
        assert_eq!(find("203.0.113.1"), None);
        assert!(interface_holding("not json", "127.0.0.1".parse().unwrap()).is_err());
        assert!(interface_holding("{}", "127.0.0.1".parse().unwrap()).is_err());
    }

    /// A host of two nodes: CPUs 0-3 and 4-7; `ens2f0` (PCI, node 1), `eno1` (node -1: the
    /// firmware does not say), `veth0` (no device).
    fn fake_host() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let w = |p: &str, s: &str| {
            let p = d.path().join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, s).unwrap();
        };
        w("sys/devices/system/node/node0/cpulist", "0-3\n");
        w("sys/devices/system/node/node1/cpulist", "4-7\n");
        w("sys/devices/pci0000:80/0000:81:00.0/numa_node", "1\n");
        w("sys/devices/pci0000:00/0000:00:1f.6/numa_node", "-1\n");
        std::fs::create_dir_all(d.path().join("sys/class/net/ens2f0")).unwrap();
        std::fs::create_dir_all(d.path().join("sys/class/net/eno1")).unwrap();
        std::fs::create_dir_all(d.path().join("sys/class/net/veth0")).unwrap();
        std::os::unix::fs::symlink(
            d.path().join("sys/devices/pci0000:80/0000:81:00.0"),
            d.path().join("sys/class/net/ens2f0/device"),
        )
        .unwrap();
        std::os::unix::fs::symlink(
            d.path().join("sys/devices/pci0000:00/0000:00:1f.6"),
            d.path().join("sys/class/net/eno1/device"),
        )
        .unwrap();
        d
    }

    #[test]
    fn a_plan_binds_to_the_node_of_the_nic_holding_the_local_address() {
        let host = fake_host();
        let all: Vec<usize> = (0..8).collect();
        let plan = |a: &str| plan(host.path(), IP_ADDR, a.parse().unwrap(), &all).unwrap();
        let p = plan("198.51.100.7").expect("ens2f0 is on node 1");
        assert_eq!(
            p,
            Placement {
                interface: "ens2f0".into(),
                node: 1,
                cpus: vec![4, 5, 6, 7]
            }
        );
        assert_eq!(p.to_string(), "NUMA node 1 (ens2f0), CPUs 4-7");
        assert_eq!(plan("192.0.2.10"), None, "eno1's node is not known");
        assert_eq!(plan("10.9.0.1"), None, "veth0 is virtual");
        assert_eq!(plan("127.0.0.1"), None, "loopback");
        assert_eq!(plan("0.0.0.0"), None, "unspecified");
        assert_eq!(plan("203.0.113.1"), None, "not ours");
    }

    #[test]
    fn binding_to_the_allowed_cpus_reaches_every_thread() {
        let allowed = allowed_cpus().unwrap();
        assert!(!allowed.is_empty());
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            let _ = rx.recv();
            allowed_cpus().unwrap()
        });
        let bound = apply(&allowed).unwrap();
        assert!(bound >= 2, "this thread and the other: {bound}");
        tx.send(()).unwrap();
        assert_eq!(other.join().unwrap(), allowed);
        assert_eq!(allowed_cpus().unwrap(), allowed);
    }
}
