//! The receiving side: verify each block, write it, and make each file appear under its final
//! name only once it is complete, verified and durable.
//!
//! Per file the receiver goes through these states:
//!
//! ```text
//!   (first frame of the file)
//!        │ exists & policy=skip ──▶ Skipped ─┐
//!        │ exists & policy=fail ──▶ Failed ──┤
//!        ▼                                   │
//!     Writing ── write error / sender gave up ──▶ Failed (temp removed)
//!        │ all bytes written, digest matches     │
//!        ▼                                       │
//!    Finalizing ── (batched: syncfs, rename, fsync dir) ──▶ Done ──▶ resolved
//! ```
//!
//! Data lands in a hidden temporary file `.ferry-<session>-<id>.part` next to the final name;
//! a file of one block gets it from the writer of that block, not with its decision. The file
//! digest of a file written from nothing, larger than 64 KiB, with BLAKE3 (the
//! default) and a block size that is a multiple of 1 KiB, is a tree: each writer hashes the
//! block it writes from memory, in any order, and the chaining values merge into the digest of
//! the whole ([`Blake3Tree`]). Other files (other algorithms, a copy resumed from proven blocks)
//! are hashed in offset order: a block that arrives in order is hashed from memory; a block
//! that arrives ahead of the cursor is written and hashed later by reading it back, which comes
//! from the page cache because it was just written.
//!
//! Durability is grouped: the finalizer takes every file that is ready, makes the batch durable
//! with one `syncfs` (or one `fsync` for a lone file), renames each with `RENAME_NOREPLACE`
//! unless overwriting, then fsyncs each parent directory once. Many small files therefore share
//! one sync latency instead of paying one each in series.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use bytes::Bytes;
use ferry_proto::journal::{decode_journal, JournalHeader, JournalRecord, RECORD_LEN};
use ferry_proto::{
    Block, ChecksumAlgo, CompleteSummary, Decision, ErrorCode, ExistingPolicy, FileDecision,
    FileId, FileMeta, Frame, OfferEntry, MAX_RESUME_RANGES,
};

use crate::digest::{block_digest, hex, Blake3Tree, FileHasher};
use crate::error::FsError;
use crate::path::{join, split_parent, validate_rel};
use crate::report::Reporter;
use crate::root::{self, Root};

/// Where received entries go: `base` (a directory under `root`), with the transfer's top entry
/// optionally renamed (as `cp src dst` does when `dst` is not a directory).
#[derive(Debug)]
pub struct Destination {
    pub root: Root,
    pub base: String,
    pub rename_top: Option<String>,
}

impl Destination {
    /// Maps a wire path to a path under the root, refusing anything that is not plainly relative.
    pub fn map(&self, wire: &str) -> Result<String, FsError> {
        validate_rel(wire)?;
        if wire.is_empty() {
            return Err(FsError::Path(crate::error::PathError::EmptyComponent(
                String::new(),
            )));
        }
        let mapped = match &self.rename_top {
            Some(top) => match wire.split_once('/') {
                Some((_, rest)) => join(top, rest),
                None => top.clone(),
            },
            None => wire.to_owned(),
        };
        Ok(join(&self.base, &mapped))
    }
}

#[derive(Clone, Debug)]
pub struct ReceiverConfig {
    pub existing: ExistingPolicy,
    pub checksum: ChecksumAlgo,
    /// Distinguishes this transfer's temporary files from any other's.
    pub tag: u64,
    /// The session's block size: files larger than one block are journaled for resume, and a
    /// partial copy is resumed only if it was written with the same block size.
    pub block_size: u32,
    /// Which permission bits are stored.
    pub modes: Modes,
    /// Which symlinks are made.
    pub links: Links,
}

/// Which symlinks a receiver makes. A link is stored as its target string and never followed
/// by ferry out of its root, but a program that later reads the tree follows it: a `get` from
/// an untrusted server can plant `x -> /etc/passwd`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Links {
    /// Every link is made as sent (the default, like `cp -r` and `rsync -l`).
    #[default]
    Any,
    /// A link whose target is absolute or climbs out of the transfer's top entry is refused
    /// (`--safe-links`).
    InTree,
}

impl Links {
    /// Whether a link at wire path `path` pointing at `target` is made.
    pub fn allows(self, path: &str, target: &str) -> bool {
        match self {
            Links::Any => true,
            Links::InTree => stays_in_tree(path, target),
        }
    }
}

/// Whether `target`, read from the directory of the link at `path` (a wire path whose first
/// component is the transfer's top entry), stays inside that top entry.
pub fn stays_in_tree(path: &str, target: &str) -> bool {
    if target.starts_with('/') {
        return false;
    }
    let parent = split_parent(path).0;
    let mut depth = parent.split('/').filter(|c| !c.is_empty()).count() as i64 - 1;
    if depth < 0 {
        // A link at the top is the whole transfer: any relative target is beside it.
        return false;
    }
    for c in target.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            _ => depth += 1,
        }
    }
    true
}

/// Which of a sender's permission bits a receiver stores. A peer chooses the modes of what it
/// sends; the receiving host's owner chooses whether setuid, setgid and world-writable bits
/// survive, as `cp` keeps them only with `--preserve`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Modes {
    /// Setuid, setgid and the world-writable bit are cleared (the default).
    #[default]
    Safe,
    /// Every permission bit is kept as sent.
    Keep,
}

impl Modes {
    pub fn apply(self, mode: u32) -> u32 {
        match self {
            Modes::Safe => mode & 0o7777 & !0o6002,
            Modes::Keep => mode & 0o7777,
        }
    }
}

/// A problem that ends the whole transfer, not just one file.
#[derive(Debug, thiserror::Error)]
pub enum RecvError {
    #[error("peer sent a frame that does not belong on a data connection")]
    UnexpectedFrame,
    #[error("peer sent inconsistent metadata for file {0:?}")]
    Inconsistent(FileId),
    #[error("peer sent data for file {0:?}, which it never offered")]
    Unoffered(FileId),
    #[error(
        "peer sent a block of {len} bytes for file {file:?}; this session's block size is {max}"
    )]
    BlockTooLarge { file: FileId, len: u64, max: u32 },
    #[error(
        "peer offered more files ahead of their data than a session may hold ({files} files, \
         {bytes} bytes of paths; at most {MAX_OPEN_OFFERS} files and {MAX_OPEN_OFFER_BYTES} bytes)"
    )]
    TooManyOffers { files: u64, bytes: u64 },
}

/// Offered files a receiver holds at once that are not stored, skipped or failed yet. A sender
/// offers at most about 16,600 files ahead of its data (its walk queue, one offer batch, the
/// files its readers hold): this is four times that, so a peer that offers without sending
/// cannot make a session hold paths without bound (issue 35: 120,064 offers with 3 KB paths
/// took a server from 193 to 833 MB).
pub const MAX_OPEN_OFFERS: u64 = 65_536;

/// Bytes the open offers of a session may charge: each its path plus [`OFFER_COST`]. 16,640
/// offers with paths of the longest kind (4,096 bytes) charge 72 MB.
pub const MAX_OPEN_OFFER_BYTES: u64 = 96 << 20;

/// What an open offer costs beyond its path: its entry and its writing state.
pub const OFFER_COST: u64 = 256;

/// Error messages a receiver keeps for its report; more are counted, not kept.
pub const MAX_KEPT_ERRORS: usize = 1_000;

/// Merged set of byte ranges `[start, end)` written so far.
#[derive(Default, Debug)]
struct Ranges(BTreeMap<u64, u64>);

impl Ranges {
    /// Inserts a range; returns false when it was entirely present already.
    fn insert(&mut self, start: u64, end: u64) -> bool {
        if start == end || self.contains(start, end) {
            return false;
        }
        let (mut s, mut e) = (start, end);
        // Merge with every overlapping or touching neighbour.
        let overlapping: Vec<u64> = self
            .0
            .range(..=end)
            .filter(|(_, &ve)| ve >= start)
            .map(|(&k, _)| k)
            .collect();
        for k in overlapping {
            if let Some(ve) = self.0.remove(&k) {
                s = s.min(k);
                e = e.max(ve);
            }
        }
        self.0.insert(s, e);
        true
    }

    /// Bytes of `[start, end)` not yet in the set.
    fn uncovered(&self, start: u64, end: u64) -> u64 {
        let covered: u64 = self
            .0
            .range(..end)
            .filter(|(_, &e)| e > start)
            .map(|(&s, &e)| e.min(end) - s.max(start))
            .sum();
        (end - start).saturating_sub(covered)
    }

    /// The parts of `[start, end)` not yet in the set, in order.
    fn gaps(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut at = start;
        // The range that holds `start`, if any, then every one that begins inside.
        let first = self.0.range(..=start).next_back().map(|(&s, &e)| (s, e));
        for (s, e) in first
            .into_iter()
            .chain(self.0.range(start + 1..end).map(|(&s, &e)| (s, e)))
        {
            if e <= at {
                continue;
            }
            if s > at {
                out.push((at, s.min(end)));
            }
            at = at.max(e);
            if at >= end {
                break;
            }
        }
        if at < end {
            out.push((at, end));
        }
        out
    }

    fn contains(&self, start: u64, end: u64) -> bool {
        self.0
            .range(..=start)
            .next_back()
            .is_some_and(|(_, &e)| e >= end)
    }

    /// End of the contiguous run that contains `at`, if any.
    fn run_end(&self, at: u64) -> Option<u64> {
        self.0
            .range(..=at)
            .next_back()
            .filter(|(_, &e)| e > at)
            .map(|(_, &e)| e)
    }
}

struct Writing {
    /// The temporary file. A file of one block gets it when that block arrives, from the
    /// writer that writes it: creating it with the decision put one create per file on the
    /// control path, serially, and a tree of 10,000 small files waited there (see
    /// [`Writing::file`]).
    file: Option<Arc<File>>,
    dir: Arc<OwnedFd>,
    dir_rel: String,
    temp: String,
    name: String,
    written: Ranges,
    /// The in-order digest (every file not in tree mode); `None` while a writer reads back
    /// outside the lock, and in tree mode.
    hasher: Option<FileHasher>,
    /// The in-order digest's algorithm while its hasher is not made yet: a file of one block
    /// gets it with its block, like its file. Offers run up to 16,384 files ahead of the data
    /// and a BLAKE3 hasher is ~2 KB: made with the decision, the hashers of a tree of small
    /// files waiting for their blocks grew the heap a page at a time (~6,000 `mprotect`s in a
    /// get of 10,000 files).
    hasher_due: Option<ChecksumAlgo>,
    /// Offset up to which the in-order digest has consumed the data.
    cursor: u64,
    /// BLAKE3 of a fresh file larger than [`Blake3Tree::MIN_SIZE`], put together from each
    /// block as it is written, in any order (see [`Blake3Tree`]); replaces the in-order
    /// digest, so nothing is read back but bytes at unaligned block edges.
    tree: Option<Box<Blake3Tree>>,
    expected: Option<Bytes>,
    /// Resume journal, for files larger than one block.
    journal: Option<JournalFile>,
    /// Writes under way outside the lock. The file is verified and handed on only once none
    /// is: a copy of a block (the sender's endgame) written after the file was finalized would
    /// reset the mtime just set and, for a non-root receiver, clear setuid/setgid bits.
    inflight: u32,
    /// The byte ranges those writes hold: a block overlapping them (or what is written) writes
    /// only its other bytes, so every byte of the file is written once and the digest is of
    /// the bytes stored, whatever a peer sends over them.
    reserved: Vec<(u64, u64)>,
}

/// The parts of `[start, end)` that neither `written` nor any of `reserved` covers.
fn free_parts(written: &Ranges, reserved: &[(u64, u64)], start: u64, end: u64) -> Vec<(u64, u64)> {
    let mut parts = written.gaps(start, end);
    for &(rs, re) in reserved {
        parts = parts
            .into_iter()
            .flat_map(|(s, e)| {
                if re <= s || rs >= e {
                    vec![(s, e)]
                } else {
                    [(s, rs.max(s)), (re.min(e), e)]
                        .into_iter()
                        .filter(|(a, b)| a < b)
                        .collect()
                }
            })
            .collect();
    }
    parts
}

impl Writing {
    /// The temporary file, created (exclusively: the name is this session's) on first use.
    /// A file that fails or is aborted before any of it arrived has nothing to remove, and
    /// `fail` and `abort` remove only a file that was made.
    fn file(&mut self) -> std::io::Result<Arc<File>> {
        if let Some(f) = &self.file {
            return Ok(f.clone());
        }
        let flags = root::OFlags::RDWR | root::OFlags::CREATE | root::OFlags::EXCL;
        let f = Arc::new(File::from(root::open_in(
            &self.dir, &self.temp, flags, 0o600,
        )?));
        self.file = Some(f.clone());
        Ok(f)
    }
}

/// An open, locked resume journal and where its next record goes.
struct JournalFile {
    file: File,
    name: String,
    end: u64,
}

enum Slot {
    /// A file with the offered size and mtime is already in place; the sender compares digests
    /// and answers with `Skipped` (identical) or with the data (different).
    Present,
    Writing(Box<Writing>),
    Finalizing,
    Done,
    Skipped,
    Failed,
}

struct FileEntry {
    meta: FileMeta,
    slot: Mutex<Slot>,
}

/// The entry of a resolved file: its state and metadata without the path.
fn shed_entry(meta: &FileMeta, slot: Slot) -> FileEntry {
    FileEntry {
        meta: FileMeta {
            id: meta.id,
            path: String::new(),
            size: meta.size,
            mode: meta.mode,
            mtime_ns: meta.mtime_ns,
        },
        slot: Mutex::new(slot),
    }
}

struct FinalizeJob {
    file: Arc<File>,
    dir: Arc<OwnedFd>,
    dir_rel: String,
    temp: String,
    name: String,
    meta: FileMeta,
    digest: Vec<u8>,
    /// Removed once the file has its final name; holding it keeps the lock until then.
    journal: Option<JournalFile>,
}

struct Counters {
    expected: Mutex<Option<(u64, u64, u64)>>,
    resolved_files: AtomicU64,
    dirs: AtomicU64,
    symlinks: AtomicU64,
    files_done: AtomicU64,
    bytes_done: AtomicU64,
    skipped: AtomicU64,
    failed: AtomicU64,
    bad_blocks: AtomicU64,
}

/// A running receiver; `handle` may be called from many threads at once.
pub struct Receiver {
    dest: Destination,
    config: ReceiverConfig,
    control: flume::Sender<Frame>,
    reporter: Arc<dyn Reporter>,
    files: Mutex<HashMap<FileId, Arc<FileEntry>>>,
    /// Destination directories already created and opened: per file, creating the temporary
    /// file is then one `openat` of a single name instead of a confined walk of the whole path.
    dirs: Mutex<HashMap<String, Arc<OwnedFd>>>,
    dir_meta: Mutex<Vec<(String, u32, i64)>>,
    finalize_tx: Mutex<Option<flume::Sender<FinalizeJob>>>,
    finalizer: Mutex<Option<JoinHandle<()>>>,
    counters: Counters,
    errors: Mutex<Vec<String>>,
    /// Errors beyond [`MAX_KEPT_ERRORS`], counted only.
    errors_dropped: AtomicU64,
    /// What the open offers charge (see [`MAX_OPEN_OFFER_BYTES`]).
    open_offer_bytes: AtomicU64,
    /// Path and digest of every stored file; spelled in hex only if asked for (`manifest`).
    manifest: Mutex<Vec<(String, Vec<u8>)>>,
    /// Whether `manifest` is kept: a server has no use for it (see `forget_manifest`).
    keep_manifest: AtomicBool,
    complete: AtomicBool,
    /// Numbers temporary names of symlinks, which several writer threads create at once.
    next_temp: AtomicU64,
    /// Set when the session is ending: frames still queued are dropped, not acted on.
    stopped: AtomicBool,
    done_tx: flume::Sender<()>,
    done_rx: flume::Receiver<()>,
}

/// Free space left for the files of one offer, per file system: read once (`statfs` of the
/// first directory seen on it) and charged with each file accepted.
#[derive(Default)]
struct SpaceBudget {
    /// Directory (relative to the destination) to the file system it is on; `None` if the
    /// file system could not say how much is free.
    dirs: HashMap<String, Option<SpaceKey>>,
    left: HashMap<SpaceKey, u64>,
}

/// A file system by its id; one that reports no id (0) is counted per directory.
#[derive(Clone, PartialEq, Eq, Hash)]
enum SpaceKey {
    Fs(u64),
    Dir(String),
}

impl SpaceBudget {
    /// Bytes still free on `dir`'s file system for this offer, or `None` if unknown.
    fn left(&mut self, dir: &OwnedFd, dir_rel: &str) -> Option<&mut u64> {
        let key = match self.dirs.get(dir_rel) {
            Some(key) => key.clone()?,
            None => {
                let st = rustix::fs::fstatvfs(dir).ok();
                let key = st.as_ref().map(|st| match st.f_fsid {
                    0 => SpaceKey::Dir(dir_rel.to_owned()),
                    id => SpaceKey::Fs(id),
                });
                self.dirs.insert(dir_rel.to_owned(), key.clone());
                let (st, key) = (st?, key?);
                self.left
                    .entry(key.clone())
                    .or_insert(st.f_bavail.saturating_mul(st.f_frsize));
                key
            }
        };
        self.left.get_mut(&key)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
        });
        // The finalizer holds only a weak reference so that dropping the receiver ends it.
        let weak = Arc::downgrade(&this);
        let handle = std::thread::Builder::new()
            .name("ferry-finalize".into())
            .spawn(move || finalizer(weak, finalize_rx))
            .expect("spawning a thread");
        *lock(&this.finalizer) = Some(handle);
        Ok(this)
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
            _ => Err(RecvError::UnexpectedFrame),
        }
    }

    fn error(&self, msg: String) {
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

    fn handle_block(&self, block: Block) -> Result<(), RecvError> {
        let id = block.file.id;
        let len = block.data.len() as u64;
        // The session's memory budget is sized in blocks of the agreed size: a peer that sends
        // larger ones breaks the protocol, whatever the wire's own 64 MiB limit allows.
        if len > u64::from(self.config.block_size) {
            return Err(RecvError::BlockTooLarge {
                file: id,
                len,
                max: self.config.block_size,
            });
        }
        let entry = self.lookup(&block.file)?;
        if block.early && !matches!(*lock(&entry.slot), Slot::Writing(_)) {
            // Sent before the sender knew the decision, for a file not being received (in
            // place already, skipped, failed, or done by the copies of it that came after).
            return Ok(());
        }
        if block_digest(&block.data) != block.digest {
            self.counters.bad_blocks.fetch_add(1, Ordering::Relaxed);
            self.reporter.on_bad_block();
            let _ = self.control.send(Frame::Resend {
                file: id,
                offset: block.offset,
                len: len as u32,
            });
            return Ok(());
        }
        let mut slot = lock(&entry.slot);
        if matches!(*slot, Slot::Present) {
            if block.early {
                return Ok(()); // the sender compares digests first; see above
            }
            // Same size and mtime as ours, different content: the policy decides.
            if self.config.existing != ExistingPolicy::Overwrite {
                drop(slot);
                let msg = format!(
                    "{}: exists with the same size and mtime but different content \
                     (use --overwrite to replace it)",
                    entry.meta.path
                );
                self.fail(&entry, ErrorCode::EXISTS, msg, true);
                return Ok(());
            }
            match self.open_writing(&entry.meta, false) {
                Ok(w) => *slot = Slot::Writing(Box::new(w)),
                Err((code, msg)) => {
                    *slot = Slot::Failed;
                    drop(slot);
                    self.mark_failed(block.file.id, code, msg, true);
                    return Ok(());
                }
            }
        }
        let Slot::Writing(w) = &mut *slot else {
            return Ok(()); // skipped, failed or already done: late or duplicate block
        };
        if let Some(d) = block.file_digest.clone() {
            w.expected = Some(d);
        }
        let end = block.offset + len;
        let parts = free_parts(&w.written, &w.reserved, block.offset, end);
        if parts.is_empty() && len > 0 {
            // Already here (or being written by another copy): after a resume, the last block
            // comes again for its file digest even when the receiver has it, and it may be the
            // last block to arrive (or the only one, when the partial copy was whole). It
            // completes the file then.
            self.advance(&entry, slot, None);
            return Ok(());
        }
        // A block that overlaps bytes already written, or being written, writes only its own:
        // an honest copy carries the same bytes there, and a peer that sends others cannot
        // make the stored bytes differ from the ones digested.
        let whole = parts.len() <= 1 && parts.first().is_none_or(|&p| p == (block.offset, end));
        let file = match w.file() {
            Ok(f) => f,
            Err(e) => {
                let (code, msg) = cannot_create(&entry.meta.path, &w.dir_rel, e);
                drop(slot);
                self.fail(&entry, code, msg, true);
                return Ok(());
            }
        };
        let tree = w.tree.is_some();
        w.inflight += 1;
        w.reserved.extend_from_slice(&parts);
        // Write (and hash, in tree mode) without holding the slot, so other blocks of the same
        // file proceed in parallel.
        drop(slot);
        let mut pieces = Vec::new();
        let mut write = Ok(());
        for &(s, e) in &parts {
            let data = &block.data[(s - block.offset) as usize..(e - block.offset) as usize];
            write = file.write_all_at(data, s);
            if write.is_err() {
                break;
            }
            if tree {
                pieces.extend(Blake3Tree::pieces(entry.meta.size, s, data));
            }
        }
        let mut slot = lock(&entry.slot);
        let Slot::Writing(w) = &mut *slot else {
            return Ok(());
        };
        w.inflight -= 1;
        for p in &parts {
            if let Some(i) = w.reserved.iter().position(|r| r == p) {
                w.reserved.swap_remove(i);
            }
        }
        if let Err(e) = write {
            let msg = format!("writing {}: {e}", entry.meta.path);
            let code = FsError::io(&entry.meta.path, e).code();
            drop(slot);
            self.fail(&entry, code, msg, true);
            return Ok(());
        }
        if let Some(t) = w.tree.as_mut() {
            for p in pieces {
                t.insert(p);
            }
        }
        // A copy of a block can arrive on two connections (the sender's endgame) and both may
        // be written before either is recorded: the second counts for nothing.
        let mut new = 0;
        for &(s, e) in &parts {
            new += w.written.uncovered(s, e);
            w.written.insert(s, e);
        }
        if new == 0 && len > 0 {
            self.advance(&entry, slot, None);
            return Ok(());
        }
        if !whole {
            // Hashed from what was stored, read back; not journaled (a record claims the
            // block's digest for all its bytes): after a crash it is sent again.
            self.reporter.on_bytes(new);
            self.advance(&entry, slot, None);
            return Ok(());
        }
        if let Some(j) = w.journal.as_mut() {
            // After the data: a record never claims a block that was not written. A failed
            // append only costs a re-send after a crash, so it does not fail the file.
            let rec = JournalRecord {
                offset: block.offset,
                len: len as u32,
                digest: block.digest,
            };
            let mut buf = bytes::BytesMut::with_capacity(RECORD_LEN);
            rec.encode(&mut buf);
            if j.file.write_all_at(&buf, j.end).is_ok() {
                j.end += RECORD_LEN as u64;
            }
        }
        // Only what no earlier copy or piece of it covered.
        self.reporter.on_bytes(new);
        self.advance(&entry, slot, Some((block.offset, &block.data)));
        Ok(())
    }

    /// Feeds the in-order digest with what has been written from its cursor on and, once the
    /// whole file is hashed (in tree mode: written) and its digest has arrived, hands it to
    /// verification. `slot` holds the file's `Writing` state; `fresh` is the block just
    /// written.
    ///
    /// The block just written, when it is next, is hashed from memory under the file's lock:
    /// blocks arrive nearly in order, so that is most of the bytes, with no read-back, and
    /// the other writers wait only for one block's hash. Data written ahead of a gap that
    /// has just closed is read back and hashed outside the lock: one writer takes the hasher
    /// out, hashes, puts it back and looks again, while the others go on writing and leave
    /// their blocks to it (each is in `written` before this is called). Under the lock, a gap
    /// closing 120 MiB behind the newest block held every writer of the file for the 115 ms
    /// of the read-back (1 GiB put at 100 ms on the bed), and the full writer queues that such
    /// stalls leave are what drew the writer tuner to probe more writers (`drive_receiver`).
    fn advance<'e>(
        &self,
        entry: &'e FileEntry,
        mut slot: MutexGuard<'e, Slot>,
        mut fresh: Option<(u64, &[u8])>,
    ) {
        loop {
            let Slot::Writing(w) = &mut *slot else {
                return;
            };
            if w.tree.is_some() {
                break; // each writer hashed its own block
            }
            if let Some(algo) = w.hasher_due.take() {
                w.hasher = Some(FileHasher::new(algo));
            }
            match (fresh.take(), w.hasher.as_mut()) {
                (Some((offset, data)), Some(h)) if offset == w.cursor => {
                    h.update(data);
                    w.cursor += data.len() as u64;
                }
                _ => {}
            }
            let from = w.cursor;
            let Some(end) = w.written.run_end(from) else {
                break;
            };
            let Some(mut hasher) = w.hasher.take() else {
                return; // another writer is reading back; it will look again
            };
            let file = w.file();
            drop(slot);
            let hashed = file.and_then(|f| hash_back(&f, &mut hasher, from, end));
            slot = lock(&entry.slot);
            let Slot::Writing(w) = &mut *slot else {
                return; // failed or aborted meanwhile
            };
            w.hasher = Some(hasher);
            if let Err(e) = hashed {
                let msg = format!("reading back {}: {e}", entry.meta.path);
                drop(slot);
                self.fail(entry, ErrorCode::IO, msg, true);
                return;
            }
            w.cursor = end;
        }
        let Slot::Writing(w) = &mut *slot else {
            return;
        };
        let hashed = match w.tree {
            Some(_) => w.written.contains(0, entry.meta.size),
            None => w.cursor == entry.meta.size && w.hasher.is_some(),
        };
        if hashed && w.expected.is_some() && w.inflight == 0 {
            let Slot::Writing(w) = std::mem::replace(&mut *slot, Slot::Finalizing) else {
                unreachable!("matched Writing above")
            };
            drop(slot);
            self.verify_and_queue(entry, *w);
        }
    }

    fn verify_and_queue(&self, entry: &FileEntry, mut w: Writing) {
        // A block of it was written by now, so its file exists and this only hands it out.
        let file = match w.file() {
            Ok(f) => f,
            Err(e) => {
                *lock(&entry.slot) = Slot::Writing(Box::new(w));
                let msg = format!("{}: creating it: {e}", entry.meta.path);
                self.fail(entry, ErrorCode::IO, msg, true);
                return;
            }
        };
        let digest = match w.tree.take() {
            Some(tree) => match finish_tree(&file, *tree) {
                Ok(d) => d,
                Err(e) => {
                    *lock(&entry.slot) = Slot::Writing(Box::new(w));
                    let msg = format!("reading back {}: {e}", entry.meta.path);
                    self.fail(entry, ErrorCode::IO, msg, true);
                    return;
                }
            },
            None => w
                .hasher
                .take()
                .map(FileHasher::finalize)
                .unwrap_or_default(),
        };
        if Some(digest.as_slice()) != w.expected.as_deref() {
            *lock(&entry.slot) = Slot::Writing(Box::new(w));
            self.fail(
                entry,
                ErrorCode::CORRUPT,
                format!(
                    "{}: file digest does not match the sender's; not stored",
                    entry.meta.path
                ),
                true,
            );
            return;
        }
        let job = FinalizeJob {
            file,
            dir: w.dir,
            dir_rel: w.dir_rel,
            temp: w.temp,
            name: w.name,
            meta: entry.meta.clone(),
            digest,
            journal: w.journal,
        };
        let finalizer = lock(&self.finalize_tx).clone();
        match finalizer {
            Some(tx) => {
                let _ = tx.send(job);
            }
            // Already aborted: a journaled copy stays for a re-run; any other is removed.
            None if job.journal.is_some() => {}
            None => remove_temp(&job.dir, &job.temp, None),
        }
    }

    /// Answers a batch of offers with one `Decisions` frame per batch. Fails the session when
    /// the files offered and still open would exceed what a session may hold
    /// ([`MAX_OPEN_OFFERS`], [`MAX_OPEN_OFFER_BYTES`]).
    fn handle_offer(&self, entries: Vec<OfferEntry>) -> Result<(), RecvError> {
        let started = std::time::Instant::now();
        let offered = entries.len();
        let mut out = Vec::with_capacity(entries.len());
        let mut space = SpaceBudget::default();
        for offer in entries {
            let meta = FileMeta {
                id: offer.file,
                path: offer.path,
                size: offer.size,
                mode: offer.mode,
                mtime_ns: offer.mtime_ns,
            };
            if lock(&self.files).contains_key(&meta.id) {
                continue; // offered twice: the first answer stands
            }
            let charge = meta.path.len() as u64 + OFFER_COST;
            let (open, bytes) = (
                self.files_open(),
                self.open_offer_bytes.load(Ordering::Acquire),
            );
            if open >= MAX_OPEN_OFFERS || bytes + charge > MAX_OPEN_OFFER_BYTES {
                if !out.is_empty() {
                    let _ = self.control.send(Frame::Decisions { entries: out });
                }
                return Err(RecvError::TooManyOffers { files: open, bytes });
            }
            let (slot, decision) = self.decide(&meta, &mut space);
            let resolved = matches!(slot, Slot::Skipped | Slot::Failed);
            // A file resolved at once keeps no path (see `shed`); an open one is charged
            // until it resolves.
            let entry = if resolved {
                shed_entry(&meta, slot)
            } else {
                self.open_offer_bytes.fetch_add(charge, Ordering::AcqRel);
                FileEntry {
                    meta: meta.clone(),
                    slot: Mutex::new(slot),
                }
            };
            lock(&self.files).insert(meta.id, Arc::new(entry));
            match &decision {
                Decision::Skip => {
                    self.counters.skipped.fetch_add(1, Ordering::Relaxed);
                }
                Decision::Fail { message, .. } => {
                    self.counters.failed.fetch_add(1, Ordering::Relaxed);
                    self.error(message.clone());
                }
                _ => {}
            }
            if resolved {
                self.resolved(meta.id);
            }
            out.push(FileDecision {
                file: meta.id,
                decision,
            });
        }
        tracing::debug!(
            offered,
            decided = out.len(),
            first = out.first().map(|d| d.file.0),
            ms = started.elapsed().as_millis() as u64,
            "decisions"
        );
        if !out.is_empty() {
            let _ = self.control.send(Frame::Decisions { entries: out });
        }
        Ok(())
    }

    /// What to ask of one offered file, and the state the file starts in.
    fn decide(&self, meta: &FileMeta, space: &mut SpaceBudget) -> (Slot, Decision) {
        let fail =
            |code: ErrorCode, message: String| (Slot::Failed, Decision::Fail { code, message });
        let rel = match self.dest.map(&meta.path) {
            Ok(r) => r,
            Err(e) => return fail(e.code(), format!("{}: {e}", meta.path)),
        };
        let (dir_rel, name) = split_parent(&rel);
        let dir = match self.dir(dir_rel) {
            Ok(d) => d,
            Err(e) => return fail(e.code(), format!("{}: {e}", meta.path)),
        };
        match root::lstat_in(&dir, name) {
            Ok(m) if m.kind == root::Kind::Dir => {
                return fail(
                    ErrorCode::EXISTS,
                    format!("{rel}: a directory is in the way"),
                );
            }
            Ok(_) if self.config.existing == ExistingPolicy::Skip => {
                return (Slot::Skipped, Decision::Skip)
            }
            Ok(m)
                if m.kind == root::Kind::File
                    && m.size == meta.size
                    && m.mtime_ns == meta.mtime_ns =>
            {
                // Probably the same file (a re-run): prove it by digest before skipping it.
                match self.digest_existing(&dir, name) {
                    Ok(digest) => {
                        return (
                            Slot::Present,
                            Decision::Complete {
                                digest: digest.into(),
                            },
                        )
                    }
                    Err(e) => {
                        return fail(ErrorCode::IO, format!("{rel}: reading it to compare: {e}"))
                    }
                }
            }
            Ok(_) if self.config.existing == ExistingPolicy::Fail => {
                return fail(
                    ErrorCode::EXISTS,
                    format!("{rel}: exists (use --overwrite or --skip-existing)"),
                );
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return fail(ErrorCode::IO, format!("{rel}: {e}")),
        }
        if let Err(message) = self.check_space(&dir, dir_rel, &rel, name, meta.size, space) {
            return fail(ErrorCode::NO_SPACE, message);
        }
        match self.open_writing(meta, true) {
            Ok(w) => {
                let have: Vec<(u64, u64)> = w
                    .written
                    .0
                    .iter()
                    .map(|(&s, &e)| (s, e))
                    .take(MAX_RESUME_RANGES)
                    .collect();
                let decision = if have.is_empty() {
                    Decision::Send
                } else {
                    Decision::Resume { have }
                };
                (Slot::Writing(Box::new(w)), decision)
            }
            Err((code, message)) => fail(code, message),
        }
    }

    /// Refuses a file the destination file system cannot hold, before anything is created for
    /// it. Nothing is preallocated, so without this a peer that offers a petabyte would only be
    /// stopped by `ENOSPC` after filling the disk that other transfers share; with it the sender
    /// learns at once, with the numbers, and can pick another destination.
    ///
    /// Bytes that a resumable partial copy already occupies count as available, so a resume on
    /// a nearly full disk is not refused for space it needs no more of. `f_bavail` (what an
    /// unprivileged writer may use) is the conservative figure even for a root server. If the
    /// file system cannot say, the writes decide.
    ///
    /// The files of one offer are charged against one reading of the free space: a thousand
    /// files that each fit but together do not are refused from the first that does not, and
    /// a tree of small files costs one `statfs` per directory and offer, not one per file.
    fn check_space(
        &self,
        dir: &OwnedFd,
        dir_rel: &str,
        rel: &str,
        name: &str,
        size: u64,
        space: &mut SpaceBudget,
    ) -> Result<(), String> {
        if size == 0 {
            return Ok(());
        }
        let Some(left) = space.left(dir, dir_rel) else {
            return Ok(());
        };
        let available = *left;
        if size <= available {
            *left = available - size;
            return Ok(());
        }
        let partial = if size > u64::from(self.config.block_size) {
            rustix::fs::statat(
                dir,
                journaled_temp(name).as_str(),
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            )
            .map(|st| u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512))
            .unwrap_or(0)
        } else {
            0
        };
        if size <= available.saturating_add(partial) {
            *left = available.saturating_sub(size.saturating_sub(partial));
            return Ok(());
        }
        Err(format!(
            "{rel}: no space: the file is {size} bytes, the destination file system has {available} \
             bytes available"
        ))
    }

    /// Digest of a file already at the destination, with the transfer's algorithm.
    fn digest_existing(&self, dir: &OwnedFd, name: &str) -> std::io::Result<Vec<u8>> {
        let file = File::from(root::open_in(dir, name, root::OFlags::RDONLY, 0)?);
        let mut h = FileHasher::new(self.config.checksum);
        let mut buf = vec![0u8; 1 << 20];
        let mut off = 0u64;
        loop {
            let n = file.read_at(&mut buf, off)?;
            if n == 0 {
                return Ok(h.finalize());
            }
            h.update(&buf[..n]);
            off += n as u64;
        }
    }

    /// The sender found its file identical to the one in place: nothing more comes for it.
    fn confirm_present(&self, id: FileId) -> Result<(), RecvError> {
        let entry = lock(&self.files)
            .get(&id)
            .cloned()
            .ok_or(RecvError::Unoffered(id))?;
        let mut slot = lock(&entry.slot);
        if matches!(*slot, Slot::Present) {
            *slot = Slot::Skipped;
            drop(slot);
            self.counters.skipped.fetch_add(1, Ordering::Relaxed);
            self.reporter.on_file_done();
            self.resolved(id);
        }
        Ok(())
    }

    /// Whether the offer of `id` has been answered: its blocks can be handled. A block sent
    /// early may overtake its offer (blocks and offers travel on different connections); the
    /// driver holds such a block until this is true.
    pub fn offered(&self, id: FileId) -> bool {
        lock(&self.files).contains_key(&id)
    }

    /// The file a block belongs to; it must have been offered, with the same metadata (a
    /// resolved file's entry keeps no path to compare: the block is dropped anyway).
    fn lookup(&self, meta: &FileMeta) -> Result<Arc<FileEntry>, RecvError> {
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
    fn dir(&self, dir_rel: &str) -> Result<Arc<OwnedFd>, FsError> {
        if let Some(d) = lock(&self.dirs).get(dir_rel) {
            return Ok(d.clone());
        }
        self.dest.root.create_dir_all(dir_rel)?;
        let fd = Arc::new(self.dest.root.open_dir(dir_rel)?);
        lock(&self.dirs).insert(dir_rel.to_owned(), fd.clone());
        Ok(fd)
    }

    /// Opens the temporary file of `meta`. A file of one block gets a name unique to this
    /// session and no journal: it is all or nothing. A larger file gets a name derived from its
    /// final name and a locked journal beside it, and, if `resume` and a partial copy from an
    /// earlier attempt matches (same size, mtime, mode, block size and digest algorithm), starts
    /// from the blocks of it that still match their recorded digests.
    fn open_writing(&self, meta: &FileMeta, resume: bool) -> Result<Writing, (ErrorCode, String)> {
        let fail = |e: FsError| (e.code(), format!("{}: {e}", meta.path));
        let rel = self.dest.map(&meta.path).map_err(fail)?;
        let (dir_rel, name) = split_parent(&rel);
        let dir = self.dir(dir_rel).map_err(fail)?;
        let io = |what: &str, e: std::io::Error| fail(FsError::io(join(dir_rel, what), e));
        // Without its file (one block: made with the block), without its hasher too.
        let writing = |file: Option<File>, temp: String, journal: Option<JournalFile>| Writing {
            hasher: file
                .is_some()
                .then(|| FileHasher::new(self.config.checksum)),
            hasher_due: file.is_none().then_some(self.config.checksum),
            file: file.map(Arc::new),
            dir: dir.clone(),
            dir_rel: dir_rel.to_owned(),
            temp,
            name: name.to_owned(),
            written: Ranges::default(),
            cursor: 0,
            tree: None,
            expected: None,
            journal,
            inflight: 0,
            reserved: Vec::new(),
        };
        if meta.size <= u64::from(self.config.block_size) {
            // Created with its first block (`Writing::file`).
            let temp = format!(".ferry-{:016x}-{}.part", self.config.tag, meta.id.0);
            return Ok(self.fresh_digest(writing(None, temp, None), meta.size));
        }
        let temp = journaled_temp(name);
        let jname = journal_name(name);
        let flags = root::OFlags::RDWR | root::OFlags::CREATE;
        let jfd = root::open_in(&dir, &jname, flags, 0o600)
            .map_err(|e| cannot_create(&meta.path, dir_rel, e))?;
        // A session that just broke off may still be letting go of it: wait a little, bounded.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while rustix::fs::flock(&jfd, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err()
        {
            if std::time::Instant::now() >= deadline {
                return Err((
                    ErrorCode::BUSY,
                    format!("{rel}: another transfer is writing it right now"),
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let jfile = File::from(jfd);
        let header = JournalHeader {
            size: meta.size,
            mtime_ns: meta.mtime_ns,
            mode: meta.mode,
            block_size: self.config.block_size,
            checksum: self.config.checksum,
            path: rel.clone(),
        };
        let resumed = if resume {
            self.try_resume(&dir, &temp, &jfile, &header)
        } else {
            None
        };
        let (file, records) = match resumed {
            Some(x) => x,
            None => {
                let flags = root::OFlags::RDWR | root::OFlags::CREATE | root::OFlags::TRUNC;
                let fd = root::open_in(&dir, &temp, flags, 0o600)
                    .map_err(|e| cannot_create(&meta.path, dir_rel, e))?;
                (File::from(fd), Vec::new())
            }
        };
        // Rewrite the journal from what was proven, so appends follow valid records only.
        let mut buf = bytes::BytesMut::new();
        header.encode(&mut buf);
        for rec in &records {
            rec.encode(&mut buf);
        }
        jfile
            .set_len(0)
            .and_then(|()| jfile.write_all_at(&buf, 0))
            .map_err(|e| io(&jname, e))?;
        let journal = JournalFile {
            file: jfile,
            name: jname,
            end: buf.len() as u64,
        };
        let mut w = writing(Some(file), temp, Some(journal));
        if records.is_empty() {
            return Ok(self.fresh_digest(w, meta.size));
        }
        for rec in &records {
            w.written
                .insert(rec.offset, rec.offset + u64::from(rec.len));
        }
        // Hash the proven prefix now, so the digest is ready to go on when the rest arrives.
        catch_up(&mut w).map_err(|e| io(&w.temp, e))?;
        Ok(w)
    }

    /// A file written from nothing is hashed as a BLAKE3 tree when that is its digest, it is
    /// large enough to come in several blocks, and the session's blocks are cut on BLAKE3's
    /// 1 KiB chunk edges (any `--block-size` that is a multiple of 1 KiB: then every cut is,
    /// and nothing is read back); otherwise in order.
    fn fresh_digest(&self, mut w: Writing, size: u64) -> Writing {
        if self.config.checksum == ChecksumAlgo::Blake3
            && u64::from(self.config.block_size).is_multiple_of(blake3::CHUNK_LEN as u64)
        {
            if let Some(tree) = Blake3Tree::new(size) {
                w.tree = Some(Box::new(tree));
                w.hasher = None;
                w.hasher_due = None;
            }
        }
        w
    }

    /// Reads an earlier attempt's journal and keeps the records whose blocks still match.
    fn try_resume(
        &self,
        dir: &OwnedFd,
        temp: &str,
        journal: &File,
        header: &JournalHeader,
    ) -> Option<(File, Vec<JournalRecord>)> {
        let len = journal.metadata().ok()?.len();
        if len == 0 || len > (64 << 20) {
            return None;
        }
        let mut bytes = vec![0u8; len as usize];
        journal.read_exact_at(&mut bytes, 0).ok()?;
        let parsed = decode_journal(&bytes).ok()?;
        if parsed.header != *header {
            return None;
        }
        let file = File::from(root::open_in(dir, temp, root::OFlags::RDWR, 0).ok()?);
        let mut records = parsed.records;
        // Blocks are cut differently from one session to the next, so two records may start
        // at one offset with different lengths: both are checked, only exact repeats go.
        records.sort_by_key(|r| (r.offset, r.len));
        records.dedup_by_key(|r| (r.offset, r.len));
        let mut kept = Vec::with_capacity(records.len());
        let mut buf = Vec::new();
        for rec in records {
            buf.resize(rec.len as usize, 0);
            // A record whose data did not survive (crash before writeback) fails here and is
            // simply sent again.
            if file.read_exact_at(&mut buf, rec.offset).is_ok() && block_digest(&buf) == rec.digest
            {
                kept.push(rec);
            }
        }
        Some((file, kept))
    }

    /// Marks a file that is being written failed and removes its temporary file; a file in
    /// any other state keeps it (a late failure cannot undo a file already stored).
    fn fail(&self, entry: &FileEntry, code: ErrorCode, msg: String, tell: bool) {
        let old = std::mem::replace(&mut *lock(&entry.slot), Slot::Failed);
        match old {
            Slot::Writing(w) => {
                // A failed file's partial copy is not worth resuming (bad digest, I/O error).
                if w.file.is_some() {
                    remove_temp(&w.dir, &w.temp, w.journal.as_ref());
                }
                self.mark_failed(entry.meta.id, code, msg, tell);
            }
            Slot::Present => self.mark_failed(entry.meta.id, code, msg, tell),
            other => *lock(&entry.slot) = other,
        }
    }

    /// Counts a failed file as resolved and, if `tell`, lets the sender stop sending it.
    fn mark_failed(&self, id: FileId, code: ErrorCode, msg: String, tell: bool) {
        self.counters.failed.fetch_add(1, Ordering::Relaxed);
        self.error(msg.clone());
        if tell {
            let _ = self.control.send(Frame::FileFailed {
                file: id,
                code,
                message: msg,
            });
        }
        self.resolved(id);
    }

    /// The sender could not read a file: drop what arrived of it.
    fn sender_gave_up(&self, id: FileId, message: &str) {
        let msg = format!("sender: {message}");
        let mut files = lock(&self.files);
        match files.get(&id).cloned() {
            Some(entry) => {
                drop(files);
                self.fail(&entry, ErrorCode::IO, msg, false);
            }
            None => {
                let meta = FileMeta {
                    id,
                    path: String::new(),
                    size: 0,
                    mode: 0,
                    mtime_ns: 0,
                };
                files.insert(
                    id,
                    Arc::new(FileEntry {
                        meta,
                        slot: Mutex::new(Slot::Failed),
                    }),
                );
                drop(files);
                self.mark_failed(id, ErrorCode::IO, msg, false);
            }
        }
    }

    fn handle_dir(&self, path: &str, mode: u32, mtime_ns: i64) {
        match self
            .dest
            .map(path)
            .and_then(|rel| self.dir(&rel).map(|_| rel))
        {
            Ok(rel) => lock(&self.dir_meta).push((rel, mode, mtime_ns)),
            Err(e) => self.entry_failed(path, e.code(), format!("directory {path}: {e}")),
        }
        self.counters.dirs.fetch_add(1, Ordering::Relaxed);
        self.check_complete();
    }

    fn handle_symlink(&self, path: &str, target: &str, mtime_ns: i64) {
        if !self.config.links.allows(path, target) {
            self.entry_failed(
                path,
                ErrorCode::PERMISSION,
                format!("symlink {path} -> {target}: leaves the tree, not made (--safe-links)"),
            );
        } else if let Err(msg) = self.make_symlink(path, target, mtime_ns) {
            self.entry_failed(path, ErrorCode::IO, msg);
        }
        self.counters.symlinks.fetch_add(1, Ordering::Relaxed);
        self.check_complete();
    }

    /// A directory or symlink could not be made: counted, and the sender is told why.
    fn entry_failed(&self, path: &str, code: ErrorCode, message: String) {
        self.counters.failed.fetch_add(1, Ordering::Relaxed);
        self.error(message.clone());
        let path = path.to_owned();
        let _ = self.control.send(Frame::EntryFailed {
            path,
            code,
            message,
        });
    }

    fn make_symlink(&self, path: &str, target: &str, mtime_ns: i64) -> Result<(), String> {
        if target.is_empty() || target.contains('\0') {
            return Err(format!("symlink {path}: invalid target"));
        }
        let rel = self
            .dest
            .map(path)
            .map_err(|e| format!("symlink {path}: {e}"))?;
        let (dir_rel, name) = split_parent(&rel);
        let err = |e: &dyn std::fmt::Display| format!("symlink {rel}: {e}");
        let dir = self.dir(dir_rel).map_err(|e| err(&e))?;
        if let Ok(have) = root::lstat_in(&dir, name) {
            if have.kind == root::Kind::Symlink
                && link_target(&dir, name).as_deref() == Some(target)
            {
                // The same link (a re-run): complete, whatever the policy. Its own mtime is
                // brought in line so the copy is the same tree; failing that costs nothing.
                if have.mtime_ns != mtime_ns {
                    let _ = root::set_link_mtime(&dir, name, mtime_ns);
                }
                self.counters.skipped.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            match self.config.existing {
                ExistingPolicy::Skip => {
                    self.counters.skipped.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                ExistingPolicy::Fail => {
                    return Err(err(&"exists (use --overwrite or --skip-existing)"))
                }
                ExistingPolicy::Overwrite => {}
            }
        }
        let n = self.next_temp.fetch_add(1, Ordering::Relaxed);
        let temp = format!(".ferry-{:016x}-l{n}.part", self.config.tag);
        root::symlink_in(&dir, &temp, target).map_err(|e| err(&e))?;
        let _ = root::set_link_mtime(&dir, &temp, mtime_ns);
        let replace = self.config.existing == ExistingPolicy::Overwrite;
        if let Err(e) = root::rename_in(&dir, &temp, name, replace) {
            let _ = rustix::fs::unlinkat(&dir, temp.as_str(), rustix::fs::AtFlags::empty());
            return Err(err(&e));
        }
        Ok(())
    }

    fn resolved(&self, id: FileId) {
        self.shed(id);
        self.counters.resolved_files.fetch_add(1, Ordering::AcqRel);
        self.check_complete();
    }

    /// Replaces a resolved file's entry with one that keeps no path, and gives back what its
    /// offer charged: a session of many files holds about a hundred bytes for each it is done
    /// with, whatever the length of its path. Late frames for it need only its state.
    fn shed(&self, id: FileId) {
        let mut files = lock(&self.files);
        let Some(entry) = files.get(&id) else {
            return;
        };
        if entry.meta.path.is_empty() {
            return; // shed already, or never had a path
        }
        let slot = match &*lock(&entry.slot) {
            Slot::Done => Slot::Done,
            Slot::Skipped => Slot::Skipped,
            Slot::Failed => Slot::Failed,
            _ => return,
        };
        let charge = entry.meta.path.len() as u64 + OFFER_COST;
        let shed = shed_entry(&entry.meta, slot);
        files.insert(id, Arc::new(shed));
        drop(files);
        self.open_offer_bytes.fetch_sub(charge, Ordering::AcqRel);
    }

    fn check_complete(&self) {
        let Some((files, dirs, symlinks)) = *lock(&self.counters.expected) else {
            return;
        };
        let c = &self.counters;
        if c.resolved_files.load(Ordering::Acquire) >= files
            && c.dirs.load(Ordering::Acquire) >= dirs
            && c.symlinks.load(Ordering::Acquire) >= symlinks
            && !self.complete.swap(true, Ordering::AcqRel)
        {
            let _ = self.done_tx.try_send(());
        }
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
                    remove_temp(&w.dir, &w.temp, None);
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

/// The temporary name of a journaled (multi-block) file: derived from its final name, so that a
/// later attempt finds it to resume from.
fn journaled_temp(name: &str) -> String {
    format!(
        ".ferry-{:016x}.part",
        xxhash_rust::xxh3::xxh3_64(name.as_bytes())
    )
}

/// The resume journal kept beside [`journaled_temp`].
fn journal_name(name: &str) -> String {
    format!(
        ".ferry-{:016x}.journal",
        xxhash_rust::xxh3::xxh3_64(name.as_bytes())
    )
}

/// The target of symlink `name` in `dir`, if it is one with a UTF-8 target (the only kind
/// the wire carries, so the only kind that can equal an offered one).
fn link_target(dir: &OwnedFd, name: &str) -> Option<String> {
    rustix::fs::readlinkat(dir, name, Vec::new())
        .ok()?
        .into_string()
        .ok()
}

/// Removes a temporary file and its journal.
/// Creates and removes a hidden file in the destination directory, so that a destination that
/// cannot be written at all (read-only, no permission) fails the transfer once, naming the
/// directory, instead of failing every file on its own.
fn check_writable(dest: &Destination, tag: u64) -> Result<(), FsError> {
    let shown = || match dest.base.as_str() {
        "" => dest.root.display_path().display().to_string(),
        base => dest.root.display_path().join(base).display().to_string(),
    };
    let dir = dest.root.open_dir(&dest.base)?;
    let name = format!(".ferry-{tag:016x}-w.part");
    let flags = root::OFlags::WRONLY | root::OFlags::CREATE | root::OFlags::EXCL;
    match root::open_in(&dir, &name, flags, 0o600) {
        Ok(fd) => {
            drop(fd);
            let _ = rustix::fs::unlinkat(&dir, name.as_str(), rustix::fs::AtFlags::empty());
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(FsError::io(shown(), e)),
    }
}

/// The message of a file whose temporary file or journal cannot be created: it names the
/// directory that refused, not the hidden name ferry chose.
fn cannot_create(path: &str, dir_rel: &str, e: std::io::Error) -> (ErrorCode, String) {
    let dir = if dir_rel.is_empty() {
        "the destination directory".to_owned()
    } else {
        format!("directory {dir_rel}")
    };
    let msg = format!("{path}: cannot create it in {dir}: {e}");
    (FsError::io(path, e).code(), msg)
}

fn remove_temp(dir: &OwnedFd, temp: &str, journal: Option<&JournalFile>) {
    let _ = rustix::fs::unlinkat(dir, temp, rustix::fs::AtFlags::empty());
    if let Some(j) = journal {
        let _ = rustix::fs::unlinkat(dir, j.name.as_str(), rustix::fs::AtFlags::empty());
    }
}

/// Advances the in-order digest of a file no other thread can reach yet (a resumed copy
/// being opened) over what was written ahead of its cursor.
fn catch_up(w: &mut Writing) -> std::io::Result<()> {
    let (Some(end), Some(h), Some(file)) = (
        w.written.run_end(w.cursor),
        w.hasher.as_mut(),
        w.file.as_ref(),
    ) else {
        return Ok(());
    };
    hash_back(file, h, w.cursor, end)?;
    w.cursor = end;
    Ok(())
}

/// Feeds `hasher` with `[from, end)` of `file`, read back (from the page cache: it was just
/// written).
fn hash_back(file: &File, hasher: &mut FileHasher, from: u64, end: u64) -> std::io::Result<()> {
    let mut buf = vec![0u8; (end - from).min(1 << 20) as usize];
    let mut at = from;
    while at < end {
        let n = (end - at).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], at)?;
        hasher.update(&buf[..n]);
        at += n as u64;
    }
    Ok(())
}

/// The BLAKE3 of a file hashed as a tree, reading back what no block covered whole (bytes at
/// unaligned block edges: none when every block is cut at a multiple of 1 KiB). Called once
/// every byte is written.
fn finish_tree(file: &File, mut tree: Blake3Tree) -> std::io::Result<Vec<u8>> {
    let size = tree.size();
    let mut buf = Vec::new();
    let missing = tree.missing();
    if tree.gave_up() {
        tree.start_over();
    }
    for (from, end) in missing {
        let mut at = from;
        while at < end {
            // Whole chunks per read (1 MiB is a multiple of BLAKE3's 1 KiB), so every read but
            // the file's last ends on a chunk edge.
            let n = (end - at).min(1 << 20) as usize;
            buf.resize(n, 0);
            file.read_exact_at(&mut buf, at)?;
            for p in Blake3Tree::pieces(size, at, &buf) {
                tree.insert(p);
            }
            at += n as u64;
        }
    }
    tree.finish()
        .ok_or_else(|| std::io::Error::other("the digest tree has a gap"))
}

/// Makes ready files durable in batches, then gives them their final names.
fn finalizer(receiver: std::sync::Weak<Receiver>, jobs: flume::Receiver<FinalizeJob>) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < 4096 {
            match jobs.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        let Some(rx) = receiver.upgrade() else { return };
        rx.finalize_batch(batch);
    }
}

impl Receiver {
    fn finalize_batch(&self, batch: Vec<FinalizeJob>) {
        let mut ok = Vec::with_capacity(batch.len());
        for job in batch {
            let mode = self.config.modes.apply(job.meta.mode);
            match root::set_file_meta(&job.file, mode, job.meta.mtime_ns) {
                Ok(()) => ok.push(job),
                Err(e) => self.finalize_failed(
                    &job,
                    format!("{}: setting mode/mtime: {e}", job.meta.path),
                    e,
                ),
            }
        }
        // One sync for the batch: syncfs when several files share it, fsync for a lone file.
        let sync = match ok.as_slice() {
            [] => Ok(()),
            [one] => root::fsync(&*one.file),
            [first, ..] => root::syncfs(&*first.file),
        };
        if let Err(e) = sync {
            for job in &ok {
                self.finalize_failed(
                    job,
                    format!("{}: sync: {e}", job.meta.path),
                    std::io::Error::from(e.kind()),
                );
            }
            return;
        }
        let replace = self.config.existing == ExistingPolicy::Overwrite;
        let mut dirs: HashMap<String, Arc<OwnedFd>> = HashMap::new();
        // Files being replaced: freed after the batch, off this thread (`root::hold`).
        let mut replaced = Vec::new();
        for job in ok {
            let old = if replace {
                root::hold(&job.dir, &job.name)
            } else {
                None
            };
            match root::rename_in(&job.dir, &job.temp, &job.name, replace) {
                Ok(()) => {
                    replaced.extend(old);
                    if let Some(j) = &job.journal {
                        let _ = rustix::fs::unlinkat(
                            &*job.dir,
                            j.name.as_str(),
                            rustix::fs::AtFlags::empty(),
                        );
                    }
                    dirs.entry(job.dir_rel.clone())
                        .or_insert_with(|| job.dir.clone());
                    let c = &self.counters;
                    c.files_done.fetch_add(1, Ordering::Relaxed);
                    c.bytes_done.fetch_add(job.meta.size, Ordering::Relaxed);
                    if self.keep_manifest.load(Ordering::Relaxed) {
                        let path = join(&job.dir_rel, &job.name);
                        lock(&self.manifest).push((path, job.digest));
                    }
                    if let Some(e) = lock(&self.files).get(&job.meta.id) {
                        *lock(&e.slot) = Slot::Done;
                    }
                    self.reporter.on_file_done();
                    self.resolved(job.meta.id);
                }
                Err(e) => {
                    let msg = format!(
                        "{}: cannot rename into place: {e}",
                        join(&job.dir_rel, &job.name)
                    );
                    self.finalize_failed(&job, msg, e);
                }
            }
        }
        root::close_later(replaced);
        for dir in dirs.values() {
            let _ = root::fsync(&**dir);
        }
    }

    fn finalize_failed(&self, job: &FinalizeJob, msg: String, e: std::io::Error) {
        remove_temp(&job.dir, &job.temp, job.journal.as_ref());
        if let Some(entry) = lock(&self.files).get(&job.meta.id) {
            *lock(&entry.slot) = Slot::Failed;
        }
        let code = FsError::io(&job.meta.path, e).code();
        self.counters.failed.fetch_add(1, Ordering::Relaxed);
        self.error(msg.clone());
        let _ = self.control.send(Frame::FileFailed {
            file: job.meta.id,
            code,
            message: msg,
        });
        self.resolved(job.meta.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn block(
        size: u64,
        data: &Bytes,
        offset: u64,
        len: usize,
        file_digest: Option<Vec<u8>>,
    ) -> Frame {
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
}
