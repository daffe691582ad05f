//! The receiver's unit tests: ranges, policies, offers, and blocks of one file arriving in any
//! order, twice, or from many threads.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use ferry_proto::{
    Block, ChecksumAlgo, Decision, ErrorCode, ExistingPolicy, FileId, FileMeta, Frame, OfferEntry,
};

use super::state::{free_parts, lock, Ranges};
use super::*;
use crate::digest::{block_digest, FileHasher};
use crate::report::Reporter;
use crate::root::Root;

#[test]
fn safe_links_stay_inside_the_top_entry() {
    assert!(stays_in_tree("tree/link", "a/b"));
    assert!(stays_in_tree("tree/a/link", "../b"));
    assert!(stays_in_tree("tree/a/link", "./../a/./c"));
    assert!(!stays_in_tree("tree/link", "../x"));
    assert!(!stays_in_tree("tree/a/link", "../../x"));
    assert!(!stays_in_tree("tree/a/link", "../b/../../x"));
    assert!(!stays_in_tree("tree/link", "/etc/passwd"));
    assert!(!stays_in_tree("link", "x"));
    assert!(Links::Any.allows("link", "/etc/passwd"));
}

#[test]
fn links_below_a_directory_stay_inside_it() {
    assert!(Links::Below.allows("link", "sub/b"));
    assert!(Links::Below.allows("sub/link", "../a"));
    assert!(!Links::Below.allows("link", "../x"));
    assert!(!Links::Below.allows("sub/link", "../../x"));
    assert!(!Links::Below.allows("link", "/etc/passwd"));
    assert!(!Links::InTree.allows("link", "sub/b"));
}

#[test]
fn safe_modes_clear_setuid_setgid_and_world_write() {
    assert_eq!(Modes::Safe.apply(0o107777), 0o1775);
    assert_eq!(Modes::Safe.apply(0o106777), 0o775);
    assert_eq!(Modes::Safe.apply(0o4755), 0o755);
    assert_eq!(Modes::Safe.apply(0o644), 0o644);
    assert_eq!(Modes::Keep.apply(0o106777), 0o6777);
}

#[test]
fn ranges_merge_and_report_runs() {
    let mut r = Ranges::default();
    assert!(r.insert(10, 20));
    assert!(r.insert(30, 40));
    assert_eq!(r.run_end(0), None);
    assert!(r.insert(0, 10));
    assert_eq!(r.run_end(0), Some(20));
    assert!(!r.insert(12, 18));
    assert!(r.insert(20, 30));
    assert_eq!(r.run_end(5), Some(40));
    assert!(r.contains(0, 40));
    assert!(!r.contains(0, 41));
    assert_eq!(r.uncovered(0, 40), 0);
    assert_eq!(r.uncovered(35, 50), 10);
    assert!(r.insert(60, 70));
    assert_eq!(r.uncovered(30, 80), 30, "the gap 40..60 and 70..80");
    assert_eq!(r.uncovered(100, 100), 0);
}

fn receiver(dir: &std::path::Path) -> (Arc<Receiver>, flume::Receiver<Frame>) {
    receiver_with(dir, Arc::new(crate::report::NoReporter))
}

fn receiver_with(
    dir: &std::path::Path,
    reporter: Arc<dyn Reporter>,
) -> (Arc<Receiver>, flume::Receiver<Frame>) {
    receiver_algo(dir, reporter, ChecksumAlgo::Blake3)
}

fn receiver_algo(
    dir: &std::path::Path,
    reporter: Arc<dyn Reporter>,
    checksum: ChecksumAlgo,
) -> (Arc<Receiver>, flume::Receiver<Frame>) {
    let dest = Destination {
        root: Root::open(dir).unwrap(),
        base: "in".into(),
        rename_top: None,
    };
    let config = ReceiverConfig {
        existing: ExistingPolicy::Fail,
        checksum,
        tag: 7,
        block_size: 1 << 20,
        modes: Modes::default(),
        links: Links::default(),
    };
    let (tx, rx) = flume::unbounded();
    let r = Receiver::new(dest, config, tx, reporter).unwrap();
    (r, rx)
}

fn offer(id: u64, path: &str, size: u64) -> Frame {
    Frame::Offer {
        entries: vec![OfferEntry {
            file: FileId(id),
            path: path.into(),
            size,
            mode: 0o644,
            mtime_ns: 0,
        }],
    }
}

fn decision(rx: &flume::Receiver<Frame>) -> Decision {
    match rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap() {
        Frame::Decisions { mut entries } => entries.pop().unwrap().decision,
        other => panic!("expected Decisions, got {other:?}"),
    }
}

#[test]
fn offer_larger_than_the_file_system_is_refused_up_front() {
    let dir = tempfile::tempdir().unwrap();
    let (r, rx) = receiver(dir.path());
    let size = 1u64 << 50;
    r.handle(offer(1, "sub/huge.bin", size)).unwrap();
    match decision(&rx) {
        Decision::Fail { code, message } => {
            assert_eq!(code, ErrorCode::NO_SPACE);
            assert!(message.contains("in/sub/huge.bin"), "{message}");
            assert!(message.contains(&size.to_string()), "{message}");
            assert!(message.contains("available"), "{message}");
        }
        other => panic!("expected Fail, got {other:?}"),
    }
    // Nothing was created for it: no temporary file, no journal.
    let sub: Vec<_> = std::fs::read_dir(dir.path().join("in/sub"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(sub.is_empty(), "{sub:?}");
    // A file that fits is still accepted.
    r.handle(offer(2, "sub/small.bin", 4096)).unwrap();
    assert_eq!(decision(&rx), Decision::Send);
    r.abort();
}

#[test]
fn files_of_one_offer_are_charged_against_one_reading_of_the_free_space() {
    let dir = tempfile::tempdir().unwrap();
    let st = rustix::fs::statvfs(dir.path()).unwrap();
    let available = st.f_bavail.saturating_mul(st.f_frsize);
    if available < 1 << 20 {
        eprintln!("skipped: the temporary directory's file system is nearly full");
        return;
    }
    let (r, rx) = receiver(dir.path());
    // Each fits alone; the two together do not. Nothing is preallocated, so the disk
    // itself never fills: only the bookkeeping can refuse the second.
    let each = available / 10 * 6;
    // Another directory on the same file system shares the budget; a file system without
    // an id is budgeted per directory, so there both go in one.
    let second = if st.f_fsid != 0 {
        "b/two.bin"
    } else {
        "a/two.bin"
    };
    let entry = |id: u64, path: &str, size: u64| OfferEntry {
        file: FileId(id),
        path: path.into(),
        size,
        mode: 0o644,
        mtime_ns: 0,
    };
    r.handle(Frame::Offer {
        entries: vec![
            entry(1, "a/one.bin", each),
            entry(2, second, each),
            entry(3, "b/small.bin", 4096),
        ],
    })
    .unwrap();
    let decisions = match rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap() {
        Frame::Decisions { entries } => entries,
        other => panic!("expected Decisions, got {other:?}"),
    };
    let by_id = |id: u64| {
        decisions
            .iter()
            .find(|d| d.file == FileId(id))
            .map(|d| d.decision.clone())
            .unwrap()
    };
    assert_eq!(by_id(1), Decision::Send);
    match by_id(2) {
        Decision::Fail { code, message } => {
            assert_eq!(code, ErrorCode::NO_SPACE);
            assert!(message.contains(&format!("in/{second}")), "{message}");
        }
        other => panic!("expected Fail, got {other:?}"),
    }
    // What is left after the first still takes a small file.
    assert_eq!(by_id(3), Decision::Send);
    // A later offer reads the free space afresh: the second file alone fits again.
    r.handle(offer(4, "b/again.bin", each)).unwrap();
    assert_eq!(decision(&rx), Decision::Send);
    r.abort();
}

#[test]
fn block_larger_than_the_session_block_size_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (r, rx) = receiver(dir.path());
    let size = (1u64 << 20) + 1;
    r.handle(offer(1, "big.bin", size)).unwrap();
    assert_eq!(decision(&rx), Decision::Send);
    let data = Bytes::from(vec![7u8; size as usize]);
    let block = Block {
        file: FileMeta {
            id: FileId(1),
            path: "big.bin".into(),
            size,
            mode: 0o644,
            mtime_ns: 0,
        },
        offset: 0,
        digest: block_digest(&data),
        file_digest: None,
        early: false,
        data,
    };
    let err = r.handle(Frame::Block(block)).unwrap_err();
    assert!(matches!(err, RecvError::BlockTooLarge { len, max: 1048576, .. } if len == size));
    r.abort();
}

fn block(size: u64, data: &Bytes, offset: u64, len: usize, file_digest: Option<Vec<u8>>) -> Frame {
    let data = data.slice(offset as usize..offset as usize + len);
    Frame::Block(Block {
        file: FileMeta {
            id: FileId(1),
            path: "f.bin".into(),
            size,
            mode: 0o644,
            mtime_ns: 0,
        },
        offset,
        digest: block_digest(&data),
        file_digest: file_digest.map(Bytes::from),
        early: false,
        data,
    })
}

/// After a resume the sender sends the last block again (it carries the file digest) even
/// when the receiver has it. When that block is the last to arrive, it is what completes the
/// file: a receiver that dropped it as a duplicate waited forever (the session then ended
/// on the idle timeout).
#[test]
fn a_resumed_file_completes_on_its_repeated_last_block() {
    let dir = tempfile::tempdir().unwrap();
    let size = (1u64 << 20) + 1000;
    let data = Bytes::from((0..size).map(|i| (i * 7 % 251) as u8).collect::<Vec<_>>());
    let mut h = FileHasher::new(ChecksumAlgo::Blake3);
    h.update(&data);
    let whole = h.finalize();
    let tail = (size - (1 << 20)) as usize;

    // First session: only the last block arrives, then the session breaks off.
    let (r, rx) = receiver(dir.path());
    r.handle(offer(1, "f.bin", size)).unwrap();
    assert_eq!(decision(&rx), Decision::Send);
    r.handle(block(size, &data, 1 << 20, tail, Some(whole.clone())))
        .unwrap();
    r.abort();
    drop(r);

    // Second session: the receiver has the tail; the missing block comes, then the tail again.
    let (r, rx) = receiver(dir.path());
    r.handle(offer(1, "f.bin", size)).unwrap();
    assert_eq!(
        decision(&rx),
        Decision::Resume {
            have: vec![(1 << 20, size)]
        }
    );
    r.expect(1, 0, 0);
    r.handle(block(size, &data, 0, 1 << 20, None)).unwrap();
    r.handle(block(size, &data, 1 << 20, tail, Some(whole)))
        .unwrap();
    r.done()
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("the file completes");
    let summary = r.finish();
    assert_eq!((summary.files, summary.failed), (1, 0), "{summary:?}");
    assert_eq!(std::fs::read(dir.path().join("in/f.bin")).unwrap(), data);
}

fn early(frame: Frame) -> Frame {
    match frame {
        Frame::Block(b) => Frame::Block(Block { early: true, ..b }),
        other => other,
    }
}

#[test]
fn early_blocks_count_only_for_a_file_being_received() {
    let dir = tempfile::tempdir().unwrap();
    let size = 3000u64;
    let (data, whole) = contents(size, 7);

    // A file decided `Send`: its early blocks are its data.
    let r = sending(receiver(dir.path()), size);
    r.handle(early(block(size, &data, 0, 1000, None))).unwrap();
    r.handle(early(block(size, &data, 1000, 2000, Some(whole.clone()))))
        .unwrap();
    r.done()
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("the file completes from early blocks");
    let summary = r.finish();
    assert_eq!((summary.files, summary.failed), (1, 0), "{summary:?}");
    let path = dir.path().join("in/f.bin");
    assert_eq!(std::fs::read(&path).unwrap(), data);

    // The same size and mtime in place: the decision is `Complete`, and early blocks (a
    // damaged one too) are dropped without a word, where a block sent after the decision
    // would be taken as different content and refused under the `Fail` policy.
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(std::time::UNIX_EPOCH)
        .unwrap();
    let (r, rx) = receiver(dir.path());
    r.handle(offer(1, "f.bin", size)).unwrap();
    assert!(matches!(decision(&rx), Decision::Complete { .. }));
    r.expect(1, 0, 0);
    let mut damaged = early(block(size, &data, 0, 1000, None));
    if let Frame::Block(b) = &mut damaged {
        b.digest ^= 1;
    }
    r.handle(damaged).unwrap();
    r.handle(early(block(size, &data, 1000, 2000, Some(whole))))
        .unwrap();
    assert!(
        rx.try_recv().is_err(),
        "no Resend, no failure for early blocks"
    );
    assert_eq!(r.bad_blocks(), 0);
    r.handle(Frame::Skipped { file: FileId(1) }).unwrap();
    r.done()
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("the file resolves as skipped");
    let summary = r.finish();
    assert_eq!((summary.skipped, summary.failed), (1, 0), "{summary:?}");
    assert!(r.errors().is_empty(), "{:?}", r.errors());
}

/// A file of one block is created by the block, not with its decision: answering an offer
/// of many small files then costs no create each on the control path. A destination that
/// refuses the create fails that file, saying which, and not the session.
#[test]
fn a_one_block_file_is_created_by_its_block() {
    let dir = tempfile::tempdir().unwrap();
    let size = 3000u64;
    let (data, whole) = contents(size, 7);
    let (r, rx) = receiver(dir.path());
    r.handle(offer(1, "f.bin", size)).unwrap();
    assert_eq!(decision(&rx), Decision::Send);
    r.handle(offer(2, "sub/g.bin", size)).unwrap();
    assert_eq!(decision(&rx), Decision::Send);
    r.expect(2, 0, 0);
    let names = |p: &str| -> Vec<String> {
        std::fs::read_dir(dir.path().join(p))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect()
    };
    assert_eq!(names("in"), ["sub"], "no temporary file before a block");
    assert!(names("in/sub").is_empty());

    std::fs::remove_dir(dir.path().join("in/sub")).unwrap();
    let mut second = block(size, &data, 0, size as usize, Some(whole.clone()));
    if let Frame::Block(b) = &mut second {
        b.file.id = FileId(2);
        b.file.path = "sub/g.bin".into();
    }
    r.handle(second).unwrap();
    match rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap() {
        Frame::FileFailed { file, message, .. } => {
            assert_eq!(file, FileId(2));
            assert!(message.contains("sub/g.bin"), "{message}");
        }
        other => panic!("expected FileFailed, got {other:?}"),
    }
    r.handle(block(size, &data, 0, size as usize, Some(whole)))
        .unwrap();
    r.done()
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("both files resolve");
    let summary = r.finish();
    assert_eq!((summary.files, summary.failed), (1, 1), "{summary:?}");
    assert_eq!(std::fs::read(dir.path().join("in/f.bin")).unwrap(), data);
    assert_eq!(names("in"), ["f.bin"], "nothing else left behind");
}

#[test]
fn gaps_and_free_parts() {
    let mut r = Ranges::default();
    r.insert(10, 20);
    r.insert(30, 40);
    assert_eq!(r.gaps(0, 50), [(0, 10), (20, 30), (40, 50)]);
    assert_eq!(r.gaps(15, 35), [(20, 30)]);
    assert_eq!(r.gaps(12, 18), []);
    assert_eq!(r.gaps(40, 45), [(40, 45)]);
    assert_eq!(
        free_parts(&r, &[(0, 5), (22, 25)], 0, 50),
        [(5, 10), (20, 22), (25, 30), (40, 50)]
    );
    assert_eq!(free_parts(&r, &[(0, 50)], 0, 50), []);
}

/// Two blocks that overlap with different bytes there: the stored file is the bytes that
/// were digested, never a mix the digest did not see. Bytes 0..n/3*2 come as `A`, then
/// n/3..n as `B`: the receiver keeps the first writer's bytes, so only a digest of
/// A × 2n/3 + B × n/3 verifies, and the file on disk is exactly that.
#[test]
fn overlapping_blocks_store_the_verified_bytes() {
    // In-order digests (small files) and tree digests (larger ones).
    for size in [6144u64, 300_000] {
        let (a_end, b_start) = (size / 3 * 2, size / 3);
        let frame = |offset: u64, end: u64, byte: u8, digest: Option<Vec<u8>>| {
            let data = Bytes::from(vec![byte; (end - offset) as usize]);
            Frame::Block(Block {
                file: FileMeta {
                    id: FileId(1),
                    path: "f.bin".into(),
                    size,
                    mode: 0o644,
                    mtime_ns: 0,
                },
                offset,
                digest: block_digest(&data),
                file_digest: digest.map(Bytes::from),
                early: false,
                data,
            })
        };
        let mut verified = vec![b'A'; a_end as usize];
        verified.resize(size as usize, b'B');
        let mut mixed = vec![b'A'; b_start as usize];
        mixed.resize(size as usize, b'B');
        for (claimed, completes) in [(&verified, true), (&mixed, false)] {
            let dir = tempfile::tempdir().unwrap();
            let (r, rx) = receiver(dir.path());
            r.handle(offer(1, "f.bin", size)).unwrap();
            assert_eq!(decision(&rx), Decision::Send);
            r.expect(1, 0, 0);
            r.handle(frame(0, a_end, b'A', None)).unwrap();
            let digest = blake3::hash(claimed).as_bytes().to_vec();
            r.handle(frame(b_start, size, b'B', Some(digest))).unwrap();
            let is_failure = |f: Frame| matches!(f, Frame::FileFailed { .. });
            if completes {
                r.done()
                    .recv_timeout(std::time::Duration::from_secs(5))
                    .expect("the file resolves");
                r.finish();
                assert!(!rx.try_iter().any(is_failure), "size {size}");
                let stored = std::fs::read(dir.path().join("in/f.bin")).ok();
                assert_eq!(stored.as_deref(), Some(&verified[..]), "size {size}");
            } else {
                let failed = rx
                    .recv_timeout(std::time::Duration::from_secs(5))
                    .is_ok_and(is_failure);
                let stored = std::fs::read(dir.path().join("in/f.bin")).ok();
                assert!(
                    failed,
                    "size {size}: a digest of bytes not stored must fail"
                );
                assert_eq!(stored, None, "size {size}: nothing under the final name");
            }
        }
    }
}

/// `size` bytes of a pattern (`i * step % 251`), and their BLAKE3 file digest.
fn contents(size: u64, step: u64) -> (Bytes, Vec<u8>) {
    let data = Bytes::from(
        (0..size)
            .map(|i| (i * step % 251) as u8)
            .collect::<Vec<_>>(),
    );
    let mut h = FileHasher::new(ChecksumAlgo::Blake3);
    h.update(&data);
    (data, h.finalize())
}

/// The receiver with file 1, `f.bin` of `size` bytes, offered and answered `Send`, and
/// told that it is the only entry.
fn sending((r, rx): (Arc<Receiver>, flume::Receiver<Frame>), size: u64) -> Arc<Receiver> {
    r.handle(offer(1, "f.bin", size)).unwrap();
    assert_eq!(decision(&rx), Decision::Send);
    r.expect(1, 0, 0);
    r
}

/// The file completes, is verified and stored once, with `data` in it.
fn stored_once(r: &Arc<Receiver>, dir: &std::path::Path, data: &[u8], round: u32) {
    r.done()
        .recv_timeout(std::time::Duration::from_secs(5))
        .unwrap_or_else(|_| panic!("round {round}: the file completes"));
    assert_eq!(r.files_open(), 0);
    let summary = r.finish();
    assert_eq!(
        (summary.files, summary.failed, summary.bad_blocks),
        (1, 0, 0),
        "round {round}: {summary:?}"
    );
    assert_eq!(std::fs::read(dir.join("in/f.bin")).unwrap(), data);
}

/// Fisher-Yates with a fixed xorshift: every round its own order, every run the same.
fn shuffle<T>(v: &mut [T], seed: &mut u64) {
    for i in (1..v.len()).rev() {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        v.swap(i, (*seed % (i as u64 + 1)) as usize);
    }
}

/// Hands `frames` to the receiver from `threads` threads at once, in order of the list.
fn feed(r: &Arc<Receiver>, frames: Vec<Frame>, threads: usize) {
    let queue = Arc::new(Mutex::new(frames.into_iter()));
    std::thread::scope(|s| {
        for _ in 0..threads {
            let (r, queue) = (r.clone(), queue.clone());
            s.spawn(move || loop {
                let next = lock(&queue).next();
                let Some(frame) = next else { break };
                r.handle(frame).unwrap();
            });
        }
    });
}

/// Data written ahead of the in-order digest is read back outside the file's lock by
/// whichever writer holds the hasher, while others write (`advance`). Blocks of one file
/// handed to four threads at once, in a different shuffled order each round, must still
/// give the sender's digest: a block written while another thread read back must be picked
/// up by that thread, and the file verified exactly once.
#[test]
fn blocks_of_one_file_written_by_many_threads_in_any_order_verify() {
    const BLOCK: usize = 64 << 10;
    let size = (BLOCK * 48 + 777) as u64;
    let (data, whole) = contents(size, 13);
    let offsets: Vec<u64> = (0..size).step_by(BLOCK).collect();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..12 {
        let dir = tempfile::tempdir().unwrap();
        let r = sending(receiver(dir.path()), size);
        assert_eq!(r.files_open(), 1);
        let mut order = offsets.clone();
        shuffle(&mut order, &mut seed);
        let frames: Vec<Frame> = order
            .iter()
            .map(|&o| {
                let len = (size - o).min(BLOCK as u64) as usize;
                let last = o + len as u64 == size;
                block(size, &data, o, len, last.then(|| whole.clone()))
            })
            .collect();
        feed(&r, frames, 4);
        stored_once(&r, dir.path(), &data, round);
    }
}

/// Blocks cut off BLAKE3's 1 KiB chunk edges (a block size that is no multiple of it), in
/// any order, one of them twice: the tree digest reads back the chunks they split and
/// matches, and the in-order digests of the other algorithms do too.
#[test]
fn blocks_cut_off_chunk_edges_verify_for_every_digest() {
    const BLOCK: u64 = 100_003;
    let size = BLOCK * 30 + 4_321;
    let data = Bytes::from((0..size).map(|i| (i * 13 % 251) as u8).collect::<Vec<_>>());
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for (round, algo) in [
        ChecksumAlgo::Blake3,
        ChecksumAlgo::Sha256,
        ChecksumAlgo::Xxh3,
        ChecksumAlgo::Blake3,
    ]
    .into_iter()
    .enumerate()
    {
        let mut h = FileHasher::new(algo);
        h.update(&data);
        let whole = h.finalize();
        let dir = tempfile::tempdir().unwrap();
        let r = sending(
            receiver_algo(dir.path(), Arc::new(crate::NoReporter), algo),
            size,
        );
        let mut offsets: Vec<u64> = (0..size).step_by(BLOCK as usize).collect();
        offsets.push(BLOCK * 7); // a copy, as the endgame sends
        shuffle(&mut offsets, &mut seed);
        let frames: Vec<Frame> = offsets
            .iter()
            .map(|&o| {
                let len = (size - o).min(BLOCK) as usize;
                let last = o + len as u64 == size;
                block(size, &data, o, len, last.then(|| whole.clone()))
            })
            .collect();
        feed(&r, frames, 4);
        stored_once(&r, dir.path(), &data, round as u32);
    }
}

/// A file whose blocks all pass their own digests but whose whole differs from the
/// sender's digest is not stored, in tree mode as in order.
#[test]
fn a_tree_digest_that_differs_from_the_senders_fails_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let size = (1u64 << 20) - 1;
    let data = Bytes::from((0..size).map(|i| (i * 3 % 251) as u8).collect::<Vec<_>>());
    let (r, rx) = receiver(dir.path());
    let r = sending((r, rx.clone()), size);
    let offsets: Vec<u64> = (0..size).step_by(256 << 10).collect();
    let frames = offsets
        .into_iter()
        .map(|o| {
            let len = (size - o).min(256 << 10) as usize;
            let last = o + len as u64 == size;
            block(size, &data, o, len, last.then(|| vec![0u8; 32]))
        })
        .rev()
        .collect();
    feed(&r, frames, 2);
    r.done()
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("the file is resolved");
    let summary = r.finish();
    assert_eq!((summary.files, summary.failed), (0, 1), "{summary:?}");
    assert!(!dir.path().join("in/f.bin").exists());
    let told = rx
        .try_iter()
        .any(|f| matches!(f, Frame::FileFailed { code, .. } if code == ErrorCode::CORRUPT));
    assert!(told, "the sender is told why");
}

/// Counts what the receiver reports as written.
#[derive(Default)]
struct Written(std::sync::atomic::AtomicU64);

impl Reporter for Written {
    fn on_bytes(&self, n: u64) {
        self.0.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The sender's endgame sends a slow connection's blocks again on idle ones, cut in
/// pieces, so a block's bytes may arrive twice, on two writer threads at once. Every block
/// of a file handed over whole and in pieces, by three threads in a shuffled order: the
/// file verifies once, holds the sender's bytes, and its bytes are reported written once.
#[test]
fn every_block_arriving_twice_is_stored_and_counted_once() {
    const BLOCK: usize = 64 << 10;
    let size = (BLOCK * 24 + 99) as u64;
    let (data, whole) = contents(size, 31);
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for round in 0..8 {
        let dir = tempfile::tempdir().unwrap();
        let written = Arc::new(Written::default());
        let r = sending(receiver_with(dir.path(), written.clone()), size);
        // (offset, len) of every block twice over: whole, and cut in pieces of 16 KiB
        // as the endgame cuts a copy for several idle connections.
        let mut order: Vec<(u64, u64)> = (0..size)
            .step_by(BLOCK)
            .flat_map(|o| {
                let len = (size - o).min(BLOCK as u64);
                let pieces = (o..o + len)
                    .step_by(16 << 10)
                    .map(move |p| (p, (o + len - p).min(16 << 10)));
                std::iter::once((o, len)).chain(pieces)
            })
            .collect();
        shuffle(&mut order, &mut seed);
        let frames: Vec<Frame> = order
            .iter()
            .map(|&(o, len)| {
                let last = o + len == size;
                block(size, &data, o, len as usize, last.then(|| whole.clone()))
            })
            .collect();
        feed(&r, frames, 3);
        stored_once(&r, dir.path(), &data, round);
        assert_eq!(
            written.0.load(std::sync::atomic::Ordering::Relaxed),
            size,
            "round {round}"
        );
    }
}

/// A striped put: a stripe host writes the middle block into the partial copy the receiver
/// (the coordinator) opened; its `Landed` is read back and counted, a lying one is asked for
/// again, and the file completes with the coordinator's own blocks.
#[test]
fn a_block_a_stripe_host_landed_completes_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let mb = 1u64 << 20;
    let size = 2 * mb + 1000;
    let data = Bytes::from((0..size).map(|i| (i * 7 % 251) as u8).collect::<Vec<_>>());
    let mut h = FileHasher::new(ChecksumAlgo::Blake3);
    h.update(&data);
    let whole = h.finalize();
    let (r, rx) = receiver(dir.path());
    let stripe = StripeWriter::new(
        Destination {
            root: Root::open(dir.path()).unwrap(),
            base: "in".into(),
            rename_top: None,
        },
        1 << 20,
        ChecksumAlgo::Blake3,
    );
    let Frame::Block(middle) = block(size, &data, mb, mb as usize, None) else {
        unreachable!()
    };
    // Before the coordinator opened the partial copy there is nothing to write into.
    assert!(stripe.write(&middle).unwrap_err().is_refusal());
    r.handle(offer(1, "f.bin", size)).unwrap();
    assert_eq!(decision(&rx), Decision::Send);
    r.expect(1, 0, 0);
    stripe.write(&middle).unwrap();
    // Early blocks stay with the coordinator: until the decision it may still truncate.
    let Frame::Block(first) = early(block(size, &data, 0, mb as usize, None)) else {
        unreachable!()
    };
    assert!(matches!(
        stripe.write(&first),
        Err(StripeError::NotStriped { .. })
    ));
    // A landing whose bytes are not the ones claimed is asked for again.
    r.handle(Frame::Landed {
        file: FileId(1),
        offset: mb,
        len: mb as u32,
        digest: middle.digest ^ 1,
        cvs: Vec::new(),
    })
    .unwrap();
    assert!(matches!(rx.try_recv(), Ok(Frame::Resend { offset, .. }) if offset == mb));
    r.handle(Frame::Landed {
        file: FileId(1),
        offset: mb,
        len: mb as u32,
        digest: middle.digest,
        cvs: Vec::new(),
    })
    .unwrap();
    r.handle(block(size, &data, 0, mb as usize, None)).unwrap();
    r.handle(block(size, &data, 2 * mb, 1000, Some(whole)))
        .unwrap();
    r.done()
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("the file completes");
    let summary = r.finish();
    assert_eq!((summary.files, summary.failed), (1, 0), "{summary:?}");
    assert_eq!(std::fs::read(dir.path().join("in/f.bin")).unwrap(), data);
}

/// The block of file `id` named `path` (see [`block`]).
fn block_of(id: u64, path: &str, size: u64, data: &Bytes, offset: u64, len: usize) -> Block {
    let last = offset + len as u64 == size;
    let whole = last.then(|| {
        let mut h = FileHasher::new(ChecksumAlgo::Blake3);
        h.update(data);
        h.finalize()
    });
    let Frame::Block(mut b) = block(size, data, offset, len, whole) else {
        unreachable!()
    };
    b.file.id = FileId(id);
    b.file.path = path.into();
    b
}

/// A striped put whose coordinator shares partial copies (`STRIPE_WHOLE`): a stripe host
/// writes a one-block file of 200 KiB and the last block of a file of three, their chaining
/// values merged, no read-back; the client hands the file digests over apart (`FileDigest`).
/// A file of 64 KiB or less keeps its own copy, which no host can open, and comes whole from
/// the client. Every file is stored with no partial copy or journal left. A coordinator that
/// does not share them answers a one-block file's `Landed` with `Resend`: its copy is not
/// the one the host could have written.
#[test]
fn a_stripe_host_lands_one_block_files_and_last_blocks_when_partials_are_shared() {
    let mb = 1u64 << 20;
    let dir = tempfile::tempdir().unwrap();
    let count = Arc::new(LandedCount::default());
    let (r, rx) = receiver_algo(dir.path(), count.clone(), ChecksumAlgo::Blake3);
    r.share_partials();
    let stripe = StripeWriter::new(
        Destination {
            root: Root::open(dir.path()).unwrap(),
            base: "in".into(),
            rename_top: None,
        },
        1 << 20,
        ChecksumAlgo::Blake3,
    );
    let files = [
        (1, "small.bin", WHOLE_MIN_SIZE),
        (2, "mid.bin", 200 << 10),
        (3, "big.bin", 2 * mb + 1000),
    ];
    let contents: Vec<Bytes> = files
        .iter()
        .map(|&(id, _, size)| (0..size).map(|i| (i * id + i / 7) as u8).collect())
        .collect();
    for &(id, path, size) in &files {
        r.handle(offer(id, path, size)).unwrap();
        assert_eq!(decision(&rx), Decision::Send, "{path}");
    }
    r.expect(3, 0, 0);
    let lasts: Vec<Block> = files
        .iter()
        .zip(&contents)
        .map(|(&(id, path, size), data)| {
            let last = (size - 1) / mb * mb;
            block_of(id, path, size, data, last, (size - last) as usize)
        })
        .collect();
    assert!(stripe.write(&lasts[0]).unwrap_err().is_refusal());
    r.handle(Frame::Block(lasts[0].clone())).unwrap();
    for b in &lasts[1..] {
        let cvs = stripe.write(b).unwrap();
        let digest = b.file_digest.clone().expect("a last block");
        r.handle(Frame::FileDigest {
            file: b.file.id,
            digest,
        })
        .unwrap();
        r.handle(Frame::Landed {
            file: b.file.id,
            offset: b.offset,
            len: b.data.len() as u32,
            digest: b.digest,
            cvs,
        })
        .unwrap();
    }
    for offset in [0, mb] {
        let b = block_of(3, "big.bin", files[2].2, &contents[2], offset, mb as usize);
        r.handle(Frame::Block(b)).unwrap();
    }
    r.done()
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("every file resolves");
    let summary = r.finish();
    assert_eq!((summary.files, summary.failed), (3, 0), "{summary:?}");
    let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!((load(&count.merged), load(&count.read_back)), (2, 0));
    for (&(_, path, _), data) in files.iter().zip(&contents) {
        let stored = std::fs::read(dir.path().join("in").join(path)).unwrap();
        assert_eq!(stored, &data[..], "{path}");
    }
    let mut left: Vec<String> = std::fs::read_dir(dir.path().join("in"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, ["big.bin", "mid.bin", "small.bin"]);

    // Not shared: the one-block file's copy is this session's own.
    let dir = tempfile::tempdir().unwrap();
    let (r, rx) = receiver(dir.path());
    r.handle(offer(2, "mid.bin", 200 << 10)).unwrap();
    assert_eq!(decision(&rx), Decision::Send);
    r.handle(Frame::Landed {
        file: FileId(2),
        offset: 0,
        len: 200 << 10,
        digest: lasts[1].digest,
        cvs: Vec::new(),
    })
    .unwrap();
    let resend = rx.try_recv();
    assert!(
        matches!(resend, Ok(Frame::Resend { offset: 0, .. })),
        "{resend:?}"
    );
}

/// Counts landed blocks by how the coordinator took them in.
#[derive(Default)]
struct LandedCount {
    merged: std::sync::atomic::AtomicU64,
    read_back: std::sync::atomic::AtomicU64,
}

impl Reporter for LandedCount {
    fn on_landed(&self, merged: bool) {
        let c = if merged {
            &self.merged
        } else {
            &self.read_back
        };
        c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// With BLAKE3, the chaining values a stripe host reports are merged into the file's tree
/// with no read-back, and the file is stored; a host that reports wrong ones (for bytes it
/// wrote right) makes the file fail its verification: nothing is committed, and the sender
/// is told `corrupt`. With another digest the block is read back.
#[test]
fn a_stripe_hosts_chaining_values_are_merged_and_wrong_ones_fail_the_file() {
    let mb = 1u64 << 20;
    let size = 3 * mb + 1000;
    let data = Bytes::from((0..size).map(|i| (i * 13 % 251) as u8).collect::<Vec<_>>());
    for (algo, lie) in [
        (ChecksumAlgo::Blake3, false),
        (ChecksumAlgo::Blake3, true),
        (ChecksumAlgo::Sha256, false),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut h = FileHasher::new(algo);
        h.update(&data);
        let whole = h.finalize();
        let count = Arc::new(LandedCount::default());
        let (r, rx) = receiver_algo(dir.path(), count.clone(), algo);
        let stripe = StripeWriter::new(
            Destination {
                root: Root::open(dir.path()).unwrap(),
                base: "in".into(),
                rename_top: None,
            },
            1 << 20,
            algo,
        );
        r.handle(offer(1, "f.bin", size)).unwrap();
        assert_eq!(decision(&rx), Decision::Send);
        r.expect(1, 0, 0);
        for offset in [mb, 2 * mb] {
            let Frame::Block(b) = block(size, &data, offset, mb as usize, None) else {
                unreachable!()
            };
            let mut cvs = stripe.write(&b).unwrap();
            assert_eq!(cvs.is_empty(), algo != ChecksumAlgo::Blake3, "{algo:?}");
            if lie && offset == 2 * mb {
                cvs[0][31] ^= 1;
            }
            r.handle(Frame::Landed {
                file: FileId(1),
                offset,
                len: mb as u32,
                digest: b.digest,
                cvs,
            })
            .unwrap();
        }
        r.handle(block(size, &data, 0, mb as usize, None)).unwrap();
        r.handle(block(size, &data, 3 * mb, 1000, Some(whole)))
            .unwrap();
        r.done()
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("the file is resolved");
        let summary = r.finish();
        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        let merged = algo == ChecksumAlgo::Blake3;
        assert_eq!(
            (load(&count.merged), load(&count.read_back)),
            if merged { (2, 0) } else { (0, 2) },
            "{algo:?}"
        );
        let stored = dir.path().join("in/f.bin");
        if lie {
            assert_eq!((summary.files, summary.failed), (0, 1), "{summary:?}");
            assert!(!stored.exists());
            let told = rx
                .try_iter()
                .any(|f| matches!(f, Frame::FileFailed { code, .. } if code == ErrorCode::CORRUPT));
            assert!(told, "the sender is told why");
        } else {
            assert_eq!(
                (summary.files, summary.failed),
                (1, 0),
                "{algo:?} {summary:?}"
            );
            assert_eq!(std::fs::read(&stored).unwrap(), data);
        }
    }
}

/// Records what a receiver tells of its commits; fails `before_sync` when told to.
#[derive(Default)]
struct Hook {
    fail: bool,
    seen: Mutex<Vec<(&'static str, Vec<Stored>, bool)>>,
    dir: std::path::PathBuf,
}

impl CommitHook for Hook {
    fn before_sync(&self, files: &[Stored], _syncfs: Option<u64>) -> std::io::Result<()> {
        let there = self.dir.join("in/f.bin").exists();
        lock(&self.seen).push(("before", files.to_vec(), there));
        if self.fail {
            return Err(std::io::Error::other("catalog is down"));
        }
        Ok(())
    }

    fn after_rename(&self, files: &[Stored]) {
        let there = self.dir.join("in/f.bin").exists();
        lock(&self.seen).push(("after", files.to_vec(), there));
    }
}

#[test]
fn the_commit_hook_hears_of_a_file_before_and_after_its_rename() {
    let dir = tempfile::tempdir().unwrap();
    let size = 3000u64;
    let (data, whole) = contents(size, 11);
    let hook = Arc::new(Hook {
        dir: dir.path().to_owned(),
        ..Hook::default()
    });
    let pair = receiver(dir.path());
    pair.0.set_commit_hook(hook.clone());
    let r = sending(pair, size);
    r.handle(block(size, &data, 0, size as usize, Some(whole.clone())))
        .unwrap();
    stored_once(&r, dir.path(), &data, 0);
    let want = Stored {
        path: "in/f.bin".into(),
        size,
        mtime_ns: 0,
        digest: whole,
        algo: ChecksumAlgo::Blake3,
    };
    let seen = lock(&hook.seen).clone();
    assert_eq!(
        seen,
        [
            ("before", vec![want.clone()], false),
            ("after", vec![want], true)
        ]
    );
}

#[test]
fn a_commit_hook_that_cannot_record_fails_the_file_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let size = 3000u64;
    let (data, whole) = contents(size, 13);
    let hook = Arc::new(Hook {
        fail: true,
        dir: dir.path().to_owned(),
        ..Hook::default()
    });
    let (r, rx) = receiver(dir.path());
    r.set_commit_hook(hook.clone());
    let r = sending((r, rx.clone()), size);
    r.handle(block(size, &data, 0, size as usize, Some(whole)))
        .unwrap();
    match rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap() {
        Frame::FileFailed { message, .. } => {
            assert!(message.contains("catalog is down"), "{message}");
        }
        other => panic!("expected FileFailed, got {other:?}"),
    }
    r.done()
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("the file resolves");
    let summary = r.finish();
    assert_eq!((summary.files, summary.failed), (0, 1), "{summary:?}");
    assert!(!dir.path().join("in/f.bin").exists());
    assert_eq!(
        lock(&hook.seen).len(),
        1,
        "no after_rename for a failed batch"
    );
}

/// Sees what the destination directory holds when a batch is about to be synced, and may put a
/// file under the final name first (another writer that got there meanwhile).
#[derive(Default)]
struct Peek {
    dir: std::path::PathBuf,
    squat: bool,
    seen: Mutex<Vec<String>>,
}

impl CommitHook for Peek {
    fn before_sync(&self, _files: &[Stored], _syncfs: Option<u64>) -> std::io::Result<()> {
        let mut names: Vec<String> = std::fs::read_dir(self.dir.join("in"))?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<_>>()?;
        names.sort();
        *lock(&self.seen) = names;
        if self.squat {
            std::fs::write(self.dir.join("in/f.bin"), b"theirs")?;
        }
        Ok(())
    }

    fn after_rename(&self, _files: &[Stored]) {}
}

/// Whether the file system under `dir` makes unnamed files (`O_TMPFILE`); where it does not,
/// the receiver names them as before.
fn makes_unnamed(dir: &std::path::Path) -> bool {
    let fd: std::os::fd::OwnedFd = std::fs::File::open(dir).unwrap().into();
    crate::root::open_unnamed(&fd, 0o600).is_ok()
}

/// A file of one block is written unnamed where the file system allows it: complete,
/// verified and about to be made durable, it still has no entry in its directory, and it
/// appears under its final name only after the sync. Where it does not, it has its hidden
/// temporary name until then.
#[test]
fn a_one_block_file_has_no_name_until_it_is_placed() {
    let dir = tempfile::tempdir().unwrap();
    let size = 3000u64;
    let (data, whole) = contents(size, 17);
    let hook = Arc::new(Peek {
        dir: dir.path().to_owned(),
        ..Peek::default()
    });
    let pair = receiver(dir.path());
    pair.0.set_commit_hook(hook.clone());
    let r = sending(pair, size);
    r.handle(block(size, &data, 0, size as usize, Some(whole)))
        .unwrap();
    stored_once(&r, dir.path(), &data, 0);
    let seen = lock(&hook.seen).clone();
    if makes_unnamed(dir.path()) {
        assert!(seen.is_empty(), "no name before the sync: {seen:?}");
    } else {
        assert!(
            seen.len() == 1 && seen[0].starts_with(".ferry-") && seen[0].ends_with(".part"),
            "{seen:?}"
        );
    }
    let names: Vec<_> = std::fs::read_dir(dir.path().join("in"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["f.bin"], "nothing else left behind");
}

/// A name taken between the file's offer and its commit is kept: the one-block file fails,
/// saying so, and leaves nothing behind, whether it was to be linked or renamed into place.
#[test]
fn a_name_taken_before_the_commit_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let size = 3000u64;
    let (data, whole) = contents(size, 19);
    let hook = Arc::new(Peek {
        dir: dir.path().to_owned(),
        squat: true,
        ..Peek::default()
    });
    let (r, rx) = receiver(dir.path());
    r.set_commit_hook(hook);
    let r = sending((r, rx.clone()), size);
    r.handle(block(size, &data, 0, size as usize, Some(whole)))
        .unwrap();
    match rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap() {
        Frame::FileFailed { message, .. } => {
            assert!(message.contains("f.bin"), "{message}");
        }
        other => panic!("expected FileFailed, got {other:?}"),
    }
    r.done()
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("the file resolves");
    let summary = r.finish();
    assert_eq!((summary.files, summary.failed), (0, 1), "{summary:?}");
    assert_eq!(
        std::fs::read(dir.path().join("in/f.bin")).unwrap(),
        b"theirs"
    );
    let names: Vec<_> = std::fs::read_dir(dir.path().join("in"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["f.bin"], "nothing else left behind");
}

/// A one-block frame of `data` for file `id` at `path`, whole, with its file digest.
fn whole_block(id: u64, path: &str, mode: u32, mtime_ns: i64, data: &Bytes) -> Frame {
    let mut h = FileHasher::new(ChecksumAlgo::Blake3);
    h.update(data);
    Frame::Block(Block {
        file: FileMeta {
            id: FileId(id),
            path: path.into(),
            size: data.len() as u64,
            mode,
            mtime_ns,
        },
        offset: 0,
        digest: block_digest(data),
        file_digest: Some(Bytes::from(h.finalize())),
        early: false,
        data: data.clone(),
    })
}

/// In a directory the session made, an offer is answered without looking for the file there
/// (it was empty when made). A file another process put there since is still never replaced:
/// the commit refuses the name, the file fails and theirs stays, nothing of ours left beside
/// it. In a directory that was there before, the lookup still answers first.
#[test]
fn a_file_in_a_directory_the_session_made_never_replaces_one_put_there_since() {
    let dir = tempfile::tempdir().unwrap();
    let (data, _) = contents(3000, 23);
    let (r, rx) = receiver(dir.path());
    // `in` was there before the offers (the receiver makes its base when it starts).
    std::fs::write(dir.path().join("in/old.bin"), b"old").unwrap();
    r.handle(offer(1, "old.bin", 3000)).unwrap();
    match decision(&rx) {
        Decision::Fail { code, .. } => assert_eq!(code, ErrorCode::EXISTS),
        other => panic!("expected Fail, got {other:?}"),
    }
    r.handle(Frame::Dir {
        path: "sub".into(),
        mode: 0o755,
        mtime_ns: 0,
    })
    .unwrap();
    std::fs::write(dir.path().join("in/sub/g.bin"), b"theirs").unwrap();
    let mut o = offer(2, "sub/g.bin", 3000);
    if let Frame::Offer { entries } = &mut o {
        entries[0].mode = 0o644;
    }
    r.handle(o).unwrap();
    assert_eq!(
        decision(&rx),
        Decision::Send,
        "not looked for in a directory made here"
    );
    r.expect(2, 1, 0);
    r.handle(whole_block(2, "sub/g.bin", 0o644, 0, &data))
        .unwrap();
    match rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap() {
        Frame::FileFailed { file, message, .. } => {
            assert_eq!(file, FileId(2));
            assert!(message.contains("sub/g.bin"), "{message}");
        }
        other => panic!("expected FileFailed, got {other:?}"),
    }
    r.done()
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("every entry resolves");
    let summary = r.finish();
    assert_eq!((summary.files, summary.failed), (0, 2), "{summary:?}");
    assert_eq!(
        std::fs::read(dir.path().join("in/sub/g.bin")).unwrap(),
        b"theirs"
    );
    let names: Vec<_> = std::fs::read_dir(dir.path().join("in/sub"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["g.bin"], "nothing else left behind");
}

/// Each stored file has the sender's mode (the policy applied) and mtime, whether or not it
/// was created with its permission bits (an unnamed one is, and the umask may take some of
/// them, which the receiver must then put back) and whatever the bits ask.
#[test]
fn one_block_files_get_their_mode_and_mtime_whatever_the_umask_took() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let (data, _) = contents(3000, 29);
    let (r, rx) = receiver(dir.path());
    let files = [
        (1u64, "a.bin", 0o644u32, 1_600_000_000_123_456_789i64),
        (2, "b.bin", 0o666, 1_500_000_000_000_000_007),
        (3, "c.bin", 0o640, 7),
        (4, "d.bin", 0o4755, -1_000_000_001),
        (5, "e.bin", 0o000, 0),
    ];
    for &(id, path, mode, mtime_ns) in &files {
        r.handle(Frame::Offer {
            entries: vec![OfferEntry {
                file: FileId(id),
                path: path.into(),
                size: data.len() as u64,
                mode,
                mtime_ns,
            }],
        })
        .unwrap();
        assert_eq!(decision(&rx), Decision::Send);
    }
    r.expect(files.len() as u64, 0, 0);
    for &(id, path, mode, mtime_ns) in &files {
        r.handle(whole_block(id, path, mode, mtime_ns, &data))
            .unwrap();
    }
    r.done()
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("every file resolves");
    let summary = r.finish();
    assert_eq!((summary.files, summary.failed), (5, 0), "{summary:?}");
    for &(_, path, mode, mtime_ns) in &files {
        let m = std::fs::symlink_metadata(dir.path().join("in").join(path)).unwrap();
        let want = Modes::default().apply(mode);
        assert_eq!(m.permissions().mode() & 0o7777, want, "{path}: mode");
        let got = m.mtime() * 1_000_000_000 + m.mtime_nsec();
        assert_eq!(got, mtime_ns, "{path}: mtime");
    }
}
