//! Answering offers: what to ask of each offered file (send, resume, skip, compare digests,
//! fail), within the session's limits and the destination's free space.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use ferry_proto::{
    Decision, ErrorCode, ExistingPolicy, FileDecision, FileId, FileMeta, Frame, OfferEntry,
    MAX_RESUME_RANGES,
};

use super::config::{RecvError, MAX_OPEN_OFFERS, MAX_OPEN_OFFER_BYTES, OFFER_COST};
use super::opening::journaled_temp;
use super::receiver::Receiver;
use super::state::{lock, shed_entry, FileEntry, Slot};
use crate::digest::FileHasher;
use crate::path::split_parent;
use crate::root;

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
    pub(super) fn left(&mut self, dir: &OwnedFd, dir_rel: &str) -> Option<&mut u64> {
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

impl Receiver {
    /// Answers a batch of offers with one `Decisions` frame per batch. Fails the session when
    /// the files offered and still open would exceed what a session may hold
    /// ([`MAX_OPEN_OFFERS`], [`MAX_OPEN_OFFER_BYTES`]).
    pub(super) fn handle_offer(&self, entries: Vec<OfferEntry>) -> Result<(), RecvError> {
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
        // Before anything is made here: an excluded file's parent may be excluded too.
        if self.excluded(&meta.path, false) {
            return (Slot::Skipped, Decision::Skip);
        }
        let rel = match self.dest.map(&meta.path) {
            Ok(r) => r,
            Err(e) => return fail(e.code(), format!("{}: {e}", meta.path)),
        };
        let (dir_rel, name) = split_parent(&rel);
        let (dir, made) = match self.dir_made(dir_rel) {
            Ok(d) => d,
            Err(e) => return fail(e.code(), format!("{}: {e}", meta.path)),
        };
        // In a directory this session made there is nothing to find but what another process
        // put there since, and the commit refuses to replace that (`RENAME_NOREPLACE`, the
        // link) unless overwriting, so the lookup is spared: one `lstat` per file on the path
        // every decision waits on. Not with `--skip-existing`, which skips such a file rather
        // than failing it.
        let existing = if made && self.config.existing != ExistingPolicy::Skip {
            Err(std::io::ErrorKind::NotFound.into())
        } else {
            root::lstat_in(&dir, name)
        };
        match existing {
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
                let known = self
                    .known_digests
                    .get()
                    .and_then(|k| k.known(&rel, m.size, m.mtime_ns, self.config.checksum));
                match known.map_or_else(|| self.digest_existing(&dir, name), Ok) {
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
        let partial = if self.journaled(size) {
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
    pub(super) fn digest_existing(&self, dir: &OwnedFd, name: &str) -> std::io::Result<Vec<u8>> {
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
    pub(super) fn confirm_present(&self, id: FileId) -> Result<(), RecvError> {
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
}
