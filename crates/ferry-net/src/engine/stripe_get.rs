//! The client's stripe hosts in a striped get: servers that share the coordinator's file
//! system and read blocks of the files it offers, which the client asks of them.
//!
//! The coordinator runs the get as any get (walk, offers, every file read and hashed, the
//! file digest on each file's last block). When the client decides to take a file of more
//! than 64 KiB and more than one block whole (`Send`), it answers `Resume` instead, naming as
//! "had" the blocks it will fetch from the stripe hosts: of the file's blocks but its first
//! (and any other the coordinator's early budget may have sent before the decision) and its
//! last, those whose index is not a multiple of the hosts' count (the coordinator included). The coordinator reads them for its digest but does not send them. They go on a
//! queue that every stripe host takes from at its own pace (a few `Fetch`es in flight per
//! data connection), and each arrives as a `Block` on one of the host's data connections,
//! which the client hands to its writers as if the coordinator had sent it: the writers check
//! its XXH3 and hash it into the file's digest, which must equal the coordinator's.
//!
//! A file of one block, with `STRIPE_DIGEST` in the coordinator's `Welcome`, is striped
//! whole: of those the client takes (after the head of the offers the coordinator may have
//! sent early), all but every (hosts' count)th are queued for the stripe hosts and answered
//! `Resume` of the whole file; the coordinator reads and hashes the file and sends its
//! digest apart (`FileDigest` on control) instead of the block.
//!
//! A block stays owed by its host until it arrives. One the host hands back (`Resend`) is
//! asked of the coordinator (`Resend`); when a host fails, or owes blocks and sends nothing
//! for [`SILENCE`], what it owes goes back on the queue for the others, or, when none is
//! left, to the coordinator, and so does everything still queued.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use ferry_core::recv::WHOLE_MIN_SIZE;
use ferry_proto::{
    Decision, FileDecision, FileId, FileMeta, Frame, OfferEntry, MAX_CONTROL_PAYLOAD,
};
use tokio::io::{AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinSet;

use super::stripe::{SILENCE, SILENCE_CHECK};
use super::{Limits, StripeIo, StripeReport};
use crate::conn::{read_frame, write_frame};
use crate::error::SessionError;
use crate::stream::Stream;

/// Blocks asked of a host and not yet arrived, per data connection: enough to keep each
/// connection busy while the next is read, few enough that a host's pace decides its share.
const IN_FLIGHT_PER_STREAM: usize = 2;

/// At most this many blocks' bytes (of the session's size) asked of one host at once, however
/// many connections it has: an auto-tuned session opens dozens, and a window that large let
/// the first host to wake take a whole file's queue (the CLI's endpoint test: 13 blocks, one
/// host took all). Eight blocks of 8 MiB cover 10 Gbit/s at 50 ms. Counted in bytes, so that
/// a host fetching small files keeps as much in flight as one fetching whole blocks.
const IN_FLIGHT_MAX: usize = 8;

/// One block to fetch.
#[derive(Clone, Debug)]
struct Want {
    file: FileId,
    offset: u64,
    len: u32,
}

/// What the hosts share: the queue of blocks to fetch, how many hosts still take from it,
/// and the offered files (the client's own record of each).
struct Dispatch {
    queue: VecDeque<Want>,
    live: usize,
    /// One-block files taken whole so far: every (hosts' count)th stays on the coordinator.
    small: u64,
}

/// The offered files, and the offers' bytes so far.
#[derive(Default)]
struct Offers {
    files: HashMap<FileId, Offered>,
    bytes: u64,
}

/// An offered file: the client's own record of it, and where it starts in the offers' bytes
/// (taken at its decision: the head, which the coordinator may send early, is not fetched
/// elsewhere).
struct Offered {
    entry: OfferEntry,
    start: Option<u64>,
}

struct Shared {
    dispatch: Mutex<Dispatch>,
    /// The queue grew: hosts with room take from it.
    more: Notify,
    offered: Mutex<Offers>,
    /// The coordinator sends a file's digest apart (`STRIPE_DIGEST`): one-block files are
    /// striped too.
    whole_small: bool,
    /// To the coordinator's control connection: `Resend` of what no host can bring.
    coordinator: mpsc::UnboundedSender<Frame>,
    /// The receiver's writers.
    writers: flume::Sender<Frame>,
}

/// The stripe hosts while the get runs.
pub(crate) struct StripeReads {
    shared: Arc<Shared>,
    tasks: JoinSet<()>,
    reports: Vec<Arc<Mutex<StripeReport>>>,
    over: watch::Sender<bool>,
}

impl StripeReads {
    /// Starts every host's session: blocks arrive on `writers`; what must be asked of the
    /// coordinator instead goes on `coordinator`.
    pub(crate) fn start(
        hosts: Vec<StripeIo>,
        whole_small: bool,
        writers: flume::Sender<Frame>,
        coordinator: mpsc::UnboundedSender<Frame>,
    ) -> Self {
        let shared = Arc::new(Shared {
            dispatch: Mutex::new(Dispatch {
                queue: VecDeque::new(),
                live: hosts.len(),
                small: 0,
            }),
            more: Notify::new(),
            offered: Mutex::default(),
            whole_small,
            coordinator,
            writers,
        });
        let (over, _) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let mut reports = Vec::new();
        for io in hosts {
            let report = Arc::new(Mutex::new(StripeReport {
                host: io.host.clone(),
                connections: io.data.len() as u64,
                ..StripeReport::default()
            }));
            reports.push(report.clone());
            let host = Host {
                shared: shared.clone(),
                owed: Arc::default(),
                heard: Arc::new(Mutex::new(Instant::now())),
                room: Arc::new(Notify::new()),
                report,
            };
            tasks.spawn(host.run(io, over.subscribe()));
        }
        Self {
            shared,
            tasks,
            reports,
            over,
        }
    }

    /// The coordinator offered these files: the client's record of each, for the blocks
    /// fetched of them.
    pub(crate) fn offered(&self, entries: &[OfferEntry]) {
        let mut offers = lock(&self.shared.offered);
        for e in entries {
            let start = Some(offers.bytes);
            offers.bytes = offers.bytes.saturating_add(e.size);
            let entry = e.clone();
            offers.files.insert(e.file, Offered { entry, start });
        }
    }

    /// Rewrites the receiver's decisions on their way to the coordinator: a file taken whole
    /// (`Send`) of more than 64 KiB and more than two blocks of `block_size` becomes a
    /// `Resume` that "has" the blocks queued here for the stripe hosts.
    /// `early`: bytes at a file's head the coordinator may have sent before the decision
    /// (its early budget), which are not asked of anyone else.
    pub(crate) fn decide(&self, frame: Frame, block_size: u32, early: u64) -> Frame {
        let Frame::Decisions { entries } = frame else {
            return frame;
        };
        let entries = entries
            .into_iter()
            .map(|d| match d.decision {
                Decision::Send => FileDecision {
                    decision: self.stripe(d.file, block_size, early),
                    file: d.file,
                },
                _ => d,
            })
            .collect();
        Frame::Decisions { entries }
    }

    /// Queues a file's striped blocks and says what the coordinator is to send.
    fn stripe(&self, file: FileId, block_size: u32, early: u64) -> Decision {
        let Some(size) = lock(&self.shared.offered)
            .files
            .get(&file)
            .map(|o| o.entry.size)
        else {
            return Decision::Send;
        };
        let bs = u64::from(block_size.max(1));
        if size > 0 && size <= bs && self.shared.whole_small {
            return self.stripe_small(file, size, early);
        }
        if size <= WHOLE_MIN_SIZE || size <= 2 * bs {
            return Decision::Send;
        }
        let mut dispatch = lock(&self.shared.dispatch);
        if dispatch.live == 0 {
            return Decision::Send;
        }
        let hosts = dispatch.live as u64 + 1;
        let blocks = size.div_ceil(bs);
        let mut have: Vec<(u64, u64)> = Vec::new();
        // Neither the first blocks (the coordinator may have sent them early, before this
        // decision) nor the last (it carries the file digest).
        let first = early.div_ceil(bs).max(1);
        for i in (first..blocks - 1).filter(|i| i % hosts != 0) {
            let (start, end) = (i * bs, ((i + 1) * bs).min(size));
            dispatch.queue.push_back(Want {
                file,
                offset: start,
                len: (end - start) as u32,
            });
            match have.last_mut() {
                Some(last) if last.1 == start => last.1 = end,
                _ => have.push((start, end)),
            }
        }
        drop(dispatch);
        self.shared.more.notify_waiters();
        match have.is_empty() {
            true => Decision::Send,
            false => Decision::Resume { have },
        }
    }

    /// A one-block file: fetched whole from a stripe host, its digest sent apart by the
    /// coordinator, unless it lies in the offers' head that the coordinator may have sent
    /// early (its one block then carries the digest and a copy fetched too would cross a link
    /// for nothing) or it is the coordinator's share.
    fn stripe_small(&self, file: FileId, size: u64, early: u64) -> Decision {
        let start = lock(&self.shared.offered)
            .files
            .get_mut(&file)
            .and_then(|o| o.start.take());
        if start.is_none_or(|s| s < early) {
            return Decision::Send;
        }
        let mut dispatch = lock(&self.shared.dispatch);
        if dispatch.live == 0 {
            return Decision::Send;
        }
        let hosts = dispatch.live as u64 + 1;
        let n = dispatch.small;
        dispatch.small += 1;
        if n.is_multiple_of(hosts) {
            return Decision::Send;
        }
        dispatch.queue.push_back(Want {
            file,
            offset: 0,
            len: size as u32,
        });
        drop(dispatch);
        self.shared.more.notify_waiters();
        Decision::Resume {
            have: vec![(0, size)],
        }
    }

    /// Ends every host's session (the get is over) and reports what each did.
    pub(crate) async fn finish(mut self) -> Vec<StripeReport> {
        super::stripe::end_sessions(&self.over, &mut self.tasks, &self.reports).await
    }
}

/// One stripe host: what it owes and when it was last heard.
#[derive(Clone)]
struct Host {
    shared: Arc<Shared>,
    owed: Arc<Mutex<HashMap<(FileId, u64), Want>>>,
    heard: Arc<Mutex<Instant>>,
    /// A block arrived or was handed back: the host has room for another.
    room: Arc<Notify>,
    report: Arc<Mutex<StripeReport>>,
}

impl Host {
    /// Runs the host's session until it fails or the get is `over`; then closes it, and what
    /// it owes goes to the others.
    async fn run(self, io: StripeIo, mut over: watch::Receiver<bool>) {
        let StripeIo {
            control,
            data,
            block_size,
            ..
        } = io;
        let window = (IN_FLIGHT_PER_STREAM * data.len().max(1)).min(IN_FLIGHT_MAX) as u64
            * u64::from(block_size.max(1));
        let (ctrl_r, mut w) = tokio::io::split(control);
        let mut conns = JoinSet::new();
        let max = Limits::new(Duration::ZERO, block_size).data_frame;
        for s in data {
            conns.spawn(self.clone().blocks(s, max));
        }
        let why = tokio::select! {
            e = self.answers(ctrl_r) => e,
            e = self.ask(&mut w, window, block_size) => e,
            e = self.silent() => e,
            _ = over.wait_for(|o| *o) => SessionError::Closed("stripe data"),
            Some(j) = conns.join_next() => match j {
                Ok(Err(e)) => e,
                Ok(Ok(())) => SessionError::Closed("stripe data"),
                Err(e) => SessionError::Protocol(format!("stripe task failed: {e}")),
            },
        };
        conns.abort_all();
        while conns.join_next().await.is_some() {}
        let _ = tokio::time::timeout(SILENCE_CHECK, w.shutdown()).await;
        let ended = matches!(why, SessionError::Closed("stripe data")) && *over.borrow();
        if !ended {
            tracing::debug!(error = %why, "stripe host failed");
            lock(&self.report).failed = Some(why.to_string());
        }
        self.leave();
    }

    /// The host is out: what it owes goes to the other hosts, or to the coordinator when
    /// none is left, with everything still queued.
    fn leave(&self) {
        let owed: Vec<Want> = lock(&self.owed).drain().map(|(_, w)| w).collect();
        lock(&self.report).bounced += owed.len() as u64;
        let mut dispatch = lock(&self.shared.dispatch);
        dispatch.live -= 1;
        if dispatch.live > 0 {
            for w in owed {
                dispatch.queue.push_front(w);
            }
            drop(dispatch);
            self.shared.more.notify_waiters();
            return;
        }
        let queued: Vec<Want> = dispatch.queue.drain(..).collect();
        drop(dispatch);
        for w in owed.into_iter().chain(queued) {
            self.to_coordinator(&w);
        }
    }

    fn to_coordinator(&self, w: &Want) {
        let _ = self.shared.coordinator.send(Frame::Resend {
            file: w.file,
            offset: w.offset,
            len: w.len,
        });
    }

    /// Asks the host for queued blocks while it has room.
    async fn ask(&self, w: &mut WriteHalf<Stream>, window: u64, block_size: u32) -> SessionError {
        let mut scratch = BytesMut::new();
        loop {
            let more = self.shared.more.notified();
            let room = self.room.notified();
            tokio::pin!(more, room);
            more.as_mut().enable();
            room.as_mut().enable();
            let mut asked = false;
            while owed_bytes(&lock(&self.owed)) < window {
                let Some(want) = self.take(block_size) else {
                    break;
                };
                let entry = lock(&self.shared.offered)
                    .files
                    .get(&want.file)
                    .map(|o| o.entry.clone());
                let Some(entry) = entry else {
                    // Never offered: nothing to fetch (cannot happen; the coordinator asks).
                    self.to_coordinator(&want);
                    continue;
                };
                {
                    let mut owed = lock(&self.owed);
                    if owed.is_empty() {
                        self.hear();
                    }
                    owed.insert((want.file, want.offset), want.clone());
                }
                let fetch = Frame::Fetch {
                    file: want.file,
                    path: entry.path,
                    size: entry.size,
                    mtime_ns: entry.mtime_ns,
                    offset: want.offset,
                    len: want.len,
                };
                if let Err(e) = write_frame(w, &fetch, &mut scratch).await {
                    return e.into();
                }
                asked = true;
            }
            if asked {
                if let Err(e) = w.flush().await {
                    return e.into();
                }
            }
            tokio::select! {
                _ = &mut more => {}
                _ = &mut room => {}
            }
        }
    }

    /// The next queued block, cut to the host's block size (the rest stays queued).
    fn take(&self, block_size: u32) -> Option<Want> {
        let mut dispatch = lock(&self.shared.dispatch);
        let mut want = dispatch.queue.pop_front()?;
        if want.len > block_size && block_size > 0 {
            dispatch.queue.push_front(Want {
                file: want.file,
                offset: want.offset + u64::from(block_size),
                len: want.len - block_size,
            });
            want.len = block_size;
        }
        Some(want)
    }

    /// One data connection: each block the host sends must be one it owes; it goes to the
    /// writers as the client's own record of the file says.
    async fn blocks(self, s: Stream, max: u32) -> Result<(), SessionError> {
        let mut r = tokio::io::BufReader::with_capacity(256 << 10, s);
        let mut carried = false;
        loop {
            let frame = match read_frame(&mut r, max).await? {
                Some(f) => f,
                None => return Err(SessionError::Closed("stripe data")),
            };
            let Frame::Block(mut b) = frame else {
                return Err(SessionError::Protocol(format!(
                    "unexpected {} on a stripe read session's data connection",
                    frame.frame_type().name()
                )));
            };
            let key = (b.file.id, b.offset);
            // Still owed until the writers have it: a connection stopped while it waits for
            // them leaves the block to be asked again (a copy that arrives twice is stored
            // once).
            let owed = lock(&self.owed).get(&key).cloned();
            let Some(want) = owed else {
                return Err(SessionError::Protocol(format!(
                    "stripe host sent a block of file {} at {} that was not asked for",
                    b.file.id.0, b.offset
                )));
            };
            self.hear();
            if b.data.len() != want.len as usize {
                return Err(SessionError::Protocol(format!(
                    "stripe host sent {} bytes of file {} at {}, not the {} asked for",
                    b.data.len(),
                    b.file.id.0,
                    b.offset,
                    want.len
                )));
            }
            let entry = lock(&self.shared.offered)
                .files
                .get(&b.file.id)
                .map(|o| o.entry.clone());
            let Some(entry) = entry else {
                lock(&self.owed).remove(&key);
                continue;
            };
            // The host's word is the bytes and their XXH3, which the writers check; what file
            // they belong to is the client's own record.
            b.file = FileMeta {
                id: entry.file,
                path: entry.path,
                size: entry.size,
                mode: entry.mode,
                mtime_ns: entry.mtime_ns,
            };
            b.file_digest = None;
            b.early = false;
            let len = b.data.len() as u64;
            if self
                .shared
                .writers
                .send_async(Frame::Block(b))
                .await
                .is_err()
            {
                return Err(SessionError::Closed("stripe data"));
            }
            lock(&self.owed).remove(&key);
            {
                let mut rep = lock(&self.report);
                rep.blocks += 1;
                rep.bytes += len;
                if !carried {
                    carried = true;
                    rep.carried += 1;
                }
            }
            self.room.notify_waiters();
        }
    }

    /// The host's control connection: a block handed back (`Resend`) is asked of the
    /// coordinator. Ends with the reason it stopped.
    async fn answers(&self, mut r: ReadHalf<Stream>) -> SessionError {
        loop {
            let frame = match read_frame(&mut r, MAX_CONTROL_PAYLOAD).await {
                Ok(Some(f)) => f,
                Ok(None) => return SessionError::Closed("stripe control"),
                Err(e) => return e,
            };
            self.hear();
            match frame {
                Frame::Resend { file, offset, .. } => {
                    let Some(want) = lock(&self.owed).remove(&(file, offset)) else {
                        continue;
                    };
                    lock(&self.report).bounced += 1;
                    self.to_coordinator(&want);
                    self.room.notify_waiters();
                }
                Frame::Error { code, message } => return SessionError::Remote { code, message },
                other => {
                    return SessionError::Protocol(format!(
                        "unexpected {} from a stripe host",
                        other.frame_type().name()
                    ))
                }
            }
        }
    }

    /// Ends when the host has owed blocks and sent nothing for [`SILENCE`].
    async fn silent(&self) -> SessionError {
        loop {
            tokio::time::sleep(SILENCE_CHECK).await;
            let owes = !lock(&self.owed).is_empty();
            if owes && lock(&self.heard).elapsed() >= SILENCE {
                return SessionError::Timeout("waiting for a stripe host that owes blocks");
            }
        }
    }

    fn hear(&self) {
        *lock(&self.heard) = Instant::now();
    }
}

/// The bytes a host owes: what counts against its window.
fn owed_bytes(owed: &HashMap<(FileId, u64), Want>) -> u64 {
    owed.values().map(|w| u64::from(w.len)).sum()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
