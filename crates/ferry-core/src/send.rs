//! The sending side: walk the sources, read files in blocks, and queue frames for the streams.
//!
//! ```text
//!  walker ──jobs──▶ reader × R ──┐
//!    │                           ├──frames──▶ (driver) stream × N
//!    └────── Dir / Symlink ──────┘
//!  resend worker ◀── Resend requests from the receiver ──┘
//! ```
//! The walker streams jobs as it discovers files, so sending starts before the walk ends. Each
//! reader owns one file at a time and reads it in order, so the file digest is computed in the
//! same pass as the reads. Frames go into one bounded queue that every stream pulls from: any
//! stream carries any block of any file, and the bound is what limits memory.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use bytes::Bytes;
use ferry_proto::{
    Block, ChecksumAlgo, Decision, ErrorCode, FileDecision, FileId, FileMeta, Frame, OfferEntry,
};

use crate::digest::{block_digest, FileHasher};
use crate::error::FsError;
use crate::gate::Gate;
use crate::path::join;
use crate::report::Reporter;
use crate::root::{self, Kind, Meta, OFlags, Root};

/// One thing to send: `rel` under `root`, arriving as `name` at the destination.
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

/// Whole-file digests by (path on the wire, size, mtime).
pub type DigestCache = Mutex<HashMap<(String, u64, i64), Vec<u8>>>;

/// Files announced per `Offer` frame, and how long a partly filled batch may wait.
const OFFER_BATCH: usize = ferry_proto::MAX_OFFER_ENTRIES;
const OFFER_DELAY: std::time::Duration = std::time::Duration::from_millis(5);

/// Blocks are cut smaller at both ends of a transfer, so that every stream has data as soon
/// as it can send and none is left alone with a whole block at the end.
///
/// At the start, the first `streams` blocks are `MIN_CUT_BLOCK` and each next `streams`
/// twice as large, up to the block size: one reader fills every stream at once instead of
/// reading and hashing 16 whole blocks first (BLAKE3 and XXH3 alone take ~3 ms per 8 MiB at
/// the per-core rates in DESIGN.md), and TCP's slow start sends little per stream in the
/// first round trips anyway. On the bed (16 streams, 100 ms, one transfer each) the first
/// 2 MB arrived at 0.63 s with the head cut and 0.75 s without.
///
/// Near the end, a block is at most the bytes left to read divided by `TAIL_SPLIT × streams`.
/// A stream carries a whole block at its own share of the path, and at long RTT one stream's
/// share is small and slow to grow (BBR raises its estimate by a quarter per eight round
/// trips). With 16 streams at 100 ms, the last 8 MiB block of the slowest stream took another
/// second after every other stream had finished: 11 % of a 1 GiB transfer. Cut this way, the
/// last blocks leave every stream at about the same time; 4 rather than 2 leaves room for a
/// stream running at a quarter of the average rate.
pub const TAIL_SPLIT: u64 = 4;

/// The smallest block either end is cut into: 34 ms at a sixteenth of 1 Gbit/s, large
/// enough that per-block costs (a frame, a digest, a write, a journal record) stay small:
/// 1 GiB over 16 connections becomes 420 blocks instead of 128.
pub const MIN_CUT_BLOCK: u64 = 256 << 10;

/// The length of a file's next block: `left` bytes of the file still to read, `block` the
/// session's block size, `queued` blocks queued so far, `remaining` the bytes of the whole
/// transfer still to read once the walk is over (unknown before). A whole block, except near
/// either end of the transfer (see [`TAIL_SPLIT`]).
fn cut(left: u64, block: u64, streams: u64, queued: u64, remaining: Option<u64>) -> u64 {
    let streams = streams.max(1);
    let doublings = (queued / streams).min(32);
    let mut len = left.min(block).min(MIN_CUT_BLOCK << doublings);
    if let Some(remaining) = remaining {
        // Whole 64 KiB multiples keep the reads aligned.
        let share = (remaining / (TAIL_SPLIT * streams)) & !0xffff;
        len = len.min(share.max(MIN_CUT_BLOCK));
    }
    // No sliver of a block after this one: the rest of the file goes with it.
    if left <= block && left - len < MIN_CUT_BLOCK {
        return left;
    }
    len
}

/// Totals known when the walk is over; they become the `Sent` frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkTotals {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub bytes: u64,
}

/// What the sender remembers of a file so that a block can be read again on request.
struct FileRecord {
    /// The directory holding the file and its name there: reopening is one `openat`.
    dir: Arc<OwnedFd>,
    name: String,
    meta: FileMeta,
    final_digest: Mutex<Option<Bytes>>,
    digest: Mutex<Option<Vec<u8>>>,
}

struct Job {
    record: Arc<FileRecord>,
}

struct Shared {
    sources: Vec<Source>,
    config: SenderConfig,
    frames: flume::Sender<Frame>,
    /// Frames for the control connection (`Offer`).
    control: flume::Sender<Frame>,
    /// The receiver's answers to offers, taken by the reader of each file.
    decisions: Mutex<HashMap<FileId, Decision>>,
    decided: Condvar,
    /// Set when the session ends: readers waiting for a decision give up.
    closed: AtomicBool,
    reporter: Arc<dyn Reporter>,
    records: Mutex<HashMap<FileId, Arc<FileRecord>>>,
    skipped: Mutex<HashSet<FileId>>,
    errors: Mutex<Vec<String>>,
    /// Files and bytes the walk has found so far (the engine sizes its first streams by them).
    found_files: AtomicU64,
    /// Files the readers are done with: every block queued, or nothing to send.
    passed_files: AtomicU64,
    found_bytes: AtomicU64,
    /// Set when the walk is over: only then is `found_bytes` the total.
    walked: AtomicBool,
    /// File bytes the readers are done with: read, already at the receiver, or not to be
    /// sent. With `found_bytes` it says how much is left once the walk is over.
    passed_bytes: AtomicU64,
    block_seq: AtomicU64,
    /// File bytes read for sending (what the reader tuner measures).
    read_bytes: AtomicU64,
    corrupt: Mutex<HashSet<u64>>,
    /// Block size and connections the receiver granted ([`Sender::grant`]); until then, what
    /// the config asked for.
    block_size: AtomicU32,
    streams: AtomicU32,
    /// Whether [`Sender::grant`] has come: until then a block is at most
    /// [`ferry_proto::MIN_GRANTED_BLOCK`], which no grant can make too large.
    granted: AtomicBool,
    /// Bytes sent early so far (see [`EARLY_PER_STREAM`]).
    early_sent: AtomicU64,
}

/// File bytes a session may send early (before their decision), per data connection asked
/// for: one head block each ([`MIN_CUT_BLOCK`]). That is all a connection's first flight can
/// carry (10 segments of at most 9,000 bytes) with room to spare, and the decisions are back
/// when the round trip after it begins; more would only fill socket buffers with bytes that
/// are wasted when the receiver holds the file already (a re-run, a resume).
pub const EARLY_PER_STREAM: u64 = MIN_CUT_BLOCK;

/// A running sender. Dropping the frame receiver makes every thread stop at its next send.
pub struct Sender {
    shared: Arc<Shared>,
    walker: Option<JoinHandle<()>>,
    readers: Vec<JoinHandle<()>>,
    resend_tx: Option<flume::Sender<(FileId, u64, u32)>>,
    resender: Option<JoinHandle<()>>,
    totals_rx: flume::Receiver<WalkTotals>,
}

impl Sender {
    /// Starts the walker, readers and the resend worker. Frames appear on `frames`.
    ///
    /// `control` carries `Offer` frames for the control connection; answers come back through
    /// [`Sender::decide`].
    pub fn start(
        sources: Vec<Source>,
        config: SenderConfig,
        frames: flume::Sender<Frame>,
        control: flume::Sender<Frame>,
        reporter: Arc<dyn Reporter>,
    ) -> Self {
        let corrupt = Mutex::new(config.corrupt_blocks.iter().copied().collect());
        let readers_n = config.readers.max();
        let (block_size, streams) = (config.block_size, u32::from(config.streams));
        let shared = Arc::new(Shared {
            sources,
            config,
            frames,
            control,
            decisions: Mutex::default(),
            decided: Condvar::new(),
            closed: AtomicBool::new(false),
            reporter,
            records: Mutex::default(),
            skipped: Mutex::default(),
            errors: Mutex::default(),
            found_files: AtomicU64::new(0),
            passed_files: AtomicU64::new(0),
            found_bytes: AtomicU64::new(0),
            walked: AtomicBool::new(false),
            passed_bytes: AtomicU64::new(0),
            block_seq: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            corrupt,
            block_size: AtomicU32::new(block_size),
            streams: AtomicU32::new(streams),
            granted: AtomicBool::new(false),
            early_sent: AtomicU64::new(0),
        });
        // The walk runs ahead of the readers by up to this many files (a few hundred bytes
        // each). It is also how far offers run ahead of the data: with a 256-deep queue only
        // about 512 files were offered per round trip, which capped small files near 5,000
        // per second at 100 ms RTT.
        let (job_tx, job_rx) = flume::bounded::<Job>(16 * 1024);
        let (totals_tx, totals_rx) = flume::bounded(1);
        let walker = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("ferry-walk".into())
                .spawn(move || {
                    let totals = walk(&shared, &job_tx);
                    shared.walked.store(true, Ordering::Release);
                    shared.reporter.on_walk_done();
                    let _ = totals_tx.send(totals);
                })
                .expect("spawning a thread")
        };
        let readers = (0..readers_n)
            .map(|i| {
                let shared = shared.clone();
                let job_rx = job_rx.clone();
                std::thread::Builder::new()
                    .name(format!("ferry-read-{i}"))
                    .spawn(move || {
                        while shared.config.readers.wait_turn(i, || shared.is_over()) {
                            let Ok(job) = job_rx.recv() else { break };
                            if !send_file(&shared, &job.record) {
                                break;
                            }
                            shared.passed_files.fetch_add(1, Ordering::Release);
                        }
                    })
                    .expect("spawning a thread")
            })
            .collect();
        let (resend_tx, resend_rx) = flume::unbounded::<(FileId, u64, u32)>();
        let resender = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("ferry-resend".into())
                .spawn(move || {
                    for (file, offset, len) in resend_rx.iter() {
                        if !resend_block(&shared, file, offset, len) {
                            break;
                        }
                    }
                })
                .expect("spawning a thread")
        };
        Self {
            shared,
            walker: Some(walker),
            readers,
            resend_tx: Some(resend_tx),
            resender: Some(resender),
            totals_rx,
        }
    }

    /// What the receiver granted: it may lower the block size and the connections asked for.
    /// The walk (and its offers), and the first blocks (early ones), may run before the
    /// receiver has answered, which lets a client send its first offers right behind the
    /// request and its first blocks right behind the data connections' `Hello`.
    pub fn grant(&self, block_size: u32, streams: u16) {
        self.shared.block_size.store(block_size, Ordering::Release);
        self.shared
            .streams
            .store(u32::from(streams), Ordering::Release);
        self.shared.granted.store(true, Ordering::Release);
    }

    /// The reader pool's gate.
    pub fn readers(&self) -> Arc<Gate> {
        self.shared.config.readers.clone()
    }

    /// File bytes read for sending so far.
    pub fn bytes_read(&self) -> u64 {
        self.shared.read_bytes.load(Ordering::Relaxed)
    }

    /// Resolves once the walk is over, with what it found.
    pub fn totals(&self) -> flume::Receiver<WalkTotals> {
        self.totals_rx.clone()
    }

    /// Files and bytes the walk has found so far (it runs ahead of the readers).
    pub fn found(&self) -> (u64, u64) {
        (
            self.shared.found_files.load(Ordering::Relaxed),
            self.shared.found_bytes.load(Ordering::Relaxed),
        )
    }

    /// Whether every file the walk found has been read and its blocks queued (resends of bad
    /// blocks aside): from then on the frame queue only empties.
    pub fn all_queued(&self) -> bool {
        self.shared.walked.load(Ordering::Acquire)
            && self.shared.passed_files.load(Ordering::Acquire)
                >= self.shared.found_files.load(Ordering::Acquire)
    }

    /// The receiver's answers to offered files.
    pub fn decide(&self, entries: Vec<FileDecision>) {
        let mut map = self
            .shared
            .decisions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        tracing::debug!(
            n = entries.len(),
            first = entries.first().map(|e| e.file.0),
            "decisions received"
        );
        for e in entries {
            // Recorded now, not when a reader picks the decision up: the receiver's `Complete`
            // can follow at once, and a session closed before that reader ran would lose it.
            if let Decision::Fail { message, .. } = &e.decision {
                self.shared.error(format!("receiver: {message}"));
            }
            map.insert(e.file, e.decision);
        }
        self.shared.decided.notify_all();
    }

    /// The session is over: readers still waiting for a decision stop.
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.decided.notify_all();
        self.shared.config.readers.close();
    }

    /// The receiver found a bad block: read it again and queue it.
    pub fn resend(&self, file: FileId, offset: u64, len: u32) {
        if let Some(tx) = &self.resend_tx {
            let _ = tx.send((file, offset, len));
        }
    }

    /// The receiver will not store this file: stop reading it.
    pub fn skip(&self, file: FileId) {
        self.shared
            .skipped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(file);
    }

    /// Local problems (unreadable files, files changed while read), for the final report.
    pub fn errors(&self) -> Vec<String> {
        self.shared
            .errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Source path and digest of each file read completely, for `--manifest`.
    pub fn digests(&self) -> Vec<(FileId, String, Vec<u8>)> {
        let records = self
            .shared
            .records
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<_> = records
            .values()
            .filter_map(|r| {
                let d = r.digest.lock().unwrap_or_else(|e| e.into_inner()).clone()?;
                Some((r.meta.id, r.meta.path.clone(), d))
            })
            .collect();
        out.sort_by_key(|(id, _, _)| *id);
        out
    }

    /// Waits for the walker and readers; resends stay possible until [`Sender::finish`].
    pub fn join_readers(&mut self) {
        if let Some(w) = self.walker.take() {
            let _ = w.join();
        }
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }

    /// Stops the resend worker and waits for all threads.
    pub fn finish(mut self) {
        self.join_readers();
        self.resend_tx.take();
        if let Some(r) = self.resender.take() {
            let _ = r.join();
        }
    }
}

impl Shared {
    fn error(&self, msg: String) {
        self.reporter.on_file_failed(&msg);
        self.errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(msg);
    }

    /// The block size the receiver granted (or, before it answered, the one asked for).
    fn block_size(&self) -> u64 {
        let asked = u64::from(self.block_size.load(Ordering::Acquire));
        if self.granted.load(Ordering::Acquire) {
            asked
        } else {
            asked.min(u64::from(ferry_proto::MIN_GRANTED_BLOCK))
        }
    }

    /// The session has ended: closed by the driver, or its frame queue dropped.
    fn is_over(&self) -> bool {
        self.closed.load(Ordering::Acquire) || self.frames.is_disconnected()
    }

    /// The length of the next block of a file with `left` bytes still to read.
    fn block_len(&self, left: u64) -> u64 {
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
    fn push(&self, frame: Frame) -> bool {
        self.frames.send(frame).is_ok()
    }

    /// Tells the receiver that a file will not come, so it does not wait for it.
    fn fail_file(&self, record: &FileRecord, code: ErrorCode, msg: String) -> bool {
        self.error(msg.clone());
        self.push(Frame::FileFailed {
            file: record.meta.id,
            code,
            message: msg,
        })
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u64, i64), Vec<u8>>> {
        self.config
            .digest_cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks until the receiver has answered the offer of `id`; `None` once the session ends.
    fn wait_decision(&self, id: FileId) -> Option<Decision> {
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
    fn early_room(&self) -> bool {
        let budget = EARLY_PER_STREAM * u64::from(self.config.streams.max(1));
        self.early_sent.load(Ordering::Relaxed) < budget
    }

    /// The receiver's answer to the offer of `id`, if it has come.
    fn take_decision(&self, id: FileId) -> Option<Decision> {
        self.decisions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id)
    }

    fn is_skipped(&self, id: FileId) -> bool {
        self.skipped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&id)
    }
}

/// An entry still to visit: `name` inside the open directory `parent`.
struct Pending {
    parent: Arc<OwnedFd>,
    name: String,
    wire: String,
}

/// Depth-first walk of every source; directories are listed in name order. Every step opens
/// or stats a single name relative to an already-open directory, never following a symlink,
/// so the walk stays beneath each source's root without re-resolving whole paths.
fn walk(shared: &Shared, jobs: &flume::Sender<Job>) -> WalkTotals {
    let mut offers = Offers {
        shared,
        batch: Vec::new(),
        since: None,
    };
    let totals = walk_sources(shared, jobs, &mut offers);
    offers.flush();
    totals
}

/// Offers waiting to be sent. Batches keep the control traffic small; a batch is flushed when
/// full, when it is a few milliseconds old, and always before the walker would block, so a
/// reader never waits for a decision about a file whose offer is still sitting here.
struct Offers<'a> {
    shared: &'a Shared,
    batch: Vec<OfferEntry>,
    since: Option<std::time::Instant>,
}

impl Offers<'_> {
    fn add(&mut self, meta: &FileMeta) {
        self.batch.push(OfferEntry {
            file: meta.id,
            path: meta.path.clone(),
            size: meta.size,
            mode: meta.mode,
            mtime_ns: meta.mtime_ns,
        });
        let since = *self.since.get_or_insert_with(std::time::Instant::now);
        if self.batch.len() >= OFFER_BATCH || since.elapsed() >= OFFER_DELAY {
            self.flush();
        }
    }

    fn flush(&mut self) {
        self.since = None;
        if !self.batch.is_empty() {
            let entries = std::mem::take(&mut self.batch);
            tracing::debug!(
                n = entries.len(),
                first = entries[0].file.0,
                "offers queued"
            );
            let _ = self.shared.control.send(Frame::Offer { entries });
        }
    }
}

fn walk_sources(shared: &Shared, jobs: &flume::Sender<Job>, offers: &mut Offers<'_>) -> WalkTotals {
    let mut totals = WalkTotals::default();
    let mut next_id = 0u64;
    for src in &shared.sources {
        let (parent_rel, name) = crate::path::split_parent(&src.rel);
        let parent = match src.root.open_dir(parent_rel) {
            Ok(fd) => Arc::new(fd),
            Err(e) => {
                shared.error(format!("skipped {}: {e}", src.name));
                continue;
            }
        };
        let mut stack = vec![Pending {
            parent,
            name: name.to_owned(),
            wire: src.name.clone(),
        }];
        while let Some(Pending { parent, name, wire }) = stack.pop() {
            // The empty name is a source that is the root itself.
            let meta = if name.is_empty() {
                src.root.lstat("")
            } else {
                root::lstat_in(&parent, &name).map_err(|e| FsError::io(&wire, e))
            };
            let meta = match meta {
                Ok(m) => m,
                Err(e) => {
                    shared.error(format!("skipped {wire}: {e}"));
                    continue;
                }
            };
            match meta.kind {
                Kind::File => {
                    let id = FileId(next_id);
                    next_id += 1;
                    totals.files += 1;
                    totals.bytes += meta.size;
                    shared.found_bytes.fetch_add(meta.size, Ordering::Relaxed);
                    shared.found_files.fetch_add(1, Ordering::Relaxed);
                    shared.reporter.on_discovered(1, meta.size);
                    let record = Arc::new(FileRecord {
                        dir: parent,
                        name,
                        meta: FileMeta {
                            id,
                            path: wire,
                            size: meta.size,
                            mode: meta.mode,
                            mtime_ns: meta.mtime_ns,
                        },
                        final_digest: Mutex::new(None),
                        digest: Mutex::new(None),
                    });
                    shared
                        .records
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(id, record.clone());
                    offers.add(&record.meta);
                    let sent = match jobs.try_send(Job { record }) {
                        Ok(()) => true,
                        Err(flume::TrySendError::Full(job)) => {
                            offers.flush();
                            jobs.send(job).is_ok()
                        }
                        Err(flume::TrySendError::Disconnected(_)) => false,
                    };
                    if !sent {
                        return totals;
                    }
                }
                Kind::Dir => {
                    totals.dirs += 1;
                    let frame = Frame::Dir {
                        path: wire.clone(),
                        mode: meta.mode,
                        mtime_ns: meta.mtime_ns,
                    };
                    if !shared.push(frame) {
                        return totals;
                    }
                    let opened = if name.is_empty() {
                        src.root
                            .open_dir("")
                            .map_err(|e| std::io::Error::other(e.to_string()))
                    } else {
                        root::open_in(&parent, &name, OFlags::RDONLY | OFlags::DIRECTORY, 0)
                    };
                    match opened.and_then(|fd| Ok((root::list_dir(&fd)?, fd))) {
                        Ok((listing, fd)) => {
                            for bad in &listing.unusable {
                                shared.error(format!(
                                    "skipped {wire}/{bad}: the name is not UTF-8 and cannot be sent"
                                ));
                            }
                            let entries = listing.entries;
                            let fd = Arc::new(fd);
                            // Reversed so that popping the stack visits names in order.
                            for (child, _) in entries.into_iter().rev() {
                                let wire = join(&wire, &child);
                                stack.push(Pending {
                                    parent: fd.clone(),
                                    name: child,
                                    wire,
                                });
                            }
                        }
                        Err(e) => shared.error(format!("cannot list {wire}: {e}")),
                    }
                }
                Kind::Symlink => {
                    let target = rustix::fs::readlinkat(&*parent, name.as_str(), Vec::new())
                        .map_err(std::io::Error::from)
                        .and_then(|t| {
                            t.into_string()
                                .map_err(|_| std::io::Error::other("target is not UTF-8"))
                        });
                    match target {
                        Ok(target) => {
                            totals.symlinks += 1;
                            if !shared.push(Frame::Symlink {
                                path: wire,
                                target,
                                mtime_ns: meta.mtime_ns,
                            }) {
                                return totals;
                            }
                        }
                        Err(e) => shared.error(format!("skipped symlink {wire}: {e}")),
                    }
                }
                Kind::Other => {
                    // Offered and failed at once, so the receiver counts it and says why: left
                    // to this end's log, a get of a FIFO ended "0 files" with success.
                    let id = FileId(next_id);
                    next_id += 1;
                    totals.files += 1;
                    let what = if name.is_empty() {
                        "not a regular file"
                    } else {
                        special_kind(&parent, &name)
                    };
                    let record = FileRecord {
                        dir: parent,
                        name,
                        meta: FileMeta {
                            id,
                            path: wire,
                            size: 0,
                            mode: meta.mode,
                            mtime_ns: meta.mtime_ns,
                        },
                        final_digest: Mutex::new(None),
                        digest: Mutex::new(None),
                    };
                    // Out now: the failure that follows waits at the receiver for its offer.
                    offers.add(&record.meta);
                    offers.flush();
                    let msg = format!(
                        "skipped {}: {what}, not a regular file, directory or symlink",
                        record.meta.path
                    );
                    if !shared.fail_file(&record, ErrorCode::IO, msg) {
                        return totals;
                    }
                }
            }
        }
    }
    totals
}

/// Opens a source file and checks it is still the regular file the walk saw.
///
/// `O_NONBLOCK`, because the name may no longer be that file: opening a FIFO swapped in
/// after the walk would wait for a writer, and held a reader thread (eight of them in
/// issue 35) until someone came. Regular files ignore the flag. What was opened is checked on
/// the descriptor, so a swap after the open changes nothing either.
fn open_checked(record: &FileRecord) -> Result<(File, Meta), FsError> {
    let path = &record.meta.path;
    let fd = root::open_in(
        &record.dir,
        &record.name,
        OFlags::RDONLY | OFlags::NONBLOCK,
        0,
    )
    .map_err(|e| FsError::io(path, e))?;
    let file = File::from(fd);
    let st = rustix::fs::fstat(&file).map_err(|e| FsError::io(path, e))?;
    let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
    if kind != rustix::fs::FileType::RegularFile {
        let why = format!(
            "is {} now, not the regular file it was when listed",
            describe_type(kind)
        );
        return Err(FsError::io(path, std::io::Error::other(why)));
    }
    Ok((file, Meta::from_stat(&st)))
}

/// What a special file is, in words: `lstat` of `name` in `dir`.
fn special_kind(dir: &OwnedFd, name: &str) -> &'static str {
    match rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => describe_type(rustix::fs::FileType::from_raw_mode(st.st_mode)),
        Err(_) => "not a regular file",
    }
}

fn describe_type(kind: rustix::fs::FileType) -> &'static str {
    use rustix::fs::FileType as T;
    match kind {
        T::RegularFile => "a regular file",
        T::Directory => "a directory",
        T::Symlink => "a symlink",
        T::Fifo => "a FIFO",
        T::Socket => "a socket",
        T::CharacterDevice => "a character device",
        T::BlockDevice => "a block device",
        T::Unknown => "of an unknown type",
    }
}

/// Reads one file in order and queues its blocks. Returns false when the transfer is over.
///
/// A file whose decision has not come yet is read and sent at once, its blocks marked early
/// (`Block::early`), and the decision is taken in when it comes: the first blocks of a session
/// then leave with the data connections' `Hello`, a round trip before any decision can be
/// back (DESIGN.md, "Starting a session in few round trips"). The receiver uses early blocks
/// only for a file it decided to receive: after a decision other than `Send` or `Resume` they
/// were bandwidth spent for nothing, never data written.
fn send_file(shared: &Shared, record: &FileRecord) -> bool {
    let meta = &record.meta;
    // Counted as it is read, or all at once when this reader is done with the file.
    let mut unpassed = Unpassed {
        counter: &shared.passed_bytes,
        left: meta.size,
    };
    let decision = match shared.take_decision(meta.id) {
        Some(d) => d,
        None if shared.early_room() => {
            match stream_file(shared, record, Vec::new(), &mut unpassed, true) {
                Streamed::Done(more) => return more,
                Streamed::Decided(d) => d,
                // Every block went early. The decision still matters when the receiver holds
                // the same size and mtime: it dropped the early blocks and waits for our word.
                // (Handing such files to a thread of their own, so that the reader goes on,
                // sent more files early but measured no faster on a tree of tiny files.)
                Streamed::AllEarly => match shared.wait_decision(meta.id) {
                    None => return false,
                    Some(Decision::Send | Decision::Resume { .. }) => {
                        shared.reporter.on_file_done();
                        return true;
                    }
                    Some(d) => d,
                },
            }
        }
        None => match shared.wait_decision(meta.id) {
            Some(d) => d,
            None => return false,
        },
    };
    tracing::trace!(
        file = record.meta.id.0,
        ?decision,
        "reader has its decision"
    );
    answer(shared, record, decision, &mut unpassed)
}

/// Sends what `decision` asks of a file not sent yet (or sent early only in part). Returns
/// false when the transfer is over.
fn answer(
    shared: &Shared,
    record: &FileRecord,
    decision: Decision,
    unpassed: &mut Unpassed<'_>,
) -> bool {
    let meta = &record.meta;
    match decision {
        Decision::Send => stream_file(shared, record, Vec::new(), unpassed, false).more(),
        Decision::Resume { have } => stream_file(shared, record, have, unpassed, false).more(),
        // The receiver has resolved these already; nothing is sent.
        Decision::Skip => true,
        // Reported by `Sender::decide` when it arrived.
        Decision::Fail { .. } => true,
        Decision::Complete { digest } => {
            let key = (meta.path.clone(), meta.size, meta.mtime_ns);
            let cached = shared.cache().get(&key).cloned();
            let ours = match cached {
                Some(d) => d,
                None => match digest_file(shared, record) {
                    Ok(d) => d,
                    Err(e) => {
                        return shared.fail_file(
                            record,
                            e.code(),
                            format!("reading {}: {e}", meta.path),
                        )
                    }
                },
            };
            if ours[..] != digest[..] {
                // Same size and mtime, different content: send it; the receiver's policy decides.
                return stream_file(shared, record, Vec::new(), unpassed, false).more();
            }
            shared.cache().insert(key, ours.clone());
            *record.digest.lock().unwrap_or_else(|e| e.into_inner()) = Some(ours);
            shared.reporter.on_file_done();
            // On the control connection: on a data connection it could wait behind early
            // blocks of this very file, which the receiver only drops.
            shared
                .control
                .send(Frame::Skipped { file: meta.id })
                .is_ok()
        }
    }
}

/// How a reading of a file ended.
enum Streamed {
    /// Every block it had to send is queued (or it failed and said so): true; or the transfer
    /// is over: false.
    Done(bool),
    /// Read early, a decision came that ends the early reading: `Skip`, `Fail` or `Complete`.
    Decided(Decision),
    /// Read early to the end before any decision came.
    AllEarly,
}

impl Streamed {
    /// Whether the reader goes on with other files; for a reading that was never early.
    fn more(self) -> bool {
        match self {
            Self::Done(more) => more,
            Self::Decided(_) | Self::AllEarly => true,
        }
    }
}

/// The whole-file digest of a source file, read in order.
fn digest_file(shared: &Shared, record: &FileRecord) -> Result<Vec<u8>, FsError> {
    let (file, _) = open_checked(record)?;
    let mut hasher = FileHasher::new(shared.config.checksum);
    let block = shared.block_size();
    let mut offset = 0;
    while offset < record.meta.size {
        let len = (record.meta.size - offset).min(block);
        let data = read_block(&file, offset, len).map_err(|e| FsError::io(&record.meta.path, e))?;
        hasher.update(&data);
        offset += len;
    }
    Ok(hasher.finalize())
}

/// `len` shortened so that `[offset, offset + len)` does not straddle an edge of the
/// receiver's ranges. An earlier session cut its blocks where it was in its own transfer, so
/// its ranges need not end where this session's blocks do, and a block across an edge would
/// be sent whole although part of it is there.
fn clip_to_ranges(have: &[(u64, u64)], offset: u64, len: u64) -> u64 {
    let end = offset.saturating_add(len);
    have.iter()
        .flat_map(|&(s, e)| [s, e])
        .filter(|&edge| edge > offset && edge < end)
        .min()
        .map_or(len, |edge| edge - offset)
}

/// Bytes of one file not yet counted in `passed_bytes`. What is left when the reader is done
/// with the file (sent, found complete at the receiver, skipped, failed midway) is counted
/// then: a file that failed must not keep the rest of the transfer from being cut at its end.
struct Unpassed<'a> {
    counter: &'a AtomicU64,
    left: u64,
}

impl Unpassed<'_> {
    fn pass(&mut self, n: u64) {
        let n = n.min(self.left);
        self.left -= n;
        self.counter.fetch_add(n, Ordering::Relaxed);
    }
}

impl Drop for Unpassed<'_> {
    fn drop(&mut self) {
        self.counter.fetch_add(self.left, Ordering::Relaxed);
    }
}

/// Whether `[start, end)` lies inside one of the receiver's ranges.
fn covered(have: &[(u64, u64)], start: u64, end: u64) -> bool {
    have.iter().any(|&(s, e)| s <= start && end <= e)
}

/// Reads one file in order, hashing all of it, and queues every block the receiver does not
/// already have (`have`), and always the last one (it carries the file digest).
///
/// `early`: the file's decision has not come; blocks go out marked early, and the decision is
/// looked for before each block. `Send` and `Resume` are taken in on the way (the blocks sent
/// so far are all the receiver needs of them, and the digest goes on from where it is); any
/// other ends the reading.
fn stream_file(
    shared: &Shared,
    record: &FileRecord,
    mut have: Vec<(u64, u64)>,
    unpassed: &mut Unpassed<'_>,
    mut early: bool,
) -> Streamed {
    let meta = &record.meta;
    let fail = |code, msg| Streamed::Done(shared.fail_file(record, code, msg));
    let (file, before) = match open_checked(record) {
        Ok(x) => x,
        Err(e) => return fail(e.code(), format!("cannot read {}: {e}", meta.path)),
    };
    if before.kind != Kind::File || before.size != meta.size || before.mtime_ns != meta.mtime_ns {
        return fail(
            ErrorCode::IO,
            format!(
                "{} changed between listing and reading; run again to send it",
                meta.path
            ),
        );
    }
    let mut hasher = FileHasher::new(shared.config.checksum);
    let mut offset = 0u64;
    loop {
        if shared.is_skipped(meta.id) {
            return Streamed::Done(true);
        }
        if early {
            let decided = match shared.take_decision(meta.id) {
                Some(d) => Some(d),
                None if shared.early_room() => None,
                // The early budget is spent: the rest waits for the decision.
                None => match shared.wait_decision(meta.id) {
                    Some(d) => Some(d),
                    None => return Streamed::Done(false),
                },
            };
            match decided {
                None => {}
                Some(Decision::Send) => early = false,
                Some(Decision::Resume { have: h }) => {
                    early = false;
                    have = h;
                }
                Some(d) => return Streamed::Decided(d),
            }
        }
        let have = &have[..];
        let left = meta.size - offset;
        // What the receiver has is read (for the file digest) in whole blocks; the cuts are
        // for what is sent.
        let whole = clip_to_ranges(have, offset, left.min(shared.block_size()));
        let len = if whole < left && covered(have, offset, offset + whole) {
            whole
        } else {
            clip_to_ranges(have, offset, shared.block_len(left))
        };
        let mut data = match read_block(&file, offset, len) {
            Ok(d) => d,
            Err(e) => {
                // A file that shrank under us is a changed file, not a broken disk.
                let now = rustix::fs::fstat(&file).map(|st| Meta::from_stat(&st)).ok();
                let msg = if now != Some(before) {
                    format!(
                        "{} changed while being sent; not stored; run again to send it",
                        meta.path
                    )
                } else {
                    format!("reading {}: {e}", meta.path)
                };
                return fail(ErrorCode::IO, msg);
            }
        };
        shared.read_bytes.fetch_add(len, Ordering::Relaxed);
        unpassed.pass(len);
        hasher.update(&data);
        let digest = block_digest(&data);
        let last = offset + len == meta.size;
        let mut file_digest = None;
        if last {
            // The end of the file: make sure it did not change under us before vouching for it.
            let after = rustix::fs::fstat(&file).map(|st| Meta::from_stat(&st));
            if after.ok() != Some(before) {
                return fail(
                    ErrorCode::IO,
                    format!(
                        "{} changed while being sent; not stored; run again to send it",
                        meta.path
                    ),
                );
            }
            let d = std::mem::replace(&mut hasher, FileHasher::new(ChecksumAlgo::Xxh3)).finalize();
            let bytes = Bytes::from(d.clone());
            *record
                .final_digest
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(bytes.clone());
            shared
                .cache()
                .insert((meta.path.clone(), meta.size, meta.mtime_ns), d.clone());
            *record.digest.lock().unwrap_or_else(|e| e.into_inner()) = Some(d);
            file_digest = Some(bytes);
        }
        if !last && covered(have, offset, offset + len) {
            offset += len;
            continue;
        }
        let seq = shared.block_seq.fetch_add(1, Ordering::Relaxed);
        if len > 0
            && shared
                .corrupt
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&seq)
        {
            data[0] ^= 0xff;
        }
        let frame = Frame::Block(Block {
            file: meta.clone(),
            offset,
            digest,
            file_digest,
            early,
            data: crate::buf::freeze(data),
        });
        if !shared.push(frame) {
            return Streamed::Done(false);
        }
        if early {
            shared.early_sent.fetch_add(len, Ordering::Relaxed);
        }
        offset += len;
        if last {
            // A file sent early is done once its decision says so (`send_file`).
            if early {
                return Streamed::AllEarly;
            }
            shared.reporter.on_file_done();
            return Streamed::Done(true);
        }
    }
}

/// Reads exactly `len` bytes at `offset` into a fresh buffer. The buffer is filled by the
/// kernel without being zeroed first (a memset of every block cost ~8% of the sender's CPU);
/// a file that got shorter is an error, not a short block.
fn read_block(file: &File, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut data = crate::buf::take(len as usize);
    let mut f = file;
    f.seek(SeekFrom::Start(offset))?;
    f.take(len).read_to_end(&mut data)?;
    if data.len() as u64 != len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(data)
}

/// Reads a block again after the receiver found it damaged.
fn resend_block(shared: &Shared, id: FileId, offset: u64, len: u32) -> bool {
    let record = shared
        .records
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&id)
        .cloned();
    let Some(record) = record else {
        shared.error(format!("receiver asked again for unknown file {id:?}"));
        return true;
    };
    let meta = &record.meta;
    let len = u64::from(len).min(meta.size.saturating_sub(offset));
    let result = open_checked(&record).and_then(|(file, now)| {
        let data = read_block(&file, offset, len).map_err(|e| FsError::io(&meta.path, e))?;
        Ok((now, data))
    });
    let (now, data) = match result {
        Ok(x) => x,
        Err(e) => {
            return shared.fail_file(&record, e.code(), format!("re-reading {}: {e}", meta.path))
        }
    };
    if now.size != meta.size || now.mtime_ns != meta.mtime_ns {
        return shared.fail_file(
            &record,
            ErrorCode::IO,
            format!(
                "{} changed while being sent; not stored; run again to send it",
                meta.path
            ),
        );
    }
    let file_digest = if offset + len == meta.size {
        record
            .final_digest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    } else {
        None
    };
    // Asked for again by a receiver that is writing the file: it has its decision.
    let frame = Frame::Block(Block {
        file: meta.clone(),
        offset,
        digest: block_digest(&data),
        file_digest,
        early: false,
        data: crate::buf::freeze(data),
    });
    shared.push(frame)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Blocks of one file of `size` sent alone over `streams` connections.
    fn blocks(size: u64, block: u64, streams: u64) -> Vec<u64> {
        let (mut out, mut offset) = (Vec::new(), 0);
        while offset < size {
            let len = cut(
                size - offset,
                block,
                streams,
                out.len() as u64,
                Some(size - offset),
            );
            assert!(len > 0 && len <= block, "{len} at {offset}");
            out.push(len);
            offset += len;
        }
        assert_eq!(out.iter().sum::<u64>(), size);
        out
    }

    #[test]
    fn a_transfer_starts_and_ends_in_small_blocks() {
        let b = blocks(1 << 30, 8 * MIB, 16);
        // The first round of blocks gives every stream a small one, the next rounds double.
        assert!(b[..16].iter().all(|&l| l == MIN_CUT_BLOCK));
        assert!(b[16..32].iter().all(|&l| l == 2 * MIN_CUT_BLOCK));
        assert!(b.contains(&(8 * MIB)));
        // The last round of blocks is small enough for every stream to finish together.
        assert!(
            b[b.len() - 16..].iter().all(|&l| l <= 2 * MIN_CUT_BLOCK),
            "{:?}",
            &b[b.len() - 16..]
        );
        // The cutting costs blocks, not many: 128 whole blocks would do without it.
        assert!(b.len() < 450, "{} blocks", b.len());
    }

    #[test]
    fn a_tail_block_is_a_share_of_what_is_left() {
        // 64 MiB left over 4 streams: 4 MiB each.
        assert_eq!(cut(1 << 30, 8 * MIB, 4, 1000, Some(64 * MIB)), 4 * MIB);
        // Before the walk is over nothing is known about the tail.
        assert_eq!(cut(1 << 30, 8 * MIB, 4, 1000, None), 8 * MIB);
        // Never below the floor, however little is left.
        assert_eq!(cut(1 << 30, 8 * MIB, 4, 1000, Some(1000)), MIN_CUT_BLOCK);
    }

    #[test]
    fn no_sliver_is_left_behind_a_block() {
        // 300 KiB left of a file: one block, not 256 KiB and then 44 KiB.
        assert_eq!(cut(300 << 10, 8 * MIB, 4, 0, Some(300 << 10)), 300 << 10);
        // A small file is one block.
        assert_eq!(cut(10 << 10, 8 * MIB, 16, 0, None), 10 << 10);
        assert_eq!(cut(0, 8 * MIB, 16, 0, None), 0);
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

    #[test]
    fn a_block_size_below_the_floor_is_kept() {
        assert!(blocks(10 * MIB, 64 << 10, 8).iter().all(|&l| l == 64 << 10));
    }
}
