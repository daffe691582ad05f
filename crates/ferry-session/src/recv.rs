//! The receiving end of a transfer as a state machine. The file side (`ferry_core::recv`)
//! decides and stores each file; this is the session around it: what each control frame
//! means, when the session is over, how many writers work, and when the end may leave.
//!
//! ```text
//!   Running: Sent ─▶ expect counts   Offer/Skipped ─▶ writers (in order)   Tuned ─▶ kept
//!            every entry resolved ─▶ Finishing (the driver finishes, sends `Complete`)
//!   Closing: waits for the sender to close its data connections, taking its `Tuned`;
//!            an end that leaves early goes as soon as it has `Tuned`.
//!   `Error`, a protocol breach ─▶ failed
//! ```

use std::collections::VecDeque;
use std::time::Instant;

use ferry_proto::{Frame, TuneReport};

use crate::pools::{PoolTuner, ThreadReport};
use crate::timeline::Timeline;
use crate::tune::Knob;
use crate::Fault;

/// What the driver should do now.
#[derive(Debug, PartialEq)]
pub enum RecvAction {
    /// The sender's walk is over: the file side expects this many entries in all.
    Expect {
        files: u64,
        dirs: u64,
        symlinks: u64,
    },
    /// An offer or a `Skipped` for the writers, which answer them in order.
    ToWriters(Frame),
    /// This many writer threads work from now on.
    Writers(u32),
}

/// What one sample of the receiving end saw.
#[derive(Clone, Copy, Debug, Default)]
pub struct RecvSample {
    /// The queue towards the writers is full: storing is slower than receiving.
    pub queue_full: bool,
    /// Block bytes written so far.
    pub written: u64,
    /// Files open for writing now.
    pub files_open: u64,
    /// Writer threads working now.
    pub writers: u32,
}

/// Where the receiving end is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecvPhase {
    Running,
    /// Every entry is resolved: the driver finishes and sends `Complete`.
    Finishing,
    /// `Complete` is out: waiting for the sender to close.
    Closing,
}

/// The receiving end of one session.
pub struct RecvSession {
    t0: Instant,
    phase: RecvPhase,
    leave_early: bool,
    tuned: Option<TuneReport>,
    writers: PoolTuner,
    timeline: Timeline,
    actions: VecDeque<RecvAction>,
    failed: Option<Fault>,
}

impl RecvSession {
    /// `writers`: threads at the start, at most, and whether to tune them. `leave_early`: a
    /// client that leaves as soon as it has sent `Complete` and has the sender's `Tuned`.
    pub fn new(now: Instant, writers: (u32, u32, bool), leave_early: bool) -> Self {
        let (start, max, tune) = writers;
        Self {
            t0: now,
            phase: RecvPhase::Running,
            leave_early,
            tuned: None,
            writers: PoolTuner::new(Knob::Writers, start, max, tune),
            timeline: Timeline::new(),
            actions: VecDeque::new(),
            failed: None,
        }
    }

    pub fn phase(&self) -> RecvPhase {
        self.phase
    }

    /// A frame from the control connection.
    pub fn handle_control(&mut self, frame: Frame) {
        if self.phase != RecvPhase::Running {
            // After `Complete` only the sender's report matters.
            if let Frame::Tuned(t) = frame {
                self.tuned = Some(t);
            }
            return;
        }
        match frame {
            Frame::Sent {
                files,
                dirs,
                symlinks,
                ..
            } => self.actions.push_back(RecvAction::Expect {
                files,
                dirs,
                symlinks,
            }),
            // Deciding may read files (digests, resume checks): a writer does it; `Skipped`
            // answers a decision, in the order of the decisions.
            // `Landed` (a striped put: a block a stripe host wrote) is read back by a writer,
            // and `FileDigest` (the digest such a block carried) is the file's like a block's.
            offer @ (Frame::Offer { .. }
            | Frame::Skipped { .. }
            | Frame::Landed { .. }
            | Frame::FileDigest { .. }) => self.actions.push_back(RecvAction::ToWriters(offer)),
            // A sender whose receiver said `EARLY_TUNED` reports ahead of `Complete`.
            Frame::Tuned(t) => self.tuned = Some(t),
            Frame::Error { code, message } => self.fail(Fault::Remote { code, message }),
            other => self.fail(Fault::Protocol(format!(
                "unexpected {:?} on control",
                other.frame_type()
            ))),
        }
    }

    /// The file side has resolved every entry.
    pub fn resolved(&mut self) {
        if self.phase == RecvPhase::Running && self.failed.is_none() {
            self.phase = RecvPhase::Finishing;
        }
    }

    /// `Complete` went out.
    pub fn completed(&mut self) {
        self.phase = RecvPhase::Closing;
    }

    /// One sample.
    pub fn on_sample(&mut self, now: Instant, s: &RecvSample) {
        let since = now.saturating_duration_since(self.t0);
        // Buffered writes into one file take its inode lock in turn, and its digest follows
        // one writer: once every open file has a writer, more writers only wait for that lock
        // (docs/bench/NOTEBOOK.md has the profile that showed it).
        self.writers
            .set_room_up((s.files_open <= u64::from(s.writers)).then_some(false));
        if let Some(n) = self.writers.on_sample(since, s.queue_full, s.written) {
            self.actions.push_back(RecvAction::Writers(n));
        }
        self.timeline.record(since, s.written);
    }

    /// Whether the end may leave now, without waiting for the sender to close: it leaves
    /// early and has the sender's report.
    pub fn may_leave(&self) -> bool {
        self.phase == RecvPhase::Closing && self.leave_early && self.tuned.is_some()
    }

    pub fn poll_action(&mut self) -> Option<RecvAction> {
        self.actions.pop_front()
    }

    /// Why the session failed, once it has.
    pub fn failure(&self) -> Option<&Fault> {
        self.failed.as_ref()
    }

    fn fail(&mut self, fault: Fault) {
        self.failed.get_or_insert(fault);
    }

    /// Writer threads working now, as the tuner holds them.
    pub fn writer_threads(&self) -> u32 {
        self.writers.threads()
    }

    /// The sender's report, if it came.
    pub fn tuned(&self) -> Option<&TuneReport> {
        self.tuned.as_ref()
    }

    /// What the session reports at its end: the sender's `Tuned`, the writers' tuner, and
    /// the timeline of bytes written.
    pub fn into_report(self) -> (Option<TuneReport>, ThreadReport, Timeline) {
        (self.tuned, self.writers.report(), self.timeline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_proto::{ErrorCode, Load};

    fn tuned() -> Frame {
        Frame::Tuned(TuneReport {
            streams: 4,
            start: 4,
            flags: 0,
            sender: Load::default(),
            steps: Vec::new(),
        })
    }

    #[test]
    fn a_landed_block_goes_to_the_writers() {
        let mut r = RecvSession::new(Instant::now(), (4, 4, false), true);
        let landed = Frame::Landed {
            file: ferry_proto::FileId(1),
            offset: 0,
            len: 1,
            digest: 0,
            cvs: Vec::new(),
        };
        r.handle_control(landed.clone());
        assert_eq!(r.poll_action(), Some(RecvAction::ToWriters(landed)));
        assert_eq!(r.phase(), RecvPhase::Running);
    }

    #[test]
    fn the_receiver_leaves_early_only_with_the_report_and_after_complete() {
        let mut r = RecvSession::new(Instant::now(), (4, 4, false), true);
        r.handle_control(Frame::Sent {
            files: 2,
            dirs: 1,
            symlinks: 0,
            bytes: 10,
        });
        r.handle_control(Frame::Offer { entries: vec![] });
        assert_eq!(
            r.poll_action(),
            Some(RecvAction::Expect {
                files: 2,
                dirs: 1,
                symlinks: 0
            })
        );
        assert!(matches!(r.poll_action(), Some(RecvAction::ToWriters(_))));
        r.handle_control(tuned());
        assert!(!r.may_leave(), "not before Complete");
        r.resolved();
        assert_eq!(r.phase(), RecvPhase::Finishing);
        r.completed();
        assert!(r.may_leave());
        // A server never leaves early.
        let mut s = RecvSession::new(Instant::now(), (4, 4, false), false);
        s.resolved();
        s.completed();
        s.handle_control(tuned());
        assert!(!s.may_leave() && s.tuned().is_some());
    }

    #[test]
    fn errors_and_stray_frames_fail_the_receiver() {
        let mut r = RecvSession::new(Instant::now(), (4, 4, false), false);
        r.handle_control(Frame::Error {
            code: ErrorCode::BUSY,
            message: "no".into(),
        });
        assert!(matches!(r.failure(), Some(Fault::Remote { .. })));
        r.resolved();
        assert_eq!(
            r.phase(),
            RecvPhase::Running,
            "a failed session does not finish"
        );
        let mut r = RecvSession::new(Instant::now(), (4, 4, false), false);
        r.handle_control(Frame::ListEnd);
        assert!(matches!(r.failure(), Some(Fault::Protocol(_))));
    }
}
