//! `ferry verify`: a fixity audit done in place. Every object this server holds a replica of
//! at or under the path (taken from the catalog, page by page, never by a walk) is re-read,
//! hashed with its registered algorithm and compared, size and digest, with what was
//! registered; this server's replica is marked good or bad. With `recursive`, the tree is
//! also walked once for regular files the catalog does not know (reported, never registered).
//!
//! The reading runs on one blocking thread with one buffer, paced by the server-wide
//! `verify_rate` so that audits cannot starve transfers. The answer is a run of `Verified`
//! frames: one whenever problem paths fill a frame, and one at least every [`progress_every`]
//! otherwise, so the control connection is never idle during a long audit; the last carries
//! the totals. When the session ends (client gone, server shutting down) the thread stops at
//! its next read.

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_catalog::{Catalog, CatalogError, Object, ReplicaState};
use ferry_core::digest::{parse_algo, FileHasher};
use ferry_core::path::join;
use ferry_core::root::Kind;
use ferry_core::{FsError, Root};
use ferry_proto::{
    CatalogAnswer, ErrorCode, Frame, Problem, VerifyCounts, VerifyReport, MAX_VERIFY_LISTED,
    MAX_VERIFY_PROBLEMS,
};
use tokio::sync::mpsc;

use super::access;
use super::state::ServerState;
use crate::error::SessionError;
use crate::transport::conn::send;
use crate::transport::stream::Stream;

/// Bytes read at a time: the audit's whole buffer.
const CHUNK: usize = 1 << 20;
/// Objects taken from the catalog at a time.
const PAGE: usize = 256;

/// A server-wide pace for audit reads: `rate` bytes a second over all audits together (0:
/// unlimited). Each read books its time after the one before it, so concurrent audits share
/// the rate instead of each taking it.
#[derive(Debug)]
pub(super) struct Pace {
    rate: u64,
    next: Mutex<Instant>,
}

impl Pace {
    pub(super) fn new(rate: u64) -> Self {
        Self {
            rate,
            next: Mutex::new(Instant::now()),
        }
    }

    /// How long to wait before reading `n` bytes (booked now).
    fn book(&self, n: u64) -> Duration {
        if self.rate == 0 {
            return Duration::ZERO;
        }
        let cost = Duration::from_secs_f64(n as f64 / self.rate as f64);
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let start = (*next).max(now);
        *next = start + cost;
        start - now
    }
}

/// How often a verify reports progress at the least: well within any idle timeout.
fn progress_every(idle: Duration) -> Duration {
    (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(5))
}

/// Runs a verify of `rel` (already checked against the read scope `prefix`) and answers it.
/// Returns the objects checked, for the session's log.
pub(super) async fn serve(
    shared: &ServerState,
    stream: &mut Stream,
    catalog: Arc<Catalog>,
    (rel, prefix): (String, String),
    recursive: bool,
) -> Result<u64, SessionError> {
    let scope = match shared.root.scope(&prefix, false) {
        Ok(s) => Some(Arc::new(s)),
        Err(e) if e.is_not_found() => None,
        Err(e) => return Err(io_refused(&rel, e)),
    };
    let (tx, mut rx) = mpsc::channel(2);
    let stop = Arc::new(AtomicBool::new(false));
    let _stop_on_drop = StopOnDrop(stop.clone());
    let audit = Audit {
        catalog,
        scope,
        prefix,
        pace: shared.verify_pace.clone(),
        stop,
        tx,
        every: progress_every(shared.config.idle_timeout),
        sent: Instant::now(),
        counts: VerifyCounts::default(),
        problems: Vec::new(),
        listed: 0,
        more: false,
    };
    let job = tokio::task::spawn_blocking(move || audit.run(&rel, recursive));
    while let Some(report) = rx.recv().await {
        send(
            stream,
            &Frame::CatalogAnswer(CatalogAnswer::Verified(report)),
        )
        .await?;
    }
    job.await.map_err(|e| SessionError::Remote {
        code: ErrorCode::INTERNAL,
        message: format!("verify stopped: {e}"),
    })?
}

/// Tells the audit thread to stop when the session's future is dropped (its end).
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

struct Audit {
    catalog: Arc<Catalog>,
    /// The read scope's root; `None` when its directory is gone (every object is missing).
    scope: Option<Arc<Root>>,
    prefix: String,
    pace: Arc<Pace>,
    stop: Arc<AtomicBool>,
    tx: mpsc::Sender<Box<VerifyReport>>,
    every: Duration,
    sent: Instant,
    counts: VerifyCounts,
    problems: Vec<(Problem, String)>,
    listed: usize,
    more: bool,
}

/// Why an audit ended early.
enum Ended {
    /// The session ended: nobody to answer.
    Stopped,
    Failed(SessionError),
}

impl From<CatalogError> for Ended {
    fn from(e: CatalogError) -> Self {
        Ended::Failed(SessionError::Remote {
            code: ErrorCode::IO,
            message: format!("verify: the catalog failed: {e}"),
        })
    }
}

impl Audit {
    fn run(mut self, rel: &str, recursive: bool) -> Result<u64, SessionError> {
        let walked = self
            .registered(rel)
            .and_then(|()| match recursive {
                true => self.unregistered(rel),
                false => Ok(()),
            })
            .and_then(|()| self.report(true));
        match walked {
            Ok(()) => Ok(self.counts.checked),
            Err(Ended::Stopped) => Err(SessionError::Closed("control")),
            Err(Ended::Failed(e)) => Err(e),
        }
    }

    /// Every registered object at or under `rel`, page by page.
    fn registered(&mut self, rel: &str) -> Result<(), Ended> {
        let mut after = String::new();
        loop {
            let page = self.catalog.held_page(rel, &after, PAGE)?;
            let Some(last) = page.last() else {
                return Ok(());
            };
            after = last.path.clone();
            for object in page {
                let found = self.check(&object)?;
                let state = match found {
                    None => ReplicaState::Good,
                    Some(_) => ReplicaState::Bad,
                };
                self.catalog.set_replica_state(&object.path, state)?;
                self.counts.checked += 1;
                match found {
                    None => self.counts.good += 1,
                    Some(p) => self.problem(p, object.path)?,
                }
                self.progress()?;
            }
        }
    }

    /// What is wrong with `object`'s file, if anything.
    fn check(&mut self, object: &Object) -> Result<Option<Problem>, Ended> {
        let inner = access::inside(&object.path, &self.prefix);
        let Some(scope) = &self.scope else {
            return Ok(Some(Problem::Missing));
        };
        let file = match scope.lstat(inner) {
            Ok(m) if m.kind == Kind::File => scope.open_read(inner),
            Ok(_) => return Ok(Some(Problem::Missing)),
            Err(e) if e.is_not_found() => return Ok(Some(Problem::Missing)),
            Err(e) => Err(e),
        };
        let Some(algo) = parse_algo(&object.algo) else {
            return Ok(Some(Problem::Bad));
        };
        let mut file = match file {
            Ok(f) => f,
            Err(e) if e.is_not_found() => return Ok(Some(Problem::Missing)),
            Err(_) => return Ok(Some(Problem::Bad)),
        };
        // A size that differs needs no read.
        match file.metadata() {
            Ok(m) if m.len() == object.size => {}
            _ => return Ok(Some(Problem::Bad)),
        }
        let mut hasher = FileHasher::new(algo);
        let mut buf = vec![0u8; CHUNK];
        let mut read = 0u64;
        loop {
            self.progress()?;
            std::thread::sleep(self.pace.book(CHUNK as u64));
            let n = match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                // A file that cannot be read back is not the file registered.
                Err(_) => return Ok(Some(Problem::Bad)),
            };
            hasher.update(&buf[..n]);
            read += n as u64;
            self.counts.bytes += n as u64;
        }
        let whole = read == object.size && hasher.finalize() == object.digest;
        Ok((!whole).then_some(Problem::Bad))
    }

    /// Regular files at or under `rel` the catalog does not know: one walk, depth first,
    /// never following symlinks; ferry's own partial files are not counted.
    fn unregistered(&mut self, rel: &str) -> Result<(), Ended> {
        let Some(scope) = self.scope.clone() else {
            return Ok(());
        };
        let top = access::inside(rel, &self.prefix).to_owned();
        match scope.lstat(&top) {
            Ok(m) if m.kind == Kind::Dir => {}
            Ok(m) if m.kind == Kind::File => return self.one_file(rel),
            _ => return Ok(()),
        }
        let mut dirs = vec![top];
        while let Some(dir) = dirs.pop() {
            let listing = match scope.read_dir(&dir) {
                Ok(l) => l,
                // A directory removed meanwhile has nothing to report.
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(Ended::Failed(io_refused(&dir, e))),
            };
            for (name, kind) in listing.entries {
                let inner = join(&dir, &name);
                let kind = match kind {
                    Some(k) => k,
                    None => scope.lstat(&inner).map_or(Kind::Other, |m| m.kind),
                };
                match kind {
                    Kind::Dir => dirs.push(inner),
                    Kind::File if !name.starts_with(".ferry-") => {
                        let path = join(&self.prefix, &inner);
                        self.one_file(&path)?;
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    fn one_file(&mut self, path: &str) -> Result<(), Ended> {
        if !self.catalog.is_registered(path)? {
            self.problem(Problem::Unregistered, path.to_owned())?;
        }
        self.progress()
    }

    fn problem(&mut self, problem: Problem, path: String) -> Result<(), Ended> {
        match problem {
            Problem::Bad => self.counts.bad += 1,
            Problem::Missing => self.counts.missing += 1,
            Problem::Unregistered => self.counts.unregistered += 1,
        }
        if self.listed == MAX_VERIFY_LISTED {
            self.more = true;
            return Ok(());
        }
        self.listed += 1;
        self.problems.push((problem, path));
        if self.problems.len() == MAX_VERIFY_PROBLEMS {
            self.report(false)?;
        }
        Ok(())
    }

    /// Stops when the session has ended; reports progress when it is time to.
    fn progress(&mut self) -> Result<(), Ended> {
        if self.stop.load(Ordering::Acquire) {
            return Err(Ended::Stopped);
        }
        if self.sent.elapsed() >= self.every {
            self.report(false)?;
        }
        Ok(())
    }

    fn report(&mut self, last: bool) -> Result<(), Ended> {
        let report = VerifyReport {
            counts: self.counts,
            problems: std::mem::take(&mut self.problems),
            last,
            more: last && self.more,
        };
        self.sent = Instant::now();
        self.tx
            .blocking_send(Box::new(report))
            .map_err(|_| Ended::Stopped)
    }
}

fn io_refused(raw: &str, e: FsError) -> SessionError {
    SessionError::Remote {
        code: e.code(),
        message: format!("verify `{raw}`: {e}"),
    }
}
