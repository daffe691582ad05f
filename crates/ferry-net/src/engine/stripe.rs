//! The client's stripe hosts in a striped put: servers that share the coordinator's file
//! system and write blocks into the partial copies the coordinator opened.
//!
//! Each host's data connections take frames from the sender's one queue like the
//! coordinator's, as many at once as the coordinator's tuner lets carry data (connection `i`
//! only while `i` < its active count: each host's link then carries about as much as the
//! coordinator's, where a host's every granted connection taking blocks left the
//! coordinator's link the least loaded), but keep only what a stripe host may write (`for_stripe_host`): a block
//! sent after its file's decision (not `early`: before it the coordinator may still discard or
//! truncate the partial copy) that fits the host's block size; when the coordinator does not
//! share every partial copy (no `STRIPE_WHOLE` in its `Welcome`), also only one that does not
//! carry the file digest, of a file of more than one block. Anything else
//! goes on the bounce queue, which the coordinator's connections take from first. A block
//! stays owed until the host reports it `Landed`; the client then forwards a `Landed` built
//! from its own record of the block (its digest, not the host's word) and the host's BLAKE3
//! chaining values to the coordinator, after a `FileDigest` when the block carried the file
//! digest. A
//! block the host hands back (`Resend`) and, when a host fails, every block it still owes go
//! on the bounce queue too, so the put completes on the others. A host that owes blocks and
//! answers nothing for [`SILENCE`] (stopped, or its link black-holed) is dropped as a failed
//! one is.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use ferry_core::recv::for_stripe_host;
use ferry_core::Reporter;
use ferry_proto::{FileId, Frame, MAX_CONTROL_PAYLOAD};
use serde::Serialize;
use tokio::io::{AsyncWriteExt, BufWriter, ReadHalf};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::conn::{read_frame, write_frame};
use crate::error::SessionError;
use crate::stream::Stream;

/// A stripe host's session as the client opened it: its control connection, after `Ready`,
/// and its data connections, each through its `Welcome`.
pub(crate) struct StripeIo {
    /// `host:port`, for the report.
    pub(crate) host: String,
    pub(crate) control: Stream,
    pub(crate) data: Vec<Stream>,
    /// The block size the host granted: larger blocks go to the coordinator.
    pub(crate) block_size: u32,
}

/// What one stripe host did in a put or a get.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StripeReport {
    pub host: String,
    /// Blocks and their bytes the host wrote and the coordinator was told of (a put), or read
    /// and sent here (a get).
    pub blocks: u64,
    pub bytes: u64,
    /// Blocks the host handed back or still owed when it failed, moved elsewhere.
    pub bounced: u64,
    /// Data connections the host's session opened, and how many of them carried a block.
    pub connections: u64,
    pub carried: u64,
    /// Why the host dropped out of the put, if it did.
    pub failed: Option<String>,
}

/// Frames the bounce queue holds before stripe connections stop taking from the sender's
/// queue: the coordinator's connections take them first, so a few per connection suffice.
const BOUNCE_MAX: usize = 64;

/// How long a stripe connection waits for the bounce queue to drain below its bound.
const BOUNCE_WAIT: std::time::Duration = std::time::Duration::from_millis(1);

type Owed = Arc<Mutex<HashMap<(FileId, u64), Frame>>>;

/// How long a stripe host that owes blocks may answer nothing (no `Landed`, no `Resend`)
/// before it is dropped as a failed one is and its blocks go to the others: a stopped
/// process or a black-holed link never fails a connection. A host writes a block and syncs
/// it in well under this on any working file system.
pub(super) const SILENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// How often a host's silence is looked at.
pub(super) const SILENCE_CHECK: std::time::Duration = std::time::Duration::from_millis(250);

/// When a host last showed progress: an answer, or a block given to it while it owed none.
type Heard = Arc<Mutex<std::time::Instant>>;

/// How long the end of a put or a get waits for the stripe hosts' sessions to close cleanly
/// (a TLS close on the control connection, so that the host logs a finished session, not a
/// failed one) before it drops them.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The stripe hosts while the put runs.
pub(crate) struct StripeHosts {
    tasks: JoinSet<()>,
    reports: Vec<Arc<Mutex<StripeReport>>>,
    /// Set when the put is over: each host's session then ends as its queue closing would.
    over: tokio::sync::watch::Sender<bool>,
    /// The coordinator shares every partial copy (`STRIPE_WHOLE`): hosts take every block
    /// sent after its file's decision.
    whole: Arc<AtomicBool>,
}

/// Where stripe hosts put what they do not carry, and what landed.
pub(crate) struct Outlets {
    pub(crate) bounce: flume::Sender<Frame>,
    pub(crate) landed: mpsc::UnboundedSender<Frame>,
    pub(crate) reporter: Arc<dyn Reporter>,
}

impl StripeHosts {
    /// Starts every host's connections on the sender's frame queue.
    pub(crate) fn start(
        hosts: Vec<StripeIo>,
        whole: bool,
        frames: &flume::Receiver<Frame>,
        active: &watch::Receiver<u32>,
        out: &Outlets,
    ) -> Self {
        let mut tasks = JoinSet::new();
        let mut reports = Vec::new();
        let (over, _) = tokio::sync::watch::channel(false);
        let whole = Arc::new(AtomicBool::new(whole));
        for h in hosts {
            let report = Arc::new(Mutex::new(StripeReport {
                host: h.host.clone(),
                connections: h.data.len() as u64,
                ..StripeReport::default()
            }));
            reports.push(report.clone());
            let host = Host {
                active: active.clone(),
                owed: Arc::default(),
                heard: Arc::new(Mutex::new(std::time::Instant::now())),
                report,
                bounce: out.bounce.clone(),
                landed: out.landed.clone(),
                reporter: out.reporter.clone(),
                whole: whole.clone(),
            };
            tasks.spawn(host.run(h, frames.clone(), over.subscribe()));
        }
        Self {
            tasks,
            reports,
            over,
            whole,
        }
    }

    /// The coordinator shares every partial copy (`STRIPE_WHOLE` in its `Welcome`): from
    /// now on hosts take small files and last blocks too.
    pub(crate) fn whole(&self) {
        self.whole.store(true, Ordering::Release);
    }

    /// Ends every host's session (the put is over), closing each cleanly if it can within
    /// `CLOSE_WAIT`, and reports what each did.
    pub(crate) async fn finish(mut self) -> Vec<StripeReport> {
        end_sessions(&self.over, &mut self.tasks, &self.reports).await
    }
}

/// Ends the stripe hosts' sessions of a put or a get: tells them it is over, waits
/// `CLOSE_WAIT` for them to close cleanly, drops those still open, and reports what each did.
pub(super) async fn end_sessions(
    over: &tokio::sync::watch::Sender<bool>,
    tasks: &mut JoinSet<()>,
    reports: &[Arc<Mutex<StripeReport>>],
) -> Vec<StripeReport> {
    let _ = over.send(true);
    let closed = tokio::time::timeout(CLOSE_WAIT, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if closed.is_err() {
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
    reports.iter().map(|r| lock(r).clone()).collect()
}

/// One stripe host: what it owes and where things go.
#[derive(Clone)]
struct Host {
    /// The coordinator's tuner: how many connections carry data, on every host alike.
    active: watch::Receiver<u32>,
    owed: Owed,
    heard: Heard,
    report: Arc<Mutex<StripeReport>>,
    bounce: flume::Sender<Frame>,
    landed: mpsc::UnboundedSender<Frame>,
    reporter: Arc<dyn Reporter>,
    whole: Arc<AtomicBool>,
}

impl Host {
    /// Runs the host's connections until one fails or the put is `over`; then closes the
    /// session, and what it owes goes to the others.
    async fn run(
        self,
        io: StripeIo,
        frames: flume::Receiver<Frame>,
        mut over: tokio::sync::watch::Receiver<bool>,
    ) {
        let StripeIo {
            control,
            data,
            block_size,
            ..
        } = io;
        let (ctrl_r, mut ctrl_w) = tokio::io::split(control);
        let mut conns = JoinSet::new();
        for (i, s) in data.into_iter().enumerate() {
            conns.spawn(self.clone().feed(i, s, frames.clone(), block_size));
        }
        let why = tokio::select! {
            e = self.clone().answers(ctrl_r) => e,
            e = self.silent() => e,
            _ = over.wait_for(|o| *o) => SessionError::Closed("stripe data"),
            Some(j) = conns.join_next() => match j {
                Ok(Err(e)) => e,
                Ok(Ok(())) => SessionError::Closed("stripe data"),
                Err(e) => SessionError::Protocol(format!("stripe task failed: {e}")),
            },
        };
        // Every connection is stopped before what is owed is taken: one still running on
        // another thread could take a frame after that, and nobody would send it again.
        conns.abort_all();
        while conns.join_next().await.is_some() {}
        // A stopped host never reads: the close is sent, not waited for long.
        let _ = tokio::time::timeout(SILENCE_CHECK, ctrl_w.shutdown()).await;
        // The queue closed (the put is ending) is no failure of the host.
        if !matches!(why, SessionError::Closed("stripe data")) {
            tracing::debug!(error = %why, "stripe host failed");
            lock(&self.report).failed = Some(why.to_string());
        }
        let owed: Vec<Frame> = lock(&self.owed).drain().map(|(_, f)| f).collect();
        lock(&self.report).bounced += owed.len() as u64;
        for f in owed {
            let _ = self.bounce.send(f);
        }
    }

    /// Ends when the host has owed blocks and answered nothing for [`SILENCE`].
    async fn silent(&self) -> SessionError {
        loop {
            tokio::time::sleep(SILENCE_CHECK).await;
            let owes = !lock(&self.owed).is_empty();
            if owes && lock(&self.heard).elapsed() >= SILENCE {
                return SessionError::Timeout("waiting for a stripe host that owes blocks");
            }
        }
    }

    /// The host answered, or was given a block while it owed none: its silence starts over.
    fn hear(&self) {
        *lock(&self.heard) = std::time::Instant::now();
    }

    fn whole(&self) -> bool {
        self.whole.load(Ordering::Acquire)
    }

    /// One data connection, the host's `index`th: while the coordinator's tuner lets that
    /// many carry data, takes frames from the queue, keeps what the host may write and
    /// bounces the rest. A block is owed from before it is written until it lands.
    async fn feed(
        mut self,
        index: usize,
        s: Stream,
        frames: flume::Receiver<Frame>,
        block_size: u32,
    ) -> Result<(), SessionError> {
        let (_rd, wr) = tokio::io::split(s);
        let mut w = BufWriter::with_capacity(256 << 10, wr);
        let mut scratch = BytesMut::with_capacity(8 << 10);
        let is_active = move |n: &u32| index < *n as usize;
        // The gate is watched until the coordinator's session lets it go (it is ending).
        let mut gated = true;
        let mut carried = false;
        loop {
            if gated && !is_active(&self.active.borrow()) {
                w.flush().await?;
                gated = self.active.wait_for(is_active).await.is_ok();
                continue;
            }
            // The bounce queue has no bound of its own (a frame is never held in an await
            // that an abort could drop): it is held to one by taking nothing while it is full.
            while self.bounce.len() >= BOUNCE_MAX {
                w.flush().await?;
                tokio::time::sleep(BOUNCE_WAIT).await;
            }
            let frame = match frames.try_recv() {
                Ok(f) => f,
                Err(flume::TryRecvError::Disconnected) => break,
                Err(flume::TryRecvError::Empty) => {
                    w.flush().await?;
                    match frames.recv_async().await {
                        Ok(f) => f,
                        Err(_) => break,
                    }
                }
            };
            let key = match &frame {
                Frame::Block(b) if for_stripe_host(b, block_size, self.whole()) => {
                    (b.file.id, b.offset)
                }
                _ => {
                    if self.bounce.send(frame).is_err() {
                        break;
                    }
                    continue;
                }
            };
            {
                let mut owed = lock(&self.owed);
                if owed.is_empty() {
                    self.hear();
                }
                owed.insert(key, frame.clone());
            }
            if !carried {
                carried = true;
                lock(&self.report).carried += 1;
            }
            write_frame(&mut w, &frame, &mut scratch).await?;
        }
        w.flush().await?;
        Ok(())
    }

    /// The host's control connection: `Landed` goes on to the coordinator, `Resend` (not
    /// written there) back to the queue. Ends with the reason it stopped.
    async fn answers(self, mut r: ReadHalf<Stream>) -> SessionError {
        loop {
            let frame = match read_frame(&mut r, MAX_CONTROL_PAYLOAD).await {
                Ok(Some(f)) => f,
                Ok(None) => return SessionError::Closed("stripe control"),
                Err(e) => return e,
            };
            self.hear();
            match frame {
                Frame::Landed {
                    file,
                    offset,
                    len,
                    digest,
                    cvs,
                } => {
                    let Some(Frame::Block(b)) = lock(&self.owed).remove(&(file, offset)) else {
                        continue; // handed on already (a duplicate, or after a failure)
                    };
                    if digest != b.digest || len as usize != b.data.len() {
                        let _ = self.bounce.send(Frame::Block(b));
                        return SessionError::Protocol(format!(
                            "stripe host reported a block of file {file:?} at {offset} that \
                             is not the one sent"
                        ));
                    }
                    {
                        let mut rep = lock(&self.report);
                        rep.blocks += 1;
                        rep.bytes += u64::from(len);
                    }
                    self.reporter.on_bytes(u64::from(len));
                    // The digest the block carried, which only the client has: before the
                    // `Landed`, so that the coordinator has it when the file is whole.
                    if let Some(digest) = b.file_digest {
                        if self
                            .landed
                            .send(Frame::FileDigest { file, digest })
                            .is_err()
                        {
                            return SessionError::Closed("put");
                        }
                    }
                    // The chaining values are the host's word: the coordinator merges them
                    // into the file's tree, whose root must still equal the sender's digest.
                    let landed = Frame::Landed {
                        file,
                        offset,
                        len,
                        digest: b.digest,
                        cvs,
                    };
                    if self.landed.send(landed).is_err() {
                        return SessionError::Closed("put");
                    }
                }
                Frame::Resend { file, offset, .. } => {
                    let Some(f) = lock(&self.owed).remove(&(file, offset)) else {
                        continue;
                    };
                    lock(&self.report).bounced += 1;
                    if self.bounce.send(f).is_err() {
                        return SessionError::Closed("put");
                    }
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
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
