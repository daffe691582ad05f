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

/// Whether a write failed only because a TCP Fast Open connection is still being set up.
///
/// A client socket with `TCP_FASTOPEN_CONNECT` and a cached cookie "connects" at once and
/// sends its SYN with the first write. When the kernel cannot put any of that write into the
/// SYN (it sends a plain SYN instead, e.g. short of memory), the write takes nothing and fails
/// with `EINPROGRESS` (linux `tcp_sendmsg_fastopen`), which is no failure: the bytes are to be
/// written once the handshake completes. Later writes before then see `EAGAIN`, as usual.
fn still_connecting(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINPROGRESS)
}

/// Writes with `write`, waiting for the connection first when it is still being set up (see
/// [`still_connecting`]). Bounded: a kernel that kept answering so is an error.
fn write_when_connected(
    s: &mut TcpStream,
    cx: &mut Context<'_>,
    mut write: impl FnMut(Pin<&mut TcpStream>, &mut Context<'_>) -> Poll<io::Result<usize>>,
) -> Poll<io::Result<usize>> {
    let mut tries = 0;
    loop {
        match write(Pin::new(s), cx) {
            Poll::Ready(Err(e)) if still_connecting(&e) && tries < 3 => {
                tries += 1;
                // The failed write found the socket writable: forget that, so the wait
                // registers for the next writable edge, the handshake's end.
                let _ = s.try_io(tokio::io::Interest::WRITABLE, || {
                    Err::<(), _>(io::ErrorKind::WouldBlock.into())
                });
                std::task::ready!(s.poll_write_ready(cx))?;
            }
            r => return r,
        }
    }
}

impl AsyncWrite for Recorder {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        write_when_connected(&mut self.get_mut().inner, cx, |s, cx| s.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        write_when_connected(&mut self.get_mut().inner, cx, |s, cx| {
            s.poll_write_vectored(cx, bufs)
        })
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
