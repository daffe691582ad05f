//! `ferry_net::speedtest` against an in-process server on loopback: both directions count the same
//! bytes, the intervals are bounded, and the server bounds what it is asked for.

use crate::util;

use std::time::Duration;

use ferry_net::speedtest::{
    run, ProbeDirection, ProbePoint, DRAIN_GRACE, MAX_PROBE_DURATION, PROBE_INTERVAL,
};
use ferry_net::SessionError;
use ferry_proto::{ErrorCode, MAX_PROBE_INTERVALS};
use util::{reporter, TestServer};

fn point(direction: ProbeDirection, streams: u16, duration: Duration) -> ProbePoint {
    ProbePoint {
        direction,
        streams,
        duration,
        window: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_sides_count_the_same_bytes_in_both_directions() {
    let server = TestServer::start().await;
    let cfg = server.client();
    for direction in [
        ProbeDirection::ClientToServer,
        ProbeDirection::ServerToClient,
    ] {
        let p = point(direction, 2, Duration::from_secs(1));
        let r = tokio::time::timeout(Duration::from_secs(20), run(&cfg, &p, &*reporter()))
            .await
            .expect("a 1 s probe ends well within 20 s")
            .unwrap();
        eprintln!(
            "{direction:?}: sent {} received {} in {} intervals, {:.0} Mbit/s",
            r.sent_bytes,
            r.received_bytes,
            r.intervals.len(),
            r.rate_mbps(Duration::from_millis(250))
        );
        assert_eq!(r.streams, 2);
        assert_eq!(r.per_stream.len(), 2);
        assert!(r.sent_bytes > 0, "{r:?}");
        // The sender closes its connections and the receiver reads them to the end, so
        // nothing is in flight when the counts are compared: they agree exactly. Allow the
        // socket buffers' worth anyway (what a receiver stopped by its deadline would miss).
        let margin = 32 << 20;
        assert!(r.received_bytes <= r.sent_bytes, "{r:?}");
        assert!(r.sent_bytes - r.received_bytes <= margin, "{r:?}");
        for s in &r.per_stream {
            assert!(
                s.received_bytes <= s.sent_bytes && s.sent_bytes > 0,
                "{s:?}"
            );
        }
        assert_eq!(r.intervals.iter().sum::<u64>(), r.received_bytes, "{r:?}");
        assert_eq!(u128::from(r.interval_ms), PROBE_INTERVAL.as_millis());
        // 1 s of sending plus the drain grace, in 100 ms buckets.
        let bound = (Duration::from_secs(1) + DRAIN_GRACE).as_millis() / PROBE_INTERVAL.as_millis();
        assert!(r.intervals.len() as u128 <= bound, "{}", r.intervals.len());
        assert!(r.rate_mbps(Duration::from_millis(250)) > 0.0);
        // The sender's TCP_INFO came back (from the client or from the server).
        assert!(r.per_stream.iter().all(|s| s.snd_mss > 0), "{r:?}");
        assert!(r.rtt_idle_us > 0, "{r:?}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_bounds_duration_and_streams() {
    let server = TestServer::start_with(|c| c.max_streams = 3).await;
    let cfg = server.client();

    // Ten thousand seconds: refused by the client before it connects...
    let long = point(
        ProbeDirection::ServerToClient,
        1,
        Duration::from_secs(10_000),
    );
    let e = run(&cfg, &long, &*reporter()).await.unwrap_err();
    assert!(
        matches!(&e, SessionError::Remote { code, .. } if *code == ErrorCode::BAD_REQUEST),
        "{e}"
    );

    // ...and by the server when a client sends it anyway.
    let e = raw_probe_request(&server, 10_000_000, 1).await;
    assert!(e.contains("a probe runs"), "{e}");

    // Ten thousand streams are beyond what the protocol can say.
    let e = raw_probe_request(&server, 1000, 10_000).await;
    assert!(e.contains("streams"), "{e}");

    // More streams than the server's max_streams: lowered to it.
    let many = point(
        ProbeDirection::ClientToServer,
        200,
        Duration::from_millis(300),
    );
    let r = run(&cfg, &many, &*reporter()).await.unwrap();
    assert_eq!(r.streams, 3);
    assert_eq!(r.per_stream.len(), 3);
    assert!(r.intervals.len() <= MAX_PROBE_INTERVALS);
    assert!(MAX_PROBE_DURATION.as_millis() / PROBE_INTERVAL.as_millis() < 1024);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_gets_no_probe() {
    let server = TestServer::start().await;
    let mut cfg = server.client();
    cfg.token = "wrong".into();
    let p = point(
        ProbeDirection::ClientToServer,
        1,
        Duration::from_millis(200),
    );
    let e = run(&cfg, &p, &*reporter()).await.unwrap_err();
    assert!(
        matches!(&e, SessionError::Remote { code, .. } if *code == ErrorCode::AUTH),
        "{e}"
    );
    server.stop().await;
}

/// Sends a `ProbeRequest` over plain TCP, bypassing the client's own checks, and returns the
/// server's error message.
async fn raw_probe_request(server: &TestServer, duration_ms: u32, streams: u16) -> String {
    use bytes::BytesMut;
    use ferry_proto::{Frame, FrameHeader, HEADER_LEN};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let mut s = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let mut out = BytesMut::new();
    util::hello_control(util::TOKEN).encode(&mut out);
    Frame::ProbeRequest {
        direction: ProbeDirection::ServerToClient,
        streams,
        duration_ms,
        window: 0,
    }
    .encode(&mut out);
    s.write_all(&out).await.unwrap();
    let read = async {
        loop {
            let mut head = [0u8; HEADER_LEN];
            s.read_exact(&mut head).await.unwrap();
            let h = FrameHeader::parse(&head).unwrap();
            let mut payload = vec![0u8; h.len as usize];
            s.read_exact(&mut payload).await.unwrap();
            match Frame::decode(h.ty, payload.into()).unwrap() {
                Frame::Welcome { .. } => continue,
                Frame::Error { message, .. } => return message,
                other => panic!("expected an error, got {other:?}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("the server answers")
}
