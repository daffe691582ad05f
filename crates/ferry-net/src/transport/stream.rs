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

/// Writes with `write`, once more when the first attempt found the connection still being set
/// up (see [`still_connecting`]). The kernel has sent its plain SYN by then and answers the
/// next write with `EAGAIN`, on which tokio's own write clears the socket's readiness and
/// registers the task, so the wake-up comes with the handshake's end. Clearing readiness here
/// instead could lose that wake-up if the SYN-ACK arrived between the two calls.
fn write_when_connected(
    mut write: impl FnMut() -> Poll<io::Result<usize>>,
) -> Poll<io::Result<usize>> {
    match write() {
        Poll::Ready(Err(e)) if still_connecting(&e) => write(),
        r => r,
    }
}

impl AsyncWrite for Recorder {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let inner = &mut self.get_mut().inner;
        write_when_connected(|| Pin::new(&mut *inner).poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let inner = &mut self.get_mut().inner;
        write_when_connected(|| Pin::new(&mut *inner).poll_write_vectored(cx, bufs))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn replies(
        mut r: Vec<Poll<io::Result<usize>>>,
    ) -> (
        impl FnMut() -> Poll<io::Result<usize>>,
        std::rc::Rc<std::cell::Cell<usize>>,
    ) {
        let calls = std::rc::Rc::new(std::cell::Cell::new(0));
        let seen = calls.clone();
        r.reverse();
        let write = move || {
            seen.set(seen.get() + 1);
            r.pop().expect("no more writes expected")
        };
        (write, calls)
    }

    fn in_progress() -> Poll<io::Result<usize>> {
        Poll::Ready(Err(io::Error::from_raw_os_error(libc::EINPROGRESS)))
    }

    /// A Fast Open write that took nothing is written again at once: the kernel answers that
    /// one `EAGAIN` (tokio's `Pending`) until the handshake ends, or takes the bytes.
    #[test]
    fn a_write_that_found_the_connection_opening_is_made_again() {
        let (w, calls) = replies(vec![in_progress(), Poll::Pending]);
        assert!(write_when_connected(w).is_pending());
        assert_eq!(calls.get(), 2);

        let (w, _) = replies(vec![in_progress(), Poll::Ready(Ok(517))]);
        assert!(matches!(write_when_connected(w), Poll::Ready(Ok(517))));
    }

    /// Only once: a kernel that answered so again is an error, not a loop; and every other
    /// outcome passes through untouched.
    #[test]
    fn only_the_first_in_progress_is_forgiven() {
        let (w, calls) = replies(vec![in_progress(), in_progress()]);
        match write_when_connected(w) {
            Poll::Ready(Err(e)) => assert!(still_connecting(&e)),
            other => panic!("{other:?}"),
        }
        assert_eq!(calls.get(), 2);

        let refused = || Poll::Ready(Err(io::Error::from(io::ErrorKind::ConnectionRefused)));
        let (w, calls) = replies(vec![refused()]);
        assert!(matches!(write_when_connected(w), Poll::Ready(Err(_))));
        assert_eq!(calls.get(), 1);
        let (w, calls) = replies(vec![Poll::Ready(Ok(3))]);
        assert!(matches!(write_when_connected(w), Poll::Ready(Ok(3))));
        assert_eq!(calls.get(), 1);
    }
}
