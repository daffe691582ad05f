//! Host mode end to end, tiny: one 8 MiB file, 20 × 64 KiB and a 120-file real tree, put and
//! get, TLS and plain, one run, iperf3 -P 1 and `ferry probe net` for a second each. Without a
//! `ferry` binary (or iperf3, for its rows) it says why and returns, or fails when `CI` is set.

use crate::common;

use common::ferry_bin;
use std::process::Command;

#[test]
fn tiny_host_mode_on_loopback() {
    let test = "tiny_host_mode_on_loopback";
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
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferry-bench"));
    cmd.args([
        "--mode",
        "host",
        "--sizes",
        "8M",
        "--trees",
        "20x64K,real:120",
    ])
    .args(["--runs", "1", "--peers", "none", "--probe-secs", "1"])
    .args([
        "--iperf3-streams",
        "1",
        "--iperf3-secs",
        "1",
        "--iperf3-omit",
        "0",
    ])
    .arg("--ferry")
    .arg(&ferry)
    .arg("--out")
    .arg(&out_dir)
    .arg("--work")
    .arg(t.path().join("work"));
    if !iperf {
        cmd.arg("--no-iperf3");
    }
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ferry-bench failed:\n{err}");

    let mut rd = csv::Reader::from_path(out_dir.join("results.csv")).unwrap();
    let h = rd.headers().unwrap().clone();
    let col = |name: &str| h.iter().position(|x| x == name).unwrap();
    let recs: Vec<csv::StringRecord> = rd.records().map(|r| r.unwrap()).collect();
    let ferry_rows: Vec<&csv::StringRecord> =
        recs.iter().filter(|r| &r[col("tool")] == "ferry").collect();
    // 3 data sets × put, get × tls, plain.
    assert_eq!(ferry_rows.len(), 12, "{err}");
    for r in &ferry_rows {
        assert_eq!(&r[col("verified")], "true", "{:?}\n{err}", &r[col("error")]);
        let gibps: f64 = r[col("gibps")].parse().unwrap();
        assert!(gibps > 0.0);
        let client: f64 = r[col("client_cpu_s")].parse().unwrap();
        assert!(client > 0.0, "the client's CPU time is counted");
        let server: f64 = r[col("server_cpu_s")].parse().unwrap();
        assert!(server >= 0.0);
    }
    let mut seen: Vec<String> = ferry_rows
        .iter()
        .map(|r| {
            format!(
                "{} {} {}",
                &r[col("dataset")],
                &r[col("direction")],
                &r[col("transport")]
            )
        })
        .collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 12, "{seen:?}");
    assert!(seen.contains(&"real-120 get plain".to_owned()), "{seen:?}");
    let probes = recs
        .iter()
        .filter(|r| &r[col("tool")] == "probe-net")
        .count();
    assert_eq!(probes, 4, "probe net per transport and direction\n{err}");
    if iperf {
        let n = recs.iter().filter(|r| &r[col("tool")] == "iperf3").count();
        assert_eq!(n, 1, "{err}");
    }
    let summary = std::fs::read_to_string(out_dir.join("summary.md")).unwrap();
    assert!(summary.contains("- nproc: "), "{summary}");
    assert!(
        summary.contains("| file-8MiB | put | ferry | tls |"),
        "{summary}"
    );
    assert!(
        summary.contains("| ferry probe net | plain | get |"),
        "{summary}"
    );
    assert!(
        summary.contains("put destination (server side)"),
        "{summary}"
    );
}

#[test]
fn bed_flags_are_refused_in_host_mode() {
    let out = Command::new(env!("CARGO_BIN_EXE_ferry-bench"))
        .args(["--mode", "host", "--rtt", "50", "--streams", "4"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--rtt, --streams apply to the bed only"),
        "{err}"
    );
}
