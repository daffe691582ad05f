//! Runs one transfer over a control connection and N data connections, on either end.
//!
//! The same two drivers serve both directions: the client runs [`drive_sender`] for `put` and
//! [`drive_receiver`] for `get`; the server runs the other one. Each runs its end's session
//! state machine (`ferry_session::send`, `ferry_session::recv`), which decides; the drivers
//! move bytes and measure. Control traffic:
//!
//! ```text
//!   sender                                   receiver
//!     │── Offer / Skipped ──────────────▶ (control; offers ahead of their data)
//!     │── Block/Dir/Symlink/FileFailed ─▶ (any data connection)
//!     │── Sent{totals} ─────────────────▶ (control; as soon as the walk is over)
//!     │◀─ Decisions / Resend / FileFailed / EntryFailed ─ (control; whenever they happen)
//!     │── Tuned{report} ────────────────▶ (control; with EARLY_TUNED, once every block is
//!     │                                     on a connection)
//!     │◀─ Complete{summary} ──────────── (control; once every entry is resolved)
//!     │── Tuned{report} ────────────────▶ (control)
//!     └─ closes data connections
//! ```
//! Nothing is acknowledged per file: the sender never waits, and the receiver's only
//! obligation is the final `Complete`. A receiving client that has a `Tuned` when it sends
//! `Complete` leaves at once (`drive_receiver`'s `leave_early`); its resets are not failures
//! if `Complete` follows (`ferry_session::send::ENDING_GRACE`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_proto::{Frame, MAX_BLOCK_PAYLOAD, MAX_CONTROL_PAYLOAD};
use ferry_session::Fault;
use serde::Serialize;
use tokio::io::ReadHalf;
use tokio::sync::{mpsc, OwnedSemaphorePermit};

use crate::conn::read_frame;
use crate::error::SessionError;
use crate::stream::Stream;
use crate::tcp::TcpInfo;

mod recv;
mod send;
mod stripe;
mod stripe_get;

pub(crate) use crate::autotune::StreamPlan;
pub(crate) use recv::{drive_receiver, ReceiverIo, RecvRun, Writers};
pub(crate) use send::{drive_sender, frame_queue, SendRun, SenderIo, SenderOutcome};
pub(crate) use stripe::StripeIo;
pub use stripe::StripeReport;

/// A failure the session named, as the driver reports it (a connection's own failure is the
/// driver's to name: see `SendDriver::error_of`).
pub(crate) fn fault_error(fault: Fault) -> SessionError {
    match fault {
        Fault::Remote { code, message } => SessionError::Remote { code, message },
        Fault::Protocol(m) => SessionError::Protocol(m),
        Fault::Closed(what) => SessionError::Closed(what),
        Fault::Connection(_) => SessionError::Closed("data"),
        f @ Fault::TooFewConnections { .. } => {
            SessionError::Io(std::io::Error::other(f.to_string()))
        }
    }
}

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

    pub(crate) fn touch(&self) {
        self.last_ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn idle(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }
}

/// Resolves with an error once the session has been idle for `limit`.
pub(crate) async fn watchdog(activity: &Activity, limit: Duration) -> SessionError {
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if activity.idle() > limit {
            return SessionError::Timeout("waiting for the peer (no traffic on any connection)");
        }
    }
}

/// Reads control frames in their own task: a read cut short by `select!` would lose bytes.
pub(crate) fn spawn_control_reader(
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
