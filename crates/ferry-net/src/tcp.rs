//! Socket options and the kernel's view of a connection.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::Duration;

use serde::Serialize;
use socket2::{SockRef, TcpKeepalive};
use tokio::net::TcpStream;

/// Options every ferry connection gets. Keepalive stops firewalls from silently dropping a
/// control connection that is idle while the data connections work.
pub(crate) fn tune(stream: &TcpStream) {
    let _ = stream.set_nodelay(true);
    let sock = SockRef::from(stream);
    let ka = TcpKeepalive::new()
        .with_time(Duration::from_secs(30))
        .with_interval(Duration::from_secs(10));
    let _ = sock.set_tcp_keepalive(&ka);
}

/// Fixes SO_SNDBUF/SO_RCVBUF. This disables the kernel's autotuning for the socket, which is
/// why it only happens when the user asks for it.
pub(crate) fn set_window(stream: &TcpStream, bytes: u32) -> std::io::Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    let sock = SockRef::from(stream);
    sock.set_send_buffer_size(bytes as usize)?;
    sock.set_recv_buffer_size(bytes as usize)?;
    Ok(())
}

/// What the kernel knows about a TCP connection, from `TCP_INFO` and the socket buffers.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TcpInfo {
    pub rtt_us: u32,
    pub rttvar_us: u32,
    pub snd_cwnd: u32,
    pub snd_mss: u32,
    pub total_retrans: u32,
    pub min_rtt_us: u32,
    pub pacing_rate_bps: u64,
    /// Payload bytes the peer acknowledged (`tcpi_bytes_acked`): what the stream tuner counts.
    pub bytes_acked: u64,
    /// Payload bytes received (`tcpi_bytes_received`).
    pub bytes_received: u64,
    /// Microseconds the connection had data in flight (`tcpi_busy_time`), and of those, how
    /// long it was held back by the peer's receive window (`tcpi_rwnd_limited`) or by its own
    /// send buffer (`tcpi_sndbuf_limited`): whether more streams could help (a window limit)
    /// or only add queueing (the path's limit). 0 on kernels before 4.10.
    pub busy_us: u64,
    pub rwnd_limited_us: u64,
    pub sndbuf_limited_us: u64,
    /// Effective SO_SNDBUF/SO_RCVBUF (the kernel doubles what is asked for).
    pub sndbuf: usize,
    pub rcvbuf: usize,
}

pub(crate) fn tcp_info(stream: &TcpStream) -> Option<TcpInfo> {
    tcp_info_fd(stream.as_fd())
}

/// `TCP_INFO` of any TCP socket (the engine keeps duplicated descriptors of its data sockets, so
/// it can sample them while the stream tasks own the connections).
pub(crate) fn tcp_info_fd(sock: BorrowedFd<'_>) -> Option<TcpInfo> {
    let fd = sock.as_raw_fd();
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` is a properly sized, writable tcp_info and `len` holds its size; the kernel
    // writes at most `len` bytes and updates `len`.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return None;
    }
    let sock = SockRef::from(&sock);
    // Kernels before 4.1 fill less of the struct: the byte counters are then unknown (0).
    let has_bytes = len as usize
        >= std::mem::offset_of!(libc::tcp_info, tcpi_bytes_received) + std::mem::size_of::<u64>();
    let has_chrono = len as usize
        >= std::mem::offset_of!(libc::tcp_info, tcpi_sndbuf_limited) + std::mem::size_of::<u64>();
    let chrono = |v: u64| if has_chrono { v } else { 0 };
    Some(TcpInfo {
        rtt_us: info.tcpi_rtt,
        rttvar_us: info.tcpi_rttvar,
        snd_cwnd: info.tcpi_snd_cwnd,
        snd_mss: info.tcpi_snd_mss,
        total_retrans: info.tcpi_total_retrans,
        min_rtt_us: info.tcpi_min_rtt,
        pacing_rate_bps: info.tcpi_pacing_rate.saturating_mul(8),
        bytes_acked: if has_bytes { info.tcpi_bytes_acked } else { 0 },
        bytes_received: if has_bytes {
            info.tcpi_bytes_received
        } else {
            0
        },
        busy_us: chrono(info.tcpi_busy_time),
        rwnd_limited_us: chrono(info.tcpi_rwnd_limited),
        sndbuf_limited_us: chrono(info.tcpi_sndbuf_limited),
        sndbuf: sock.send_buffer_size().unwrap_or(0),
        rcvbuf: sock.recv_buffer_size().unwrap_or(0),
    })
}
