//! The routing table's initial windows (`initcwnd`, `initrwnd`), and advice on them.
//!
//! Why: every new TCP connection starts at the kernel's 10 segments and about doubles its window
//! per round trip, so at long RTT a transfer spends its first round trips below the path's rate
//! whatever ferry does: more connections each start at 10 segments too, and past 16 their
//! uneven rates cost at the end what they gained at the start (BENCHMARKS.md, "1 GiB at 100 ms:
//! a wider start, measured again"). A larger initial window is a route attribute, an
//! administrator's choice like `tcp_wmem`: on the bed, `initcwnd 40 initrwnd 40` on both ends'
//! routes took a 1 GiB put at 100 ms from 9.30 to 9.18 s (6 pairs, every pair faster). The
//! kernel keeps these attributes in the routing table, which only netlink reads; `ip -j route`
//! (iproute2) is how this probe asks, and without it the advice is skipped with a note.

use std::process::Command;
use std::time::Duration;

use ferry_session::tune::TunerConfig;
use ferry_units::units::{format_bytes as bytes, format_mbps, format_thousands};
use serde::Serialize;

use crate::tcp::{bdp_bytes, AdviceInputs};

/// The kernel's initial congestion window when a route sets none (RFC 6928), in segments.
pub const KERNEL_INITIAL_WINDOW: u32 = 10;

/// The initial window the advice suggests, in segments: what was measured on the bed.
pub const SUGGESTED_INITIAL_WINDOW: u32 = 40;

/// Below this round-trip time slow start is over in a few milliseconds: no advice.
const ADVISE_FROM_RTT_MS: f64 = 20.0;

/// Streams a transfer of ferry's starts with at `rtt_ms` when nothing is remembered, the count
/// the advice's round trips are computed for: the tuner's own wide start
/// ([`TunerConfig::wide_start`]). An RTT that is not a finite number of milliseconds counts as
/// none; one beyond 1,000 s as 1,000 s.
pub fn starting_streams(rtt_ms: f64) -> u64 {
    let ms = if rtt_ms.is_finite() {
        rtt_ms.clamp(0.0, 1e6)
    } else {
        0.0
    };
    let rtt = Duration::from_secs_f64(ms / 1000.0);
    u64::from(TunerConfig::streams_for_rtt(rtt).wide_start(rtt).start)
}

/// IPv4 (or IPv6) and TCP headers with timestamps: what an MTU leaves for a segment's data.
const HEADERS_V4: u32 = 52;
const HEADERS_V6: u32 = 72;

/// One route of the main table, as far as the advice needs it.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Route {
    /// `"default"` or a prefix such as `"10.0.0.0/24"`.
    pub dst: String,
    pub gateway: Option<String>,
    pub dev: Option<String>,
    /// `proto`, `scope`, `src` and `metric`: repeated in a suggested `ip route change`, which
    /// would otherwise reset them.
    pub protocol: Option<String>,
    pub scope: Option<String>,
    pub prefsrc: Option<String>,
    pub metric: Option<u64>,
    /// The route's MTU when it sets one (segments are then sized by it).
    pub mtu: Option<u32>,
    /// Initial congestion window (segments); `None`: the kernel's 10.
    pub initcwnd: Option<u32>,
    /// Initial receive window (segments); `None`: the kernel's.
    pub initrwnd: Option<u32>,
    /// Whether it is an IPv6 route.
    pub ipv6: bool,
    /// Attributes a command rebuilt from the fields above would lose: other metrics (a locked
    /// MTU, `advmss`, `congctl`, …), flags (`onlink`), a shared nexthop (`nhid`), several
    /// (`nexthops`), or an expiry (a router's advertisement). No command is suggested for it.
    pub more: bool,
}

impl Route {
    /// A unicast route out of a real interface (or several): the kind a transfer's connections
    /// take.
    fn carries_transfers(&self) -> bool {
        self.dev.as_deref() != Some("lo")
            && !self.dst.starts_with("fe80:")
            && !self.dst.starts_with("ff")
    }

    fn is_default(&self) -> bool {
        self.dst == "default" || self.dst == "0.0.0.0/0" || self.dst == "::/0"
    }

    /// The command that sets both initial windows to `window` on this route's paths, or `None`
    /// when one rebuilt from what is parsed would lose attributes ([`Route::more`]). For a
    /// default route, which also leads to the Internet at large, it adds a route of its own
    /// for a peer (`PEER` stands for its address or prefix); otherwise an `ip route change`
    /// that repeats the route's gateway, device, protocol, scope, source, metric and MTU.
    pub fn change_command(&self, window: u32) -> Option<String> {
        if self.more {
            return None;
        }
        let ip = if self.ipv6 { "ip -6 route" } else { "ip route" };
        let default = self.is_default();
        let mut c = if default {
            format!("{ip} add PEER")
        } else {
            format!("{ip} change {}", self.dst)
        };
        let mut add = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                c.push_str(&format!(" {k} {v}"));
            }
        };
        add("via", self.gateway.clone());
        add("dev", self.dev.clone());
        if !default {
            add("proto", self.protocol.clone());
            add("scope", self.scope.clone());
            add("metric", self.metric.map(|m| m.to_string()));
        }
        add("src", self.prefsrc.clone());
        add("mtu", self.mtu.map(|m| m.to_string()));
        c.push_str(&format!(" initcwnd {window} initrwnd {window}"));
        Some(c)
    }
}

/// Parses the JSON of `ip -j route show` (one table, one family). Entries of other kinds
/// (`"type": "multicast"`, `"local"`, …) are left out; an entry without `dst` is an error.
pub fn parse_ip_routes(text: &str, ipv6: bool) -> Result<Vec<Route>, String> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not the JSON of `ip -j route`: {e}"))?;
    let entries = v
        .as_array()
        .ok_or_else(|| "not the JSON of `ip -j route`: not an array".to_string())?;
    let mut out = Vec::new();
    for e in entries {
        if e.get("type")
            .and_then(|t| t.as_str())
            .is_some_and(|t| t != "unicast")
        {
            continue;
        }
        let s = |k: &str| e.get(k).and_then(|x| x.as_str()).map(str::to_string);
        let dst = s("dst").ok_or_else(|| format!("a route without dst: {e}"))?;
        let metric_of = |k: &str| -> Option<u64> {
            e.get("metrics")?
                .as_array()?
                .iter()
                .find_map(|m| m.get(k).and_then(|x| x.as_u64()))
        };
        let small = |k: &str| metric_of(k).and_then(|x| u32::try_from(x).ok());
        let other_metrics = e
            .get("metrics")
            .and_then(|m| m.as_array())
            .is_some_and(|m| {
                m.iter()
                    .filter_map(|x| x.as_object())
                    .flat_map(|o| o.keys())
                    .any(|k| !matches!(k.as_str(), "mtu" | "initcwnd" | "initrwnd"))
            });
        let flags = e
            .get("flags")
            .and_then(|f| f.as_array())
            .is_some_and(|f| !f.is_empty());
        let more = other_metrics
            || flags
            || ["nhid", "nexthops", "expires", "encap", "via"]
                .iter()
                .any(|k| e.get(k).is_some());
        out.push(Route {
            dst,
            gateway: s("gateway"),
            dev: s("dev"),
            protocol: s("protocol"),
            scope: s("scope"),
            prefsrc: s("prefsrc"),
            metric: e.get("metric").and_then(|x| x.as_u64()),
            mtu: small("mtu"),
            initcwnd: small("initcwnd"),
            initrwnd: small("initrwnd"),
            ipv6,
            more,
        });
    }
    Ok(out)
}

/// Where iproute2's `ip` may live when it is not in `PATH`: some systems install it only in an
/// sbin directory, which a non-root user's `PATH` need not hold, though reading routes needs no
/// privilege. (Debian 12 also installs /bin/ip, which every `PATH` has.) The same list as
/// `ferry_netem::find_in_path`, which the probe does not depend on.
const IP_DIRS: [&str; 4] = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"];

/// The `ip` to run: the first executable file of that name in `path` (a `PATH` value), else in
/// [`IP_DIRS`]; `None` if there is none. `is_file` is asked about each candidate.
pub(crate) fn find_ip(
    path: Option<&std::ffi::OsStr>,
    is_file: impl Fn(&std::path::Path) -> bool,
) -> Option<std::path::PathBuf> {
    let listed = path.map(|p| std::env::split_paths(p).collect::<Vec<_>>());
    listed
        .into_iter()
        .flatten()
        .chain(IP_DIRS.iter().map(std::path::PathBuf::from))
        .filter(|d| d.is_absolute())
        .map(|d| d.join("ip"))
        .find(|c| is_file(c))
}

pub(crate) fn is_executable(p: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The main table's IPv4 and IPv6 routes, from `ip -j route show` (iproute2). `Err` says why
/// not (no `ip`, or output that does not parse).
pub fn read_routes() -> Result<Vec<Route>, String> {
    let ip = find_ip(std::env::var_os("PATH").as_deref(), is_executable)
        .ok_or_else(|| format!("no `ip` (iproute2) in PATH or in {}", IP_DIRS.join(", ")))?;
    let mut all = Vec::new();
    for ipv6 in [false, true] {
        let mut c = Command::new(&ip);
        if ipv6 {
            c.arg("-6");
        }
        let out = c
            .args(["-j", "route", "show"])
            .output()
            .map_err(|e| format!("`ip -j route show` could not run: {e}"))?;
        if !out.status.success() {
            // A host without IPv6 says so on stderr; its IPv4 routes still count.
            if ipv6 {
                continue;
            }
            return Err(format!(
                "`ip -j route show` failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        match parse_ip_routes(&String::from_utf8_lossy(&out.stdout), ipv6) {
            Ok(routes) => all.extend(routes),
            // IPv4 is what a transfer node's peers are mostly reached by: keep its routes.
            Err(_) if ipv6 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(all)
}

/// Round trips a slow start from `KERNEL_INITIAL_WINDOW`-style `initial` segments of `mss`
/// bytes on each of `streams` connections takes to reach `bdp` bytes in flight, doubling per
/// round trip.
pub fn slow_start_round_trips(bdp: u64, streams: u64, initial: u32, mss: u32) -> u32 {
    let first = streams.max(1) * u64::from(initial.max(1)) * u64::from(mss.max(1));
    let mut rounds = 0;
    let mut flight = first;
    while flight < bdp && rounds < 64 {
        flight = flight.saturating_mul(2);
        rounds += 1;
    }
    rounds
}

/// Advice on routes that start connections at the kernel's 10 segments, for paths of the
/// inputs' RTT; `None` when the RTT is short or every route that carries transfers starts
/// larger. `mtu_of`: a device's MTU (segments are sized by the route's MTU, else the device's,
/// else 1500). Pure.
pub fn route_advice(
    routes: &[Route],
    inp: &AdviceInputs,
    mtu_of: impl Fn(&str) -> Option<u32>,
) -> Option<String> {
    if inp.rtt_ms < ADVISE_FROM_RTT_MS {
        return None;
    }
    let small: Vec<&Route> = routes
        .iter()
        .filter(|r| r.carries_transfers())
        .filter(|r| r.initcwnd.unwrap_or(KERNEL_INITIAL_WINDOW) < SUGGESTED_INITIAL_WINDOW)
        .collect();
    let first = small.first()?;
    let mtu = first
        .mtu
        .or_else(|| first.dev.as_deref().and_then(&mtu_of))
        .unwrap_or(1500);
    let headers = if first.ipv6 { HEADERS_V6 } else { HEADERS_V4 };
    let mss = mtu.saturating_sub(headers).max(536);
    let bdp = bdp_bytes(inp.target_mbps, inp.rtt_ms);
    let initial = first.initcwnd.unwrap_or(KERNEL_INITIAL_WINDOW);
    let streams = starting_streams(inp.rtt_ms);
    let now = slow_start_round_trips(bdp, streams, initial, mss);
    let then = slow_start_round_trips(bdp, streams, SUGGESTED_INITIAL_WINDOW, mss);
    if now <= then {
        return None;
    }
    let secs = |n: u32| f64::from(n) * inp.rtt_ms / 1000.0;
    let commands: Vec<String> = small
        .iter()
        .filter_map(|r| r.change_command(SUGGESTED_INITIAL_WINDOW))
        .take(3)
        .collect();
    let how = if commands.is_empty() {
        format!(
            "add `initcwnd {SUGGESTED_INITIAL_WINDOW} initrwnd {SUGGESTED_INITIAL_WINDOW}` to \
             those routes' attributes"
        )
    } else if commands.iter().any(|c| c.contains(" add PEER ")) {
        format!("{} (PEER: the other node's address)", commands.join("; "))
    } else {
        commands.join("; ")
    };
    Some(format!(
        "route {} starts every connection at {initial} segments of {} (initcwnd{}): at {} ms \
         the {streams} streams ferry starts with need {now} round trips ({:.1} s) of slow start to \
         fill {} ({} in flight), {then} ({:.1} s) from {SUGGESTED_INITIAL_WINDOW}; on routes \
         to other transfer nodes (not to the Internet at large): {how} (and in the network \
         configuration, which a reboot or a network manager would otherwise undo); measured \
         on a 1 Gbit/s path at 100 ms, a 1 GiB put went from 9.30 to 9.18 s",
        first.dst,
        bytes(u64::from(mss)),
        if first.initcwnd.is_some() {
            ""
        } else {
            " unset, the kernel's"
        },
        format_thousands(inp.rtt_ms),
        secs(now),
        format_mbps(inp.target_mbps),
        bytes(bdp),
        secs(then),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BED: &str = r#"[{"dst":"10.77.0.0/24","dev":"fnm0","protocol":"kernel","scope":"link","prefsrc":"10.77.0.1","flags":[]}]"#;
    const SET: &str = r#"[{"dst":"10.77.0.0/24","dev":"fnm0","protocol":"kernel","scope":"link","prefsrc":"10.77.0.1","flags":[],"metrics":[{"mtu":9000,"initcwnd":40,"initrwnd":40}]}]"#;
    const HOST: &str = r#"[{"dst":"default","gateway":"192.0.2.1","dev":"eth0","flags":[]},
        {"dst":"192.0.2.0/24","dev":"eth0","protocol":"kernel","scope":"link","prefsrc":"192.0.2.2","flags":[]}]"#;
    const V6: &str = r#"[{"dst":"fe80::/64","dev":"eth0","protocol":"kernel","metric":256,"flags":[],"pref":"medium"},
        {"type":"multicast","dst":"ff00::/8","dev":"eth0","table":"local","protocol":"kernel","metric":256,"flags":[]},
        {"dst":"2001:db8::/64","dev":"eth0","protocol":"ra","metric":100,"flags":[]}]"#;

    fn at(rtt_ms: f64, target_mbps: f64) -> AdviceInputs {
        AdviceInputs {
            rtt_ms,
            target_mbps,
        }
    }

    #[test]
    fn parses_what_ip_prints() {
        let r = parse_ip_routes(SET, false).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(
            (r[0].mtu, r[0].initcwnd, r[0].initrwnd),
            (Some(9000), Some(40), Some(40))
        );
        let h = parse_ip_routes(HOST, false).unwrap();
        assert_eq!(h[0].dst, "default");
        assert_eq!(h[0].gateway.as_deref(), Some("192.0.2.1"));
        assert_eq!(h[1].prefsrc.as_deref(), Some("192.0.2.2"));
        // The multicast entry is left out; link-local stays parsed but carries no transfer.
        let v6 = parse_ip_routes(V6, true).unwrap();
        assert_eq!(v6.len(), 2);
        assert_eq!(v6[1].metric, Some(100));
        assert!(!v6[0].carries_transfers() && v6[1].carries_transfers());
        assert_eq!(parse_ip_routes("[]", false).unwrap(), vec![]);
    }

    #[test]
    fn junk_is_an_error_not_a_panic() {
        for bad in ["", "{", "{}", "[1]", r#"[{"dev":"eth0"}]"#, "null"] {
            assert!(parse_ip_routes(bad, false).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_command_keeps_the_route() {
        let r = parse_ip_routes(BED, false).unwrap();
        assert_eq!(
            r[0].change_command(40).as_deref(),
            Some(
                "ip route change 10.77.0.0/24 dev fnm0 proto kernel scope link src 10.77.0.1 \
                 initcwnd 40 initrwnd 40"
            )
        );
        // A default route also leads to the Internet: a route of its own per peer instead.
        let h = parse_ip_routes(HOST, false).unwrap();
        assert_eq!(
            h[0].change_command(40).as_deref(),
            Some("ip route add PEER via 192.0.2.1 dev eth0 initcwnd 40 initrwnd 40")
        );
        // A route with what the command would not repeat gets none: an MTU lock and a
        // congestion control, onlink, a shared nexthop, several, an advertised expiry.
        for more in [
            r#"[{"dst":"10.1.0.0/16","gateway":"10.0.0.1","dev":"d0","flags":[],"metrics":[{"mtu":1400,"lock":["mtu"],"congestion":"bbr"}]}]"#,
            r#"[{"dst":"10.1.0.0/16","gateway":"10.0.0.1","dev":"d0","flags":["onlink"]}]"#,
            r#"[{"dst":"10.1.0.0/16","nhid":7,"gateway":"10.0.0.1","dev":"d0","flags":[]}]"#,
            r#"[{"dst":"default","flags":[],"nexthops":[{"gateway":"10.0.0.1","dev":"d0","weight":1,"flags":[]}]}]"#,
            r#"[{"dst":"2001:db8:1::/64","gateway":"fe80::1","dev":"d0","protocol":"ra","metric":1024,"expires":299,"flags":[]}]"#,
        ] {
            let r = parse_ip_routes(more, more.contains("2001")).unwrap();
            assert!(r[0].more, "{more}");
            assert_eq!(r[0].change_command(40), None, "{more}");
        }
        let v6 = parse_ip_routes(V6, true).unwrap();
        assert_eq!(
            v6[1].change_command(40).as_deref(),
            Some(
                "ip -6 route change 2001:db8::/64 dev eth0 proto ra metric 100 initcwnd 40 \
                 initrwnd 40"
            )
        );
    }

    #[test]
    fn streams_as_the_wide_start_has_them() {
        assert_eq!(
            [0.0, 20.0, 49.9, 50.0, 75.0, 100.0, 200.0].map(starting_streams),
            [4, 4, 4, 8, 12, 16, 16]
        );
    }

    #[test]
    fn round_trips_of_slow_start() {
        // The bed: 1 Gbit/s at 100 ms is 12.5 MB; 16 streams of 10 segments at MTU 9000 send
        // 1.43 MB first, and reach it in 4 doublings (the rx timeline showed 4-5).
        assert_eq!(slow_start_round_trips(12_500_000, 16, 10, 8948), 4);
        assert_eq!(slow_start_round_trips(12_500_000, 16, 40, 8948), 2);
        assert_eq!(slow_start_round_trips(1000, 16, 10, 8948), 0);
        assert_eq!(slow_start_round_trips(u64::MAX, 1, 1, 1), 64);
    }

    #[test]
    fn advises_where_slow_start_is_long() {
        let routes = parse_ip_routes(HOST, false).unwrap();
        let a = route_advice(&routes, &at(100.0, 10_000.0), |_| Some(9000)).expect("advice");
        assert!(
            a.starts_with(
                "route default starts every connection at 10 segments of 8.7 KiB \
                           (initcwnd unset, the kernel's): at 100 ms the 16 streams ferry \
                           starts with need 7 round trips (0.7 s)"
            ),
            "{a}"
        );
        assert!(a.contains("5 (0.5 s) from 40"), "{a}");
        assert!(
            a.contains("ip route add PEER via 192.0.2.1 dev eth0 initcwnd 40 initrwnd 40"),
            "{a}"
        );
        assert!(a.contains("ip route change 192.0.2.0/24 dev eth0"), "{a}");
        assert!(a.contains("a reboot"), "{a}");
        assert!(a.contains("(PEER: the other node's address)"), "{a}");
        // Routes whose every command would lose attributes: said in words.
        let multipath = parse_ip_routes(
            r#"[{"dst":"default","flags":[],"nexthops":[{"gateway":"10.0.0.1","dev":"d0","weight":1,"flags":[]}]}]"#,
            false,
        )
        .unwrap();
        let a = route_advice(&multipath, &at(50.0, 10_000.0), |_| None).expect("advice");
        assert!(a.contains("the 8 streams ferry starts with"), "{a}");
        assert!(
            a.contains("add `initcwnd 40 initrwnd 40` to those routes' attributes"),
            "{a}"
        );
    }

    #[test]
    fn quiet_at_short_rtt_or_when_set() {
        let host = parse_ip_routes(HOST, false).unwrap();
        assert_eq!(route_advice(&host, &at(1.0, 10_000.0), |_| None), None);
        let set = parse_ip_routes(SET, false).unwrap();
        assert_eq!(route_advice(&set, &at(100.0, 10_000.0), |_| None), None);
        // Loopback and link-local routes carry no transfer.
        let lo = vec![Route {
            dst: "127.0.0.0/8".into(),
            dev: Some("lo".into()),
            ..Route::default()
        }];
        assert_eq!(route_advice(&lo, &at(100.0, 10_000.0), |_| None), None);
        // A path a first flight already fills needs no larger one.
        assert_eq!(route_advice(&host, &at(20.0, 10.0), |_| None), None);
    }

    #[test]
    fn ip_is_found_outside_a_users_path() {
        use std::path::{Path, PathBuf};
        let at =
            |have: &'static [&'static str]| move |p: &Path| have.iter().any(|h| p == Path::new(h));
        // A user whose PATH lacks the sbin directories, on a system with `ip` only in
        // /usr/sbin.
        let user = std::ffi::OsString::from("/usr/local/bin:/usr/bin:/bin");
        assert_eq!(
            find_ip(Some(&user), at(&["/usr/sbin/ip"])),
            Some(PathBuf::from("/usr/sbin/ip"))
        );
        // PATH comes first, in its order; relative entries are not trusted.
        let mine = std::ffi::OsString::from("rel:/opt/iproute/bin:/usr/bin");
        assert_eq!(
            find_ip(
                Some(&mine),
                at(&[
                    "rel/ip",
                    "/usr/bin/ip",
                    "/opt/iproute/bin/ip",
                    "/usr/sbin/ip"
                ])
            ),
            Some(PathBuf::from("/opt/iproute/bin/ip"))
        );
        assert_eq!(
            find_ip(None, at(&["/sbin/ip"])),
            Some(PathBuf::from("/sbin/ip"))
        );
        assert_eq!(find_ip(Some(&user), at(&[])), None);
    }
}
