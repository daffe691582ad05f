//! The [`Sender`]: starts the walker, the reader pool and the resend worker, and is how the
//! driver talks to them.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use ferry_proto::{Decision, FileDecision, FileId, Frame};

use super::reading::{resend_block, send_file};
use super::state::{Job, SenderConfig, SenderState, Source, WalkTotals};
use super::walk::{walk, walk_archive};
use crate::archive::Archive;
use crate::filter::Filter;
use crate::gate::Gate;
use crate::report::Reporter;

/// A running sender. Dropping the frame receiver makes every thread stop at its next send.
pub struct Sender {
    shared: Arc<SenderState>,
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
        let all = Filter::default();
        Self::start_filtered(sources, all, config, frames, control, reporter)
    }

    /// [`Sender::start`] sending only what `filter` lets the walk reach: an excluded entry is
    /// neither offered nor counted, and an excluded directory is not entered.
    pub fn start_filtered(
        sources: Vec<Source>,
        filter: Filter,
        config: SenderConfig,
        frames: flume::Sender<Frame>,
        control: flume::Sender<Frame>,
        reporter: Arc<dyn Reporter>,
    ) -> Self {
        let what = (sources, None, filter);
        Self::start_with(what, config, (frames, control), reporter)
    }

    /// Sends the members of `archive` as if they were a walked tree (`put --untar`): each
    /// regular member is a byte range of the archive, read in place by the readers.
    pub fn start_archive(
        archive: Archive,
        config: SenderConfig,
        frames: flume::Sender<Frame>,
        control: flume::Sender<Frame>,
        reporter: Arc<dyn Reporter>,
    ) -> Self {
        let what = (Vec::new(), Some(archive), Filter::default());
        Self::start_with(what, config, (frames, control), reporter)
    }

    fn start_with(
        (sources, archive, filter): (Vec<Source>, Option<Archive>, Filter),
        config: SenderConfig,
        (frames, control): (flume::Sender<Frame>, flume::Sender<Frame>),
        reporter: Arc<dyn Reporter>,
    ) -> Self {
        let corrupt = Mutex::new(config.corrupt_blocks.iter().copied().collect());
        let (block_size, streams) = (config.block_size, u32::from(config.streams));
        let shared = Arc::new(SenderState {
            sources,
            archive,
            filter,
            config,
            frames,
            control,
            decisions: Mutex::default(),
            decided: Condvar::new(),
            closed: AtomicBool::new(false),
            digest_apart: AtomicBool::new(false),
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
            helpers: flume::unbounded(),
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
                    let totals = match &shared.archive {
                        Some(archive) => walk_archive(&shared, archive, &job_tx),
                        None => walk(&shared, &job_tx),
                    };
                    shared.walked.store(true, Ordering::Release);
                    shared.reporter.on_walk_done();
                    let _ = totals_tx.send(totals);
                })
                .expect("spawning a thread")
        };
        let readers = start_readers(&shared, &job_rx);
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

    /// The receiver takes a file's digest apart (`FileDigest` on control, with
    /// `Capabilities::STRIPE_DIGEST`): a file whose every block it has (a `Resume` of all of
    /// it, its blocks fetched from a striped get's stripe hosts) is read and hashed, and only
    /// its digest is sent, not its last block.
    pub fn digest_apart(&self) {
        self.shared.digest_apart.store(true, Ordering::Release);
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

/// A sender dropped without [`Sender::close`] (its session's future was dropped: a
/// third-party copy whose client left) still stops its threads instead of leaving readers
/// waiting for decisions that never come.
impl Drop for Sender {
    fn drop(&mut self) {
        self.close();
    }
}

/// Starts the reader pool: `readers.max()` threads, of which the gate lets the first
/// `readers.active()` take files; the rest are parked until a tuner raises it or the session
/// ends.
fn start_readers(shared: &Arc<SenderState>, jobs: &flume::Receiver<Job>) -> Vec<JoinHandle<()>> {
    (0..shared.config.readers.max())
        .map(|i| {
            let shared = shared.clone();
            let jobs = jobs.clone();
            std::thread::Builder::new()
                .name(format!("ferry-read-{i}"))
                .spawn(move || read_files(&shared, i, &jobs))
                .expect("spawning a thread")
        })
        .collect()
}

/// How often a reader waiting for the walk's next file looks for a file it could help with.
/// A poll, not a select over both queues: flume's `Selector` can lose a message when several
/// threads select on one MPMC channel (zesterer/flume#135), and a lost job is a file never sent.
const HELP_POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// One reader's loop: while the gate lets it work, it helps read a file already started, or
/// else takes the next file from the walk. Ends when the walk is done and its files taken, or
/// the session is over.
fn read_files(shared: &SenderState, i: u32, jobs: &flume::Receiver<Job>) {
    let helpers = &shared.helpers.1;
    while shared.config.readers.wait_turn(i, || shared.is_over()) {
        // A file already started first: its blocks are due now, a new file can wait.
        if let Ok(segments) = helpers.try_recv() {
            segments.help(shared);
            continue;
        }
        match jobs.recv_timeout(HELP_POLL) {
            Ok(job) => {
                if !send_file(shared, &job.record) {
                    break;
                }
                shared.passed_files.fetch_add(1, Ordering::Release);
            }
            Err(flume::RecvTimeoutError::Timeout) => {}
            // The walk is over and its files are taken: help with what is left, then stop.
            Err(flume::RecvTimeoutError::Disconnected) => {
                while let Ok(segments) = helpers.try_recv() {
                    segments.help(shared);
                }
                break;
            }
        }
    }
}
