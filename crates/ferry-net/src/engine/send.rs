//! The sending end's driver: it runs a [`SendSession`] against a control connection, N data
//! connections and the file side's readers (`ferry_core::send::Sender`). The session decides;
//! this moves frames between sockets, threads and the session, and measures.
//!
//! A block's way: the walker offers the file on the control connection, a reader thread cuts
//! and reads the block into the frame queue, and one data connection's task ([`send_stream`])
//! takes it, records it in the connection's history (for the endgame's copies) and writes it.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use ferry_core::send::Sender;
use ferry_core::Reporter;
use ferry_proto::{
    Capabilities, CompleteSummary, Frame, SessionId, TuneReport, MAX_CONTROL_PAYLOAD,
};
use ferry_session::endgame::History;
use ferry_session::send::{SendAction, SendConfig, SendSample, SendSession, StreamEnd};
use ferry_session::{ConnSample, Fault};
use tokio::io::{AsyncWriteExt, BufWriter, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use super::stripe::{Outlets, StripeHosts, StripeIo, StripeReport};
use super::{spawn_control_reader, watchdog, Activity, Limits, StreamReport};
use crate::autotune::{
    conn_sample, host_sample, DataSockets, LoadMeter, StreamPlan, ThreadReport, SAMPLE_EVERY,
};
use crate::conn::{send, write_frame};
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

/// Blocks a ramp helper carries before it parks for good (`StreamPlan::helpers`): the first
/// blocks of a transfer are cut to 256 and 512 KiB, so two are about what a connection opening
/// from the kernel's 10 segments sends in its first three round trips at MTU 9000. One or
/// three each won less, four or more nothing (BENCHMARKS.md, "Ramp helpers").
const HELPER_BLOCKS: u32 = 2;

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
    /// What each stripe host of a striped put did.
    pub(crate) stripes: Vec<StripeReport>,
}

/// The bounded queue between the readers and the data connections, sized by `plan`.
pub(crate) fn frame_queue(
    plan: &StreamPlan,
    streams: u16,
) -> (flume::Sender<Frame>, flume::Receiver<Frame>) {
    flume::bounded(plan.queue_len(streams))
}

/// The sending end's connections and the file side, as the session starts.
pub(crate) struct SenderIo {
    pub(crate) control: Stream,
    pub(crate) data: Vec<Stream>,
    pub(crate) sender: Sender,
    /// The readers' frames, towards the data connections.
    pub(crate) frames: flume::Receiver<Frame>,
    /// The walker's offers, towards the control connection.
    pub(crate) control_out: flume::Receiver<Frame>,
    pub(crate) reporter: Arc<dyn Reporter>,
    /// A striped put's other hosts (`engine::stripe`); empty otherwise.
    pub(crate) stripes: Vec<StripeIo>,
}

/// How the sending end runs: `welcome`, a client's put whose data connections read their
/// `Welcome` alongside the data, within this time; `awaiting`, a client's put whose control
/// connection has not had its `Welcome` and `Ready` yet (the session and its secret).
pub(crate) struct SendRun {
    pub(crate) limits: Limits,
    pub(crate) plan: StreamPlan,
    pub(crate) welcome: Option<Duration>,
    pub(crate) awaiting: Option<(SessionId, [u8; 32])>,
    /// The coordinator of a striped put said `STRIPE_WHOLE` in a `Welcome` read already: its
    /// stripe hosts take small files and last blocks too. (A `Welcome` read during the
    /// session says so itself.)
    pub(crate) stripe_whole: bool,
}

/// Runs the sending end until the receiver reports `Complete`.
pub(crate) async fn drive_sender(
    io: SenderIo,
    run: SendRun,
) -> Result<SenderOutcome, SessionError> {
    let mut d = SendDriver::start(io, run);
    let result = d.run().await;
    d.finish(result).await
}

/// One data connection's task, as it is spawned.
struct StreamTask {
    index: usize,
    queues: Queues,
    stop: watch::Receiver<bool>,
    active: watch::Receiver<u32>,
    activity: Activity,
    reporter: Arc<dyn Reporter>,
    welcome: Option<Duration>,
    stall: StallHook,
    helper: bool,
}

type StreamResult = (usize, Result<StreamReport, SessionError>);

/// The sending end while it runs: the session and everything it acts on.
struct SendDriver {
    session: SendSession,
    sender: Sender,
    limits: Limits,
    ctrl_w: WriteHalf<Stream>,
    ctrl_rx: mpsc::Receiver<Result<Frame, SessionError>>,
    control_out: flume::Receiver<Frame>,
    totals: flume::Receiver<ferry_session::send::Totals>,
    /// Only the stream tasks and this probe hold the frame queue: dropped at the end, so
    /// readers blocked on a full queue see it disconnected and stop.
    probe: flume::Receiver<Frame>,
    streams: JoinSet<StreamResult>,
    tasks: Vec<tokio::task::AbortHandle>,
    /// Which connection a stopped task was.
    by_id: HashMap<tokio::task::Id, usize>,
    /// What each connection was given and may not have delivered yet.
    histories: Vec<Arc<Mutex<History>>>,
    /// The endgame's copies for each connection.
    copies_tx: Vec<flume::Sender<Frame>>,
    sockets: DataSockets,
    meter: LoadMeter,
    activity: Activity,
    stop_tx: watch::Sender<bool>,
    scratch: BytesMut,
    /// Each data connection's failure, for the session's verdict on it.
    failures: HashMap<usize, SessionError>,
    /// A striped put's other hosts, and the `Landed` they report, for the coordinator.
    stripes: StripeHosts,
    landed: mpsc::UnboundedReceiver<Frame>,
}

impl SendDriver {
    fn start(io: SenderIo, run: SendRun) -> Self {
        let SenderIo {
            control,
            data,
            sender,
            frames,
            control_out,
            reporter,
            stripes,
        } = io;
        let activity = Activity::new();
        // The path's round trip, for the tuner's timing: the control connection has carried a
        // TLS handshake and the request by now, so TCP has a minimum RTT for it.
        let rtt = tcp_info(control.tcp())
            .map(|i| Duration::from_micros(u64::from(i.min_rtt_us)))
            .unwrap_or_default();
        let gate = sender.readers();
        let session = SendSession::new(
            SendConfig {
                plan: run.plan,
                conns: data.len(),
                rtt,
                awaiting: run.awaiting,
                readers: (gate.active(), gate.max()),
            },
            Instant::now(),
        );
        let (sockets, active) = DataSockets::new(&data, session.active());
        let (ctrl_r, ctrl_w) = tokio::io::split(control);
        let ctrl_rx = spawn_control_reader(ctrl_r, activity.clone());
        let (stop_tx, stop_rx) = watch::channel(false);
        // A connection whose `Welcome` is read alongside keeps every block until it has it: if
        // the server refuses it as beyond the grant, they go again on another.
        let histories: Vec<Arc<Mutex<History>>> = data
            .iter()
            .map(|_| Arc::new(Mutex::new(History::new(run.welcome.is_none()))))
            .collect();
        let (copies_tx, copies_rx): (Vec<_>, Vec<_>) =
            data.iter().map(|_| flume::unbounded::<Frame>()).unzip();
        let stall_took = run.plan.stall.map(|_| watch::channel(false));
        let (bounce_tx, bounce) = flume::unbounded();
        let (landed_tx, landed) = mpsc::unbounded_channel();
        let stripes = StripeHosts::start(
            stripes,
            run.stripe_whole,
            &frames,
            &active,
            &Outlets {
                bounce: bounce_tx,
                landed: landed_tx,
                reporter: reporter.clone(),
            },
        );
        let mut streams = JoinSet::new();
        let mut tasks = Vec::with_capacity(data.len());
        // The helpers are the last connections, beyond what the tuner may use.
        let mains = data.len().saturating_sub(usize::from(run.plan.helpers));
        for (i, s) in data.into_iter().enumerate() {
            let task = StreamTask {
                index: i,
                queues: Queues {
                    frames: frames.clone(),
                    bounce: bounce.clone(),
                    copies: copies_rx[i].clone(),
                    history: histories[i].clone(),
                },
                stop: stop_rx.clone(),
                active: active.clone(),
                activity: activity.clone(),
                reporter: reporter.clone(),
                welcome: run.welcome,
                stall: match &stall_took {
                    None => StallHook::Off,
                    Some((tx, _)) if run.plan.stall == Some(i) => StallHook::Stall(tx.clone()),
                    Some((_, rx)) => StallHook::After(rx.clone()),
                },
                helper: i >= mains,
            };
            tasks.push(streams.spawn(async move { (i, send_stream(s, task).await) }));
        }
        let by_id = tasks.iter().enumerate().map(|(i, t)| (t.id(), i)).collect();
        let totals = sender.totals();
        Self {
            session,
            sender,
            limits: run.limits,
            ctrl_w,
            ctrl_rx,
            control_out,
            totals,
            probe: frames,
            streams,
            tasks,
            by_id,
            histories,
            copies_tx,
            sockets,
            meter: LoadMeter::start(),
            activity,
            stop_tx,
            scratch: BytesMut::new(),
            failures: HashMap::new(),
            stripes,
            landed,
        }
    }

    /// Moves events between the connections, the file side and the session until the session
    /// has its outcome.
    async fn run(&mut self) -> Result<CompleteSummary, SessionError> {
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let activity = self.activity.clone();
        let dog = watchdog(&activity, self.limits.idle);
        tokio::pin!(dog);
        loop {
            self.apply();
            if let Some(outcome) = self.session.outcome().cloned() {
                return outcome.map_err(|f| self.error_of(f));
            }
            while let Some(frame) = self.session.poll_control(!self.control_out.is_empty()) {
                send(&mut self.ctrl_w, &frame).await?;
            }
            let deadline = self.session.poll_timeout();
            let grace = tokio::time::sleep_until(
                deadline.map_or_else(tokio::time::Instant::now, tokio::time::Instant::from_std),
            );
            tokio::select! {
                t = self.totals.recv_async(), if !self.session.walk_over() => {
                    self.session.walked(t.ok());
                }
                Ok(frame) = self.control_out.recv_async(), if self.session.may_offer() => {
                    let n = write_frame(&mut self.ctrl_w, &frame, &mut self.scratch).await?;
                    self.session.offered(n);
                    self.ctrl_w.flush().await?;
                    self.activity.touch();
                }
                f = self.ctrl_rx.recv() => match f {
                    Some(Ok(frame)) => {
                        // Before any decision it precedes is taken in: no block of a file
                        // decided after it reaches a stripe host by the narrower rule.
                        if let Frame::Welcome { capabilities, .. } = &frame {
                            if capabilities.has(Capabilities::STRIPE_WHOLE) {
                                self.stripes.whole();
                            }
                        }
                        self.session.handle_control(frame)
                    }
                    Some(Err(e)) => return Err(e),
                    None => return Err(SessionError::Closed("control")),
                },
                Some(landed) = self.landed.recv() => {
                    send(&mut self.ctrl_w, &landed).await?;
                    self.activity.touch();
                }
                () = grace, if deadline.is_some() => self.session.handle_timeout(Instant::now()),
                Some(joined) = self.streams.join_next_with_id() => self.joined(joined)?,
                _ = tick.tick() => self.sample(),
                e = &mut dog => return Err(e),
            }
        }
    }

    /// Carries out what the session decided.
    fn apply(&mut self) {
        while let Some(action) = self.session.poll_action() {
            match action {
                SendAction::Grant {
                    block_size,
                    streams,
                } => self.sender.grant(block_size, streams),
                SendAction::StopFrom(i) => {
                    for t in self.tasks.iter().skip(i) {
                        t.abort();
                    }
                }
                SendAction::ResendOnFirst(i) => self.resend_on_first(i),
                SendAction::Resend { file, offset, len } => self.sender.resend(file, offset, len),
                SendAction::Decide(entries) => self.sender.decide(entries),
                SendAction::Skip(file) => self.sender.skip(file),
                SendAction::Streams(n) => self.sockets.publish(n),
                SendAction::Readers(n) => self.sender.readers().set(n),
                SendAction::Drain => {
                    tokio::task::spawn_blocking(ferry_core::buf::drain);
                }
                SendAction::Copy { to, frame } => {
                    let _ = self.copies_tx[to].send(frame);
                }
            }
        }
    }

    /// Queues what connection `i` was given before the server refused it (or it was stopped
    /// as beyond the grant) for connection 0, which every grant includes.
    fn resend_on_first(&mut self, i: usize) {
        let frames = lock(&self.histories[i]).take_frames();
        tracing::debug!(
            stream = i,
            frames = frames.len(),
            "data connection beyond the grant"
        );
        for f in frames {
            let _ = self.copies_tx[0].send(f);
        }
    }

    /// A data connection's task ended: the session judges it; its error stays here.
    fn joined(
        &mut self,
        joined: Result<(tokio::task::Id, StreamResult), tokio::task::JoinError>,
    ) -> Result<(), SessionError> {
        let (i, end) = match joined {
            Err(e) if e.is_cancelled() => match self.by_id.get(&e.id()) {
                Some(&i) => (i, StreamEnd::Stopped),
                None => return Err(SessionError::Protocol(format!("stream task failed: {e}"))),
            },
            Err(e) => return Err(SessionError::Protocol(format!("stream task failed: {e}"))),
            Ok((_, (i, Ok(_)))) => (i, StreamEnd::Finished),
            Ok((_, (i, Err(e)))) => {
                let welcomed = !lock(&self.histories[i]).is_unwelcomed();
                tracing::debug!(stream = i, error = %e, "sender: a data connection failed");
                self.failures.entry(i).or_insert(e);
                (i, StreamEnd::Failed { welcomed })
            }
        };
        self.session.stream_ended(Instant::now(), i, end);
        Ok(())
    }

    /// One sample of the queue, the connections and the file side, for the session.
    fn sample(&mut self) {
        let (empty, full) = (self.probe.is_empty(), self.probe.is_full());
        self.meter.sample(empty, full);
        // One TCP_INFO of every connection per sample, for the tuner, the endgame and the
        // timeline.
        let conns: Vec<Option<ConnSample>> = self
            .sockets
            .infos()
            .iter()
            .map(|i| i.as_ref().map(conn_sample))
            .collect();
        let s = SendSample {
            queue_empty: empty,
            all_queued: self.sender.all_queued(),
            found: self.sender.found(),
            bytes_read: self.sender.bytes_read(),
        };
        let mut guards: Vec<_> = self.histories.iter().map(|h| lock(h)).collect();
        let mut views: Vec<&mut History> = guards.iter_mut().map(|g| &mut **g).collect();
        let meter = &self.meter;
        self.session
            .on_sample(Instant::now(), &s, &conns, &mut views, host_sample, || {
                meter.load()
            });
    }

    /// A failure the session named, as the error to report.
    fn error_of(&mut self, fault: Fault) -> SessionError {
        match fault {
            Fault::Connection(i) => self
                .failures
                .remove(&i)
                .unwrap_or(SessionError::Closed("data")),
            other => super::fault_error(other),
        }
    }

    /// Ends the session: reports, stops the connections and the readers, and gathers what
    /// each did.
    async fn finish(
        self,
        result: Result<CompleteSummary, SessionError>,
    ) -> Result<SenderOutcome, SessionError> {
        let Self {
            session,
            sender,
            mut ctrl_w,
            probe,
            mut streams,
            copies_tx,
            sockets,
            meter,
            stop_tx,
            stripes,
            ..
        } = self;
        drop(probe);
        let stripes = stripes.finish().await;
        tracing::debug!("sender: loop ended");
        let tuning = session.tune_report(meter.load());
        // Its duplicates of the data sockets go now: a connection reset at the end closes at once.
        drop(sockets);
        drop(copies_tx);
        let report = session.into_report();
        if report.copied.0 > 0 {
            tracing::debug!(
                blocks = report.copied.0,
                bytes = report.copied.1,
                "endgame: blocks sent again on idle connections"
            );
        }
        if result.is_ok() {
            // The receiver reports (and remembers) what the tuner did; it is not an error if
            // it has already gone.
            let _ = send(&mut ctrl_w, &Frame::Tuned(tuning.clone())).await;
        }
        let _ = stop_tx.send(true);
        // Readers waiting for a decision that will never come must not hold the session.
        sender.close();
        let reports = join_streams(&mut streams).await;
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
            streams: reports,
            remote_errors: report.remote_errors,
            sender,
            tuning,
            readers: report.readers,
            timeline: report.timeline,
            granted: report.granted,
            stripes,
        })
    }
}

/// Waits for the data connections to close, at most 10 s: a stream stuck writing to a peer
/// that went away must not hold the session forever. Their reports, by index.
async fn join_streams(streams: &mut JoinSet<StreamResult>) -> Vec<StreamReport> {
    let mut reports = Vec::new();
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
    reports.into_iter().map(|(_, r)| r).collect()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where a sending connection takes its frames: the shared queue, the endgame's copies dealt
/// to it, and the record of what it was given.
pub(super) struct Queues {
    frames: flume::Receiver<Frame>,
    /// What stripe hosts did not carry, ahead of the shared queue.
    bounce: flume::Receiver<Frame>,
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
async fn send_stream(stream: Stream, task: StreamTask) -> Result<StreamReport, SessionError> {
    let (index, welcome, stop) = (task.index, task.welcome, task.stop.clone());
    let sock = stream.tcp().as_fd().try_clone_to_owned().ok();
    let counts = Arc::new(Counts::default());
    let history = task.queues.history.clone();
    let (welcomed_tx, welcomed) = watch::channel(welcome.is_none());
    let work = {
        let counts = counts.clone();
        async move {
            let (mut rd, wr) = tokio::io::split(stream);
            let mut w = BufWriter::with_capacity(256 << 10, wr);
            let result = {
                let body = send_frames(&mut w, task, welcomed, &counts);
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

/// What a connection takes next.
enum Take {
    /// A frame from the queue, or (`true`) an endgame copy.
    Frame(Frame, bool),
    /// Nothing yet: look at the gates again.
    Again,
    Stop,
}

/// The next frame for connection `index` from the shared queue, or when it is empty and the
/// connection has flushed, an endgame copy. Small files arrive a few at a time from several
/// readers: flushing at once would send each as its own few packets on every stream, so a
/// partly filled buffer waits a moment ([`FLUSH_LINGER`]) for more before it flushes.
async fn take_frame(
    w: &mut BufWriter<WriteHalf<Stream>>,
    queues: &Queues,
    stop: &mut watch::Receiver<bool>,
    active: &mut watch::Receiver<u32>,
    gated: &mut bool,
    index: usize,
) -> Result<Take, SessionError> {
    let Queues {
        frames,
        bounce,
        copies,
        history,
    } = queues;
    if let Ok(f) = bounce.try_recv() {
        return Ok(Take::Frame(f, false));
    }
    match frames.try_recv() {
        Ok(f) => return Ok(Take::Frame(f, false)),
        Err(flume::TryRecvError::Disconnected) => return Ok(Take::Stop),
        Err(flume::TryRecvError::Empty) => {}
    }
    if !w.buffer().is_empty() {
        match tokio::time::timeout(FLUSH_LINGER, frames.recv_async()).await {
            Ok(Ok(f)) => return Ok(Take::Frame(f, false)),
            Ok(Err(_)) => return Ok(Take::Stop),
            Err(_) => {}
        }
    }
    w.flush().await?;
    lock(history).wait();
    let is_active = |n: &u32| index < *n as usize;
    Ok(tokio::select! {
        f = frames.recv_async() => match f { Ok(f) => Take::Frame(f, false), Err(_) => Take::Stop },
        Ok(f) = bounce.recv_async() => Take::Frame(f, false),
        Ok(f) = copies.recv_async() => Take::Frame(f, true),
        _ = stop.wait_for(|s| *s) => Take::Stop,
        // Parked while waiting: the frame goes to a stream still active.
        r = active.wait_for(|n| !is_active(n)), if *gated => {
            // The gate is gone (the session is ending): stop watching it.
            *gated = r.is_ok();
            Take::Again
        }
    })
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
async fn send_frames(
    w: &mut BufWriter<WriteHalf<Stream>>,
    task: StreamTask,
    mut welcomed: watch::Receiver<bool>,
    counts: &Counts,
) -> Result<(), SessionError> {
    let StreamTask {
        index,
        queues,
        mut stop,
        mut active,
        activity,
        reporter,
        stall,
        helper,
        ..
    } = task;
    let history = queues.history.clone();
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
        let (frame, copy) =
            match take_frame(w, &queues, &mut stop, &mut active, &mut gated, index).await? {
                Take::Frame(f, copy) => (f, copy),
                Take::Again => continue,
                Take::Stop => break,
            };
        lock(&history).begin(&frame);
        // Counted once, as it is taken: a block whose write never ends (a connection stuck or
        // reset) goes out again only as a copy, which is not counted, so counting after the
        // write lost it from the progress (a finished put read short).
        if let (Frame::Block(b), false) = (&frame, copy) {
            reporter.on_bytes(b.data.len() as u64);
        }
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
            }
        }
        if *stop.borrow() {
            break;
        }
    }
    Ok(())
}
