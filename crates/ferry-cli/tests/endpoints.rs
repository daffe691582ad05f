//! `[endpoints.NAME] hosts = [...]` in the client config: `NAME:/path` names one site of
//! several servers that share a file system. A put and a get stripe over all of them (the
//! first coordinates); a bad endpoint is a usage error that names it.

use crate::util;

use std::time::Duration;

use util::*;

/// Writes the client config with one endpoint `site` of `hosts` and, if given, its token.
fn endpoint_config(sb: &Sandbox, hosts: &[String], token: Option<&str>) {
    let list: Vec<String> = hosts.iter().map(|h| format!("\"{h}\"")).collect();
    let mut text = format!("[endpoints.site]\nhosts = [{}]\n", list.join(", "));
    if let Some(t) = token {
        text.push_str(&format!("token = \"{t}\"\n"));
    }
    let dir = sb.xdg_config().join("ferry");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.toml"), text).unwrap();
}

#[test]
fn a_put_to_and_a_get_from_an_endpoint_stripe_over_its_hosts() {
    let sb = Sandbox::new();
    let root = sb.mkdir("shared-fs");
    let token_file = sb.path("token");
    let first = Server::start(&sb, &root, Some(&token_file), &[]);
    let others: Vec<Server> = (0..2)
        .map(|_| Server::start(&sb, &root, Some(&token_file), &["--stripe"]))
        .collect();
    let hosts: Vec<String> = std::iter::once(&first)
        .chain(&others)
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect();
    // The endpoint's token is the only one the client has: no FERRY_TOKEN, no default.
    endpoint_config(&sb, &hosts, Some(&first.token));
    let src = sb.path("src/big.bin");
    write_pattern(&src, 24 << 20, 11);

    let out = run(
        sb.ferry()
            // Fixed streams: an auto-tuned session sends its early budget (256 KiB a
            // connection, up to 64) before the file's decision, which only the coordinator
            // takes; of 24 blocks, a loaded machine then left some stripe host none.
            .args(["put", "--json", "--retry-for", "0", "--block-size", "1M"])
            .args(["--streams", "4"])
            .arg(&src)
            .arg("site:/in/"),
        Duration::from_secs(120),
    );
    assert_code(&out, 0);
    let report = one_json(&out.stdout);
    let stripes = report["stripes"].as_array().expect("stripes in the report");
    assert_eq!(stripes.len(), 2, "{report}");
    assert_striped(stripes, &hosts[1..], &report.to_string());
    assert_eq!(
        std::fs::read(root.join("in/big.bin")).unwrap(),
        std::fs::read(&src).unwrap()
    );
    // Each stripe session ended cleanly: the host logs it as a finished session, not a
    // connection dropped without a TLS close.
    for s in &others {
        let log = wait_for_log(s, "result=ok", Duration::from_secs(10));
        assert!(!log.contains("WARN"), "{log}");
    }

    let back = sb.path("back.bin");
    let out = run(
        sb.ferry()
            // Fixed streams: an auto-tuned session's early budget (256 KiB a connection, up
            // to 64) would cover most of this small file's 1 MiB blocks, which no stripe host
            // then serves.
            .args(["get", "--json", "--retry-for", "0", "--streams", "4"])
            .arg("site:/in/big.bin")
            .arg(&back),
        Duration::from_secs(120),
    );
    assert_code(&out, 0);
    assert_eq!(std::fs::read(&back).unwrap(), std::fs::read(&src).unwrap());
    // The first host coordinated; the others read blocks of the file for the get. Which
    // host takes how many is their pace's: on loopback the first to answer may take every
    // striped block of so small a file, so only their sum is asserted here (ferry-net's
    // `stripe_get` tests show every host used on a larger one).
    let report = one_json(&out.stdout);
    let stripes = report["stripes"].as_array().expect("stripes in the report");
    assert_eq!(stripes.len(), 2, "{report}");
    assert_striped(stripes, &hosts[1..], &report.to_string());
}

/// Each stripe host in the report is the one named, opened its data connections and did not
/// fail, and together they carried blocks. How many each took is their pace's: on a loaded
/// machine one host's connections may open after the others took every block of so small a
/// file (CI once saw a host with four connections and none carried), so only the sum is
/// asserted; ferry-net's `stripe` tests show every host used on a larger file.
fn assert_striped(stripes: &[serde_json::Value], hosts: &[String], report: &str) {
    let mut carried = 0;
    for (s, host) in stripes.iter().zip(hosts) {
        assert_eq!(s["host"].as_str(), Some(host.as_str()), "{s}");
        assert!(
            u64_field(s, "connections") > 0 && s["failed"].is_null(),
            "{s}"
        );
        carried += u64_field(s, "blocks");
    }
    assert!(carried > 0, "no stripe host carried a block: {report}");
}

/// The server's log once it holds `text`, or as it is after `wait`.
fn wait_for_log(s: &Server, text: &str, wait: Duration) -> String {
    let end = std::time::Instant::now() + wait;
    loop {
        let log = s.stderr();
        if log.contains(text) || std::time::Instant::now() >= end {
            return log;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_bad_endpoint_is_a_usage_error_that_names_it() {
    let sb = Sandbox::new();
    let src = sb.path("src/f");
    write_pattern(&src, 10, 1);
    for (hosts, says) in [
        (vec![], "between 1 and"),
        (vec!["dtn1".to_owned(), "dtn1:7070".to_owned()], "twice"),
        (vec!["dtn1:notaport".to_owned()], "not a port"),
    ] {
        endpoint_config(&sb, &hosts, Some("t"));
        let out = run(
            sb.ferry().arg("put").arg(&src).arg("site:/in/"),
            Duration::from_secs(30),
        );
        assert_code(&out, 2);
        assert!(
            out.stderr.contains("endpoint `site`") && out.stderr.contains(says),
            "{hosts:?}: {}",
            out.stderr
        );
    }
}

#[test]
fn a_copy_into_an_endpoint_or_with_stripe_stripes_over_its_hosts() {
    let sb = Sandbox::new();
    let a = Server::start(
        &sb,
        &sb.mkdir("a"),
        Some(&sb.path("token-a")),
        &["--third-party"],
    );
    let root = sb.mkdir("shared-fs");
    let token_file = sb.path("token");
    let first = Server::start(&sb, &root, Some(&token_file), &["--third-party"]);
    let others: Vec<Server> = (0..2)
        .map(|_| {
            let flags = ["--third-party", "--stripe"];
            Server::start(&sb, &root, Some(&token_file), &flags)
        })
        .collect();
    let hosts: Vec<String> = std::iter::once(&first)
        .chain(&others)
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect();
    endpoint_config(&sb, &hosts, Some(&first.token));
    let src = a.root.join("big.bin");
    write_pattern(&src, 24 << 20, 12);
    let check = |out: &Out, dest: &str| {
        assert_code(out, 0);
        let report = one_json(&out.stdout);
        let stripes = report["source_report"]["stripes"]
            .as_array()
            .expect("the source's stripes in the report");
        assert_eq!(stripes.len(), 2, "{report}");
        assert_striped(stripes, &hosts[1..], &report.to_string());
        assert_eq!(
            std::fs::read(root.join(dest).join("big.bin")).unwrap(),
            std::fs::read(&src).unwrap()
        );
    };
    let cp = || {
        let mut cmd = sb.ferry();
        // Fixed streams, as for the put above: blocks sent early go to the coordinator only.
        cmd.args(["cp", "--json", "--retry-for", "0", "--block-size", "1M"])
            .args(["--streams", "4", "--source-token", &a.token]);
        cmd
    };
    // The endpoint as the destination: its token, its first host coordinates.
    let out = run(
        cp().arg(a.remote("/big.bin")).arg("site:/in/"),
        Duration::from_secs(120),
    );
    check(&out, "in");
    // The same with --stripe and the coordinator named.
    let out = run(
        cp().args([
            "--dest-token",
            &first.token,
            "--stripe",
            &hosts[1..].join(","),
        ])
        .arg(a.remote("/big.bin"))
        .arg(first.remote("/again/")),
        Duration::from_secs(120),
    );
    check(&out, "again");
    // A source endpoint of several hosts: A pulls from it, striped over its other hosts,
    // with the endpoint's token. Fixed streams, as for the get above: an auto-tuned early
    // budget would cover most of so small a file.
    let out = run(
        sb.ferry()
            .args(["cp", "--json", "--retry-for", "0", "--block-size", "1M"])
            .args(["--streams", "4", "--dest-token", &a.token])
            .arg("site:/in/big.bin")
            .arg(a.remote("/third/")),
        Duration::from_secs(120),
    );
    assert_code(&out, 0);
    let report = one_json(&out.stdout);
    let stripes = report["source_report"]["stripes"]
        .as_array()
        .expect("the destination's get reports the source's stripes");
    assert_eq!(stripes.len(), 2, "{report}");
    // Which host takes how many is their pace's on loopback (see the get above): their sum.
    assert_striped(stripes, &hosts[1..], &report.to_string());
    assert_eq!(
        std::fs::read(a.root.join("third/big.bin")).unwrap(),
        std::fs::read(&src).unwrap()
    );
    // Both ends striped: refused, saying which is missing, not copied unstriped.
    let out = run(
        cp().arg("site:/in/big.bin").arg("site:/fourth/"),
        Duration::from_secs(30),
    );
    assert_code(&out, 2);
    assert!(out.stderr.contains("not both yet"), "{}", out.stderr);
}
