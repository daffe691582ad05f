//! How a get ends. The receiving client leaves as soon as it has sent `Complete`, once it holds
//! the server's `Tuned`, which a server sends ahead of `Complete` to a client that says
//! `EARLY_TUNED`: the client does not wait a round trip for the server to close. A block the
//! server is still writing then meets a closed connection, and the server must not count the
//! session as failed for it when `Complete` follows.

use crate::util;

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_proto::{
    Capabilities, CompleteSummary, Decision, FileDecision, Frame, Load, TransferOpts,
};
use util::*;

/// A get through the client API leaves with the server's report and every byte counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_leaves_with_the_servers_report() {
    let server = TestServer::start().await;
    let content = bytes(40 * BLOCK as usize + 5, 7);
    write(&server.root.join("f.bin"), &content);
    for round in 0..3 {
        let back = tempfile::tempdir().unwrap();
        let report = ferry_net::client::get(&server.client(), "/f.bin", back.path(), reporter())
            .await
            .unwrap();
        assert!(report.is_success(), "round {round}: {:?}", report.errors);
        assert_eq!(std::fs::read(back.path().join("f.bin")).unwrap(), content);
        // The sender's load comes only in its `Tuned`: the early report arrived.
        assert!(
            report.tuning.load.sender.is_some(),
            "round {round}: no report from the server"
        );
        // Every data connection reports what it carried, although the client did not wait
        // for the server to close them; copies sent twice at the end may add to the sum.
        let carried: u64 = report.streams.iter().map(|s| s.bytes).sum();
        assert_eq!(report.streams.len(), 4, "round {round}");
        assert!(
            carried >= content.len() as u64,
            "round {round}: the streams carried {carried} of {} bytes",
            content.len()
        );
    }
    // The server took nothing amiss: it still serves, and has nothing half-written.
    let src = tempfile::tempdir().unwrap();
    write(&src.path().join("after.bin"), &content);
    let r = ferry_net::client::put(
        &server.client(),
        &[src.path().join("after.bin")],
        "/",
        reporter(),
    )
    .await
    .unwrap();
    assert!(r.is_success(), "{:?}", r.errors);
    assert!(leftovers(&server.root).is_empty());
    server.stop().await;
}

/// A raw client gets a file over two connections, the second with a window too small to
/// carry anything, so the server's endgame sends its blocks again on the first, while its
/// writes to the second stay blocked. With
/// everything in hand, it resets the stuck connection (as a client that leaves does, with a
/// block still on its way) and sends `Complete` only after the server has seen the reset. A
/// client that said `EARLY_TUNED` had the server's report before `Complete`, and the server
/// ends the session well: its second `Tuned`, sent only after a session that succeeded,
/// follows `Complete`. Without the capability there is no early report, a client never
/// leaves early, and the same reset fails the session at once: the race is real.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_before_complete_fails_a_get_only_without_the_early_report() {
    let server = TestServer::start().await;
    // More than the stuck connection can take before its writes block (its unsent limit of
    // 1 MiB and a write buffer), so that the server is writing when the reset comes.
    let content = bytes(128 * BLOCK as usize, 11);
    write(&server.root.join("f.bin"), &content);
    for early in [true, false] {
        let (report_before, report_after) = reset_then_complete(&server, &content, early).await;
        assert_eq!(
            report_before, early,
            "early = {early}: a report before Complete"
        );
        assert_eq!(
            report_after, early,
            "early = {early}: the session's outcome"
        );
    }
    server.stop().await;
}

/// Runs one raw get as described above; returns whether a `Tuned` came before `Complete`, and
/// whether one came after it (the session ended well on the server).
async fn reset_then_complete(server: &TestServer, content: &[u8], early: bool) -> (bool, bool) {
    let mut hello = hello_control(TOKEN);
    let (session, secret) = session_of(&hello);
    if !early {
        if let Frame::Hello { capabilities, .. } = &mut hello {
            *capabilities = Capabilities(Capabilities::RESEND);
        }
    }
    let mut c = Raw::connect(server.addr).await;
    c.send(&hello).await.unwrap();
    assert!(matches!(c.expect(T).await, Frame::Welcome { .. }));
    let opts = TransferOpts {
        streams: 2,
        ..raw_opts(ferry_proto::ExistingPolicy::Fail)
    };
    c.send(&Frame::GetRequest {
        src: "/f.bin".into(),
        opts,
    })
    .await
    .unwrap();
    // Ready, and the offer (in either order).
    let mut offered = None;
    let mut ready = false;
    while !ready || offered.is_none() {
        match c.expect(T).await {
            Frame::Ready { streams: 2, .. } => ready = true,
            Frame::Offer { entries } => offered = entries.first().map(|e| e.file),
            other => panic!("expected Ready and an Offer, got {other:?}"),
        }
    }
    let mut d0 = Raw::connect(server.addr).await;
    // The smallest receive buffer the kernel allows: this connection's window stays shut.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(1).unwrap();
    let mut d1 = Raw::from_stream(sock.connect(server.addr).await.unwrap());
    d0.send(&hello_data(session, secret, 0)).await.unwrap();
    d1.send(&hello_data(session, secret, 1)).await.unwrap();
    c.send(&Frame::Decisions {
        entries: vec![FileDecision {
            file: offered.unwrap(),
            decision: Decision::Send,
        }],
    })
    .await
    .unwrap();
    assert!(matches!(d0.expect(T).await, Frame::Welcome { .. }));
    assert!(matches!(d1.expect(T).await, Frame::Welcome { .. }));
    // Everything arrives on the first connection, part of it as the endgame's copies.
    let mut have: BTreeMap<u64, usize> = BTreeMap::new();
    while have.values().sum::<usize>() < content.len() {
        match d0.expect(Duration::from_secs(10)).await {
            Frame::Block(b) => {
                let at = b.offset as usize;
                assert_eq!(&content[at..at + b.data.len()], &b.data[..]);
                have.insert(b.offset, b.data.len());
            }
            other => panic!("unexpected {other:?} on a data connection"),
        }
    }
    // The control frames so far: `Sent`, and the report if it came early.
    let mut report_before = false;
    loop {
        match c.recv(Duration::from_millis(500)).await {
            Read::Frame(Frame::Tuned(_)) => report_before = true,
            Read::Frame(Frame::Sent { .. }) => {}
            Read::TimedOut => break,
            other => panic!("unexpected {other:?} on control"),
        }
    }
    let reset = socket2::SockRef::from(&d1.stream);
    reset.set_linger(Some(Duration::ZERO)).unwrap();
    drop(d1);
    // Long enough for the server's blocked write to fail first.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let summary = CompleteSummary {
        files: 1,
        bytes: content.len() as u64,
        skipped: 0,
        failed: 0,
        bad_blocks: 0,
        receiver: Load::default(),
    };
    let _ = c.send(&Frame::Complete(summary)).await;
    // Only a session that ended well sends its report after `Complete`.
    let report_after = match c.recv(T).await {
        Read::Frame(Frame::Tuned(_)) => true,
        Read::Closed => false,
        other => panic!("unexpected {other:?} after Complete"),
    };
    drop(d0);
    (report_before, report_after)
}
