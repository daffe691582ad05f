//! One connection of a session, encrypted or (when both ends allowed it) plain TCP, behind one
//! type so the engine does not care which.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsStream;

/// First byte of a TLS record carrying a handshake message (RFC 8446 §5.1). A ferry `Hello`
/// starts with frame type 0x01, so one byte tells the two apart.
pub(crate) const TLS_HANDSHAKE_RECORD: u8 = 0x16;

pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<Recorder>>),
}

impl Stream {
    /// The TCP socket underneath, for socket options and `TCP_INFO`.
    pub(crate) fn tcp(&self) -> &TcpStream {
        match self {
            Self::Plain(s) => s,
            Self::Tls(s) => &s.get_ref().0.inner,
        }
    }

    pub(crate) fn is_encrypted(&self) -> bool {
        matches!(self, Self::Tls(_))
    }
}

/// A TCP stream that keeps the first bytes it reads. A server that refuses a connection
/// (busy, or plain TCP only) answers with a plain ferry `Error` frame, which a TLS client
/// cannot parse as a record; with these bytes it can still tell the user what the server said,
/// and whether retrying helps.
pub(crate) struct Recorder {
    pub(crate) inner: TcpStream,
    first: Vec<u8>,
}

impl Recorder {
    const KEEP: usize = 4096;

    pub(crate) fn new(inner: TcpStream) -> Self {
        Self {
            inner,
            first: Vec::new(),
        }
    }

    /// The plain `Error` frame the peer sent instead of a TLS record, if it did.
    pub(crate) fn plain_error(first: &[u8]) -> Option<ferry_proto::Frame> {
        let head: &[u8; ferry_proto::HEADER_LEN] =
            first.get(..ferry_proto::HEADER_LEN)?.try_into().ok()?;
        let header = ferry_proto::FrameHeader::parse(head).ok()?;
        if header.ty != ferry_proto::FrameType::ERROR {
            return None;
        }
        let body = first.get(ferry_proto::HEADER_LEN..)?;
        let body = body.get(..header.len as usize)?;
        ferry_proto::Frame::decode(header.ty, bytes::Bytes::copy_from_slice(body)).ok()
    }

    pub(crate) fn first_bytes(&self) -> &[u8] {
        &self.first
    }
}

impl AsyncRead for Recorder {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if this.first.len() < Self::KEEP {
            let new = &buf.filled()[before..];
            let take = new.len().min(Self::KEEP - this.first.len());
            this.first.extend_from_slice(&new[..take]);
        }
        r
    }
}

impl AsyncWrite for Recorder {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(s) => s.is_write_vectored(),
            Self::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
