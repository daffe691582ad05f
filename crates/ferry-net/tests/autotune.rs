//! Auto-tuned streams over loopback: the gate that lets only the active streams carry data,
//! the tuning report on both directions, and fixed counts left alone. No assertion on speed.

use crate::util;

use ferry_net::ClientConfig;
use util::*;

/// A client that asks for `max` connections, tuned, starting with `start`.
fn auto(mut c: ClientConfig, max: u16, start: u16) -> ClientConfig {
    c.opts.streams = max;
    c.opts.auto_start = start;
    c
}

fn one_of_the_bottlenecks(b: &str) -> bool {
    ["network", "source storage", "destination storage", "cpu"].contains(&b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_to_one_stream_only_the_first_carries_data() {
    let server = TestServer::start().await;
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("tree");
    // Several files, a directory and blocks of every shape, so every frame type is queued.
    write(&tree.join("big.bin"), &bytes(20 * BLOCK as usize + 5, 1));
    write(&tree.join("sub/small.bin"), &bytes(1000, 2));
    write(&tree.join("sub/mid.bin"), &bytes(3 * BLOCK as usize, 3));
    let mut cfg = auto(server.client(), 4, 4);
    cfg.force_streams = Some(1);
    let report = ferry_net::client::put(&cfg, std::slice::from_ref(&tree), "/in/", reporter())
        .await
        .unwrap();
    assert!(report.is_success(), "{:?}", report.errors);
    assert_eq!(snapshot(&tree), snapshot(&server.root.join("in/tree")));
    assert_eq!(report.streams.len(), 4, "every connection was opened");
    assert!(report.streams[0].bytes >= 23 * u64::from(BLOCK));
    for (i, s) in report.streams.iter().enumerate().skip(1) {
        assert_eq!(s.bytes, 0, "stream {i} is parked and must not carry frames");
    }
    let t = &report.tuning;
    assert_eq!(
        (t.mode, t.streams, t.connections, t.start),
        ("auto", 1, 4, 1)
    );
    assert_eq!(t.start_from, "test");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_put_and_get_arrive_identical_and_report_tuning() {
    let server = TestServer::start().await;
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("run");
    write(&tree.join("a.bin"), &bytes(40 * BLOCK as usize + 3, 4));
    for i in 0..30 {
        write(
            &tree.join(format!("s/{i}")),
            &bytes(100 * i + 1, 10 + i as u64),
        );
    }
    let cfg = auto(server.client(), 8, 3);
    let put = ferry_net::client::put(&cfg, std::slice::from_ref(&tree), "/in/", reporter())
        .await
        .unwrap();
    assert!(put.is_success(), "{:?}", put.errors);
    assert_eq!(snapshot(&tree), snapshot(&server.root.join("in/run")));
    let t = &put.tuning;
    assert_eq!((t.mode, t.connections), ("auto", 8));
    assert!((1..=8).contains(&t.streams), "{t:?}");
    assert_eq!(t.start_from, "default", "{t:?}");
    assert!(one_of_the_bottlenecks(t.bottleneck), "{t:?}");
    // Both ends' loads are known on a put: the sender's own, the receiver's from Complete.
    assert!(
        t.load.sender.is_some() && t.load.receiver.is_some(),
        "{t:?}"
    );
    assert!(t.load.same_host);
    let carried = put.streams.iter().filter(|s| s.bytes > 0).count();
    assert!((1..=8).contains(&carried));

    // On a get the server tunes; its report arrives in `Tuned`.
    let back = tempfile::tempdir().unwrap();
    let get = ferry_net::client::get(&cfg, "/in/run", &back.path().join("c/"), reporter())
        .await
        .unwrap();
    assert!(get.is_success(), "{:?}", get.errors);
    assert_eq!(snapshot(&tree), snapshot(&back.path().join("c/run")));
    let t = &get.tuning;
    assert_eq!((t.mode, t.connections), ("auto", 8));
    assert!(
        t.load.sender.is_some(),
        "the server's Tuned report arrived: {t:?}"
    );
    assert!(t.load.receiver.is_some());
    assert!(one_of_the_bottlenecks(t.bottleneck), "{t:?}");
    let json = serde_json::to_value(&get).unwrap();
    for k in [
        "mode",
        "streams",
        "start",
        "start_from",
        "steps",
        "bottleneck",
        "load",
    ] {
        assert!(!json["tuning"][k].is_null(), "tuning.{k} in {json}");
    }
    assert!(leftovers(&server.root).is_empty());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_count_uses_every_stream_and_says_so() {
    let server = TestServer::start().await;
    let src = tempfile::tempdir().unwrap();
    let file = src.path().join("f.bin");
    write(&file, &bytes(16 * BLOCK as usize, 9));
    let mut cfg = server.client();
    cfg.opts.streams = 3;
    let report = ferry_net::client::put(&cfg, std::slice::from_ref(&file), "/f.bin", reporter())
        .await
        .unwrap();
    assert!(report.is_success(), "{:?}", report.errors);
    let t = &report.tuning;
    assert_eq!(
        (t.mode, t.streams, t.connections, t.start_from),
        ("fixed", 3, 3, "fixed")
    );
    assert!(t.steps.is_empty());
    assert_eq!(
        std::fs::read(server.root.join("f.bin")).unwrap(),
        std::fs::read(&file).unwrap()
    );
    server.stop().await;
}
