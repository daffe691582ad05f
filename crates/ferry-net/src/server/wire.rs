//! The few things a server says on a connection outside a transfer: `Welcome`, and refusals
//! closed so that the client reads them.

use std::time::Duration;

use ferry_proto::{Capabilities, Frame, SessionId, PROTOCOL_VERSION};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::transport::conn::send;
use crate::transport::stream::Stream;
use crate::transport::tcp::peer_closed;

pub(super) async fn welcome(
    stream: &mut Stream,
    session: SessionId,
    secret: [u8; 32],
) -> std::io::Result<()> {
    welcome_with(stream, session, secret, Capabilities::ours()).await
}

/// A `Welcome` with `capabilities`: a control connection's also says `multipath` when the
/// client offered it, so that the client knows a `Paths` follows.
pub(super) async fn welcome_with(
    stream: &mut Stream,
    session: SessionId,
    secret: [u8; 32],
    capabilities: Capabilities,
) -> std::io::Result<()> {
    let frame = Frame::Welcome {
        version: PROTOCOL_VERSION,
        capabilities,
        session,
        secret,
    };
    send(stream, &frame).await
}

/// Resolves once the peer has closed the connection (checked every 100 ms: its unread bytes,
/// a `Hello`'s early blocks, say nothing).
pub(super) async fn closed_by_peer(stream: &Stream) {
    let mut check = tokio::time::interval(Duration::from_millis(100));
    loop {
        check.tick().await;
        if peer_closed(stream.tcp()) {
            return;
        }
    }
}

/// Closes a refused connection so that the client reads the refusal. Clients send their
/// request right behind the Hello; closing with those bytes unread would send a reset, and a
/// reset can destroy the refusal before the client has read it. So: end our side, then take
/// what the client sent until it closes too, bounded in bytes and time.
pub(super) async fn linger(stream: &mut Stream) {
    let _ = tokio::time::timeout(Duration::from_millis(500), async {
        let _ = stream.shutdown().await;
        let mut sink = [0u8; 4096];
        let mut left = 64usize << 10;
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(n) if n > 0 => left = left.saturating_sub(n),
                _ => break,
            }
        }
    })
    .await;
}

/// Sends a plain `Error` frame and closes. What the client sent first is read off the socket
/// before: closing with unread bytes sends a reset, which the client would take for a network
/// failure (and retry) instead of reading the refusal.
pub(super) async fn refuse_plainly(stream: TcpStream, frame: &Frame) {
    let mut plain = Stream::Plain(stream);
    let mut first = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_millis(500), plain.read(&mut first)).await;
    let _ = send(&mut plain, frame).await;
    let _ = plain.shutdown().await;
}
