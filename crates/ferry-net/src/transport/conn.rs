//! Reading and writing whole frames on a byte stream.

use bytes::BytesMut;
use ferry_proto::{Frame, FrameHeader, HEADER_LEN};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::SessionError;

/// Reads one frame whose payload may be at most `max` bytes (on top of the per-type bound).
/// `Ok(None)` is a clean end of stream at a frame boundary.
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    max: u32,
) -> Result<Option<Frame>, SessionError> {
    let mut head = [0u8; HEADER_LEN];
    match r.read(&mut head[..1]).await? {
        0 => return Ok(None),
        _ => r.read_exact(&mut head[1..]).await?,
    };
    let header = FrameHeader::parse(&head)?;
    if header.len > max {
        let why = if header.ty == ferry_proto::FrameType::BLOCK {
            " (the session's block size plus its header)"
        } else {
            ""
        };
        return Err(SessionError::Protocol(format!(
            "{} frame of {} bytes is larger than allowed here: {max}{why}",
            header.ty.name(),
            header.len
        )));
    }
    let len = header.len as usize;
    // Block payloads land in recycled buffers; the decoded block's data is a zero-copy slice.
    let mut payload = ferry_core::buf::take(len);
    let mut limited = r.take(len as u64);
    while payload.len() < len {
        if limited.read_buf(&mut payload).await? == 0 {
            return Err(SessionError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
    }
    Ok(Some(Frame::decode(
        header.ty,
        ferry_core::buf::freeze(payload),
    )?))
}

/// Reads a frame where the protocol requires one.
pub(crate) async fn expect_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    max: u32,
    what: &'static str,
) -> Result<Frame, SessionError> {
    match read_frame(r, max).await? {
        Some(Frame::Error { code, message }) => Err(SessionError::Remote { code, message }),
        Some(f) => Ok(f),
        None => Err(SessionError::Closed(what)),
    }
}

/// Writes one frame; block data is written straight from its buffer, never copied.
pub(crate) async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    frame: &Frame,
    scratch: &mut BytesMut,
) -> std::io::Result<usize> {
    scratch.clear();
    match frame {
        Frame::Block(b) => {
            b.encode_head(scratch);
            w.write_all(scratch).await?;
            w.write_all(&b.data).await?;
            Ok(scratch.len() + b.data.len())
        }
        other => {
            other.encode(scratch);
            w.write_all(scratch).await?;
            Ok(scratch.len())
        }
    }
}

/// Writes a frame and flushes it (control frames, where latency matters more than batching).
pub(crate) async fn send<W: AsyncWrite + Unpin>(w: &mut W, frame: &Frame) -> std::io::Result<()> {
    let mut buf = BytesMut::new();
    write_frame(w, frame, &mut buf).await?;
    w.flush().await
}
