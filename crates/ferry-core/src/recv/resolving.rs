//! How a file's story ends (failed, or resolved: stored, skipped), and how the session learns
//! that every announced entry has ended.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use ferry_proto::{ErrorCode, FileId, FileMeta, Frame};

use super::config::OFFER_COST;
use super::receiver::Receiver;
use super::state::{lock, remove_temp, shed_entry, FileEntry, Slot};

impl Receiver {
    /// Marks a file that is being written failed and removes its temporary file; a file in
    /// any other state keeps it (a late failure cannot undo a file already stored).
    pub(super) fn fail(&self, entry: &FileEntry, code: ErrorCode, msg: String, tell: bool) {
        let old = std::mem::replace(&mut *lock(&entry.slot), Slot::Failed);
        match old {
            Slot::Writing(w) => {
                // A failed file's partial copy is not worth resuming (bad digest, I/O error).
                if w.file.is_some() {
                    remove_temp(&w.dir, w.temp_name(), w.journal.as_ref());
                }
                self.mark_failed(entry.meta.id, code, msg, tell);
            }
            Slot::Present => self.mark_failed(entry.meta.id, code, msg, tell),
            other => *lock(&entry.slot) = other,
        }
    }

    /// Counts a failed file as resolved and, if `tell`, lets the sender stop sending it.
    pub(super) fn mark_failed(&self, id: FileId, code: ErrorCode, msg: String, tell: bool) {
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
    pub(super) fn sender_gave_up(&self, id: FileId, message: &str) {
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

    pub(super) fn resolved(&self, id: FileId) {
        self.shed(id);
        self.counters.resolved_files.fetch_add(1, Ordering::AcqRel);
        self.check_complete();
    }

    /// Replaces a resolved file's entry with one that keeps no path, and gives back what its
    /// offer charged: a session of many files holds about a hundred bytes for each it is done
    /// with, whatever the length of its path. Late frames for it need only its state.
    pub(super) fn shed(&self, id: FileId) {
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

    pub(super) fn check_complete(&self) {
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
}
