//! `ferry-netem`: bring an emulated WAN test bed up and down, run commands
//! on its hosts, change it at run time and read its stats.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use ferry_netem::{
    delete_netns, find_in_path, parse_loss, reap_stale, BedConfig, BedOptions, Host, Regime,
    TestBed, CLIENT_ADDR, DEVICE, SERVER_ADDR,
};
use ferry_units::units::{parse_bytes_tc, parse_duration_tc, parse_rate_tc};
use serde_json::json;

const STATE_ROOT: &str = "/run/ferry-netem";

#[derive(Parser)]
#[command(
    name = "ferry-netem",
    version,
    about = "User-space WAN emulator: two network namespaces joined by a TUN forwarder with delay, rate, queue and loss"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create the bed and start its forwarder in the background.
    Up(UpArgs),
    /// Stop the forwarder, print its final stats as JSON, remove everything. Idempotent.
    Down {
        #[arg(long, default_value = "fnm")]
        name: String,
        /// Every bed of the state directory, and namespaces left by dead test processes.
        #[arg(long)]
        all: bool,
    },
    /// Run a command on one host: `exec client -- iperf3 -c 10.77.0.2`.
    Exec {
        #[arg(long, default_value = "fnm")]
        name: String,
        /// client | server
        host: Host,
        #[arg(last = true, required = true)]
        cmd: Vec<OsString>,
    },
    /// Print the state and the latest stats (refreshed every second) as JSON.
    Status {
        /// Only this bed (default: all).
        #[arg(long)]
        name: Option<String>,
    },
    /// Change loss / RTT / rate / queue of a running bed (applied before returning).
    Set {
        #[arg(long, default_value = "fnm")]
        name: String,
        #[arg(long)]
        loss: Option<String>,
        #[arg(long)]
        rtt: Option<String>,
        #[arg(long)]
        rate: Option<String>,
        #[arg(long)]
        queue: Option<String>,
    },
    /// Drop 100% of packets (on) or go back to the configured loss (off).
    /// (Signals do the same: SIGUSR1 = on, SIGUSR2 = off, sent to the pid in status.)
    Blackhole {
        #[arg(long, default_value = "fnm")]
        name: String,
        state: OnOff,
    },
    /// Internal: the background process started by `up`.
    #[command(hide = true)]
    Daemon(UpArgs),
}

#[derive(Clone, Copy, ValueEnum)]
enum OnOff {
    On,
    Off,
}

#[derive(Args, Clone, Debug)]
struct UpArgs {
    /// Name prefix: namespaces are NAME-c and NAME-s.
    #[arg(long, default_value = "fnm")]
    name: String,
    /// Round-trip time (each direction is delayed by RTT/2): 50ms, 0.1s, 250us.
    #[arg(long, default_value = "0ms")]
    rtt: String,
    /// Link rate per direction: 1gbit, 200mbit, unlimited.
    #[arg(long, default_value = "unlimited")]
    rate: String,
    /// Random loss per packet and direction: 0.01 or 1%.
    #[arg(long, default_value = "0")]
    loss: String,
    /// Drop-tail queue limit in bytes per direction (default: one BDP, at least 64 MTU).
    #[arg(long)]
    queue: Option<String>,
    #[arg(long, default_value_t = 9000)]
    mtu: u32,
    #[arg(long, value_enum, default_value_t = Regime::Default)]
    regime: Regime,
    /// Set both hosts' route over the link to start connections at N segments (initcwnd and
    /// initrwnd), as an administrator may on a transfer node; default: the kernel's 10.
    #[arg(long, value_name = "N")]
    initial_window: Option<u32>,
    /// Enable TCP Fast Open on both hosts (net.ipv4.tcp_fastopen=3), as an administrator may
    /// on transfer nodes; default: the kernel's (client side only).
    #[arg(long)]
    tcp_fastopen: bool,
    /// Seed of the loss PRNG.
    #[arg(long)]
    seed: Option<u64>,
    /// Tuned regime: raise the host's global net.core.{r,w}mem_max to 100 MiB
    /// when the kernel does not let a namespace set them.
    #[arg(long)]
    raise_host_core_max: bool,
    /// SCHED_FIFO priority of the forwarder (0 = normal scheduling).
    #[arg(long, default_value_t = 10)]
    rt_priority: i32,
    /// Stay in the foreground; print the final stats as JSON on SIGINT/SIGTERM.
    #[arg(long)]
    foreground: bool,
}

impl UpArgs {
    fn config(&self) -> Result<(BedConfig, BedOptions)> {
        let cfg = BedConfig {
            rtt: parse_duration_tc(&self.rtt).map_err(anyhow::Error::msg)?,
            rate_bps: parse_rate_tc(&self.rate).map_err(anyhow::Error::msg)?,
            loss: parse_loss(&self.loss).map_err(anyhow::Error::msg)?,
            mtu: self.mtu,
            regime: self.regime,
            queue_bytes: self
                .queue
                .as_deref()
                .map(parse_bytes_tc)
                .transpose()
                .map_err(anyhow::Error::msg)?,
            initial_window: self.initial_window,
            fast_open: self.tcp_fastopen,
        };
        let opts = BedOptions {
            name: Some(self.name.clone()),
            seed: self.seed,
            raise_host_core_max: self.raise_host_core_max,
            rt_priority: Some(self.rt_priority),
        };
        Ok((cfg, opts))
    }
}

fn state_dir(name: &str) -> PathBuf {
    Path::new(STATE_ROOT).join(name)
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 40
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        || name.starts_with('.')
    {
        bail!("bad name {name:?}: use up to 40 of [A-Za-z0-9._-]");
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Up(a) if a.foreground => run_bed(a, false),
        Cmd::Up(a) => up(a),
        Cmd::Daemon(a) => run_bed(a, true),
        Cmd::Down { name, all } => down(&name, all),
        Cmd::Exec { name, host, cmd } => exec(&name, host, cmd),
        Cmd::Status { name } => status(name.as_deref()),
        Cmd::Set {
            name,
            loss,
            rtt,
            rate,
            queue,
        } => {
            let mut lines = String::new();
            let mut add = |k: &str, v: Option<String>| {
                if let Some(v) = v {
                    lines.push_str(&format!("{k}={v}\n"));
                }
            };
            add("loss", loss);
            add("rtt", rtt);
            add("rate", rate);
            add("queue", queue);
            send_control(&name, &lines)
        }
        Cmd::Blackhole { name, state } => {
            let v = match state {
                OnOff::On => "blackhole=1\n",
                OnOff::Off => "blackhole=0\n",
            };
            send_control(&name, v)
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferry-netem: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `up`: re-executes itself as `daemon` in a new session and waits for it
/// to report READY or an error.
fn up(a: UpArgs) -> Result<()> {
    check_name(&a.name)?;
    a.config()?; // validate before forking
    let dir = state_dir(&a.name);
    if dir.join("pid").exists() && daemon_pid(&a.name).is_some() {
        bail!(
            "bed {} is already up (`ferry-netem down --name {}`)",
            a.name,
            a.name
        );
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let log = std::fs::File::create(dir.join("daemon.log"))?;
    let args: Vec<OsString> = std::env::args_os().skip(2).collect();
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("daemon")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log);
    // SAFETY: setsid(2) is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting the forwarder daemon")?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
    let line = line.trim();
    if line == "READY" {
        print!("{}", std::fs::read_to_string(dir.join("state.json"))?);
        Ok(())
    } else {
        let _ = child.wait();
        let log = std::fs::read_to_string(dir.join("daemon.log")).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        bail!(
            "bringing the bed up failed: {} {}",
            line.trim_start_matches("ERROR "),
            log.trim()
        )
    }
}

fn signal_set() -> libc::sigset_t {
    // SAFETY: sigset manipulation on a local.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGUSR1,
            libc::SIGUSR2,
        ] {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

fn write_atomic(path: &Path, data: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data)?;
    std::fs::rename(&tmp, path)
}

/// Brings the bed up in this process and serves signals until SIGTERM/SIGINT.
fn run_bed(a: UpArgs, daemon: bool) -> Result<()> {
    check_name(&a.name)?;
    // Block the signals before any thread exists, so that all threads
    // inherit the mask and sigtimedwait() below receives them.
    let set = signal_set();
    // SAFETY: valid sigset.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    let (cfg, opts) = a.config()?;
    let dir = state_dir(&a.name);
    let bed = match TestBed::up_with(cfg.clone(), opts) {
        Ok(b) => b,
        Err(e) => {
            if daemon {
                println!("ERROR {e:#}");
            }
            return Err(e);
        }
    };
    std::fs::create_dir_all(&dir)?;
    let pid = std::process::id();
    let state = json!({
        "name": a.name,
        "pid": pid,
        "client": {"netns": bed.netns(Host::Client), "addr": CLIENT_ADDR.to_string(), "device": DEVICE},
        "server": {"netns": bed.netns(Host::Server), "addr": SERVER_ADDR.to_string(), "device": DEVICE},
        "config": cfg,
        "queue_bytes_effective": cfg.rate_bps.map(|_| cfg.effective_queue_bytes()),
        "notes": bed.notes(),
    });
    write_atomic(
        &dir.join("state.json"),
        &format!("{}\n", serde_json::to_string_pretty(&state)?),
    )?;
    write_atomic(&dir.join("pid"), &format!("{pid}\n"))?;
    for n in bed.notes() {
        eprintln!("ferry-netem: note: {n}");
    }
    if daemon {
        println!("READY");
        std::io::stdout().flush()?;
        // Nobody reads stdout any more.
        let null = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
        // SAFETY: dup2 onto stdout.
        unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), 1) };
    } else {
        eprintln!(
            "ferry-netem: bed {} up (client {} in {}, server {} in {}); Ctrl-C to stop",
            a.name,
            CLIENT_ADDR,
            bed.netns(Host::Client),
            SERVER_ADDR,
            bed.netns(Host::Server)
        );
    }
    let write_stats = |bed: &TestBed| {
        if let Ok(s) = serde_json::to_string_pretty(&bed.stats()) {
            let _ = write_atomic(&dir.join("stats.json"), &format!("{s}\n"));
        }
    };
    loop {
        let ts = libc::timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        // SAFETY: valid set and timespec; info may be null.
        let sig = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &ts) };
        match sig {
            libc::SIGTERM | libc::SIGINT => break,
            libc::SIGUSR1 => bed.set_blackhole(true),
            libc::SIGUSR2 => bed.set_blackhole(false),
            libc::SIGHUP => {
                let ctl = dir.join("control");
                if let Ok(text) = std::fs::read_to_string(&ctl) {
                    if let Err(e) = apply_control(&bed, &text) {
                        eprintln!("ferry-netem: control: {e:#}");
                    }
                    let _ = std::fs::rename(&ctl, dir.join("control.applied"));
                }
            }
            _ => {}
        }
        write_stats(&bed);
        if bed.stats().running {
            continue;
        }
        eprintln!("ferry-netem: forwarder stopped unexpectedly");
        break;
    }
    let stats = bed.down()?;
    let text = serde_json::to_string_pretty(&stats)?;
    let _ = write_atomic(&dir.join("stats.json"), &format!("{text}\n"));
    let _ = std::fs::remove_file(dir.join("pid"));
    if !daemon {
        println!("{text}");
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

fn apply_control(bed: &TestBed, text: &str) -> Result<()> {
    for line in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| anyhow!("bad control line {line:?}"))?;
        let v = v.trim();
        match k.trim() {
            "loss" => bed.set_loss(parse_loss(v).map_err(anyhow::Error::msg)?),
            "rtt" => bed.set_rtt(parse_duration_tc(v).map_err(anyhow::Error::msg)?),
            "rate" => bed.set_rate(parse_rate_tc(v).map_err(anyhow::Error::msg)?),
            "queue" => bed.set_queue_bytes(parse_bytes_tc(v).map_err(anyhow::Error::msg)?),
            "blackhole" => bed.set_blackhole(matches!(v, "1" | "on" | "true")),
            other => bail!("unknown control key {other:?}"),
        }
    }
    Ok(())
}

fn pid_alive(pid: i32) -> bool {
    // A zombie (exited, not yet reaped by its new parent) counts as dead.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            s.rfind(')')
                .and_then(|i| s[i + 1..].split_whitespace().next())
                != Some("Z")
        }
        Err(_) => false,
    }
}

/// The daemon's pid, if it is running.
fn daemon_pid(name: &str) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(state_dir(name).join("pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    (pid_alive(pid) && String::from_utf8_lossy(&cmdline).contains("ferry-netem")).then_some(pid)
}

fn send_control(name: &str, text: &str) -> Result<()> {
    if text.is_empty() {
        bail!("nothing to set");
    }
    let pid = daemon_pid(name).ok_or_else(|| anyhow!("bed {name} is not running"))?;
    let dir = state_dir(name);
    let ctl = dir.join("control");
    write_atomic(&ctl, text)?;
    // SAFETY: kill(2).
    unsafe { libc::kill(pid, libc::SIGHUP) };
    let t0 = Instant::now();
    while ctl.exists() {
        if t0.elapsed() > Duration::from_secs(5) {
            bail!("bed {name} did not apply the change");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

fn down_one(name: &str) -> Result<()> {
    let dir = state_dir(name);
    if let Some(pid) = daemon_pid(name) {
        // SAFETY: kill(2).
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let t0 = Instant::now();
        while pid_alive(pid) {
            if t0.elapsed() > Duration::from_secs(10) {
                // SAFETY: kill(2).
                unsafe { libc::kill(pid, libc::SIGKILL) };
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    if let Ok(s) = std::fs::read_to_string(dir.join("stats.json")) {
        print!("{s}");
    }
    let mut errs = Vec::new();
    for sfx in ["c", "s"] {
        if let Err(e) = delete_netns(&format!("{name}-{sfx}")) {
            errs.push(format!("{e:#}"));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if errs.is_empty() {
        Ok(())
    } else {
        bail!("{}", errs.join("; "))
    }
}

fn down(name: &str, all: bool) -> Result<()> {
    if !all {
        check_name(name)?;
        return down_one(name);
    }
    let mut names: Vec<String> = std::fs::read_dir(STATE_ROOT)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    let mut errs = Vec::new();
    for n in names {
        if let Err(e) = down_one(&n) {
            errs.push(format!("{n}: {e:#}"));
        }
    }
    reap_stale();
    if errs.is_empty() {
        Ok(())
    } else {
        bail!("{}", errs.join("; "))
    }
}

fn exec(name: &str, host: Host, cmd: Vec<OsString>) -> Result<()> {
    check_name(name)?;
    let ns = format!("{name}-{}", host.suffix());
    if !Path::new("/run/netns").join(&ns).exists() {
        bail!("namespace {ns} does not exist (is bed {name} up?)");
    }
    let ip = find_in_path("ip").ok_or_else(|| anyhow!("no `ip` binary"))?;
    let err = Command::new(ip)
        .args(["netns", "exec"])
        .arg(&ns)
        .args(&cmd)
        .exec();
    Err(err).context("exec ip netns exec")
}

fn status(name: Option<&str>) -> Result<()> {
    let names: Vec<String> = match name {
        Some(n) => vec![n.to_string()],
        None => {
            let mut v: Vec<String> = std::fs::read_dir(STATE_ROOT)
                .map(|rd| {
                    rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                        .collect()
                })
                .unwrap_or_default();
            v.sort();
            v
        }
    };
    let mut out = Vec::new();
    for n in names {
        let dir = state_dir(&n);
        let read = |f: &str| -> serde_json::Value {
            std::fs::read_to_string(dir.join(f))
                .ok()
                .and_then(|s| serde_json::from_str(&s).ok())
                .unwrap_or(serde_json::Value::Null)
        };
        let netns: Vec<String> = ["c", "s"]
            .iter()
            .map(|s| format!("{n}-{s}"))
            .filter(|ns| Path::new("/run/netns").join(ns).exists())
            .collect();
        out.push(json!({
            "name": n,
            "running": daemon_pid(&n).is_some(),
            "netns_present": netns,
            "state": read("state.json"),
            "stats": read("stats.json"),
        }));
    }
    let stray: Vec<String> = ferry_netem::list_netns("fnm");
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({"beds": out, "fnm_namespaces": stray}))?
    );
    Ok(())
}
