//! Multipath mode end to end, tiny: a 24 MiB file and a ten-file mixed tree, one round at K = 1
//! and K = 2 on two emulated links, ferry and (when installed) striped GridFTP. Without root /
//! TUN / `ip`, or without a `ferry` binary, it says why and returns, or fails when `CI` is set
//! (`ferry_netem::needs`).

use crate::common;

use common::{bench, ferry_bin};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;

fn num(v: &serde_json::Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("no number {key}: {v:#}"))
}

#[test]
fn tiny_multipath_put_over_one_and_two_links() {
    let test = "tiny_multipath_put_over_one_and_two_links";
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
    // GridFTP's servers read and write as `nobody`, who must reach the directory: under a
    // private TMPDIR (CI's is 0700) it cannot, so the test works in /dev/shm where it exists.
    let shm = Path::new("/dev/shm");
    let t = if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (out_dir, work) = (t.path().join("out"), t.path().join("work"));
    let child = bench()
        .args(["--mode", "multipath", "--paths", "1,2", "--sizes", "24M"])
        .args(["--trees", "mixed:10", "--runs", "1", "--no-warmup"])
        .args(["--iperf3-secs", "1", "--iperf3-omit", "0"])
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
    assert_eq!(r["paths"], serde_json::json!([1, 2]));
    assert_eq!(r["datasets"], serde_json::json!(["file-24MiB", "mixed-10"]));
    assert_eq!(r["bed"]["links"], 2);
    assert_eq!(r["bed"]["rtt_ms"], 20);
    assert_eq!(r["bed"]["rate_bps"], 300_000_000);
    assert_eq!(r["target"], 0.9);
    let tools: Vec<String> = serde_json::from_value(r["tools"].clone()).unwrap();
    let gridftp = tools.iter().any(|t| t == "gridftp");
    assert_eq!(tools.len(), 1 + usize::from(gridftp), "{tools:?}");
    assert_eq!(tools[0], "ferry");
    let rows = r["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4 * tools.len(), "{text}");
    for row in rows {
        assert_eq!(row["verified"], true, "{row:#}");
        assert_eq!(row["error"], "", "{row:#}");
        assert_eq!(row["link_bytes"].as_array().unwrap().len(), 2, "{row:#}");
    }
    // iperf3 over 1 and 2 links at once, when installed.
    for c in r["ceilings"].as_array().unwrap() {
        let per: Vec<f64> = serde_json::from_value(c["per_link"].clone()).unwrap();
        assert_eq!(per.len() as u64, c["k"].as_u64().unwrap(), "{c:#}");
        assert!(per.iter().all(|m| *m > 0.0), "{c:#}");
        assert!(num(c, "mbit_s") > 0.0, "{c:#}");
    }
    let points = r["points"].as_array().unwrap();
    assert_eq!(points.len(), 4 * tools.len(), "{text}");
    for p in points {
        assert_eq!(p["ok"], 1, "{p:#}");
        assert!(num(p, "median_s") > 0.0);
        assert!(num(p, "median_mbit_s") > 0.0);
        assert!(num(p, "vs_links") > 0.0);
        assert!(num(p, "vs_one_path") > 0.0);
        let k = p["k"].as_u64().unwrap() as f64;
        assert_eq!(num(p, "target_mbit_s"), 300.0 * k, "{p:#}");
    }
    let bytes = |tool: &str, k: u64| -> Vec<u64> {
        let row = rows
            .iter()
            .find(|x| x["tool"] == tool && x["dataset"] == "file-24MiB" && x["k"] == k)
            .unwrap();
        serde_json::from_value(row["link_bytes"].clone()).unwrap()
    };
    // K = 1 is a plain put over link 0; K = 2 spreads the file over both links.
    for tool in &tools {
        let one = bytes(tool, 1);
        assert!(one[0] >= 24 << 20 && one[1] < 1 << 20, "{tool}: {one:?}");
        let two = bytes(tool, 2);
        for (i, b) in two.iter().enumerate() {
            assert!(
                *b > 2 << 20,
                "{tool}: link {i} carried {b} B of 24 MiB: {two:?}"
            );
        }
        assert!(two.iter().sum::<u64>() >= 24 << 20, "{tool}: {two:?}");
    }

    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("| ferry | file-24MiB | 2 | 1/1 |"),
        "{stdout}"
    );
    assert!(
        stdout.contains("target (rate ≥ 0.9 × K × one link's)"),
        "{stdout}"
    );
    // Cleaned up: the destinations, the namespaces.
    for k in ["k1", "k2", "gridftp-k1", "gridftp-k2"] {
        if k.starts_with("gridftp") && !gridftp {
            continue;
        }
        let left: Vec<_> = std::fs::read_dir(work.join("mp-dest").join(k))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "{k}: {left:?}");
    }
    assert_eq!(
        ferry_netem::list_netns(&format!("fnm-{pid}-")),
        Vec::<String>::new()
    );
}

#[test]
fn tiny_striped_copies_push_and_pull_beside_the_put() {
    let test = "tiny_striped_copies_push_and_pull_beside_the_put";
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
        .args(["--mode", "multipath", "--stripe-hosts", "--paths", "1,2"])
        .args([
            "--copies",
            "push,pull",
            "--sizes",
            "24M",
            "--trees",
            "mixed:10",
        ])
        .args(["--runs", "1", "--no-warmup", "--no-iperf3"])
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
    assert_eq!(r["bed"]["striped"], true);
    assert_eq!(
        r["tools"],
        serde_json::json!(["ferry", "ferry-cp-push", "ferry-cp-pull"])
    );
    let rows = r["rows"].as_array().unwrap();
    // Two K, two data sets, three transfers each.
    assert_eq!(rows.len(), 12, "{text}");
    for row in rows {
        assert_eq!(row["verified"], true, "{row:#}");
        assert_eq!(row["error"], "", "{row:#}");
        // Every copy crossed the bed's links (c's server is not the K servers' host): the
        // data's bytes at least, on link 0 alone at K = 1.
        let links: Vec<u64> = serde_json::from_value(row["link_bytes"].clone()).unwrap();
        assert!(
            links.iter().sum::<u64>() >= num(row, "bytes") as u64,
            "{row:#}"
        );
        if row["k"] == 1 {
            assert!(links[1] < 1 << 20, "{row:#}");
        }
        assert!(!row["bottleneck"].as_str().unwrap().is_empty(), "{row:#}");
    }
    for p in r["points"].as_array().unwrap() {
        assert_eq!(p["ok"], 1, "{p:#}");
        let copy = p["tool"].as_str().unwrap().starts_with("ferry-cp-");
        assert_eq!(p["vs_put"].as_f64().is_some(), copy, "{p:#}");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("| ferry-cp-pull | file-24MiB | 2 | 1/1 |"),
        "{stdout}"
    );
    // Cleaned up: the K servers' directories, the pulls' destination, the namespaces.
    for d in ["mp-dest/k1", "mp-dest/k2", "mp-cdest"] {
        let left: Vec<_> = std::fs::read_dir(work.join(d)).unwrap().collect();
        assert!(left.is_empty(), "{d}: {left:?}");
    }
    assert_eq!(
        ferry_netem::list_netns(&format!("fnm-{pid}-")),
        Vec::<String>::new()
    );
}

#[test]
fn multipath_mode_refuses_what_does_not_apply() {
    for (args, want) in [
        (
            &["--streams", "4", "--targets"][..],
            "--mode multipath: --streams, --targets do not apply",
        ),
        (&["--peers", "xrootd"][..], "--peers takes gridftp or none"),
        (&["--paths", "0,2"][..], "--paths 0: each K is 1 to 8"),
        (&["--paths", "2,2"][..], "--paths: 2 appears twice"),
        (&["--rate", "unlimited"][..], "the links need a rate"),
        (
            &["--sizes", "none", "--trees", "none"][..],
            "nothing to send",
        ),
        (&["--trees", "lots"][..], "--trees lots"),
        (&["--copies", "push"][..], "add --stripe-hosts"),
        (
            &["--stripe-hosts", "--copies", "push,over"][..],
            "--copies over: each case is push or pull",
        ),
    ] {
        let out = bench()
            .args(["--mode", "multipath"])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
