//! A stripe host's session: the blocks a striped put's client sends here are written into the
//! partial copies the put's coordinator (another server on the same file system) opened, and
//! each is reported `Landed` once durable (with the BLAKE3 chaining values of what was
//! written, so that the coordinator need not read it back), or handed back with `Resend` when it is not for
//! this host (not opened yet, committed already, damaged): the client then sends it to the
//! coordinator. Nothing here creates, decides, verifies or renames a file.
//!
//! A stripe *read* session ([`serve_reads`]) is a striped get's: the client asks for blocks
//! of files the get's coordinator offered (`Fetch`), each read here from the shared file
//! system and sent as a `Block` on a data connection, or handed back with `Resend` when it
//! cannot be (the file changed, or cannot be read here): the client then asks the
//! coordinator. Nothing here walks, offers or hashes a whole file.

use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::BytesMut;
use ferry_core::recv::StripeWriter;
use ferry_core::send::{StripeReader, Wanted};
use ferry_proto::{Frame, MAX_CONTROL_PAYLOAD};
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::engine::Limits;
use crate::error::SessionError;
use crate::transport::conn::{read_frame, send, write_frame};
use crate::transport::stream::Stream;

/// What a stripe session stored: blocks and bytes landed.
pub(super) struct Landed {
    pub(super) blocks: u64,
    pub(super) bytes: u64,
}

/// Runs a stripe session until the client closes it (or goes idle for `idle`).
pub(super) async fn serve(
    control: Stream,
    writer: Arc<StripeWriter>,
    data: Vec<Stream>,
    block_size: u32,
    idle: Duration,
) -> Result<Landed, SessionError> {
    let limits = Limits::new(idle, block_size);
    let (tx, mut rx) = mpsc::channel::<Frame>(256);
    let mut streams = JoinSet::new();
    for s in data {
        streams.spawn(stripe_stream(
            s,
            writer.clone(),
            tx.clone(),
            limits.data_frame,
        ));
    }
    drop(tx);
    let (mut ctrl_r, mut ctrl_w) = tokio::io::split(control);
    let mut landed = Landed {
        blocks: 0,
        bytes: 0,
    };
    loop {
        let step = tokio::time::timeout(idle, async {
            tokio::select! {
                f = rx.recv() => Ok(f),
                r = read_frame(&mut ctrl_r, MAX_CONTROL_PAYLOAD) => match r? {
                    None => Ok(None),
                    Some(Frame::Error { code, message }) => {
                        Err(SessionError::Remote { code, message })
                    }
                    Some(other) => Err(SessionError::Protocol(format!(
                        "unexpected {} on a stripe session's control connection",
                        other.frame_type().name()
                    ))),
                },
                Some(Ok(Err(e))) = streams.join_next() => Err(e),
            }
        });
        let Some(frame) = step
            .await
            .map_err(|_| SessionError::Timeout("a stripe session's client"))??
        else {
            // The client closed the session, or every data connection ended.
            return Ok(landed);
        };
        if let Frame::Landed { len, .. } = frame {
            landed.blocks += 1;
            landed.bytes += u64::from(len);
        }
        send(&mut ctrl_w, &frame).await?;
    }
}

/// One data connection of a stripe session: each block written (on a blocking thread) before
/// the next is read, so a session writes as many blocks at once as it has connections.
async fn stripe_stream(
    mut s: Stream,
    writer: Arc<StripeWriter>,
    out: mpsc::Sender<Frame>,
    max: u32,
) -> Result<(), SessionError> {
    loop {
        let frame = match read_frame(&mut s, max).await {
            Ok(Some(f)) => f,
            // The client resets its data connections at the end: what they carried that did
            // not land it sends again elsewhere.
            Ok(None) | Err(SessionError::Io(_)) => break,
            Err(e) => return Err(e),
        };
        let Frame::Block(block) = frame else {
            return Err(SessionError::Protocol(format!(
                "unexpected {} on a stripe session's data connection",
                frame.frame_type().name()
            )));
        };
        let writer = writer.clone();
        let (written, block) = tokio::task::spawn_blocking(move || (writer.write(&block), block))
            .await
            .map_err(|e| SessionError::Protocol(format!("stripe writer failed: {e}")))?;
        let (file, offset, len) = (block.file.id, block.offset, block.data.len() as u32);
        let answer = match written {
            Ok(cvs) => Frame::Landed {
                file,
                offset,
                len,
                digest: block.digest,
                cvs,
            },
            Err(e) if e.is_refusal() => {
                tracing::debug!(error = %e, "stripe: block handed back");
                Frame::Resend { file, offset, len }
            }
            Err(e) => return Err(SessionError::Protocol(e.to_string())),
        };
        if out.send(answer).await.is_err() {
            break;
        }
    }
    Ok(())
}

/// Fetches a stripe read session holds before it reads no more of its control connection: a
/// client keeps a few per data connection in flight.
const FETCHES_QUEUED: usize = 1024;

/// Runs a stripe read session until the client closes it (or goes idle for `idle`): each
/// `Fetch` on the control connection is read by whichever data connection is free and sent
/// there as a `Block`; one that cannot be read is answered `Resend` on control.
pub(super) async fn serve_reads(
    control: Stream,
    reader: Arc<StripeReader>,
    data: Vec<Stream>,
    idle: Duration,
) -> Result<Landed, SessionError> {
    let (fetch_tx, fetches) = flume::bounded::<Wanted>(FETCHES_QUEUED);
    let (refused_tx, mut refused) = mpsc::channel::<Frame>(256);
    let sent = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let mut streams = JoinSet::new();
    for s in data {
        streams.spawn(read_stream(
            s,
            reader.clone(),
            fetches.clone(),
            refused_tx.clone(),
            sent.clone(),
        ));
    }
    drop(refused_tx);
    let (mut ctrl_r, mut ctrl_w) = tokio::io::split(control);
    let max = MAX_CONTROL_PAYLOAD;
    loop {
        let step = tokio::time::timeout(idle, async {
            tokio::select! {
                Some(f) = refused.recv() => Ok(Some(Some(f))),
                r = read_frame(&mut ctrl_r, max) => match r? {
                    None => Ok(None),
                    Some(Frame::Fetch { file, path, size, mtime_ns, offset, len }) => {
                        let w = Wanted { file, path, size, mtime_ns, offset, len };
                        fetch_tx
                            .send_async(w)
                            .await
                            .map_err(|_| SessionError::Closed("stripe data"))?;
                        Ok(Some(None))
                    }
                    Some(Frame::Error { code, message }) => {
                        Err(SessionError::Remote { code, message })
                    }
                    Some(other) => Err(SessionError::Protocol(format!(
                        "unexpected {} on a stripe read session's control connection",
                        other.frame_type().name()
                    ))),
                },
                Some(Ok(Err(e))) = streams.join_next() => Err(e),
            }
        });
        let answer = step
            .await
            .map_err(|_| SessionError::Timeout("a stripe session's client"))??;
        match answer {
            // The client closed the session.
            None => break,
            Some(Some(frame)) => send(&mut ctrl_w, &frame).await?,
            Some(None) => {}
        }
    }
    drop(fetch_tx);
    streams.abort_all();
    while streams.join_next().await.is_some() {}
    Ok(Landed {
        blocks: sent.0.load(Ordering::Relaxed),
        bytes: sent.1.load(Ordering::Relaxed),
    })
}

/// One data connection of a stripe read session: reads each fetched block (on a blocking
/// thread) and sends it, flushing whenever no other fetch waits.
async fn read_stream(
    s: Stream,
    reader: Arc<StripeReader>,
    fetches: flume::Receiver<Wanted>,
    refused: mpsc::Sender<Frame>,
    sent: Arc<(AtomicU64, AtomicU64)>,
) -> Result<(), SessionError> {
    match send_fetched(s, reader, fetches, refused, sent).await {
        // The client resets its data connections at the end: what did not reach it, it asks
        // of the coordinator.
        Err(SessionError::Io(_)) => Ok(()),
        other => other,
    }
}

async fn send_fetched(
    s: Stream,
    reader: Arc<StripeReader>,
    fetches: flume::Receiver<Wanted>,
    refused: mpsc::Sender<Frame>,
    sent: Arc<(AtomicU64, AtomicU64)>,
) -> Result<(), SessionError> {
    let (_rd, wr) = tokio::io::split(s);
    let mut w = BufWriter::with_capacity(256 << 10, wr);
    let mut scratch = BytesMut::with_capacity(8 << 10);
    loop {
        let wanted = match fetches.try_recv() {
            Ok(f) => f,
            Err(flume::TryRecvError::Disconnected) => break,
            Err(flume::TryRecvError::Empty) => {
                w.flush().await?;
                match fetches.recv_async().await {
                    Ok(f) => f,
                    Err(_) => break,
                }
            }
        };
        let reader = reader.clone();
        let (read, wanted) = tokio::task::spawn_blocking(move || (reader.read(&wanted), wanted))
            .await
            .map_err(|e| SessionError::Protocol(format!("stripe reader failed: {e}")))?;
        match read {
            Ok(block) => {
                let len = block.data.len() as u64;
                write_frame(&mut w, &Frame::Block(block), &mut scratch).await?;
                sent.0.fetch_add(1, Ordering::Relaxed);
                sent.1.fetch_add(len, Ordering::Relaxed);
            }
            Err(e) if e.is_refusal() => {
                tracing::debug!(error = %e, "stripe: fetch handed back");
                let back = Frame::Resend {
                    file: wanted.file,
                    offset: wanted.offset,
                    len: wanted.len,
                };
                if refused.send(back).await.is_err() {
                    break;
                }
            }
            Err(e) => return Err(SessionError::Protocol(e.to_string())),
        }
    }
    w.flush().await?;
    Ok(())
}
