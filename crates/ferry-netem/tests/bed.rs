//! Integration tests of the emulator. They need root, /dev/net/tun and
//! `ip` (and iperf3 / ping for some): without them each test prints why
//! and returns, or fails when `CI` is set (`ferry_netem::needs`). They run
//! one at a time (a shared lock) because they measure timing and throughput
//! on a 2-core machine.

use std::collections::HashSet;
use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use std::os::unix::process::CommandExt;

use ferry_netem::{
    can_run, find_in_path, needs, set_thread_realtime, BedConfig, Host, Regime, TestBed,
};
use ferry_units::stats::upper_median;

static LOCK: Mutex<()> = Mutex::new(());

/// Takes the global lock, or returns None (after saying why; a failure under
/// CI) when this machine cannot run a bed.
fn setup(test: &str) -> Option<MutexGuard<'static, ()>> {
    needs(test, can_run())?;
    Some(LOCK.lock().unwrap_or_else(|e| e.into_inner()))
}

/// The path of `tool`, or the reason it is missing, for [`needs`].
fn tool(tool: &str) -> Result<std::path::PathBuf, String> {
    find_in_path(tool).ok_or_else(|| format!("{tool} not installed (scripts/netem-deps.sh)"))
}

fn netns_exists(name: &str) -> bool {
    std::path::Path::new("/run/netns").join(name).exists()
}

/// Kills and reaps a child when dropped (also on panic).
struct Reap(Child);
impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn cfg(rtt_ms: u64) -> BedConfig {
    BedConfig {
        rtt: Duration::from_millis(rtt_ms),
        rate_bps: None,
        loss: 0.0,
        mtu: 9000,
        regime: Regime::Default,
        queue_bytes: None,
        initial_window: None,
        fast_open: false,
    }
}

/// A UDP echo server bound in the server namespace, serving on its own
/// thread until `stop` is received or 30 s have passed.
fn udp_echo(bed: &TestBed) -> (SocketAddr, std::thread::JoinHandle<()>) {
    let sock = bed
        .run_in(Host::Server, || UdpSocket::bind((bed.server_addr(), 0)))
        .unwrap()
        .unwrap();
    let addr = sock.local_addr().unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let h = std::thread::spawn(move || {
        let _ = set_thread_realtime(20);
        let t0 = Instant::now();
        let mut buf = [0u8; 2048];
        while t0.elapsed() < Duration::from_secs(30) {
            if let Ok((n, from)) = sock.recv_from(&mut buf) {
                if &buf[..n] == b"stop" {
                    break;
                }
                let _ = sock.send_to(&buf[..n], from);
            }
        }
    });
    (addr, h)
}

fn client_socket(bed: &TestBed) -> UdpSocket {
    let s = bed
        .run_in(Host::Client, || UdpSocket::bind((bed.client_addr(), 0)))
        .unwrap()
        .unwrap();
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    s
}

/// Round trips of `n` sequential UDP echoes, in ms, sorted.
fn udp_rtts(sock: &UdpSocket, to: SocketAddr, n: u32) -> Vec<f64> {
    let mut v = Vec::new();
    let mut buf = [0u8; 64];
    for i in 0..n {
        let msg = i.to_be_bytes();
        let t = Instant::now();
        sock.send_to(&msg, to).unwrap();
        // Skip stale replies of earlier probes.
        while let Ok((k, _)) = sock.recv_from(&mut buf) {
            if buf[..k] == msg {
                v.push(t.elapsed().as_secs_f64() * 1e3);
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    v.sort_by(f64::total_cmp);
    v
}

/// Mean lateness (us) of the forwarder's releases between two snapshots:
/// how far the machine's load kept the forwarder itself from its schedule.
fn lateness_between(a: &ferry_netem::Stats, b: &ferry_netem::Stats) -> f64 {
    let sum = |s: &ferry_netem::Stats| {
        let (c, d) = (&s.client_to_server, &s.server_to_client);
        (
            c.late_mean_us * c.tx_packets as f64 + d.late_mean_us * d.tx_packets as f64,
            (c.tx_packets + d.tx_packets) as f64,
        )
    };
    let ((la, na), (lb, nb)) = (sum(a), sum(b));
    if nb > na {
        (lb - la) / (nb - na)
    } else {
        0.0
    }
}

/// Total time (us) some task waited for a CPU, from PSI, if the kernel has it.
fn cpu_pressure_total_us() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/pressure/cpu").ok()?;
    let some = text.lines().find(|l| l.starts_with("some"))?;
    some.split_whitespace()
        .find_map(|f| f.strip_prefix("total=")?.parse().ok())
}

/// A round whose releases were this late on average was disturbed by
/// foreign load (on a quiet machine the mean is 1-30 us) ...
const OVERLOADED_LATENESS_US: f64 = 100.0;
/// ... and so was one during which tasks waited for a CPU this share of
/// the time (PSI "some"; the probes themselves load the CPUs very little).
const OVERLOADED_PRESSURE_PCT: f64 = 20.0;
const ROUNDS: usize = 5;

/// Runs `measure` (returning the round's (statistic, min) in ms) until the
/// statistic is within 1 ms of `want`, for at most ROUNDS rounds. On this
/// PREEMPT_NONE 2-core VM a burst of foreign load (other builds, tests) can
/// hold both CPUs in the kernel for milliseconds, even against real-time
/// threads; the forwarder's own release lateness and the kernel's CPU
/// pressure tell such rounds apart. If every round was disturbed, only the
/// minimum (noise only ever adds delay) is held to the 1 ms bound, with a
/// message saying so; an undisturbed round that misses fails the test.
fn check_rtt(what: &str, bed: &TestBed, want: f64, mut measure: impl FnMut() -> (f64, f64)) {
    let mut disturbed_min = f64::INFINITY;
    let mut clean_miss = None;
    for round in 1..=ROUNDS {
        let before = bed.stats();
        let (t0, psi0) = (Instant::now(), cpu_pressure_total_us());
        let (stat, min) = measure();
        let late = lateness_between(&before, &bed.stats());
        let pressure = match (psi0, cpu_pressure_total_us()) {
            (Some(a), Some(b)) => b.saturating_sub(a) as f64 / 1e4 / t0.elapsed().as_secs_f64(),
            _ => 0.0,
        };
        eprintln!(
            "{what}, round {round}: {stat:.3} ms (min {min:.3}), \
             forwarder lateness {late:.1} us, cpu pressure {pressure:.0}%"
        );
        if (stat - want).abs() < 1.0 {
            return;
        }
        if late > OVERLOADED_LATENESS_US || pressure > OVERLOADED_PRESSURE_PCT {
            disturbed_min = disturbed_min.min(min);
        } else {
            clean_miss = Some((stat, late, pressure));
        }
    }
    if let Some((stat, late, pressure)) = clean_miss {
        panic!(
            "{what}: {stat} ms, set {want} ms \
             (forwarder lateness {late:.1} us, cpu pressure {pressure:.0}%)"
        );
    }
    eprintln!(
        "{what}: every round was disturbed by machine load; \
         checking the minimum RTT instead: {disturbed_min:.3} ms"
    );
    assert!(
        (disturbed_min - want).abs() < 1.0,
        "{what}: min RTT {disturbed_min} ms, set {want} ms"
    );
}

#[test]
fn rtt_is_within_1ms() {
    let Some(_g) = setup("rtt_is_within_1ms") else {
        return;
    };
    let bed = TestBed::up(BedConfig {
        rate_bps: Some(1_000_000_000),
        ..cfg(50)
    })
    .unwrap();
    // The probes run with real-time priority, as the forwarder does: on a
    // loaded 2-core machine, ordinary threads can wake up milliseconds late,
    // which would measure CPU contention rather than the emulated link.
    let _ = set_thread_realtime(20);
    struct Normal;
    impl Drop for Normal {
        fn drop(&mut self) {
            let _ = set_thread_realtime(0);
        }
    }
    let _normal = Normal;
    let (echo, h) = udp_echo(&bed);
    let sock = client_socket(&bed);
    check_rtt("udp echo median at rtt 50 ms", &bed, 50.0, || {
        let mut rtts = udp_rtts(&sock, echo, 15);
        assert!(rtts.len() >= 14, "lost echoes: {rtts:?}");
        (upper_median(&mut rtts).expect("no echo came back"), rtts[0])
    });

    // The kernel's view: ping, as the issue suggests.
    if needs("rtt_is_within_1ms", tool("ping")).is_some() {
        check_rtt("ping avg at rtt 50 ms", &bed, 50.0, || {
            let mut cmd = bed.command(Host::Client, "ping");
            cmd.args(["-c", "5", "-i", "0.2", "-q", &bed.server_addr().to_string()]);
            // SAFETY: the hook only calls sched_setscheduler(2).
            unsafe {
                cmd.pre_exec(|| {
                    let p = libc::sched_param { sched_priority: 20 };
                    libc::sched_setscheduler(0, libc::SCHED_FIFO, &p);
                    Ok(())
                });
            }
            let out = cmd.output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "ping failed: {text}");
            // rtt min/avg/max/mdev = 50.101/50.149/50.530/0.091 ms
            let line = text
                .lines()
                .find(|l| l.contains("min/avg/max"))
                .expect("ping summary");
            let nums: Vec<f64> = line
                .split('=')
                .nth(1)
                .unwrap()
                .trim()
                .trim_end_matches(" ms")
                .split('/')
                .map(|x| x.parse().unwrap())
                .collect();
            (nums[1], nums[0])
        });
    } else {
        eprintln!("checked with UDP echoes only");
    }

    // At run time, down to 0: the bed itself adds little.
    bed.set_rtt(Duration::ZERO);
    std::thread::sleep(Duration::from_millis(60));
    check_rtt("udp echo median at rtt 0", &bed, 0.0, || {
        let mut rtts = udp_rtts(&sock, echo, 10);
        (upper_median(&mut rtts).expect("no echo came back"), rtts[0])
    });
    sock.send_to(b"stop", echo).unwrap();
    h.join().unwrap();
    let st = bed.stats();
    eprintln!(
        "release lateness c2s: mean {:.1} us, max {:.1} us",
        st.client_to_server.late_mean_us, st.client_to_server.late_max_us
    );
}

#[test]
fn rate_cap_is_held_within_5pct() {
    let Some(_g) = setup("rate_cap_is_held_within_5pct") else {
        return;
    };
    let Some(_) = needs("rate_cap_is_held_within_5pct", tool("iperf3")) else {
        return;
    };
    let rate = 200_000_000u64;
    let mtu = 9000u32;
    let bed = TestBed::up(BedConfig {
        rate_bps: Some(rate),
        mtu,
        ..cfg(10)
    })
    .unwrap();
    // The cap applies to whole IP packets; iperf3 reports TCP payload. Each full-size packet
    // of `mtu` bytes carries mtu - 20 (IPv4) - 20 (TCP) - 12 (timestamp option) bytes of
    // payload, so the best possible goodput is rate * (mtu - 52) / mtu (99.4% at MTU 9000).
    // ACKs travel the other direction and cost nothing here.
    let cap = rate as f64 * (mtu - 52) as f64 / mtu as f64;
    // Up to five runs, a second apart. Going over the cap is the emulator's fault and fails at
    // once; falling short can also be the host's: on a VM whose host was busy, 8 runs in a row
    // reached 68-92% of the cap, and the next 5 (nothing changed) 98.5-100%; a CI run on
    // 2026-11-25 had three at 88-92% and the same test passed at 99.3% minutes later. A TCP
    // flow falls short of the cap for many reasons, but none makes it exceed it.
    let mut last = 0.0;
    for attempt in 1..=5 {
        if attempt > 1 {
            std::thread::sleep(Duration::from_secs(1));
        }
        let goodput = iperf3_goodput(&bed);
        let st = bed.stats();
        eprintln!(
            "rate 200 Mbit/s, run {attempt}: goodput {:.1} Mbit/s = {:.1}% of the payload cap {:.1}; forwarder CPU {:.1}%",
            goodput / 1e6,
            goodput / cap * 100.0,
            cap / 1e6,
            st.cpu_percent
        );
        assert!(
            goodput < cap * 1.05,
            "goodput {goodput} over the cap {cap} ({:.2}%)",
            goodput / cap * 100.0
        );
        if goodput > cap * 0.95 {
            return;
        }
        last = goodput;
    }
    panic!(
        "goodput {last} vs cap {cap} ({:.2}%) in the last of 5 runs",
        last / cap * 100.0
    );
}

/// One 4-second iperf3 run across `bed`: the receiver's goodput in bits per second, leaving
/// out the first second (slow start).
fn iperf3_goodput(bed: &TestBed) -> f64 {
    let server = bed.server_addr().to_string();
    let _srv = Reap(
        bed.command(Host::Server, "iperf3")
            .args(["-s", "-1", "-J", "-B", &server])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // The server needs a moment to listen: retry while refused (bounded).
    let t0 = Instant::now();
    let out = loop {
        let out = bed
            .command(Host::Client, "iperf3")
            .args(["-c", &server, "-t", "4", "-J", "--get-server-output"])
            .stderr(Stdio::null())
            .output()
            .unwrap();
        if out.status.success() || t0.elapsed() > Duration::from_secs(5) {
            break out;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("iperf3 JSON");
    assert!(out.status.success(), "iperf3 failed: {}", json["error"]);
    // Goodput as the receiver saw it, per second, leaving out the first
    // second (slow start). Not `-O 1` with end.sum_received: iperf3 3.12's
    // server mis-accounts the omitted period (a zero-length interval
    // holding a second's worth of bytes), which inflates the sum by ~3%.
    let intervals = json["server_output_json"]["intervals"]
        .as_array()
        .expect("server intervals (iperf3 --get-server-output)");
    let (mut bytes, mut secs) = (0.0, 0.0);
    for iv in intervals {
        let sum = &iv["sum"];
        let (start, len) = (
            sum["start"].as_f64().unwrap(),
            sum["seconds"].as_f64().unwrap(),
        );
        if start >= 0.99 && len >= 0.5 {
            bytes += sum["bytes"].as_f64().unwrap();
            secs += len;
        }
    }
    assert!(secs >= 2.0, "too few receiver intervals: {intervals:?}");
    bytes * 8.0 / secs
}

/// Sends `n` numbered datagrams from the client to a receiver on the
/// server, paced, and returns the set of numbers received.
fn udp_blast(bed: &TestBed, n: u32, gap: Duration) -> HashSet<u32> {
    let rx = bed
        .run_in(Host::Server, || UdpSocket::bind((bed.server_addr(), 0)))
        .unwrap()
        .unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let to = rx.local_addr().unwrap();
    let tx = client_socket(bed);
    let recv = std::thread::spawn(move || {
        let mut got = HashSet::new();
        let mut buf = [0u8; 64];
        let t0 = Instant::now();
        // Ends 300 ms after the last datagram (read timeout), at most 10 s.
        while let Ok(k) = rx.recv(&mut buf) {
            if k >= 4 {
                got.insert(u32::from_be_bytes(buf[..4].try_into().unwrap()));
            }
            if t0.elapsed() > Duration::from_secs(10) {
                break;
            }
        }
        got
    });
    let t0 = Instant::now();
    for i in 0..n {
        // Pace against the clock so that sleep overshoot does not add up.
        let due = t0 + gap * i;
        if let Some(d) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        tx.send_to(&i.to_be_bytes(), to).unwrap();
    }
    recv.join().unwrap()
}

#[test]
fn loss_is_applied_at_the_configured_rate() {
    let Some(_g) = setup("loss_is_applied_at_the_configured_rate") else {
        return;
    };
    let p = 0.10;
    let n = 2000u32;
    let bed = TestBed::up(BedConfig { loss: p, ..cfg(2) }).unwrap();
    let got = udp_blast(&bed, n, Duration::from_micros(100));
    let lost = n as f64 - got.len() as f64;
    let mean = n as f64 * p;
    let sigma = (n as f64 * p * (1.0 - p)).sqrt();
    let st = bed.stats();
    eprintln!(
        "loss {p}: lost {lost} of {n} (expected {mean} +- {sigma:.1}); forwarder counted {} loss drops",
        st.client_to_server.drop_loss
    );
    // 4 sigma rather than 3: a 0.27% false-failure rate is too flaky for CI.
    assert!(
        (lost - mean).abs() <= 4.0 * sigma,
        "lost {lost}, expected {mean} +- {}",
        4.0 * sigma
    );
    // Every loss is one of ours: nothing else drops on this path.
    assert_eq!(st.client_to_server.drop_loss, lost as u64);
    assert_eq!(st.client_to_server.rx_packets, n as u64);
}

#[test]
fn loss_and_blackhole_change_at_run_time() {
    let Some(_g) = setup("loss_and_blackhole_change_at_run_time") else {
        return;
    };
    let bed = TestBed::up(cfg(2)).unwrap();
    let gap = Duration::from_millis(2);
    assert_eq!(udp_blast(&bed, 20, gap).len(), 20, "baseline");
    bed.set_loss(1.0);
    assert_eq!(udp_blast(&bed, 20, gap).len(), 0, "loss 1.0 must block");
    bed.set_loss(0.0);
    assert_eq!(udp_blast(&bed, 20, gap).len(), 20, "loss 0.0 must restore");
    bed.set_blackhole(true);
    assert_eq!(udp_blast(&bed, 20, gap).len(), 0, "blackhole must block");
    bed.set_blackhole(false);
    assert_eq!(
        udp_blast(&bed, 20, gap).len(),
        20,
        "blackhole off must restore"
    );
    let st = bed.stats();
    assert_eq!(st.client_to_server.drop_loss, 40);
}

#[test]
fn teardown_removes_everything_even_on_panic() {
    let Some(_g) = setup("teardown_removes_everything_even_on_panic") else {
        return;
    };
    // Normal drop, with a process still running inside the server host.
    let bed = TestBed::up(cfg(0)).unwrap();
    let names = [
        bed.netns(Host::Client).to_string(),
        bed.netns(Host::Server).to_string(),
    ];
    assert!(names.iter().all(|n| netns_exists(n)));
    let mut sleeper = bed
        .spawn_in(Host::Server, Command::new("sleep").arg("30"))
        .unwrap();
    drop(bed);
    for n in &names {
        assert!(!netns_exists(n), "{n} still exists");
    }
    let t0 = Instant::now();
    let status = sleeper.wait().unwrap();
    assert!(
        !status.success() && t0.elapsed() < Duration::from_secs(5),
        "process in the bed survived"
    );

    // A panic while the bed is up (quietly: no message or backtrace).
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let names = std::panic::catch_unwind(|| {
        let bed = TestBed::up(cfg(0)).unwrap();
        let names = [
            bed.netns(Host::Client).to_string(),
            bed.netns(Host::Server).to_string(),
        ];
        std::panic::panic_any(names)
    })
    .unwrap_err();
    std::panic::set_hook(hook);
    let names = names.downcast::<[String; 2]>().unwrap();
    for n in names.iter() {
        assert!(!netns_exists(n), "{n} still exists after a panic");
    }

    // down() reports and removes; no TUN device ever appears in this namespace.
    let bed = TestBed::up(cfg(0)).unwrap();
    let ns = bed.netns(Host::Client).to_string();
    let stats = bed.down().unwrap();
    assert!(!stats.running);
    assert!(!netns_exists(&ns));
    let links = Command::new(find_in_path("ip").unwrap())
        .args(["-o", "link"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&links.stdout).contains("fnm0"));
}

#[test]
fn regimes_set_namespaced_tcp_buffers() {
    let Some(_g) = setup("regimes_set_namespaced_tcp_buffers") else {
        return;
    };
    let read = |bed: &TestBed, key: &str| {
        bed.run_in(Host::Client, || {
            std::fs::read_to_string(format!("/proc/sys/net/ipv4/{key}"))
        })
        .unwrap()
        .unwrap()
        .split_whitespace()
        .map(|x| x.parse::<u64>().unwrap())
        .collect::<Vec<_>>()
    };
    let host_rmem: Vec<u64> = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_rmem")
        .unwrap()
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    let bed = TestBed::up(cfg(0)).unwrap();
    assert_eq!(read(&bed, "tcp_wmem")[2], 4_194_304);
    assert_eq!(read(&bed, "tcp_rmem"), host_rmem);
    drop(bed);
    let bed = TestBed::up(BedConfig {
        regime: Regime::Tuned,
        ..cfg(0)
    })
    .unwrap();
    assert_eq!(read(&bed, "tcp_wmem")[2], 104_857_600);
    assert_eq!(read(&bed, "tcp_rmem")[2], 104_857_600);
    for n in bed.notes() {
        eprintln!("note: {n}");
    }
}

#[test]
fn cli_up_exec_blackhole_down() {
    let Some(_g) = setup("cli_up_exec_blackhole_down") else {
        return;
    };
    let ping = needs("cli_up_exec_blackhole_down", tool("ping")).is_some();
    let bin = env!("CARGO_BIN_EXE_ferry-netem");
    let name = format!("fnmcli{}", std::process::id());
    let run = |args: &[&str]| {
        Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    /// Brings the bed down on drop, whatever happens.
    struct Down<'a>(&'a str, &'a str);
    impl Drop for Down<'_> {
        fn drop(&mut self) {
            let _ = Command::new(self.0)
                .args(["down", "--name", self.1])
                .output();
        }
    }
    // An initial window out of range is refused before anything is created.
    assert!(!run(&["up", "--name", &name, "--initial-window", "0"])
        .status
        .success());
    assert!(!netns_exists(&format!("{name}-c")));
    let out = run(&[
        "up",
        "--name",
        &name,
        "--rtt",
        "20ms",
        "--rate",
        "100mbit",
        "--initial-window",
        "40",
        "--tcp-fastopen",
    ]);
    let _down = Down(bin, &name);
    assert!(
        out.status.success(),
        "up: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let state: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(state["server"]["addr"], "10.77.0.2");
    assert_eq!(state["config"]["initial_window"], 40);
    assert_eq!(state["config"]["fast_open"], true);
    assert!(netns_exists(&format!("{name}-c")) && netns_exists(&format!("{name}-s")));
    // Both hosts' route over the link starts connections at 40 segments, and keeps its
    // source address (a `route change` that forgot it would drop it).
    for (host, src) in [("c", "10.77.0.1"), ("s", "10.77.0.2")] {
        let out = Command::new("ip")
            .args(["-n", &format!("{name}-{host}"), "-j", "route", "show"])
            .output()
            .unwrap();
        let routes: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let r = &routes[0];
        assert_eq!(r["dst"], "10.77.0.0/24", "{routes}");
        assert_eq!(r["prefsrc"], src, "{routes}");
        assert_eq!(r["metrics"][0]["initcwnd"], 40, "{routes}");
        assert_eq!(r["metrics"][0]["initrwnd"], 40, "{routes}");
        // Both hosts allow TCP Fast Open, client and server side.
        let out = Command::new("ip")
            .args(["netns", "exec", &format!("{name}-{host}")])
            .args(["cat", "/proc/sys/net/ipv4/tcp_fastopen"])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "3", "{host}");
    }

    // A second `up` of the same name fails cleanly.
    assert!(!run(&["up", "--name", &name]).status.success());

    // Reachability through the bed, driven with the CLI's own commands.
    let probe = |expect: bool| {
        let out = if ping {
            run(&[
                "exec",
                "--name",
                &name,
                "client",
                "--",
                "ping",
                "-c",
                "2",
                "-i",
                "0.2",
                "-W",
                "1",
                "-q",
                "10.77.0.2",
            ])
        } else {
            return;
        };
        assert_eq!(
            out.status.success(),
            expect,
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    };
    probe(true);
    assert!(run(&["blackhole", "--name", &name, "on"]).status.success());
    probe(false);
    assert!(run(&["blackhole", "--name", &name, "off"]).status.success());
    probe(true);
    assert!(run(&["set", "--name", &name, "--loss", "1.0"])
        .status
        .success());
    probe(false);
    assert!(
        run(&["set", "--name", &name, "--loss", "0", "--rtt", "2ms"])
            .status
            .success()
    );
    probe(true);
    // exec passes the exit status through.
    assert!(run(&["exec", "--name", &name, "server", "--", "true"])
        .status
        .success());
    assert!(!run(&["exec", "--name", &name, "server", "--", "false"])
        .status
        .success());

    let st = run(&["status", "--name", &name]);
    let st: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert_eq!(st["beds"][0]["running"], true);

    let out = run(&["down", "--name", &name]);
    assert!(
        out.status.success(),
        "down: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stats["running"], false);
    assert!(!netns_exists(&format!("{name}-c")) && !netns_exists(&format!("{name}-s")));
    assert!(!std::path::Path::new("/run/ferry-netem")
        .join(&name)
        .exists());
    // Idempotent.
    assert!(run(&["down", "--name", &name]).status.success());
}
