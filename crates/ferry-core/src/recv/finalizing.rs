//! Finalizing: verify a written file's digest and set its metadata (on the writer's thread),
//! then, in batches, make it durable and rename it into place.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ferry_proto::{ErrorCode, ExistingPolicy, Frame};

use super::commit::{CommitHook, Stored};
use super::receiver::Receiver;
use super::state::{lock, remove_temp, FileEntry, FinalizeJob, Naming, Slot, Writing};
use crate::digest::{Blake3Tree, FileHasher};
use crate::error::FsError;
use crate::path::join;
use crate::root;

impl Receiver {
    pub(super) fn verify_and_queue(&self, entry: &FileEntry, mut w: Writing) {
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
        // On the writer's thread, not the finalizer's: the finalizer serves every file of the
        // session in turn. No write of it is under way any more (`advance` hands a file on
        // only then), so none can reset the mtime after this.
        let mode = w.mode;
        if let Err(e) = root::set_file_meta(
            &file,
            mode,
            entry.meta.mtime_ns,
            w.naming == Naming::Unnamed,
        ) {
            let msg = format!("{}: setting mode/mtime: {e}", entry.meta.path);
            let code = FsError::io(&entry.meta.path, e).code();
            *lock(&entry.slot) = Slot::Writing(Box::new(w));
            self.fail(entry, code, msg, true);
            return;
        }
        let job = FinalizeJob {
            file,
            dir: w.dir,
            dir_rel: w.dir_rel,
            temp: w.temp,
            naming: w.naming,
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
            None => remove_temp(&job.dir, job.naming.temp(&job.temp), None),
        }
    }
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

impl Receiver {
    /// Makes ready files durable in batches, then gives them their final names. Holds only a weak
    /// reference, so that dropping the receiver ends it.
    ///
    /// Two stages: this thread syncs batch k+1 while a second one names batch k (its links and
    /// directory syncs), so a batch's names no longer wait behind the next batch's `syncfs`,
    /// nor that `syncfs` behind the names (the tiny tree's tail at 100 ms was this one thread's
    /// backlog; docs/bench/NOTEBOOK.md, "Issue 37: the server's small-file writes on ext4"). At
    /// most one synced batch waits for the namer, so memory stays bounded.
    pub(super) fn finalizer(
        receiver: std::sync::Weak<Receiver>,
        jobs: flume::Receiver<FinalizeJob>,
    ) {
        let (synced_tx, synced) = flume::bounded::<Vec<FinalizeJob>>(1);
        std::thread::scope(|s| {
            let namer = std::thread::Builder::new()
                .name("ferry-name".into())
                .spawn_scoped(s, || {
                    while let Ok(batch) = synced.recv() {
                        let Some(rx) = receiver.upgrade() else { return };
                        rx.name_batch(batch);
                    }
                });
            while let Ok(first) = jobs.recv() {
                let mut batch = vec![first];
                while batch.len() < 4096 {
                    match jobs.try_recv() {
                        Ok(j) => batch.push(j),
                        Err(_) => break,
                    }
                }
                let Some(rx) = receiver.upgrade() else { return };
                let Some(batch) = rx.sync_batch(batch) else {
                    continue;
                };
                drop(rx);
                match &namer {
                    Ok(_) => {
                        if synced_tx.send(batch).is_err() {
                            return;
                        }
                    }
                    // No second thread: named here, in series, as one stage.
                    Err(_) => {
                        let Some(rx) = receiver.upgrade() else { return };
                        rx.name_batch(batch);
                    }
                }
            }
            drop(synced_tx);
        });
    }

    /// Tells the commit hook of a batch and makes it durable: one sync for the batch, `syncfs`
    /// when several files share it (a hook's records ride on it), `fsync` for a lone file.
    /// `None` when the batch failed (every file of it is failed).
    fn sync_batch(&self, ok: Vec<FinalizeJob>) -> Option<Vec<FinalizeJob>> {
        let hook = self.commit_hook.get().filter(|_| !ok.is_empty());
        if let Some(hook) = hook {
            if let Err(e) = self.tell_before_sync(hook.as_ref(), &ok) {
                for job in &ok {
                    let msg = format!("{}: cannot record it before storing: {e}", job.meta.path);
                    self.finalize_failed(job, msg, std::io::Error::new(e.kind(), e.to_string()));
                }
                return None;
            }
        }
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
            return None;
        }
        Some(ok)
    }

    /// Gives each file of a durable batch its final name and makes the names durable, then
    /// tells the hook and resolves them.
    fn name_batch(&self, ok: Vec<FinalizeJob>) {
        let hook = self.commit_hook.get().filter(|_| !ok.is_empty());
        let renamed = self.rename_batch(ok);
        // Told before the files resolve, so a sender told they are stored finds them recorded
        // (a hook that registers them later settles that before answering for them).
        if let Some(hook) = hook {
            let files: Vec<Stored> = renamed.iter().map(|j| self.stored(j)).collect();
            hook.after_rename(&files);
        }
        for job in renamed {
            self.renamed(job);
        }
    }

    /// Tells `hook` of a batch about to be synced, with the file system the sync flushes.
    fn tell_before_sync(&self, hook: &dyn CommitHook, ok: &[FinalizeJob]) -> std::io::Result<()> {
        let syncfs = match ok {
            [] => return Ok(()),
            [_] => None,
            [first, ..] => Some(rustix::fs::fstat(&*first.file)?.st_dev),
        };
        let files: Vec<Stored> = ok.iter().map(|j| self.stored(j)).collect();
        hook.before_sync(&files, syncfs)
    }

    /// What a commit hook is told of a job.
    fn stored(&self, job: &FinalizeJob) -> Stored {
        Stored {
            path: join(&job.dir_rel, &job.name),
            size: job.meta.size,
            mtime_ns: job.meta.mtime_ns,
            digest: job.digest.clone(),
            algo: self.config.checksum,
        }
    }

    /// Renames (or, unnamed, links) each durable file of a batch into place, then fsyncs each
    /// parent directory once; returns the jobs placed.
    fn rename_batch(&self, ok: Vec<FinalizeJob>) -> Vec<FinalizeJob> {
        let replace = self.config.existing == ExistingPolicy::Overwrite;
        let mut dirs: HashMap<String, Arc<OwnedFd>> = HashMap::new();
        // Files being replaced: freed after the batch, off this thread (`root::hold`).
        let mut replaced = Vec::new();
        let mut renamed = Vec::with_capacity(ok.len());
        for job in ok {
            let old = if replace {
                root::hold(&job.dir, &job.name)
            } else {
                None
            };
            let placed = match job.naming {
                // Never with `replace` (see `Naming::TryUnnamed`): a link keeps what is there.
                Naming::Unnamed => root::link_unnamed(job.file.as_fd(), &job.dir, &job.name),
                _ => root::rename_in(&job.dir, &job.temp, &job.name, replace),
            };
            match placed {
                Ok(()) => {
                    replaced.extend(old);
                    // Its journal goes with the same directory sync.
                    if let Some(j) = &job.journal {
                        let _ = rustix::fs::unlinkat(
                            &*job.dir,
                            j.name.as_str(),
                            rustix::fs::AtFlags::empty(),
                        );
                    }
                    dirs.entry(job.dir_rel.clone())
                        .or_insert_with(|| job.dir.clone());
                    renamed.push(job);
                }
                Err(e) => {
                    let msg = format!(
                        "{}: cannot move into place: {e}",
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
        renamed
    }

    /// A file is under its final name and durable: count it, resolve it.
    fn renamed(&self, job: FinalizeJob) {
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

    pub(super) fn finalize_failed(&self, job: &FinalizeJob, msg: String, e: std::io::Error) {
        remove_temp(&job.dir, job.naming.temp(&job.temp), job.journal.as_ref());
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
