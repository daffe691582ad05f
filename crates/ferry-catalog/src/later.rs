//! Registration off the committer's path: [`Catalog::register_later`] queues a batch for a
//! thread of the catalog's own, which registers whatever has queued in one transaction, so the
//! finalizer that renamed the files never waits for the rows.
//!
//! Nothing is lost by the wait: a queued batch's intents are written already (in the catalog,
//! or in the local file of a PostgreSQL catalog's server, cleared only after the registration
//! commits), so a crash before its registration leaves them for [`Catalog::reconcile`]. Every read and change
//! of the catalog first waits for what was queued before it ([`Catalog::settle`]), so a client
//! told its files are stored finds them registered.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::store::Shared;
use crate::{Catalog, CatalogError, Commit};

/// At most this many files in one registering transaction: the finalizer's intents wait for
/// the connection while it runs.
const MOST_PER_TX: usize = 1024;

/// A registration that failed is tried again after this, then after twice as long, up to
/// [`RETRY_MOST`], until it commits (the database back, the disk freed).
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MOST: Duration = Duration::from_secs(30);

/// Called with a registration's error, each time it fails (a server logs it; the thread tries
/// again, and the intents stay for the next start if it never succeeds).
pub type OnError = Box<dyn Fn(&CatalogError, usize) + Send + Sync>;

/// The queue and the thread that drains it, started by the first batch.
#[derive(Default)]
pub(crate) struct Later {
    queue: Mutex<Option<Worker>>,
}

/// The way into the registering thread, and the thread.
type Worker = (Sender<Vec<Commit>>, JoinHandle<()>);

/// How far the thread has come: batches queued and registered, and the error it met since
/// the last [`Catalog::settle`].
#[derive(Default)]
pub(crate) struct Progress {
    queued: u64,
    done: u64,
    error: Option<CatalogError>,
    /// Files renamed into place whose registration failed and is being tried again, and why
    /// it last failed: while there are any, no new intents are taken ([`Catalog::intend`]).
    unregistered: usize,
    why: String,
}

/// What the registering thread and the callers share.
#[derive(Default)]
pub(crate) struct Tracker {
    progress: Mutex<Progress>,
    moved: Condvar,
    pub(crate) on_error: std::sync::OnceLock<OnError>,
}

impl Tracker {
    fn lock(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until every batch queued before the call is registered (or failed).
    pub(crate) fn wait(&self) -> MutexGuard<'_, Progress> {
        let mut p = self.lock();
        let target = p.queued;
        while p.done < target {
            p = self.moved.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        p
    }
}

impl Catalog {
    /// Queues `files` (renamed into place, their intents written) for registration by the
    /// catalog's own thread; returns at once.
    pub fn register_later(&self, files: Vec<Commit>) {
        if files.is_empty() {
            return;
        }
        let mut queue = self.later.queue.lock().unwrap_or_else(|e| e.into_inner());
        let (tx, _) = queue.get_or_insert_with(|| {
            let (tx, rx) = mpsc::channel();
            let shared = self.shared.clone();
            (tx, std::thread::spawn(move || drain(&shared, &rx)))
        });
        self.shared.tracker.lock().queued += 1;
        if let Err(mpsc::SendError(files)) = tx.send(files) {
            // The thread is gone (it panicked): register here rather than not at all.
            let r = self.shared.register(&files);
            self.shared.finished(1, files, r);
        }
    }

    /// Waits for the registrations queued before the call; the first error one of them met
    /// since the last call, if any.
    pub fn settle(&self) -> Result<(), CatalogError> {
        match self.shared.tracker.wait().error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Who hears of a queued registration that failed (besides [`Self::settle`]); set once.
    pub fn on_register_error(&self, f: OnError) {
        let _ = self.shared.tracker.on_error.set(f);
    }

    /// Waits for the queued registrations, for a read or change that must see them.
    pub(crate) fn settled(&self) {
        drop(self.shared.tracker.wait());
    }

    /// Refuses new intents while stored files wait for a registration that failed (the
    /// database down, the disk full): the files and the catalog would otherwise drift apart
    /// for as long as it lasts. The registering thread tries those again on its own.
    pub(crate) fn no_backlog(&self) -> Result<(), CatalogError> {
        let p = self.shared.tracker.lock();
        match p.unregistered {
            0 => Ok(()),
            files => Err(CatalogError::Unregistered {
                files,
                why: p.why.clone(),
            }),
        }
    }
}

impl Drop for Catalog {
    /// Registers what is queued before the catalog closes.
    fn drop(&mut self) {
        let queue = self
            .later
            .queue
            .get_mut()
            .unwrap_or_else(|e| e.into_inner());
        if let Some((tx, worker)) = queue.take() {
            drop(tx);
            let _ = worker.join();
        }
    }
}

/// The registering thread: everything queued by now, in transactions of at most
/// [`MOST_PER_TX`] files, until the catalog closes.
fn drain(shared: &Arc<Shared>, rx: &Receiver<Vec<Commit>>) {
    // Files stored whose registration failed: registered first in the next transaction (their
    // paths' later contents, queued since, then land last), or alone after `wait`.
    let mut backlog: Vec<Commit> = Vec::new();
    let mut wait = RETRY_FIRST;
    loop {
        let (mut files, mut batches) = if backlog.is_empty() {
            match rx.recv() {
                Ok(files) => (files, 1),
                Err(_) => return,
            }
        } else {
            match rx.recv_timeout(wait) {
                Ok(files) => (files, 1),
                Err(RecvTimeoutError::Timeout) => (Vec::new(), 0),
                // The catalog is closing: one last try; what fails stays in the intents.
                Err(RecvTimeoutError::Disconnected) => {
                    let r = shared.register(&backlog);
                    shared.finished(0, std::mem::take(&mut backlog), r);
                    return;
                }
            }
        };
        while files.len() < MOST_PER_TX {
            match rx.try_recv() {
                Ok(more) => {
                    files.extend(more);
                    batches += 1;
                }
                Err(_) => break,
            }
        }
        let retrying = !backlog.is_empty();
        backlog.append(&mut files);
        let r = shared.register(&backlog);
        backlog = shared.finished(batches, backlog, r);
        // Doubled only when a retry failed again: a first failure waits the first interval.
        wait = match retrying && !backlog.is_empty() {
            true => (wait * 2).min(RETRY_MOST),
            false => RETRY_FIRST,
        };
    }
}

impl Shared {
    /// Counts `batches` done; returns what is left to register: nothing, or all of `files`
    /// when the registration failed.
    fn finished(
        &self,
        batches: u64,
        files: Vec<Commit>,
        r: Result<(), CatalogError>,
    ) -> Vec<Commit> {
        let mut p = self.tracker.lock();
        p.done += batches;
        let left = match r {
            Ok(()) => {
                p.unregistered = 0;
                p.why.clear();
                Vec::new()
            }
            Err(e) => {
                if let Some(f) = self.tracker.on_error.get() {
                    f(&e, files.len());
                }
                p.unregistered = files.len();
                p.why = e.to_string();
                p.error.get_or_insert(e);
                files
            }
        };
        drop(p);
        self.tracker.moved.notify_all();
        left
    }
}
