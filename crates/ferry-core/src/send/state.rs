//! What a sender is given (sources, settings) and the state its walker, readers and resend
//! worker share: offers' decisions, files found and passed, the early budget.

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use bytes::Bytes;
use ferry_proto::{ChecksumAlgo, Decision, ErrorCode, FileId, FileMeta, Frame};

use super::cut::cut;
use super::segments::Segments;
use crate::digest::KnownDigests;
use crate::filter::Filter;
use crate::gate::Gate;
use crate::report::Reporter;
use crate::root::Root;

/// One thing to send: `rel` under `root`, arriving as `name` at the destination. A directory
/// named "" arrives as its contents only, each under its own name (a sync between servers).
#[derive(Debug)]
pub struct Source {
    pub root: Root,
    pub rel: String,
    pub name: String,
}

/// Sender tuning.
#[derive(Clone, Debug)]
pub struct SenderConfig {
    pub block_size: u32,
    /// Data connections opened (with `--streams auto`, the most the tuner may use, so the cuts
    /// are finer than the active streams need). Both ends of a transfer are cut into smaller
    /// blocks by it (see [`TAIL_SPLIT`]).
    pub streams: u16,
    pub checksum: ChecksumAlgo,
    /// Files read at once: reader threads started is `readers.max()`, and the gate says how
    /// many take files (a tuner may change it). Storage often wants fewer threads than the
    /// network has streams.
    pub readers: Arc<Gate>,
    /// Test-only fault hook: sequence numbers (0-based, in the order blocks are read) of blocks
    /// whose data is altered after the digest is computed, once each.
    pub corrupt_blocks: Vec<u64>,
    /// Digests of files already read, kept across the attempts of one job, so that a retry
    /// does not read every complete file again to prove it identical.
    pub digest_cache: Arc<DigestCache>,
}

/// Whole-file digests by (path on the wire, size, mtime): those this sender read, and those
/// it knows without reading (a server's catalog).
#[derive(Default)]
pub struct DigestCache {
    read: Mutex<HashMap<(String, u64, i64), Vec<u8>>>,
    known: Option<Arc<dyn KnownDigests>>,
}

impl DigestCache {
    /// A cache that also asks `known` before a file is read to prove it.
    pub fn with_known(known: Arc<dyn KnownDigests>) -> Self {
        Self {
            read: Mutex::default(),
            known: Some(known),
        }
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u64, i64), Vec<u8>>> {
        self.read.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The digest of `key`'s file with `algo`: read before, or known.
    pub(super) fn get(&self, key: &(String, u64, i64), algo: ChecksumAlgo) -> Option<Vec<u8>> {
        if let Some(d) = self.lock().get(key) {
            return Some(d.clone());
        }
        self.known.as_ref()?.known(&key.0, key.1, key.2, algo)
    }
}

impl std::fmt::Debug for DigestCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DigestCache")
            .field("read", &self.lock().len())
            .field("known", &self.known.is_some())
            .finish()
    }
}

/// Totals known when the walk is over; the session sends them as the `Sent` frame.
pub use ferry_session::send::Totals as WalkTotals;

/// What the sender remembers of a file so that a block can be read again on request.
pub(super) struct FileRecord {
    /// The directory holding the file and its name there: reopening is one `openat`.
    pub(super) dir: Arc<OwnedFd>,
    pub(super) name: String,
    /// Where the file's bytes start in what `dir`/`name` opens: 0 for a file, a member's
    /// offset for an archive sent as its members (`put --untar`).
    pub(super) base: u64,
    /// Size and mtime of what `dir`/`name` opened when listed (the archive's, for a member):
    /// one that changed since is not vouched for.
    pub(super) listed: (u64, i64),
    pub(super) meta: FileMeta,
    pub(super) final_digest: Mutex<Option<Bytes>>,
    pub(super) digest: Mutex<Option<Vec<u8>>>,
}

pub(super) struct Job {
    pub(super) record: Arc<FileRecord>,
}

/// What the sender's walker, readers and resend worker share: the settings, the queues, the
/// receiver's decisions, and what has been found, read and passed so far.
pub(super) struct SenderState {
    pub(super) sources: Vec<Source>,
    /// An archive sent as its members instead of the sources (`put --untar`).
    pub(super) archive: Option<crate::archive::Archive>,
    /// Which entries the walk sends (`--exclude`/`--include`), judged by their wire paths.
    pub(super) filter: Filter,
    pub(super) config: SenderConfig,
    pub(super) frames: flume::Sender<Frame>,
    /// Frames for the control connection (`Offer`).
    pub(super) control: flume::Sender<Frame>,
    /// The receiver's answers to offers, taken by the reader of each file.
    pub(super) decisions: Mutex<HashMap<FileId, Decision>>,
    pub(super) decided: Condvar,
    /// Set when the session ends: readers waiting for a decision give up.
    pub(super) closed: AtomicBool,
    /// The receiver takes a file's digest apart (`FileDigest` on control) when it has every
    /// block of the file: a striped get's client, whose stripe hosts bring one-block files.
    pub(super) digest_apart: AtomicBool,
    pub(super) reporter: Arc<dyn Reporter>,
    pub(super) records: Mutex<HashMap<FileId, Arc<FileRecord>>>,
    pub(super) skipped: Mutex<HashSet<FileId>>,
    pub(super) errors: Mutex<Vec<String>>,
    /// Files and bytes the walk has found so far (the engine sizes its first streams by them).
    pub(super) found_files: AtomicU64,
    /// Files the readers are done with: every block queued, or nothing to send.
    pub(super) passed_files: AtomicU64,
    pub(super) found_bytes: AtomicU64,
    /// Set when the walk is over: only then is `found_bytes` the total.
    pub(super) walked: AtomicBool,
    /// File bytes the readers are done with: read, already at the receiver, or not to be
    /// sent. With `found_bytes` it says how much is left once the walk is over.
    pub(super) passed_bytes: AtomicU64,
    pub(super) block_seq: AtomicU64,
    /// File bytes read for sending (what the reader tuner measures).
    pub(super) read_bytes: AtomicU64,
    pub(super) corrupt: Mutex<HashSet<u64>>,
    /// Block size and connections the receiver granted ([`Sender::grant`]); until then, what
    /// the config asked for.
    pub(super) block_size: AtomicU32,
    pub(super) streams: AtomicU32,
    /// Whether [`Sender::grant`] has come: until then a block is at most
    /// [`ferry_proto::MIN_GRANTED_BLOCK`], which no grant can make too large.
    pub(super) granted: AtomicBool,
    /// Bytes sent early so far (see [`EARLY_PER_STREAM`]).
    pub(super) early_sent: AtomicU64,
    /// Files being read in segments that idle readers may help with: a reader looks here
    /// before it takes a new file (both ends kept, so it never disconnects).
    pub(super) helpers: (flume::Sender<Arc<Segments>>, flume::Receiver<Arc<Segments>>),
}

pub use ferry_session::cut::EARLY_PER_STREAM;

impl SenderState {
    pub(super) fn error(&self, msg: String) {
        self.reporter.on_file_failed(&msg);
        self.errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(msg);
    }

    /// The block size the receiver granted (or, before it answered, the one asked for).
    pub(super) fn block_size(&self) -> u64 {
        let asked = u64::from(self.block_size.load(Ordering::Acquire));
        if self.granted.load(Ordering::Acquire) {
            asked
        } else {
            asked.min(u64::from(ferry_proto::MIN_GRANTED_BLOCK))
        }
    }

    /// The session has ended: closed by the driver, or its frame queue dropped.
    pub(super) fn is_over(&self) -> bool {
        self.closed.load(Ordering::Acquire) || self.frames.is_disconnected()
    }

    /// The length of the next block of a file with `left` bytes still to read.
    pub(super) fn block_len(&self, left: u64) -> u64 {
        let remaining = self.walked.load(Ordering::Acquire).then(|| {
            self.found_bytes
                .load(Ordering::Relaxed)
                .saturating_sub(self.passed_bytes.load(Ordering::Relaxed))
        });
        cut(
            left,
            self.block_size(),
            u64::from(self.streams.load(Ordering::Acquire)),
            self.block_seq.load(Ordering::Relaxed),
            remaining,
        )
    }

    /// Queues a frame; false when the transfer is over (the driver dropped the queue).
    pub(super) fn push(&self, frame: Frame) -> bool {
        self.frames.send(frame).is_ok()
    }

    /// Tells the receiver that a file will not come, so it does not wait for it.
    pub(super) fn fail_file(&self, record: &FileRecord, code: ErrorCode, msg: String) -> bool {
        self.error(msg.clone());
        self.push(Frame::FileFailed {
            file: record.meta.id,
            code,
            message: msg,
        })
    }

    pub(super) fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u64, i64), Vec<u8>>> {
        self.config.digest_cache.lock()
    }

    /// Blocks until the receiver has answered the offer of `id`; `None` once the session ends.
    pub(super) fn wait_decision(&self, id: FileId) -> Option<Decision> {
        let mut map = self.decisions.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(d) = map.remove(&id) {
                return Some(d);
            }
            if self.is_over() {
                tracing::debug!(file = id.0, "session over before the file was decided");
                return None;
            }
            // Bounded waits: a session that ends without `close` still frees its readers.
            map = self
                .decided
                .wait_timeout(map, std::time::Duration::from_millis(200))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Whether a block may still go early: the session's early budget is not spent.
    pub(super) fn early_room(&self) -> bool {
        let budget = EARLY_PER_STREAM * u64::from(self.config.streams.max(1));
        self.early_sent.load(Ordering::Relaxed) < budget
    }

    /// The receiver's answer to the offer of `id`, if it has come.
    pub(super) fn take_decision(&self, id: FileId) -> Option<Decision> {
        self.decisions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id)
    }

    pub(super) fn is_skipped(&self, id: FileId) -> bool {
        self.skipped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&id)
    }
}
