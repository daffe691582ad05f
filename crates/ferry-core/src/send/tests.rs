//! The sender's unit tests: block cutting, and reading what the walk saw.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ferry_proto::{FileId, FileMeta};

use super::cut::clip_to_ranges;
use super::reading::{open_checked, Unpassed};
use super::state::FileRecord;
use crate::root::OFlags;

const MIB: u64 = 1 << 20;

/// A FIFO where the walk saw a regular file (swapped in between): opening it must not
/// wait for a writer, and the error names what it is now. Before `O_NONBLOCK` the open
/// blocked until someone opened the FIFO for writing.
#[test]
fn a_fifo_swapped_in_after_the_walk_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("f");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let fd = rustix::fs::open(
        dir.path(),
        OFlags::RDONLY | OFlags::DIRECTORY,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    let record = FileRecord {
        dir: Arc::new(fd),
        name: "f".into(),
        base: 0,
        listed: (10, 0),
        meta: FileMeta {
            id: FileId(0),
            path: "t/f".into(),
            size: 10,
            mode: 0o644,
            mtime_ns: 0,
        },
        final_digest: Mutex::new(None),
        digest: Mutex::new(None),
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(open_checked(&record).map(|_| ()).map_err(|e| e.to_string()));
    });
    let got = rx.recv_timeout(std::time::Duration::from_secs(5));
    if got.is_err() {
        // Release the blocked open so the thread ends, then fail.
        let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
        panic!("opening a FIFO blocked the reader");
    }
    let err = got.unwrap().expect_err("a FIFO is not read");
    assert!(err.contains("t/f") && err.contains("FIFO"), "{err}");
}

#[test]
fn a_block_stops_at_the_edge_of_what_the_receiver_has() {
    let have = [(0, 3 * MIB), (5 * MIB, 6 * MIB)];
    // Inside a range: up to its end, then skipped whole as covered.
    assert_eq!(clip_to_ranges(&have, MIB, 8 * MIB), 2 * MIB);
    // In a gap: up to the next range's start.
    assert_eq!(clip_to_ranges(&have, 3 * MIB, 8 * MIB), 2 * MIB);
    // Past every edge, or no ranges at all: untouched.
    assert_eq!(clip_to_ranges(&have, 6 * MIB, 8 * MIB), 8 * MIB);
    assert_eq!(clip_to_ranges(&[], 0, 8 * MIB), 8 * MIB);
    // An edge exactly at either end of the block cuts nothing.
    assert_eq!(clip_to_ranges(&have, 3 * MIB, 2 * MIB), 2 * MIB);
}

#[test]
fn a_file_given_up_counts_as_passed() {
    let counter = AtomicU64::new(0);
    {
        let mut u = Unpassed {
            counter: &counter,
            left: 10 * MIB,
        };
        u.pass(MIB);
        assert_eq!(counter.load(Ordering::Relaxed), MIB);
    }
    assert_eq!(counter.load(Ordering::Relaxed), 10 * MIB);
}

/// A striped get's stripe host reads what the client names beneath its source, as the
/// coordinator's walk named it, and only while the file is the one offered.
#[test]
fn a_stripe_reader_reads_offered_ranges_beneath_its_source_only() {
    use super::{ReadError, Source, StripeReader, Wanted};
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::create_dir_all(dir.path().join("top/sub")).unwrap();
    std::fs::write(dir.path().join("top/sub/f"), &data).unwrap();
    std::fs::write(dir.path().join("other"), b"secret").unwrap();
    let st = crate::root::Root::open(dir.path())
        .unwrap()
        .lstat("top/sub/f")
        .unwrap();
    let source = Source {
        root: crate::root::Root::open(dir.path()).unwrap(),
        rel: "top".into(),
        name: "top".into(),
    };
    let reader = StripeReader::new(source, 128 << 10);
    let want = |path: &str, size: u64, offset: u64, len: u32| Wanted {
        file: FileId(3),
        path: path.into(),
        size,
        mtime_ns: st.mtime_ns,
        offset,
        len,
    };
    let block = reader
        .read(&want("top/sub/f", data.len() as u64, 100_000, 50_000))
        .unwrap();
    assert_eq!(&block.data[..], &data[100_000..150_000]);
    assert_eq!(
        block.digest,
        crate::digest::block_digest(&data[100_000..150_000])
    );
    assert_eq!((block.file.id, block.offset), (FileId(3), 100_000));
    assert!(!block.early && block.file_digest.is_none());
    // Not beneath the source's name, or climbing out of it: refused, not a refusal to hand
    // back.
    for path in ["other", "top/../other", "topsub/f", "/top/sub/f"] {
        let e = reader.read(&want(path, 6, 0, 6)).unwrap_err();
        assert!(matches!(e, ReadError::Outside { .. }), "{path}: {e}");
        assert!(!e.is_refusal());
    }
    // Another size than offered: handed back (the coordinator will fail the file).
    let e = reader.read(&want("top/sub/f", 10, 0, 5)).unwrap_err();
    assert!(
        matches!(e, ReadError::Changed { .. }) && e.is_refusal(),
        "{e}"
    );
    // More than the session's block size.
    let e = reader
        .read(&want("top/sub/f", data.len() as u64, 0, 200_000))
        .unwrap_err();
    assert!(matches!(e, ReadError::TooLarge { .. }), "{e}");
}
