//! Integration tests of topologies: several hosts, a link per pair, parallel links. They need
//! root, /dev/net/tun and `ip` (and ping for one): without them each test says why and
//! returns, or fails when `CI` is set (`ferry_netem::needs`). Every wait is bounded.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use ferry_netem::{
    can_run, find_in_path, needs, End, LinkConfig, Regime, Topology, TopologyConfig,
};

/// Longest a socket operation of these tests waits.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn config(hosts: &[&str], links: Vec<LinkConfig>) -> TopologyConfig {
    TopologyConfig {
        hosts: hosts.iter().map(|h| h.to_string()).collect(),
        links,
        regime: Regime::Default,
    }
}

/// Client, A and B with a link per pair, each with its own RTT: 0 = c–a 10 ms, 1 = c–b 30 ms,
/// 2 = a–b 50 ms.
fn three_hosts() -> TopologyConfig {
    config(
        &["c", "a", "b"],
        vec![
            LinkConfig::new(0, 1, ms(10), None),
            LinkConfig::new(0, 2, ms(30), None),
            LinkConfig::new(1, 2, ms(50), None),
        ],
    )
}

/// A TCP connection from host `from` to host `to` over link `link`: the client stream (in
/// `from`) and the server's accepted stream (in `to`), both with I/O timeouts.
fn connect(topo: &Topology, from: usize, to: usize, link: usize) -> (TcpStream, TcpStream) {
    let dst = topo.addr_of(link, to).expect("`to` is on the link");
    let listener = topo
        .run_in(to, || TcpListener::bind((dst, 0)))
        .unwrap()
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let client = topo
        .run_in(from, || {
            TcpStream::connect_timeout(&SocketAddr::from((dst, port)), IO_TIMEOUT)
        })
        .unwrap()
        .unwrap();
    // The handshake is done: the connection waits in the backlog.
    let (server, _) = listener.accept().unwrap();
    for s in [&client, &server] {
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    }
    (client, server)
}

/// Reads `s` to its end on a thread: (bytes, seconds from the first byte to the end).
fn drain(mut s: TcpStream) -> std::thread::JoinHandle<(u64, f64)> {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        let (mut total, mut first) = (0u64, None);
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    first.get_or_insert_with(Instant::now);
                    total += n as u64;
                }
            }
        }
        (total, first.map_or(0.0, |t| t.elapsed().as_secs_f64()))
    })
}

/// Sends `bytes` from host `from` to host `to` over link `link` and returns what arrived,
/// and the client's local address.
fn transfer(
    topo: &Topology,
    from: usize,
    to: usize,
    link: usize,
    bytes: usize,
) -> (u64, SocketAddr) {
    let (mut client, server) = connect(topo, from, to, link);
    let local = client.local_addr().unwrap();
    let reader = drain(server);
    client.write_all(&vec![7u8; bytes]).unwrap();
    client.shutdown(Shutdown::Write).unwrap();
    (reader.join().unwrap().0, local)
}

/// (min, avg) RTT in ms of `ping` from host `from` to `to`, or why it failed.
fn ping(topo: &Topology, from: usize, to: std::net::Ipv4Addr) -> Result<(f64, f64), String> {
    let out = topo
        .command(from, "ping")
        .args(["-c", "4", "-i", "0.2", "-w", "5", "-q", &to.to_string()])
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let stats = text
        .lines()
        .find_map(|l| l.split_once("min/avg/max/mdev = "))
        .map(|(_, v)| {
            v.split('/')
                .filter_map(|x| x.parse::<f64>().ok())
                .collect::<Vec<_>>()
        });
    match stats.as_deref() {
        Some([min, avg, ..]) if out.status.success() => Ok((*min, *avg)),
        _ => Err(format!(
            "ping {to}: {}{}",
            text,
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}

#[test]
fn ping_over_each_link_shows_its_rtt() {
    let Some(()) = needs("ping_over_each_link_shows_its_rtt", can_run()) else {
        return;
    };
    let Some(_) = needs(
        "ping_over_each_link_shows_its_rtt",
        find_in_path("ping").ok_or("ping not installed (scripts/netem-deps.sh)"),
    ) else {
        return;
    };
    let cfg = three_hosts();
    let topo = Topology::up(cfg.clone()).unwrap();
    for (i, l) in cfg.links.iter().enumerate() {
        let rtt = l.rtt.as_secs_f64() * 1e3;
        let (min, avg) = ping(&topo, l.a, topo.addr(i, End::B)).unwrap();
        eprintln!("link {i}: set {rtt} ms, ping min {min} avg {avg} ms");
        assert!(
            min >= rtt,
            "link {i}: ping min {min} ms below the set {rtt} ms"
        );
        assert!(
            avg < rtt + 50.0,
            "link {i}: ping avg {avg} ms, set {rtt} ms"
        );
    }
    // The client is on no link with 10.78.2.0/24 (a–b): no route there.
    let c = topo.host("c").unwrap();
    assert!(ping(&topo, c, topo.addr(2, End::A)).is_err());
    let stats = topo.down().unwrap();
    assert_eq!(stats.len(), 3);
    for s in &stats {
        // 4 echo requests and replies, each 84 IP bytes.
        assert!(
            s.a_to_b.tx_packets >= 4 && s.b_to_a.tx_packets >= 4,
            "{s:?}"
        );
    }
}

#[test]
fn a_transfer_shows_up_on_its_link_only() {
    let Some(()) = needs("a_transfer_shows_up_on_its_link_only", can_run()) else {
        return;
    };
    let topo = Topology::up(three_hosts()).unwrap();
    let (c, a) = (topo.host("c").unwrap(), topo.host("a").unwrap());
    let bytes = 4 << 20;
    let (got, local) = transfer(&topo, c, a, 0, bytes);
    assert_eq!(got, bytes as u64);
    assert_eq!(local.ip(), topo.addr(0, End::A));
    let stats = topo.down().unwrap();
    // Link 0 is c (a end) – a (b end): the data went a_to_b, as whole IP packets.
    let data = &stats[0].a_to_b;
    assert!(data.tx_bytes > bytes as u64, "{data:?}");
    assert!(data.tx_bytes < bytes as u64 * 11 / 10, "{data:?}");
    assert_eq!(data.rx_bytes, data.tx_bytes, "nothing dropped: {data:?}");
    for s in &stats[1..] {
        let other = s.delivered_bytes();
        eprintln!("link {}: {other} bytes", s.link);
        assert!(other < bytes as u64 / 100, "link {}: {s:?}", s.link);
    }
}

#[test]
fn parallel_links_carry_traffic_bound_to_their_own_addresses() {
    let name = "parallel_links_carry_traffic_bound_to_their_own_addresses";
    let Some(()) = needs(name, can_run()) else {
        return;
    };
    let links = (0..2).map(|_| LinkConfig::new(0, 1, ms(2), None)).collect();
    let topo = Topology::up(config(&["c", "s"], links)).unwrap();
    let sizes = [1 << 20, 3 << 20];
    let mut before = topo.stats();
    for (link, &bytes) in sizes.iter().enumerate() {
        let (got, local) = transfer(&topo, 0, 1, link, bytes);
        assert_eq!(got, bytes as u64);
        assert_eq!(local.ip(), topo.addr(link, End::A));
        let after = topo.stats();
        for (i, (b, a)) in before.iter().zip(&after).enumerate() {
            let moved = a.a_to_b.tx_bytes - b.a_to_b.tx_bytes;
            if i == link {
                assert!(
                    (bytes as u64..bytes as u64 * 11 / 10).contains(&moved),
                    "link {i}: {moved}"
                );
            } else {
                assert!(
                    moved < bytes as u64 / 100,
                    "link {i} carried {moved} of link {link}'s data"
                );
            }
        }
        before = after;
    }
    // Each link's controls are its own.
    topo.set_blackhole(0, true);
    assert!(!udp_passes(&topo, 0));
    assert!(udp_passes(&topo, 1));
    topo.set_blackhole(0, false);
    topo.set_loss(1, 1.0);
    assert!(udp_passes(&topo, 0));
    assert!(!udp_passes(&topo, 1));
    assert!(topo.link_stats(1).b_to_a.drop_loss == 0 && topo.link_stats(1).a_to_b.drop_loss >= 3);
}

/// Whether any of 3 datagrams from host 0 to host 1 over link `link` arrives (200 ms each).
fn udp_passes(topo: &Topology, link: usize) -> bool {
    let (src, dst) = (topo.addr(link, End::A), topo.addr(link, End::B));
    let rx = topo
        .run_in(1, || UdpSocket::bind((dst, 0)))
        .unwrap()
        .unwrap();
    let tx = topo
        .run_in(0, || UdpSocket::bind((src, 0)))
        .unwrap()
        .unwrap();
    rx.set_read_timeout(Some(ms(200))).unwrap();
    let to = rx.local_addr().unwrap();
    let mut buf = [0u8; 16];
    (0..3).any(|_| {
        tx.send_to(b"x", to).unwrap();
        rx.recv_from(&mut buf).is_ok()
    })
}

#[test]
fn a_link_rate_limits_throughput() {
    let Some(()) = needs("a_link_rate_limits_throughput", can_run()) else {
        return;
    };
    let rate = 100_000_000;
    let links = vec![LinkConfig::new(0, 1, ms(4), Some(rate))];
    let topo = Topology::up(config(&["c", "s"], links)).unwrap();
    let (mut client, server) = connect(&topo, 0, 1, 0);
    let reader = drain(server);
    let chunk = vec![1u8; 1 << 16];
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(2) {
        client.write_all(&chunk).unwrap();
    }
    client.shutdown(Shutdown::Write).unwrap();
    let (got, secs) = reader.join().unwrap();
    let mbit = got as f64 * 8.0 / secs / 1e6;
    eprintln!("{got} bytes in {secs:.3} s: {mbit:.1} Mbit/s through a 100 Mbit/s link");
    assert!(secs > 1.5, "{secs} s");
    assert!(mbit <= 115.0, "{mbit} Mbit/s through a 100 Mbit/s link");
    // Far below the rate would mean the link barely works, not that it limits.
    assert!(mbit >= 20.0, "{mbit} Mbit/s through a 100 Mbit/s link");
    let s = topo.down().unwrap();
    assert!(s[0].a_to_b.tx_bytes > got, "{:?}", s[0].a_to_b);
}

#[test]
fn teardown_removes_every_host_even_on_panic() {
    let Some(()) = needs("teardown_removes_every_host_even_on_panic", can_run()) else {
        return;
    };
    let exists = |ns: &str| std::path::Path::new("/run/netns").join(ns).exists();
    let topo = Topology::up(three_hosts()).unwrap();
    let names: Vec<String> = (0..3).map(|h| topo.netns(h).to_string()).collect();
    let name = topo.name().to_string();
    assert!(
        names.iter().all(|n| exists(n) && n.starts_with(&name)),
        "{names:?}"
    );
    let mut sleeper = topo
        .spawn_in(1, std::process::Command::new("sleep").arg("30"))
        .unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _topo = topo;
        panic!("test panic");
    }));
    assert!(r.is_err());
    assert!(names.iter().all(|n| !exists(n)), "{names:?}");
    // Killed with its namespace; reaped here, bounded.
    let t0 = Instant::now();
    while sleeper.try_wait().unwrap().is_none() && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(ms(20));
    }
    assert!(
        sleeper.try_wait().unwrap().is_some(),
        "process left in a host survived"
    );
    // A host left by a process that died is removed by the next `up`.
    let dead = (4_000_000..4_194_303)
        .rev()
        .find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
        .unwrap();
    let stale = format!("fnm-{dead}-0-a");
    ferry_netem::delete_netns(&stale).unwrap();
    let out = std::process::Command::new(find_in_path("ip").unwrap())
        .args(["netns", "add", &stale])
        .status()
        .unwrap();
    // (Any bed or topology coming up in a parallel test may reap it first.)
    assert!(out.success());
    drop(Topology::up(three_hosts()).unwrap());
    assert!(!exists(&stale), "{stale} was not reaped");
    // A bad configuration is an error, and leaves nothing behind.
    let mut bad = three_hosts();
    bad.links[2].b = 9;
    let e = Topology::up(bad).err().expect("host 9 does not exist");
    assert!(format!("{e:#}").contains("there are 3"), "{e:#}");
}

#[test]
fn every_host_gets_the_regime_and_each_link_its_device_and_mtu() {
    let name = "every_host_gets_the_regime_and_each_link_its_device_and_mtu";
    let Some(()) = needs(name, can_run()) else {
        return;
    };
    let mut cfg = three_hosts();
    cfg.regime = Regime::Tuned;
    cfg.links[1].mtu = 1500;
    let topo = Topology::up(cfg).unwrap();
    for h in 0..3 {
        let wmem = topo
            .run_in(h, || std::fs::read_to_string("/proc/sys/net/ipv4/tcp_wmem"))
            .unwrap()
            .unwrap();
        assert_eq!(
            wmem.split_whitespace().nth(2),
            Some("104857600"),
            "host {h}"
        );
    }
    // Host a (1) is on link 0 (b end) and link 2 (a end) only; link 1 has MTU 1500.
    let mtu = |host: usize, dev: &str| {
        let out = std::process::Command::new(find_in_path("ip").unwrap())
            .args(["-n", topo.netns(host), "-o", "link", "show", "dev", dev])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut words = text.split_whitespace();
        words.find(|w| *w == "mtu");
        words.next().map(str::to_string)
    };
    assert_eq!(mtu(1, "fl0").as_deref(), Some("9000"));
    assert_eq!(mtu(1, "fl2").as_deref(), Some("9000"));
    assert_eq!(mtu(1, "fl1"), None, "host a is not on link 1");
    assert_eq!(mtu(0, "fl1").as_deref(), Some("1500"));
    assert_eq!(mtu(2, "fl1").as_deref(), Some("1500"));
}
