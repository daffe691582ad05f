//! Per-file state: the byte ranges written, the temporary file, the digest under way and the
//! slot that says where the file is in its life (see the diagram in the `recv` module's docs).

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use ferry_proto::journal::{JournalRecord, RECORD_LEN};
use ferry_proto::{ChecksumAlgo, ErrorCode, FileMeta};

use crate::digest::{Blake3Tree, FileHasher};
use crate::error::FsError;
use crate::root;

/// Merged set of byte ranges `[start, end)` written so far.
#[derive(Default, Debug)]
pub(super) struct Ranges(pub(super) BTreeMap<u64, u64>);

impl Ranges {
    /// Inserts a range; returns false when it was entirely present already.
    pub(super) fn insert(&mut self, start: u64, end: u64) -> bool {
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
    pub(super) fn uncovered(&self, start: u64, end: u64) -> u64 {
        let covered: u64 = self
            .0
            .range(..end)
            .filter(|(_, &e)| e > start)
            .map(|(&s, &e)| e.min(end) - s.max(start))
            .sum();
        (end - start).saturating_sub(covered)
    }

    /// The parts of `[start, end)` not yet in the set, in order.
    pub(super) fn gaps(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
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

    pub(super) fn contains(&self, start: u64, end: u64) -> bool {
        self.0
            .range(..=start)
            .next_back()
            .is_some_and(|(_, &e)| e >= end)
    }

    /// End of the contiguous run that contains `at`, if any.
    pub(super) fn run_end(&self, at: u64) -> Option<u64> {
        self.0
            .range(..=at)
            .next_back()
            .filter(|(_, &e)| e > at)
            .map(|(_, &e)| e)
    }
}

pub(super) struct Writing {
    /// The temporary file. A file of one block gets it when that block arrives, from the
    /// writer that writes it: creating it with the decision put one create per file on the
    /// control path, serially, and a tree of 10,000 small files waited there (see
    /// [`Writing::file`]).
    pub(super) file: Option<Arc<File>>,
    pub(super) dir: Arc<OwnedFd>,
    pub(super) dir_rel: String,
    pub(super) temp: String,
    /// Whether the file has (or is to get) its temporary name, or none at all.
    pub(super) naming: Naming,
    pub(super) name: String,
    /// The mode the file is to have (the session's policy applied); an unnamed file is
    /// created with its permission bits, so that most need no `fchmod` once written.
    pub(super) mode: u32,
    pub(super) written: Ranges,
    /// The in-order digest (every file not in tree mode); `None` while a writer reads back
    /// outside the lock, and in tree mode.
    pub(super) hasher: Option<FileHasher>,
    /// The in-order digest's algorithm while its hasher is not made yet: a file of one block
    /// gets it with its block, like its file. Offers run up to 16,384 files ahead of the data
    /// and a BLAKE3 hasher is ~2 KB: made with the decision, the hashers of a tree of small
    /// files waiting for their blocks grew the heap a page at a time (~6,000 `mprotect`s in a
    /// get of 10,000 files).
    pub(super) hasher_due: Option<ChecksumAlgo>,
    /// Offset up to which the in-order digest has consumed the data.
    pub(super) cursor: u64,
    /// BLAKE3 of a fresh file larger than [`Blake3Tree::MIN_SIZE`], put together from each
    /// block as it is written, in any order (see [`Blake3Tree`]); replaces the in-order
    /// digest, so nothing is read back but bytes at unaligned block edges.
    pub(super) tree: Option<Box<Blake3Tree>>,
    pub(super) expected: Option<Bytes>,
    /// Resume journal, for files larger than one block.
    pub(super) journal: Option<JournalFile>,
    /// Writes under way outside the lock. The file is verified and handed on only once none
    /// is: a copy of a block (the sender's endgame) written after the file was finalized would
    /// reset the mtime just set and, for a non-root receiver, clear setuid/setgid bits.
    pub(super) inflight: u32,
    /// The byte ranges those writes hold: a block overlapping them (or what is written) writes
    /// only its other bytes, so every byte of the file is written once and the digest is of
    /// the bytes stored, whatever a peer sends over them.
    pub(super) reserved: Vec<(u64, u64)>,
}

/// The parts of `[start, end)` that neither `written` nor any of `reserved` covers.
pub(super) fn free_parts(
    written: &Ranges,
    reserved: &[(u64, u64)],
    start: u64,
    end: u64,
) -> Vec<(u64, u64)> {
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
    /// The temporary file, created on first use: unnamed where [`Naming::TryUnnamed`] allows
    /// it and the file system takes it, else under its temporary name (exclusively: the name
    /// is this session's). A file that fails or is aborted before any of it arrived has
    /// nothing to remove, and `fail` and `abort` remove only a file that was made.
    pub(super) fn file(&mut self) -> std::io::Result<Arc<File>> {
        if let Some(f) = &self.file {
            return Ok(f.clone());
        }
        // Unnamed, it can be opened by no one else (`/proc/<pid>/fd` asks ptrace rights), so
        // it may have its final permission bits from the start; a named one stays 0600 until
        // it is finished.
        let unnamed = match self.naming {
            Naming::TryUnnamed => root::open_unnamed(&self.dir, self.mode & 0o777).ok(),
            _ => None,
        };
        let fd = match unnamed {
            Some(fd) => {
                self.naming = Naming::Unnamed;
                fd
            }
            None => {
                self.naming = Naming::Temp;
                let flags = root::OFlags::RDWR | root::OFlags::CREATE | root::OFlags::EXCL;
                root::open_in(&self.dir, &self.temp, flags, 0o600)?
            }
        };
        let f = Arc::new(File::from(fd));
        self.file = Some(f.clone());
        Ok(f)
    }

    /// The name its data is under until it is renamed into place, if it has one.
    pub(super) fn temp_name(&self) -> Option<&str> {
        self.naming.temp(&self.temp)
    }
}

/// How a file's data is named before it gets its final name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Naming {
    /// A hidden temporary name, renamed into place.
    Temp,
    /// Not made yet; to be made unnamed (`O_TMPFILE`) if the file system takes it: a file of
    /// one block, not replacing one (a link cannot replace a name).
    TryUnnamed,
    /// No name: linked into place once complete and durable, so a failure or a crash leaves
    /// nothing behind, and the commit costs a link instead of a create and a rename.
    Unnamed,
}

impl Naming {
    /// `temp`, unless the file has no name.
    pub(super) fn temp(self, temp: &str) -> Option<&str> {
        (self != Naming::Unnamed).then_some(temp)
    }
}

/// An open, locked resume journal and where its next record goes.
pub(super) struct JournalFile {
    pub(super) file: File,
    pub(super) name: String,
    pub(super) end: u64,
}

pub(super) enum Slot {
    /// A file with the offered size and mtime is already in place; the sender compares digests
    /// and answers with `Skipped` (identical) or with the data (different).
    Present,
    Writing(Box<Writing>),
    Finalizing,
    Done,
    Skipped,
    Failed,
}

pub(super) struct FileEntry {
    pub(super) meta: FileMeta,
    pub(super) slot: Mutex<Slot>,
}

/// The entry of a resolved file: its state and metadata without the path.
pub(super) fn shed_entry(meta: &FileMeta, slot: Slot) -> FileEntry {
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

pub(super) struct FinalizeJob {
    pub(super) file: Arc<File>,
    pub(super) dir: Arc<OwnedFd>,
    pub(super) dir_rel: String,
    pub(super) temp: String,
    pub(super) naming: Naming,
    pub(super) name: String,
    pub(super) meta: FileMeta,
    pub(super) digest: Vec<u8>,
    /// Removed once the file has its final name; holding it keeps the lock until then.
    pub(super) journal: Option<JournalFile>,
}

pub(super) struct Counters {
    pub(super) expected: Mutex<Option<(u64, u64, u64)>>,
    pub(super) resolved_files: AtomicU64,
    pub(super) dirs: AtomicU64,
    pub(super) symlinks: AtomicU64,
    pub(super) files_done: AtomicU64,
    pub(super) bytes_done: AtomicU64,
    pub(super) skipped: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) bad_blocks: AtomicU64,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The message of a file whose temporary file or journal cannot be created: it names the
/// directory that refused, not the hidden name ferry chose.
pub(super) fn cannot_create(path: &str, dir_rel: &str, e: std::io::Error) -> (ErrorCode, String) {
    let dir = if dir_rel.is_empty() {
        "the destination directory".to_owned()
    } else {
        format!("directory {dir_rel}")
    };
    let msg = format!("{path}: cannot create it in {dir}: {e}");
    (FsError::io(path, e).code(), msg)
}

/// Starts writeback of bytes just written, without waiting for it, so that the sync that makes
/// the file durable finds little of it dirty: a file that arrives over seconds is then written
/// out as it arrives rather than all at once after its last block. A failure costs nothing but
/// that: the sync before the rename still writes whatever is dirty, and reports its errors.
/// Only for files of at least `writing::WRITEBACK_MIN_SIZE`: a small file's own writeback
/// costs more than the batch's sync saves by it.
pub(super) fn start_writeback(file: &File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Ok(off), Ok(n)) = (i64::try_from(offset), i64::try_from(len)) else {
            return;
        };
        // SAFETY: sync_file_range takes no pointers, only a descriptor this file keeps open.
        unsafe {
            libc::sync_file_range(file.as_raw_fd(), off, n, libc::SYNC_FILE_RANGE_WRITE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

/// Removes a temporary file (if it has a name) and its journal.
pub(super) fn remove_temp(dir: &OwnedFd, temp: Option<&str>, journal: Option<&JournalFile>) {
    if let Some(temp) = temp {
        let _ = rustix::fs::unlinkat(dir, temp, rustix::fs::AtFlags::empty());
    }
    if let Some(j) = journal {
        let _ = rustix::fs::unlinkat(dir, j.name.as_str(), rustix::fs::AtFlags::empty());
    }
}

impl JournalFile {
    /// Appends a record of a block written. A failed append only costs a re-send after a
    /// crash, so it does not fail the file.
    pub(super) fn append(&mut self, rec: &JournalRecord) {
        let mut buf = bytes::BytesMut::with_capacity(RECORD_LEN);
        rec.encode(&mut buf);
        if self.file.write_all_at(&buf, self.end).is_ok() {
            self.end += RECORD_LEN as u64;
        }
    }
}
