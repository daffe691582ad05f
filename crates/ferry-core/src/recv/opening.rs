//! Opening a file's temporary copy: a session-unique name for a file of one block; for a larger
//! one a name derived from its final name and a locked journal, and a resume from the blocks of
//! an earlier attempt's copy that still match their recorded digests.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use ferry_proto::journal::{decode_journal, JournalHeader, JournalRecord};
use ferry_proto::{ChecksumAlgo, ErrorCode, ExistingPolicy, FileMeta};

use super::receiver::Receiver;
use super::state::{cannot_create, JournalFile, Naming, Ranges, Writing};
use super::writing::hash_back;
use crate::digest::{block_digest, Blake3Tree, FileHasher};
use crate::error::FsError;
use crate::path::{join, split_parent};
use crate::root;

impl Receiver {
    /// Opens the temporary file of `meta`. A file of one block gets a name unique to this
    /// session and no journal: it is all or nothing (unless the partial copies are shared,
    /// [`Receiver::share_partials`]). A larger file gets a name derived from its
    /// final name and a locked journal beside it, and, if `resume` and a partial copy from an
    /// earlier attempt matches (same size, mtime, mode, block size and digest algorithm), starts
    /// from the blocks of it that still match their recorded digests.
    pub(super) fn open_writing(
        &self,
        meta: &FileMeta,
        resume: bool,
    ) -> Result<Writing, (ErrorCode, String)> {
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
            naming: Naming::Temp,
            name: name.to_owned(),
            mode: self.config.modes.apply(meta.mode),
            written: Ranges::default(),
            cursor: 0,
            tree: None,
            expected: None,
            journal,
            inflight: 0,
            reserved: Vec::new(),
        };
        if !self.journaled(meta.size) {
            // Created with its first block (`Writing::file`).
            let temp = format!(".ferry-{:016x}-{}.part", self.config.tag, meta.id.0);
            let mut w = writing(None, temp, None);
            if self.config.existing != ExistingPolicy::Overwrite {
                w.naming = Naming::TryUnnamed;
            }
            return Ok(self.fresh_digest(w, meta.size));
        }
        let temp = journaled_temp(name);
        let jname = journal_name(name);
        let jfile = lock_journal(&dir, &jname).map_err(|e| e.explain(&meta.path, dir_rel, &rel))?;
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
    pub(super) fn fresh_digest(&self, mut w: Writing, size: u64) -> Writing {
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
    pub(super) fn try_resume(
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
}

/// The temporary name of a journaled (multi-block) file: derived from its final name, so that a
/// later attempt finds it to resume from.
pub(super) fn journaled_temp(name: &str) -> String {
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

/// Why a journal could not be had.
enum JournalBusy {
    Create(std::io::Error),
    Locked,
}

impl JournalBusy {
    fn explain(self, path: &str, dir_rel: &str, rel: &str) -> (ErrorCode, String) {
        match self {
            JournalBusy::Create(e) => cannot_create(path, dir_rel, e),
            JournalBusy::Locked => (
                ErrorCode::BUSY,
                format!("{rel}: another transfer is writing it right now"),
            ),
        }
    }
}

/// Opens (creating it) and locks the journal `jname` in `dir`: one transfer writes a file at a
/// time. A session that just broke off may still be letting go of it: wait a little, bounded.
fn lock_journal(dir: &OwnedFd, jname: &str) -> Result<File, JournalBusy> {
    let flags = root::OFlags::RDWR | root::OFlags::CREATE;
    let jfd = root::open_in(dir, jname, flags, 0o600).map_err(JournalBusy::Create)?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while rustix::fs::flock(&jfd, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
        if std::time::Instant::now() >= deadline {
            return Err(JournalBusy::Locked);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Ok(File::from(jfd))
}
