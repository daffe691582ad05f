//! Striped puts with real processes on loopback: three `ferry serve` sharing one directory.
//! The coordinator merges the stripe hosts' BLAKE3 chaining values instead of reading their
//! blocks back (its metrics count both ways), at every size around block and chunk edges;
//! and a stripe host that stops answering (SIGSTOP) is left behind after a bounded time, its
//! blocks sent through the others, the put byte-identical, as when one is killed.

use crate::util;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use util::*;

/// A coordinator (with a metrics listener) and two stripe hosts over `root`, one token file.
fn three_servers(sb: &Sandbox, root: &Path) -> (Server, Vec<Server>) {
    let token_file = sb.path("token");
    let first = Server::start(
        sb,
        root,
        Some(&token_file),
        &["--metrics-listen", "127.0.0.1:0"],
    );
    let others = (0..2)
        .map(|_| Server::start(sb, root, Some(&token_file), &["--stripe"]))
        .collect();
    (first, others)
}

/// `ferry put --json --stripe HOSTS SRC coordinator:DEST`, not yet run.
fn striped_put(
    sb: &Sandbox,
    (first, others): (&Server, &[Server]),
    src: &Path,
    dest: &str,
) -> std::process::Command {
    let hosts: Vec<String> = others
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect();
    let mut cmd = sb.client(&first.token);
    cmd.args([
        "put",
        "--json",
        "--retry-for",
        "0",
        "--stripe",
        &hosts.join(","),
    ]);
    cmd.arg(src).arg(first.remote(dest));
    cmd
}

/// One sample of the coordinator's metrics page, by its exact name and labels.
fn metric(server: &Server, series: &str) -> u64 {
    metric_opt(server, series).unwrap_or_else(|page| panic!("no {series} in\n{page}"))
}

/// [`metric`], or the page when it has no such sample (a labelled counter appears with its
/// first count).
fn metric_opt(server: &Server, series: &str) -> Result<u64, String> {
    let addr = server
        .stderr()
        .lines()
        .find_map(|l| {
            l.strip_prefix("ferry: metrics at http://")?
                .strip_suffix("/metrics")
                .map(str::to_owned)
        })
        .expect("the server says where its metrics are");
    let mut s = TcpStream::connect(&addr).expect("connecting to the metrics listener");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut page = String::new();
    s.read_to_string(&mut page).expect("reading the metrics");
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .ok_or(page)
}

/// Whether `dir` holds a partial copy (`.ferry-*.part`) anywhere below it. Names only, and
/// whatever vanishes while it looks is passed over: the put is renaming files meanwhile.
fn has_partial(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        (name.starts_with(".ferry-") && name.ends_with(".part"))
            || (e.file_type().is_ok_and(|t| t.is_dir()) && has_partial(&e.path()))
    })
}

#[test]
fn a_striped_put_at_block_and_chunk_edges_is_byte_identical_and_merged_without_read_back() {
    let sb = Sandbox::new();
    let root = sb.mkdir("shared-fs");
    let (first, others) = three_servers(&sb, &root);
    const B: u64 = 128 << 10;
    let sizes = [
        0,
        1,
        1023,
        1024,
        1025,
        B - 1,
        B,
        B + 1,
        B + 1023,
        B + 1025,
        3 * B - 1,
        3 * B,
        3 * B + 1,
        40 * B - 1,
        40 * B + 1,
        40 * B + 1025,
    ];
    let src = sb.path("src");
    for (i, size) in sizes.iter().enumerate() {
        write_pattern(&src.join(format!("f{i:02}-{size}")), *size, 40 + i as u64);
    }
    let out = run(
        striped_put(&sb, (&first, &others), &src, "/in/").args(["--block-size", "128K"]),
        Duration::from_secs(120),
    );
    assert_code(&out, 0);
    let report = one_json(&out.stdout);
    assert_eq!(tree_digest(&root.join("in/src")), tree_digest(&src));
    assert!(!has_partial(&root), "{:?}", all_paths(&root));
    let stripes = report["stripes"].as_array().expect("stripes in the report");
    let landed: u64 = stripes.iter().map(|s| u64_field(s, "blocks")).sum();
    assert!(landed > 0, "{report}");
    // The blocks stripe hosts wrote were merged by their chaining values, none read back (a
    // block whose file another copy completed first is not counted at all).
    let merged = metric(&first, "ferry_server_landed_blocks_total{check=\"merged\"}");
    let read_back = metric(
        &first,
        "ferry_server_landed_blocks_total{check=\"read_back\"}",
    );
    assert_eq!(read_back, 0, "{report}");
    assert!(
        merged > 0 && merged <= landed,
        "{merged} of {landed}: {report}"
    );

    // With another file digest the coordinator reads each landed block back.
    let out = run(
        striped_put(&sb, (&first, &others), &src, "/again/").args([
            "--block-size",
            "128K",
            "--checksum",
            "sha256",
        ]),
        Duration::from_secs(120),
    );
    assert_code(&out, 0);
    let report = one_json(&out.stdout);
    assert_eq!(tree_digest(&root.join("again/src")), tree_digest(&src));
    let again: u64 = report["stripes"]
        .as_array()
        .expect("stripes in the report")
        .iter()
        .map(|s| u64_field(s, "blocks"))
        .sum();
    assert!(again > 0, "{report}");
    let read_back = metric(
        &first,
        "ferry_server_landed_blocks_total{check=\"read_back\"}",
    );
    assert!(
        read_back > 0 && read_back <= again,
        "{read_back} of {again}"
    );
    assert_eq!(
        metric(&first, "ferry_server_landed_blocks_total{check=\"merged\"}"),
        merged
    );
}

/// A striped put of a tree, a 128 MiB file and 120 files of one block (65 KiB to 1 MiB), during
/// which the last stripe host gets `signal` once the coordinator has opened a partial copy
/// (the stripe sessions are up by then, and the host is being given blocks, whole small files
/// among them); the put must end well, byte-identical. Returns its report and how long it
/// took. The host gets SIGCONT after the put and is killed with the sandbox.
fn put_losing_a_host(signal: &str) -> (serde_json::Value, Duration) {
    let sb = Sandbox::new();
    let root = sb.mkdir("shared-fs");
    let (first, others) = three_servers(&sb, &root);
    let src = sb.path("src");
    write_pattern(&src.join("big.bin"), 128 << 20, 17);
    for i in 0..120u64 {
        let size = (65 << 10) + (i * 7919 * 1024) % (959 << 10);
        write_pattern(&src.join(format!("small/{}/f{i}", i % 5)), size, 100 + i);
    }
    let mut cmd = striped_put(&sb, (&first, &others), &src, "/in/");
    cmd.args(["--block-size", "1M"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let t0 = Instant::now();
    let mut put = ChildGuard(Some(cmd.spawn().expect("spawning ferry put")));
    // Under way once a stripe host has landed a block: every stripe session is open by then
    // (the put opens them all before it gives any a block). A host killed before the client
    // reached it fails the put by design: the user named it.
    let landed = || {
        ["merged", "read_back"]
            .iter()
            .map(|c| {
                let series = format!("ferry_server_landed_blocks_total{{check=\"{c}\"}}");
                metric_opt(&first, &series).unwrap_or(0)
            })
            .sum::<u64>()
    };
    let opened = wait_until(Duration::from_secs(60), || {
        (has_partial(&root) && landed() > 0) || put.child().try_wait().unwrap().is_some()
    });
    assert!(
        opened && has_partial(&root),
        "the put did not get under way"
    );
    let victim = &others[1];
    victim.signal(signal);
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = r.read_to_string(&mut text);
            text
        })
    };
    let stdout = drain(Box::new(put.child().stdout.take().unwrap()));
    let stderr = drain(Box::new(put.child().stderr.take().unwrap()));
    let status = put.wait_for(Duration::from_secs(90));
    let took = t0.elapsed();
    if signal == "STOP" {
        victim.signal("CONT");
    }
    // Killed by the guard if it did not end: the pipes close either way.
    drop(put);
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    let status = status.unwrap_or_else(|| panic!("the put did not end; {stderr}"));
    assert!(status.success(), "{status}: {stderr}");
    let report = one_json(&stdout);
    assert_eq!(tree_digest(&root.join("in/src")), tree_digest(&src));
    // A host running again finds no partial copy to write its stale blocks into.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(tree_digest(&root.join("in/src")), tree_digest(&src));
    assert!(!has_partial(&root), "{:?}", all_paths(&root));
    (report, took)
}

#[test]
fn a_stripe_host_that_stops_answering_is_left_behind_and_the_put_completes() {
    let (report, took) = put_losing_a_host("STOP");
    // Ten seconds of silence, then the rest through the others: well inside a minute.
    assert!(took < Duration::from_secs(60), "took {took:?}");
    let stripes = report["stripes"].as_array().expect("stripes in the report");
    let failed = stripes[1]["failed"].as_str().unwrap_or_default();
    assert!(failed.contains("timed out"), "{report}");
    assert!(stripes[0]["failed"].is_null(), "{report}");
}

#[test]
fn a_killed_stripe_host_is_left_behind_at_once_and_the_put_completes() {
    let (report, took) = put_losing_a_host("KILL");
    // A reset connection fails the host at once: no silence to wait out.
    assert!(took < Duration::from_secs(30), "took {took:?}");
    let stripes = report["stripes"].as_array().expect("stripes in the report");
    let failed = stripes[1]["failed"].as_str().unwrap_or_default();
    assert!(
        !failed.is_empty() && !failed.contains("timed out"),
        "{report}"
    );
    assert!(stripes[0]["failed"].is_null(), "{report}");
}
