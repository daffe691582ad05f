//! Third-party mode end to end, tiny: one 16 MiB file, one round of a put between the two
//! servers and a `ferry cp` asked for by the client, on the three-host bed. Without root
//! / TUN / `ip`, or without a `ferry` binary, it says why and returns, or fails when `CI` is set
//! (`ferry_netem::needs`).

use crate::common;

use common::{bench, ferry_bin};
use std::process::Stdio;

fn num(v: &serde_json::Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("results.json has no number {key}: {v:#}"))
}

#[test]
fn tiny_third_party_copy_against_a_put() {
    let test = "tiny_third_party_copy_against_a_put";
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
    let child = bench()
        .args(["--mode", "third-party", "--sizes", "16M", "--runs", "1"])
        .arg("--no-warmup")
        .arg("--ferry")
        .arg(&ferry)
        .arg("--out")
        .arg(&out_dir)
        .arg("--work")
        .arg(&work)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ferry-bench failed:\n{err}");

    let text = std::fs::read_to_string(out_dir.join("results.json")).unwrap();
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(r["bytes"], 16 << 20);
    assert_eq!(r["file"], "file-16MiB");
    assert_eq!(r["bed"]["ab_rtt_ms"], 50);
    assert_eq!(r["bed"]["ab_rate_bps"], 1_000_000_000u64);
    assert_eq!(r["bed"]["client_rate_bps"], 20_000_000);
    let rows = r["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{text}");
    for row in rows {
        assert_eq!(row["verified"], true, "{row:#}");
        assert_eq!(row["error"], "", "{row:#}");
    }
    assert!(num(&r, "put_median_s") > 0.0);
    assert!(num(&r, "cp_median_s") > 0.0);
    assert!(num(&r, "put_median_mbit_s") > 0.0);
    assert!(num(&r, "cp_median_mbit_s") > 0.0);
    assert!(num(&r, "cp_vs_put") > 0.0);
    // The copy's data crossed a–b; the client's links carried its control sessions only.
    let share = num(&r, "client_link_share_max");
    assert!(
        share > 0.0 && share < 0.01,
        "client links: {share} of the data"
    );
    let cp = rows.iter().find(|x| x["kind"] == "cp").unwrap();
    assert!(cp["ab_link_bytes"].as_u64().unwrap() >= 16 << 20, "{cp:#}");
    // 16 MiB at 20 Mbit/s, computed.
    assert!((num(&r, "through_client_s") - 6.71).abs() < 0.01);

    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("cp / put (rate): "), "{stdout}");
    assert!(stdout.contains("computed"), "{stdout}");
    // Cleaned up: the destination's files, the namespaces.
    let left: Vec<_> = std::fs::read_dir(work.join("tp-dest")).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(
        ferry_netem::list_netns(&format!("fnm-{pid}-")),
        Vec::<String>::new()
    );
}

#[test]
fn third_party_mode_refuses_what_does_not_apply() {
    for (args, want) in [
        (
            &["--streams", "4", "--peers", "none"][..],
            "--mode third-party: --streams, --peers do not apply",
        ),
        (&["--sizes", "1G,2G"][..], "--sizes takes one value"),
        (&["--rate", "fast"][..], "--rate fast"),
    ] {
        let out = bench()
            .args(["--mode", "third-party"])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
