//! `ferry cp` between two daemons on an emulated three-host bed (ferry-netem's `Topology`): the
//! client `c` has a slow link to each server, the servers `a` and `b` a fast one between them.
//! The tree arrives identical, the client's links carry control traffic only (counted on the
//! links), and a kill -9 of the source mid-copy, then the same command again, resumes.

use crate::util;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ferry_netem::{End, LinkConfig, Regime, Topology, TopologyConfig};
use util::*;

/// Links: 0 = c–a and 1 = c–b (20 Mbit/s, 20 ms), 2 = a–b (`ab_rate`, 10 ms).
fn bed(test: &str, ab_rate: u64) -> Option<Topology> {
    bed_at(test, ab_rate, Duration::from_millis(10))
}

/// [`bed`] with the a–b link's round trip `ab_rtt`.
fn bed_at(test: &str, ab_rate: u64, ab_rtt: Duration) -> Option<Topology> {
    ferry_netem::needs(test, ferry_netem::can_run())?;
    let ms = Duration::from_millis;
    Some(
        Topology::up(TopologyConfig {
            hosts: vec!["c".into(), "a".into(), "b".into()],
            links: vec![
                LinkConfig::new(0, 1, ms(20), Some(20_000_000)),
                LinkConfig::new(0, 2, ms(20), Some(20_000_000)),
                LinkConfig::new(1, 2, ab_rtt, Some(ab_rate)),
            ],
            regime: Regime::Default,
        })
        .expect("topology up"),
    )
}

const PORT: u16 = 7000;

/// `ferry serve --third-party` in host `name`, listening on every address of its namespace,
/// with its own state directory and token file.
fn serve(sb: &Sandbox, topo: &Topology, name: &str, root: &Path) -> (ChildGuard, String) {
    let host = topo.host(name).unwrap();
    let log = sb.path(&format!(
        "serve-{name}-{}.log",
        Instant::now().elapsed().as_nanos()
    ));
    let token_file = sb.path(&format!("token-{name}"));
    let listen = format!("0.0.0.0:{PORT}");
    let mut cmd = sb.serve_cmd(root, &listen, Some(&token_file));
    cmd.arg("--third-party")
        .env("FERRY_STATE_DIR", sb.mkdir(&format!("state-{name}")))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    topo.enter(host, &mut cmd).unwrap();
    let mut guard = ChildGuard(Some(cmd.spawn().expect("spawning ferry serve")));
    if let Err(e) = wait_serving(&mut guard, &log, &listen, Duration::from_secs(5)) {
        panic!("{e}");
    }
    let token = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .to_owned();
    (guard, token)
}

/// `ferry cp` run in the client's host: the servers by their addresses on the client's links,
/// the destination as the source reaches it on the a–b link.
fn cp(sb: &Sandbox, topo: &Topology, tokens: (&str, &str), src: &str, dst: &str) -> Command {
    let mut cmd = sb.ferry();
    cmd.args(["cp", "--json", "--retry-for", "0"])
        .arg("--source-token")
        .arg(tokens.0)
        .arg("--dest-token")
        .arg(tokens.1)
        .arg("--dest-addr")
        .arg(format!("{}:{PORT}", topo.addr(2, End::B)))
        .arg(format!("{}:{PORT}:{src}", topo.addr(0, End::B)))
        .arg(format!("{}:{PORT}:{dst}", topo.addr(1, End::B)));
    topo.enter(topo.host("c").unwrap(), &mut cmd).unwrap();
    cmd
}

#[test]
fn a_tree_copied_between_two_daemons_crosses_only_their_link() {
    let Some(topo) = bed(
        "a_tree_copied_between_two_daemons_crosses_only_their_link",
        1_000_000_000,
    ) else {
        return;
    };
    let sb = Sandbox::new();
    let (root_a, root_b) = (sb.mkdir("a"), sb.mkdir("b"));
    let src = root_a.join("run42");
    write_pattern(&src.join("big.bin"), 24 << 20, 1);
    for i in 0..200 {
        write_pattern(
            &src.join(format!("small/f{i:03}.dat")),
            2000 + i * 61,
            i + 2,
        );
    }
    std::fs::create_dir(root_b.join("incoming")).unwrap();
    let total: u64 = (24 << 20) + (0..200).map(|i| 2000 + i * 61).sum::<u64>();
    let (_a, token_a) = serve(&sb, &topo, "a", &root_a);
    let (_b, token_b) = serve(&sb, &topo, "b", &root_b);

    let out = run(
        &mut cp(&sb, &topo, (&token_a, &token_b), "/run42", "/incoming/"),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    let report = one_json(&out.stdout);
    assert_eq!(report["direction"], "copy");
    assert_eq!(u64_field(&report, "files"), 201);
    assert_eq!(u64_field(&report, "bytes"), total);
    assert_eq!(
        tree_digest(&root_b.join("incoming/run42")),
        tree_digest(&src)
    );
    // The client's links carried TLS handshakes, requests and progress; the data crossed a–b.
    let client_links = topo.link_stats(0).delivered_bytes() + topo.link_stats(1).delivered_bytes();
    let between = topo.link_stats(2).delivered_bytes();
    eprintln!("client links {client_links} B, a–b {between} B, data {total} B");
    assert!(
        client_links * 100 < total,
        "the client's links carried {client_links} bytes for {total} of data"
    );
    assert!(between >= total, "a–b carried {between} bytes");
}

#[test]
fn a_copy_whose_source_is_killed_resumes_when_run_again() {
    // 300 Mbit/s between the servers: 96 MiB take about 3 s, time to kill the source.
    let Some(topo) = bed(
        "a_copy_whose_source_is_killed_resumes_when_run_again",
        300_000_000,
    ) else {
        return;
    };
    let sb = Sandbox::new();
    let (root_a, root_b) = (sb.mkdir("a"), sb.mkdir("b"));
    let size = 96u64 << 20;
    write_pattern(&root_a.join("big.bin"), size, 9);
    let (mut a, token_a) = serve(&sb, &topo, "a", &root_a);
    let (_b, token_b) = serve(&sb, &topo, "b", &root_b);

    let mut first = cp(&sb, &topo, (&token_a, &token_b), "/big.bin", "/");
    first.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut client = ChildGuard(Some(first.spawn().unwrap()));
    // Kill -9 the source once the destination holds a quarter of the file.
    let held = || partial_bytes(&root_b);
    assert!(
        wait_until(Duration::from_secs(30), || held() >= size / 4),
        "the copy got under way (partial: {} bytes)",
        held()
    );
    let st = Command::new("kill")
        .arg("-9")
        .arg(a.pid().to_string())
        .status()
        .unwrap();
    assert!(st.success());
    let _ = a.wait_for(Duration::from_secs(5));
    let status = client
        .wait_for(Duration::from_secs(30))
        .expect("the client ends when its source dies");
    assert!(!status.success(), "the first run fails");
    assert!(
        !root_b.join("big.bin").exists(),
        "nothing under the final name"
    );
    let kept = held();
    assert!(
        kept >= size / 4,
        "the destination kept its verified part ({kept})"
    );

    // The same command again, against the source restarted: only the rest crosses a–b.
    let (_a, token_a2) = serve(&sb, &topo, "a", &root_a);
    assert_eq!(token_a2, token_a, "the token file is reused");
    let before = topo.link_stats(2).a_to_b.tx_bytes;
    let out = run(
        &mut cp(&sb, &topo, (&token_a, &token_b), "/big.bin", "/"),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    let sent = topo.link_stats(2).a_to_b.tx_bytes - before;
    assert_eq!(tree_digest(&root_b), tree_digest(&root_a));
    eprintln!("held {kept} of {size} B after the kill; the rerun carried {sent} B");
    assert!(
        sent < size - kept / 2,
        "the rerun carried {sent} bytes with {kept} of {size} already held: it did not resume"
    );
}

#[test]
fn a_source_opens_ramp_helpers_over_a_path_its_last_copy_measured() {
    let test = "a_source_opens_ramp_helpers_over_a_path_its_last_copy_measured";
    let Some(topo) = bed_at(test, 1_000_000_000, Duration::from_millis(50)) else {
        return;
    };
    let sb = Sandbox::new();
    let (root_a, root_b) = (sb.mkdir("a"), sb.mkdir("b"));
    write_pattern(&root_a.join("one.bin"), 80 << 20, 1);
    write_pattern(&root_a.join("two.bin"), 80 << 20, 2);
    let (_a, token_a) = serve(&sb, &topo, "a", &root_a);
    let (_b, token_b) = serve(&sb, &topo, "b", &root_b);
    let helpers = |name: &str| {
        let out = run(
            &mut cp(&sb, &topo, (&token_a, &token_b), name, "/"),
            CMD_TIMEOUT,
        );
        assert_code(&out, 0);
        one_json(&out.stdout)["source_report"]["tuning"]["ramp_helpers"]
            .as_u64()
            .unwrap()
    };
    // The first copy to b measures the path (50 ms, 1 Gbit/s); the second starts from it.
    assert_eq!(helpers("/one.bin"), 0);
    assert!(
        helpers("/two.bin") > 0,
        "no ramp helpers over a remembered long path"
    );
    assert_eq!(tree_digest(&root_b), tree_digest(&root_a));
}

/// Bytes the destination's partial files (ferry's temporary names) hold on disk: blocks land
/// out of order, so a file's length says less than what is allocated.
fn partial_bytes(root: &Path) -> u64 {
    std::fs::read_dir(root)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().contains(".ferry-"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512)
                .sum()
        })
        .unwrap_or(0)
}

#[test]
fn servers_without_third_party_are_refused_and_via_client_moves_the_data_here_on_purpose() {
    let sb = Sandbox::new();
    let (root_a, root_b) = (sb.mkdir("a"), sb.mkdir("b"));
    let src = root_a.join("run7");
    write_pattern(&src.join("big.bin"), 3 << 20, 5);
    for i in 0..10 {
        write_pattern(&src.join(format!("f{i}")), 100 + i * 10, i + 1);
    }
    let a = Server::start(&sb, &root_a, Some(&sb.path("token-a")), &[]);
    let b = Server::start(&sb, &root_b, Some(&sb.path("token-b")), &[]);
    let cmd = |extra: &[&str]| {
        let mut c = sb.ferry();
        c.arg("cp")
            .args(extra)
            .args(["--source-token", &a.token, "--dest-token", &b.token])
            .arg(a.remote("/run7"))
            .arg(b.remote("/"));
        c
    };
    // Without the server setting: refused, saying how to allow it, and nothing moved.
    let out = run(&mut cmd(&[]), CMD_TIMEOUT);
    assert_code(&out, 1);
    assert!(
        out.stderr.contains("--third-party") && out.stderr.contains("--via-client"),
        "{}",
        out.stderr
    );
    assert!(!root_b.join("run7").exists());
    // On purpose: through this host, and it says so.
    let out = run(&mut cmd(&["--via-client", "--json"]), CMD_TIMEOUT);
    assert_code(&out, 0);
    assert!(out.stderr.contains("crosses this host"), "{}", out.stderr);
    let report = one_json(&out.stdout);
    assert_eq!(report["direction"], "copy via client");
    assert_eq!(tree_digest(&root_b.join("run7")), tree_digest(&src));
    let spools = sb.state_dir().join("via-client");
    assert_eq!(
        std::fs::read_dir(&spools).map(|d| d.count()).unwrap_or(0),
        0,
        "the spool is removed once the copy is stored"
    );
}
