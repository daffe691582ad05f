//! A topology: N hosts (network namespaces) joined by point-to-point links, each link with
//! its own RTT, rate, loss and queue. Two hosts may share several links (like several network
//! cards), which striping needs; three hosts with a link per pair make a third-party bed.
//!
//! Link `i` has a TUN device `fl<i>` in each of its two hosts and its own subnet, `10.78.i.0/24`:
//! its `a` end is `10.78.i.1`, its `b` end `10.78.i.2`. Traffic to an address goes over the
//! link that address is on, so binding to (or connecting to) a link's address picks the link.
//! Each link has its own forwarder thread (the bed's, [`crate::forward`]).

use std::borrow::BorrowMut;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::bed::{
    apply_sysctls, can_run, check_config, core_max_notes, delete_netns, ip, ip_bin, is_host_name,
    open_tun, reap_stale, regime_sysctls, run_in_fd, setns_net, start_forwarder, write_sysctl,
    BedConfig, BedOptions, Netns, Regime, COUNTER,
};
use crate::forward::{DirStats, ForwarderState};

/// The most links a topology has: one `/24` of `10.78.0.0/16` each.
pub const MAX_LINKS: usize = 256;
/// Prefix length of each link's subnet.
pub const LINK_PREFIX_LEN: u8 = 24;

/// One end of a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum End {
    /// The link's `a` host, address `10.78.i.1`.
    A,
    /// The link's `b` host, address `10.78.i.2`.
    B,
}

/// The address of `end` of link `link`: `10.78.<link>.1` (A) or `.2` (B).
///
/// # Panics
/// If `link` is not below [`MAX_LINKS`].
pub fn link_addr(link: usize, end: End) -> Ipv4Addr {
    let third = u8::try_from(link).expect("link index below MAX_LINKS");
    Ipv4Addr::new(10, 78, third, if end == End::A { 1 } else { 2 })
}

/// Name of the TUN device of link `link` (the same in both of its hosts).
pub fn link_device(link: usize) -> String {
    format!("fl{link}")
}

/// One point-to-point link between hosts `a` and `b` (indices into
/// [`TopologyConfig::hosts`]); delay, rate, loss and queue apply to each direction.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkConfig {
    pub a: usize,
    pub b: usize,
    /// Round-trip time; each direction is delayed by rtt / 2.
    pub rtt: Duration,
    /// Rate in bit/s per direction; None = unlimited.
    pub rate_bps: Option<u64>,
    /// Random loss probability per packet, each direction, 0..=1.
    pub loss: f64,
    /// MTU of the link's two TUN devices.
    pub mtu: u32,
    /// Drop-tail limit on bytes waiting for serialisation, per direction; None = one
    /// bandwidth-delay product (at least 64 MTU-sized packets), as in the bed.
    pub queue_bytes: Option<u64>,
}

impl LinkConfig {
    /// A lossless link of MTU 9000 with the default queue.
    pub fn new(a: usize, b: usize, rtt: Duration, rate_bps: Option<u64>) -> Self {
        LinkConfig {
            a,
            b,
            rtt,
            rate_bps,
            loss: 0.0,
            mtu: 9000,
            queue_bytes: None,
        }
    }

    /// The bed configuration of this link, whose checks and queue default it shares.
    fn as_bed(&self, regime: Regime) -> BedConfig {
        BedConfig {
            rtt: self.rtt,
            rate_bps: self.rate_bps,
            loss: self.loss,
            mtu: self.mtu,
            regime,
            queue_bytes: self.queue_bytes,
            initial_window: None,
            fast_open: false,
        }
    }
}

/// Hosts and links of a topology.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopologyConfig {
    /// Short host names (1 to 8 of `a-z0-9`, distinct), e.g. `["c", "a", "b"]`; each names
    /// its namespace `fnm-<pid>-<n>-<host>`.
    pub hosts: Vec<String>,
    pub links: Vec<LinkConfig>,
    /// TCP buffer regime of every host, as in the bed.
    pub regime: Regime,
}

impl TopologyConfig {
    /// The limits a topology accepts.
    fn check(&self) -> Result<()> {
        if self.hosts.is_empty() {
            bail!("a topology needs at least one host");
        }
        for (i, h) in self.hosts.iter().enumerate() {
            if !is_host_name(h) {
                bail!("host name {h:?}: use 1 to 8 lowercase letters or digits");
            }
            if self.hosts[..i].contains(h) {
                bail!("host name {h:?} appears twice");
            }
        }
        if self.links.len() > MAX_LINKS {
            bail!("{} links: at most {MAX_LINKS}", self.links.len());
        }
        let n = self.hosts.len();
        for (i, l) in self.links.iter().enumerate() {
            if l.a >= n || l.b >= n {
                bail!("link {i} joins hosts {} and {}: there are {n}", l.a, l.b);
            }
            if l.a == l.b {
                bail!("link {i} joins host {} to itself", self.hosts[l.a]);
            }
            check_config(&l.as_bed(self.regime)).with_context(|| format!("link {i}"))?;
        }
        Ok(())
    }
}

/// Counters and settings of one link, running or finished.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LinkStats {
    pub link: usize,
    /// Names of the link's `a` and `b` hosts.
    pub a: String,
    pub b: String,
    pub rtt_ms: f64,
    pub rate_bps: Option<u64>,
    pub loss: f64,
    pub blackhole: bool,
    pub queue_bytes: Option<u64>,
    pub mtu: u32,
    pub running: bool,
    /// Whether the link's forwarder runs with SCHED_FIFO.
    pub realtime: bool,
    /// CPU time of the link's forwarder thread (refreshed about every 100 ms).
    pub cpu_s: f64,
    /// From `a` to `b`; bytes are whole IP packets (headers included).
    pub a_to_b: DirStats,
    pub b_to_a: DirStats,
}

impl LinkStats {
    /// IP bytes the link delivered, both directions together.
    pub fn delivered_bytes(&self) -> u64 {
        self.a_to_b.tx_bytes + self.b_to_a.tx_bytes
    }
}

/// A running link: its forwarder and what it left when it stopped.
struct LinkRun {
    shared: Arc<ForwarderState>,
    thread: Option<JoinHandle<io::Result<()>>>,
    error: Option<String>,
}

/// A running topology. Dropping it (also on panic) stops the forwarders, kills processes
/// left in its namespaces and deletes them.
pub struct Topology {
    name: String,
    config: TopologyConfig,
    hosts: Vec<Netns>,
    links: Vec<LinkRun>,
    notes: Vec<String>,
    torn_down: bool,
}

impl Topology {
    /// Creates the hosts, the links' devices and addresses, and starts a forwarder per link.
    /// On failure whatever was made is removed again.
    pub fn up(config: TopologyConfig) -> Result<Topology> {
        can_run().map_err(|e| anyhow!(e))?;
        config.check()?;
        reap_stale();
        let name = format!(
            "fnm-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Relaxed)
        );
        let mut topo = Topology {
            name,
            config,
            hosts: Vec::new(),
            links: Vec::new(),
            notes: Vec::new(),
            torn_down: false,
        };
        // Each link's two TUN devices, [a end, b end], until its forwarder takes them.
        let mut tuns: Vec<[Option<OwnedFd>; 2]> =
            topo.config.links.iter().map(|_| [None, None]).collect();
        let mut core_denied = false;
        for h in 0..topo.config.hosts.len() {
            core_denied |= topo.make_host(h, &mut tuns)?;
        }
        if topo.config.regime == Regime::Tuned && core_denied {
            core_max_notes(&BedOptions::default(), &mut topo.notes)?;
        }
        for (i, [a, b]) in tuns.into_iter().enumerate() {
            let (Some(a), Some(b)) = (a, b) else {
                bail!("link {i}: a TUN device was not created");
            };
            topo.start_link(i, a, b)?;
        }
        Ok(topo)
    }

    /// Creates host `h`'s namespace with its regime, `lo` and one TUN device per link end it
    /// has (left in `tuns`). Returns whether a global `net.core.*` sysctl was refused.
    fn make_host(&mut self, h: usize, tuns: &mut [[Option<OwnedFd>; 2]]) -> Result<bool> {
        let ns = format!("{}-{}", self.name, self.config.hosts[h]);
        if std::path::Path::new("/run/netns").join(&ns).exists() {
            bail!("namespace {ns} already exists");
        }
        ip(&["netns", "add", &ns])?;
        let file = match File::open(format!("/run/netns/{ns}")) {
            Ok(f) => f,
            Err(e) => {
                let _ = delete_netns(&ns);
                return Err(e).with_context(|| format!("opening netns {ns}"));
            }
        };
        self.hosts.push(Netns {
            name: ns.clone(),
            file,
        });
        let ends: Vec<(usize, End)> = self.ends_of(h).collect();
        let sysctls = regime_sysctls(self.config.regime);
        let fd = self.hosts[h].file.as_raw_fd();
        let (fds, notes, core_denied) = run_in_fd(fd, || open_tuns(&ns, &ends, &sysctls))?
            .with_context(|| format!("creating TUN devices in {ns}"))?;
        self.notes.extend(notes);
        for ((link, end), tun) in ends.iter().zip(fds) {
            tuns[*link][*end as usize] = Some(tun);
        }
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        for &(link, end) in &ends {
            let dev = link_device(link);
            let addr = format!("{}/{LINK_PREFIX_LEN}", link_addr(link, end));
            let mtu = self.config.links[link].mtu.to_string();
            ip(&["-n", &ns, "addr", "add", &addr, "dev", &dev])?;
            let up = ["link", "set", &dev, "mtu", &mtu, "txqueuelen", "1000", "up"];
            ip(&[&["-n", &ns][..], &up[..]].concat())?;
        }
        Ok(core_denied)
    }

    /// The link ends host `h` has, in link order.
    fn ends_of(&self, h: usize) -> impl Iterator<Item = (usize, End)> + '_ {
        self.config
            .links
            .iter()
            .enumerate()
            .flat_map(move |(i, l)| {
                let a = (l.a == h).then_some((i, End::A));
                let b = (l.b == h).then_some((i, End::B));
                a.into_iter().chain(b)
            })
    }

    /// Starts link `i`'s forwarder between its `a` and `b` devices.
    fn start_link(&mut self, i: usize, a: OwnedFd, b: OwnedFd) -> Result<()> {
        let link = &self.config.links[i];
        let seed = std::env::var("FERRY_NETEM_SEED")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .map(|s| s.wrapping_add(i as u64));
        let opts = BedOptions {
            seed,
            ..BedOptions::default()
        };
        let name = format!("{}-l{i}", self.name);
        let (shared, thread) =
            start_forwarder(&name, &link.as_bed(self.config.regime), &opts, a, b)?;
        self.links.push(LinkRun {
            shared,
            thread: Some(thread),
            error: None,
        });
        Ok(())
    }

    /// The name prefix: host `h`'s namespace is `<name>-<hosts[h]>`.
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn config(&self) -> &TopologyConfig {
        &self.config
    }
    /// Remarks made while setting up (e.g. sysctls the kernel refused).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }
    /// The index of the host named `name`.
    pub fn host(&self, name: &str) -> Option<usize> {
        self.config.hosts.iter().position(|h| h == name)
    }

    /// The address of `end` of link `link` (the same as [`link_addr`]).
    ///
    /// # Panics
    /// If there is no link `link`.
    pub fn addr(&self, link: usize, end: End) -> Ipv4Addr {
        self.link(link);
        link_addr(link, end)
    }

    /// The address host `host` has on link `link`, if it is one of the link's ends.
    pub fn addr_of(&self, link: usize, host: usize) -> Option<Ipv4Addr> {
        let l = self.config.links.get(link)?;
        match host {
            h if h == l.a => Some(link_addr(link, End::A)),
            h if h == l.b => Some(link_addr(link, End::B)),
            _ => None,
        }
    }

    /// Name of the network namespace of host `host`.
    ///
    /// # Panics
    /// If there is no host `host`.
    pub fn netns(&self, host: usize) -> &str {
        &self.ns(host).name
    }

    fn ns(&self, host: usize) -> &Netns {
        let n = self.hosts.len();
        self.hosts
            .get(host)
            .unwrap_or_else(|| panic!("no host {host} in a topology of {n} hosts"))
    }

    fn link(&self, link: usize) -> &LinkRun {
        let n = self.links.len();
        self.links
            .get(link)
            .unwrap_or_else(|| panic!("no link {link} in a topology of {n} links"))
    }

    /// `ip netns exec <ns> <program>`: add arguments, stdio etc. as usual.
    pub fn command(&self, host: usize, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new(ip_bin());
        c.args(["netns", "exec", self.netns(host)]).arg(program);
        c
    }

    /// Makes `cmd` start inside `host`'s namespace (setns(2) in the child just before exec;
    /// everything else, stdio included, is kept).
    pub fn enter<'c>(&self, host: usize, cmd: &'c mut Command) -> io::Result<&'c mut Command> {
        let fd = Arc::new(self.ns(host).file.try_clone()?);
        // SAFETY: the hook only calls setns(2), which is async-signal-safe.
        unsafe {
            cmd.pre_exec(move || setns_net(fd.as_raw_fd()));
        }
        Ok(cmd)
    }

    /// Spawns `cmd` inside `host`'s namespace, keeping its stdio configuration.
    pub fn spawn_in(&self, host: usize, mut cmd: impl BorrowMut<Command>) -> io::Result<Child> {
        self.enter(host, cmd.borrow_mut())?.spawn()
    }

    /// Runs `f` on a thread inside `host`'s namespace and returns its result; sockets it
    /// creates stay in that namespace.
    pub fn run_in<T: Send, F: FnOnce() -> T + Send>(&self, host: usize, f: F) -> io::Result<T> {
        run_in_fd(self.ns(host).file.as_raw_fd(), f)
    }

    /// Changes link `link`'s loss probability (both directions) at run time.
    pub fn set_loss(&self, link: usize, loss: f64) {
        self.link(link).shared.control.set_loss(loss);
    }
    /// Drops 100% on link `link` while on, without forgetting its loss setting.
    pub fn set_blackhole(&self, link: usize, on: bool) {
        self.link(link).shared.control.set_blackhole(on);
    }
    /// Changes link `link`'s RTT at run time (queued packets keep theirs; never reorders).
    pub fn set_rtt(&self, link: usize, rtt: Duration) {
        let ns = rtt.as_nanos() as u64 / 2;
        self.link(link).shared.control.set_one_way_ns(ns);
    }
    /// Changes link `link`'s rate at run time (None: unlimited).
    pub fn set_rate(&self, link: usize, rate_bps: Option<u64>) {
        let bps = rate_bps.unwrap_or(0);
        self.link(link).shared.control.set_rate_bps(bps);
    }
    /// Changes link `link`'s drop-tail limit (at least one MTU).
    pub fn set_queue_bytes(&self, link: usize, bytes: u64) {
        let run = self.link(link);
        let mtu = self.config.links[link].mtu as u64;
        run.shared.control.set_queue_bytes(bytes.max(mtu));
    }

    /// Current counters and settings of link `link`.
    pub fn link_stats(&self, link: usize) -> LinkStats {
        let run = self.link(link);
        let cfg = &self.config.links[link];
        let c = &run.shared.control;
        let rate = c.rate_bps();
        LinkStats {
            link,
            a: self.config.hosts[cfg.a].clone(),
            b: self.config.hosts[cfg.b].clone(),
            rtt_ms: c.one_way_ns() as f64 * 2.0 / 1e6,
            rate_bps: (rate != 0).then_some(rate),
            loss: c.loss(),
            blackhole: c.blackhole(),
            queue_bytes: (rate != 0).then(|| c.queue_bytes()),
            mtu: cfg.mtu,
            running: run.thread.as_ref().is_some_and(|t| !t.is_finished()),
            realtime: run.shared.realtime.load(Relaxed),
            cpu_s: run.shared.cpu_ns.load(Relaxed) as f64 / 1e9,
            a_to_b: run.shared.c2s.snapshot(),
            b_to_a: run.shared.s2c.snapshot(),
        }
    }

    /// Current counters of every link, in link order.
    pub fn stats(&self) -> Vec<LinkStats> {
        (0..self.links.len()).map(|i| self.link_stats(i)).collect()
    }

    /// Errors of forwarder threads that died, as (link, error).
    pub fn forwarder_errors(&self) -> Vec<(usize, String)> {
        let errs = self.links.iter().enumerate();
        errs.filter_map(|(i, l)| Some((i, l.error.clone()?)))
            .collect()
    }

    /// Tears down now and returns every link's final stats.
    pub fn down(mut self) -> Result<Vec<LinkStats>> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<Vec<LinkStats>> {
        let first = !std::mem::replace(&mut self.torn_down, true);
        for l in &self.links {
            l.shared.control.request_stop();
        }
        for l in &mut self.links {
            if let Some(t) = l.thread.take() {
                l.error = match t.join() {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(e.to_string()),
                    Err(_) => Some("forwarder thread panicked".into()),
                };
            }
        }
        let stats = self.stats();
        let mut errs = Vec::new();
        if let Some(dir) = std::env::var_os("FERRY_NETEM_STATS_DIR").filter(|_| first) {
            if let Ok(text) = serde_json::to_string_pretty(&stats) {
                let path = std::path::Path::new(&dir).join(format!("{}.json", self.name));
                if let Err(e) = std::fs::write(&path, text + "\n") {
                    errs.push(format!("writing {}: {e}", path.display()));
                }
            }
        }
        for ns in &self.hosts {
            if let Err(e) = delete_netns(&ns.name) {
                errs.push(format!("{e:#}"));
            }
        }
        if errs.is_empty() {
            Ok(stats)
        } else {
            Err(anyhow!("teardown of {}: {}", self.name, errs.join("; ")))
        }
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            // Drop cannot return the error; the bed reports the same way.
            eprintln!("ferry-netem: {e:#}");
        }
    }
}

/// Inside a new namespace: IPv6 off (no background noise on the links), the regime's
/// sysctls, and one TUN device per link end in `ends`. Returns the devices in `ends`' order,
/// notes on sysctls it could not set, and whether a global `net.core.*` one was refused.
fn open_tuns(
    ns: &str,
    ends: &[(usize, End)],
    sysctls: &[(String, String)],
) -> io::Result<(Vec<OwnedFd>, Vec<String>, bool)> {
    let _ = write_sysctl("net.ipv6.conf.default.disable_ipv6", "1");
    let fds = ends
        .iter()
        .map(|&(link, _)| open_tun(&link_device(link)))
        .collect::<io::Result<Vec<_>>>()?;
    let (notes, core_denied) = apply_sysctls(ns, sysctls);
    Ok((fds, notes, core_denied))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(hosts: &[&str], links: &[(usize, usize)]) -> TopologyConfig {
        TopologyConfig {
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            links: links
                .iter()
                .map(|&(a, b)| LinkConfig::new(a, b, Duration::from_millis(1), None))
                .collect(),
            regime: Regime::Default,
        }
    }

    #[test]
    fn addresses_are_one_subnet_per_link() {
        assert_eq!(link_addr(0, End::A), Ipv4Addr::new(10, 78, 0, 1));
        assert_eq!(link_addr(7, End::B), Ipv4Addr::new(10, 78, 7, 2));
        assert_eq!(link_addr(255, End::A), Ipv4Addr::new(10, 78, 255, 1));
        assert_eq!(link_device(12), "fl12");
    }

    #[test]
    fn bad_configs_are_refused_with_a_reason() {
        let refuse = |c: TopologyConfig, why: &str| {
            let e = format!("{:#}", c.check().expect_err(why));
            assert!(e.contains(why), "{e:?} should say {why:?}");
        };
        assert!(cfg(&["c", "a", "b"], &[(0, 1), (0, 2), (1, 2), (1, 2)])
            .check()
            .is_ok());
        refuse(cfg(&[], &[]), "at least one host");
        refuse(cfg(&["c", "c"], &[]), "twice");
        refuse(cfg(&["C"], &[]), "lowercase");
        refuse(cfg(&["a-b"], &[]), "lowercase");
        refuse(cfg(&["waytoolong"], &[]), "lowercase");
        refuse(cfg(&["c", "a"], &[(0, 2)]), "there are 2");
        refuse(cfg(&["c", "a"], &[(1, 1)]), "to itself");
        refuse(cfg(&["c", "a"], &vec![(0, 1); MAX_LINKS + 1]), "at most");
        let mut c = cfg(&["c", "a"], &[(0, 1)]);
        c.links[0].loss = 2.0;
        refuse(c, "loss");
        let mut c = cfg(&["c", "a"], &[(0, 1)]);
        c.links[0].rate_bps = Some(0);
        refuse(c, "rate 0");
    }
}
