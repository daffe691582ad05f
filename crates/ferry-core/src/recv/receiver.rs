//! The [`Receiver`] and its public API: frames in, files out, a summary at the end.

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use ferry_proto::{CompleteSummary, FileId, FileMeta, Frame};

use super::commit::CommitHook;
use super::config::{check_writable, Destination, ReceiverConfig, RecvError, MAX_KEPT_ERRORS};
use super::state::{lock, remove_temp, Counters, FileEntry, FinalizeJob, Slot};
use super::stripe::WHOLE_MIN_SIZE;
use crate::digest::{hex, KnownDigests};
use crate::error::FsError;
use crate::filter::Filter;
use crate::path::split_parent;
use crate::report::Reporter;
use crate::root;

/// A running receiver; `handle` may be called from many threads at once.
pub struct Receiver {
    pub(super) dest: Destination,
    pub(super) config: ReceiverConfig,
    pub(super) control: flume::Sender<Frame>,
    pub(super) reporter: Arc<dyn Reporter>,
    pub(super) files: Mutex<HashMap<FileId, Arc<FileEntry>>>,
    /// Destination directories already created and opened: per file, creating the temporary
    /// file is then one `openat` of a single name instead of a confined walk of the whole path.
    /// With each, whether this session made it (see [`Receiver::dir_made`]).
    pub(super) dirs: Mutex<HashMap<String, (Arc<OwnedFd>, bool)>>,
    pub(super) dir_meta: Mutex<Vec<(String, u32, i64)>>,
    pub(super) finalize_tx: Mutex<Option<flume::Sender<FinalizeJob>>>,
    pub(super) finalizer: Mutex<Option<JoinHandle<()>>>,
    pub(super) counters: Counters,
    pub(super) errors: Mutex<Vec<String>>,
    /// Errors beyond [`MAX_KEPT_ERRORS`], counted only.
    pub(super) errors_dropped: AtomicU64,
    /// What the open offers charge (see [`MAX_OPEN_OFFER_BYTES`]).
    pub(super) open_offer_bytes: AtomicU64,
    /// Path and digest of every stored file; spelled in hex only if asked for (`manifest`).
    pub(super) manifest: Mutex<Vec<(String, Vec<u8>)>>,
    /// Whether `manifest` is kept: a server has no use for it (see `forget_manifest`).
    pub(super) keep_manifest: AtomicBool,
    pub(super) complete: AtomicBool,
    /// Numbers temporary names of symlinks, which several writer threads create at once.
    pub(super) next_temp: AtomicU64,
    /// Set when the session is ending: frames still queued are dropped, not acted on.
    pub(super) stopped: AtomicBool,
    pub(super) done_tx: flume::Sender<()>,
    pub(super) done_rx: flume::Receiver<()>,
    /// What this end takes of what the sender offers (`--exclude`/`--include` on a get): the
    /// sender walks everything, and what this refuses is skipped and never made here.
    pub(super) filter: OnceLock<Filter>,
    /// Told of every batch of files renamed into place (a server's catalog).
    pub(super) commit_hook: OnceLock<Arc<dyn CommitHook>>,
    /// Digests of files already here, known without reading them (a server's catalog).
    pub(super) known_digests: OnceLock<Arc<dyn KnownDigests>>,
    /// A striped put's coordinator: every file gets its partial copy under the shared,
    /// journaled name at its decision, so that a stripe host can write any of its blocks.
    pub(super) shared_partials: AtomicBool,
}

impl Receiver {
    /// `control` carries `Resend`, `Skipped` and `FileFailed` back to the sender.
    pub fn new(
        dest: Destination,
        config: ReceiverConfig,
        control: flume::Sender<Frame>,
        reporter: Arc<dyn Reporter>,
    ) -> Result<Arc<Self>, FsError> {
        dest.root.create_dir_all(&dest.base)?;
        check_writable(&dest, config.tag)?;
        let (finalize_tx, finalize_rx) = flume::unbounded::<FinalizeJob>();
        let (done_tx, done_rx) = flume::bounded(1);
        let this = Arc::new(Self {
            dest,
            config,
            control,
            reporter,
            files: Mutex::default(),
            dirs: Mutex::default(),
            dir_meta: Mutex::default(),
            finalize_tx: Mutex::new(Some(finalize_tx)),
            finalizer: Mutex::new(None),
            counters: Counters {
                expected: Mutex::new(None),
                resolved_files: AtomicU64::new(0),
                dirs: AtomicU64::new(0),
                symlinks: AtomicU64::new(0),
                files_done: AtomicU64::new(0),
                bytes_done: AtomicU64::new(0),
                skipped: AtomicU64::new(0),
                failed: AtomicU64::new(0),
                bad_blocks: AtomicU64::new(0),
            },
            errors: Mutex::default(),
            errors_dropped: AtomicU64::new(0),
            open_offer_bytes: AtomicU64::new(0),
            manifest: Mutex::default(),
            keep_manifest: AtomicBool::new(true),
            complete: AtomicBool::new(false),
            next_temp: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
            done_tx,
            done_rx,
            filter: OnceLock::new(),
            commit_hook: OnceLock::new(),
            known_digests: OnceLock::new(),
            shared_partials: AtomicBool::new(false),
        });
        // The finalizer holds only a weak reference so that dropping the receiver ends it.
        let weak = Arc::downgrade(&this);
        let handle = std::thread::Builder::new()
            .name("ferry-finalize".into())
            .spawn(move || Receiver::finalizer(weak, finalize_rx))
            .expect("spawning a thread");
        *lock(&this.finalizer) = Some(handle);
        Ok(this)
    }

    /// Takes only what `filter` admits from now on (set it before the first frame): other
    /// files are answered `Skip`, other directories and symlinks are not made. Only the first
    /// filter set counts.
    pub fn set_filter(&self, filter: Filter) {
        let _ = self.filter.set(filter);
    }

    /// Tells `hook` of every file stored from now on (set it before the first frame): before
    /// each batch is renamed into place and after. Only the first hook set counts.
    pub fn set_commit_hook(&self, hook: Arc<dyn CommitHook>) {
        let _ = self.commit_hook.set(hook);
    }

    /// Takes the digest of a file already here from `known` when it has one for the file's
    /// size and mtime, instead of reading the file (set it before the first frame).
    pub fn set_known_digests(&self, known: Arc<dyn KnownDigests>) {
        let _ = self.known_digests.set(known);
    }

    /// Gives every file of more than [`WHOLE_MIN_SIZE`] its partial copy under the name
    /// derived from its final name, with a journal, at its decision, one-block files too (set
    /// it before the first frame): the coordinator of a striped put, whose stripe hosts then
    /// write those files' every block, the last too (`Capabilities::STRIPE_WHOLE`).
    pub fn share_partials(&self) {
        self.shared_partials.store(true, Ordering::Relaxed);
    }

    /// Whether `size` bytes get a journaled partial copy (see [`Self::share_partials`]).
    pub(super) fn journaled(&self, size: u64) -> bool {
        size > u64::from(self.config.block_size)
            || (size > WHOLE_MIN_SIZE && self.shared_partials.load(Ordering::Relaxed))
    }

    /// Whether the filter leaves out the entry at wire path `path` (or a directory above it).
    pub(super) fn excluded(&self, path: &str, is_dir: bool) -> bool {
        self.filter
            .get()
            .is_some_and(|f| !f.is_empty() && !f.admits(path, is_dir))
    }

    /// Resolves (once) when every announced entry has been stored, skipped or failed.
    pub fn done(&self) -> flume::Receiver<()> {
        self.done_rx.clone()
    }

    /// Files offered and not yet resolved (stored, skipped or failed): the most that blocks
    /// can be written into at once.
    pub fn files_open(&self) -> u64 {
        let offered = lock(&self.files).len() as u64;
        offered.saturating_sub(self.counters.resolved_files.load(Ordering::Acquire))
    }

    /// The sender's totals (`Sent`): from now on completion can be detected.
    pub fn expect(&self, files: u64, dirs: u64, symlinks: u64) {
        *lock(&self.counters.expected) = Some((files, dirs, symlinks));
        self.check_complete();
    }

    /// The session is ending: frames handed in from now on are dropped.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
    }

    /// Handles one frame from a data connection (or a `FileFailed` from the sender).
    pub fn handle(&self, frame: Frame) -> Result<(), RecvError> {
        if self.stopped.load(Ordering::Acquire) {
            return Ok(());
        }
        match frame {
            Frame::Block(b) => self.handle_block(b),
            Frame::Dir {
                path,
                mode,
                mtime_ns,
            } => {
                self.handle_dir(&path, mode, mtime_ns);
                Ok(())
            }
            Frame::Symlink {
                path,
                target,
                mtime_ns,
            } => {
                self.handle_symlink(&path, &target, mtime_ns);
                Ok(())
            }
            Frame::FileFailed { file, message, .. } => {
                self.sender_gave_up(file, &message);
                Ok(())
            }
            Frame::Offer { entries } => self.handle_offer(entries),
            Frame::Skipped { file } => self.confirm_present(file),
            Frame::Landed {
                file,
                offset,
                len,
                digest,
                cvs,
            } => self.handle_landed(super::writing::Landed {
                file,
                offset,
                len,
                digest,
                cvs,
            }),
            Frame::FileDigest { file, digest } => self.handle_file_digest(file, digest),
            _ => Err(RecvError::UnexpectedFrame),
        }
    }

    pub(super) fn error(&self, msg: String) {
        self.reporter.on_file_failed(&msg);
        let mut errors = lock(&self.errors);
        // A peer can make every file fail (bad names, say): the messages, which carry its
        // paths, must not grow without bound.
        if errors.len() < MAX_KEPT_ERRORS {
            errors.push(msg);
        } else {
            self.errors_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether the offer of `id` has been answered: its blocks can be handled. A block sent
    /// early may overtake its offer (blocks and offers travel on different connections); the
    /// driver holds such a block until this is true.
    pub fn offered(&self, id: FileId) -> bool {
        lock(&self.files).contains_key(&id)
    }

    /// The file a block belongs to; it must have been offered, with the same metadata (a
    /// resolved file's entry keeps no path to compare: the block is dropped anyway).
    pub(super) fn lookup(&self, meta: &FileMeta) -> Result<Arc<FileEntry>, RecvError> {
        let entry = lock(&self.files)
            .get(&meta.id)
            .cloned()
            .ok_or(RecvError::Unoffered(meta.id))?;
        if !entry.meta.path.is_empty() && entry.meta != *meta {
            return Err(RecvError::Inconsistent(meta.id));
        }
        Ok(entry)
    }

    /// Creates (`mkdir -p`, confined) and opens a destination directory, once per directory.
    pub(super) fn dir(&self, dir_rel: &str) -> Result<Arc<OwnedFd>, FsError> {
        self.dir_made(dir_rel).map(|(fd, _)| fd)
    }

    /// [`Self::dir`], and whether this session made the directory: it was empty then, so what
    /// is in it came from this session, or from another process since (which a link or a
    /// rename without `--overwrite` still refuses to replace).
    pub(super) fn dir_made(&self, dir_rel: &str) -> Result<(Arc<OwnedFd>, bool), FsError> {
        if let Some(d) = lock(&self.dirs).get(dir_rel) {
            return Ok(d.clone());
        }
        let made = self.dest.root.make_dir_all(dir_rel)?;
        let fd = Arc::new(self.dest.root.open_dir(dir_rel)?);
        let mut dirs = lock(&self.dirs);
        // Two writers may race here: the one whose mkdir made it says so, whichever is first.
        let d = dirs.entry(dir_rel.to_owned()).or_insert((fd, made));
        d.1 |= made;
        Ok(d.clone())
    }

    /// After completion: stops the finalizer, applies directory metadata (deepest first, since
    /// creating entries changes a directory's mtime) and makes the directories durable.
    pub fn finish(&self) -> CompleteSummary {
        lock(&self.finalize_tx).take();
        if let Some(h) = lock(&self.finalizer).take() {
            let _ = h.join();
        }
        let mut dirs = std::mem::take(&mut *lock(&self.dir_meta));
        dirs.sort_by_key(|(rel, _, _)| std::cmp::Reverse(rel.matches('/').count()));
        let mut synced = HashSet::new();
        for (rel, mode, mtime) in &dirs {
            let mode = self.config.modes.apply(*mode);
            if let Err(e) = self.dest.root.set_dir_meta(rel, mode, *mtime) {
                self.error(format!("directory {rel}: {e}"));
            }
            let (parent, _) = split_parent(rel);
            for d in [rel.as_str(), parent] {
                if synced.insert(d.to_owned()) {
                    if let Ok(fd) = self.dest.root.open_dir(d) {
                        let _ = root::fsync(&fd);
                    }
                }
            }
        }
        let c = &self.counters;
        CompleteSummary {
            files: c.files_done.load(Ordering::Relaxed),
            bytes: c.bytes_done.load(Ordering::Relaxed),
            skipped: c.skipped.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            bad_blocks: c.bad_blocks.load(Ordering::Relaxed),
            // The engine measures the load and fills it in.
            receiver: Default::default(),
        }
    }

    /// The transfer broke off: remove the temporary files it created.
    ///
    /// Files already verified and queued for the finalizer are still made durable and renamed
    /// (they are complete and correct, and a re-run need not send them); only files still being
    /// written lose their temporary files.
    pub fn abort(&self) {
        self.stop();
        lock(&self.finalize_tx).take();
        if let Some(h) = lock(&self.finalizer).take() {
            let _ = h.join();
        }
        let files: Vec<_> = lock(&self.files).values().cloned().collect();
        for e in files {
            if let Slot::Writing(w) = &*lock(&e.slot) {
                // Journaled partial copies stay for the next attempt to resume; one-block
                // files are cheaper to send again than to keep.
                if w.journal.is_none() && w.file.is_some() {
                    remove_temp(&w.dir, w.temp_name(), None);
                }
            }
        }
    }

    pub fn errors(&self) -> Vec<String> {
        let mut errors = lock(&self.errors).clone();
        let dropped = self.errors_dropped.load(Ordering::Relaxed);
        if dropped > 0 {
            errors.push(format!("… and {dropped} more errors"));
        }
        errors
    }

    /// Keeps no manifest: a server, which never reports one, would hold a path for every file
    /// a session stores (see [`MAX_OPEN_OFFERS`] for what else a session holds per file).
    pub fn forget_manifest(&self) {
        self.keep_manifest.store(false, Ordering::Relaxed);
    }

    /// `(path under the root, hex digest)` of every stored file, for `--manifest`.
    pub fn manifest(&self) -> Vec<(String, String)> {
        let mut m: Vec<(String, String)> = lock(&self.manifest)
            .iter()
            .map(|(p, d)| (p.clone(), hex(d)))
            .collect();
        m.sort();
        m
    }

    /// Bad blocks seen so far.
    pub fn bad_blocks(&self) -> u64 {
        self.counters.bad_blocks.load(Ordering::Relaxed)
    }
}
