//! Service mode end to end, tiny: twelve jobs over the three emulated links, every file
//! verified, the API polled and the service's memory sampled, then a 24 MiB job over a link
//! that goes dark for 5 s and comes back. Without root / TUN / `ip`, or without a `ferry`
//! binary, it says why and returns, or fails when `CI` is set (`ferry_netem::needs`).

use crate::common;

use common::{bench, ferry_bin};
use std::process::Stdio;

#[test]
fn tiny_service_run_verifies_every_job_and_rides_out_a_dark_link() {
    let test = "tiny_service_run_verifies_every_job_and_rides_out_a_dark_link";
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
    let t = tempfile::tempdir().unwrap();
    let (out_dir, work) = (t.path().join("out"), t.path().join("work"));
    // 50 Mbit/s: the 24 MiB job still runs 2 s in, when its link goes dark.
    let out = bench()
        .args(["--mode", "service", "--jobs", "12", "--rate", "50mbit"])
        .args([
            "--dark-secs",
            "5",
            "--dark-size",
            "24M",
            "--max-run-secs",
            "120",
        ])
        .arg("--ferry")
        .arg(&ferry)
        .arg("--out")
        .arg(&out_dir)
        .arg("--work")
        .arg(&work)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let md = std::fs::read_to_string(out_dir.join("summary.md")).unwrap_or_default();
    assert!(out.status.success(), "ferry-bench failed:\n{err}\n{md}");

    assert!(
        md.contains("12 of 12 jobs done and verified (every job done and verified)"),
        "{md}"
    );
    assert!(
        md.contains("completed without intervention and verified"),
        "{md}"
    );
    let text = std::fs::read_to_string(out_dir.join("results.json")).unwrap();
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(r["verified_jobs"], 12);
    assert_eq!(r["bed"]["rtt_ms"], serde_json::json!([20, 50, 100]));
    // 6 trees of 10 files and 6 single files.
    assert_eq!(r["verified_files"], 66);
    let links: Vec<u64> = r["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["link"].as_u64().unwrap())
        .collect();
    assert_eq!(links, [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2]);
    let api = r["api"].as_array().unwrap();
    let endpoints: Vec<&str> = api
        .iter()
        .map(|a| a["endpoint"].as_str().unwrap())
        .collect();
    for e in ["POST /api/jobs (submit)", "GET /api/jobs", "GET /metrics"] {
        assert!(endpoints.contains(&e), "{endpoints:?}");
    }
    for a in api {
        assert!(a["requests"].as_u64().unwrap() > 0, "{a}");
        assert!(a["p99_ms"].as_f64().unwrap() > 0.0, "{a}");
    }
    assert!(r["memory"]["peak_kib"].as_u64().unwrap() > 0, "{text}");
    assert_eq!(r["dark"]["state"], "done");
    assert_eq!(r["dark"]["verified"], true);
    for f in ["jobs.csv", "api.csv", "rss.csv"] {
        assert!(out_dir.join(f).is_file(), "{f}");
    }
}
