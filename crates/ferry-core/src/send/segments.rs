//! One large file read by several readers at once.
//!
//! A file hashed with BLAKE3 is cut into aligned segments of a power-of-two size. Each
//! segment is read in order by one reader, which hashes it into its BLAKE3 subtrees
//! ([`RangeHasher`]) and queues its blocks; the subtrees merge in a [`Blake3Tree`] into
//! exactly `blake3::hash` of the file (what `b3sum` prints), whatever reader hashed what and in
//! what order. So one file's reading and hashing is spread over
//! several cores (the gain is for a many-core host: scripts/host-bench.sh, not yet run on one).
//!
//! The reader that took the file from the walk (its origin) reads the first segments alone
//! while the file is read early (before its decision) and then hands out the rest: it puts
//! tickets for the file where idle readers look first ([`SenderState::helpers`]). Each
//! reader takes the next segment until none is left. The file's last block carries the file
//! digest, so it is held back until every segment is hashed; the origin then queues it. Other
//! digests (SHA-256, MD5, XXH3) are not trees: those files are read in order by one reader.

use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ferry_proto::{ChecksumAlgo, Decision, ErrorCode};

use super::cut::covered;
use super::reading::{
    changed, early_decision, next_len, open_checked, queue_block, read_block, read_failed,
    BlockRead, Streamed, Unpassed,
};
use super::state::{FileRecord, SenderState};
use crate::digest::{block_digest, Blake3Tree, RangeHasher};
use crate::root::Meta;

/// Segments are at least this long: a few blocks each, so the hand-over costs little.
const MIN_SEGMENT: u64 = 16 << 20;

/// The segment size for a file of `size` bytes read in blocks of `block` bytes, if the file
/// is worth splitting: BLAKE3, and at least two segments.
pub(super) fn segment_size(algo: ChecksumAlgo, size: u64, block: u64) -> Option<u64> {
    let seg = (4 * block).max(MIN_SEGMENT).next_power_of_two();
    (algo == ChecksumAlgo::Blake3 && size > 2 * seg).then_some(seg)
}

/// A file being read in segments.
pub(super) struct Segments {
    record: Arc<FileRecord>,
    /// The file as the origin opened it: helpers check their own opening against it.
    before: Meta,
    seg: u64,
    count: u64,
    /// The next segment to hand out.
    next: AtomicU64,
    /// Segments read to their end, or given up; the origin waits for all of them.
    done: Mutex<u64>,
    all_done: Condvar,
    /// What the receiver already has (`Decision::Resume`); set before any helper comes.
    have: Mutex<Vec<(u64, u64)>>,
    tree: Mutex<Blake3Tree>,
    /// The file's last block, read but held until the file digest is known.
    last: Mutex<Option<BlockRead>>,
    /// Set when a reader failed or the file was skipped: nobody reads further.
    stop: AtomicBool,
    /// Set when the receiver was told of a failure, and whether the queue took the news.
    failed: Mutex<Option<bool>>,
    /// File bytes not yet counted as passed ([`Unpassed`] for the whole file).
    unpassed: AtomicU64,
}

/// A reader's place in the file: what the receiver has, and whether the decision is still
/// awaited (only the origin reads early).
pub(super) struct Place {
    pub(super) have: Vec<(u64, u64)>,
    pub(super) early: bool,
}

impl Segments {
    fn new(record: Arc<FileRecord>, before: Meta, seg: u64, unpassed: &mut Unpassed<'_>) -> Self {
        let size = record.meta.size;
        let tree = Blake3Tree::new(size).expect("a split file is larger than a tree's minimum");
        let left = std::mem::take(&mut unpassed.left);
        Self {
            record,
            before,
            seg,
            count: size.div_ceil(seg),
            next: AtomicU64::new(0),
            done: Mutex::new(0),
            all_done: Condvar::new(),
            have: Mutex::default(),
            tree: Mutex::new(tree),
            last: Mutex::new(None),
            stop: AtomicBool::new(false),
            failed: Mutex::new(None),
            unpassed: AtomicU64::new(left),
        }
    }

    fn pass(&self, shared: &SenderState, n: u64) {
        let took = self
            .unpassed
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                Some(left - n.min(left))
            })
            .map_or(0, |left| n.min(left));
        shared.passed_bytes.fetch_add(took, Ordering::Relaxed);
    }

    /// The next segment to read, if any is left and the file is still wanted.
    fn take(&self) -> Option<u64> {
        if self.stop.load(Ordering::Acquire) {
            return None;
        }
        let i = self.next.fetch_add(1, Ordering::AcqRel);
        (i < self.count).then_some(i)
    }

    fn finished(&self, n: u64) {
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        *done += n;
        if *done >= self.count {
            self.all_done.notify_all();
        }
    }

    /// No more segments are handed out; those not taken yet count as done.
    fn give_up(&self) {
        self.stop.store(true, Ordering::Release);
        let taken = self.next.swap(self.count, Ordering::AcqRel).min(self.count);
        self.finished(self.count - taken);
    }

    /// Tells the receiver (once) that the file failed, and stops every reader of it.
    fn fail(&self, shared: &SenderState, msg: String) -> Streamed {
        let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        let told =
            *failed.get_or_insert_with(|| shared.fail_file(&self.record, ErrorCode::IO, msg));
        drop(failed);
        self.give_up();
        Streamed::failed(told)
    }

    fn changed(&self) -> String {
        changed(&self.record.meta.path)
    }

    /// Reads segment `i` in order: hashes all of it, queues the blocks the receiver does not
    /// have, and holds the file's last block. `Err` when this reader must stop.
    fn read_segment(
        &self,
        shared: &SenderState,
        file: &File,
        i: u64,
        place: &mut Place,
        publish: &mut dyn FnMut(&SenderState),
    ) -> Result<(), Streamed> {
        let meta = &self.record.meta;
        let (start, end) = (i * self.seg, ((i + 1) * self.seg).min(meta.size));
        let mut hasher =
            RangeHasher::new(meta.size, start, end).expect("segments are aligned subtrees");
        let mut offset = start;
        while offset < end {
            if self.stop.load(Ordering::Acquire) || shared.is_skipped(meta.id) {
                self.give_up();
                return Err(Streamed::Finished);
            }
            if place.early {
                match early_decision(shared, meta.id)? {
                    None => {}
                    Some(Decision::Send) => {
                        place.early = false;
                        publish(shared);
                    }
                    Some(Decision::Resume { have }) => {
                        place.early = false;
                        place.have = have.clone();
                        *self.have.lock().unwrap_or_else(|e| e.into_inner()) = have;
                        publish(shared);
                    }
                    Some(d) => {
                        self.give_up();
                        return Err(Streamed::Decided(d));
                    }
                }
            }
            let len = next_len(shared, &place.have, offset, end - offset);
            let data = match read_block(file, self.record.base + offset, len) {
                Ok(d) => d,
                Err(e) => {
                    let msg = read_failed(file, self.before, &meta.path, &e);
                    return Err(self.fail(shared, msg));
                }
            };
            shared.read_bytes.fetch_add(len, Ordering::Relaxed);
            self.pass(shared, len);
            hasher.update(&data);
            let read = BlockRead {
                digest: block_digest(&data),
                data,
                file_digest: None,
            };
            let at = offset;
            offset += len;
            if offset == meta.size {
                *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(read);
            } else if !covered(&place.have, at, offset)
                && !queue_block(shared, &self.record, at, read, place.early)
            {
                self.give_up();
                return Err(Streamed::Over);
            }
        }
        let pieces = hasher.finish().expect("the whole segment was read");
        let mut tree = self.tree.lock().unwrap_or_else(|e| e.into_inner());
        for p in pieces {
            tree.insert(p);
        }
        Ok(())
    }

    /// Reads segments until none is left; each one taken is counted done, however it ends.
    fn work(
        &self,
        shared: &SenderState,
        file: &File,
        place: &mut Place,
        publish: &mut dyn FnMut(&SenderState),
    ) -> Result<(), Streamed> {
        while let Some(i) = self.take() {
            let r = self.read_segment(shared, file, i, place, publish);
            self.finished(1);
            r?;
        }
        Ok(())
    }

    /// Waits until every segment is read or given up. False if the session ended first.
    fn wait_all(&self, shared: &SenderState) -> bool {
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        while *done < self.count {
            if shared.is_over() {
                return false;
            }
            // Bounded: a session that ends while a helper is blocked still frees the origin.
            done = self
                .all_done
                .wait_timeout(done, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// After every segment: the file digest, checked against a file unchanged since it was
    /// opened, on the held last block, which is queued.
    fn finish(&self, shared: &SenderState, file: &File, early: bool) -> Streamed {
        let meta = &self.record.meta;
        if let Some(told) = *self.failed.lock().unwrap_or_else(|e| e.into_inner()) {
            return Streamed::failed(told);
        }
        if shared.is_skipped(meta.id) {
            return Streamed::Finished;
        }
        let after = rustix::fs::fstat(file).map(|st| Meta::from_stat(&st));
        if after.ok() != Some(self.before) {
            return self.fail(shared, self.changed());
        }
        let digest = self.tree.lock().unwrap_or_else(|e| e.into_inner()).finish();
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner()).take();
        let (Some(digest), Some(mut last)) = (digest, last) else {
            // Every segment was read to its end, so neither can be missing.
            return self.fail(shared, format!("{}: a segment went unread", meta.path));
        };
        record_digest(shared, &self.record, &digest);
        last.file_digest = Some(Bytes::from(digest));
        let offset = meta.size - last.data.len() as u64;
        if !queue_block(shared, &self.record, offset, last, early) {
            return Streamed::Over;
        }
        if early {
            return Streamed::AllEarly;
        }
        shared.reporter.on_file_done();
        Streamed::Finished
    }

    /// Helps read a file another reader started: segments until none is left.
    pub(super) fn help(&self, shared: &SenderState) {
        // Most tickets come to a file that is read to its end already.
        if self.stop.load(Ordering::Acquire) || self.next.load(Ordering::Acquire) >= self.count {
            return;
        }
        let file = match open_checked(&self.record) {
            Ok((file, now)) if now == self.before => file,
            Ok(_) => {
                let _ = self.fail(shared, self.changed());
                return;
            }
            Err(e) => {
                let _ = self.fail(
                    shared,
                    format!("cannot read {}: {e}", self.record.meta.path),
                );
                return;
            }
        };
        let mut place = Place {
            have: self.have.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            early: false,
        };
        let _ = self.work(shared, &file, &mut place, &mut |_| {});
    }
}

/// Keeps a finished file's digest for the manifest, the digest cache and a resend of its
/// last block.
pub(super) fn record_digest(shared: &SenderState, record: &FileRecord, digest: &[u8]) {
    let meta = &record.meta;
    *record
        .final_digest
        .lock()
        .unwrap_or_else(|e| e.into_inner()) = Some(Bytes::copy_from_slice(digest));
    shared.cache().insert(
        (meta.path.clone(), meta.size, meta.mtime_ns),
        digest.to_vec(),
    );
    *record.digest.lock().unwrap_or_else(|e| e.into_inner()) = Some(digest.to_vec());
}

/// Reads a large BLAKE3 file in segments, starting alone (early, if its decision has not
/// come) and handing out the rest to idle readers once it is decided. The origin's side of
/// [`Segments`]; what `stream_file` does for other files.
pub(super) fn read_split(
    shared: &SenderState,
    record: &Arc<FileRecord>,
    (file, before): (File, Meta),
    seg: u64,
    mut place: Place,
    unpassed: &mut Unpassed<'_>,
) -> Streamed {
    let segs = Arc::new(Segments::new(record.clone(), before, seg, unpassed));
    *segs.have.lock().unwrap_or_else(|e| e.into_inner()) = place.have.clone();
    let mut publish = {
        let segs = segs.clone();
        move |shared: &SenderState| {
            let others = shared.config.readers.active().saturating_sub(1);
            let left = segs.count.saturating_sub(segs.next.load(Ordering::Acquire));
            for _ in 0..u64::from(others).min(left) {
                if shared.helpers.0.send(segs.clone()).is_err() {
                    break;
                }
            }
        }
    };
    if !place.early {
        publish(shared);
    }
    let worked = segs.work(shared, &file, &mut place, &mut publish);
    let outcome = if !segs.wait_all(shared) {
        Streamed::Over
    } else {
        match worked {
            Ok(()) => segs.finish(shared, &file, place.early),
            Err(s) => s,
        }
    };
    // What no reader passed (a failure, a skip) is passed now, so the transfer's end is cut
    // as if the file were done.
    let rest = segs.unpassed.swap(0, Ordering::Relaxed);
    shared.passed_bytes.fetch_add(rest, Ordering::Relaxed);
    outcome
}
