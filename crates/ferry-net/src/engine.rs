//! Runs one transfer over a control connection and N data connections, on either end.
//!
//! The same two loops serve both directions: the client runs [`drive_sender`] for `put` and
//! [`drive_receiver`] for `get`; the server runs the other one. Control traffic:
//!
//! ```text
//!   sender                                   receiver
//!     │── Block/Dir/Symlink/FileFailed ─▶ (any data connection)
//!     │── Sent{totals} ─────────────────▶ (control; as soon as the walk is over)
//!     │◀─ Resend / Skipped / FileFailed ─ (control; whenever they happen)
//!     │── Tuned{report} ────────────────▶ (control; with EARLY_TUNED, once every block is
//!     │                                     on a connection)
//!     │◀─ Complete{summary} ──────────── (control; once every entry is resolved)
//!     │── Tuned{report} ────────────────▶ (control)
//!     └─ closes data connections
//! ```
//! Nothing is acknowledged per file: the sender never waits, and the receiver's only
//! obligation is the final `Complete`. A receiving client that has a `Tuned` when it sends
//! `Complete` leaves at once (`drive_receiver`'s `leave_early`); its resets are not failures
//! if `Complete` follows ([`ENDING_GRACE`]).

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use ferry_core::recv::Receiver;
use ferry_core::send::Sender;
use ferry_core::Reporter;
use ferry_proto::{
    CompleteSummary, FileId, Frame, SessionId, TuneReport, MAX_BLOCK_PAYLOAD, MAX_CONTROL_PAYLOAD,
};
use serde::Serialize;
use tokio::io::{AsyncWriteExt, BufReader, BufWriter, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit};
use tokio::task::JoinSet;

pub(crate) use crate::autotune::StreamPlan;
use crate::autotune::{
    delivered, LoadMeter, StreamControl, ThreadControl, ThreadReport, SAMPLE_EVERY,
};
use crate::conn::{read_frame, send, write_frame};
use crate::endgame::{Conn, Endgame, History};
use crate::error::SessionError;
use crate::stream::Stream;
use crate::tcp::{tcp_info, tcp_info_fd, TcpInfo};
use crate::timeline::Timeline;

/// How long a data connection holds a partly filled write buffer for more frames before it
/// flushes: short enough not to matter to a round trip, long enough to coalesce small files.
const FLUSH_LINGER: Duration = Duration::from_micros(500);

/// How long a data connection may go on writing once the session is over before it is reset:
/// by then the receiver has every block, so anything still being written is a copy nobody
/// needs, and a connection that cannot take it at once is a slow one (`endgame`).
const RESET_AFTER: Duration = Duration::from_millis(20);

/// How long a sender that reported early waits for `Complete` after a data connection failed
/// (at least four round trips): the receiver may have closed it having stored everything, and
/// `Complete` may come later than the reset, or after a retransmission.
const ENDING_GRACE: Duration = Duration::from_secs(2);

/// Blocks a ramp helper carries before it parks for good (`StreamPlan::helpers`): the first
/// blocks of a transfer are cut to 256 and 512 KiB, so two are about what a connection opening
/// from the kernel's 10 segments sends in its first three round trips at MTU 9000. One or
/// three each won less, four or more nothing (BENCHMARKS.md, "Ramp helpers").
const HELPER_BLOCKS: u32 = 2;

/// One data connection through its handshake: its index, and on a server its connection-cap
/// permit; or why one could not join (a client's dial or `Hello` failed).
pub(crate) type Joined = Result<(u16, Stream, Option<OwnedSemaphorePermit>), SessionError>;

/// The receiving end's data connections, still joining while the receiver answers the
/// sender's offers: a server's `put` has its decisions travel back right behind `Ready`, a
/// client's `get` while its data connections wait for their `Welcome`; either way the data
/// follows a round trip sooner than if the offers waited for the last connection. They come
/// from the server's listener (with their connection-cap permits) or the client's dials, and
/// are checked here for both: each index in range and new, each with the socket buffers asked
/// for. The permits stay here for as long as the session holds its `Joins`.
pub(crate) struct Joins {
    rx: mpsc::Receiver<Joined>,
    /// When the last one must have joined (the handshake timeout after `Ready`).
    deadline: tokio::time::Instant,
    /// Fixed socket buffers the client asked for (0: the kernel's autotuning).
    tcp_window: u32,
    seen: Vec<bool>,
    permits: Vec<OwnedSemaphorePermit>,
}

impl Joins {
    pub(crate) fn new(
        rx: mpsc::Receiver<Joined>,
        n: usize,
        deadline: tokio::time::Instant,
        tcp_window: u32,
    ) -> Self {
        if tcp_window > 0 {
            tracing::warn!(
                window = tcp_window,
                "client asked for fixed socket buffers: TCP autotuning is off for this session's data connections"
            );
        }
        Self {
            rx,
            deadline,
            tcp_window,
            // One per connection granted in `Ready`.
            seen: vec![false; n],
            permits: Vec::new(),
        }
    }

    /// When the last connection must have joined.
    pub(crate) fn deadline(&self) -> tokio::time::Instant {
        self.deadline
    }

    /// Whether every connection has joined.
    pub(crate) fn complete(&self) -> bool {
        self.seen.iter().all(|&s| s)
    }

    /// The next connection to join, with its index; cancel-safe. Once all have joined the
    /// channel is closed, so a late or extra connection is refused at once.
    pub(crate) async fn next(&mut self) -> Result<(usize, Stream), SessionError> {
        let (index, s, permit) = tokio::time::timeout_at(self.deadline, self.rx.recv())
            .await
            .map_err(|_| SessionError::Timeout("waiting for data connections to join"))?
            .ok_or(SessionError::Closed("data"))??;
        let slot = self.seen.get_mut(usize::from(index)).ok_or_else(|| {
            SessionError::Protocol(format!("data connection index {index} out of range"))
        })?;
        if std::mem::replace(slot, true) {
            return Err(SessionError::Protocol(format!(
                "data connection {index} joined twice"
            )));
        }
        if let Err(e) = crate::tcp::set_window(s.tcp(), self.tcp_window) {
            tracing::warn!("cannot set TCP window: {e}");
        }
        self.permits.extend(permit);
        if self.complete() {
            // The session's secret opens nothing more.
            self.rx.close();
        }
        Ok((usize::from(index), s))
    }

    /// The connection-cap permits of the connections that joined.
    pub(crate) fn into_permits(self) -> Vec<OwnedSemaphorePermit> {
        self.permits
    }
}

/// How a data connection fared.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StreamReport {
    pub bytes: u64,
    /// Data bytes of blocks this connection sent a second time at the end of the transfer,
    /// for a slower connection that still held them (sending end only; `endgame`).
    pub resent: u64,
    /// The connection was reset when the session ended, still writing copies the receiver
    /// no longer needed (sending end only).
    pub reset: bool,
    pub tcp: Option<TcpInfo>,
}

/// Time of the last frame seen or sent on any connection of the session, for the idle timeout.
#[derive(Clone)]
pub(crate) struct Activity {
    start: Instant,
    last_ms: Arc<AtomicU64>,
}

impl Activity {
    pub(crate) fn new() -> Self {
        Self {
            start: Instant::now(),
            last_ms: Arc::default(),
        }
    }

    fn touch(&self) {
        self.last_ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn idle(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }
}

/// Resolves with an error once the session has been idle for `limit`.
async fn watchdog(activity: &Activity, limit: Duration) -> SessionError {
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if activity.idle() > limit {
            return SessionError::Timeout("waiting for the peer (no traffic on any connection)");
        }
    }
}

/// Reads control frames in their own task: a read cut short by `select!` would lose bytes.
fn spawn_control_reader(
    mut r: ReadHalf<Stream>,
    activity: Activity,
) -> mpsc::Receiver<Result<Frame, SessionError>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let item = match read_frame(&mut r, MAX_CONTROL_PAYLOAD).await {
                Ok(Some(f)) => Ok(f),
                Ok(None) => Err(SessionError::Closed("control")),
                Err(e) => Err(e),
            };
            activity.touch();
            let stop = item.is_err();
            if tx.send(item).await.is_err() || stop {
                return;
            }
        }
    });
    rx
}

/// Limits shared by both loops.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) idle: Duration,
    /// Largest frame a data connection may carry: the session's block size plus the block
    /// header, so a peer cannot make the receiver reserve more than the session's memory
    /// bound allows by announcing a block larger than agreed.
    pub(crate) data_frame: u32,
}

impl Limits {
    pub(crate) fn new(idle: Duration, block_size: u32) -> Self {
        Self {
            idle,
            data_frame: block_size
                .saturating_add(MAX_BLOCK_PAYLOAD - ferry_proto::MAX_BLOCK_DATA)
                .min(MAX_BLOCK_PAYLOAD),
        }
    }
}

/// What the sending end brings home.
pub(crate) struct SenderOutcome {
    pub(crate) summary: CompleteSummary,
    pub(crate) streams: Vec<StreamReport>,
    pub(crate) remote_errors: Vec<String>,
    pub(crate) sender: Sender,
    /// What the stream tuner did, and this end's load (also sent to the receiver in `Tuned`).
    pub(crate) tuning: TuneReport,
    /// What the reader tuner did.
    pub(crate) readers: ThreadReport,
    /// Bytes the receiver acknowledged, per interval.
    pub(crate) timeline: Timeline,
    /// The streams and block size of the server's `Ready`, when it came during the session
    /// (`drive_sender`'s `awaiting`).
    pub(crate) granted: Option<(u16, u32)>,
}

/// A client's session whose control connection has carried its `Hello` and request but not
/// yet the server's `Welcome` and `Ready`: the sender reads them on the way, and writes at
/// most [`crate::client::EARLY_OFFER_BYTES`] of offers before them.
struct Awaiting {
    session: (SessionId, [u8; 32]),
    welcomed: bool,
    offered: usize,
}

/// A receiving end's writer pool: the gate (its size is the number of threads started) and
/// whether a tuner moves it.
#[derive(Clone)]
pub(crate) struct Writers {
    pub(crate) gate: Arc<ferry_core::gate::Gate>,
    pub(crate) tune: bool,
}

impl Writers {
    /// A pool starting with `start` threads; with `tune`, it may grow to the auto maximum.
    pub(crate) fn new(start: usize, tune: bool) -> Self {
        Self {
            gate: crate::autotune::storage_gate(start, tune),
            tune,
        }
    }
}

/// The bounded queue between the readers and the data connections, sized by `plan`.
pub(crate) fn frame_queue(
    plan: &StreamPlan,
    streams: u16,
) -> (flume::Sender<Frame>, flume::Receiver<Frame>) {
    flume::bounded(plan.queue_len(streams))
}

/// Runs the sending end until the receiver reports `Complete`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn drive_sender(
    control: Stream,
    data: Vec<Stream>,
    sender: Sender,
    frames: flume::Receiver<Frame>,
    control_out: flume::Receiver<Frame>,
    reporter: Arc<dyn Reporter>,
    limits: Limits,
    plan: StreamPlan,
    welcome: Option<Duration>,
    awaiting: Option<(SessionId, [u8; 32])>,
) -> Result<SenderOutcome, SessionError> {
    let mut awaiting = awaiting.map(|session| Awaiting {
        session,
        welcomed: false,
        offered: 0,
    });
    let mut granted = None;
    let activity = Activity::new();
    let mut meter = LoadMeter::start();
    let (t0, mut timeline) = (Instant::now(), Timeline::new());
    // The path's round trip, for the tuner's timing: the control connection has carried a TLS
    // handshake and the request by now, so TCP has a minimum RTT for it.
    let rtt = tcp_info(control.tcp())
        .map(|i| Duration::from_micros(u64::from(i.min_rtt_us)))
        .unwrap_or_default();
    let (mut gate, active) = StreamControl::new(plan, &data, rtt);
    let mut readers = ThreadControl::new(
        sender.readers(),
        ferry_core::tune::Knob::Readers,
        plan.tune_storage,
    );
    let (ctrl_r, mut ctrl_w) = tokio::io::split(control);
    let mut ctrl_rx = spawn_control_reader(ctrl_r, activity.clone());
    let mut scratch = bytes::BytesMut::new();
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut streams = JoinSet::new();
    // What each connection was given and may not have delivered yet, and the queue of copies
    // for idle connections (`endgame`). The copies are bounded by the histories.
    // A connection whose `Welcome` is read alongside keeps every block until it has it: if
    // the server refuses it as beyond the grant, they go again on another (below).
    let histories: Vec<Arc<Mutex<History>>> = data
        .iter()
        .map(|_| Arc::new(Mutex::new(History::new(welcome.is_none()))))
        .collect();
    let (copies_tx, copies_rx): (Vec<_>, Vec<_>) =
        data.iter().map(|_| flume::unbounded::<Frame>()).unzip();
    let stall_took = plan.stall.map(|_| watch::channel(false));
    let mut tasks = Vec::with_capacity(data.len());
    // The helpers are the last connections, beyond what the tuner may use.
    let mains = data.len().saturating_sub(usize::from(plan.helpers));
    for (i, s) in data.into_iter().enumerate() {
        let helper = i >= mains;
        let queues = Queues {
            frames: frames.clone(),
            copies: copies_rx[i].clone(),
            history: histories[i].clone(),
        };
        let (stop, act, rep) = (stop_rx.clone(), activity.clone(), reporter.clone());
        let active = active.clone();
        let stall = match &stall_took {
            None => StallHook::Off,
            Some((tx, _)) if plan.stall == Some(i) => StallHook::Stall(tx.clone()),
            Some((_, rx)) => StallHook::After(rx.clone()),
        };
        let task = streams.spawn(async move {
            (
                i,
                send_stream(i, s, queues, stop, active, act, rep, welcome, stall, helper).await,
            )
        });
        tasks.push(task);
    }
    // Which connection a stopped task was, for one stopped as beyond the grant.
    let by_id: HashMap<tokio::task::Id, usize> =
        tasks.iter().enumerate().map(|(i, t)| (t.id(), i)).collect();
    drop(copies_rx);
    let mut endgame = Endgame::default();
    // Only the stream tasks and this loop's probe may hold the queue now: the probe is
    // dropped with the loop, so when the streams end, readers blocked on a full queue see it
    // disconnected and stop.
    let probe = frames;
    let totals = sender.totals();
    let mut sent = false;
    let mut drained = false;
    // `Tuned` sent ahead of `Complete` (`StreamPlan::early_tuned`).
    let mut reported = false;
    // A data connection's failure after it, held for the grace (below).
    let mut ending: Option<SessionError> = None;
    let grace = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(grace);
    let mut remote_errors = Vec::new();
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let dog = watchdog(&activity, limits.idle);
    tokio::pin!(dog);
    // The walk's totals, until they go out behind every offer they count.
    let mut walked: Option<ferry_core::send::WalkTotals> = None;
    // Connections that failed before their `Welcome` and before `Ready`, with why.
    let mut provisional: Vec<(usize, SessionError)> = Vec::new();
    let result = loop {
        // The offers are queued before the totals, but a loop turn may find both: the totals
        // wait until the offers have gone (and `Ready` has come, which the later offers wait
        // for).
        if awaiting.is_none() && control_out.is_empty() {
            if let Some(t) = walked.take() {
                let frame = Frame::Sent {
                    files: t.files,
                    dirs: t.dirs,
                    symlinks: t.symlinks,
                    bytes: t.bytes,
                };
                if let Err(e) = send(&mut ctrl_w, &frame).await {
                    break Err(e.into());
                }
            }
        }
        tokio::select! {
            t = totals.recv_async(), if !sent => {
                sent = true;
                walked = t.ok();
            }
            Ok(frame) = control_out.recv_async(),
                if awaiting.as_ref().is_none_or(|a| a.offered < crate::client::EARLY_OFFER_BYTES) =>
            {
                match crate::conn::write_frame(&mut ctrl_w, &frame, &mut scratch).await {
                    Ok(n) => {
                        if let Some(a) = awaiting.as_mut() {
                            a.offered += n;
                        }
                    }
                    Err(e) => break Err(e.into()),
                }
                if let Err(e) = ctrl_w.flush().await {
                    break Err(e.into());
                }
                activity.touch();
            }
            f = ctrl_rx.recv() => match f {
                Some(Ok(welcome @ Frame::Welcome { .. }))
                    if awaiting.as_ref().is_some_and(|a| !a.welcomed) =>
                {
                    let a = awaiting.as_mut().expect("checked by the guard");
                    let checked = crate::client::welcome_of(welcome)
                        .and_then(|theirs| crate::client::same_session(theirs, a.session));
                    if let Err(e) = checked {
                        break Err(e);
                    }
                    a.welcomed = true;
                }
                Some(Ok(Frame::Ready { streams, block_size }))
                    if awaiting.as_ref().is_some_and(|a| a.welcomed) =>
                {
                    if usize::from(streams) > histories.len() {
                        // A dial failed (the server at its connection cap, say): the server
                        // would wait for a connection that never comes.
                        break Err(SessionError::Io(std::io::Error::other(format!(
                            "{} of the {streams} data connections granted could be opened",
                            histories.len()
                        ))));
                    }
                    // Connections that ended without their `Welcome` before `Ready`: refused
                    // as beyond the grant, or a failure.
                    let mut failure = None;
                    for (i, e) in provisional.drain(..) {
                        if i < usize::from(streams) {
                            failure.get_or_insert(e);
                        } else {
                            resend_on_first(i, &histories, &copies_tx);
                        }
                    }
                    if let Some(e) = failure {
                        break Err(e);
                    }
                    // Before any decision: the server answers offers only after `Ready`.
                    sender.grant(block_size, streams);
                    gate.limit(u32::from(streams));
                    granted = Some((streams, block_size));
                    awaiting = None;
                    // Dialled beyond the grant: the server refuses them; stop them now (what
                    // they carried goes again when their task has ended, below).
                    for t in tasks.iter().skip(usize::from(streams)) {
                        t.abort();
                    }
                }
                Some(Ok(Frame::Resend { file, offset, len })) => sender.resend(file, offset, len),
                Some(Ok(Frame::Decisions { entries })) => sender.decide(entries),
                Some(Ok(Frame::EntryFailed { message, .. })) => remote_errors.push(message),
                Some(Ok(Frame::FileFailed { file, message, .. })) => {
                    sender.skip(file);
                    remote_errors.push(message);
                }
                Some(Ok(Frame::Complete(summary))) => break Ok(summary),
                Some(Ok(Frame::Error { code, message })) => break Err(SessionError::Remote { code, message }),
                Some(Ok(other)) => break Err(SessionError::Protocol(format!("unexpected {:?} on control", other.frame_type()))),
                Some(Err(e)) => break Err(e),
                None => break Err(SessionError::Closed("control")),
            },
            _ = &mut grace, if ending.is_some() => {
                break Err(ending.take().expect("checked by the guard"));
            }
            Some(joined) = streams.join_next_with_id() => {
                let joined = match joined {
                    // After the early `Tuned`, a receiver with everything stored may close its
                    // data connections as soon as it has sent `Complete`, and a block still on
                    // its way then resets one here, perhaps before `Complete` is read. A
                    // failure is final only if the session does not end well within the grace.
                    Ok((_, (_, Err(e)))) if reported => {
                        if ending.is_none() {
                            let wait = (rtt * 4).max(ENDING_GRACE);
                            grace.as_mut().reset(tokio::time::Instant::now() + wait);
                            tracing::debug!(error = %e, "sender: a data connection ended after the early report");
                        }
                        ending.get_or_insert(e);
                        continue;
                    }
                    j => j,
                };
                // Dialled beyond what the server grants: refused by it (`not_granted`, or a
                // reset that destroyed it), or stopped here once `Ready` said so. What it
                // carried goes again on connection 0, which every grant includes. A connection
                // without its `Welcome` that ends before `Ready` is judged when `Ready` comes.
                let (i, failed) = match joined {
                    Err(e) if e.is_cancelled() => match by_id.get(&e.id()) {
                        Some(&i) => (i, None),
                        None => break Err(SessionError::Protocol(format!("stream task failed: {e}"))),
                    },
                    Err(e) => break Err(SessionError::Protocol(format!("stream task failed: {e}"))),
                    Ok((_, (_, Ok(_)))) => break Err(SessionError::Protocol("data connection ended early".into())),
                    Ok((_, (i, Err(e)))) if i == 0 || !lock(&histories[i]).is_unwelcomed() => break Err(e),
                    Ok((_, (i, Err(e)))) => (i, Some(e)),
                };
                match (granted, failed) {
                    (Some((n, _)), Some(e)) if i < usize::from(n) => break Err(e),
                    (None, Some(e)) => provisional.push((i, e)),
                    _ => resend_on_first(i, &histories, &copies_tx),
                }
            }
            _ = tick.tick() => {
                let (empty, full) = (probe.is_empty(), probe.is_full());
                meter.sample(empty, full);
                // One TCP_INFO of every connection per sample, for all three users.
                let infos = gate.infos();
                gate.on_sample(empty, sender.found(), sent, &infos);
                readers.on_sample(empty, sender.bytes_read());
                let armed = empty && sender.all_queued();
                if armed && plan.drain_at_end && !drained {
                    drained = true;
                    tokio::task::spawn_blocking(ferry_core::buf::drain);
                }
                if armed && plan.early_tuned && !reported {
                    // Every block is on a connection: the tuner has nothing left to decide,
                    // and the report overtakes the last blocks, which sit in the data
                    // connections' send buffers. The receiver then has it by the time it
                    // sends `Complete` and need not wait for the one sent after.
                    reported = true;
                    let mut load = meter.load();
                    load.threads = u16::try_from(readers.threads()).unwrap_or(u16::MAX);
                    if let Err(e) = send(&mut ctrl_w, &Frame::Tuned(gate.report(load))).await {
                        break Err(e.into());
                    }
                }
                let copies =
                    endgame_tick(&mut endgame, &histories, &infos, gate.active(), rtt, armed);
                for (to, frame) in copies.pieces() {
                    let _ = copies_tx[to].send(frame);
                }
                let now = t0.elapsed();
                if timeline.due(now) {
                    timeline.record(now, delivered(&infos));
                }
            }
            e = &mut dog => break Err(e),
        }
    };
    drop(probe);
    tracing::debug!("sender: loop ended");
    let mut load = meter.load();
    load.threads = u16::try_from(readers.threads()).unwrap_or(u16::MAX);
    let tuning = gate.report(load);
    // Its duplicates of the data sockets go now: a connection reset at the end closes at once.
    drop(gate);
    drop(copies_tx);
    if endgame.copied().0 > 0 {
        tracing::debug!(
            blocks = endgame.copied().0,
            bytes = endgame.copied().1,
            "endgame: blocks sent again on idle connections"
        );
    }
    if result.is_ok() {
        // The receiver reports (and remembers) what the tuner did; it is not an error if it
        // has already gone.
        let _ = send(&mut ctrl_w, &Frame::Tuned(tuning.clone())).await;
    }
    let _ = stop_tx.send(true);
    // Readers waiting for a decision that will never come must not hold the session.
    sender.close();
    let mut reports = Vec::new();
    // A stream stuck writing to a peer that went away must not hold the session forever.
    let deadline = tokio::time::sleep(Duration::from_secs(10));
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            j = streams.join_next() => match j {
                Some(Ok((i, Ok(r)))) => reports.push((i, r)),
                Some(_) => {}
                None => break,
            },
            _ = &mut deadline => {
                streams.abort_all();
                break;
            }
        }
    }
    tracing::debug!("sender: data connections closed (or given up at the deadline)");
    reports.sort_by_key(|(i, _)| *i);
    let _ = ctrl_w.shutdown().await;
    let sender = tokio::task::spawn_blocking(move || {
        let mut s = sender;
        s.join_readers();
        s
    })
    .await
    .map_err(|e| SessionError::Protocol(format!("reader threads failed: {e}")))?;
    tracing::debug!("sender: readers joined");
    let summary = result?;
    Ok(SenderOutcome {
        summary,
        streams: reports.into_iter().map(|(_, r)| r).collect(),
        remote_errors,
        sender,
        tuning,
        readers: readers.report(),
        timeline,
        granted,
    })
}

/// Queues what connection `i` was given before the server refused it (or it was stopped as
/// beyond the grant) for connection 0, which every grant includes.
fn resend_on_first(i: usize, histories: &[Arc<Mutex<History>>], copies: &[flume::Sender<Frame>]) {
    let frames = lock(&histories[i]).take_frames();
    tracing::debug!(
        stream = i,
        frames = frames.len(),
        "data connection beyond the grant"
    );
    for f in frames {
        let _ = copies[0].send(f);
    }
}

/// One endgame tick: what each connection's kernel still holds, then the copies to queue,
/// cut and hashed after the histories are let go (their tasks lock them per frame).
fn endgame_tick(
    endgame: &mut Endgame,
    histories: &[Arc<Mutex<History>>],
    infos: &[Option<TcpInfo>],
    active: u32,
    rtt: Duration,
    armed: bool,
) -> crate::endgame::Copies {
    let mut guards: Vec<_> = histories.iter().map(|h| lock(h)).collect();
    let mut conns: Vec<Conn<'_>> = guards
        .iter_mut()
        .zip(infos)
        .enumerate()
        .map(|(i, (h, info))| Conn {
            history: h,
            unacked: info.as_ref().map(TcpInfo::unacked_bytes),
            rate: info.as_ref().map_or(0, TcpInfo::send_rate),
            delivered: info.as_ref().map_or(0, TcpInfo::delivered),
            active: (i as u32) < active,
        })
        .collect();
    endgame.tick(Instant::now(), rtt, armed, &mut conns)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where a sending connection takes its frames: the shared queue, the endgame's copies dealt
/// to it, and the record of what it was given.
struct Queues {
    frames: flume::Receiver<Frame>,
    copies: flume::Receiver<Frame>,
    history: Arc<Mutex<History>>,
}

/// One data connection of the sending end. `welcome`: the connection's `Hello` went out
/// without waiting for the server's `Welcome` (a client's `put`, which saves a round trip
/// before the data); it is read here while the frames go out, within this time. A refusal
/// (`Error`) ends the stream with the server's reason, also when it is what broke a write.
/// A stream that ends well needs no `Welcome`: the session's `Complete` vouches for it, and a
/// session that completes before every connection joined never welcomes the late ones.
///
/// Once the session is over (`stop`), a connection still writing [`RESET_AFTER`] later is
/// reset rather than drained: the receiver has everything, and what it is still writing are
/// copies that a slow connection would take its time over (`endgame`).
#[allow(clippy::too_many_arguments)]
async fn send_stream(
    index: usize,
    stream: Stream,
    queues: Queues,
    stop: watch::Receiver<bool>,
    active: watch::Receiver<u32>,
    activity: Activity,
    reporter: Arc<dyn Reporter>,
    welcome: Option<Duration>,
    stall: StallHook,
    helper: bool,
) -> Result<StreamReport, SessionError> {
    let sock = stream.tcp().as_fd().try_clone_to_owned().ok();
    let counts = Arc::new(Counts::default());
    let history = queues.history.clone();
    let (welcomed_tx, welcomed) = watch::channel(welcome.is_none());
    let work = {
        let (counts, stop) = (counts.clone(), stop.clone());
        async move {
            let (mut rd, wr) = tokio::io::split(stream);
            let mut w = BufWriter::with_capacity(256 << 10, wr);
            let result = {
                let body = send_frames(
                    index, &mut w, queues, stop, active, welcomed, activity, reporter, &counts,
                    stall, helper,
                );
                tokio::pin!(body);
                match welcome {
                    None => body.await,
                    Some(limit) => {
                        let confirm = || {
                            lock(&history).confirm();
                            let _ = welcomed_tx.send(true);
                        };
                        alongside_welcome(body, &mut rd, limit, confirm).await
                    }
                }
            };
            finish_stream(rd, w, result, &counts).await
        }
    };
    tokio::pin!(work);
    tokio::select! {
        r = &mut work => r,
        () = stopped_for(stop, RESET_AFTER) => {
            let tcp = sock.as_ref().and_then(|s| tcp_info_fd(s.as_fd()));
            if let Some(s) = &sock {
                // A close with lingering off sends a reset and drops what the socket holds.
                let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
            }
            tracing::debug!(stream = index, "reset at the end, still writing");
            Ok(counts.report(tcp, true))
        }
    }
}

/// Resolves `after` the session was told to stop (or its stop signal went away).
async fn stopped_for(mut stop: watch::Receiver<bool>, after: Duration) {
    let _ = stop.wait_for(|s| *s).await;
    tokio::time::sleep(after).await;
}

/// Bytes a sending connection has written so far, kept outside its task so that a connection
/// reset at the end still reports them.
#[derive(Default)]
struct Counts {
    bytes: AtomicU64,
    resent: AtomicU64,
}

impl Counts {
    fn report(&self, tcp: Option<TcpInfo>, reset: bool) -> StreamReport {
        StreamReport {
            bytes: self.bytes.load(Ordering::Relaxed),
            resent: self.resent.load(Ordering::Relaxed),
            reset,
            tcp,
        }
    }
}

/// Runs `body` (the frames going out) while the connection's `Welcome` is read, within
/// `limit`. A refusal ends it with the server's reason, also when the refusal is what broke a
/// write (a second to read it then).
async fn alongside_welcome<F>(
    mut body: std::pin::Pin<&mut F>,
    rd: &mut ReadHalf<Stream>,
    limit: Duration,
    on_welcome: impl FnOnce(),
) -> Result<(), SessionError>
where
    F: std::future::Future<Output = Result<(), SessionError>>,
{
    let mut on_welcome = Some(on_welcome);
    let greeted = tokio::time::timeout(limit, read_welcome_on(rd));
    tokio::pin!(greeted);
    let mut welcomed = false;
    loop {
        tokio::select! {
            r = &mut body => return match r {
                Err(e) if !welcomed => {
                    match tokio::time::timeout(Duration::from_secs(1), &mut greeted).await {
                        Ok(Ok(Err(refused @ SessionError::Remote { .. }))) => Err(refused),
                        _ => Err(e),
                    }
                }
                r => r,
            },
            g = &mut greeted, if !welcomed => match g {
                Ok(Ok(())) => {
                    welcomed = true;
                    if let Some(f) = on_welcome.take() {
                        f();
                    }
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(SessionError::Timeout("waiting for a data connection's welcome")),
            },
        }
    }
}

/// The data connection's `Welcome`, or the server's refusal.
async fn read_welcome_on(rd: &mut ReadHalf<Stream>) -> Result<(), SessionError> {
    match crate::conn::expect_frame(rd, MAX_CONTROL_PAYLOAD, "data").await? {
        Frame::Welcome { .. } => Ok(()),
        other => Err(SessionError::Protocol(format!(
            "expected Welcome on a data connection, got {:?}",
            other.frame_type()
        ))),
    }
}

/// Flushes and closes a data connection after its frames, with what TCP says about it.
async fn finish_stream(
    rd: ReadHalf<Stream>,
    mut w: BufWriter<WriteHalf<Stream>>,
    result: Result<(), SessionError>,
    counts: &Counts,
) -> Result<StreamReport, SessionError> {
    result?;
    w.flush().await?;
    let mut stream = rd.unsplit(w.into_inner());
    let info = tcp_info(stream.tcp());
    let _ = stream.shutdown().await;
    Ok(counts.report(info, false))
}

/// Test hook (`StreamPlan::stall`): one connection never writes its first block, as if its
/// window had closed for good; the others start taking frames only once it holds one
/// (waiting at most 2 s), or on a fast path they could send everything before it took any
/// and there would be nothing stuck to test.
#[derive(Clone)]
enum StallHook {
    Off,
    Stall(watch::Sender<bool>),
    After(watch::Receiver<bool>),
}

/// Pulls frames from the shared queue and writes them until told to stop. Stream `index`
/// takes frames only while `index < active`; otherwise it flushes and parks without touching
/// the queue, so the tuner decides how many connections carry data. A ramp `helper` takes
/// [`HELPER_BLOCKS`] blocks whatever the gate says, then parks until the session ends. With
/// the queue empty a stream also takes the endgame's copies of blocks that another connection
/// holds. Each frame is recorded in the connection's history before it is written. `stall`: a
/// test hook.
#[allow(clippy::too_many_arguments)]
async fn send_frames(
    index: usize,
    w: &mut BufWriter<WriteHalf<Stream>>,
    queues: Queues,
    mut stop: watch::Receiver<bool>,
    mut active: watch::Receiver<u32>,
    mut welcomed: watch::Receiver<bool>,
    activity: Activity,
    reporter: Arc<dyn Reporter>,
    counts: &Counts,
    stall: StallHook,
    helper: bool,
) -> Result<(), SessionError> {
    let Queues {
        frames,
        copies,
        history,
    } = queues;
    if let StallHook::After(mut took) = stall.clone() {
        // Bounded: a stalled connection that is parked never takes a block.
        let _ = tokio::time::timeout(Duration::from_secs(2), took.wait_for(|t| *t)).await;
    }
    let mut scratch = BytesMut::with_capacity(8 << 10);
    let is_active = move |n: &u32| index < *n as usize;
    // A helper ignores the tuner's gate: it carries its blocks from the start, then parks.
    let mut gated = !helper;
    let mut blocks = 0u32;
    loop {
        if helper && blocks >= HELPER_BLOCKS {
            // A helper's part is done: it drains what it holds and takes nothing more, not
            // even the endgame's copies (it is never counted active), so it cannot be the
            // slow connection at the end.
            w.flush().await?;
            lock(&history).wait();
            let _ = stop.wait_for(|s| *s).await;
            break;
        }
        if !helper && !is_active(&active.borrow()) {
            w.flush().await?;
            lock(&history).wait();
            tokio::select! {
                r = active.wait_for(is_active) => if r.is_err() { break },
                _ = stop.wait_for(|s| *s) => break,
            }
            continue;
        }
        if !*welcomed.borrow() && lock(&history).held() >= ferry_core::send::EARLY_PER_STREAM {
            // Before its `Welcome` a connection carries one first flight's worth: the
            // session's early blocks are spread over every connection's first flight rather
            // than queued behind the first few.
            w.flush().await?;
            tokio::select! {
                r = welcomed.wait_for(|w| *w) => if r.is_err() { break },
                _ = stop.wait_for(|s| *s) => break,
            }
            continue;
        }
        let (frame, copy) = match frames.try_recv() {
            Ok(f) => (f, false),
            Err(flume::TryRecvError::Disconnected) => break,
            Err(flume::TryRecvError::Empty) => {
                // Nothing queued. Small files arrive a few at a time from several readers:
                // flushing at once sends each as its own few packets on every stream. Wait a
                // moment for more to fill the buffer, then flush before waiting longer.
                let more = if w.buffer().is_empty() {
                    None
                } else {
                    tokio::time::timeout(FLUSH_LINGER, frames.recv_async())
                        .await
                        .ok()
                };
                match more {
                    Some(Ok(f)) => (f, false),
                    Some(Err(_)) => break,
                    None => {
                        w.flush().await?;
                        lock(&history).wait();
                        tokio::select! {
                            f = frames.recv_async() => match f { Ok(f) => (f, false), Err(_) => break },
                            Ok(f) = copies.recv_async() => (f, true),
                            _ = stop.wait_for(|s| *s) => break,
                            // Parked while waiting: the frame goes to a stream still active.
                            r = active.wait_for(|n| !is_active(n)), if gated => {
                                // The gate is gone (the session is ending): stop watching it.
                                gated = r.is_ok();
                                continue;
                            }
                        }
                    }
                }
            }
        };
        lock(&history).begin(&frame);
        if let (StallHook::Stall(took), Frame::Block(_)) = (&stall, &frame) {
            // A write that never returns: only the endgame finishes the transfer, and only a
            // reset ends this connection (`send_stream`).
            let _ = took.send(true);
            std::future::pending::<()>().await;
        }
        let n = write_frame(w, &frame, &mut scratch).await?;
        lock(&history).end();
        counts.bytes.fetch_add(n as u64, Ordering::Relaxed);
        activity.touch();
        if let Frame::Block(b) = &frame {
            blocks += 1;
            if copy {
                counts
                    .resent
                    .fetch_add(b.data.len() as u64, Ordering::Relaxed);
            } else {
                reporter.on_bytes(b.data.len() as u64);
            }
        }
        if *stop.borrow() {
            break;
        }
    }
    Ok(())
}

/// Runs the receiving end until every announced entry is resolved, then sends `Complete`.
/// Returns the summary (with this end's load), the streams, and what the sender's tuner
/// reported (`None` if the sender closed without saying).
///
/// `leave_early`: once `Complete` is sent and the sender's `Tuned` is in, return without
/// waiting for the sender to close the data connections (a round trip). A client's `get` does:
/// its files are stored, and the sender holds a failed connection against the session only
/// if `Complete` does not follow. A server waits, so that a sending client never has its
/// connections reset under it.
pub(crate) async fn drive_receiver(
    control: Stream,
    joins: Joins,
    receiver: Arc<Receiver>,
    control_out: flume::Receiver<Frame>,
    writers: Writers,
    limits: Limits,
    leave_early: bool,
) -> Result<ReceiverOutcome, SessionError> {
    let activity = Activity::new();
    let mut meter = LoadMeter::start();
    let (t0, mut timeline) = (Instant::now(), Timeline::new());
    let (ctrl_r, mut ctrl_w) = tokio::io::split(control);
    let mut ctrl_rx = spawn_control_reader(ctrl_r, activity.clone());
    // A short queue between network and storage: a slow disk pushes back on TCP instead of
    // filling memory. Sized by the writers that start, like the sender's frame queue.
    let (to_writers, from_streams) = flume::bounded::<Frame>(writers.gate.active() as usize * 2);
    let (fatal_tx, fatal_rx) = flume::bounded::<String>(1);
    let written = Arc::new(AtomicU64::new(0));
    // Told each time a writer has answered an offer: a data connection holds an early block
    // of a file not offered yet until then (see `Offers::wait`).
    let offered = Arc::new(tokio::sync::Notify::new());
    // Offers handed to the writers and not answered yet (see `Offers::wait`).
    let deciding = Arc::new(AtomicU64::new(0));
    let mut writer_threads = Vec::new();
    for i in 0..writers.gate.max() {
        let (rx, receiver, fatal) = (from_streams.clone(), receiver.clone(), fatal_tx.clone());
        let (gate, written, offered) = (writers.gate.clone(), written.clone(), offered.clone());
        let deciding = deciding.clone();
        let t = std::thread::Builder::new()
            .name(format!("ferry-write-{i}"))
            .spawn(move || {
                // Parked writers leave once the queue is closed; the working ones drain it.
                while gate.wait_turn(i, || rx.is_disconnected()) {
                    let Ok(frame) = rx.recv() else { return };
                    let n = match &frame {
                        Frame::Block(b) => b.data.len() as u64,
                        _ => 0,
                    };
                    let offer = matches!(frame, Frame::Offer { .. });
                    let handled = receiver.handle(frame);
                    if offer {
                        deciding.fetch_sub(1, Ordering::AcqRel);
                    }
                    if let Err(e) = handled {
                        let _ = fatal.try_send(e.to_string());
                        return;
                    }
                    if offer {
                        offered.notify_waiters();
                    }
                    written.fetch_add(n, Ordering::Relaxed);
                }
            })?;
        writer_threads.push(t);
    }
    let mut writer_tuner = ThreadControl::new(
        writers.gate.clone(),
        ferry_core::tune::Knob::Writers,
        writers.tune,
    );
    drop(from_streams);
    let mut streams = JoinSet::new();
    // Holds a sender of the writers' queue: dropped with the control loop, like `offers_tx`.
    let spawn_stream = {
        let (tx, act, max) = (to_writers.clone(), activity.clone(), limits.data_frame);
        let offers = Offers {
            receiver: receiver.clone(),
            offered,
            deciding: deciding.clone(),
            limit: limits.idle,
        };
        move |streams: &mut JoinSet<(usize, Result<StreamReport, SessionError>)>,
              i: usize,
              s: Stream| {
            let (tx, act, offers) = (tx.clone(), act.clone(), offers.clone());
            let live = LiveStream {
                index: i,
                // Only an end that leaves early reads a connection from outside its task: a
                // server keeps to one descriptor per connection.
                sock: if leave_early {
                    s.tcp().as_fd().try_clone_to_owned().ok()
                } else {
                    None
                },
                bytes: Arc::default(),
            };
            let bytes = live.bytes.clone();
            streams.spawn(async move { (i, recv_stream(s, tx, act, max, offers, bytes).await) });
            live
        }
    };
    // What each connection has carried, for a report without waiting for its end.
    let mut live: Vec<LiveStream> = Vec::new();
    let mut tuned = None;
    let mut joins = joins;
    // The control loop keeps a sender for offers; it is dropped before the writers are joined.
    let offers_tx = to_writers;
    let done = receiver.done();
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let dog = watchdog(&activity, limits.idle);
    tokio::pin!(dog);
    // However this future ends — error, or dropped mid-way by a shutting-down server — the
    // receiver's temporary files must not outlive the session.
    let mut cleanup = AbortOnDrop(Some(receiver.clone()));
    let result: Result<(), SessionError> = loop {
        tokio::select! {
            j = joins.next(), if !joins.complete() => match j {
                Ok((index, s)) => {
                    live.push(spawn_stream(&mut streams, index, s));
                    activity.touch();
                }
                Err(e) => break Err(e),
            },
            f = ctrl_rx.recv() => match f {
                Some(Ok(Frame::Sent { files, dirs, symlinks, .. })) => receiver.expect(files, dirs, symlinks),
                // Deciding may read files (digests, resume checks): a writer thread does it;
                // `Skipped` answers a decision, in the order of the decisions.
                Some(Ok(offer @ (Frame::Offer { .. } | Frame::Skipped { .. }))) => {
                    if matches!(offer, Frame::Offer { .. }) {
                        deciding.fetch_add(1, Ordering::AcqRel);
                    }
                    // A writer that failed the session has stopped taking frames: with the
                    // queue full, waiting on it alone would never see why.
                    tokio::select! {
                        sent = offers_tx.send_async(offer) => if sent.is_err() {
                            break Err(SessionError::Protocol("receiver workers stopped".into()));
                        },
                        Ok(msg) = fatal_rx.recv_async() => break Err(SessionError::Protocol(msg)),
                    }
                }
                // A sender whose receiver said `EARLY_TUNED` reports ahead of `Complete`.
                Some(Ok(Frame::Tuned(t))) => tuned = Some(t),
                Some(Ok(Frame::Error { code, message })) => break Err(SessionError::Remote { code, message }),
                Some(Ok(other)) => break Err(SessionError::Protocol(format!("unexpected {:?} on control", other.frame_type()))),
                Some(Err(e)) => break Err(e),
                None => break Err(SessionError::Closed("control")),
            },
            Ok(frame) = control_out.recv_async() => {
                if let Err(e) = send(&mut ctrl_w, &frame).await {
                    break Err(e.into());
                }
                activity.touch();
            }
            _ = done.recv_async() => break Ok(()),
            Ok(msg) = fatal_rx.recv_async() => break Err(SessionError::Protocol(msg)),
            Some(joined) = streams.join_next() => match joined {
                Ok((_, Err(e))) => break Err(e),
                Ok((_, Ok(_))) => break Err(SessionError::Closed("data")),
                Err(e) => break Err(SessionError::Protocol(format!("stream task failed: {e}"))),
            },
            _ = tick.tick() => {
                let full = offers_tx.is_full();
                meter.sample(offers_tx.is_empty(), full);
                // Buffered writes into one file take its inode lock in turn, and its digest
                // follows one writer: once every open file has a writer, more writers only
                // wait for that lock. While eight writers were probed on a single 1 GiB file at
                // 100 ms, all eight copied into it contending for the lock (`perf`: copying,
                // `rwsem_spin_on_owner`, `rwsem_down_write_slowpath`), the connections'
                // receive queues grew to 54 MB and the transfer ended 0.66 s after its last
                // byte arrived.
                let open = receiver.files_open();
                writer_tuner.set_room_up((open <= u64::from(writers.gate.active())).then_some(false));
                writer_tuner.on_sample(full, written.load(Ordering::Relaxed));
                timeline.record(t0.elapsed(), written.load(Ordering::Relaxed));
            }
            e = &mut dog => break Err(e),
        }
    };
    drop(spawn_stream);
    let mut reports: Vec<(usize, StreamReport)> = Vec::new();
    let outcome = match result {
        Ok(()) => {
            tracing::debug!("receiver: all resolved");
            // Failures found while finishing still reach the sender before `Complete`.
            let r = receiver.clone();
            let mut summary = tokio::task::spawn_blocking(move || r.finish())
                .await
                .map_err(|e| SessionError::Protocol(format!("finalizer failed: {e}")))?;
            summary.receiver = meter.load();
            summary.receiver.threads = u16::try_from(writer_tuner.threads()).unwrap_or(u16::MAX);
            let mut res = Ok(summary.clone());
            for frame in control_out.drain() {
                if let Err(e) = send(&mut ctrl_w, &frame).await {
                    res = Err(e.into());
                }
            }
            if res.is_ok() {
                match send(&mut ctrl_w, &Frame::Complete(summary)).await {
                    Ok(()) => tracing::debug!("receiver: complete sent"),
                    Err(e) => res = Err(e.into()),
                }
            }
            // Let the sender close the data connections; their EOF ends the stream tasks. It
            // says what its tuner did first, on the control connection.
            let deadline = tokio::time::sleep(Duration::from_secs(10));
            tokio::pin!(deadline);
            let mut control_open = true;
            loop {
                if leave_early && tuned.is_some() {
                    // The connections still open report what they carried so far: every
                    // byte the session needed.
                    for l in &live {
                        if !reports.iter().any(|(i, _)| *i == l.index) {
                            reports.push((l.index, l.report()));
                        }
                    }
                    tracing::debug!("receiver: leaving without waiting for the sender to close");
                    break;
                }
                tokio::select! {
                    j = streams.join_next() => match j {
                        Some(Ok((i, Ok(r)))) => reports.push((i, r)),
                        Some(_) => {}
                        None => break,
                    },
                    f = ctrl_rx.recv(), if control_open => match f {
                        Some(Ok(Frame::Tuned(t))) => tuned = Some(t),
                        Some(Ok(_)) => {}
                        _ => control_open = false,
                    },
                    _ = &mut deadline => break,
                }
            }
            if tuned.is_none() && control_open {
                // The data connections closed first; the report is on its way or not coming.
                let wait = async {
                    while let Some(Ok(f)) = ctrl_rx.recv().await {
                        if let Frame::Tuned(t) = f {
                            return Some(t);
                        }
                    }
                    None
                };
                tuned = tokio::time::timeout(Duration::from_secs(1), wait)
                    .await
                    .ok()
                    .flatten();
            }
            res
        }
        Err(e) => {
            let _ = send(&mut ctrl_w, &e.to_frame()).await;
            Err(e)
        }
    };
    // Order matters: stop taking new work, let the writers finish what they hold, and only
    // then clean up, so no writer can create or complete a file after the cleanup pass.
    tracing::debug!("receiver: session over, stopping the writers");
    receiver.stop();
    streams.abort_all();
    while streams.join_next().await.is_some() {}
    drop(offers_tx);
    // Parked writers leave now rather than at their next recheck; the working ones drain
    // what the streams queued.
    writers.gate.close();
    let _ = tokio::task::spawn_blocking(move || {
        for t in writer_threads {
            let _ = t.join();
        }
    })
    .await;
    let armed = cleanup.0.take();
    if outcome.is_err() {
        if let Some(r) = armed {
            let _ = tokio::task::spawn_blocking(move || r.abort()).await;
        }
    }
    let _ = ctrl_w.shutdown().await;
    reports.sort_by_key(|(i, _)| *i);
    outcome.map(|summary| ReceiverOutcome {
        summary,
        streams: reports.into_iter().map(|(_, r)| r).collect(),
        tuned,
        writers: writer_tuner.report(),
        timeline,
    })
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
struct Offers {
    receiver: Arc<Receiver>,
    offered: Arc<tokio::sync::Notify>,
    /// Offer frames handed to the writers and not answered yet.
    deciding: Arc<AtomicU64>,
    limit: Duration,
}

impl Offers {
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
            if self.deciding.load(Ordering::Acquire) > 0 {
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
    offers: Offers,
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
