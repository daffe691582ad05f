//! A stripe host's session: the blocks a striped put's client sends here are written into the
//! partial copies the put's coordinator (another server on the same file system) opened, and
//! each is reported `Landed` once durable (with the BLAKE3 chaining values of what was
//! written, so that the coordinator need not read it back), or handed back with `Resend` when it is not for
//! this host (not opened yet, committed already, damaged): the client then sends it to the
//! coordinator. Nothing here creates, decides, verifies or renames a file.

use std::sync::Arc;
use std::time::Duration;

use ferry_core::recv::StripeWriter;
use ferry_proto::{Frame, MAX_CONTROL_PAYLOAD};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::engine::Limits;
use crate::error::SessionError;
use crate::transport::conn::{read_frame, send};
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
