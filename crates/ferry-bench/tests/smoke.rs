//! A tiny sweep on the emulated bed: RTT 0 and 20 ms, one 10 MiB file, streams 1 and 2, one run,
//! ferry only. Without root / TUN / `ip`, or without a `ferry` binary, it says why and returns,
//! or fails when `CI` is set (`ferry_netem::needs`).

use crate::common;

use common::{bench, ferry_bin};
use std::path::Path;

#[test]
fn dry_run_prints_the_plan() {
    let out = bench().args(["--full", "--dry-run"]).output().unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("12 links"), "{err}");
    assert!(err.contains("1gbit, 100 ms, tuned regime"), "{err}");
}

#[test]
fn tiny_sweep_on_the_bed() {
    let test = "tiny_sweep_on_the_bed";
    let Some(()) = ferry_netem::needs(test, ferry_netem::can_run()) else {
        return;
    };
    let Some(ferry) = ferry_netem::needs(
        test,
        ferry_bin().ok_or(
            "no ferry binary in target/debug or target/release \
             (run `cargo build -p ferry-cli` first, or set FERRY_BIN)",
        ),
    ) else {
        return;
    };
    let iperf = ferry_netem::needs(
        test,
        ferry_netem::find_in_path("iperf3").ok_or("iperf3 not installed: its rows not checked"),
    )
    .is_some();
    let t = tempfile::tempdir().unwrap();
    let out_dir = t.path().join("out");
    let out = bench()
        .args([
            "--rtt",
            "0,20",
            "--sizes",
            "10M",
            "--trees",
            "none",
            "--streams",
            "1,2",
            "--runs",
            "1",
            "--peers",
            "none",
            "--iperf3-secs",
            "1",
            "--iperf3-omit",
            "1",
        ])
        .arg("--ferry")
        .arg(&ferry)
        .arg("--out")
        .arg(&out_dir)
        .arg("--work")
        .arg(t.path().join("work"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ferry-bench failed:\n{err}");

    let mut rd = csv::Reader::from_path(out_dir.join("results.csv")).unwrap();
    let headers = rd.headers().unwrap().clone();
    let col = |name: &str| headers.iter().position(|h| h == name).unwrap();
    let (tool, rtt, streams, verified, mbps, error) = (
        col("tool"),
        col("rtt_ms"),
        col("streams"),
        col("verified"),
        col("mbps"),
        col("error"),
    );
    let recs: Vec<csv::StringRecord> = rd.records().map(|r| r.unwrap()).collect();
    let ferry_rows: Vec<&csv::StringRecord> = recs.iter().filter(|r| &r[tool] == "ferry").collect();
    let mut seen: Vec<(String, String)> = ferry_rows
        .iter()
        .map(|r| (r[rtt].to_owned(), r[streams].to_owned()))
        .collect();
    seen.sort();
    let want: Vec<(String, String)> = [("0", "1"), ("0", "2"), ("20", "1"), ("20", "2")]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(seen, want, "{err}");
    for r in &ferry_rows {
        assert_eq!(&r[verified], "true", "not verified: {:?}", &r[error]);
        let v: f64 = r[mbps].parse().unwrap();
        assert!(v > 0.0, "throughput {v}");
    }
    if iperf {
        let n = recs.iter().filter(|r| &r[tool] == "iperf3").count();
        assert_eq!(n, 4, "iperf3 at 2 stream counts on 2 links\n{err}");
    }
    assert!(out_dir.join("medians.csv").is_file());
    let summary = std::fs::read_to_string(out_dir.join("summary.md")).unwrap();
    assert!(
        summary.contains("### put, 1gbit, RTT 20 ms, default regime"),
        "{summary}"
    );

    let font = ferry_bench_font_available()
        .then_some(())
        .ok_or("no TTF font (fonts-dejavu-core): plots not checked");
    if ferry_netem::needs(test, font).is_some() {
        let png = out_dir.join("plots/ferry-put-1gbit-block16MiB.png");
        let bytes = std::fs::read(&png).unwrap_or_else(|e| panic!("{}: {e}\n{err}", png.display()));
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"));
        assert!(bytes.len() > 5000);
    }
}

fn ferry_bench_font_available() -> bool {
    std::env::var_os("FERRY_BENCH_FONT").is_some()
        || [
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/TTF/DejaVuSans.ttf",
            "/usr/share/fonts/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
        ]
        .iter()
        .any(|p| Path::new(p).is_file())
}
