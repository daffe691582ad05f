//! Socket options and the kernel's view of a connection.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::Duration;

use serde::Serialize;
use socket2::{SockRef, TcpKeepalive};
use tokio::net::TcpStream;

/// Unsent bytes a connection may hold in its send buffer (`TCP_NOTSENT_LOWAT`) unless
/// `FERRY_TCP_NOTSENT_LOWAT` says otherwise (bytes; 0 leaves the kernel's default, no limit).
///
/// Why: the frames of all files come from one queue, and a frame written into a socket is
/// committed to that connection. With autotuning a send buffer grows to `tcp_wmem`'s max
/// (4 MiB here), so 16 connections could take 64 MiB off the queue — more than half of a
/// 100 MB tree of small files — and a connection that then slows down (a loss, a recovery)
/// holds the end of the transfer back while the others sit idle. Limiting only the *unsent*
/// part keeps the connection's window (in flight, sized by the kernel as before: this does
/// not disable autotuning) and leaves the rest in the shared queue, where the next connection
/// with room takes it. 1 MiB is 8 ms of sending at 1 Gbit/s, ample time for the writer to
/// refill it. Measured on the bed (BENCHMARKS.md, "Unsent data per connection").
pub const NOTSENT_LOWAT: u32 = 1 << 20;

/// The limit in force: [`NOTSENT_LOWAT`], or the environment's override.
pub fn notsent_lowat() -> u32 {
    bytes_from(
        std::env::var("FERRY_TCP_NOTSENT_LOWAT").ok().as_deref(),
        NOTSENT_LOWAT,
    )
}

/// The receive window a data connection may open to before the kernel's autotuning has
/// measured it, unless `FERRY_TCP_RCVBUF_START` says otherwise (bytes; 0 leaves the kernel's start).
///
/// Why: Linux starts a connection's receive buffer at `tcp_rmem`'s middle value (128 KiB
/// here, a common default) and lets autotuning grow it once per round trip, by what the
/// application read in the last one. Until then the buffer allows a window of half of it,
/// about 56 KiB — less than the sender's initial congestion window of 10 segments at MTU
/// 9000 — so for the first three round trips every connection of a transfer was limited by
/// the receiver's window, not by the network (TCP_INFO: 250–400 ms of `rwnd_limited` per
/// connection at 100 ms RTT; 92–96 ms with the larger start), and the link filled 0.17 s
/// later than with it.
/// Starting the buffer higher keeps autotuning: the buffer is not locked, as SO_RCVBUF would
/// lock it, and the kernel goes on growing it to `tcp_rmem`'s max. 4 MiB is the window each
/// of 4 connections needs to fill 1 Gbit/s at 125 ms; a sender's slow start takes five round
/// trips to reach it from 10 segments, time in which autotuning has measured the connection
/// and grows the buffer on from there if the path needs more. Measured on the bed
/// (BENCHMARKS.md, "The receive window at the start").
pub const RCVBUF_START: u32 = 4 << 20;

/// The start in force: [`RCVBUF_START`], or the environment's override.
pub fn rcvbuf_start() -> u32 {
    bytes_from(
        std::env::var("FERRY_TCP_RCVBUF_START").ok().as_deref(),
        RCVBUF_START,
    )
}

/// The receive window every connection the server accepts starts with, before anyone has
/// authenticated it, unless `FERRY_TCP_LISTEN_RCVBUF_START` says otherwise (bytes; 0 leaves
/// the kernel's start).
///
/// Why: a connection's first window is fixed when its SYN arrives, from the listening
/// socket's buffer; raising a data connection's buffer once its `Hello` is accepted
/// ([`RCVBUF_START`]) comes after the client's first flight has left. With the kernel's
/// 128 KiB buffer that window is 7 segments at MTU 9000, below a sender's initial 10, and the
/// slow start of every connection began 30% short (TCP_INFO: ~92 ms `rwnd_limited` per
/// connection at 100 ms RTT, none with this start; docs/bench/NOTEBOOK.md, "The first window").
/// Why not more: this is what a client that has not authenticated can make the server's
/// kernel hold unread, per connection: a buffer of twice the window, 512 KiB instead of 128,
/// for at most the handshake timeout once accepted, on every connection the server has not
/// yet accepted or refused (up to the 4096 of the accept queue) as well; the kernel's
/// `tcp_mem` bounds the total.
pub const LISTEN_RCVBUF_START: u32 = 256 << 10;

/// The listening start in force: [`LISTEN_RCVBUF_START`], or the environment's override.
pub fn listen_rcvbuf_start() -> u32 {
    bytes_from(
        std::env::var("FERRY_TCP_LISTEN_RCVBUF_START")
            .ok()
            .as_deref(),
        LISTEN_RCVBUF_START,
    )
}

/// Gives every connection a listener will accept its first window (see
/// [`LISTEN_RCVBUF_START`]), on the socket before `listen`: accepted sockets inherit its
/// buffer, still unlocked, so autotuning goes on.
pub(crate) fn open_listen_window(socket: &tokio::net::TcpSocket) {
    let _ = start_unconnected_window(socket.as_fd(), listen_rcvbuf_start());
}

/// [`start_receive_window`] for a socket that has neither connected nor listened, whose window
/// scale is still to be chosen. Linux without the October 2025 fix "tcp: take care of zero
/// tp->window_clamp in tcp_set_rcvlowat()" (this 6.18 has it; older and stable kernels vary)
/// also sets the socket's window clamp when SO_RCVLOWAT grows the buffer, and the scale
/// offered in the SYN (fixed for the connection's life) is sized by that clamp: 256 KiB would
/// cap every accepted connection's window at 512 KiB for good (a clamp set by hand here gave
/// scale 3). Clearing the clamp, which Linux allows only before the connection exists, keeps
/// the scale sized by `tcp_rmem`'s max as without the raise.
pub(crate) fn start_unconnected_window(sock: BorrowedFd<'_>, bytes: u32) -> std::io::Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    start_receive_window(sock, bytes)?;
    set_int(sock, libc::IPPROTO_TCP, libc::TCP_WINDOW_CLAMP, 0)
}

/// Pending Fast Open connections a listener holds (`TCP_FASTOPEN`'s queue, which the kernel caps
/// at `net.core.somaxconn`): connections whose SYN carried data and whose handshake has not
/// completed. Beyond it the kernel falls back to the ordinary handshake, so this bounds what
/// spoofed SYNs with stolen cookies can make the server work on, not how many clients it
/// serves.
pub const FAST_OPEN_QUEUE: i32 = 256;

/// Whether ferry asks for TCP Fast Open (RFC 7413): unless `FERRY_TCP_FASTOPEN=0`.
///
/// Why: every connection pays a round trip for its SYN before TLS can start, and a session's
/// first data waits for that and TLS's own (0.2 s at 100 ms). With Fast Open the client's TLS
/// hello rides in the SYN once the client's kernel holds a cookie from the server (any earlier
/// connection to that address gets one), so the data leaves a round trip sooner. It takes both
/// kernels: the client's `net.ipv4.tcp_fastopen` bit 1 (Linux's default) and the server's bit
/// 2 (off by default; `ferry probe host` says how to set it); where either is missing the
/// options change nothing and connections open as before. The switch exists for paths whose
/// middleboxes drop SYNs that carry data (each such connection would wait for a SYN
/// retransmission, which the kernel sends without data).
pub fn fast_open() -> bool {
    fast_open_from(std::env::var("FERRY_TCP_FASTOPEN").ok().as_deref())
}

fn fast_open_from(var: Option<&str>) -> bool {
    var.map(str::trim) != Some("0")
}

/// Lets a client socket send its first write in the SYN (`TCP_FASTOPEN_CONNECT`), before
/// `connect`. With a cookie cached for the server, `connect` then returns at once and the
/// SYN leaves with the first write; without one it connects as usual and asks for a cookie.
/// Fails (and is ignored) where the kernel's client side is off.
pub(crate) fn allow_fast_open_connect(sock: BorrowedFd<'_>) -> std::io::Result<()> {
    set_int(sock, libc::IPPROTO_TCP, libc::TCP_FASTOPEN_CONNECT, 1)
}

/// Lets a listener accept data in SYNs (`TCP_FASTOPEN`, queue [`FAST_OPEN_QUEUE`]). The
/// kernel honours it only with `net.ipv4.tcp_fastopen` bit 2 set.
pub(crate) fn allow_fast_open_listen(sock: BorrowedFd<'_>) -> std::io::Result<()> {
    set_int(sock, libc::IPPROTO_TCP, libc::TCP_FASTOPEN, FAST_OPEN_QUEUE)
}

/// Whether a client connection is still waiting for its SYN to be answered (`TCP_SYN_SENT`):
/// with Fast Open, `connect` returns before that, so a server that never answers is noticed
/// later, and this tells an unreachable server from a slow handshake.
pub(crate) fn still_opening(sock: BorrowedFd<'_>) -> bool {
    // linux/tcp_states.h: TCP_SYN_SENT = 2.
    raw_tcp_info(sock).is_some_and(|(info, _)| info.tcpi_state == 2)
}

/// `TCPI_OPT_SYN_DATA` (linux/tcp.h): the connection's SYN carried data the peer accepted.
const TCPI_OPT_SYN_DATA: u8 = 32;

/// An override that does not parse as a byte count is ignored, not fatal: it is a tuning
/// knob, and the default is safe.
fn bytes_from(var: Option<&str>, default: u32) -> u32 {
    var.and_then(|v| v.trim().parse().ok()).unwrap_or(default)
}

/// Options every ferry connection gets. Keepalive stops firewalls from silently dropping a
/// control connection that is idle while the data connections work; the unsent-data limit is
/// explained at [`NOTSENT_LOWAT`].
pub(crate) fn tune(stream: &TcpStream) {
    let _ = stream.set_nodelay(true);
    let sock = SockRef::from(stream);
    let ka = TcpKeepalive::new()
        .with_time(Duration::from_secs(30))
        .with_interval(Duration::from_secs(10));
    let _ = sock.set_tcp_keepalive(&ka);
    limit_unsent(&sock, notsent_lowat());
}

/// Gives a data connection its larger start (see [`RCVBUF_START`]): the client's before it
/// dials (its SYN then offers the larger first window, which a get's first flights need), the
/// server's once the connection's `Hello` has proved that it belongs to a session, so that a
/// connection nobody has authenticated keeps the listener's smaller start.
pub(crate) fn open_receive_window(sock: BorrowedFd<'_>) {
    let _ = start_receive_window(sock, rcvbuf_start());
}

/// [`open_receive_window`] for a client's data socket before it dials (see
/// [`start_unconnected_window`]).
pub(crate) fn open_dial_window(sock: BorrowedFd<'_>) {
    let _ = start_unconnected_window(sock, rcvbuf_start());
}

fn limit_unsent(sock: &SockRef<'_>, lowat: u32) {
    if lowat > 0 {
        let _ = sock.set_tcp_notsent_lowat(lowat);
    }
}

/// Grows the socket's receive buffer to hold a window of `bytes` without locking it, so that
/// autotuning goes on (see [`RCVBUF_START`]). Linux has one unlocked way to do that: raising
/// SO_RCVLOWAT makes the kernel grow the buffer to fit the low-water mark (`tcp_set_rcvlowat`;
/// the mark is capped at half of `tcp_rmem`'s max). The mark goes straight back to 1 byte, so
/// reads and readiness are as before. A buffer fixed with `--tcp-window` (locked) stays as it
/// was.
fn start_receive_window(sock: BorrowedFd<'_>, bytes: u32) -> std::io::Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    let mark = i32::try_from(bytes).unwrap_or(i32::MAX);
    set_rcvlowat(sock, mark)?;
    set_rcvlowat(sock, 1)
}

fn set_rcvlowat(sock: BorrowedFd<'_>, bytes: i32) -> std::io::Result<()> {
    set_int(sock, libc::SOL_SOCKET, libc::SO_RCVLOWAT, bytes)
}

fn set_int(sock: BorrowedFd<'_>, level: i32, name: i32, value: i32) -> std::io::Result<()> {
    // SAFETY: setsockopt on a socket this process holds open, with a valid int and its size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&value as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
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
    /// Payload bytes the peer acknowledged (`tcpi_bytes_acked`); the stream tuner counts
    /// [`TcpInfo::delivered`].
    pub bytes_acked: u64,
    /// Payload bytes received (`tcpi_bytes_received`).
    pub bytes_received: u64,
    /// Segments the peer holds beyond a hole in the sequence (`tcpi_sacked`): delivered, but
    /// not yet in `bytes_acked`.
    pub sacked: u32,
    /// Segments sent and not yet acknowledged (`tcpi_unacked`), and bytes written to the
    /// socket and not yet sent (`tcpi_notsent_bytes`, 0 before Linux 4.6): together, what the
    /// kernel still holds of the connection (the endgame's measure of a connection's backlog).
    pub unacked: u32,
    pub notsent_bytes: u32,
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
    /// The connection opened with TCP Fast Open: its SYN carried data (the client's TLS
    /// hello) and the peer accepted it, saving a round trip (`TCPI_OPT_SYN_DATA`).
    pub fast_open: bool,
}

impl TcpInfo {
    /// Bytes the kernel still holds of the connection: not yet sent, or sent and not yet
    /// acknowledged (whole segments, so a little more than the truth).
    pub fn unacked_bytes(&self) -> u64 {
        u64::from(self.notsent_bytes)
            .saturating_add(u64::from(self.unacked).saturating_mul(u64::from(self.snd_mss)))
    }

    /// What the connection can send now, bytes per second: its pacing rate, or its window per
    /// round trip when that is lower (a BBR flow in ProbeRTT keeps its pacing rate but a
    /// window of four segments). 0 when unknown.
    pub fn send_rate(&self) -> u64 {
        let pacing = self.pacing_rate_bps / 8;
        let window = u64::from(self.snd_cwnd).saturating_mul(u64::from(self.snd_mss));
        match (self.rtt_us, pacing) {
            (0, p) => p,
            (rtt, 0) => window.saturating_mul(1_000_000) / u64::from(rtt),
            (rtt, p) => p.min(window.saturating_mul(1_000_000) / u64::from(rtt)),
        }
    }

    /// Payload bytes that reached the peer: acknowledged, or selectively acknowledged beyond
    /// a hole (one full segment each). What the stream tuner counts. `bytes_acked` alone
    /// stalls while a loss is repaired and then jumps by everything delivered meanwhile: with
    /// 8 streams at 50 ms under the default regime (losses at the bottleneck) its rate over
    /// 0.5 s varied by 12–15% (coefficient of variation) against 1–3% for this sum, which made
    /// the tuner's measurements noise (BENCHMARKS.md, "Auto-tuning against fixed settings").
    /// Not strictly monotonic (a SACKed segment shorter than the MSS counts in full until it
    /// is acknowledged): the tuner restarts an interval on a decrease.
    pub fn delivered(&self) -> u64 {
        self.bytes_acked
            .saturating_add(u64::from(self.sacked).saturating_mul(u64::from(self.snd_mss)))
    }
}

/// Whether the peer has closed or reset the connection, even with unread data still queued
/// (which a peek would return instead of the end): its state has left `ESTABLISHED` for
/// `CLOSE_WAIT` (a FIN came) or `CLOSE` (a reset).
pub(crate) fn peer_closed(stream: &TcpStream) -> bool {
    // linux/tcp_states.h: TCP_CLOSE = 7, TCP_CLOSE_WAIT = 8.
    raw_tcp_info(stream.as_fd()).is_some_and(|(info, _)| matches!(info.tcpi_state, 7 | 8))
}

/// The kernel's `TCP_INFO` for a socket, and how many bytes of it the kernel filled.
fn raw_tcp_info(sock: BorrowedFd<'_>) -> Option<(libc::tcp_info, usize)> {
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` is a properly sized, writable tcp_info and `len` holds its size; the kernel
    // writes at most `len` bytes and updates `len`.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some((info, len as usize))
}

pub(crate) fn tcp_info(stream: &TcpStream) -> Option<TcpInfo> {
    tcp_info_fd(stream.as_fd())
}

/// `TCP_INFO` of any TCP socket (the engine keeps duplicated descriptors of its data sockets, so
/// it can sample them while the stream tasks own the connections).
pub(crate) fn tcp_info_fd(sock: BorrowedFd<'_>) -> Option<TcpInfo> {
    let (info, len) = raw_tcp_info(sock)?;
    let sock = SockRef::from(&sock);
    // Kernels before 4.1 fill less of the struct: the byte counters are then unknown (0).
    let has_bytes = len
        >= std::mem::offset_of!(libc::tcp_info, tcpi_bytes_received) + std::mem::size_of::<u64>();
    let has_chrono = len
        >= std::mem::offset_of!(libc::tcp_info, tcpi_sndbuf_limited) + std::mem::size_of::<u64>();
    let chrono = |v: u64| if has_chrono { v } else { 0 };
    let has_notsent = len
        >= std::mem::offset_of!(libc::tcp_info, tcpi_notsent_bytes) + std::mem::size_of::<u32>();
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
        // Without the byte counters a count of segments alone is no running total.
        sacked: if has_bytes { info.tcpi_sacked } else { 0 },
        unacked: info.tcpi_unacked,
        notsent_bytes: if has_notsent {
            info.tcpi_notsent_bytes
        } else {
            0
        },
        busy_us: chrono(info.tcpi_busy_time),
        rwnd_limited_us: chrono(info.tcpi_rwnd_limited),
        sndbuf_limited_us: chrono(info.tcpi_sndbuf_limited),
        sndbuf: sock.send_buffer_size().unwrap_or(0),
        rcvbuf: sock.recv_buffer_size().unwrap_or(0),
        fast_open: info.tcpi_options & TCPI_OPT_SYN_DATA != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_closed_peer_is_seen_behind_unread_data() {
        use tokio::io::AsyncWriteExt;
        let (mut client, server) = connected_pair().await;
        client.write_all(b"unread").await.unwrap();
        assert!(!peer_closed(&server));
        drop(client);
        // The FIN arrives at once on loopback; bounded in case it does not.
        let mut closed = false;
        for _ in 0..100 {
            closed = peer_closed(&server);
            if closed {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            closed,
            "the peer's close was not seen behind 6 unread bytes"
        );
    }

    /// Both ends of one loopback connection: (client, server).
    async fn connected_pair() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    #[test]
    fn override_parses_bytes_and_falls_back_on_nonsense() {
        assert_eq!(bytes_from(None, NOTSENT_LOWAT), NOTSENT_LOWAT);
        assert_eq!(bytes_from(Some(" 262144 "), NOTSENT_LOWAT), 262_144);
        assert_eq!(bytes_from(Some("0"), RCVBUF_START), 0);
        assert_eq!(bytes_from(Some("1M"), NOTSENT_LOWAT), NOTSENT_LOWAT);
        assert_eq!(bytes_from(Some("-5"), RCVBUF_START), RCVBUF_START);
    }

    #[test]
    fn fast_open_is_on_unless_switched_off() {
        assert!(fast_open_from(None));
        assert!(fast_open_from(Some("1")));
        assert!(!fast_open_from(Some("0")));
        assert!(!fast_open_from(Some(" 0\n")));
    }

    /// A listener given Fast Open holds its queue length, capped by the kernel at
    /// `net.core.somaxconn`, whatever the host allows (the kernel checks
    /// `net.ipv4.tcp_fastopen` when a SYN arrives); a client socket takes
    /// `TCP_FASTOPEN_CONNECT` where the host's client side is on (Linux's default).
    #[test]
    fn fast_open_options_reach_the_sockets() {
        let listener = tokio::net::TcpSocket::new_v4().unwrap();
        allow_fast_open_listen(listener.as_fd()).unwrap();
        let sock = SockRef::from(&listener);
        let somaxconn = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
            .unwrap_or(i32::MAX);
        assert_eq!(
            get_int(&sock, libc::IPPROTO_TCP, libc::TCP_FASTOPEN),
            FAST_OPEN_QUEUE.min(somaxconn)
        );
        let client = tokio::net::TcpSocket::new_v4().unwrap();
        let client_side = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_fastopen")
            .map(|t| t.trim().parse::<u32>());
        match (allow_fast_open_connect(client.as_fd()), client_side) {
            (Ok(()), _) => assert_eq!(
                get_int(
                    &SockRef::from(&client),
                    libc::IPPROTO_TCP,
                    libc::TCP_FASTOPEN_CONNECT
                ),
                1
            ),
            (Err(e), Ok(Ok(v))) => assert_eq!(v & 1, 0, "refused with the client side on: {e}"),
            (Err(e), _) => eprintln!("TCP_FASTOPEN_CONNECT refused: {e}"),
        }
    }

    #[test]
    fn delivered_counts_segments_held_beyond_a_hole() {
        let mut i = TcpInfo {
            bytes_acked: 1_000_000,
            snd_mss: 8948,
            ..TcpInfo::default()
        };
        assert_eq!(i.delivered(), 1_000_000);
        // A loss: the cumulative ACK stalls while later segments arrive and are SACKed.
        i.sacked = 10;
        assert_eq!(i.delivered(), 1_089_480);
        // Nonsense from a peer or kernel cannot overflow it.
        i.bytes_acked = u64::MAX;
        assert_eq!(i.delivered(), u64::MAX);
    }

    #[tokio::test]
    async fn every_connection_limits_its_unsent_bytes() {
        let (client, server) = connected_pair().await;
        let sock = SockRef::from(&client);
        let before = sock.tcp_notsent_lowat().unwrap();
        limit_unsent(&sock, NOTSENT_LOWAT);
        assert_eq!(sock.tcp_notsent_lowat().unwrap(), NOTSENT_LOWAT);
        // 0 means "leave the kernel's default".
        let other = SockRef::from(&server);
        let default = other.tcp_notsent_lowat().unwrap();
        limit_unsent(&other, 0);
        assert_eq!(other.tcp_notsent_lowat().unwrap(), default);
        assert_ne!(
            before, NOTSENT_LOWAT,
            "the kernel default is not already 1 MiB"
        );
    }

    fn get_int(sock: &SockRef<'_>, level: i32, name: i32) -> i32 {
        let mut v: i32 = -1;
        let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
        // SAFETY: getsockopt into a local int of the size given.
        let rc = unsafe {
            libc::getsockopt(
                sock.as_raw_fd(),
                level,
                name,
                (&mut v as *mut i32).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0);
        v
    }

    fn rcvlowat(sock: &SockRef<'_>) -> i32 {
        get_int(sock, libc::SOL_SOCKET, libc::SO_RCVLOWAT)
    }

    #[tokio::test]
    async fn the_receive_buffer_starts_larger_and_reads_wake_as_before() {
        let (client, server) = connected_pair().await;
        let sock = SockRef::from(&server);
        let before = sock.recv_buffer_size().unwrap();
        start_receive_window(server.as_fd(), RCVBUF_START).unwrap();
        let after = sock.recv_buffer_size().unwrap();
        // How far it grows depends on the host's `tcp_rmem` max (the mark is capped at half
        // of it), so only that it grew is certain.
        assert!(after > before, "receive buffer {before} -> {after}");
        // The low-water mark is back at one byte: a small frame still wakes the reader.
        assert_eq!(rcvlowat(&sock), 1);
        // 0 leaves the kernel's start alone.
        let other = SockRef::from(&client);
        let kernel = other.recv_buffer_size().unwrap();
        start_receive_window(client.as_fd(), 0).unwrap();
        assert_eq!(other.recv_buffer_size().unwrap(), kernel);
    }

    /// The window clamp a socket not yet connected will size its SYN's window scale by (0:
    /// by `tcp_rmem`'s max).
    fn window_clamp(sock: &SockRef<'_>) -> i32 {
        get_int(sock, libc::IPPROTO_TCP, libc::TCP_WINDOW_CLAMP)
    }

    /// The window scales of a connection (both 4-bit fields, in the ABI's order): the largest
    /// window it may ever advertise is 64 KiB shifted by its own.
    fn wscales(fd: BorrowedFd<'_>) -> u8 {
        let (info, _) = raw_tcp_info(fd).unwrap();
        info.tcpi_snd_rcv_wscale
    }

    /// Whether this host's `tcp_rmem` leaves a start of `bytes` room to grow a new socket's
    /// buffer: its default is below the buffer the window needs, and its max allows the mark.
    fn rmem_lets_grow(bytes: u32) -> bool {
        let v: Vec<u64> = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_rmem")
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        let b = u64::from(bytes);
        matches!(v.as_slice(), [_, def, max] if *def < 2 * b && max / 2 >= b)
    }

    /// A connection accepted by a listener whose socket had `start` applied before `listen`:
    /// its receive buffer and window scales.
    async fn accepted_window(start: u32) -> (usize, u8) {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        start_unconnected_window(socket.as_fd(), start).unwrap();
        assert_eq!(window_clamp(&SockRef::from(&socket)), 0);
        let listener = socket.listen(8).unwrap();
        assert_eq!(rcvlowat(&SockRef::from(&listener)), 1);
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (server, _) = accepted.unwrap();
        drop(client);
        let sock = SockRef::from(&server);
        (sock.recv_buffer_size().unwrap(), wscales(server.as_fd()))
    }

    #[tokio::test]
    async fn accepted_connections_inherit_the_listeners_first_window() {
        let (kernel, kernel_scales) = accepted_window(0).await;
        let (started, scales) = accepted_window(LISTEN_RCVBUF_START).await;
        assert!(
            started >= kernel,
            "accepted receive buffer {kernel} -> {started}"
        );
        if rmem_lets_grow(LISTEN_RCVBUF_START) {
            assert!(
                started > kernel && started >= LISTEN_RCVBUF_START as usize,
                "accepted receive buffer {kernel} -> {started}"
            );
        }
        // The start does not cap the window scale: the connection may still grow its window
        // as far as without it (a scale sized by a 256 KiB clamp would be 3: 512 KiB at most).
        assert_eq!(scales, kernel_scales);
    }

    #[tokio::test]
    async fn a_socket_gets_its_window_before_it_dials() {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        let before = socket.recv_buffer_size().unwrap();
        start_unconnected_window(socket.as_fd(), RCVBUF_START).unwrap();
        let after = socket.recv_buffer_size().unwrap();
        assert!(after >= before, "receive buffer {before} -> {after}");
        if rmem_lets_grow(RCVBUF_START) {
            assert!(after > before, "receive buffer {before} -> {after}");
        }
        assert_eq!(window_clamp(&SockRef::from(&socket)), 0);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(socket.connect(addr), listener.accept());
        let (client, _server) = (client.unwrap(), accepted.unwrap());
        let sock = SockRef::from(&client);
        assert!(sock.recv_buffer_size().unwrap() >= after as usize);
        assert_eq!(rcvlowat(&sock), 1);
        let (plain, _) = connected_pair().await;
        assert_eq!(wscales(client.as_fd()), wscales(plain.as_fd()));
    }

    #[tokio::test]
    async fn a_window_fixed_by_the_user_stays_fixed() {
        let (_client, server) = connected_pair().await;
        set_window(&server, 256 << 10).unwrap();
        let sock = SockRef::from(&server);
        let fixed = sock.recv_buffer_size().unwrap();
        start_receive_window(server.as_fd(), RCVBUF_START).unwrap();
        assert_eq!(sock.recv_buffer_size().unwrap(), fixed);
        assert_eq!(rcvlowat(&sock), 1);
    }
}
