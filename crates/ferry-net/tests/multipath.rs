//! Several network paths between a client and a server: the server tells a multipath client
//! its data addresses (`Paths`), the client spreads its data connections over them (and over
//! its own local addresses, `bind`), and blocks go to each path as fast as it takes them.

use crate::util;

use std::net::IpAddr;
use std::time::Duration;

use util::*;

/// A server whose two network paths are counting relays to itself, the second one paced to
/// `pace` bytes per second where given.
async fn two_paths(pace: Option<u64>) -> (TestServer, Relay, Relay) {
    let (one, to_one) = Relay::start_later(None).await;
    let (two, to_two) = Relay::start_later(pace).await;
    let paths = vec![one.addr.to_string(), two.addr.to_string()];
    let server = TestServer::start_with(|c| c.paths = paths).await;
    let _ = (to_one.send(server.addr), to_two.send(server.addr));
    (server, one, two)
}

fn multipath(server: &TestServer) -> ferry_net::ClientConfig {
    let mut cfg = server.client();
    cfg.multipath = true;
    cfg
}

#[tokio::test]
async fn a_multipath_put_and_get_spread_their_connections_over_every_path() {
    let (server, one, two) = two_paths(None).await;
    let dir = tempfile::tempdir().unwrap();
    let data = bytes(16 << 20, 3);
    write(&dir.path().join("f"), &data);
    let mut cfg = multipath(&server);
    cfg.bind = vec![
        "127.0.0.1".parse::<IpAddr>().unwrap(),
        "127.0.0.2".parse().unwrap(),
    ];
    let report = ferry_net::client::put(&cfg, &[dir.path().join("f")], "/", reporter())
        .await
        .expect("put");
    assert_eq!(report.bytes, data.len() as u64);
    assert_eq!(std::fs::read(server.root.join("f")).unwrap(), data);
    // Four data connections, two per path (the control connection reached the server
    // directly), and data on both: how much each carries is up to each path's rate.
    let (a, b) = (one.bytes(), two.bytes());
    let total = data.len() as u64;
    assert_eq!((one.peers().len(), two.peers().len()), (2, 2));
    assert!(
        a > 0 && b > 0 && a + b >= total,
        "paths carried {a} and {b} of {total}"
    );
    // Connection i left from bind[i mod 2]: both local addresses were used.
    let from: std::collections::BTreeSet<IpAddr> = one
        .peers()
        .into_iter()
        .chain(two.peers())
        .map(|p| p.ip())
        .collect();
    assert_eq!(from.len(), 2, "local addresses used: {from:?}");
    let back = tempfile::tempdir().unwrap();
    let before = one.bytes() + two.bytes();
    ferry_net::client::get(&cfg, "/f", back.path(), reporter())
        .await
        .expect("get");
    assert_eq!(std::fs::read(back.path().join("f")).unwrap(), data);
    assert!(
        one.bytes() + two.bytes() - before > total,
        "the get went over the paths too"
    );
}

#[tokio::test]
async fn blocks_go_to_each_path_as_fast_as_it_takes_them_not_round_robin() {
    // The second path is paced to 2 MB/s: round robin would give it half the data.
    let (server, fast, slow) = two_paths(Some(2 << 20)).await;
    let dir = tempfile::tempdir().unwrap();
    let data = bytes(24 << 20, 5);
    write(&dir.path().join("g"), &data);
    let mut cfg = multipath(&server);
    cfg.opts.streams = 4;
    ferry_net::client::put(&cfg, &[dir.path().join("g")], "/", reporter())
        .await
        .expect("put");
    assert_eq!(std::fs::read(server.root.join("g")).unwrap(), data);
    let (f, s) = (fast.bytes(), slow.bytes());
    assert!(s > 0, "the slow path carried something");
    assert!(
        s * 100 < (f + s) * 35,
        "the slow path carried {s} of {}: blocks were not spread by rate",
        f + s
    );
}

#[tokio::test]
async fn a_server_listening_on_several_addresses_tells_them_and_serves_all() {
    // Two loopback addresses of one server; the client is told both and uses both.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let mut config = ferry_net::ServerConfig::new(&root, TOKEN);
    config.max_streams = 8;
    // Raw frames below speak plain TCP.
    config.allow_plaintext = true;
    let fingerprint = config.tls.as_ref().unwrap().fingerprint();
    let addrs = [
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.3:0".parse().unwrap(),
    ];
    let server = ferry_net::Server::bind_all(&addrs, config).await.unwrap();
    let bound = server.local_addrs().unwrap();
    assert_eq!(bound.len(), 2);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    let mut cfg = client_config(bound[0].to_string());
    cfg.security = ferry_net::Security::Tls(ferry_net::ServerTrust::Pinned(fingerprint));
    cfg.multipath = true;
    let src = tempfile::tempdir().unwrap();
    let data = bytes(4 << 20, 8);
    write(&src.path().join("h"), &data);
    let report = ferry_net::client::put(&cfg, &[src.path().join("h")], "/", reporter())
        .await
        .expect("put");
    assert_eq!(std::fs::read(root.join("h")).unwrap(), data);
    assert_eq!(report.bytes, data.len() as u64);
    // What a multipath client is told: both addresses, as bound.
    let mut raw = Raw::connect(bound[1]).await;
    let hello = match hello_control(TOKEN) {
        ferry_proto::Frame::Hello { version, role, .. } => ferry_proto::Frame::Hello {
            version,
            capabilities: ferry_proto::Capabilities(
                ferry_proto::Capabilities::ours().0 | ferry_proto::Capabilities::MULTIPATH,
            ),
            role,
        },
        other => panic!("{other:?}"),
    };
    raw.send(&hello).await.unwrap();
    assert!(matches!(
        raw.expect(T).await,
        ferry_proto::Frame::Welcome { .. }
    ));
    let told = match raw.expect(T).await {
        ferry_proto::Frame::Paths { addrs } => addrs,
        other => panic!("expected Paths, got {other:?}"),
    };
    let bound: Vec<String> = bound.iter().map(ToString::to_string).collect();
    assert_eq!(told, bound);
    // A client without the capability sees no Paths: its next frame answers its request.
    let (mut plain, _, _) = control_at(bound[1].parse().unwrap()).await;
    plain
        .send(&ferry_proto::Frame::ListRequest { path: "/".into() })
        .await
        .unwrap();
    assert!(matches!(
        plain.expect(T).await,
        ferry_proto::Frame::ListEntries { .. } | ferry_proto::Frame::ListEnd
    ));
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
}

#[tokio::test]
async fn an_auto_tuned_put_over_three_paths_moves_in_multiples_of_three() {
    let (a, to_a) = Relay::start_later(None).await;
    let (b, to_b) = Relay::start_later(None).await;
    let (c, to_c) = Relay::start_later(None).await;
    let paths = vec![a.addr.to_string(), b.addr.to_string(), c.addr.to_string()];
    let server = TestServer::start_with(|cfg| cfg.paths = paths).await;
    let _ = (
        to_a.send(server.addr),
        to_b.send(server.addr),
        to_c.send(server.addr),
    );
    let dir = tempfile::tempdir().unwrap();
    let data = bytes(8 << 20, 9);
    write(&dir.path().join("k"), &data);
    let mut cfg = multipath(&server);
    // Auto-tuned from the default of 4, up to 16 connections.
    cfg.opts.streams = 16;
    cfg.opts.auto_start = 4;
    let report = ferry_net::client::put(&cfg, &[dir.path().join("k")], "/", reporter())
        .await
        .expect("put");
    assert_eq!(std::fs::read(server.root.join("k")).unwrap(), data);
    // 4 streams would leave one path with two and two with one: it starts on 6, two each.
    let t = &report.tuning;
    assert!(t.start >= 3 && t.start % 3 == 0, "{t:?}");
    assert!(t.streams >= 3 && t.streams % 3 == 0, "{t:?}");
}
