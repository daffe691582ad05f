//! `ferry put --multipath` over two emulated links between one client and one server (two
//! network cards each, ferry-netem's `Topology` with parallel links): the server listens on
//! both, the client binds one data connection in two to each, and both links carry the data.

use crate::util;

use std::process::Stdio;
use std::time::Duration;

use ferry_netem::{End, LinkConfig, Regime, Topology, TopologyConfig};
use util::*;

#[test]
fn a_multipath_put_spreads_over_both_links() {
    let test = "a_multipath_put_spreads_over_both_links";
    let Some(()) = ferry_netem::needs(test, ferry_netem::can_run()) else {
        return;
    };
    let link = || LinkConfig::new(0, 1, Duration::from_millis(20), Some(200_000_000));
    let topo = Topology::up(TopologyConfig {
        hosts: vec!["c".into(), "s".into()],
        links: vec![link(), link()],
        regime: Regime::Default,
    })
    .expect("topology up");
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let src = sb.path("src/big.bin");
    let size = 32u64 << 20;
    write_pattern(&src, size, 4);
    let token_file = sb.path("token");
    let listen: Vec<String> = (0..2)
        .map(|i| format!("{}:7000", topo.addr(i, End::B)))
        .collect();
    let log = sb.path("serve.log");
    let mut cmd = sb.ferry();
    cmd.arg("serve")
        .arg("--root")
        .arg(&root)
        .args(["--listen", &listen[0], "--listen", &listen[1]])
        .arg("--token-file")
        .arg(&token_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    topo.enter(topo.host("s").unwrap(), &mut cmd).unwrap();
    let mut guard = ChildGuard(Some(cmd.spawn().unwrap()));
    if let Err(e) = wait_serving(&mut guard, &log, &listen.join(", "), Duration::from_secs(5)) {
        panic!("{e}");
    }
    let token = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .to_owned();

    let mut put = sb.client(&token);
    put.args(["put", "--json", "--streams", "4", "--retry-for", "0"])
        .args(["--bind", &topo.addr(0, End::A).to_string()])
        .args(["--bind", &topo.addr(1, End::A).to_string()])
        .arg(&src)
        .arg(format!("{}:/", listen[0]));
    topo.enter(topo.host("c").unwrap(), &mut put).unwrap();
    let out = run(&mut put, CMD_TIMEOUT);
    assert_code(&out, 0);
    assert_eq!(u64_field(&one_json(&out.stdout), "bytes"), size);
    assert_eq!(tree_digest(&root), tree_digest(&sb.path("src")));
    let carried: Vec<u64> = (0..2).map(|i| topo.link_stats(i).a_to_b.tx_bytes).collect();
    eprintln!("links carried {carried:?} of {size}");
    for (i, c) in carried.iter().enumerate() {
        assert!(*c > size / 4, "link {i} carried {c} of {size}: {carried:?}");
    }
}
