//! `probe_host` on the machine the tests run on.

use ferry_probe::host::{probe_host, HostOptions};
use ferry_probe::NoProgress;

#[test]
fn probes_this_host() {
    let rep = probe_host(&HostOptions::quick(), &NoProgress);

    let usable = std::thread::available_parallelism().unwrap().get();
    assert!(rep.cpu.usable > 0);
    assert_eq!(rep.cpu.usable, usable);
    assert!(!rep.cpu.online.is_empty(), "{:?}", rep.unreadable);
    assert!(rep.cpu.online.len() >= usable);
    assert!(rep.cpu.cores.is_none_or(|c| c > 0));

    // TCP settings parsed from /proc.
    let wmem = rep.tcp.tcp_wmem.expect("tcp_wmem parsed");
    let rmem = rep.tcp.tcp_rmem.expect("tcp_rmem parsed");
    assert!(wmem[0] <= wmem[1] && wmem[1] <= wmem[2], "{wmem:?}");
    assert!(rmem[2] > 0);
    assert!(rep.tcp.congestion_control.is_some());
    assert!(!rep.tcp.available_congestion_control.is_empty());
    if wmem[2] <= 4 << 20 {
        assert!(
            rep.advice.iter().any(|a| a.starts_with("tcp_wmem max is")),
            "{:?}",
            rep.advice
        );
    }

    // Digest and cipher speeds.
    let names: Vec<&str> = rep.speeds.iter().map(|s| s.name.as_str()).collect();
    for want in [
        "xxh3-128",
        "blake3",
        "xxh3",
        "sha256",
        "md5",
        "aes-256-gcm seal",
    ] {
        assert!(names.contains(&want), "{names:?}");
    }
    assert!(
        rep.speeds.iter().all(|s| s.mib_per_s > 0.0),
        "{:?}",
        rep.speeds
    );

    let text = rep.render_text();
    for section in ["\ncpu\n", "\nnics\n", "\ntcp\n", "per-core speed", "advice"] {
        assert!(text.contains(section), "{section}: {text}");
    }
    let json = serde_json::to_value(&rep).unwrap();
    assert!(json["speeds"].as_array().unwrap().len() >= 7);
}

#[test]
fn unreadable_root_is_reported_not_fatal() {
    let empty = tempfile::tempdir().unwrap();
    let opts = HostOptions {
        sys_root: empty.path().to_path_buf(),
        measure_speeds: false,
        ..HostOptions::default()
    };
    let rep = probe_host(&opts, &NoProgress);
    assert!(rep.cpu.usable > 0);
    assert!(rep.tcp.tcp_wmem.is_none());
    assert!(rep
        .unreadable
        .iter()
        .any(|u| u.path == "/proc/sys/net/ipv4/tcp_wmem"));
    assert!(rep.render_text().contains("could not read"));
}
