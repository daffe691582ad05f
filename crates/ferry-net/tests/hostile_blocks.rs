//! Blocks a receiver must refuse (issue 34): data for a file that was never offered, and data
//! whose metadata contradicts the offer of its file. A raw client plays the sender; each case
//! must end its own session with a clear error, write nothing under any name in the server's
//! root, and leave the server serving the next client.

use crate::util;

use std::path::Path;
use std::time::Duration;

use ferry_proto::{Decision, ErrorCode, FileId, Frame};
use util::*;

/// The server's idle limit in these tests: also how long a data connection holds the block of
/// a file not offered yet before calling it the peer's error (`Offers::wait`).
const IDLE: Duration = Duration::from_secs(3);

const MTIME: i64 = 1_600_000_000_000_000_000;

async fn server() -> TestServer {
    TestServer::start_with(|c| c.idle_timeout = IDLE).await
}

/// The offer of one file with the metadata `raw_block` gives its blocks.
fn offer(id: u64, path: &str, size: u64) -> Frame {
    Frame::Offer {
        entries: vec![ferry_proto::OfferEntry {
            file: FileId(id),
            path: path.into(),
            size,
            mode: 0o644,
            mtime_ns: MTIME,
        }],
    }
}

/// Offers one file and returns the receiver's decision about it.
async fn offered(c: &mut Raw, id: u64, path: &str, size: u64) -> Decision {
    c.send(&offer(id, path, size)).await.unwrap();
    match c.expect(T).await {
        Frame::Decisions { mut entries } => {
            assert_eq!(entries.len(), 1, "{entries:?}");
            let e = entries.pop().unwrap();
            assert_eq!(e.file, FileId(id));
            e.decision
        }
        other => panic!("expected Decisions, got {other:?}"),
    }
}

/// The first block of `whole` (a file offered as `path`, id `id`), changed by `edit`.
fn edited_block(
    id: u64,
    path: &str,
    whole: &[u8],
    len: usize,
    edit: impl FnOnce(&mut ferry_proto::Block),
) -> Frame {
    let mut f = raw_block(id, path, whole, 0, len);
    if let Frame::Block(b) = &mut f {
        edit(b);
    }
    f
}

/// The session's end as the control connection sees it: an `Error` frame, then closed. The
/// idle limit bounds how long it may take.
async fn session_refused(c: &mut Raw) -> (ErrorCode, String) {
    let (err, closed) = refusal_message(c, IDLE + T).await;
    assert!(closed, "control still open after {err:?}");
    err.expect("an Error frame says why the session ended")
}

/// A real put through the same server afterwards, checked on disk: it still serves, and the
/// refused session left nothing in the way.
async fn assert_still_serves(server: &TestServer, name: &str) {
    let src = tempfile::tempdir().unwrap();
    let file = src.path().join(name);
    let content = bytes(3 * BLOCK as usize + 17, name.len() as u64);
    write(&file, &content);
    let r = put_past_busy(&server.client(), &file, 40, Duration::from_millis(100))
        .await
        .unwrap();
    assert!(r.is_success(), "{:?}", r.errors);
    assert_eq!(std::fs::read(server.root.join(name)).unwrap(), content);
}

/// Everything under `root`, waiting (bounded) for a session's cleanup to finish first: the
/// server removes temporary files after it has sent its `Error`.
async fn settled_names(root: &Path, want: impl Fn(&[String]) -> bool) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let now = names(root);
        if want(&now) || tokio::time::Instant::now() >= deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_for_a_file_never_offered_ends_the_session_and_writes_nothing() {
    let server = server().await;
    let whole = bytes(5000, 1);

    // No offer at all: the data connection holds the block for the idle limit, waiting for an
    // offer that may still be on its way, then calls it the peer's error.
    let (mut c, mut d) = raw_put(&server, "/").await;
    d.send(&raw_block(7, "never.bin", &whole, 0, whole.len()))
        .await
        .unwrap();
    let (code, message) = session_refused(&mut c).await;
    // The wait for the offer and the idle watchdog run out together; either ends the session.
    assert!(
        code == ErrorCode::PROTOCOL && message.contains("never offered")
            || code == ErrorCode::TIMEOUT,
        "{code:?}: {message}"
    );
    let left = settled_names(&server.root, |n| n.is_empty()).await;
    assert_eq!(
        left,
        Vec::<String>::new(),
        "written for a file never offered"
    );

    // Another file offered and accepted, and a block (sent early) for one that was not.
    let (mut c, mut d) = raw_put(&server, "/").await;
    assert_eq!(
        offered(&mut c, 0, "offered.bin", whole.len() as u64).await,
        Decision::Send
    );
    let mut stray = raw_block(1, "stray.bin", &whole, 0, whole.len());
    if let Frame::Block(b) = &mut stray {
        b.early = true;
    }
    d.send(&stray).await.unwrap();
    let (code, message) = session_refused(&mut c).await;
    assert!(
        code == ErrorCode::PROTOCOL && message.contains("never offered")
            || code == ErrorCode::TIMEOUT,
        "{code:?}: {message}"
    );
    let left = settled_names(&server.root, |n| n.is_empty()).await;
    assert_eq!(
        left,
        Vec::<String>::new(),
        "written for a file never offered"
    );

    // `Skipped` answers a `Complete` decision: for a file never offered it is refused at once
    // (`RecvError::Unoffered`), without waiting for anything.
    let (mut c, _d) = raw_put(&server, "/").await;
    c.send(&Frame::Skipped { file: FileId(9) }).await.unwrap();
    let started = tokio::time::Instant::now();
    let (code, message) = session_refused(&mut c).await;
    assert_eq!(code, ErrorCode::PROTOCOL, "{message}");
    assert!(message.contains("never offered"), "{message}");
    assert!(started.elapsed() < IDLE, "refused only by the idle limit");
    assert_eq!(names(&server.root), Vec::<String>::new());

    assert_still_serves(&server, "after-unoffered.bin").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_contradicting_its_offer_ends_the_session_and_writes_nothing() {
    let server = server().await;
    let whole = bytes(5000, 2);
    type Edit = fn(&mut ferry_proto::Block);
    let edits: [(&str, Edit); 5] = [
        // Larger: the block no longer ends the file, so it carries no file digest (a block
        // that claims one without ending its file is malformed, refused before any lookup).
        ("size", |b| {
            b.file.size += 1;
            b.file_digest = None;
        }),
        ("mode", |b| b.file.mode = 0o4755),
        ("mtime", |b| b.file.mtime_ns += 1),
        ("path", |b| b.file.path = "other.bin".into()),
        ("escaping path", |b| b.file.path = "../escaped.bin".into()),
    ];
    for (what, edit) in edits {
        let (mut c, mut d) = raw_put(&server, "/").await;
        assert_eq!(
            offered(&mut c, 0, "a.bin", whole.len() as u64).await,
            Decision::Send,
            "{what}"
        );
        d.send(&edited_block(0, "a.bin", &whole, whole.len(), edit))
            .await
            .unwrap();
        let (code, message) = session_refused(&mut c).await;
        assert_eq!(code, ErrorCode::PROTOCOL, "{what}: {message}");
        assert!(
            message.contains("inconsistent metadata"),
            "{what}: {message}"
        );
        // A file of one block is created by its first block: none was accepted, so nothing
        // exists, not even a temporary file.
        let left = settled_names(&server.root, |n| n.is_empty()).await;
        assert_eq!(left, Vec::<String>::new(), "{what}");
        assert!(
            !server.root.parent().unwrap().join("escaped.bin").exists(),
            "{what}"
        );
    }
    assert_still_serves(&server, "after-inconsistent.bin").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contradicting_block_of_a_large_file_leaves_only_its_empty_resume_files() {
    // A file of several blocks gets its temporary file and resume journal with its decision,
    // before any block. A session that breaks keeps them for the next attempt to resume, and a
    // refused one is no different: both are empty of data, and never under the final name.
    let server = server().await;
    let whole = bytes(3 * BLOCK as usize + 17, 3);
    let (mut c, mut d) = raw_put(&server, "/").await;
    assert_eq!(
        offered(&mut c, 0, "big.bin", whole.len() as u64).await,
        Decision::Send
    );
    d.send(&edited_block(0, "big.bin", &whole, BLOCK as usize, |b| {
        b.file.size -= 1
    }))
    .await
    .unwrap();
    let (code, message) = session_refused(&mut c).await;
    assert_eq!(code, ErrorCode::PROTOCOL, "{message}");
    assert!(message.contains("inconsistent metadata"), "{message}");
    let left = settled_names(&server.root, |n| n.len() == 2).await;
    assert_eq!(temp_names(&server.root), left, "only temporary files");
    assert_eq!(left.len(), 2, "a part file and its journal: {left:?}");
    assert!(left.iter().any(|n| n.ends_with(".journal")), "{left:?}");
    let part = left.iter().find(|n| n.ends_with(".part")).unwrap();
    assert_eq!(
        std::fs::metadata(server.root.join(part)).unwrap().len(),
        0,
        "data written from a refused block"
    );

    // The real file under that name afterwards: it arrives whole, and the leftovers go (the
    // journal no longer matches, so nothing is resumed from them).
    let src = tempfile::tempdir().unwrap();
    let file = src.path().join("big.bin");
    write(&file, &whole);
    let r = put_past_busy(&server.client(), &file, 40, Duration::from_millis(100))
        .await
        .unwrap();
    assert!(r.is_success(), "{:?}", r.errors);
    assert!(std::fs::read(server.root.join("big.bin")).unwrap() == whole);
    assert_eq!(names(&server.root), ["big.bin"]);
    server.stop().await;
}
