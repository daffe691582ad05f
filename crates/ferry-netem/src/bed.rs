//! The test bed: two network namespaces with a TUN device each, joined by
//! the in-process forwarder thread.

use std::borrow::BorrowMut;
use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{self, Read};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::forward::{self, Control, DirStats, ForwarderState};
use crate::sched::bdp_bytes;

/// Address of the client host (inside its namespace only).
pub const CLIENT_ADDR: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
/// Address of the server host (inside its namespace only).
pub const SERVER_ADDR: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
/// Prefix length of the point-to-point subnet.
pub const PREFIX_LEN: u8 = 24;
/// The largest `initial_window` a bed accepts (segments): far above what anyone sets.
pub const MAX_INITIAL_WINDOW: u32 = 1024;
/// Name of the TUN device inside each namespace.
pub const DEVICE: &str = "fnm0";
/// 100 MiB, the "tuned" buffer size.
pub const TUNED_BUF: u64 = 104_857_600;
/// 4 MiB, the default regime's tcp_wmem max.
pub const DEFAULT_WMEM_MAX: u64 = 4_194_304;

/// One of the two emulated hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Host {
    Client,
    Server,
}

impl Host {
    pub fn suffix(self) -> &'static str {
        match self {
            Host::Client => "c",
            Host::Server => "s",
        }
    }
}

impl std::str::FromStr for Host {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "client" | "c" => Ok(Host::Client),
            "server" | "s" => Ok(Host::Server),
            _ => Err(format!("unknown host {s:?} (client|server)")),
        }
    }
}

/// TCP buffer regime applied to both namespaces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Regime {
    /// tcp_wmem max 4 MiB, tcp_rmem as the host has.
    #[default]
    Default,
    /// 100 MiB: tcp_rmem/tcp_wmem max 104857600 (and net.core.{r,w}mem_max
    /// where the kernel lets a namespace set them).
    Tuned,
}

/// What the emulated link looks like.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BedConfig {
    /// Round-trip time; each direction is delayed by rtt / 2.
    #[serde(rename = "rtt_ms", with = "duration_ms")]
    pub rtt: Duration,
    /// Link rate in bit/s per direction; None = unlimited.
    pub rate_bps: Option<u64>,
    /// Random loss probability per packet, each direction, 0..=1.
    pub loss: f64,
    /// MTU of both TUN devices.
    pub mtu: u32,
    pub regime: Regime,
    /// Drop-tail limit on bytes waiting for serialisation, per direction.
    /// None = one bandwidth-delay product (at least 64 MTU-sized packets).
    pub queue_bytes: Option<u64>,
    /// `initcwnd` and `initrwnd` (segments) of both hosts' route over the link,
    /// as an administrator would set them on a transfer node's routes to its
    /// peers; None = the kernel's (10 segments). A host's setting, like the
    /// regime: it lets a benchmark show what it changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_window: Option<u32>,
    /// TCP Fast Open on both hosts (`net.ipv4.tcp_fastopen=3`, client and server), as an
    /// administrator may enable it on transfer nodes; false = the kernel's (client only, so
    /// no connection opens with data). A host's setting, like `initial_window`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fast_open: bool,
}

impl Default for BedConfig {
    fn default() -> Self {
        BedConfig {
            rtt: Duration::ZERO,
            rate_bps: None,
            loss: 0.0,
            mtu: 9000,
            regime: Regime::Default,
            queue_bytes: None,
            initial_window: None,
            fast_open: false,
        }
    }
}

impl BedConfig {
    /// The queue limit actually used.
    pub fn effective_queue_bytes(&self) -> u64 {
        let floor = 64 * self.mtu as u64;
        match (self.queue_bytes, self.rate_bps) {
            (Some(q), _) => q.max(self.mtu as u64),
            (None, Some(r)) => bdp_bytes(r, self.rtt.as_nanos() as u64).max(floor),
            (None, None) => u64::MAX,
        }
    }
}

mod duration_ms {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64() * 1e3)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let ms = f64::deserialize(d)?;
        Duration::try_from_secs_f64(ms / 1e3).map_err(serde::de::Error::custom)
    }
}

/// Less common knobs of [`TestBed::up_with`].
#[derive(Clone, Debug, Default)]
pub struct BedOptions {
    /// Name prefix: namespaces are `<name>-c` and `<name>-s`.
    /// Default: `fnm-<pid>-<counter>`.
    pub name: Option<String>,
    /// Seed of the loss PRNG. Default: $FERRY_NETEM_SEED, else time-based.
    pub seed: Option<u64>,
    /// In the tuned regime, when the kernel does not let a namespace set
    /// net.core.{r,w}mem_max (they are global on many kernels), raise the
    /// host's global values to 100 MiB if lower. Never lowered or restored.
    pub raise_host_core_max: bool,
    /// Run the forwarder thread with SCHED_FIFO at this priority (1..=99).
    /// Default: 10, unless $FERRY_NETEM_NO_RT is set. Use `Some(0)` for
    /// normal scheduling.
    pub rt_priority: Option<i32>,
}

/// Counters and CPU use of a running or finished bed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Stats {
    pub name: String,
    pub rtt_ms: f64,
    pub rate_bps: Option<u64>,
    pub loss: f64,
    pub blackhole: bool,
    pub queue_bytes: Option<u64>,
    pub mtu: u32,
    pub regime: Regime,
    pub running: bool,
    /// Whether the forwarder runs with SCHED_FIFO.
    pub realtime: bool,
    /// Seconds since the forwarder started.
    pub wall_s: f64,
    /// CPU time of the forwarder thread (this includes the receiving
    /// hosts' kernel network stack work done inside its TUN writes).
    pub cpu_s: f64,
    pub cpu_user_s: f64,
    pub cpu_sys_s: f64,
    /// cpu_s / wall_s * 100: percent of one core.
    pub cpu_percent: f64,
    pub client_to_server: DirStats,
    pub server_to_client: DirStats,
}

/// Why this machine cannot run a bed, if it cannot.
pub fn can_run() -> Result<(), String> {
    // SAFETY: trivial syscall.
    if unsafe { libc::geteuid() } != 0 {
        return Err("ferry-netem needs root (network namespaces, TUN devices)".into());
    }
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
    {
        return Err(format!("cannot open /dev/net/tun: {e}"));
    }
    if find_in_path("ip").is_none() {
        return Err("no `ip` binary in PATH (install iproute2; scripts/netem-deps.sh)".into());
    }
    Ok(())
}

/// Full path of `prog` in $PATH (plus the sbin directories).
pub fn find_in_path(prog: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(Into::into))
        .map(|d| d.join(prog))
        .find(|p| {
            std::fs::metadata(p)
                .map(|m| {
                    m.is_file()
                        && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
                })
                .unwrap_or(false)
        })
}

pub(crate) fn ip_bin() -> std::path::PathBuf {
    find_in_path("ip").unwrap_or_else(|| "ip".into())
}

/// Runs `ip ARGS...`, failing with its stderr.
pub(crate) fn ip(args: &[&str]) -> Result<String> {
    let out = Command::new(ip_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running `ip`")?;
    if !out.status.success() {
        bail!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Namespaces whose names start with `prefix`.
pub fn list_netns(prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Whether `s` may name a host: 1 to 8 lowercase ASCII letters or digits, so that it fits
/// namespace names and cannot be mistaken for another part of them.
pub(crate) fn is_host_name(s: &str) -> bool {
    (1..=8).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Kills every process inside namespace `ns` and deletes it. Idempotent.
pub fn delete_netns(ns: &str) -> Result<()> {
    if !std::path::Path::new("/run/netns").join(ns).exists() {
        return Ok(());
    }
    if let Ok(out) = ip(&["netns", "pids", ns]) {
        let me = std::process::id() as i32;
        for pid in out.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            if pid != me {
                // SAFETY: plain kill(2).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
    match ip(&["netns", "del", ns]) {
        Ok(_) => Ok(()),
        Err(_) if !std::path::Path::new("/run/netns").join(ns).exists() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Deletes `fnm-<pid>-<n>-<host>` namespaces (a bed's `c` and `s`, a topology's hosts) left
/// by processes that died without cleaning up (e.g. SIGKILLed test runs).
pub fn reap_stale() {
    for ns in list_netns("fnm-") {
        let mut parts = ns.split('-');
        let (Some("fnm"), Some(pid), Some(_n), Some(host), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            continue;
        };
        if !is_host_name(host) {
            continue;
        }
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = delete_netns(&ns);
        }
    }
}

pub(crate) fn setns_net(fd: i32) -> io::Result<()> {
    // SAFETY: setns on a namespace fd.
    if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `f` on a fresh thread that has joined the network namespace
/// open at `ns_fd`. Sockets created there stay in that namespace.
pub(crate) fn run_in_fd<T: Send, F: FnOnce() -> T + Send>(ns_fd: i32, f: F) -> io::Result<T> {
    std::thread::scope(|s| {
        let h = s.spawn(move || -> io::Result<T> {
            setns_net(ns_fd)?;
            Ok(f())
        });
        match h.join() {
            Ok(r) => r,
            Err(p) => std::panic::resume_unwind(p),
        }
    })
}

/// Creates a TUN device named `name` (IFF_TUN | IFF_NO_PI, non-blocking)
/// in the caller's current network namespace.
pub fn open_tun(name: &str) -> io::Result<OwnedFd> {
    let path = CString::new("/dev/net/tun").expect("no NUL");
    // SAFETY: open(2) with a valid path.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, owned descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.len() >= ifr.ifr_name.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "interface name too long",
        ));
    }
    for (d, s) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    ifr.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF takes a pointer to an ifreq.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF as _, &mut ifr) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

fn read_sysctl(key: &str) -> io::Result<String> {
    let mut s = String::new();
    File::open(format!("/proc/sys/{}", key.replace('.', "/")))?.read_to_string(&mut s)?;
    Ok(s.split_whitespace().collect::<Vec<_>>().join(" "))
}

pub(crate) fn write_sysctl(key: &str, value: &str) -> io::Result<()> {
    std::fs::write(format!("/proc/sys/{}", key.replace('.', "/")), value)
}

/// The sysctls of a regime, computed from the host's (root namespace) values.
pub fn regime_sysctls(regime: Regime) -> Vec<(String, String)> {
    let host3 = |key: &str, dflt: [u64; 3]| -> [u64; 3] {
        read_sysctl(key)
            .ok()
            .and_then(|s| {
                let v: Vec<u64> = s.split(' ').filter_map(|x| x.parse().ok()).collect();
                (v.len() == 3).then(|| [v[0], v[1], v[2]])
            })
            .unwrap_or(dflt)
    };
    let rmem = host3("net.ipv4.tcp_rmem", [4096, 131072, 6291456]);
    let wmem = host3("net.ipv4.tcp_wmem", [4096, 16384, 4194304]);
    let fmt = |a: [u64; 3]| format!("{} {} {}", a[0], a[1], a[2]);
    match regime {
        Regime::Default => vec![
            ("net.ipv4.tcp_rmem".into(), fmt(rmem)),
            (
                "net.ipv4.tcp_wmem".into(),
                fmt([wmem[0], wmem[1], DEFAULT_WMEM_MAX]),
            ),
        ],
        Regime::Tuned => vec![
            (
                "net.ipv4.tcp_rmem".into(),
                fmt([rmem[0], rmem[1], TUNED_BUF]),
            ),
            (
                "net.ipv4.tcp_wmem".into(),
                fmt([wmem[0], wmem[1], TUNED_BUF]),
            ),
            ("net.core.rmem_max".into(), TUNED_BUF.to_string()),
            ("net.core.wmem_max".into(), TUNED_BUF.to_string()),
        ],
    }
}

pub(crate) struct Netns {
    pub(crate) name: String,
    pub(crate) file: File,
}

/// Numbers beds and topologies of this process, so that their names never collide.
pub(crate) static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A running test bed. Dropping it tears everything down.
pub struct TestBed {
    name: String,
    config: BedConfig,
    client: Netns,
    server: Netns,
    shared: Arc<ForwarderState>,
    thread: Option<JoinHandle<io::Result<()>>>,
    started: Instant,
    notes: Vec<String>,
    forwarder_error: Option<String>,
    final_user_sys: Option<(f64, f64)>,
}

/// Deletes namespaces created so far if `up` fails half-way.
struct SetupGuard(Vec<String>);
impl Drop for SetupGuard {
    fn drop(&mut self) {
        for ns in &self.0 {
            let _ = delete_netns(ns);
        }
    }
}

/// The limits a bed's link accepts.
pub(crate) fn check_config(config: &BedConfig) -> Result<()> {
    if !(0.0..=1.0).contains(&config.loss) {
        bail!("loss must be in 0..=1, got {}", config.loss);
    }
    if !(68..=65535).contains(&config.mtu) {
        bail!("mtu must be in 68..=65535, got {}", config.mtu);
    }
    if config.rate_bps == Some(0) {
        bail!("rate 0: use None for unlimited");
    }
    if let Some(w) = config.initial_window {
        if !(1..=MAX_INITIAL_WINDOW).contains(&w) {
            bail!("initial window must be in 1..={MAX_INITIAL_WINDOW} segments, got {w}");
        }
    }
    Ok(())
}

/// What making the two hosts found out on the way.
#[derive(Default)]
struct Made {
    /// Sysctls a namespace could not set, for the bed's notes.
    notes: Vec<String>,
    /// A `net.core.*` sysctl was refused: the kernel keeps it global (see `core_max_notes`).
    core_denied: bool,
}

/// Creates one host's namespace (registered with `guard` for cleanup), its sysctls, its TUN
/// device, address, MTU and route.
fn make_host(
    name: &str,
    host: Host,
    config: &BedConfig,
    guard: &mut SetupGuard,
    made: &mut Made,
) -> Result<(Netns, OwnedFd)> {
    let ns = format!("{name}-{}", host.suffix());
    if std::path::Path::new("/run/netns").join(&ns).exists() {
        bail!("namespace {ns} already exists (another bed named {name}? `ferry-netem down --name {name}`)");
    }
    ip(&["netns", "add", &ns])?;
    guard.0.push(ns.clone());
    let file =
        File::open(format!("/run/netns/{ns}")).with_context(|| format!("opening netns {ns}"))?;
    let mut sysctls = regime_sysctls(config.regime);
    if config.fast_open {
        sysctls.push(("net.ipv4.tcp_fastopen".into(), "3".into()));
    }
    let (tun, sys_notes, core_denied) =
        run_in_fd(file.as_raw_fd(), || open_tun_with_sysctls(&ns, &sysctls))?
            .with_context(|| format!("creating TUN {DEVICE} in {ns}"))?;
    made.notes.extend(sys_notes);
    made.core_denied |= core_denied;
    let addr = match host {
        Host::Client => CLIENT_ADDR,
        Host::Server => SERVER_ADDR,
    };
    configure_link(&ns, addr, config)?;
    Ok((Netns { name: ns, file }, tun))
}

/// Inside a new namespace: its sysctls and its TUN device. Returns the device, notes on the
/// sysctls it could not set, and whether a global `net.core.*` one was refused.
fn open_tun_with_sysctls(
    ns: &str,
    sysctls: &[(String, String)],
) -> io::Result<(OwnedFd, Vec<String>, bool)> {
    // The bed is IPv4-only: keep the kernel from sending IPv6
    // noise (MLD reports etc.) over the emulated link.
    let _ = write_sysctl("net.ipv6.conf.default.disable_ipv6", "1");
    let tun = open_tun(DEVICE)?;
    let (sys_notes, core_denied) = apply_sysctls(ns, sysctls);
    Ok((tun, sys_notes, core_denied))
}

/// Inside namespace `ns`: sets `sysctls`. Returns notes on those it could not set, and
/// whether a global `net.core.*` one was refused.
pub(crate) fn apply_sysctls(ns: &str, sysctls: &[(String, String)]) -> (Vec<String>, bool) {
    let mut sys_notes = Vec::new();
    let mut core_denied = false;
    for (k, v) in sysctls {
        if let Err(e) = write_sysctl(k, v) {
            // net.core.{r,w}mem_max are global on many kernels:
            // summarised by `core_max_notes`.
            if !(k.starts_with("net.core.") && e.kind() == io::ErrorKind::PermissionDenied) {
                sys_notes.push(format!("{ns}: cannot set {k}={v}: {e}"));
            } else {
                core_denied = true;
            }
        }
    }
    (sys_notes, core_denied)
}

/// Brings up `lo` and the TUN device of namespace `ns` with its address and MTU, and the
/// initial windows on its route when asked for.
fn configure_link(ns: &str, addr: Ipv4Addr, config: &BedConfig) -> Result<()> {
    let mtu = config.mtu.to_string();
    ip(&["-n", ns, "link", "set", "lo", "up"])?;
    ip(&[
        "-n",
        ns,
        "addr",
        "add",
        &format!("{addr}/{PREFIX_LEN}"),
        "dev",
        DEVICE,
    ])?;
    ip(&[
        "-n",
        ns,
        "link",
        "set",
        DEVICE,
        "mtu",
        &mtu,
        "txqueuelen",
        "1000",
        "up",
    ])?;
    if let Some(w) = config.initial_window {
        // `change` replaces the route the address created: repeat what it had.
        let mask = u32::MAX << (32 - u32::from(PREFIX_LEN));
        let net = Ipv4Addr::from(u32::from(addr) & mask);
        let w = w.to_string();
        ip(&[
            "-n",
            ns,
            "route",
            "change",
            &format!("{net}/{PREFIX_LEN}"),
            "dev",
            DEVICE,
            "proto",
            "kernel",
            "scope",
            "link",
            "src",
            &addr.to_string(),
            "initcwnd",
            &w,
            "initrwnd",
            &w,
        ])?;
    }
    Ok(())
}

/// The tuned regime where a namespace may not set `net.core.{r,w}mem_max`: says what the
/// host's global values are, raising them first if `opts` asks to.
pub(crate) fn core_max_notes(opts: &BedOptions, notes: &mut Vec<String>) -> Result<()> {
    for key in ["net.core.rmem_max", "net.core.wmem_max"] {
        let host_val: u64 = read_sysctl(key)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        if host_val >= TUNED_BUF {
            notes.push(format!(
                "{key} is global and already {host_val} on the host"
            ));
        } else if opts.raise_host_core_max {
            write_sysctl(key, &TUNED_BUF.to_string())
                .with_context(|| format!("raising host {key}"))?;
            notes.push(format!(
                "raised the host's global {key} from {host_val} to {TUNED_BUF}"
            ));
        } else {
            notes.push(format!(
                "{key} stays {host_val}: this kernel keeps it global (read-only in a namespace); \
                 TCP autotuning is bounded by the per-namespace tcp_rmem/tcp_wmem instead; \
                 explicit SO_SNDBUF/SO_RCVBUF are capped by it unless set with SO_*BUFFORCE as root \
                 (or use --raise-host-core-max)"
            ));
        }
    }
    Ok(())
}

/// Starts the forwarder thread between the two TUN devices and waits (bounded) until it runs,
/// so that stats have a tid.
pub(crate) fn start_forwarder(
    name: &str,
    config: &BedConfig,
    opts: &BedOptions,
    ctun: OwnedFd,
    stun: OwnedFd,
) -> Result<(Arc<ForwarderState>, JoinHandle<io::Result<()>>)> {
    let rtt_ns = config.rtt.as_nanos() as u64;
    let control = Control::new(
        config.loss,
        rtt_ns / 2,
        config.rate_bps.unwrap_or(0),
        config.effective_queue_bytes(),
    );
    let shared = Arc::new(ForwarderState::new(control));
    let seed = opts
        .seed
        .or_else(|| {
            std::env::var("FERRY_NETEM_SEED")
                .ok()
                .and_then(|s| s.parse().ok())
        })
        .unwrap_or_else(|| forward::mono_ns() ^ ((std::process::id() as u64) << 32));
    let mtu = config.mtu;
    let sh = shared.clone();
    let rt = match opts.rt_priority {
        Some(0) => None,
        Some(p) => Some(p.clamp(1, 99)),
        None if std::env::var_os("FERRY_NETEM_NO_RT").is_some() => None,
        None => Some(10),
    };
    let thread = std::thread::Builder::new()
        .name(format!("netem-{name}"))
        .spawn(move || forward::run(ctun, stun, mtu, seed, rt, sh))
        .context("spawning the forwarder thread")?;
    let t0 = Instant::now();
    while shared.tid.load(Relaxed) == 0
        && t0.elapsed() < Duration::from_secs(2)
        && !thread.is_finished()
    {
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok((shared, thread))
}

impl TestBed {
    /// Brings a bed up with default options.
    pub fn up(config: BedConfig) -> Result<TestBed> {
        Self::up_with(config, BedOptions::default())
    }

    /// Brings a bed up.
    pub fn up_with(config: BedConfig, opts: BedOptions) -> Result<TestBed> {
        can_run().map_err(|e| anyhow!(e))?;
        check_config(&config)?;
        reap_stale();
        let name = opts.name.clone().unwrap_or_else(|| {
            format!(
                "fnm-{}-{}",
                std::process::id(),
                COUNTER.fetch_add(1, Relaxed)
            )
        });
        let mut guard = SetupGuard(Vec::new());
        let mut made = Made::default();
        let (client, ctun) = make_host(&name, Host::Client, &config, &mut guard, &mut made)?;
        let (server, stun) = make_host(&name, Host::Server, &config, &mut guard, &mut made)?;
        let mut notes = made.notes;
        if config.regime == Regime::Tuned && made.core_denied {
            core_max_notes(&opts, &mut notes)?;
        }
        let (shared, thread) = start_forwarder(&name, &config, &opts, ctun, stun)?;
        guard.0.clear();
        Ok(TestBed {
            name,
            config,
            client,
            server,
            shared,
            thread: Some(thread),
            started: Instant::now(),
            notes,
            forwarder_error: None,
            final_user_sys: None,
        })
    }

    /// The name prefix (namespaces are `<name>-c` and `<name>-s`).
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn config(&self) -> &BedConfig {
        &self.config
    }
    /// Remarks made while setting up (e.g. sysctls the kernel refused).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }
    pub fn client_addr(&self) -> Ipv4Addr {
        CLIENT_ADDR
    }
    pub fn server_addr(&self) -> Ipv4Addr {
        SERVER_ADDR
    }
    pub fn addr(&self, host: Host) -> Ipv4Addr {
        match host {
            Host::Client => CLIENT_ADDR,
            Host::Server => SERVER_ADDR,
        }
    }
    /// Name of the network namespace of `host`.
    pub fn netns(&self, host: Host) -> &str {
        &self.ns(host).name
    }
    fn ns(&self, host: Host) -> &Netns {
        match host {
            Host::Client => &self.client,
            Host::Server => &self.server,
        }
    }

    /// `ip netns exec <ns> <program>`: add arguments, stdio etc. as usual.
    pub fn command(&self, host: Host, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new(ip_bin());
        c.args(["netns", "exec", self.netns(host)]).arg(program);
        c
    }

    /// A copy of `cmd` (program, arguments, environment changes, working
    /// directory) wrapped with `ip netns exec`. Stdio settings cannot be
    /// copied from a Command: set them on the result.
    pub fn wrap(&self, host: Host, cmd: &Command) -> Command {
        let mut c = self.command(host, cmd.get_program());
        c.args(cmd.get_args());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        if let Some(d) = cmd.get_current_dir() {
            c.current_dir(d);
        }
        c
    }

    /// Makes `cmd` start inside `host`'s namespace (setns(2) in the child
    /// just before exec; everything else, stdio included, is kept).
    pub fn enter<'c>(&self, host: Host, cmd: &'c mut Command) -> io::Result<&'c mut Command> {
        let fd = Arc::new(self.ns(host).file.try_clone()?);
        // SAFETY: the hook only calls setns(2), which is async-signal-safe.
        unsafe {
            cmd.pre_exec(move || setns_net(fd.as_raw_fd()));
        }
        Ok(cmd)
    }

    /// Spawns `cmd` (a Command or &mut Command) inside `host`'s namespace,
    /// keeping its stdio configuration.
    pub fn spawn_in(&self, host: Host, mut cmd: impl BorrowMut<Command>) -> io::Result<Child> {
        self.enter(host, cmd.borrow_mut())?.spawn()
    }

    /// Runs `f` on a thread inside `host`'s namespace and returns its
    /// result. Sockets created by `f` stay in that namespace, so a test can
    /// e.g. bind a listener on the server and connect from the client
    /// within one process.
    pub fn run_in<T: Send, F: FnOnce() -> T + Send>(&self, host: Host, f: F) -> io::Result<T> {
        run_in_fd(self.ns(host).file.as_raw_fd(), f)
    }

    fn control(&self) -> &Control {
        &self.shared.control
    }
    /// Changes the random loss probability (both directions) at run time.
    pub fn set_loss(&self, loss: f64) {
        self.control().set_loss(loss);
    }
    /// Drops 100% while on, without forgetting the loss setting.
    pub fn set_blackhole(&self, on: bool) {
        self.control().set_blackhole(on);
    }
    /// Changes the RTT at run time (packets already queued keep theirs;
    /// lowering it never reorders packets).
    pub fn set_rtt(&self, rtt: Duration) {
        self.control().set_one_way_ns(rtt.as_nanos() as u64 / 2);
    }
    /// Changes the rate at run time (None: unlimited).
    pub fn set_rate(&self, rate_bps: Option<u64>) {
        self.control().set_rate_bps(rate_bps.unwrap_or(0));
    }
    pub fn set_queue_bytes(&self, bytes: u64) {
        self.control()
            .set_queue_bytes(bytes.max(self.config.mtu as u64));
    }

    /// Current counters and CPU use of the forwarder.
    pub fn stats(&self) -> Stats {
        let c = self.control();
        let tid = self.shared.tid.load(Relaxed);
        let running = self.thread.as_ref().is_some_and(|t| !t.is_finished());
        let mut cpu_ns = self.shared.cpu_ns.load(Relaxed);
        let (mut user, mut sys) = (0.0, 0.0);
        if running && tid != 0 {
            let task = format!("/proc/self/task/{tid}");
            if let Some(ns) = std::fs::read_to_string(format!("{task}/schedstat"))
                .ok()
                .and_then(|s| {
                    s.split_whitespace()
                        .next()
                        .and_then(|x| x.parse::<u64>().ok())
                })
            {
                cpu_ns = cpu_ns.max(ns);
            }
            if let Some((u, s)) = proc_stat_times(&format!("{task}/stat")) {
                (user, sys) = (u, s);
            }
        } else if let Some((u, s)) = self.final_user_sys {
            (user, sys) = (u, s);
        }
        let wall = self.started.elapsed().as_secs_f64();
        let cpu = cpu_ns as f64 / 1e9;
        let rate = c.rate_bps();
        Stats {
            name: self.name.clone(),
            rtt_ms: c.one_way_ns() as f64 * 2.0 / 1e6,
            rate_bps: (rate != 0).then_some(rate),
            loss: c.loss(),
            blackhole: c.blackhole(),
            queue_bytes: (rate != 0).then(|| c.queue_bytes()),
            mtu: self.config.mtu,
            regime: self.config.regime,
            running,
            realtime: self.shared.realtime.load(Relaxed),
            wall_s: wall,
            cpu_s: cpu,
            cpu_user_s: user,
            cpu_sys_s: sys,
            cpu_percent: if wall > 0.0 { cpu / wall * 100.0 } else { 0.0 },
            client_to_server: self.shared.c2s.snapshot(),
            server_to_client: self.shared.s2c.snapshot(),
        }
    }

    /// Error of the forwarder thread, if it died.
    pub fn forwarder_error(&self) -> Option<&str> {
        self.forwarder_error.as_deref()
    }

    /// Tears down now and returns the final stats.
    pub fn down(mut self) -> Result<Stats> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<Stats> {
        let mut errs = Vec::new();
        let first = self.thread.is_some();
        if let Some(t) = self.thread.take() {
            let tid = self.shared.tid.load(Relaxed);
            // Sample user/sys split while the thread still exists.
            self.final_user_sys = proc_stat_times(&format!("/proc/self/task/{tid}/stat"));
            self.shared.control.request_stop();
            match t.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => self.forwarder_error = Some(e.to_string()),
                Err(_) => self.forwarder_error = Some("forwarder thread panicked".into()),
            }
        }
        let stats = self.stats();
        if let Some(dir) = std::env::var_os("FERRY_NETEM_STATS_DIR").filter(|_| first) {
            if let Ok(text) = serde_json::to_string_pretty(&stats) {
                let path = std::path::Path::new(&dir).join(format!("{}.json", self.name));
                if let Err(e) = std::fs::write(&path, text + "\n") {
                    errs.push(format!("writing {}: {e}", path.display()));
                }
            }
        }
        for ns in [&self.client.name, &self.server.name] {
            if let Err(e) = delete_netns(ns) {
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

impl Drop for TestBed {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("ferry-netem: {e:#}");
        }
    }
}

/// (user, system) seconds from a /proc/.../stat file.
fn proc_stat_times(path: &str) -> Option<(f64, f64)> {
    let s = std::fs::read_to_string(path).ok()?;
    // Fields after the ")" of the comm: state is field 3; utime 14, stime 15.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // SAFETY: sysconf is trivially safe.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let u: f64 = f.get(11)?.parse().ok()?;
    let st: f64 = f.get(12)?.parse().ok()?;
    Some((u / hz, st / hz))
}
