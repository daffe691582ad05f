//! The receiver's writer pool (`Receiver::start`): frames in, files out; a frame that breaks
//! the protocol reported through `fatal`; parked writers leaving when the queue closes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_core::digest::{block_digest, FileHasher};
use ferry_core::gate::Gate;
use ferry_core::recv::{Destination, Links, Modes, Receiver, ReceiverConfig, RecvError};
use ferry_core::{NoReporter, Root};
use ferry_proto::{
    Block, ChecksumAlgo, Decision, ExistingPolicy, FileId, FileMeta, Frame, OfferEntry,
};

const WAIT: Duration = Duration::from_secs(5);

/// A receiver writing under `dir/in`, and the queue its control frames go to.
fn receiver(dir: &std::path::Path) -> (Arc<Receiver>, flume::Receiver<Frame>) {
    let dest = Destination {
        root: Root::open(dir).unwrap(),
        base: "in".into(),
        rename_top: None,
    };
    let config = ReceiverConfig {
        existing: ExistingPolicy::Fail,
        checksum: ChecksumAlgo::Blake3,
        tag: 9,
        block_size: 1 << 20,
        modes: Modes::default(),
        links: Links::default(),
    };
    let (tx, rx) = flume::unbounded();
    let r = Receiver::new(dest, config, tx, Arc::new(NoReporter)).unwrap();
    (r, rx)
}

fn meta(id: u64, size: u64) -> FileMeta {
    FileMeta {
        id: FileId(id),
        path: format!("f{id}.bin"),
        size,
        mode: 0o644,
        mtime_ns: 0,
    }
}

/// The blocks of file `id` holding `data`, cut every `block` bytes, the last with the file
/// digest.
fn blocks(id: u64, data: &Bytes, block: usize) -> Vec<Frame> {
    let mut h = FileHasher::new(ChecksumAlgo::Blake3);
    h.update(data);
    let whole = Bytes::from(h.finalize());
    let size = data.len();
    (0..size)
        .step_by(block)
        .map(|o| {
            let piece = data.slice(o..(o + block).min(size));
            let last = o + piece.len() == size;
            Frame::Block(Block {
                file: meta(id, size as u64),
                offset: o as u64,
                digest: block_digest(&piece),
                file_digest: last.then(|| whole.clone()),
                early: false,
                data: piece,
            })
        })
        .collect()
}

/// Waits (bounded) until `f` holds.
fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn frames_in_files_out() {
    let dir = tempfile::tempdir().unwrap();
    let (r, control) = receiver(dir.path());
    let answered = Arc::new(AtomicU64::new(0));
    let (tx, queue) = flume::bounded::<Frame>(4);
    let pool = {
        let answered = answered.clone();
        r.start(Arc::new(Gate::new(2, 4)), queue, move || {
            answered.fetch_add(1, Ordering::AcqRel);
        })
        .unwrap()
    };
    assert_eq!(pool.writers().max(), 4);
    let files: Vec<Bytes> = (0..3u64)
        .map(|id| {
            Bytes::from(
                (0..200_000 + id * 7)
                    .map(|i| (i % 251) as u8)
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    let entries = files
        .iter()
        .enumerate()
        .map(|(id, data)| {
            let m = meta(id as u64, data.len() as u64);
            OfferEntry {
                file: m.id,
                path: m.path,
                size: m.size,
                mode: m.mode,
                mtime_ns: m.mtime_ns,
            }
        })
        .collect();
    let deciding = pool.deciding();
    deciding.queued();
    tx.send(Frame::Offer { entries }).unwrap();
    match control.recv_timeout(WAIT).unwrap() {
        Frame::Decisions { entries } => {
            assert_eq!(entries.len(), 3);
            assert!(entries.iter().all(|d| d.decision == Decision::Send));
        }
        other => panic!("expected Decisions, got {other:?}"),
    }
    eventually("the offer is counted out", || deciding.pending() == 0);
    eventually("on_answered is called", || {
        answered.load(Ordering::Acquire) == 1
    });
    r.expect(3, 0, 0);
    for (id, data) in files.iter().enumerate() {
        for frame in blocks(id as u64, data, 64 << 10) {
            tx.send(frame).unwrap();
        }
    }
    r.done().recv_timeout(WAIT).expect("every file is stored");
    drop(tx);
    let total: u64 = files.iter().map(|d| d.len() as u64).sum();
    assert_eq!(pool.bytes_written(), total);
    assert!(pool.fatal().try_recv().is_err(), "nothing broke");
    pool.join();
    let summary = r.finish();
    assert_eq!((summary.files, summary.failed), (3, 0), "{summary:?}");
    for (id, data) in files.iter().enumerate() {
        let stored = std::fs::read(dir.path().join(format!("in/f{id}.bin"))).unwrap();
        assert_eq!(stored, data[..], "file {id}");
    }
}

#[test]
fn a_frame_that_breaks_the_protocol_is_reported_through_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let (r, _control) = receiver(dir.path());
    let (tx, queue) = flume::bounded::<Frame>(4);
    let pool = r.start(Arc::new(Gate::new(2, 2)), queue, || {}).unwrap();
    // Data for a file never offered: the session cannot go on.
    let data = Bytes::from(vec![1u8; 1000]);
    tx.send(blocks(5, &data, 1000).remove(0)).unwrap();
    match pool.fatal().recv_timeout(WAIT) {
        Ok(RecvError::Unoffered(id)) => assert_eq!(id, FileId(5)),
        other => panic!("expected Unoffered, got {other:?}"),
    }
    assert_eq!(pool.bytes_written(), 0, "a refused block is not counted");
    // The other writer still takes frames until the driver ends the session.
    tx.send(Frame::Dir {
        path: "d".into(),
        mode: 0o755,
        mtime_ns: 0,
    })
    .unwrap();
    eventually("the other writer makes the directory", || {
        dir.path().join("in/d").is_dir()
    });
    drop(tx);
    pool.join();
    r.abort();
}

#[test]
fn parked_writers_leave_when_the_queue_closes() {
    let dir = tempfile::tempdir().unwrap();
    let (r, _control) = receiver(dir.path());
    let (tx, queue) = flume::bounded::<Frame>(4);
    // One writer works, three are parked; each writer holds the receiver while it runs.
    let pool = r.start(Arc::new(Gate::new(1, 4)), queue, || {}).unwrap();
    assert!(Arc::strong_count(&r) > 1);
    drop(tx);
    // Without the gate being closed: the queue's end alone lets every writer go.
    eventually("every writer leaves", || Arc::strong_count(&r) == 1);
    let started = Instant::now();
    pool.join();
    assert!(started.elapsed() < WAIT);
}
