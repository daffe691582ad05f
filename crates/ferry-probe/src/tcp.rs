//! TCP settings from `/proc/sys/net`, and advice computed from them by a pure function.

use serde::Serialize;

use ferry_units::units::{format_bytes as bytes, format_mbps as rate, format_ms as ms, MIB};

/// The kernel's TCP settings that bound one stream's throughput. `None` where unreadable.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct TcpSettings {
    /// `net.ipv4.tcp_rmem`: min, default, max receive buffer of an autotuned socket (bytes).
    pub tcp_rmem: Option<[u64; 3]>,
    /// `net.ipv4.tcp_wmem`: min, default, max send buffer of an autotuned socket (bytes).
    pub tcp_wmem: Option<[u64; 3]>,
    /// `net.core.rmem_max`: the cap on SO_RCVBUF (what `--tcp-window` can set).
    pub core_rmem_max: Option<u64>,
    /// `net.core.wmem_max`: the cap on SO_SNDBUF.
    pub core_wmem_max: Option<u64>,
    /// `net.ipv4.tcp_congestion_control`.
    pub congestion_control: Option<String>,
    /// `net.ipv4.tcp_available_congestion_control`.
    pub available_congestion_control: Vec<String>,
    /// `net.ipv4.tcp_allowed_congestion_control`: what unprivileged programs may choose.
    pub allowed_congestion_control: Vec<String>,
    /// `net.ipv4.tcp_window_scaling`.
    pub window_scaling: Option<bool>,
    /// `net.ipv4.tcp_moderate_rcvbuf` (receive-buffer autotuning).
    pub moderate_rcvbuf: Option<bool>,
    /// `net.ipv4.tcp_slow_start_after_idle`.
    pub slow_start_after_idle: Option<bool>,
    /// `net.core.default_qdisc`.
    pub default_qdisc: Option<String>,
    /// `net.ipv4.tcp_fastopen`: bit 1 lets this host's clients send data in a SYN, bit 2 lets
    /// its listeners accept it (TCP Fast Open, RFC 7413; Linux's default is 1, client only).
    pub fastopen: Option<u32>,
}

/// The `/proc/sys` files [`TcpSettings`] is read from, as `(field, path)`.
pub const TCP_FILES: &[(&str, &str)] = &[
    ("tcp_rmem", "/proc/sys/net/ipv4/tcp_rmem"),
    ("tcp_wmem", "/proc/sys/net/ipv4/tcp_wmem"),
    ("core_rmem_max", "/proc/sys/net/core/rmem_max"),
    ("core_wmem_max", "/proc/sys/net/core/wmem_max"),
    (
        "congestion_control",
        "/proc/sys/net/ipv4/tcp_congestion_control",
    ),
    (
        "available_congestion_control",
        "/proc/sys/net/ipv4/tcp_available_congestion_control",
    ),
    (
        "allowed_congestion_control",
        "/proc/sys/net/ipv4/tcp_allowed_congestion_control",
    ),
    ("window_scaling", "/proc/sys/net/ipv4/tcp_window_scaling"),
    ("moderate_rcvbuf", "/proc/sys/net/ipv4/tcp_moderate_rcvbuf"),
    (
        "slow_start_after_idle",
        "/proc/sys/net/ipv4/tcp_slow_start_after_idle",
    ),
    ("default_qdisc", "/proc/sys/net/core/default_qdisc"),
    ("fastopen", "/proc/sys/net/ipv4/tcp_fastopen"),
];

/// Parses a `tcp_rmem`/`tcp_wmem` value (`"4096\t131072\t6291456"`).
pub fn parse_triple(s: &str) -> Option<[u64; 3]> {
    let v: Vec<u64> = s
        .split_whitespace()
        .map(|t| t.parse().ok())
        .collect::<Option<_>>()?;
    <[u64; 3]>::try_from(v).ok()
}

impl TcpSettings {
    /// Sets one field from the text of its `/proc/sys` file (names as in [`TCP_FILES`]).
    /// Returns false when the text does not parse.
    pub fn set(&mut self, field: &str, text: &str) -> bool {
        let t = text.trim();
        let flag = || t.parse::<u8>().ok().map(|v| v != 0);
        let list = || t.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        match field {
            "tcp_rmem" => self.tcp_rmem = parse_triple(t),
            "tcp_wmem" => self.tcp_wmem = parse_triple(t),
            "core_rmem_max" => self.core_rmem_max = t.parse().ok(),
            "core_wmem_max" => self.core_wmem_max = t.parse().ok(),
            "congestion_control" => self.congestion_control = Some(t.to_string()),
            "available_congestion_control" => {
                self.available_congestion_control = list();
                return true;
            }
            "allowed_congestion_control" => {
                self.allowed_congestion_control = list();
                return true;
            }
            "window_scaling" => self.window_scaling = flag(),
            "moderate_rcvbuf" => self.moderate_rcvbuf = flag(),
            "slow_start_after_idle" => self.slow_start_after_idle = flag(),
            "default_qdisc" => self.default_qdisc = Some(t.to_string()),
            "fastopen" => self.fastopen = t.parse().ok(),
            _ => return false,
        }
        match field {
            "tcp_rmem" => self.tcp_rmem.is_some(),
            "tcp_wmem" => self.tcp_wmem.is_some(),
            "core_rmem_max" => self.core_rmem_max.is_some(),
            "core_wmem_max" => self.core_wmem_max.is_some(),
            "window_scaling" => self.window_scaling.is_some(),
            "moderate_rcvbuf" => self.moderate_rcvbuf.is_some(),
            "slow_start_after_idle" => self.slow_start_after_idle.is_some(),
            "fastopen" => self.fastopen.is_some(),
            _ => true,
        }
    }
}

/// What the advice is computed against.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct AdviceInputs {
    /// The round-trip time of the paths ferry is meant for (ms), e.g. 100.
    pub rtt_ms: f64,
    /// The rate a transfer should reach (Mbit/s), e.g. the NIC speed.
    pub target_mbps: f64,
}

/// The throughput cap (Mbit/s) of one TCP stream whose window is `window` bytes at `rtt_ms`:
/// at most one window per round trip. 4 MiB at 100 ms → 335.5 Mbit/s.
pub fn stream_cap_mbps(window: u64, rtt_ms: f64) -> f64 {
    window as f64 * 8.0 / (rtt_ms / 1000.0) / 1e6
}

/// The bandwidth-delay product (bytes) of `mbps` at `rtt_ms`.
pub fn bdp_bytes(mbps: f64, rtt_ms: f64) -> u64 {
    (mbps * 1e6 / 8.0 * rtt_ms / 1000.0).ceil() as u64
}

/// Advice on TCP settings, one sentence each, most important first. Pure: the same settings and
/// inputs give the same advice.
pub fn tcp_advice(t: &TcpSettings, inp: &AdviceInputs) -> Vec<String> {
    let mut out = Vec::new();
    let rtt = inp.rtt_ms;
    let target = inp.target_mbps;
    let bdp = bdp_bytes(target, rtt);
    // The buffer to suggest: the BDP rounded up to a power of two, at least 16 MiB.
    let suggest = bdp.next_power_of_two().max(16 * MIB);

    if t.window_scaling == Some(false) {
        out.push(format!(
            "TCP window scaling is off (net.ipv4.tcp_window_scaling=0): every stream's window is \
             at most 64 KiB, {} at {}; sysctl -w net.ipv4.tcp_window_scaling=1",
            rate(stream_cap_mbps(64 * 1024, rtt)),
            ms(rtt)
        ));
    }

    for (name, triple) in [("tcp_wmem", t.tcp_wmem), ("tcp_rmem", t.tcp_rmem)] {
        let Some([min, def, max]) = triple else {
            continue;
        };
        let cap = stream_cap_mbps(max, rtt);
        if cap < target {
            let streams = (target / cap).ceil() as u64;
            out.push(format!(
                "{name} max is {}: one TCP stream at {} RTT is capped near {}; ferry uses \
                 parallel streams (--streams {streams} would fill {}), or raise net.ipv4.{name} \
                 max: sysctl -w net.ipv4.{name}=\"{min} {def} {suggest}\" (the bandwidth-delay \
                 product of {} at {} is {})",
                bytes(max),
                ms(rtt),
                rate(cap),
                rate(target),
                rate(target),
                ms(rtt),
                bytes(bdp),
            ));
        }
    }

    if t.moderate_rcvbuf == Some(false) {
        let def = t
            .tcp_rmem
            .map(|r| bytes(r[1]))
            .unwrap_or("its default".into());
        out.push(format!(
            "receive-buffer autotuning is off (net.ipv4.tcp_moderate_rcvbuf=0): receive windows \
             stay at tcp_rmem's default ({def}); sysctl -w net.ipv4.tcp_moderate_rcvbuf=1"
        ));
    }

    for (name, core, tcp) in [
        ("wmem_max", t.core_wmem_max, t.tcp_wmem),
        ("rmem_max", t.core_rmem_max, t.tcp_rmem),
    ] {
        if let (Some(core), Some(tcp)) = (core, tcp) {
            if core < tcp[2] {
                out.push(format!(
                    "net.core.{name} is {}, below the autotuning max {}: --tcp-window is cut \
                     to {} (and turns autotuning off); leave --tcp-window unset",
                    bytes(core),
                    bytes(tcp[2]),
                    bytes(core)
                ));
            }
        }
    }

    if let Some(cc) = t.congestion_control.as_deref() {
        let has_bbr = t.available_congestion_control.iter().any(|c| c == "bbr");
        if cc != "bbr" && !cc.starts_with("bbr") {
            if has_bbr {
                out.push(format!(
                    "congestion control is {cc}; bbr is available and keeps long paths with some \
                     loss far fuller: sysctl -w net.ipv4.tcp_congestion_control=bbr"
                ));
            } else {
                out.push(format!(
                    "congestion control is {cc}; on long paths with some loss bbr keeps \
                     throughput far higher: modprobe tcp_bbr; sysctl -w \
                     net.ipv4.tcp_congestion_control=bbr"
                ));
            }
        }
    }

    if t.slow_start_after_idle == Some(true) {
        out.push(
            "net.ipv4.tcp_slow_start_after_idle=1: a stream that pauses for one retransmission \
             timeout restarts from a small window; sysctl -w \
             net.ipv4.tcp_slow_start_after_idle=0 on transfer nodes"
                .to_string(),
        );
    }

    // Fast Open saves each connection the round trip of its SYN before TLS: worth saying from
    // the RTTs ferry's wide start is for, where it is ~1% of a 1 GiB transfer and more of a
    // short one (BENCHMARKS.md, "TCP Fast Open").
    if let Some(fo) = t.fastopen {
        if rtt >= 20.0 && fo & 3 != 3 {
            let missing = match (fo & 1 != 0, fo & 2 != 0) {
                (true, false) => {
                    "its listeners refuse data in a SYN (bit 2 unset), so every ferry connection \
                     to a server here"
                }
                (false, true) => {
                    "its clients send no data in a SYN (bit 1 unset), so every ferry connection \
                     from a client here"
                }
                _ => "it is off both ways, so every ferry connection to or from this host",
            };
            out.push(format!(
                "TCP Fast Open (net.ipv4.tcp_fastopen={fo}): {missing} \
                 waits a round trip ({}) for its SYN before TLS starts; \
                 sysctl -w net.ipv4.tcp_fastopen={} on transfer nodes lets a client's TLS hello \
                 ride in the SYN once it holds the server's cookie (ferry uses it where both \
                 ends allow it; FERRY_TCP_FASTOPEN=0 turns it off)",
                ms(rtt),
                fo | 3
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn linux_defaults() -> TcpSettings {
        let mut t = TcpSettings::default();
        assert!(t.set("tcp_rmem", "4096\t131072\t6291456\n"));
        assert!(t.set("tcp_wmem", "4096\t16384\t4194304\n"));
        assert!(t.set("core_rmem_max", "212992\n"));
        assert!(t.set("core_wmem_max", "212992\n"));
        assert!(t.set("congestion_control", "cubic\n"));
        assert!(t.set("available_congestion_control", "reno cubic\n"));
        assert!(t.set("allowed_congestion_control", "reno cubic\n"));
        assert!(t.set("window_scaling", "1\n"));
        assert!(t.set("moderate_rcvbuf", "1\n"));
        assert!(t.set("slow_start_after_idle", "0\n"));
        assert!(t.set("default_qdisc", "fq_codel\n"));
        assert!(t.set("fastopen", "1\n"));
        t
    }

    #[test]
    fn advice_on_fast_open_names_the_missing_side() {
        let inp = AdviceInputs {
            rtt_ms: 100.0,
            target_mbps: 1000.0,
        };
        let fo = |t: &TcpSettings| {
            tcp_advice(t, &inp)
                .into_iter()
                .filter(|a| a.starts_with("TCP Fast Open"))
                .collect::<Vec<_>>()
        };
        let mut t = linux_defaults();
        let a = fo(&t);
        assert_eq!(a.len(), 1, "{a:?}");
        assert!(
            a[0].contains("tcp_fastopen=1): its listeners refuse"),
            "{}",
            a[0]
        );
        assert!(
            a[0].contains("sysctl -w net.ipv4.tcp_fastopen=3"),
            "{}",
            a[0]
        );
        assert!(a[0].contains("(100 ms)"), "{}", a[0]);
        // Other bits (0x400: every listener, without the socket option) are kept in the
        // suggestion.
        assert!(t.set("fastopen", "1026"));
        assert!(fo(&t)[0].contains("tcp_fastopen=1027 on"), "{:?}", fo(&t));
        assert!(t.set("fastopen", "0"));
        assert!(fo(&t)[0].contains("off both ways"), "{:?}", fo(&t));
        assert!(t.set("fastopen", "3"));
        assert!(fo(&t).is_empty());
        // A short path has little to save.
        assert!(t.set("fastopen", "1"));
        let near = AdviceInputs {
            rtt_ms: 1.0,
            target_mbps: 1000.0,
        };
        assert!(!tcp_advice(&t, &near)
            .iter()
            .any(|a| a.starts_with("TCP Fast Open")));
        assert!(!TcpSettings::default().set("fastopen", "on"));
    }

    #[test]
    fn parses() {
        let t = linux_defaults();
        assert_eq!(t.tcp_wmem, Some([4096, 16384, 4194304]));
        assert_eq!(t.available_congestion_control, vec!["reno", "cubic"]);
        assert_eq!(t.window_scaling, Some(true));
        assert!(!TcpSettings::default().set("tcp_rmem", "1 2"));
        assert!(!TcpSettings::default().set("window_scaling", "yes"));
        assert!(!TcpSettings::default().set("nonsense", "1"));
    }

    #[test]
    fn caps() {
        assert_eq!(stream_cap_mbps(4 << 20, 100.0).floor(), 335.0);
        assert_eq!(bdp_bytes(10_000.0, 100.0), 125_000_000);
    }

    #[test]
    fn advice_for_a_4_mib_wmem() {
        let t = linux_defaults();
        let a = tcp_advice(
            &t,
            &AdviceInputs {
                rtt_ms: 100.0,
                target_mbps: 10_000.0,
            },
        );
        let w = a
            .iter()
            .find(|s| s.starts_with("tcp_wmem"))
            .expect("wmem advice");
        assert!(
            w.starts_with(
                "tcp_wmem max is 4 MiB: one TCP stream at 100 ms RTT is capped near 335 \
                 Mbit/s; ferry uses parallel streams (--streams 30 would fill 10 Gbit/s), or \
                 raise net.ipv4.tcp_wmem max"
            ),
            "{w}"
        );
        assert!(
            w.contains("sysctl -w net.ipv4.tcp_wmem=\"4096 16384 134217728\""),
            "{w}"
        );
        assert!(w.contains("is 119 MiB"), "{w}");
        // 6 MiB rmem: capped near 503 Mbit/s, also below 10 Gbit/s.
        assert!(
            a.iter().any(|s| s.starts_with("tcp_rmem max is 6 MiB")),
            "{a:?}"
        );
        // core maxima below the autotuning maxima: --tcp-window advice.
        assert!(
            a.iter()
                .any(|s| s.starts_with("net.core.wmem_max is 208 KiB")),
            "{a:?}"
        );
        // cubic without bbr available.
        assert!(a.iter().any(|s| s.contains("modprobe tcp_bbr")), "{a:?}");
        assert!(
            !a.iter().any(|s| s.contains("slow_start_after_idle")),
            "{a:?}"
        );
    }

    #[test]
    fn no_advice_when_buffers_are_large() {
        let mut t = linux_defaults();
        t.set("tcp_rmem", "4096 131072 268435456");
        t.set("tcp_wmem", "4096 16384 268435456");
        t.set("core_rmem_max", "268435456");
        t.set("core_wmem_max", "268435456");
        t.set("congestion_control", "bbr");
        t.set("fastopen", "3");
        let inp = AdviceInputs {
            rtt_ms: 100.0,
            target_mbps: 10_000.0,
        };
        assert_eq!(tcp_advice(&t, &inp), Vec::<String>::new());

        // The same 256 MiB is not enough for 100 Gbit/s at 100 ms.
        let a = tcp_advice(
            &t,
            &AdviceInputs {
                rtt_ms: 100.0,
                target_mbps: 100_000.0,
            },
        );
        assert_eq!(a.len(), 2, "{a:?}");
        assert!(
            a[0].contains("--streams 5 would fill 100 Gbit/s"),
            "{}",
            a[0]
        );
    }

    #[test]
    fn advice_on_switches() {
        let mut t = linux_defaults();
        t.set("window_scaling", "0");
        t.set("moderate_rcvbuf", "0");
        t.set("slow_start_after_idle", "1");
        t.set("available_congestion_control", "reno cubic bbr");
        let a = tcp_advice(
            &t,
            &AdviceInputs {
                rtt_ms: 100.0,
                target_mbps: 1000.0,
            },
        );
        assert!(a[0].contains("window scaling is off"), "{a:?}");
        assert!(
            a.iter().any(|s| s.contains("tcp_moderate_rcvbuf=1")),
            "{a:?}"
        );
        assert!(
            a.iter().any(|s| s.contains("slow_start_after_idle=0")),
            "{a:?}"
        );
        assert!(
            a.iter()
                .any(|s| s.contains("bbr is available") && !s.contains("modprobe")),
            "{a:?}"
        );
    }
}
