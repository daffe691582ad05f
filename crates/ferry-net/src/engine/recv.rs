//! The receiving end's driver: it runs a [`RecvSession`] against a control connection, the
//! data connections as they join, and the file side's writers (`ferry_core::recv::Receiver`).
//!
//! A block's way: a data connection's task ([`recv_stream`]) reads it, holds it until its
//! file's offer is answered ([`OfferWait`]), and queues it for the writer threads, which
//! write it into the file's temporary; the file side verifies, syncs and renames the file
//! once every byte is in.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::recv::{Deciding, Receiver, WriterPool};
use ferry_proto::{CompleteSummary, FileId, Frame, TuneReport};
use ferry_session::recv::{RecvAction, RecvPhase, RecvSample, RecvSession};
use tokio::io::{AsyncWriteExt, BufReader, WriteHalf};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::stripe_get::StripeReads;
use super::{
    fault_error, spawn_control_reader, watchdog, Activity, Joins, Limits, StreamReport, StripeIo,
};
use crate::autotune::{LoadMeter, ThreadReport, SAMPLE_EVERY};
use crate::conn::{read_frame, send};
use crate::error::SessionError;
use crate::stream::Stream;
use crate::tcp::{tcp_info, tcp_info_fd};
use crate::timeline::Timeline;

/// A receiving end's writer pool: the gate (its size is the number of threads started) and
/// whether a tuner moves it.
#[derive(Clone)]
pub(crate) struct Writers {
    pub(crate) gate: Arc<ferry_core::gate::Gate>,
    pub(crate) tune: bool,
}

impl Writers {
    /// A pool starting with `start` threads; with `tune`, it may grow to the auto maximum,
    /// never past `most`.
    pub(crate) fn new(start: usize, tune: bool, most: usize) -> Self {
        Self {
            gate: crate::autotune::storage_gate(start, tune, most),
            tune,
        }
    }
}

/// The receiving end's connections and the file side, as the session starts.
pub(crate) struct ReceiverIo {
    pub(crate) control: Stream,
    pub(crate) joins: Joins,
    pub(crate) receiver: Arc<Receiver>,
    /// The file side's frames for the control connection (decisions, failures).
    pub(crate) control_out: flume::Receiver<Frame>,
    /// A striped get's other hosts, with the session's block size, the bytes of a file's
    /// head the coordinator may send early, and whether it sends a file's digest apart
    /// (`STRIPE_DIGEST`: one-block files are striped too) (empty: no striping).
    pub(crate) stripes: (Vec<StripeIo>, u32, u64, bool),
}

/// How the receiving end runs. `leave_early`: once `Complete` is sent and the sender's
/// `Tuned` is in, return without waiting for the sender to close the data connections (a
/// round trip). A client's `get` does: its files are stored, and the sender holds a failed
/// connection against the session only if `Complete` does not follow. A server waits, so that
/// a sending client never has its connections reset under it.
pub(crate) struct RecvRun {
    pub(crate) writers: Writers,
    pub(crate) limits: Limits,
    pub(crate) leave_early: bool,
}

/// Runs the receiving end until every announced entry is resolved, then sends `Complete`.
/// Returns the summary (with this end's load), the streams, and what the sender's tuner
/// reported (`None` if the sender closed without saying).
pub(crate) async fn drive_receiver(
    io: ReceiverIo,
    run: RecvRun,
) -> Result<ReceiverOutcome, SessionError> {
    // However this future ends — error, or dropped mid-way by a shutting-down server — the
    // receiver's temporary files must not outlive the session.
    let mut cleanup = AbortOnDrop(Some(io.receiver.clone()));
    let mut d = RecvDriver::start(io, run)?;
    let result = d.run().await;
    // The connections' tasks take no new frames from here.
    d.stream_tx = None;
    // Every entry is resolved (or the session failed): nothing more is needed of the stripe
    // hosts, whose connections hold the writers' queue open.
    let stripes = match d.stripes.take() {
        Some(s) => s.finish().await,
        None => Vec::new(),
    };
    let outcome = match result {
        Ok(()) => d.complete().await,
        Err(e) => {
            let _ = send(&mut d.ctrl_w, &e.to_frame()).await;
            Err(e)
        }
    };
    d.stop().await;
    let armed = cleanup.0.take();
    if outcome.is_err() {
        if let Some(r) = armed {
            let _ = tokio::task::spawn_blocking(move || r.abort()).await;
        }
    }
    let _ = d.ctrl_w.shutdown().await;
    d.reports.sort_by_key(|(i, _)| *i);
    let summary = outcome?;
    let (tuned, writers, timeline) = d.session.into_report();
    Ok(ReceiverOutcome {
        summary,
        streams: d.reports.into_iter().map(|(_, r)| r).collect(),
        tuned,
        writers,
        timeline,
        stripes,
    })
}

/// The receiving end while it runs.
struct RecvDriver {
    session: RecvSession,
    receiver: Arc<Receiver>,
    writers: Writers,
    limits: Limits,
    leave_early: bool,
    ctrl_w: WriteHalf<Stream>,
    ctrl_rx: mpsc::Receiver<Result<Frame, SessionError>>,
    control_out: flume::Receiver<Frame>,
    joins: Joins,
    /// The writers' queue, as the control loop feeds it offers; dropped before the writers
    /// are joined.
    offers_tx: flume::Sender<Frame>,
    /// The same queue for the data connections' tasks, while they may still start.
    stream_tx: Option<flume::Sender<Frame>>,
    offer_wait: OfferWait,
    fatal_rx: flume::Receiver<ferry_core::recv::RecvError>,
    /// The file side's writer threads (`None` once joined).
    pool: Option<WriterPool>,
    streams: JoinSet<(usize, Result<StreamReport, SessionError>)>,
    /// What each connection has carried, for a report without waiting for its end.
    live: Vec<LiveStream>,
    reports: Vec<(usize, StreamReport)>,
    meter: LoadMeter,
    activity: Activity,
    /// A striped get's other hosts, while they run.
    stripes: Option<StripeReads>,
    /// The session's block size, by which striped files are cut, and the head of each file
    /// left to the coordinator.
    block_size: u32,
    early: u64,
    /// What the stripe hosts cannot bring, for the coordinator (`Resend`).
    stripe_out: mpsc::UnboundedReceiver<Frame>,
}

impl RecvDriver {
    fn start(io: ReceiverIo, run: RecvRun) -> Result<Self, SessionError> {
        let ReceiverIo {
            control,
            joins,
            receiver,
            control_out,
            stripes: (hosts, block_size, early, small),
        } = io;
        let activity = Activity::new();
        let (ctrl_r, ctrl_w) = tokio::io::split(control);
        let ctrl_rx = spawn_control_reader(ctrl_r, activity.clone());
        // A short queue between network and storage: a slow disk pushes back on TCP instead
        // of filling memory. Sized by the writers that start, like the sender's frame queue.
        let (to_writers, from_streams) =
            flume::bounded::<Frame>(run.writers.gate.active() as usize * 2);
        // Told each time a writer has answered an offer: a data connection holds an early
        // block of a file not offered yet until then (see `OfferWait::wait`).
        let offered = Arc::new(tokio::sync::Notify::new());
        let pool = {
            let offered = offered.clone();
            receiver.start(run.writers.gate.clone(), from_streams, move || {
                offered.notify_waiters()
            })?
        };
        let (fatal_rx, deciding) = (pool.fatal(), pool.deciding());
        let gate = &run.writers.gate;
        let session = RecvSession::new(
            Instant::now(),
            (gate.active(), gate.max(), run.writers.tune),
            run.leave_early,
        );
        let offer_wait = OfferWait {
            receiver: receiver.clone(),
            offered,
            deciding,
            limit: run.limits.idle,
        };
        let (stripe_tx, stripe_out) = mpsc::unbounded_channel();
        let stripes = (!hosts.is_empty())
            .then(|| StripeReads::start(hosts, small, to_writers.clone(), stripe_tx));
        Ok(Self {
            session,
            receiver,
            writers: run.writers,
            limits: run.limits,
            leave_early: run.leave_early,
            ctrl_w,
            ctrl_rx,
            control_out,
            joins,
            offers_tx: to_writers.clone(),
            stream_tx: Some(to_writers),
            offer_wait,
            fatal_rx,
            pool: Some(pool),
            streams: JoinSet::new(),
            live: Vec::new(),
            reports: Vec::new(),
            meter: LoadMeter::start(),
            activity,
            stripes,
            block_size,
            early,
            stripe_out,
        })
    }

    /// A data connection joined: its task reads frames for the writers.
    fn spawn_stream(&mut self, index: usize, s: Stream) {
        let Some(tx) = self.stream_tx.clone() else {
            return;
        };
        let (act, offers) = (self.activity.clone(), self.offer_wait.clone());
        let max = self.limits.data_frame;
        let live = LiveStream {
            index,
            // Only an end that leaves early reads a connection from outside its task: a
            // server keeps to one descriptor per connection.
            sock: if self.leave_early {
                s.tcp().as_fd().try_clone_to_owned().ok()
            } else {
                None
            },
            bytes: Arc::default(),
        };
        let bytes = live.bytes.clone();
        self.streams
            .spawn(async move { (index, recv_stream(s, tx, act, max, offers, bytes).await) });
        self.live.push(live);
    }

    /// Moves events between the connections, the writers and the session until every entry
    /// is resolved.
    async fn run(&mut self) -> Result<(), SessionError> {
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let activity = self.activity.clone();
        let dog = watchdog(&activity, self.limits.idle);
        tokio::pin!(dog);
        let done = self.receiver.done();
        loop {
            self.apply().await?;
            if let Some(f) = self.session.failure() {
                return Err(fault_error(f.clone()));
            }
            if self.session.phase() != RecvPhase::Running {
                return Ok(());
            }
            tokio::select! {
                j = self.joins.next(), if !self.joins.complete() => {
                    let (index, s) = j?;
                    self.spawn_stream(index, s);
                    self.activity.touch();
                }
                f = self.ctrl_rx.recv() => match f {
                    Some(Ok(frame)) => {
                        if let (Some(s), Frame::Offer { entries }) = (&self.stripes, &frame) {
                            s.offered(entries);
                        }
                        self.session.handle_control(frame)
                    }
                    Some(Err(e)) => return Err(e),
                    None => return Err(SessionError::Closed("control")),
                },
                Ok(frame) = self.control_out.recv_async() => {
                    let frame = match &self.stripes {
                        Some(s) => s.decide(frame, self.block_size, self.early),
                        None => frame,
                    };
                    send(&mut self.ctrl_w, &frame).await?;
                    self.activity.touch();
                }
                Some(frame) = self.stripe_out.recv() => {
                    send(&mut self.ctrl_w, &frame).await?;
                    self.activity.touch();
                }
                _ = done.recv_async() => self.session.resolved(),
                Ok(e) = self.fatal_rx.recv_async() => return Err(SessionError::Protocol(e.to_string())),
                Some(joined) = self.streams.join_next() => return Err(match joined {
                    Ok((_, Err(e))) => e,
                    Ok((_, Ok(_))) => SessionError::Closed("data"),
                    Err(e) => SessionError::Protocol(format!("stream task failed: {e}")),
                }),
                _ = tick.tick() => self.sample(),
                e = &mut dog => return Err(e),
            }
        }
    }

    /// Carries out what the session decided.
    async fn apply(&mut self) -> Result<(), SessionError> {
        while let Some(action) = self.session.poll_action() {
            match action {
                RecvAction::Expect {
                    files,
                    dirs,
                    symlinks,
                } => self.receiver.expect(files, dirs, symlinks),
                RecvAction::ToWriters(offer) => self.hand_to_writers(offer).await?,
                RecvAction::Writers(n) => self.writers.gate.set(n),
            }
        }
        Ok(())
    }

    /// Hands an offer (or a `Skipped`) to the writers, in order.
    async fn hand_to_writers(&mut self, offer: Frame) -> Result<(), SessionError> {
        if matches!(offer, Frame::Offer { .. }) {
            self.offer_wait.deciding.queued();
        }
        // A writer that failed the session has stopped taking frames: with the queue full,
        // waiting on it alone would never see why.
        tokio::select! {
            sent = self.offers_tx.send_async(offer) => match sent {
                Ok(()) => Ok(()),
                Err(_) => Err(SessionError::Protocol("receiver workers stopped".into())),
            },
            Ok(e) = self.fatal_rx.recv_async() => Err(SessionError::Protocol(e.to_string())),
        }
    }

    fn sample(&mut self) {
        let full = self.offers_tx.is_full();
        self.meter.sample(self.offers_tx.is_empty(), full);
        let s = RecvSample {
            queue_full: full,
            written: self.pool.as_ref().map_or(0, WriterPool::bytes_written),
            files_open: self.receiver.files_open(),
            writers: self.writers.gate.active(),
        };
        self.session.on_sample(Instant::now(), &s);
    }

    /// Every entry is resolved: finishes the files, sends `Complete`, and waits for the
    /// sender to close (or, leaving early, for its report).
    async fn complete(&mut self) -> Result<CompleteSummary, SessionError> {
        tracing::debug!("receiver: all resolved");
        // Failures found while finishing still reach the sender before `Complete`.
        let r = self.receiver.clone();
        let mut summary = tokio::task::spawn_blocking(move || r.finish())
            .await
            .map_err(|e| SessionError::Protocol(format!("finalizer failed: {e}")))?;
        summary.receiver = self.meter.load();
        summary.receiver.threads = u16::try_from(self.session.writer_threads()).unwrap_or(u16::MAX);
        let mut res = Ok(summary.clone());
        for frame in self.control_out.drain() {
            if let Err(e) = send(&mut self.ctrl_w, &frame).await {
                res = Err(e.into());
            }
        }
        if res.is_ok() {
            match send(&mut self.ctrl_w, &Frame::Complete(summary)).await {
                Ok(()) => tracing::debug!("receiver: complete sent"),
                Err(e) => res = Err(e.into()),
            }
        }
        self.session.completed();
        self.closing().await;
        res
    }

    /// Lets the sender close the data connections; their EOF ends the stream tasks. It says
    /// what its tuner did first, on the control connection.
    async fn closing(&mut self) {
        let deadline = tokio::time::sleep(Duration::from_secs(10));
        tokio::pin!(deadline);
        let mut control_open = true;
        loop {
            if self.session.may_leave() {
                // The connections still open report what they carried so far: every byte
                // the session needed.
                for l in &self.live {
                    if !self.reports.iter().any(|(i, _)| *i == l.index) {
                        self.reports.push((l.index, l.report()));
                    }
                }
                tracing::debug!("receiver: leaving without waiting for the sender to close");
                return;
            }
            tokio::select! {
                j = self.streams.join_next() => match j {
                    Some(Ok((i, Ok(r)))) => self.reports.push((i, r)),
                    Some(_) => {}
                    None => break,
                },
                f = self.ctrl_rx.recv(), if control_open => match f {
                    Some(Ok(f)) => self.session.handle_control(f),
                    _ => control_open = false,
                },
                _ = &mut deadline => break,
            }
        }
        if self.session.tuned().is_none() && control_open {
            // The data connections closed first; the report is on its way or not coming.
            let (rx, session) = (&mut self.ctrl_rx, &mut self.session);
            let wait = async {
                while let Some(Ok(f)) = rx.recv().await {
                    session.handle_control(f);
                    if session.tuned().is_some() {
                        return;
                    }
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(1), wait).await;
        }
    }

    /// Stops the writers: order matters. Stop taking new work, let the writers finish what
    /// they hold, and only then clean up, so no writer can create or complete a file after
    /// the cleanup pass.
    async fn stop(&mut self) {
        tracing::debug!("receiver: session over, stopping the writers");
        self.receiver.stop();
        self.streams.abort_all();
        while self.streams.join_next().await.is_some() {}
        // The queue closes once its last sender goes: a parked writer then leaves, the
        // working ones drain what the streams queued.
        let (closed, _) = flume::bounded(0);
        drop(std::mem::replace(&mut self.offers_tx, closed));
        if let Some(pool) = self.pool.take() {
            let _ = tokio::task::spawn_blocking(move || pool.join()).await;
        }
    }
}

/// A receiving connection seen from outside its task: its socket (a duplicate, for
/// `TCP_INFO`) and the block bytes it has carried.
struct LiveStream {
    index: usize,
    sock: Option<std::os::fd::OwnedFd>,
    bytes: Arc<AtomicU64>,
}

impl LiveStream {
    fn report(&self) -> StreamReport {
        StreamReport {
            bytes: self.bytes.load(Ordering::Relaxed),
            tcp: self.sock.as_ref().and_then(|s| tcp_info_fd(s.as_fd())),
            ..StreamReport::default()
        }
    }
}

/// What the receiving end brings home.
pub(crate) struct ReceiverOutcome {
    pub(crate) summary: CompleteSummary,
    pub(crate) streams: Vec<StreamReport>,
    /// What the sender's stream tuner reported (`None` if it closed without saying).
    pub(crate) tuned: Option<TuneReport>,
    /// What this end's writer tuner did.
    pub(crate) writers: ThreadReport,
    /// Bytes written, per interval.
    pub(crate) timeline: Timeline,
    /// What each other host of a striped get did.
    pub(crate) stripes: Vec<super::StripeReport>,
}

/// Aborts the receiver (removing its temporary files) if dropped while still armed.
struct AbortOnDrop(Option<Arc<Receiver>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(r) = self.0.take() {
            r.abort();
        }
    }
}

/// How long a frame that came ahead of its file's offer is held while the receiver has no
/// offer left to answer: the offer is then still on its way (a sender flushes offers within
/// milliseconds, and sends them before the data), or it never comes.
const OFFER_GRACE: Duration = Duration::from_secs(5);

/// What a receiving connection needs to hold a frame back until its file's offer is answered.
#[derive(Clone)]
struct OfferWait {
    receiver: Arc<Receiver>,
    offered: Arc<tokio::sync::Notify>,
    /// Offer frames handed to the writers and not answered yet.
    deciding: Deciding,
    limit: Duration,
}

impl OfferWait {
    /// Returns once the offer of `id` has been answered. A sender sends a file's first blocks
    /// before it has the decision (`Block::early`), so they can overtake the offer, which
    /// travels on the control connection; held here, on the connection's task, they leave
    /// the writers free to answer the offer.
    ///
    /// Held only as long as that can be what happens (issue 35: a 64 MiB block of a file never
    /// offered was held for the idle timeout, 120 s, in every session that sent one): a frame
    /// that is not early was sent after its decision, so its file must be known already; an
    /// early one waits while offers are being answered (one may be its own: deciding reads
    /// files, a re-run's digests) and for [`OFFER_GRACE`] after, never beyond `limit`.
    async fn wait(&self, id: FileId, early: bool) -> Result<(), SessionError> {
        // Nearly always: no waiter registered for the block of a file already answered.
        if self.receiver.offered(id) {
            return Ok(());
        }
        let never =
            || SessionError::Protocol(format!("data of file {} that was never offered", id.0));
        if !early {
            return Err(never());
        }
        let deadline = tokio::time::Instant::now() + self.limit;
        let mut grace = tokio::time::Instant::now() + OFFER_GRACE;
        loop {
            let answered = self.offered.notified();
            tokio::pin!(answered);
            // Enabled before the look, so that an answer right after it is not missed.
            answered.as_mut().enable();
            if self.receiver.offered(id) {
                return Ok(());
            }
            let now = tokio::time::Instant::now();
            if self.deciding.pending() > 0 {
                grace = now + OFFER_GRACE;
            }
            if now >= deadline || now >= grace {
                return Err(never());
            }
            let _ = tokio::time::timeout_at(grace.min(deadline), answered).await;
        }
    }
}

/// Reads data frames from one connection and hands them to the writers.
async fn recv_stream(
    stream: Stream,
    to_writers: flume::Sender<Frame>,
    activity: Activity,
    max_frame: u32,
    offers: OfferWait,
    counted: Arc<AtomicU64>,
) -> Result<StreamReport, SessionError> {
    let mut r = BufReader::with_capacity(256 << 10, stream);
    let mut bytes = 0u64;
    loop {
        let frame = match read_frame(&mut r, max_frame).await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => return Err(e),
        };
        activity.touch();
        match &frame {
            Frame::Block(b) => {
                bytes += b.data.len() as u64;
                counted.store(bytes, Ordering::Relaxed);
                offers.wait(b.file.id, b.early).await?;
            }
            // A reader may fail a file before its offer has left the sender's batch.
            Frame::FileFailed { file, .. } => offers.wait(*file, true).await?,
            Frame::Dir { .. } | Frame::Symlink { .. } => {}
            other => {
                return Err(SessionError::Protocol(format!(
                    "unexpected {:?} on a data connection",
                    other.frame_type()
                )))
            }
        }
        if to_writers.send_async(frame).await.is_err() {
            break;
        }
    }
    let info = tcp_info(r.get_ref().tcp());
    Ok(StreamReport {
        bytes,
        tcp: info,
        ..StreamReport::default()
    })
}
