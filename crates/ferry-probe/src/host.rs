//! `ferry probe host`: CPUs, NUMA, NICs and their IRQs, TCP settings, digest and cipher speeds.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use ferry_units::units::{format_bytes as bytes, format_mbps, format_thousands as num, KIB, MIB};
use serde::Serialize;

use crate::cpulist::{format_cpulist, parse_cpulist};
use crate::interrupts::{irq_conflicts, parse_interrupts, Interrupts, IrqConflict};
use crate::routes::{read_routes, route_advice, Route};
use crate::speed::{measure_speeds, Speed};
use crate::sys::{Sys, Unreadable};
use crate::tcp::{tcp_advice, AdviceInputs, TcpSettings, TCP_FILES};
use crate::ProbeProgress;

/// What `probe_host` does and against what it advises.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HostOptions {
    /// Where /proc and /sys are found: `/` on a real system (tests use a fake tree).
    pub sys_root: PathBuf,
    /// Round-trip time the TCP advice is computed for (ms).
    pub rtt_ms: f64,
    /// Rate a transfer should reach (Mbit/s); `None`: the fastest NIC that is up, else 10 Gbit/s.
    pub target_mbps: Option<f64>,
    /// Measure digest and AES-GCM speeds.
    pub measure_speeds: bool,
    /// Bytes hashed or sealed per pass.
    pub speed_bytes: usize,
    /// Passes per speed; the median is reported.
    pub speed_passes: u32,
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            sys_root: PathBuf::from("/"),
            rtt_ms: 100.0,
            target_mbps: None,
            measure_speeds: true,
            speed_bytes: 64 << 20,
            speed_passes: 3,
        }
    }
}

impl HostOptions {
    /// Smaller speed measurements (8 MiB, one pass): well under a second.
    pub fn quick() -> Self {
        HostOptions {
            speed_bytes: 8 << 20,
            speed_passes: 1,
            ..Self::default()
        }
    }
}

/// CPUs as the kernel reports them.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct CpuInfo {
    pub model: Option<String>,
    /// CPUs this process may run on (`std::thread::available_parallelism`: affinity and cgroup
    /// quotas applied).
    pub usable: usize,
    /// CPUs online (`/sys/devices/system/cpu/online`).
    pub online: Vec<usize>,
    /// Distinct physical packages among online CPUs.
    pub sockets: Option<usize>,
    /// Distinct physical cores among online CPUs.
    pub cores: Option<usize>,
    /// Instruction-set features that matter to ferry's digests and ciphers, as /proc/cpuinfo
    /// names them (`aes`, `pclmulqdq`, `vaes`, `avx2`, `avx512f`, `sha_ni`; `aes`, `pmull`,
    /// `sha2` on Arm).
    pub features: Vec<String>,
    /// cpufreq governor and driver of CPU 0, where cpufreq is exposed.
    pub governor: Option<String>,
    pub freq_driver: Option<String>,
}

/// A NUMA node.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct NumaNode {
    pub id: u32,
    pub cpus: Vec<usize>,
    /// Memory of the node (bytes).
    pub mem_total: Option<u64>,
}

/// One interrupt of a NIC.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct NicIrq {
    pub irq: u32,
    /// Handler name from /proc/interrupts, e.g. `"eth0-TxRx-3"`.
    pub name: Option<String>,
    /// `/proc/irq/N/smp_affinity_list`.
    pub affinity: Option<Vec<usize>>,
    /// `/proc/irq/N/effective_affinity_list` (the CPUs actually targeted, kernel ≥ 4.15).
    pub effective_affinity: Option<Vec<usize>>,
    /// Interrupts so far, all CPUs.
    pub count: u64,
    /// `(cpu, count)` of each CPU that handled it at least once.
    pub per_cpu: Vec<(usize, u64)>,
}

/// A network interface.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Nic {
    pub name: String,
    /// No device behind it (loopback, bridge, veth, ifb, …).
    pub is_virtual: bool,
    pub driver: Option<String>,
    /// Bus address of the device, e.g. `"0000:00:03.0"`.
    pub bus_id: Option<String>,
    pub operstate: Option<String>,
    /// Link speed (Mbit/s) when the driver reports one.
    pub speed_mbps: Option<u64>,
    pub mtu: Option<u32>,
    pub numa_node: Option<u32>,
    pub rx_queues: usize,
    pub tx_queues: usize,
    pub irqs: Vec<NicIrq>,
}

/// Everything `probe_host` found.
#[derive(Debug, Clone, Serialize)]
pub struct HostReport {
    pub hostname: Option<String>,
    pub kernel: Option<String>,
    pub cpu: CpuInfo,
    pub numa_nodes: Vec<NumaNode>,
    pub nics: Vec<Nic>,
    pub irq_conflicts: Vec<IrqConflict>,
    /// Whether an `irqbalance` process runs (`None`: /proc could not be scanned).
    pub irqbalance_running: Option<bool>,
    pub tcp: TcpSettings,
    /// The main table's routes with their initial windows (empty when not read: a probe of a
    /// fake /proc tree, or no `ip`).
    pub routes: Vec<Route>,
    /// What the advice was computed against.
    pub advice_inputs: AdviceInputs,
    /// Per-core speeds (empty when not measured).
    pub speeds: Vec<Speed>,
    /// Concrete advice, one sentence each, most important first.
    pub advice: Vec<String>,
    /// Remarks on what was measured or assumed.
    pub notes: Vec<String>,
    /// What could not be read (the probe goes on without it).
    pub unreadable: Vec<Unreadable>,
}

/// Probes this host. Never fails: whatever cannot be read is listed in `unreadable` and the rest
/// is still reported.
pub fn probe_host(opts: &HostOptions, progress: &dyn ProbeProgress) -> HostReport {
    let mut sys = Sys::new(&opts.sys_root);
    let mut notes = Vec::new();

    progress.on_step("cpus and NUMA nodes");
    let hostname = sys
        .read("/proc/sys/kernel/hostname", "host name")
        .map(|s| s.trim().to_string());
    let kernel = sys
        .read("/proc/sys/kernel/osrelease", "kernel release")
        .map(|s| s.trim().to_string());
    let cpu = read_cpus(&mut sys);
    let numa_nodes = read_numa(&mut sys);
    if numa_nodes.is_empty() {
        notes.push("no NUMA information (/sys/devices/system/node): taken as one node".into());
    }

    progress.on_step("NICs and interrupts");
    let interrupts = sys
        .read("/proc/interrupts", "interrupt counts")
        .map(|t| parse_interrupts(&t))
        .unwrap_or_default();
    let nics = read_nics(&mut sys, &interrupts);
    let online = if cpu.online.is_empty() {
        (0..cpu.usable).collect()
    } else {
        cpu.online.clone()
    };
    let conflicts = irq_conflicts(&nics, &numa_nodes, &online);
    let irqbalance_running = irqbalance_running(&sys);

    progress.on_step("TCP settings");
    let tcp = read_tcp(&mut sys, &mut notes);
    let target_mbps = target_mbps(opts, &nics, &mut notes);
    let advice_inputs = AdviceInputs {
        rtt_ms: opts.rtt_ms,
        target_mbps,
    };

    let speeds = if opts.measure_speeds {
        measure_speeds(opts.speed_bytes, opts.speed_passes, progress)
    } else {
        Vec::new()
    };
    if !speeds.is_empty() {
        notes.push(format!(
            "speeds: one thread, in memory, median of {} pass{} over {}",
            opts.speed_passes.max(1),
            if opts.speed_passes > 1 { "es" } else { "" },
            bytes(opts.speed_bytes as u64)
        ));
    }

    // Routes live in the kernel's routing table, not under /proc: only a probe of this host
    // reads them.
    let routes = if opts.sys_root == Path::new("/") {
        progress.on_step("routes");
        read_routes().unwrap_or_else(|why| {
            notes.push(format!(
                "routes not read ({why}): no advice on initial windows"
            ));
            Vec::new()
        })
    } else {
        Vec::new()
    };

    let mut advice = tcp_advice(&tcp, &advice_inputs);
    advice.extend(route_advice(&routes, &advice_inputs, |dev| {
        nics.iter().find(|n| n.name == dev).and_then(|n| n.mtu)
    }));
    advice.extend(conflicts.iter().map(|c| c.text.clone()));
    advice.extend(host_advice(&cpu, &numa_nodes, &nics, &speeds, target_mbps));

    HostReport {
        hostname,
        kernel,
        cpu,
        numa_nodes,
        nics,
        irq_conflicts: conflicts,
        irqbalance_running,
        tcp,
        routes,
        advice_inputs,
        speeds,
        advice,
        notes,
        unreadable: sys.unreadable,
    }
}

/// The TCP settings under /proc/sys; those that do not parse are noted.
fn read_tcp(sys: &mut Sys, notes: &mut Vec<String>) -> TcpSettings {
    let mut tcp = TcpSettings::default();
    for &(field, path) in TCP_FILES {
        if let Some(text) = sys.read(path, "TCP setting") {
            if !tcp.set(field, &text) {
                notes.push(format!("{path}: could not parse {:?}", text.trim()));
            }
        }
    }
    tcp
}

/// The rate the advice aims at: the one asked for, else the fastest NIC that is up, else
/// 10 Gbit/s (noted).
fn target_mbps(opts: &HostOptions, nics: &[Nic], notes: &mut Vec<String>) -> f64 {
    let fastest = nics
        .iter()
        .filter(|n| !n.is_virtual && n.operstate.as_deref() == Some("up"))
        .filter_map(|n| n.speed_mbps)
        .max();
    match (opts.target_mbps, fastest) {
        (Some(t), _) => t,
        (None, Some(s)) => s as f64,
        (None, None) => {
            notes.push(
                "no NIC that is up reports a link speed (virtual NICs often do not): advice \
                 assumes a 10 Gbit/s target"
                    .into(),
            );
            10_000.0
        }
    }
}

const X86_FEATURES: &[&str] = &[
    "aes",
    "pclmulqdq",
    "vaes",
    "vpclmulqdq",
    "avx2",
    "avx512f",
    "sha_ni",
];
const ARM_FEATURES: &[&str] = &["aes", "pmull", "sha2", "sha3", "asimd", "sve"];

fn read_cpus(sys: &mut Sys) -> CpuInfo {
    let usable = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let online = sys
        .read("/sys/devices/system/cpu/online", "online CPUs")
        .and_then(|s| parse_cpulist(&s))
        .unwrap_or_default();
    let mut packages = BTreeSet::new();
    let mut cores = BTreeSet::new();
    let mut topology_ok = !online.is_empty();
    for &c in &online {
        let dir = sys.path(&format!("/sys/devices/system/cpu/cpu{c}/topology"));
        let pkg = sys.read_opt(&dir.join("physical_package_id"));
        let core = sys.read_opt(&dir.join("core_id"));
        match (pkg, core) {
            (Some(p), Some(k)) => {
                packages.insert(p.clone());
                cores.insert((p, k));
            }
            _ => topology_ok = false,
        }
    }
    let (mut model, mut features) = (None, Vec::new());
    if let Some(info) = sys.read("/proc/cpuinfo", "CPU model and features") {
        for line in info.lines() {
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            let (k, v) = (k.trim(), v.trim());
            if model.is_none() && (k == "model name" || k == "Model" || k == "cpu model") {
                model = Some(v.to_string());
            }
            if features.is_empty() && (k == "flags" || k == "Features") {
                let have: BTreeSet<&str> = v.split_whitespace().collect();
                let wanted = if k == "flags" {
                    X86_FEATURES
                } else {
                    ARM_FEATURES
                };
                features = wanted
                    .iter()
                    .filter(|f| have.contains(*f))
                    .map(|f| f.to_string())
                    .collect();
            }
        }
    }
    let freq = sys.path("/sys/devices/system/cpu/cpu0/cpufreq");
    CpuInfo {
        model,
        usable,
        online,
        sockets: topology_ok.then_some(packages.len()),
        cores: topology_ok.then_some(cores.len()),
        features,
        governor: sys.read_opt(&freq.join("scaling_governor")),
        freq_driver: sys.read_opt(&freq.join("scaling_driver")),
    }
}

pub(crate) fn read_numa(sys: &mut Sys) -> Vec<NumaNode> {
    let dir = sys.path("/sys/devices/system/node");
    let mut nodes = Vec::new();
    for name in sys.list_opt(&dir) {
        let Some(id) = name
            .strip_prefix("node")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let p = dir.join(&name);
        let cpus = sys
            .read_path(&p.join("cpulist"), "NUMA node CPUs")
            .and_then(|s| parse_cpulist(&s))
            .unwrap_or_default();
        let mem_total = sys.read_opt(&p.join("meminfo")).and_then(|m| {
            m.lines()
                .find(|l| l.contains("MemTotal:"))
                .and_then(|l| l.split_whitespace().rev().nth(1)?.parse::<u64>().ok())
                .map(|kib| kib * KIB)
        });
        nodes.push(NumaNode {
            id,
            cpus,
            mem_total,
        });
    }
    nodes.sort_by_key(|n| n.id);
    nodes
}

/// Whether `action` (an interrupt handler name) belongs to a device named `dev`: equal, or
/// `dev` followed by a separator (`eth0-TxRx-0`, `virtio2-input.0`, `mlx5_comp0@pci:…`).
fn action_matches(action: &str, dev: &str) -> bool {
    if dev.is_empty() {
        return false;
    }
    match action.strip_prefix(dev) {
        Some("") => true,
        Some(rest) => rest.starts_with(|c: char| !c.is_ascii_alphanumeric()),
        None => false,
    }
}

fn read_nics(sys: &mut Sys, interrupts: &Interrupts) -> Vec<Nic> {
    let Some(names) = sys.list("/sys/class/net", "network interfaces") else {
        return Vec::new();
    };
    let mut nics = Vec::new();
    for name in names {
        let base = sys.path(&format!("/sys/class/net/{name}"));
        let dev = base.join("device");
        let mut nic = Nic {
            name: name.clone(),
            is_virtual: !dev.exists(),
            operstate: sys.read_opt(&base.join("operstate")),
            speed_mbps: sys
                .read_opt(&base.join("speed"))
                .and_then(|s| s.parse::<i64>().ok())
                .filter(|&s| s > 0)
                .map(|s| s as u64),
            mtu: sys.read_opt(&base.join("mtu")).and_then(|s| s.parse().ok()),
            ..Nic::default()
        };
        let queues = sys.list_opt(&base.join("queues"));
        nic.rx_queues = queues.iter().filter(|q| q.starts_with("rx-")).count();
        nic.tx_queues = queues.iter().filter(|q| q.starts_with("tx-")).count();
        if !nic.is_virtual {
            read_nic_device(sys, interrupts, &mut nic, &dev);
        }
        nics.push(nic);
    }
    // Physical first, then by name.
    nics.sort_by(|a, b| (a.is_virtual, &a.name).cmp(&(b.is_virtual, &b.name)));
    nics
}

/// A NIC's bus device (`/sys/class/net/NAME/device`, followed) and the NUMA node it hangs off,
/// if the kernel says: virtio-net's device is `virtio2` below the PCI function, and the PCI
/// function holds `numa_node` (and `msi_irqs`).
pub(crate) fn device_numa_node(sys: &Sys, dev: &Path) -> (std::path::PathBuf, Option<u32>) {
    let real = std::fs::canonicalize(dev).unwrap_or_else(|_| dev.to_path_buf());
    let bus_dev = [Some(real.as_path()), real.parent()]
        .into_iter()
        .flatten()
        .find(|p| p.join("numa_node").exists() || p.join("msi_irqs").exists())
        .unwrap_or(real.as_path())
        .to_path_buf();
    let node = sys
        .read_opt(&bus_dev.join("numa_node"))
        .and_then(|s| s.parse::<i64>().ok())
        .filter(|&n| n >= 0)
        .map(|n| n as u32);
    (bus_dev, node)
}

fn read_nic_device(sys: &mut Sys, interrupts: &Interrupts, nic: &mut Nic, dev: &Path) {
    let real = std::fs::canonicalize(dev).unwrap_or_else(|_| dev.to_path_buf());
    nic.driver = std::fs::read_link(dev.join("driver"))
        .ok()
        .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()));
    let (bus_dev, node) = device_numa_node(sys, dev);
    let dev_name = real
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let bus_id = bus_dev
        .file_name()
        .map(|f| f.to_string_lossy().into_owned());
    nic.numa_node = node;

    let mut irqs: BTreeSet<u32> = sys
        .list_opt(&bus_dev.join("msi_irqs"))
        .iter()
        .filter_map(|s| s.parse().ok())
        .collect();
    for line in &interrupts.lines {
        let Some(n) = line.irq else { continue };
        let ours = line.actions.iter().any(|a| {
            action_matches(a, &nic.name)
                || action_matches(a, &dev_name)
                || bus_id.as_deref().is_some_and(|b| a.contains(b))
        });
        if ours {
            irqs.insert(n);
        }
    }
    nic.bus_id = bus_id;
    for n in irqs {
        let line = interrupts.irq(n);
        let dir = format!("/proc/irq/{n}");
        let affinity = sys
            .read(&format!("{dir}/smp_affinity_list"), "IRQ affinity")
            .and_then(|s| parse_cpulist(&s));
        let effective = sys
            .read_opt(&sys.path(&format!("{dir}/effective_affinity_list")))
            .and_then(|s| parse_cpulist(&s));
        nic.irqs.push(NicIrq {
            irq: n,
            name: line.map(|l| l.actions.join(", ")).filter(|s| !s.is_empty()),
            affinity,
            effective_affinity: effective,
            count: line.map(|l| l.total()).unwrap_or(0),
            per_cpu: line
                .map(|l| interrupts.cpus_with_counts(l))
                .unwrap_or_default(),
        });
    }
}

fn irqbalance_running(sys: &Sys) -> Option<bool> {
    let proc_dir = sys.path("/proc");
    let rd = std::fs::read_dir(proc_dir).ok()?;
    for e in rd.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Ok(comm) = std::fs::read_to_string(e.path().join("comm")) {
            if comm.trim() == "irqbalance" {
                return Some(true);
            }
        }
    }
    Some(false)
}

fn host_advice(
    cpu: &CpuInfo,
    nodes: &[NumaNode],
    nics: &[Nic],
    speeds: &[Speed],
    target_mbps: f64,
) -> Vec<String> {
    let mut out = Vec::new();
    let target_mib = target_mbps * 1e6 / 8.0 / MIB as f64;
    let target_text = format!(
        "{} ({} MiB/s)",
        if target_mbps >= 1000.0 {
            format!("{} Gbit/s", num(target_mbps / 1000.0))
        } else {
            format!("{} Mbit/s", num(target_mbps))
        },
        num(target_mib)
    );
    for s in speeds {
        if s.mib_per_s >= target_mib {
            continue;
        }
        match s.name.as_str() {
            "xxh3-128" => out.push(format!(
                "the block digest (XXH3-128) runs at {} MiB/s per core, below {target_text}: \
                 each stream's blocks are checked on one core",
                num(s.mib_per_s)
            )),
            "aes-256-gcm seal" | "aes-256-gcm open" => {
                let cores = (target_mib / s.mib_per_s).ceil();
                let side = if s.name.ends_with("seal") {
                    "sending"
                } else {
                    "receiving"
                };
                out.push(format!(
                    "AES-256-GCM {} runs at {} MiB/s per core: TLS at {target_text} needs about \
                     {cores} cores for {side}, spread over parallel streams",
                    s.name.trim_start_matches("aes-256-gcm "),
                    num(s.mib_per_s),
                ));
            }
            algo => out.push(format!(
                "{algo} runs at {} MiB/s per core, below {target_text}: with --checksum {algo} \
                 one large file moves at most near {} MiB/s (a file is hashed by one thread); \
                 many files in flight hash in parallel",
                num(s.mib_per_s),
                num(s.mib_per_s)
            )),
        }
    }
    if nodes.len() > 1 {
        for nic in nics.iter().filter(|n| !n.is_virtual) {
            if let Some(node) = nic.numa_node {
                out.push(format!(
                    "{} is on NUMA node {node}: run ferry there (numactl --cpunodebind={node} \
                     --membind={node} ferry …)",
                    nic.name
                ));
            }
        }
    }
    for nic in nics.iter().filter(|n| !n.is_virtual) {
        if let (Some(speed), Some(mtu)) = (nic.speed_mbps, nic.mtu) {
            if speed >= 10_000 && mtu < 9000 {
                out.push(format!(
                    "{} runs at {} Gbit/s with MTU {mtu}: jumbo frames (MTU 9000) cut the \
                     per-packet CPU cost, if every hop of the path supports them",
                    nic.name,
                    speed / 1000
                ));
            }
        }
    }
    if cpu.governor.as_deref() == Some("powersave")
        && !matches!(
            cpu.freq_driver.as_deref(),
            Some("intel_pstate") | Some("amd-pstate-epp")
        )
    {
        out.push(
            "the cpufreq governor is powersave: digests and TLS run at a low clock; cpupower \
             frequency-set -g performance (or schedutil)"
                .into(),
        );
    }
    out
}

fn onoff(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "on",
        Some(false) => "off",
        None => "?",
    }
}

fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map_or("?".into(), |v| v.to_string())
}

impl HostReport {
    /// A plain-text report for a terminal (no colours).
    pub fn render_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "host {} (kernel {})",
            opt(&self.hostname),
            opt(&self.kernel)
        );
        self.render_cpu(&mut s);
        self.render_nics(&mut s);
        self.render_tcp(&mut s);
        self.render_advice(&mut s);
        s
    }

    /// CPUs, their features and frequency governor, NUMA nodes.
    fn render_cpu(&self, s: &mut String) {
        let c = &self.cpu;
        s.push_str("\ncpu\n");
        let _ = writeln!(s, "  model        {}", opt(&c.model));
        let _ = writeln!(
            s,
            "  cpus         {} usable, {} online ({}); {} socket(s), {} core(s)",
            c.usable,
            c.online.len(),
            format_cpulist(&c.online),
            opt(&c.sockets),
            opt(&c.cores)
        );
        let _ = writeln!(
            s,
            "  features     {}",
            if c.features.is_empty() {
                "none of aes, pclmulqdq, avx2, sha_ni found".to_string()
            } else {
                c.features.join(" ")
            }
        );
        if c.governor.is_some() {
            let _ = writeln!(
                s,
                "  cpufreq      {} ({})",
                opt(&c.governor),
                opt(&c.freq_driver)
            );
        }
        for n in &self.numa_nodes {
            let _ = writeln!(
                s,
                "  numa node {:<2} cpus {}{}",
                n.id,
                format_cpulist(&n.cpus),
                n.mem_total
                    .map(|m| format!(", {} memory", bytes(m)))
                    .unwrap_or_default()
            );
        }
    }

    /// Physical NICs with their interrupts, virtual ones in a line, IRQ affinity conflicts.
    fn render_nics(&self, s: &mut String) {
        s.push_str("\nnics\n");
        for n in self.nics.iter().filter(|n| !n.is_virtual) {
            let _ = writeln!(
                s,
                "  {:<12} {}, {}, mtu {}, numa node {}, queues rx {} tx {}, driver {} ({})",
                n.name,
                opt(&n.operstate),
                n.speed_mbps
                    .map(|v| format!("{v} Mbit/s"))
                    .unwrap_or("speed unknown".into()),
                opt(&n.mtu),
                n.numa_node.map_or("-".into(), |v| v.to_string()),
                n.rx_queues,
                n.tx_queues,
                opt(&n.driver),
                opt(&n.bus_id)
            );
            render_irqs(s, &n.irqs);
        }
        let virt: Vec<String> = self
            .nics
            .iter()
            .filter(|n| n.is_virtual)
            .map(|n| format!("{} ({})", n.name, opt(&n.operstate)))
            .collect();
        if !virt.is_empty() {
            let _ = writeln!(s, "  virtual      {}", virt.join(", "));
        }
        let _ = writeln!(
            s,
            "  irq affinity {}; irqbalance {}",
            if self.irq_conflicts.is_empty() {
                "no conflicts".to_string()
            } else {
                format!("{} conflict(s), see advice", self.irq_conflicts.len())
            },
            match self.irqbalance_running {
                Some(true) => "running",
                Some(false) => "not running",
                None => "unknown",
            }
        );
    }

    /// The TCP settings and what one stream can carry with them.
    fn render_tcp(&self, s: &mut String) {
        let t = &self.tcp;
        let triple = |v: &Option<[u64; 3]>| {
            v.map_or("?".into(), |[a, b, c]| {
                format!("{a} {b} {c}  (max {})", bytes(c))
            })
        };
        s.push_str("\ntcp\n");
        let _ = writeln!(s, "  tcp_rmem           {}", triple(&t.tcp_rmem));
        let _ = writeln!(s, "  tcp_wmem           {}", triple(&t.tcp_wmem));
        let _ = writeln!(
            s,
            "  core rmem/wmem_max {} / {}",
            t.core_rmem_max.map_or("?".into(), bytes),
            t.core_wmem_max.map_or("?".into(), bytes)
        );
        let _ = writeln!(
            s,
            "  congestion         {} (available: {}; allowed: {})",
            opt(&t.congestion_control),
            t.available_congestion_control.join(" "),
            t.allowed_congestion_control.join(" ")
        );
        let _ = writeln!(
            s,
            "  default qdisc      {}; window scaling {}, rcvbuf autotuning {}, slow start after idle {}",
            opt(&t.default_qdisc),
            onoff(t.window_scaling),
            onoff(t.moderate_rcvbuf),
            onoff(t.slow_start_after_idle)
        );
        if let Some(fo) = t.fastopen {
            let side = |bit: u32| if fo & bit != 0 { "on" } else { "off" };
            let _ = writeln!(
                s,
                "  TCP Fast Open      client {}, server {} (net.ipv4.tcp_fastopen={fo})",
                side(1),
                side(2)
            );
        }
        if let Some([_, _, max]) = t.tcp_wmem {
            if max > 0 {
                let _ = writeln!(
                    s,
                    "  one stream at {} ms: sends ≤ {} Mbit/s{}",
                    self.advice_inputs.rtt_ms,
                    num(crate::tcp::stream_cap_mbps(max, self.advice_inputs.rtt_ms).floor()),
                    t.tcp_rmem
                        .map(|r| format!(
                            ", receives ≤ {} Mbit/s",
                            num(crate::tcp::stream_cap_mbps(r[2], self.advice_inputs.rtt_ms)
                                .floor())
                        ))
                        .unwrap_or_default()
                );
            }
        }
    }

    /// Per-core speeds, advice, notes, and what could not be read.
    fn render_advice(&self, s: &mut String) {
        if !self.speeds.is_empty() {
            s.push_str("\nper-core speed (MiB/s)\n");
            for sp in &self.speeds {
                let _ = writeln!(
                    s,
                    "  {:<18} {:>8}   {}",
                    sp.name,
                    num(sp.mib_per_s),
                    sp.role
                );
            }
        }

        let _ = writeln!(
            s,
            "\nadvice (for {} ms RTT, target {})",
            self.advice_inputs.rtt_ms,
            format_mbps(self.advice_inputs.target_mbps)
        );
        if self.advice.is_empty() {
            s.push_str("  nothing to change\n");
        }
        for a in &self.advice {
            let _ = writeln!(s, "  - {a}");
        }
        if !self.notes.is_empty() {
            s.push_str("\nnotes\n");
            for n in &self.notes {
                let _ = writeln!(s, "  - {n}");
            }
        }
        if !self.unreadable.is_empty() {
            s.push_str("\ncould not read\n");
            for u in self.unreadable.iter().take(12) {
                let _ = writeln!(s, "  - {} ({}): {}", u.path, u.what, u.error);
            }
            if self.unreadable.len() > 12 {
                let _ = writeln!(s, "  - … and {} more", self.unreadable.len() - 12);
            }
        }
    }
}

/// One line per interrupt of a NIC: its affinity and counts per CPU.
fn render_irqs(s: &mut String, irqs: &[NicIrq]) {
    for i in irqs {
        let aff = i
            .affinity
            .as_ref()
            .map_or("?".into(), |a| format_cpulist(a));
        let eff = i.effective_affinity.as_ref().map_or(String::new(), |a| {
            format!(" (effective {})", format_cpulist(a))
        });
        let on: Vec<String> = i
            .per_cpu
            .iter()
            .map(|(c, n)| format!("cpu{c}:{n}"))
            .collect();
        let _ = writeln!(
            s,
            "    irq {:<5} {:<22} affinity {aff}{eff}, {} interrupts{}",
            i.irq,
            opt(&i.name),
            i.count,
            if on.is_empty() {
                String::new()
            } else {
                format!(" ({})", on.join(" "))
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_match_devices() {
        assert!(action_matches("eth0-TxRx-0", "eth0"));
        assert!(action_matches("eth0", "eth0"));
        assert!(!action_matches("eth01-rx", "eth0"));
        assert!(action_matches("virtio2-input.0", "virtio2"));
        assert!(!action_matches("virtio20-input.0", "virtio2"));
        assert!(!action_matches("x", ""));
    }

    #[test]
    fn advice_on_slow_digests() {
        let speeds = vec![
            Speed {
                name: "md5".into(),
                role: String::new(),
                mib_per_s: 431.0,
            },
            Speed {
                name: "blake3".into(),
                role: String::new(),
                mib_per_s: 3062.0,
            },
            Speed {
                name: "aes-256-gcm seal".into(),
                role: String::new(),
                mib_per_s: 900.0,
            },
        ];
        let a = host_advice(&CpuInfo::default(), &[], &[], &speeds, 10_000.0);
        assert_eq!(a.len(), 2, "{a:?}");
        assert!(a[0].starts_with("md5 runs at 431 MiB/s per core, below 10 Gbit/s (1,192 MiB/s)"));
        assert!(a[1].contains("needs about 2 cores for sending"), "{}", a[1]);
    }

    /// A fake /sys and /proc: one PCI NIC on NUMA node 1 whose queue IRQs are all on node 0.
    #[test]
    fn fake_tree() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let w = |p: &str, text: &str| {
            let p = r.join(p.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        w("/proc/sys/kernel/hostname", "dtn1\n");
        w("/sys/devices/system/cpu/online", "0-3\n");
        for c in 0..4 {
            let d = format!("/sys/devices/system/cpu/cpu{c}/topology");
            w(&format!("{d}/physical_package_id"), &format!("{}\n", c / 2));
            w(&format!("{d}/core_id"), &format!("{}\n", c % 2));
        }
        w("/sys/devices/system/node/node0/cpulist", "0-1\n");
        w("/sys/devices/system/node/node1/cpulist", "2-3\n");
        w(
            "/sys/devices/system/node/node1/meminfo",
            "Node 1 MemTotal:       1024 kB\n",
        );
        w(
            "/proc/cpuinfo",
            "model name\t: Test CPU\nflags\t\t: fpu aes avx2 sha_ni\n",
        );
        w(
            "/proc/interrupts",
            "      CPU0  CPU1  CPU2  CPU3\n\
             70:   10  0  0  0  PCI-MSI 1-edge  eth0-TxRx-0\n\
             71:   20  0  0  0  PCI-MSI 2-edge  eth0-TxRx-1\n\
             72:    0  0  0  0  PCI-MSI 3-edge  eth0-config\n",
        );
        let pci = "/sys/devices/pci0000:80/0000:81:00.0";
        w(&format!("{pci}/numa_node"), "1\n");
        for i in 70..73 {
            w(&format!("{pci}/msi_irqs/{i}"), "msix\n");
            w(&format!("/proc/irq/{i}/smp_affinity_list"), "0-3\n");
            w(&format!("/proc/irq/{i}/effective_affinity_list"), "0\n");
        }
        w("/sys/bus/pci/drivers/ice/bind", "");
        std::os::unix::fs::symlink(
            r.join("sys/bus/pci/drivers/ice"),
            r.join(pci.trim_start_matches('/')).join("driver"),
        )
        .unwrap();
        w("/sys/class/net/eth0/speed", "25000\n");
        w("/sys/class/net/eth0/operstate", "up\n");
        w("/sys/class/net/eth0/mtu", "1500\n");
        w("/sys/class/net/eth0/queues/rx-0/x", "");
        w("/sys/class/net/eth0/queues/tx-0/x", "");
        std::os::unix::fs::symlink(
            r.join(pci.trim_start_matches('/')),
            r.join("sys/class/net/eth0/device"),
        )
        .unwrap();
        w("/sys/class/net/lo/operstate", "unknown\n");
        w("/proc/sys/net/ipv4/tcp_wmem", "4096 16384 4194304\n");
        w("/proc/sys/net/ipv4/tcp_rmem", "4096 131072 6291456\n");

        let opts = HostOptions {
            sys_root: r.to_path_buf(),
            measure_speeds: false,
            ..HostOptions::default()
        };
        let rep = probe_host(&opts, &crate::NoProgress);
        assert_eq!(rep.hostname.as_deref(), Some("dtn1"));
        assert_eq!(rep.cpu.online, vec![0, 1, 2, 3]);
        assert_eq!(rep.cpu.sockets, Some(2));
        assert_eq!(rep.cpu.cores, Some(4));
        assert_eq!(rep.cpu.model.as_deref(), Some("Test CPU"));
        assert_eq!(rep.cpu.features, vec!["aes", "avx2", "sha_ni"]);
        assert_eq!(rep.numa_nodes.len(), 2);
        assert_eq!(rep.numa_nodes[1].mem_total, Some(1 << 20));

        assert_eq!(rep.nics.len(), 2);
        let eth0 = &rep.nics[0];
        assert_eq!(eth0.name, "eth0");
        assert!(!eth0.is_virtual);
        assert!(rep.nics[1].is_virtual);
        assert_eq!(eth0.speed_mbps, Some(25_000));
        assert_eq!(eth0.numa_node, Some(1));
        assert_eq!(eth0.driver.as_deref(), Some("ice"));
        assert_eq!(eth0.bus_id.as_deref(), Some("0000:81:00.0"));
        assert_eq!(eth0.irqs.len(), 3);
        assert_eq!(eth0.irqs[1].effective_affinity, Some(vec![0]));
        assert_eq!(eth0.irqs[1].count, 20);

        // Cross-NUMA (node 1 NIC, handled on CPU 0) and stacked (two queues on CPU 0).
        let kinds: Vec<_> = rep.irq_conflicts.iter().map(|c| c.kind).collect();
        assert_eq!(
            kinds,
            vec![
                crate::interrupts::IrqConflictKind::CrossNuma,
                crate::interrupts::IrqConflictKind::Stacked
            ]
        );
        assert_eq!(rep.advice_inputs.target_mbps, 25_000.0);
        assert!(rep
            .advice
            .iter()
            .any(|a| a.starts_with("tcp_wmem max is 4 MiB")));
        assert!(rep
            .advice
            .iter()
            .any(|a| a.contains("numactl --cpunodebind=1")));
        assert!(rep.advice.iter().any(|a| a.contains("jumbo frames")));
        // Missing files are listed, not fatal.
        assert!(rep
            .unreadable
            .iter()
            .any(|u| u.path == "/proc/sys/net/ipv4/tcp_congestion_control"));
        let text = rep.render_text();
        assert!(text.contains("irq 71"), "{text}");
        assert!(text.contains("could not read"), "{text}");
    }
}
