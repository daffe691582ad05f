//! The walk: every source depth-first, offering files in batches and handing them to the
//! readers; directories and symlinks go straight to the frame queue.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use ferry_proto::{ErrorCode, FileId, FileMeta, Frame, OfferEntry};

use super::reading::special_kind;
use super::state::{FileRecord, Job, SenderState, Source, WalkTotals};
use crate::archive::{Archive, Member, MemberKind};
use crate::error::FsError;
use crate::path::join;
use crate::root::{self, Kind, Meta, OFlags};
use std::os::fd::OwnedFd;

/// Files announced per `Offer` frame, and how long a partly filled batch may wait.
pub(super) const OFFER_BATCH: usize = ferry_proto::MAX_OFFER_ENTRIES;
pub(super) const OFFER_DELAY: std::time::Duration = std::time::Duration::from_millis(5);

/// An entry still to visit: `name` inside the open directory `parent`.
pub(super) struct Unvisited {
    parent: Arc<OwnedFd>,
    name: String,
    wire: String,
}

/// Depth-first walk of every source; directories are listed in name order. Every step opens
/// or stats a single name relative to an already-open directory, never following a symlink,
/// so the walk stays beneath each source's root without re-resolving whole paths.
pub(super) fn walk(shared: &SenderState, jobs: &flume::Sender<Job>) -> WalkTotals {
    let mut walker = Walker::new(shared, jobs);
    for src in &shared.sources {
        if !walker.source(src) {
            break;
        }
    }
    walker.offers.flush();
    walker.totals
}

/// The members of an archive, in archive order, instead of a walk (`put --untar`).
pub(super) fn walk_archive(
    shared: &SenderState,
    archive: &Archive,
    jobs: &flume::Sender<Job>,
) -> WalkTotals {
    let mut walker = Walker::new(shared, jobs);
    for m in &archive.members {
        if !walker.member(archive, m) {
            break;
        }
    }
    walker.offers.flush();
    walker.totals
}

/// Offers waiting to be sent, as one batch. Batches keep the control traffic small; a batch is flushed when
/// full, when it is a few milliseconds old, and always before the walker would block, so a
/// reader never waits for a decision about a file whose offer is still sitting here.
pub(super) struct OfferBatch<'a> {
    shared: &'a SenderState,
    batch: Vec<OfferEntry>,
    since: Option<std::time::Instant>,
}

impl OfferBatch<'_> {
    fn add(&mut self, meta: &FileMeta) {
        self.batch.push(OfferEntry {
            file: meta.id,
            path: meta.path.clone(),
            size: meta.size,
            mode: meta.mode,
            mtime_ns: meta.mtime_ns,
        });
        let since = *self.since.get_or_insert_with(std::time::Instant::now);
        if self.batch.len() >= OFFER_BATCH || since.elapsed() >= OFFER_DELAY {
            self.flush();
        }
    }

    fn flush(&mut self) {
        self.since = None;
        if !self.batch.is_empty() {
            let entries = std::mem::take(&mut self.batch);
            tracing::debug!(
                n = entries.len(),
                first = entries[0].file.0,
                "offers queued"
            );
            let _ = self.shared.control.send(Frame::Offer { entries });
        }
    }
}

/// One walk's progress: what it found so far and the offers it has not sent yet.
struct Walker<'a> {
    shared: &'a SenderState,
    jobs: &'a flume::Sender<Job>,
    offers: OfferBatch<'a>,
    totals: WalkTotals,
    next_id: u64,
}

impl<'a> Walker<'a> {
    fn new(shared: &'a SenderState, jobs: &'a flume::Sender<Job>) -> Self {
        Walker {
            shared,
            jobs,
            offers: OfferBatch {
                shared,
                batch: Vec::new(),
                since: None,
            },
            totals: WalkTotals::default(),
            next_id: 0,
        }
    }

    /// Walks one source. Returns false when the transfer is over.
    fn source(&mut self, src: &Source) -> bool {
        let shared = self.shared;
        let (parent_rel, name) = crate::path::split_parent(&src.rel);
        let parent = match src.root.open_dir(parent_rel) {
            Ok(fd) => Arc::new(fd),
            Err(e) => {
                shared.error(format!("skipped {}: {e}", src.name));
                return true;
            }
        };
        let mut stack = vec![Unvisited {
            parent,
            name: name.to_owned(),
            wire: src.name.clone(),
        }];
        while let Some(entry) = stack.pop() {
            // The empty name is a source that is the root itself.
            let meta = if entry.name.is_empty() {
                src.root.lstat("")
            } else {
                root::lstat_in(&entry.parent, &entry.name).map_err(|e| FsError::io(&entry.wire, e))
            };
            let meta = match meta {
                Ok(m) => m,
                Err(e) => {
                    shared.error(format!("skipped {}: {e}", entry.wire));
                    continue;
                }
            };
            // The empty wire path is a root sent as itself: never filtered.
            let is_dir = meta.kind == Kind::Dir;
            if !entry.wire.is_empty() && !shared.filter.allows(&entry.wire, is_dir) {
                tracing::debug!(path = %entry.wire, "excluded by the filter");
                continue;
            }
            let more = match meta.kind {
                Kind::File => self.file(entry, meta),
                Kind::Dir => self.dir(src, entry, meta, &mut stack),
                Kind::Symlink => self.symlink(entry, meta),
                Kind::Other => self.other(entry, meta),
            };
            if !more {
                return false;
            }
        }
        true
    }

    fn next_id(&mut self) -> FileId {
        let id = FileId(self.next_id);
        self.next_id += 1;
        self.totals.files += 1;
        id
    }

    /// Offers a regular file and hands it to the readers.
    fn file(&mut self, entry: Unvisited, meta: Meta) -> bool {
        let id = self.next_id();
        let record = record(entry, id, meta.size, &meta);
        self.enqueue(record)
    }

    /// Counts a file found, offers it and hands it to the readers.
    fn enqueue(&mut self, record: FileRecord) -> bool {
        let shared = self.shared;
        let size = record.meta.size;
        self.totals.bytes += size;
        shared.found_bytes.fetch_add(size, Ordering::Relaxed);
        shared.found_files.fetch_add(1, Ordering::Relaxed);
        shared.reporter.on_discovered(1, size);
        let record = Arc::new(record);
        let id = record.meta.id;
        shared
            .records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, record.clone());
        self.offers.add(&record.meta);
        match self.jobs.try_send(Job { record }) {
            Ok(()) => true,
            Err(flume::TrySendError::Full(job)) => {
                self.offers.flush();
                self.jobs.send(job).is_ok()
            }
            Err(flume::TrySendError::Disconnected(_)) => false,
        }
    }

    /// Sends one member of an archive as a walk of the unpacked tree would send it; a file is
    /// a range of the archive, read in place.
    fn member(&mut self, archive: &Archive, m: &Member) -> bool {
        match &m.kind {
            MemberKind::Dir => {
                self.totals.dirs += 1;
                self.shared.push(Frame::Dir {
                    path: m.path.clone(),
                    mode: m.mode,
                    mtime_ns: m.mtime_ns,
                })
            }
            MemberKind::Symlink { target } => {
                self.totals.symlinks += 1;
                self.shared.push(Frame::Symlink {
                    path: m.path.clone(),
                    target: target.clone(),
                    mtime_ns: m.mtime_ns,
                })
            }
            &MemberKind::File { offset, size } => {
                let id = self.next_id();
                let record = FileRecord {
                    dir: archive.dir.clone(),
                    name: archive.name.clone(),
                    base: offset,
                    listed: (archive.meta.size, archive.meta.mtime_ns),
                    meta: FileMeta {
                        id,
                        path: m.path.clone(),
                        size,
                        mode: m.mode,
                        mtime_ns: m.mtime_ns,
                    },
                    final_digest: Mutex::new(None),
                    digest: Mutex::new(None),
                };
                self.enqueue(record)
            }
        }
    }

    /// Queues a directory and puts its entries on the stack, in name order.
    fn dir(
        &mut self,
        src: &Source,
        entry: Unvisited,
        meta: Meta,
        stack: &mut Vec<Unvisited>,
    ) -> bool {
        let shared = self.shared;
        let Unvisited { parent, name, wire } = entry;
        // A source named "" sends its directory's contents only, into the destination itself.
        if !wire.is_empty() {
            self.totals.dirs += 1;
            let frame = Frame::Dir {
                path: wire.clone(),
                mode: meta.mode,
                mtime_ns: meta.mtime_ns,
            };
            if !shared.push(frame) {
                return false;
            }
        }
        let opened = if name.is_empty() {
            src.root
                .open_dir("")
                .map_err(|e| std::io::Error::other(e.to_string()))
        } else {
            root::open_in(&parent, &name, OFlags::RDONLY | OFlags::DIRECTORY, 0)
        };
        match opened.and_then(|fd| Ok((root::list_dir(&fd)?, fd))) {
            Ok((listing, fd)) => {
                for bad in &listing.unusable {
                    shared.error(format!(
                        "skipped {wire}/{bad}: the name is not UTF-8 and cannot be sent"
                    ));
                }
                let entries = listing.entries;
                let fd = Arc::new(fd);
                // Reversed so that popping the stack visits names in order.
                for (child, _) in entries.into_iter().rev() {
                    let wire = join(&wire, &child);
                    stack.push(Unvisited {
                        parent: fd.clone(),
                        name: child,
                        wire,
                    });
                }
            }
            Err(e) => shared.error(format!("cannot list {wire}: {e}")),
        }
        true
    }

    /// Queues a symlink, as its target string.
    fn symlink(&mut self, entry: Unvisited, meta: Meta) -> bool {
        let Unvisited { parent, name, wire } = entry;
        let target = rustix::fs::readlinkat(&*parent, name.as_str(), Vec::new())
            .map_err(std::io::Error::from)
            .and_then(|t| {
                t.into_string()
                    .map_err(|_| std::io::Error::other("target is not UTF-8"))
            });
        match target {
            Ok(target) => {
                self.totals.symlinks += 1;
                self.shared.push(Frame::Symlink {
                    path: wire,
                    target,
                    mtime_ns: meta.mtime_ns,
                })
            }
            Err(e) => {
                self.shared.error(format!("skipped symlink {wire}: {e}"));
                true
            }
        }
    }

    /// Offers a special file (FIFO, socket, device) and fails it at once, so the receiver
    /// counts it and says why: left to this end's log, a get of a FIFO ended "0 files" with
    /// success.
    fn other(&mut self, entry: Unvisited, meta: Meta) -> bool {
        let id = self.next_id();
        let what = if entry.name.is_empty() {
            "not a regular file"
        } else {
            special_kind(&entry.parent, &entry.name)
        };
        let record = record(entry, id, 0, &meta);
        // Out now: the failure that follows waits at the receiver for its offer.
        self.offers.add(&record.meta);
        self.offers.flush();
        let msg = format!(
            "skipped {}: {what}, not a regular file, directory or symlink",
            record.meta.path
        );
        self.shared.fail_file(&record, ErrorCode::IO, msg)
    }
}

/// What the sender keeps of a file it offers, `size` bytes long.
fn record(entry: Unvisited, id: FileId, size: u64, meta: &Meta) -> FileRecord {
    FileRecord {
        dir: entry.parent,
        name: entry.name,
        base: 0,
        listed: (size, meta.mtime_ns),
        meta: FileMeta {
            id,
            path: entry.wire,
            size,
            mode: meta.mode,
            mtime_ns: meta.mtime_ns,
        },
        final_digest: Mutex::new(None),
        digest: Mutex::new(None),
    }
}
