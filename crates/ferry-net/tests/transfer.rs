//! put and get against a real server on loopback, checked with digests computed outside ferry.

use crate::util;

use std::os::unix::fs::PermissionsExt;

use util::*;

/// 0, 1, block−1, block, block+1 and several blocks: every edge of the block grid.
const SIZES: [usize; 7] = [
    0,
    1,
    BLOCK as usize - 1,
    BLOCK as usize,
    BLOCK as usize + 1,
    5 * BLOCK as usize + 17,
    16 * BLOCK as usize,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_then_get_boundary_sizes_byte_identical() {
    let server = TestServer::start().await;
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("run42");
    for (i, n) in SIZES.iter().enumerate() {
        write(&tree.join(format!("f{i}_{n}")), &bytes(*n, i as u64));
    }
    let report = ferry_net::client::put(
        &server.client(),
        std::slice::from_ref(&tree),
        "/incoming/",
        reporter(),
    )
    .await
    .unwrap();
    assert_eq!(report.files, SIZES.len() as u64);
    assert!(report.is_success(), "{:?}", report.errors);
    assert_eq!(
        snapshot(&tree),
        snapshot(&server.root.join("incoming/run42"))
    );

    let back = tempfile::tempdir().unwrap();
    let report = ferry_net::client::get(
        &server.client(),
        "/incoming/run42",
        &back.path().join("copy/"),
        reporter(),
    )
    .await
    .unwrap();
    assert!(report.is_success(), "{:?}", report.errors);
    assert_eq!(snapshot(&tree), snapshot(&back.path().join("copy/run42")));
    assert!(leftovers(&server.root).is_empty());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_file_renamed_like_cp_and_mode_mtime_kept() {
    let server = TestServer::start().await;
    let src = tempfile::tempdir().unwrap();
    let f = src.path().join("data.bin");
    write(&f, &bytes(300_000, 7));
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
    let cfg = server.client();
    ferry_net::client::put(&cfg, std::slice::from_ref(&f), "/renamed.bin", reporter())
        .await
        .unwrap();
    let got = server.root.join("renamed.bin");
    assert_eq!(std::fs::read(&got).unwrap(), std::fs::read(&f).unwrap());
    let (a, b) = (
        std::fs::metadata(&f).unwrap(),
        std::fs::metadata(&got).unwrap(),
    );
    assert_eq!(b.permissions().mode() & 0o7777, 0o640);
    assert_eq!(a.modified().unwrap(), b.modified().unwrap());
    server.stop().await;
}

/// A data connection that stops sending for good at its first block (as a window that never
/// reopens would) must not hold the transfer: once everything else has gone out, the endgame
/// sends that block again on an idle connection, the receiver keeps the bytes once, the
/// sender's progress counts them once, and the stuck connection, still writing when the
/// session ends, is reset. Without the endgame this put would wait for the stuck block until
/// the idle timeout (20 s here) and fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_connections_block_is_sent_again_on_an_idle_one() {
    let server = TestServer::start().await;
    let src = tempfile::tempdir().unwrap();
    let file = src.path().join("stuck.bin");
    write(&file, &bytes(40 * BLOCK as usize + 3, 7));
    let mut cfg = server.client();
    cfg.stall_stream = Some(1);
    let counted = std::sync::Arc::new(CountBytes::default());
    let report = ferry_net::client::put(&cfg, std::slice::from_ref(&file), "/in/", counted.clone())
        .await
        .unwrap();
    assert!(report.is_success(), "{:?}", report.errors);
    assert_eq!(
        std::fs::read(&file).unwrap(),
        std::fs::read(server.root.join("in/stuck.bin")).unwrap()
    );
    // The stuck block counts once, though only its copy was written: the progress reads whole
    // (it read one block short when bytes were counted after their write).
    assert_eq!(
        counted.0.load(std::sync::atomic::Ordering::Relaxed),
        40 * u64::from(BLOCK) + 3
    );
    assert!(leftovers(&server.root).is_empty());
    let s = &report.streams;
    assert_eq!(s[1].bytes, 0, "the stuck connection wrote nothing");
    assert!(s[1].reset, "and was reset at the end: {s:?}");
    assert_eq!(s[1].resent, 0, "it carried no copies");
    let resent: u64 = s.iter().map(|s| s.resent).sum();
    assert!(resent > 0, "its block went out again: {s:?}");
    server.stop().await;
}

/// A put sends its first blocks on every data connection it dialled, before the server has
/// said how many it grants (`Block::early`). A server that grants one of eight refuses the
/// others, and what they carried goes again on the one it kept: the tree arrives whole. A
/// re-run finds every file in place: its early blocks are dropped, and each file is skipped
/// on the digests alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_blocks_on_connections_beyond_the_grant_are_sent_again() {
    let server = TestServer::start_with(|c| c.max_streams = 1).await;
    let src = tempfile::tempdir().unwrap();
    let tree = src.path().join("early");
    for i in 0..12u64 {
        write(
            &tree.join(format!("f{i}")),
            &bytes((i as usize + 1) * BLOCK as usize / 3, i),
        );
    }
    let mut cfg = server.client();
    cfg.opts.streams = 8;
    let report = ferry_net::client::put(&cfg, std::slice::from_ref(&tree), "/in/", reporter())
        .await
        .unwrap();
    assert!(report.is_success(), "{:?}", report.errors);
    assert_eq!(report.files, 12);
    assert_eq!(report.streams.len(), 1, "the server granted one connection");
    assert_eq!(snapshot(&tree), snapshot(&server.root.join("in/early")));

    let again = ferry_net::client::put(&cfg, std::slice::from_ref(&tree), "/in/", reporter())
        .await
        .unwrap();
    assert!(again.is_success(), "{:?}", again.errors);
    assert_eq!(again.skipped, 12, "{again:?}");
    assert_eq!(snapshot(&tree), snapshot(&server.root.join("in/early")));
    assert!(leftovers(&server.root).is_empty());
    server.stop().await;
}

/// A client's writer count on a put (and reader count on a get) reaches the server, which
/// runs that many within its own `max_storage_threads`; asking nothing leaves the server's
/// own tuned pool. The count is what the server reports working at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_asks_the_server_for_storage_threads_within_its_cap() {
    let server = TestServer::start_with(|c| {
        c.writers = 2;
        c.readers = 2;
        c.tune_storage = false;
        c.max_storage_threads = 6;
    })
    .await;
    let src = tempfile::tempdir().unwrap();
    let file = src.path().join("f.bin");
    write(&file, &bytes(3 * BLOCK as usize + 5, 9));
    for (asked, want) in [(0u16, 2u32), (3, 3), (9, 6)] {
        let mut cfg = server.client();
        cfg.opts.storage_threads = asked;
        let dest = format!("/asked{asked}/");
        let put = ferry_net::client::put(&cfg, std::slice::from_ref(&file), &dest, reporter())
            .await
            .unwrap();
        assert!(put.is_success(), "{:?}", put.errors);
        assert_eq!(put.tuning.writers.side, "server");
        assert_eq!(put.tuning.writers.threads, Some(want), "put asking {asked}");
        let back = tempfile::tempdir().unwrap();
        let get = ferry_net::client::get(&cfg, &format!("{dest}f.bin"), back.path(), reporter())
            .await
            .unwrap();
        assert!(get.is_success(), "{:?}", get.errors);
        assert_eq!(get.tuning.readers.side, "server");
        assert_eq!(get.tuning.readers.threads, Some(want), "get asking {asked}");
        assert_eq!(
            std::fs::read(back.path().join("f.bin")).unwrap(),
            std::fs::read(&file).unwrap()
        );
    }
    server.stop().await;
}
