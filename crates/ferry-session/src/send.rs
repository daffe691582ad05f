//! The sending end of a transfer as a state machine: what it does with each control frame, each
//! data connection's end, each sample and each timeout. The driver feeds it and carries out
//! what it polls: frames for the control connection, [`SendAction`]s for the file side and the
//! data connections, and the next deadline.
//!
//! ```text
//!  (client put)  Awaiting ──Welcome──▶ Welcomed ──Ready──▶ Granted ─┐
//!  (server get)  ──────────────────────────────────────▶ Granted ─┤
//!                                                                  ▼
//!   Granted: Decisions/Resend/FileFailed ─▶ file side; the walk over ─▶ `Sent`
//!            every block on a connection ─▶ early `Tuned` (and the endgame's copies)
//!            a data connection fails after it ─▶ Ending (grace) ─▶ failed unless `Complete`
//!   `Complete` ─▶ Done(summary)        `Error`, a protocol breach, a failure ─▶ Done(fault)
//! ```
//! Connections dialled before the server's `Ready` may be refused as beyond its grant: what
//! they carried goes again on connection 0, which every grant includes.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use ferry_proto::{
    negotiate_version, CompleteSummary, FileDecision, FileId, Frame, Load, SessionId, TuneReport,
};

use crate::endgame::{Conn, Copies, Endgame, History};
use crate::pools::{PoolTuner, ThreadReport};
use crate::sample::{delivered, ConnSample, HostSample};
use crate::streams::{StreamPlan, StreamTuner};
use crate::timeline::Timeline;
use crate::tune::Knob;
use crate::Fault;

/// Offer bytes a client writes behind its request before `Ready`: half of what a server reads
/// from a refused client before it closes (64 KiB). An offer entry is its path plus 30 bytes,
/// so this holds a first batch of 256 files with paths up to 98 bytes; the rest follows
/// `Ready`.
pub const EARLY_OFFER_BYTES: usize = 32 << 10;

/// How long a session whose sender has reported early (`Tuned` before `Complete`) waits for
/// `Complete` after a data connection failed; four round trips when that is longer.
pub const ENDING_GRACE: Duration = Duration::from_secs(2);

/// What the walk found, once it is over: the `Sent` frame's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub bytes: u64,
}

/// How the sending end starts.
pub struct SendConfig {
    pub plan: StreamPlan,
    /// Data connections open or being opened (ramp helpers included).
    pub conns: usize,
    /// The path's round trip, from the control connection.
    pub rtt: Duration,
    /// A client's put before its `Welcome`: the session asked for and its secret.
    pub awaiting: Option<(SessionId, [u8; 32])>,
    /// Reader threads at the start and at most.
    pub readers: (u32, u32),
}

/// What the driver should do now.
#[derive(Debug, PartialEq)]
pub enum SendAction {
    /// The server granted `streams` connections and this block size: the file side cuts
    /// blocks for them from now on.
    Grant { block_size: u32, streams: u16 },
    /// Stop the data connections from this index on: dialled beyond the grant.
    StopFrom(usize),
    /// Send what connection `i` was given (and may not have delivered) again on connection 0.
    ResendOnFirst(usize),
    /// The receiver asks for part of a file again.
    Resend { file: FileId, offset: u64, len: u32 },
    /// The receiver's decisions on offered files.
    Decide(Vec<FileDecision>),
    /// A file the receiver could not take: the file side stops sending it.
    Skip(FileId),
    /// This many connections carry data from now on.
    Streams(u32),
    /// This many reader threads work from now on.
    Readers(u32),
    /// Everything is queued: the process may give idle memory back.
    Drain,
    /// An endgame copy for connection `to`.
    Copy { to: usize, frame: Frame },
}

/// How a data connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamEnd {
    /// It ran out of frames and closed well: only expected once the session is over.
    Finished,
    /// It failed (its error stays with the driver); `welcomed`: the server had accepted it.
    Failed { welcomed: bool },
    /// The driver stopped it ([`SendAction::StopFrom`]).
    Stopped,
}

/// What one sample of the sending end saw, besides its connections.
#[derive(Clone, Copy, Debug, Default)]
pub struct SendSample {
    /// The frame queue towards the data connections is empty.
    pub queue_empty: bool,
    /// Every block has been read and queued.
    pub all_queued: bool,
    /// What the walk has found so far: files and bytes.
    pub found: (u64, u64),
    /// File bytes read so far.
    pub bytes_read: u64,
}

/// What the sending end did, for the report at its end.
pub struct SendReport {
    pub readers: ThreadReport,
    pub timeline: Timeline,
    /// (streams, block size) the server granted.
    pub granted: Option<(u16, u32)>,
    /// Why the receiver failed entries, in the order it said.
    pub remote_errors: Vec<String>,
    /// Endgame copies sent: blocks and bytes.
    pub copied: (u64, u64),
}

struct Awaiting {
    session: (SessionId, [u8; 32]),
    welcomed: bool,
    offered: usize,
}

/// The sending end of one session.
pub struct SendSession {
    t0: Instant,
    plan: StreamPlan,
    rtt: Duration,
    conns: usize,
    awaiting: Option<Awaiting>,
    granted: Option<(u16, u32)>,
    /// Connections that failed before their `Welcome` and before `Ready`.
    provisional: Vec<usize>,
    walk_over: bool,
    walked: Option<Totals>,
    drained: bool,
    /// `Tuned` sent ahead of `Complete`.
    reported: bool,
    /// The first data connection that failed after the early report, and until when the
    /// session waits for `Complete` regardless.
    ending: Option<(usize, Instant)>,
    streams: StreamTuner,
    readers: PoolTuner,
    endgame: Endgame,
    copies: Option<Copies>,
    timeline: Timeline,
    remote_errors: Vec<String>,
    control: VecDeque<Frame>,
    actions: VecDeque<SendAction>,
    outcome: Option<Result<CompleteSummary, Fault>>,
}

impl SendSession {
    pub fn new(cfg: SendConfig, now: Instant) -> Self {
        let SendConfig {
            plan,
            conns,
            rtt,
            awaiting,
            readers,
        } = cfg;
        Self {
            t0: now,
            plan,
            rtt,
            conns,
            awaiting: awaiting.map(|session| Awaiting {
                session,
                welcomed: false,
                offered: 0,
            }),
            granted: None,
            provisional: Vec::new(),
            walk_over: false,
            walked: None,
            drained: false,
            reported: false,
            ending: None,
            streams: StreamTuner::new(plan, conns, rtt),
            readers: PoolTuner::new(Knob::Readers, readers.0, readers.1, plan.tune_storage),
            endgame: Endgame::default(),
            copies: None,
            timeline: Timeline::new(),
            remote_errors: Vec::new(),
            control: VecDeque::new(),
            actions: VecDeque::new(),
            outcome: None,
        }
    }

    /// Connections that carry data now.
    pub fn active(&self) -> u32 {
        self.streams.active()
    }

    /// Whether the driver may write another offer on the control connection: always, except
    /// before the `Welcome` beyond [`EARLY_OFFER_BYTES`].
    pub fn may_offer(&self) -> bool {
        self.awaiting
            .as_ref()
            .is_none_or(|a| a.offered < EARLY_OFFER_BYTES)
    }

    /// The driver wrote an offer of this many bytes on the control connection.
    pub fn offered(&mut self, bytes: usize) {
        if let Some(a) = self.awaiting.as_mut() {
            a.offered += bytes;
        }
    }

    /// Whether the walk is over (its totals are in, or will never come).
    pub fn walk_over(&self) -> bool {
        self.walk_over
    }

    /// The walk is over with these totals (`None`: the walker went away without them).
    pub fn walked(&mut self, totals: Option<Totals>) {
        self.walk_over = true;
        self.walked = totals;
    }

    /// A frame from the control connection.
    pub fn handle_control(&mut self, frame: Frame) {
        if self.outcome.is_some() {
            return;
        }
        match frame {
            welcome @ Frame::Welcome { .. }
                if self.awaiting.as_ref().is_some_and(|a| !a.welcomed) =>
            {
                self.welcome(welcome)
            }
            Frame::Ready {
                streams,
                block_size,
            } if self.awaiting.as_ref().is_some_and(|a| a.welcomed) => {
                self.ready(streams, block_size)
            }
            Frame::Resend { file, offset, len } => {
                self.actions
                    .push_back(SendAction::Resend { file, offset, len })
            }
            Frame::Decisions { entries } => self.actions.push_back(SendAction::Decide(entries)),
            Frame::EntryFailed { message, .. } => self.remote_errors.push(message),
            Frame::FileFailed { file, message, .. } => {
                self.actions.push_back(SendAction::Skip(file));
                self.remote_errors.push(message);
            }
            Frame::Complete(summary) => self.outcome = Some(Ok(summary)),
            Frame::Error { code, message } => self.fail(Fault::Remote { code, message }),
            other => self.fail(Fault::Protocol(format!(
                "unexpected {:?} on control",
                other.frame_type()
            ))),
        }
    }

    fn welcome(&mut self, frame: Frame) {
        let a = self.awaiting.as_mut().expect("checked by the caller");
        match check_welcome(frame, a.session) {
            Ok(()) => a.welcomed = true,
            Err(f) => self.fail(f),
        }
    }

    fn ready(&mut self, streams: u16, block_size: u32) {
        let granted = usize::from(streams);
        if granted > self.conns {
            // A dial failed (the server at its connection cap, say): the server would wait
            // for a connection that never comes.
            return self.fail(Fault::TooFewConnections {
                opened: self.conns,
                granted,
            });
        }
        // Connections that ended without their `Welcome` before `Ready`: refused as beyond
        // the grant, or a failure.
        let mut failure = None;
        for i in std::mem::take(&mut self.provisional) {
            if i < granted {
                failure.get_or_insert(i);
            } else {
                self.actions.push_back(SendAction::ResendOnFirst(i));
            }
        }
        if let Some(i) = failure {
            return self.fail(Fault::Connection(i));
        }
        // Before any decision: the server answers offers only after `Ready`.
        self.actions.push_back(SendAction::Grant {
            block_size,
            streams,
        });
        self.streams.limit(u32::from(streams));
        self.actions
            .push_back(SendAction::Streams(self.streams.active()));
        self.granted = Some((streams, block_size));
        self.awaiting = None;
        // Dialled beyond the grant: the server refuses them; stop them now (what they
        // carried goes again when they have ended, below).
        if granted < self.conns {
            self.actions.push_back(SendAction::StopFrom(granted));
        }
    }

    /// Data connection `i` ended.
    pub fn stream_ended(&mut self, now: Instant, i: usize, end: StreamEnd) {
        if self.outcome.is_some() {
            return;
        }
        match end {
            // After the early `Tuned`, a receiver with everything stored may close its data
            // connections as soon as it has sent `Complete`, and a block still on its way then
            // resets one here, perhaps before `Complete` is read. A failure is final only if
            // the session does not end well within the grace.
            StreamEnd::Failed { .. } if self.reported => {
                if self.ending.is_none() {
                    let wait = (self.rtt * 4).max(ENDING_GRACE);
                    self.ending = Some((i, now + wait));
                }
            }
            StreamEnd::Finished => self.fail(Fault::Protocol("data connection ended early".into())),
            StreamEnd::Failed { welcomed } if i == 0 || welcomed => self.fail(Fault::Connection(i)),
            // Dialled beyond what the server grants: refused by it, or stopped here once
            // `Ready` said so. A connection without its `Welcome` that ends before `Ready`
            // is judged when `Ready` comes.
            StreamEnd::Failed { .. } => match self.granted {
                Some((n, _)) if i < usize::from(n) => self.fail(Fault::Connection(i)),
                Some(_) => self.actions.push_back(SendAction::ResendOnFirst(i)),
                None => self.provisional.push(i),
            },
            StreamEnd::Stopped => self.actions.push_back(SendAction::ResendOnFirst(i)),
        }
    }

    /// Time passed: a failure held for the grace becomes final at its end.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some((i, at)) = self.ending {
            if now >= at && self.outcome.is_none() {
                self.fail(Fault::Connection(i));
            }
        }
    }

    /// The next deadline the driver must call [`Self::handle_timeout`] at.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.ending.map(|(_, at)| at)
    }

    /// One sample: the queue and the file side (`s`), each data connection's `TCP_INFO`
    /// (`conns`) and what each was given (`histories`), both by index. `host` and `load` are
    /// asked for only when needed.
    pub fn on_sample(
        &mut self,
        now: Instant,
        s: &SendSample,
        conns: &[Option<ConnSample>],
        histories: &mut [&mut History],
        host: impl FnOnce() -> HostSample,
        load: impl FnOnce() -> Load,
    ) {
        let since = now.saturating_duration_since(self.t0);
        let before = self.streams.active();
        self.streams
            .on_sample(since, s.queue_empty, s.found, self.walk_over, conns, host);
        if self.streams.active() != before {
            self.actions
                .push_back(SendAction::Streams(self.streams.active()));
        }
        if let Some(n) = self.readers.on_sample(since, s.queue_empty, s.bytes_read) {
            self.actions.push_back(SendAction::Readers(n));
        }
        let armed = s.queue_empty && s.all_queued;
        if armed && self.plan.drain_at_end && !self.drained {
            self.drained = true;
            self.actions.push_back(SendAction::Drain);
        }
        if armed && self.plan.early_tuned && !self.reported {
            // Every block is on a connection: the tuner has nothing left to decide, and the
            // report overtakes the last blocks, which sit in the data connections' send
            // buffers. The receiver then has it by the time it sends `Complete` and need not
            // wait for the one sent after.
            self.reported = true;
            let report = self.tune_report(load());
            self.control.push_back(Frame::Tuned(report));
        }
        let active = self.streams.active() as usize;
        let mut views: Vec<Conn<'_>> = histories
            .iter_mut()
            .zip(conns)
            .enumerate()
            .map(|(i, (h, c))| Conn {
                history: h,
                unacked: c.map(|c| c.unacked),
                rate: c.map_or(0, |c| c.send_rate),
                delivered: c.map_or(0, |c| c.delivered),
                active: i < active,
            })
            .collect();
        // Cut and hashed when polled, after the driver has let go of the histories.
        self.copies = Some(self.endgame.tick(now, self.rtt, armed, &mut views));
        if self.timeline.due(since) {
            self.timeline.record(since, delivered(conns));
        }
    }

    /// The next frame for the control connection. `offers_waiting`: offers are queued for it
    /// still; the walk's totals go out only behind every offer they count.
    pub fn poll_control(&mut self, offers_waiting: bool) -> Option<Frame> {
        if let Some(f) = self.control.pop_front() {
            return Some(f);
        }
        if self.awaiting.is_none() && !offers_waiting {
            if let Some(t) = self.walked.take() {
                return Some(Frame::Sent {
                    files: t.files,
                    dirs: t.dirs,
                    symlinks: t.symlinks,
                    bytes: t.bytes,
                });
            }
        }
        None
    }

    /// The next thing for the driver to do.
    pub fn poll_action(&mut self) -> Option<SendAction> {
        if let Some(copies) = self.copies.take() {
            self.actions.extend(
                copies
                    .pieces()
                    .map(|(to, frame)| SendAction::Copy { to, frame }),
            );
        }
        self.actions.pop_front()
    }

    /// How the session ended, once it has: the receiver's summary, or why not.
    pub fn outcome(&self) -> Option<&Result<CompleteSummary, Fault>> {
        self.outcome.as_ref()
    }

    fn fail(&mut self, fault: Fault) {
        if self.outcome.is_none() {
            self.outcome = Some(Err(fault));
        }
    }

    /// What the stream tuner did, with this end's load and its reader threads.
    pub fn tune_report(&self, mut load: Load) -> TuneReport {
        load.threads = u16::try_from(self.readers.threads()).unwrap_or(u16::MAX);
        self.streams.report(load)
    }

    /// The session's own account of itself, at its end.
    pub fn into_report(self) -> SendReport {
        SendReport {
            readers: self.readers.report(),
            timeline: self.timeline,
            granted: self.granted,
            remote_errors: self.remote_errors,
            copied: self.endgame.copied(),
        }
    }
}

/// Checks a `Welcome`: a version both ends speak, for the session asked for.
pub fn check_welcome(frame: Frame, ours: (SessionId, [u8; 32])) -> Result<(), Fault> {
    let Frame::Welcome {
        version,
        session,
        secret,
        ..
    } = frame
    else {
        return Err(Fault::Protocol(format!(
            "expected Welcome, got {:?}",
            frame.frame_type()
        )));
    };
    negotiate_version(version).map_err(|e| Fault::Remote {
        code: e.code,
        message: e.reason,
    })?;
    if (session, secret) != ours {
        return Err(Fault::Protocol(
            "the server welcomed another session than the one asked for".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_proto::{Capabilities, ErrorCode, PROTOCOL_VERSION};

    const OURS: (SessionId, [u8; 32]) = (SessionId(1), [2; 32]);

    fn session(conns: usize, awaiting: bool, early_tuned: bool) -> (SendSession, Instant) {
        let now = Instant::now();
        let plan = StreamPlan {
            block_size: 1 << 20,
            early_tuned,
            ..StreamPlan::default()
        };
        let cfg = SendConfig {
            plan,
            conns,
            rtt: Duration::from_millis(10),
            awaiting: awaiting.then_some(OURS),
            readers: (4, 4),
        };
        (SendSession::new(cfg, now), now)
    }

    fn welcome(ours: (SessionId, [u8; 32])) -> Frame {
        Frame::Welcome {
            version: PROTOCOL_VERSION,
            capabilities: Capabilities::default(),
            session: ours.0,
            secret: ours.1,
        }
    }

    fn actions(s: &mut SendSession) -> Vec<SendAction> {
        std::iter::from_fn(|| s.poll_action()).collect()
    }

    #[test]
    fn a_failure_after_the_early_report_is_final_only_after_the_grace() {
        let (mut s, now) = session(2, false, true);
        s.walked(Some(Totals::default()));
        let mut h: Vec<History> = vec![History::new(true), History::new(true)];
        let mut views: Vec<&mut History> = h.iter_mut().collect();
        let sample = SendSample {
            queue_empty: true,
            all_queued: true,
            ..SendSample::default()
        };
        s.on_sample(
            now,
            &sample,
            &[None, None],
            &mut views,
            HostSample::default,
            Load::default,
        );
        assert!(matches!(s.poll_control(false), Some(Frame::Tuned(_))));
        assert!(matches!(s.poll_control(false), Some(Frame::Sent { .. })));
        s.stream_ended(now, 1, StreamEnd::Failed { welcomed: true });
        assert!(s.outcome().is_none(), "held for the grace");
        let at = s.poll_timeout().expect("a deadline");
        assert!(at >= now + ENDING_GRACE);
        s.handle_timeout(at - Duration::from_millis(1));
        assert!(s.outcome().is_none());
        s.handle_timeout(at);
        assert_eq!(s.outcome(), Some(&Err(Fault::Connection(1))));
        // The same failure with `Complete` inside the grace ends well.
        let (mut s, now) = session(2, false, true);
        let mut h: Vec<History> = vec![History::new(true), History::new(true)];
        let mut views: Vec<&mut History> = h.iter_mut().collect();
        s.on_sample(
            now,
            &sample,
            &[None, None],
            &mut views,
            HostSample::default,
            Load::default,
        );
        s.stream_ended(now, 1, StreamEnd::Failed { welcomed: true });
        s.handle_control(Frame::Complete(CompleteSummary::default()));
        assert!(matches!(s.outcome(), Some(Ok(_))));
    }

    #[test]
    fn without_the_early_report_a_failed_connection_fails_at_once() {
        let (mut s, now) = session(2, false, false);
        s.stream_ended(now, 1, StreamEnd::Failed { welcomed: true });
        assert_eq!(s.outcome(), Some(&Err(Fault::Connection(1))));
        let (mut s, now) = session(2, false, false);
        s.stream_ended(now, 0, StreamEnd::Finished);
        assert!(matches!(s.outcome(), Some(Err(Fault::Protocol(_)))));
    }

    #[test]
    fn the_grant_limits_the_connections_and_refused_ones_go_again_on_the_first() {
        let (mut s, now) = session(4, true, false);
        assert!(s.may_offer());
        s.offered(EARLY_OFFER_BYTES);
        assert!(!s.may_offer(), "no more offers before the Welcome");
        // Connection 3 refused before `Ready`: judged when it comes.
        s.stream_ended(now, 3, StreamEnd::Failed { welcomed: false });
        assert!(s.outcome().is_none());
        s.handle_control(welcome(OURS));
        s.handle_control(Frame::Ready {
            streams: 2,
            block_size: 1 << 20,
        });
        assert!(s.may_offer());
        assert_eq!(
            actions(&mut s),
            vec![
                SendAction::ResendOnFirst(3),
                SendAction::Grant {
                    block_size: 1 << 20,
                    streams: 2
                },
                SendAction::Streams(2),
                SendAction::StopFrom(2),
            ]
        );
        s.stream_ended(now, 2, StreamEnd::Stopped);
        assert_eq!(actions(&mut s), vec![SendAction::ResendOnFirst(2)]);
        // A granted connection that fails before its `Welcome` fails the session.
        s.stream_ended(now, 1, StreamEnd::Failed { welcomed: false });
        assert_eq!(s.outcome(), Some(&Err(Fault::Connection(1))));
    }

    #[test]
    fn a_provisional_failure_inside_the_grant_fails_the_session_at_ready() {
        let (mut s, now) = session(3, true, false);
        s.stream_ended(now, 1, StreamEnd::Failed { welcomed: false });
        s.handle_control(welcome(OURS));
        s.handle_control(Frame::Ready {
            streams: 3,
            block_size: 1 << 20,
        });
        assert_eq!(s.outcome(), Some(&Err(Fault::Connection(1))));
    }

    #[test]
    fn bad_handshakes_fail_the_session() {
        let (mut s, _) = session(2, true, false);
        s.handle_control(welcome((SessionId(9), [2; 32])));
        assert!(matches!(s.outcome(), Some(Err(Fault::Protocol(_)))));
        let (mut s, _) = session(2, true, false);
        s.handle_control(welcome(OURS));
        s.handle_control(Frame::Ready {
            streams: 3,
            block_size: 1 << 20,
        });
        assert_eq!(
            s.outcome(),
            Some(&Err(Fault::TooFewConnections {
                opened: 2,
                granted: 3
            }))
        );
        // `Ready` before `Welcome`, or any other frame out of place, is a protocol error.
        let (mut s, _) = session(2, true, false);
        s.handle_control(Frame::Ready {
            streams: 1,
            block_size: 1 << 20,
        });
        assert!(matches!(s.outcome(), Some(Err(Fault::Protocol(_)))));
        let (mut s, _) = session(2, false, false);
        s.handle_control(Frame::Error {
            code: ErrorCode::BUSY,
            message: "busy".into(),
        });
        assert!(matches!(s.outcome(), Some(Err(Fault::Remote { .. }))));
    }

    #[test]
    fn sent_waits_for_the_offers_and_the_welcome() {
        let (mut s, _) = session(1, true, false);
        s.walked(Some(Totals {
            files: 3,
            ..Totals::default()
        }));
        assert_eq!(s.poll_control(false), None, "not before the Welcome");
        s.handle_control(welcome(OURS));
        s.handle_control(Frame::Ready {
            streams: 1,
            block_size: 1 << 20,
        });
        assert_eq!(s.poll_control(true), None, "not ahead of an offer");
        assert!(matches!(
            s.poll_control(false),
            Some(Frame::Sent { files: 3, .. })
        ));
        assert_eq!(s.poll_control(false), None, "once");
    }
}
