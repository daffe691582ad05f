//! The client: connects, authenticates, asks for a transfer, opens the data connections and
//! runs the engine for its side.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::filter::Filter;
use ferry_core::recv::{Destination, Links, Modes, Receiver, ReceiverConfig};
use ferry_core::send::{DigestCache, Sender, SenderConfig, Source};
use ferry_core::{digest, FsError, Reporter, Root};
use ferry_proto::{
    Capabilities, ErrorCode, Frame, ListEntry, Load, Role, SessionId, TransferOpts, TuneReport,
    MAX_CONTROL_PAYLOAD, PROTOCOL_VERSION,
};
use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};

use crate::autotune::{bottleneck, cores};

/// The most storage threads a client's own pool may run: what a request may ask of a server.
const CLIENT_MOST: usize = ferry_proto::MAX_STORAGE_THREADS as usize;
use crate::conn::{expect_frame, send};
use crate::engine::{
    drive_receiver, drive_sender, frame_queue, Joined, Joins, Limits, ReceiverIo, RecvRun, SendRun,
    SenderIo, SenderOutcome, StreamPlan, StreamReport, StripeIo, StripeReport, Writers,
};
use crate::error::SessionError;
use crate::stream::{Recorder, Stream};
use crate::tcp::tune;
use crate::timeline::Timeline;
use crate::tls::{ClientTls, Known, ServerTrust};

/// Whether and how the connections of a session are protected.
#[derive(Clone, Debug)]
pub enum Security {
    /// TLS 1.3 on every connection, the server identified as `ServerTrust` says. The default.
    Tls(ServerTrust),
    /// Plain TCP (`--no-encrypt`): only against a server started with `--allow-plaintext`,
    /// and anyone on the path can read and change the data.
    Plaintext,
}

#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// `host:port` of the server.
    pub server: String,
    pub token: String,
    pub opts: TransferOpts,
    /// Reader threads (put) and writer threads (get) this end starts with.
    pub readers: usize,
    pub writers: usize,
    /// Tune this end's storage threads during the transfer (`--readers`/`--writers` not given).
    pub tune_storage: bool,
    /// Where the storage thread counts came from: `default`, `disk profile` or `fixed`.
    pub storage_from: &'static str,
    /// Where `opts.block_size` came from: `default`, `disk profile` or `fixed`.
    pub block_from: &'static str,
    pub connect_timeout: Duration,
    pub idle_timeout: Duration,
    /// Test-only fault hook, see `SenderConfig::corrupt_blocks`.
    pub corrupt_blocks: Vec<u64>,
    /// How long to keep retrying (with backoff) after failures that a retry can fix.
    pub retry_for: Duration,
    pub security: Security,
    /// Where `opts.auto_start` came from, for the report.
    pub start_from: StartFrom,
    /// Test hook: with `opts.auto_start > 0`, the sending side holds this many streams from
    /// the start instead of tuning (only when the client sends, i.e. for put).
    pub force_streams: Option<u32>,
    /// Test hook: data connection `i` of a put never writes its first block, as if its window
    /// had closed for good (only the endgame then finishes the transfer).
    pub stall_stream: Option<usize>,
    /// The process ends with this transfer (the CLI's put): once the last block is queued, the
    /// sending side gives its idle memory back while the last bytes cross, instead of inside
    /// its exit (`ferry_core::buf::drain`). Not for a process that goes on, or that hosts a
    /// server: it stops the block-buffer pool for the whole process.
    pub drain_at_end: bool,
    /// Ramp helpers opened beyond the tuned connections (already counted in `opts.streams`, so
    /// from index [`ferry_proto::RAMP_HELPERS_FROM`] on): each carries two blocks at the start,
    /// then parks ([`crate::ramp_helpers`]); on a get the server does that, told by
    /// `Capabilities::RAMP_HELPERS`. 0 with fixed streams.
    pub helpers: u16,
    /// Which permission bits a get stores (setuid, setgid and world-write cleared by default).
    pub modes: Modes,
    /// Which symlinks a get makes (`--safe-links`: none that leave the tree).
    pub links: Links,
    /// Dial the data connections over the server's several network paths (`--multipath`):
    /// ask for its `Paths` and spread the connections over them, connection `i` to path
    /// `i mod paths`. One round trip slower to start: the connections wait for the paths.
    pub multipath: bool,
    /// Local addresses the data connections leave from (`--bind`), connection `i` from
    /// `bind[i mod len]`: one per network card. Empty: the kernel chooses.
    pub bind: Vec<std::net::IpAddr>,
    /// A striped put's or get's other hosts (`--stripe`, or an endpoint's `hosts`): servers
    /// that share the remote file system with `server`, which coordinates. In a put each
    /// writes blocks of the large files into the partial copies `server` opened; in a get each
    /// reads blocks of the large files `server` offers. Empty: no striping.
    pub stripe: Vec<StripeHost>,
}

/// One other host of a striped put: its address and how its key is trusted.
#[derive(Clone, Debug)]
pub struct StripeHost {
    pub server: String,
    pub security: Security,
    /// What the host is logged in to with: the stripe grant it minted, in a striped copy's
    /// put from its source; `None`: the put's own token.
    pub token: Option<String>,
}

/// Where an auto-tuned transfer's first stream count came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StartFrom {
    /// The built-in default.
    #[default]
    Default,
    /// What the tuner held at the end of an earlier transfer to the same server; `settled`:
    /// its search had ended, so a put holds the count from the start instead of searching
    /// again (a get's sender is the server, which is not told, and searches).
    Profile { settled: bool },
    /// The best stream count `ferry probe net` measured to this server.
    Probe,
}

/// How the stream count was chosen and what limited the transfer: `--json`'s `tuning`.
#[derive(Clone, Debug, Serialize)]
pub struct Tuning {
    /// `auto` or `fixed`.
    pub mode: &'static str,
    /// Streams carrying data at the end: the setting the tuner holds (fixed: all of them).
    pub streams: u32,
    /// Data connections opened (with auto, the most the tuner may use, plus ramp helpers).
    pub connections: u32,
    /// Ramp helpers among them: granted connections that carried two blocks at the start and
    /// then parked (`ferry_net::ramp_helpers`; over a remembered long path).
    pub ramp_helpers: u32,
    /// Streams carrying data at the start.
    pub start: u32,
    /// `profile`, `probe`, `default`, `test`, or `fixed`.
    pub start_from: &'static str,
    /// The tuner finished a search (short transfers end before it does).
    pub settled: bool,
    /// A tree of small files (below one block on average): not remembered as the route's
    /// profile, its runs being too short to measure the path.
    pub small_files: bool,
    /// The tuner's measurements, oldest first.
    pub steps: Vec<TuningStep>,
    /// `network`, `source storage`, `destination storage` or `cpu`: see `load`.
    pub bottleneck: &'static str,
    pub load: Loads,
    /// The sender's reader threads and the receiver's writer threads, each tuned by its end.
    pub readers: Pool,
    pub writers: Pool,
}

/// A pool of storage threads as `--json` reports it. This client knows its own pool in full;
/// of the server's it knows the final count (from that end's load report).
#[derive(Clone, Debug, Serialize)]
pub struct Pool {
    /// `client` or `server`: which end ran it.
    pub side: &'static str,
    /// Threads working at the end (`None`: the server did not say).
    pub threads: Option<u32>,
    /// This client's pool: `auto` or `fixed`; `None` for the server's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start: Option<u32>,
    /// `default`, `disk profile` or `fixed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_from: Option<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<crate::autotune::ThreadStep>,
}

impl Pool {
    fn local(cfg: &ClientConfig, r: crate::autotune::ThreadReport) -> Self {
        Self {
            side: "client",
            threads: Some(r.threads),
            mode: Some(if r.tuned { "auto" } else { "fixed" }),
            start: Some(r.start),
            start_from: Some(cfg.storage_from),
            steps: r.steps,
        }
    }

    fn remote(load: Option<Load>) -> Self {
        Self {
            side: "server",
            threads: load.map(|l| u32::from(l.threads)).filter(|&n| n > 0),
            mode: None,
            start: None,
            start_from: None,
            steps: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct TuningStep {
    pub at_s: f64,
    pub streams: u32,
    pub mbit_per_s: f64,
    /// The measurement's noise, ± percent of its median (half the range of its samples).
    pub noise_pct: f64,
    /// `baseline`, `kept`, `rejected` or `drift`.
    pub verdict: &'static str,
}

/// Both ends' measured load; `None` when that end's report did not arrive.
#[derive(Clone, Debug, Serialize)]
pub struct Loads {
    /// Cores this client may use.
    pub cores: u32,
    /// Whether the server is on this host (loopback), so both ends share the cores.
    pub same_host: bool,
    pub sender: Option<LoadShare>,
    pub receiver: Option<LoadShare>,
}

/// One end's load as fractions 0..=1.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct LoadShare {
    /// CPU time over wall time times usable cores.
    pub cpu: f64,
    /// Share of time its queue towards the network was empty (sender: reading could not keep
    /// up; receiver: the network could not keep up).
    pub queue_empty: f64,
    /// Share of time that queue was full (sender: the network or the receiver pushed back;
    /// receiver: its writers could not keep up).
    pub queue_full: f64,
}

impl From<Load> for LoadShare {
    fn from(l: Load) -> Self {
        let f = |x: u16| f64::from(x.min(1000)) / 1000.0;
        Self {
            cpu: f(l.cpu_permille),
            queue_empty: f(l.starved_permille),
            queue_full: f(l.blocked_permille),
        }
    }
}

impl Tuning {
    fn new(
        cfg: &ClientConfig,
        opts: &TransferOpts,
        connections: usize,
        tuned: Option<&TuneReport>,
        receiver: Option<Load>,
        same_host: bool,
        (readers, writers): (Pool, Pool),
    ) -> Self {
        let connections = connections as u32;
        let mains = u32::from(cfg.opts.streams.saturating_sub(cfg.helpers));
        let ramp_helpers = connections
            .saturating_sub(mains)
            .min(u32::from(cfg.helpers));
        let auto = opts.is_auto();
        let sender = tuned.map(|t| t.sender);
        let streams = match tuned {
            Some(t) => u32::from(t.streams),
            None if auto => u32::from(opts.auto_start).min(connections),
            None => connections,
        };
        let start = tuned.map_or(streams, |t| u32::from(t.start));
        let start_from = if !auto {
            "fixed"
        } else if cfg.force_streams.is_some() {
            "test"
        } else {
            match cfg.start_from {
                StartFrom::Default => "default",
                StartFrom::Profile { .. } => "profile",
                StartFrom::Probe => "probe",
            }
        };
        let steps = tuned
            .map(|t| {
                t.steps
                    .iter()
                    .map(|s| TuningStep {
                        at_s: f64::from(s.at_ms) / 1000.0,
                        streams: u32::from(s.streams),
                        mbit_per_s: (s.rate as f64 * 8.0 / 1e6 * 10.0).round() / 10.0,
                        noise_pct: f64::from(s.noise_permille) / 10.0,
                        verdict: s.verdict.name(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self {
            mode: if auto { "auto" } else { "fixed" },
            streams,
            connections,
            ramp_helpers,
            start,
            start_from,
            settled: tuned.is_some_and(|t| t.has(TuneReport::SETTLED)),
            small_files: tuned.is_some_and(|t| t.has(TuneReport::SMALL_FILES)),
            steps,
            bottleneck: bottleneck(sender, receiver, same_host),
            load: Loads {
                cores: cores(),
                same_host,
                sender: sender.map(LoadShare::from),
                receiver: receiver.map(LoadShare::from),
            },
            readers,
            writers,
        }
    }

    /// Whether this transfer's result is worth remembering for the next one to the same
    /// server: auto-tuned bulk data with at least one measurement.
    pub fn worth_remembering(&self) -> bool {
        self.mode == "auto"
            && !self.steps.is_empty()
            && !self.small_files
            && self.start_from != "test"
    }
}

/// What a finished transfer did, as printed by `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct TransferReport {
    pub direction: &'static str,
    pub files: u64,
    pub bytes: u64,
    pub skipped: u64,
    pub failed: u64,
    pub bad_blocks: u64,
    pub seconds: f64,
    pub mib_per_s: f64,
    pub block_size: u32,
    /// `default`, `disk profile` (the request size `ferry probe disk` found best here) or
    /// `fixed` (`--block-size`).
    pub block_size_from: &'static str,
    pub checksum: &'static str,
    pub streams: Vec<StreamReport>,
    /// How many streams carried data and why, and what limited the transfer.
    pub tuning: Tuning,
    /// Sessions it took: more than 1 when the job resumed after a failure.
    pub attempts: u32,
    /// Whether the connections were TLS, and the server certificate's fingerprint.
    pub encrypted: bool,
    pub server_fingerprint: Option<String>,
    pub errors: Vec<String>,
    /// Payload bytes per interval of the last attempt's data phase (a put counts what the
    /// server's TCP acknowledged, a get what was written here): how soon it reached its rate.
    pub timeline: Timeline,
    /// `(path, hex digest)` of every stored file.
    #[serde(skip)]
    pub manifest: Vec<(String, String)>,
    /// What each other host of a striped put or get did (its last attempt).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stripes: Vec<StripeReport>,
}

impl TransferReport {
    /// Whether everything that was asked for arrived.
    pub fn is_success(&self) -> bool {
        self.failed == 0 && self.errors.is_empty()
    }

    /// The round trip (the data connections' smallest, µs) and the rate (bytes/s) of a
    /// transfer large enough to tell, for the next transfer's ramp helpers. The rate is what
    /// the transfer held in its better intervals (`Timeline::held_rate`), or its average
    /// (payload over wall time) where that is higher or the timeline too short: a 100 MB put
    /// at 100 ms on the bed averages 80 MB/s over a path that carries 118.
    pub fn path_measured(&self) -> Option<(u64, u64)> {
        if self.bytes < PATH_MIN_BYTES || self.seconds <= 0.0 {
            return None;
        }
        let rtt_us = self
            .streams
            .iter()
            .filter_map(|s| s.tcp.as_ref().map(|t| t.min_rtt_us))
            .filter(|&r| r > 0)
            .min()?;
        let average = (self.bytes as f64 / self.seconds) as u64;
        let rate = self.timeline.held_rate().unwrap_or(0).max(average);
        Some((u64::from(rtt_us), rate))
    }
}

/// Bytes below which a transfer says too little about the path's rate to size the next
/// transfer's ramp helpers: most of it would be set-up and slow start.
const PATH_MIN_BYTES: u64 = 64 << 20;

pub(crate) struct Connected {
    pub(crate) control: Stream,
    /// The TLS setup data connections use, pinned to the certificate the control connection
    /// accepted; `None` for plain TCP.
    pub(crate) tls: Option<Arc<ClientTls>>,
    addr: SocketAddr,
    session: SessionId,
    secret: [u8; 32],
    /// The capabilities the server's `Welcome` set.
    pub(crate) caps: Capabilities,
}

/// The first address of `server` (`host:port`). A name that does not resolve is a
/// [`SessionError::Resolve`], which is not retried.
async fn resolve(server: &str) -> Result<SocketAddr, SessionError> {
    let unresolved = |cause: String| SessionError::Resolve {
        server: server.to_owned(),
        cause,
    };
    tokio::net::lookup_host(server)
        .await
        .map_err(|e| unresolved(e.to_string()))?
        .next()
        .ok_or_else(|| unresolved("no address found".into()))
}

/// A failure to reach `addr`, named with the address and port tried.
fn unreached(addr: SocketAddr, cause: std::io::Error) -> SessionError {
    SessionError::Connect {
        addr: addr.to_string(),
        cause,
    }
}

/// No answer from `addr` within `timeout`.
fn no_answer(addr: SocketAddr, timeout: Duration, what: &str) -> SessionError {
    let cause = std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("{what} within {} s", timeout.as_secs_f64()),
    );
    unreached(addr, cause)
}

/// `data`: a data connection, whose receive window starts larger (`tcp::open_receive_window`).
/// `fast_open`: the connection's first write may ride in its SYN (`tcp::fast_open`); only for
/// TLS, whose first write goes through [`Recorder`], which waits out the one case where such
/// a write reports the connection still in progress.
async fn dial(
    addr: SocketAddr,
    window: u32,
    timeout: Duration,
    data: bool,
    fast_open: bool,
) -> Result<TcpStream, SessionError> {
    dial_from(addr, None, window, timeout, (data, fast_open)).await
}

/// [`dial`] from the local address `local`, where given (`--bind`).
async fn dial_from(
    addr: SocketAddr,
    local: Option<std::net::IpAddr>,
    window: u32,
    timeout: Duration,
    (data, fast_open): (bool, bool),
) -> Result<TcpStream, SessionError> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(|e| unreached(addr, e))?;
    if let Some(ip) = local {
        socket.bind(SocketAddr::new(ip, 0)).map_err(|e| {
            unreached(
                addr,
                std::io::Error::new(e.kind(), format!("binding to {ip}: {e}")),
            )
        })?;
    }
    if window > 0 {
        // Before connect, so the window scale offered in the SYN matches.
        socket.set_send_buffer_size(window)?;
        socket.set_recv_buffer_size(window)?;
    }
    if data {
        // Before connect too: the SYN's window is the first one the server may fill.
        crate::tcp::open_dial_window(std::os::fd::AsFd::as_fd(&socket));
    }
    if fast_open && crate::tcp::fast_open() {
        // Refused where the kernel's client side is off: the connection opens as usual.
        let _ = crate::tcp::allow_fast_open_connect(std::os::fd::AsFd::as_fd(&socket));
    }
    let stream = tokio::time::timeout(timeout, socket.connect(addr))
        .await
        .map_err(|_| no_answer(addr, timeout, "no answer"))?
        .map_err(|e| unreached(addr, e))?;
    tune(&stream);
    Ok(stream)
}

/// Starts TLS on a fresh connection, telling a changed server key apart from other failures.
async fn secure(
    tcp: TcpStream,
    addr: SocketAddr,
    tls: &ClientTls,
    timeout: Duration,
    on_change: impl FnOnce(String, String) -> SessionError,
) -> Result<Stream, SessionError> {
    // A Fast Open connection "connects" at once and sends its SYN with the ClientHello, so a
    // server that does not answer shows up here: keep a handle to tell the user which it was.
    let socket = std::os::fd::AsFd::as_fd(&tcp).try_clone_to_owned().ok();
    let handshake = tls
        .connector()
        .connect(ClientTls::server_name(), Recorder::new(tcp))
        .into_fallible();
    match tokio::time::timeout(timeout, handshake).await {
        Ok(Ok(s)) => Ok(Stream::Tls(Box::new(tokio_rustls::TlsStream::Client(s)))),
        Ok(Err((e, io))) => {
            // A refusal in plain TCP (busy, or a server without TLS): say what it said.
            if let Some(ferry_proto::Frame::Error { code, message }) =
                Recorder::plain_error(io.first_bytes())
            {
                return Err(SessionError::Remote { code, message });
            }
            if let (Some(pin), Some(seen)) = (tls.pin(), tls.seen()) {
                if pin != seen {
                    return Err(on_change(pin.to_string(), seen.to_string()));
                }
            }
            // rustls reports what it refused as InvalidData; anything else is the network.
            if e.kind() == std::io::ErrorKind::InvalidData {
                Err(SessionError::Tls(format!(
                    "handshake failed: {e} (is this a ferry server? one that only allows plain \
                     TCP needs --no-encrypt)"
                )))
            } else {
                Err(unreached(addr, e))
            }
        }
        Err(_)
            if socket.is_some_and(|s| crate::tcp::still_opening(std::os::fd::AsFd::as_fd(&s))) =>
        {
            Err(no_answer(addr, timeout, "no answer"))
        }
        Err(_) => Err(no_answer(addr, timeout, "no TLS handshake")),
    }
}

fn hello_frame(role: Role) -> Frame {
    hello_with(role, 0)
}

/// A `Hello` that offers `extra` capability bits beside the usual ones.
fn hello_with(role: Role, extra: u64) -> Frame {
    Frame::Hello {
        version: PROTOCOL_VERSION,
        capabilities: Capabilities(Capabilities::ours().0 | extra),
        role,
    }
}

/// What a session's control `Hello` offers beyond the usual: a striped put asks its
/// coordinator to share every partial copy (`STRIPE_WHOLE`), so that stripe hosts take small
/// files and last blocks too; a striped get asks it to send a file's digest apart
/// (`STRIPE_DIGEST`), so that stripe hosts bring one-block files. Each server keeps the bit
/// its request uses.
fn control_extra(cfg: &ClientConfig) -> u64 {
    match cfg.stripe.is_empty() {
        true => 0,
        false => Capabilities::STRIPE_WHOLE | Capabilities::STRIPE_DIGEST,
    }
}

async fn read_welcome<R: tokio::io::AsyncRead + Unpin>(
    stream: &mut R,
    timeout: Duration,
) -> Result<(SessionId, [u8; 32]), SessionError> {
    welcome_of(read_frame_within(stream, timeout).await?)
}

/// The server's next control frame (its `Welcome`), within `timeout`.
async fn read_frame_within<R: tokio::io::AsyncRead + Unpin>(
    stream: &mut R,
    timeout: Duration,
) -> Result<Frame, SessionError> {
    tokio::time::timeout(
        timeout,
        expect_frame(stream, MAX_CONTROL_PAYLOAD, "control"),
    )
    .await
    .map_err(|_| SessionError::Timeout("waiting for the server's welcome"))?
}

/// The session a `Welcome` names, once its version is one this build speaks.
fn welcome_of(reply: Frame) -> Result<(SessionId, [u8; 32]), SessionError> {
    match reply {
        Frame::Welcome {
            version,
            session,
            secret,
            ..
        } => {
            ferry_proto::negotiate_version(version).map_err(|e| SessionError::Remote {
                code: e.code,
                message: e.reason,
            })?;
            Ok((session, secret))
        }
        other => Err(SessionError::Protocol(format!(
            "expected Welcome, got {:?}",
            other.frame_type()
        ))),
    }
}

/// The control `Welcome`, which must name the session this client chose
/// (`ferry_session::send::check_welcome`, the same check the sender makes of a late one).
async fn welcomed<R: tokio::io::AsyncRead + Unpin>(
    stream: &mut R,
    timeout: Duration,
    ours: (SessionId, [u8; 32]),
) -> Result<Capabilities, SessionError> {
    let reply = read_frame_within(stream, timeout).await?;
    let caps = match &reply {
        Frame::Welcome { capabilities, .. } => *capabilities,
        _ => Capabilities::default(),
    };
    ferry_session::send::check_welcome(reply, ours).map_err(crate::engine::fault_error)?;
    Ok(caps)
}

/// A new session's identity and the secret its data connections join with. The client
/// chooses them, so that its data connections can join (and carry data) before the control
/// connection's `Welcome` is back.
fn new_session() -> (SessionId, [u8; 32]) {
    let mut id = [0u8; 8];
    let mut secret = [0u8; 32];
    getrandom::fill(&mut id).expect("the OS random source works");
    getrandom::fill(&mut secret).expect("the OS random source works");
    (SessionId(u64::from_le_bytes(id)), secret)
}

fn control_role(cfg: &ClientConfig, (session, secret): (SessionId, [u8; 32])) -> Role {
    Role::Control {
        token: cfg.token.clone(),
        session,
        secret,
    }
}

/// The control connection, logged in.
pub(crate) async fn connect(
    cfg: &ClientConfig,
    reporter: &dyn Reporter,
) -> Result<Connected, SessionError> {
    let (mut control, tls, addr) = secure_control(cfg, reporter, |_, _| {}).await?;
    let ours = new_session();
    send(&mut control, &hello_frame(control_role(cfg, ours))).await?;
    let caps = welcomed(&mut control, cfg.connect_timeout, ours).await?;
    Ok(Connected {
        control,
        tls,
        addr,
        session: ours.0,
        secret: ours.1,
        caps,
    })
}

/// The control connection up to the point where it can log in: TCP, then TLS with the
/// server's key checked against (or, on first contact, pinned in) the known hosts.
///
/// `ready_for_data` is called once the data connections could be dialled too: before the
/// control connection's own SYN when the key to hold them to is known in advance (their TLS
/// then waits for the configuration built meanwhile), once the control connection is up when
/// there is no TLS, after the control handshake on first contact.
async fn secure_control(
    cfg: &ClientConfig,
    reporter: &dyn Reporter,
    mut ready_for_data: impl FnMut(SocketAddr, Option<DataTls>),
) -> Result<(Stream, Option<Arc<ClientTls>>, SocketAddr), SessionError> {
    let addr = resolve(&cfg.server).await?;
    let trust = match &cfg.security {
        Security::Plaintext => None,
        Security::Tls(ServerTrust::Pinned(fp)) => Some((Some(*fp), None)),
        Security::Tls(ServerTrust::KnownHosts { file, host }) => match file.lookup(host)? {
            Known::Pinned { fingerprint, line } => {
                Some((Some(fingerprint), Some((file, host, line))))
            }
            Known::Unknown => Some((None, Some((file, host, 0)))),
        },
    };
    let Some((pin, known)) = trust else {
        let tcp = dial(addr, 0, cfg.connect_timeout, false, false).await?;
        // After the control connection is up, so the server sees it first.
        ready_for_data(addr, None);
        return Ok((Stream::Plain(tcp), None, addr));
    };
    // Building the TLS configuration takes tens of milliseconds of CPU on first use: let it
    // run while the SYNs are out. With the key known, the data connections go out with the
    // control connection, so that they are through TLS when it is, and carry data right
    // behind its request (DESIGN.md, "Starting a session in few round trips").
    let (built_tx, built_rx) = tokio::sync::watch::channel(None);
    if pin.is_some() {
        ready_for_data(addr, Some(DataTls::Soon(built_rx)));
    }
    let (tcp, tls) = tokio::join!(dial(addr, 0, cfg.connect_timeout, false, true), async {
        ClientTls::new(pin).map(Arc::new)
    });
    let (tcp, tls) = (tcp?, tls?);
    if pin.is_some() {
        let _ = built_tx.send(Some(tls.clone()));
    }
    let control = secure(
        tcp,
        addr,
        &tls,
        cfg.connect_timeout,
        |expected, presented| {
            let fix = match known {
                Some((file, _, line)) => format!(
                    "remove line {line} of {} (or pass --server-fingerprint {presented})",
                    file.path().display()
                ),
                None => format!("pass --server-fingerprint {presented}"),
            };
            SessionError::ServerKeyChanged {
                host: cfg.server.clone(),
                expected,
                presented,
                fix,
            }
        },
    )
    .await?;
    let seen = tls
        .seen()
        .ok_or_else(|| SessionError::Tls("no server certificate".into()))?;
    let tls = match pin {
        Some(_) => tls,
        None => {
            // First contact: remember the key, and hold the data connections of this
            // session to it too.
            if let Some((file, host, _)) = known {
                file.add(host, seen)?;
                reporter.on_warning(&format!(
                    "first connection to {host}: pinned its key {seen} in {}",
                    file.path().display()
                ));
            }
            let tls = Arc::new(ClientTls::new(Some(seen))?);
            ready_for_data(addr, Some(DataTls::Now(tls.clone())));
            tls
        }
    };
    Ok((control, Some(tls), addr))
}

/// Sends the request and, once the server is ready, opens the data connections.
pub(crate) async fn start(
    cfg: &ClientConfig,
    c: &mut Connected,
    request: Frame,
) -> Result<(TransferOpts, Vec<Stream>), SessionError> {
    send(&mut c.control, &request).await?;
    let opts = ready(cfg, &mut c.control).await?;
    let mut dials = tokio::task::JoinSet::new();
    for index in 0..opts.streams {
        let tls = c.tls.clone().map(DataTls::Now);
        let dial = DataDial::new(cfg, c.addr, tls, (c.session, c.secret), index);
        dials.spawn(dial.run());
    }
    let data = Joining::new(cfg, &opts, dials).finish().await?;
    Ok((opts, data))
}

/// A session under way: the control connection has carried its `Hello` and the request,
/// the data connections are dialling, each sending its `Hello` once its TLS is up.
pub(crate) struct Opening {
    control: Stream,
    tls: Option<Arc<ClientTls>>,
    addr: SocketAddr,
    session: (SessionId, [u8; 32]),
    dials: Dials,
}

type Dials = tokio::task::JoinSet<Result<(u16, Stream), SessionError>>;

/// Logs in and starts a transfer with as few round trips as the protocol allows: the data
/// connections go through TCP and TLS alongside the control connection (after it, on first
/// contact with a server) and send their `Hello` at once, since the client chose the session's
/// identity and secret; the request follows the control `Hello` without waiting for the
/// `Welcome` (the server reads them in order). DESIGN.md, "Starting a session in few round
/// trips".
async fn open(
    cfg: &ClientConfig,
    reporter: &dyn Reporter,
    request: &Frame,
) -> Result<Opening, SessionError> {
    let session = new_session();
    // As many as asked for; the server may grant fewer, and refuses the rest on their own
    // (`not_granted`). A JoinSet aborts them all if the login fails.
    let mut dials = tokio::task::JoinSet::new();
    let (mut control, tls, addr) = secure_control(cfg, reporter, |addr, tls| {
        for index in 0..cfg.opts.streams.max(1) {
            dials.spawn(DataDial::new(cfg, addr, tls.clone(), session, index).run());
        }
    })
    .await?;
    let mut scratch = bytes::BytesMut::new();
    let hello = hello_with(control_role(cfg, session), control_extra(cfg));
    crate::conn::write_frame(&mut control, &hello, &mut scratch).await?;
    crate::conn::write_frame(&mut control, request, &mut scratch).await?;
    control.flush().await?;
    Ok(Opening {
        control,
        tls,
        addr,
        session,
        dials,
    })
}

/// The server's answer to an opening (`Welcome`, then `Ready`): a get's client, whose
/// receiver then runs while its data connections join. (A put's sender reads the answer on
/// the way instead, `drive_sender`'s `awaiting`.)
async fn answered(
    cfg: &ClientConfig,
    o: Opening,
) -> Result<(Connected, TransferOpts, Joining), SessionError> {
    let Opening {
        mut control,
        tls,
        addr,
        session,
        dials,
    } = o;
    let caps = welcomed(&mut control, cfg.connect_timeout, session).await?;
    let opts = ready(cfg, &mut control).await?;
    let c = Connected {
        control,
        tls,
        addr,
        session: session.0,
        secret: session.1,
        caps,
    };
    let joining = Joining::new(cfg, &opts, dials);
    Ok((c, opts, joining))
}

/// A multipath session's opening: log in asking for the server's `Paths`, send the request,
/// and once the server is ready dial connection `i` to path `i mod paths` (from local address
/// `i mod bind`). One round trip slower than [`open`]: no connection can leave before the
/// paths are known. Returns what [`answered`] does, the number of paths, and whether the
/// server shares a striped put's partial copies (`STRIPE_WHOLE` in its `Welcome`).
async fn open_paths(
    cfg: &ClientConfig,
    reporter: &dyn Reporter,
    request: &Frame,
) -> Result<(Connected, TransferOpts, Joining, u16, bool), SessionError> {
    let session = new_session();
    let (mut control, tls, addr) = secure_control(cfg, reporter, |_, _| {}).await?;
    let extra = Capabilities::MULTIPATH | control_extra(cfg);
    send(&mut control, &hello_with(control_role(cfg, session), extra)).await?;
    let reply = read_frame_within(&mut control, cfg.connect_timeout).await?;
    let offers = matches!(&reply, Frame::Welcome { capabilities, .. }
        if capabilities.has(Capabilities::MULTIPATH));
    let whole = matches!(&reply, Frame::Welcome { capabilities, .. }
        if capabilities.has(Capabilities::STRIPE_WHOLE));
    let caps = match &reply {
        Frame::Welcome { capabilities, .. } => *capabilities,
        _ => Capabilities::default(),
    };
    ferry_session::send::check_welcome(reply, session).map_err(crate::engine::fault_error)?;
    let paths = if offers {
        read_paths(&mut control, cfg.connect_timeout, addr).await?
    } else {
        // A server from before `Paths`: its one address.
        reporter.on_warning(&format!(
            "{} does not tell its network paths (an older ferry): using the one reached",
            cfg.server
        ));
        vec![addr]
    };
    send(&mut control, request).await?;
    let opts = ready(cfg, &mut control).await?;
    let mut dials = tokio::task::JoinSet::new();
    for index in 0..opts.streams {
        let to = paths[usize::from(index) % paths.len()];
        let data_tls = tls.clone().map(DataTls::Now);
        dials.spawn(DataDial::new(cfg, to, data_tls, session, index).run());
    }
    let c = Connected {
        control,
        tls,
        addr,
        session: session.0,
        secret: session.1,
        caps,
    };
    let joining = Joining::new(cfg, &opts, dials);
    let count = u16::try_from(paths.len()).unwrap_or(u16::MAX);
    Ok((c, opts, joining, count, whole))
}

/// The server's `Paths`, as addresses to dial: an unspecified address (a server listening on
/// all of its own) stands for the one the control connection reached.
async fn read_paths(
    control: &mut Stream,
    timeout: Duration,
    reached: SocketAddr,
) -> Result<Vec<SocketAddr>, SessionError> {
    let frame = read_frame_within(control, timeout).await?;
    let Frame::Paths { addrs } = frame else {
        return Err(SessionError::Protocol(format!(
            "expected Paths, got {:?}",
            frame.frame_type()
        )));
    };
    let mut paths = Vec::with_capacity(addrs.len());
    for a in &addrs {
        let mut path = match a.parse::<SocketAddr>() {
            Ok(p) => p,
            Err(_) => resolve(a).await?,
        };
        if path.ip().is_unspecified() {
            path.set_ip(reached.ip());
        }
        paths.push(path);
    }
    if paths.is_empty() {
        paths.push(reached);
    }
    Ok(paths)
}

/// The data connections of a session that the server has accepted, still joining it: each
/// has sent its `Hello`; those beyond the grant are dropped (the server refuses them).
pub(crate) struct Joining {
    dials: Dials,
    streams: u16,
    timeout: Duration,
}

impl Joining {
    /// `dials`: data connections under way, at least as many as the server granted.
    fn new(cfg: &ClientConfig, opts: &TransferOpts, dials: Dials) -> Self {
        Self {
            dials,
            streams: opts.streams,
            timeout: cfg.connect_timeout,
        }
    }

    /// The granted connections, handed over as each has its `Welcome`, for a receiver that
    /// answers the sender's offers meanwhile (`engine::Joins`): the decisions then leave
    /// while the connections join. Extra dials are dropped; the dials and handshakes stop
    /// when the receiver does.
    pub(crate) fn into_joins(self) -> Joins {
        let n = usize::from(self.streams);
        let deadline = tokio::time::Instant::now() + 2 * self.timeout;
        let (tx, rx) = tokio::sync::mpsc::channel(n.max(1));
        tokio::spawn(async move {
            tokio::select! {
                _ = tx.closed() => {}
                _ = self.feed(&tx) => {}
            }
        });
        Joins::new(rx, n, deadline, 0)
    }

    /// The granted connections one at a time, each as soon as it has its `Welcome`, or the
    /// first reason one cannot: at most `streams` items.
    async fn feed(mut self, tx: &tokio::sync::mpsc::Sender<Joined>) {
        let mut welcomes = tokio::task::JoinSet::new();
        let mut first_error = None;
        let mut granted = 0;
        while granted < self.streams {
            match self.dials.join_next().await {
                Some(Ok(Ok((index, _)))) if index >= self.streams => {}
                Some(Ok(Ok((index, mut s)))) => {
                    let timeout = self.timeout;
                    welcomes.spawn(async move {
                        read_welcome(&mut s, timeout).await?;
                        Ok::<_, SessionError>((index, s))
                    });
                    granted += 1;
                }
                Some(Ok(Err(e))) => {
                    first_error.get_or_insert(e);
                }
                Some(Err(e)) => {
                    first_error
                        .get_or_insert(SessionError::Protocol(format!("dial task failed: {e}")));
                }
                None => {
                    let e = first_error.unwrap_or_else(|| {
                        SessionError::Protocol(
                            "the server granted more streams than asked for".into(),
                        )
                    });
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
        }
        drop(self.dials);
        while let Some(r) = welcomes.join_next().await {
            let joined = match r {
                Ok(Ok((i, s))) => Ok((i, s, None)),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(SessionError::Protocol(format!("join task failed: {e}"))),
            };
            let failed = joined.is_err();
            if tx.send(joined).await.is_err() || failed {
                return;
            }
        }
    }

    /// The granted number of connections, each through its `Welcome`; extra dials are dropped.
    pub(crate) async fn finish(self) -> Result<Vec<Stream>, SessionError> {
        let n = usize::from(self.streams);
        // Room for every connection or the one error: `feed` never waits on it.
        let (tx, mut rx) = tokio::sync::mpsc::channel(n.max(1));
        self.feed(&tx).await;
        drop(tx);
        let mut data = Vec::with_capacity(n);
        while let Some(joined) = rx.recv().await {
            let (index, s, _) = joined?;
            data.push((index, s));
        }
        // In the order of the index each connection announced, which is the server's order
        // too: a probe pairs each connection's counts from both ends by position.
        data.sort_unstable_by_key(|(index, _)| *index);
        Ok(data.into_iter().map(|(_, s)| s).collect())
    }
}

/// The data connections dialled, each through TLS and its `Hello`, in the order of their
/// index, up to the first that failed: the server may grant fewer than were dialled, so a
/// failure beyond the grant costs nothing (the sender checks the grant against what it has,
/// `drive_sender`). An error if the first one failed.
async fn all_dialled(mut dials: Dials) -> Result<Vec<Stream>, SessionError> {
    let n = dials.len();
    let mut slots: Vec<Option<Stream>> = (0..n).map(|_| None).collect();
    let mut first_error = None;
    while let Some(r) = dials.join_next().await {
        match r {
            Ok(Ok((index, s))) => {
                if let Some(slot) = slots.get_mut(usize::from(index)) {
                    *slot = Some(s);
                }
            }
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error.get_or_insert(SessionError::Protocol(format!("dial task failed: {e}")));
            }
        }
    }
    let data: Vec<Stream> = slots.into_iter().map_while(|s| s).collect();
    match first_error {
        Some(e) if data.is_empty() => Err(e),
        Some(e) => {
            tracing::debug!(
                opened = data.len(),
                dialled = n,
                "a data connection failed: {e}"
            );
            Ok(data)
        }
        None => Ok(data),
    }
}

/// Reads the server's answer to a request: the session's stream count and block size.
async fn ready<R: tokio::io::AsyncRead + Unpin>(
    cfg: &ClientConfig,
    control: &mut R,
) -> Result<TransferOpts, SessionError> {
    let reply = tokio::time::timeout(
        cfg.idle_timeout,
        expect_frame(control, MAX_CONTROL_PAYLOAD, "control"),
    )
    .await
    .map_err(|_| SessionError::Timeout("waiting for the server to accept the request"))??;
    let Frame::Ready {
        streams,
        block_size,
    } = reply
    else {
        return Err(SessionError::Protocol(format!(
            "expected Ready, got {:?}",
            reply.frame_type()
        )));
    };
    let mut opts = cfg.opts.clone();
    opts.streams = streams;
    opts.block_size = block_size;
    Ok(opts)
}

/// The TLS setup a data connection is pinned to: at hand, or being built while the control
/// connection dials (the key is known in advance, so the data connections dial at once).
#[derive(Clone)]
enum DataTls {
    Now(Arc<ClientTls>),
    Soon(tokio::sync::watch::Receiver<Option<Arc<ClientTls>>>),
}

impl DataTls {
    async fn get(self) -> Result<Arc<ClientTls>, SessionError> {
        match self {
            Self::Now(tls) => Ok(tls),
            Self::Soon(mut rx) => {
                let built = rx.wait_for(Option::is_some).await.map_err(|_| {
                    SessionError::Tls("the control connection's TLS setup failed".into())
                })?;
                Ok(built.clone().expect("waited for"))
            }
        }
    }
}

/// One data connection through TCP and TLS, pinned to the key the control connection
/// accepted, and its `Hello`. It needs nothing from the server's answers (the client chose the
/// session's secret), so it runs alongside the login.
struct DataDial {
    addr: SocketAddr,
    local: Option<std::net::IpAddr>,
    window: u32,
    timeout: Duration,
    tls: Option<DataTls>,
    host: String,
    session: (SessionId, [u8; 32]),
    index: u16,
}

impl DataDial {
    fn new(
        cfg: &ClientConfig,
        addr: SocketAddr,
        tls: Option<DataTls>,
        session: (SessionId, [u8; 32]),
        index: u16,
    ) -> Self {
        let local = (!cfg.bind.is_empty()).then(|| cfg.bind[usize::from(index) % cfg.bind.len()]);
        Self {
            addr,
            local,
            window: cfg.opts.tcp_window,
            timeout: cfg.connect_timeout,
            tls,
            host: cfg.server.clone(),
            session,
            index,
        }
    }

    async fn run(self) -> Result<(u16, Stream), SessionError> {
        let tcp = dial_from(
            self.addr,
            self.local,
            self.window,
            self.timeout,
            (true, self.tls.is_some()),
        )
        .await?;
        let mut s = match self.tls {
            None => Stream::Plain(tcp),
            Some(tls) => {
                let tls = tls.get().await?;
                let host = self.host;
                secure(tcp, self.addr, &tls, self.timeout, |expected, presented| {
                    SessionError::ServerKeyChanged {
                        host,
                        expected,
                        presented,
                        fix: "retry: the server's key changed during the session".into(),
                    }
                })
                .await?
            }
        };
        let role = Role::Data {
            session: self.session.0,
            secret: self.session.1,
            stream: self.index,
        };
        send(&mut s, &hello_frame(role)).await?;
        Ok((self.index, s))
    }
}

fn limits(cfg: &ClientConfig, opts: &TransferOpts) -> Limits {
    Limits::new(cfg.idle_timeout, opts.block_size)
}

/// Runs one attempt after another until the job is done, a failure that a retry cannot fix
/// occurs, or `retry_for` has passed. Every attempt is a new session that resumes from what
/// the receiver already holds, so a retry sends only what is missing.
async fn with_retries<F, Fut>(
    cfg: &ClientConfig,
    reporter: &Arc<dyn Reporter>,
    attempt_once: F,
) -> Result<TransferReport, SessionError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<TransferReport, SessionError>>,
{
    let t0 = Instant::now();
    let (mut r, attempt) = retrying(cfg.retry_for, reporter.as_ref(), attempt_once).await?;
    r.attempts = attempt;
    r.seconds = t0.elapsed().as_secs_f64();
    r.mib_per_s = r.bytes as f64 / (1 << 20) as f64 / r.seconds.max(1e-9);
    Ok(r)
}

/// How long a server that has not answered once in this run is retried: long enough to ride
/// out a restart, short enough that a wrong address or port fails in seconds, not after the
/// whole `--retry-for`.
pub const FIRST_CONTACT_RETRY: Duration = Duration::from_secs(5);

/// Runs `attempt_once` until it succeeds, fails in a way a retry cannot fix, or the time to
/// retry is over; returns the result and the number of attempts. A name that does not resolve
/// is never retried; a server that has never answered is retried for [`FIRST_CONTACT_RETRY`]
/// (at most `retry_for`); once it has answered, for `retry_for`.
pub(crate) async fn retrying<T, F, Fut>(
    retry_for: Duration,
    reporter: &dyn Reporter,
    mut attempt_once: F,
) -> Result<(T, u32), SessionError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, SessionError>>,
{
    let t0 = Instant::now();
    let mut wait = Duration::from_secs(1);
    let mut attempt = 1u32;
    let mut answered = false;
    loop {
        let e = match attempt_once().await {
            Ok(r) => return Ok((r, attempt)),
            Err(e) => e,
        };
        answered |= !e.is_unreached();
        let limit = if answered {
            retry_for
        } else {
            retry_for.min(FIRST_CONTACT_RETRY)
        };
        if !e.is_retryable() || t0.elapsed() + wait > limit {
            return Err(e);
        }
        reporter.on_retry(attempt, wait, &e.to_string());
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(30));
        attempt += 1;
    }
}

/// Sends local files or trees to `dest` on the server, retrying (and resuming) on failures
/// that a retry can fix.
pub async fn put(
    cfg: &ClientConfig,
    sources: &[PathBuf],
    dest: &str,
    reporter: Arc<dyn Reporter>,
) -> Result<TransferReport, SessionError> {
    put_filtered(cfg, sources, &Filter::default(), dest, reporter).await
}

/// [`put`] of only what `filter` lets the walk reach (`--exclude`/`--include`).
pub async fn put_filtered(
    cfg: &ClientConfig,
    sources: &[PathBuf],
    filter: &Filter,
    dest: &str,
    reporter: Arc<dyn Reporter>,
) -> Result<TransferReport, SessionError> {
    let cache: Arc<DigestCache> = Arc::default();
    with_retries(cfg, &reporter, || async {
        let srcs = sources
            .iter()
            .map(|p| local_source(p))
            .collect::<Result<_, _>>()?;
        let what = Walked::Sources(srcs, filter);
        put_once(cfg, what, dest, reporter.clone(), cache.clone()).await
    })
    .await
}

/// Sends the members of the tar `archive` into the directory `dest` (`put --untar`): the
/// headers are listed first (a member that would land outside `dest` refuses the whole
/// archive before anything is sent), then each member is read in place, a range of the
/// archive, and the server commits and registers it like any put file.
pub async fn put_untar(
    cfg: &ClientConfig,
    archive: &Path,
    dest: &str,
    reporter: Arc<dyn Reporter>,
) -> Result<TransferReport, SessionError> {
    let cache: Arc<DigestCache> = Arc::default();
    let dest = match dest.ends_with('/') {
        true => dest.to_owned(),
        false => format!("{dest}/"),
    };
    with_retries(cfg, &reporter, || async {
        let what = Walked::Archive(ferry_core::archive::Archive::open(archive)?);
        put_once(cfg, what, &dest, reporter.clone(), cache.clone()).await
    })
    .await
}

/// What a put sends: sources walked through their filter, or an archive's members.
enum Walked<'a> {
    Sources(Vec<Source>, &'a Filter),
    Archive(ferry_core::archive::Archive),
}

/// A put of what `sources` opens (afresh for each attempt): local paths for the CLI, a
/// server's confined scope for the source of a third-party copy.
pub async fn put_sources<F>(
    cfg: &ClientConfig,
    sources: F,
    dest: &str,
    reporter: Arc<dyn Reporter>,
) -> Result<TransferReport, SessionError>
where
    F: Fn() -> Result<Vec<Source>, SessionError>,
{
    put_sources_filtered(cfg, sources, &Filter::default(), dest, reporter).await
}

/// [`put_sources`] of only what `filter` lets the walk reach (a sync's changed files).
pub async fn put_sources_filtered<F>(
    cfg: &ClientConfig,
    sources: F,
    filter: &Filter,
    dest: &str,
    reporter: Arc<dyn Reporter>,
) -> Result<TransferReport, SessionError>
where
    F: Fn() -> Result<Vec<Source>, SessionError>,
{
    // Digests survive attempts: a retry proves complete files identical without reading them.
    let cache: Arc<DigestCache> = Arc::default();
    with_retries(cfg, &reporter, || async {
        put_once(
            cfg,
            Walked::Sources(sources()?, filter),
            dest,
            reporter.clone(),
            cache.clone(),
        )
        .await
    })
    .await
}

/// One attempt of a put of `what`.
async fn put_once(
    cfg: &ClientConfig,
    what: Walked<'_>,
    dest: &str,
    reporter: Arc<dyn Reporter>,
    digest_cache: Arc<DigestCache>,
) -> Result<TransferReport, SessionError> {
    if cfg.drain_at_end {
        // An earlier attempt may have drained the pool before it failed.
        ferry_core::buf::undrain();
    }
    let t0 = Instant::now();
    // A striped put's destination is a directory on every host, so that each maps a file's
    // path to the same partial copy whatever exists there yet (`StripeRequest`).
    let dest = match cfg.stripe.is_empty() || dest.ends_with('/') {
        true => dest.to_owned(),
        false => format!("{dest}/"),
    };
    let dest = dest.as_str();
    let request = Frame::PutRequest {
        dest: dest.to_owned(),
        // An archive's members land inside `dest`, which ends with `/`.
        sources: match &what {
            Walked::Sources(srcs, _) => srcs.len() as u32,
            Walked::Archive(_) => 1,
        },
        opts: cfg.opts.clone(),
    };
    // The walk and the readers start before the login: the first offers follow the request,
    // the first blocks each data connection's `Hello` (`Block::early`), all cut by what was
    // asked for until the server says what it grants (it may lower both).
    let asked = StreamPlan::from_opts(&cfg.opts);
    let (tx, rx) = frame_queue(&asked, cfg.opts.streams);
    let (ctl_tx, ctl_rx) = flume::unbounded();
    let config = SenderConfig {
        block_size: cfg.opts.block_size,
        streams: cfg.opts.streams,
        checksum: cfg.opts.checksum,
        readers: crate::autotune::storage_gate(cfg.readers, cfg.tune_storage, CLIENT_MOST),
        corrupt_blocks: cfg.corrupt_blocks.clone(),
        digest_cache,
    };
    let sender = match what {
        Walked::Sources(srcs, filter) => {
            Sender::start_filtered(srcs, filter.clone(), config, tx, ctl_tx, reporter.clone())
        }
        Walked::Archive(a) => Sender::start_archive(a, config, tx, ctl_tx, reporter.clone()),
    };
    let opened = async {
        if cfg.multipath {
            let (c, opts, joining, paths, whole) =
                open_paths(cfg, reporter.as_ref(), &request).await?;
            let data = joining.finish().await?;
            let session = (c.session, c.secret);
            return Ok((
                c.control,
                c.tls,
                c.addr,
                session,
                data,
                Some((opts, paths, whole)),
            ));
        }
        let o = open(cfg, reporter.as_ref(), &request).await?;
        let data = all_dialled(o.dials).await?;
        Ok::<_, SessionError>((o.control, o.tls, o.addr, o.session, data, None))
    };
    let (opened, stripes) = tokio::join!(opened, open_stripes(cfg, reporter.clone(), dest));
    let (control, tls, addr, session, data, multipath, (stripes, left_out)) =
        match (opened, stripes) {
            (Ok((c, t, a, s, d, m)), Ok(stripes)) => (c, t, a, s, d, m, stripes),
            (Err(e), _) | (_, Err(e)) => {
                sender.close();
                return Err(e);
            }
        };
    // A multipath session has read `Welcome` and `Ready` already: its blocks are cut by the
    // grant from now on, and the engine awaits neither.
    let (granted, paths, whole) = match multipath {
        Some((o, paths, whole)) => (Some(o), paths, whole),
        None => (None, 1, false),
    };
    if let Some(o) = &granted {
        sender.grant(o.block_size, o.streams);
    }
    let security = security_of(&control, tls.as_ref());
    let plan = StreamPlan {
        force: cfg.force_streams,
        stall: cfg.stall_stream,
        tune_storage: cfg.tune_storage,
        settled_start: cfg.start_from == StartFrom::Profile { settled: true },
        drain_at_end: cfg.drain_at_end,
        helpers: cfg.helpers,
        paths,
        ..asked
    };
    let same_host = addr.ip().is_loopback();
    let dialled = data.len();
    let io = SenderIo {
        control,
        data,
        sender,
        frames: rx,
        control_out: ctl_rx,
        reporter,
        stripes,
    };
    let run = SendRun {
        limits: limits(cfg, granted.as_ref().unwrap_or(&cfg.opts)),
        plan,
        welcome: granted.is_none().then_some(cfg.connect_timeout),
        awaiting: granted.is_none().then_some(session),
        stripe_whole: whole,
    };
    let mut out = drive_sender(io, run).await?;
    if let Some(o) = &granted {
        out.granted.get_or_insert((o.streams, o.block_size));
    }
    let stripes = std::mem::take(&mut out.stripes);
    let mut report = put_report(cfg, out, t0, (dialled, same_host), security).await;
    report.stripes = stripe_reports(cfg, stripes, left_out);
    Ok(report)
}

/// Opens a stripe session on each of a striped put's other hosts, all at once: logs in with
/// the put's token, asks to write into `dest` (`StripeRequest`) and joins the data
/// connections. A host that refuses fails the put, named: the user asked for it. One that
/// cannot be reached is left out and reported failed, as one that dies mid-put is.
async fn open_stripes(
    cfg: &ClientConfig,
    reporter: Arc<dyn Reporter>,
    dest: &str,
) -> Result<Opened, SessionError> {
    let request = Frame::StripeRequest {
        dest: dest.to_owned(),
        opts: cfg.opts.clone(),
    };
    open_stripe_hosts(cfg, reporter, request, 0).await
}

/// Opens a stripe read session on each of a striped get's other hosts, all at once: as
/// [`open_stripes`], reading `src` (`StripeRead`), each host checked to take them
/// (`STRIPE_READ` in its `Welcome`) before the request is sent.
async fn open_stripe_reads(
    cfg: &ClientConfig,
    reporter: Arc<dyn Reporter>,
    src: &str,
) -> Result<Opened, SessionError> {
    let request = Frame::StripeRead {
        src: src.to_owned(),
        opts: cfg.opts.clone(),
    };
    open_stripe_hosts(cfg, reporter, request, Capabilities::STRIPE_READ).await
}

/// The stripe hosts whose sessions opened, and a report for each left out.
type Opened = (Vec<StripeIo>, Vec<StripeReport>);

/// Opens `request`'s stripe session on every host of `cfg.stripe`; `needs`: capability bits
/// each host's `Welcome` must set. A host's refusal is the transfer's error; a host that
/// cannot be reached or whose connection fails (an error a retry may not see) is left out,
/// with its reason in its report: the transfer goes on with the others, as when a host
/// dies mid-way.
async fn open_stripe_hosts(
    cfg: &ClientConfig,
    reporter: Arc<dyn Reporter>,
    request: Frame,
    needs: u64,
) -> Result<Opened, SessionError> {
    let mut opening = tokio::task::JoinSet::new();
    for (i, host) in cfg.stripe.iter().cloned().enumerate() {
        let host_cfg = ClientConfig {
            server: host.server.clone(),
            security: host.security.clone(),
            token: host.token.clone().unwrap_or_else(|| cfg.token.clone()),
            multipath: false,
            stripe: Vec::new(),
            ..cfg.clone()
        };
        let request = request.clone();
        let reporter = reporter.clone();
        let name = host.server.clone();
        let opened = async move {
            let mut c = connect(&host_cfg, reporter.as_ref()).await?;
            if !c.caps.has(needs) {
                return Err(SessionError::Remote {
                    code: ErrorCode::DENIED,
                    message: "takes no striped gets (an older ferry, or not serve --stripe)".into(),
                });
            }
            let (opts, data) = start(&host_cfg, &mut c, request).await?;
            Ok::<_, SessionError>(StripeIo {
                host: name,
                control: c.control,
                data,
                block_size: opts.block_size,
            })
        };
        opening.spawn(async move {
            let named = |e| match e {
                SessionError::Remote { code, message } => SessionError::Remote {
                    code,
                    message: format!("stripe host {}: {message}", host.server),
                },
                other => other,
            };
            (i, opened.await.map_err(named))
        });
    }
    let mut hosts = Vec::with_capacity(opening.len());
    let mut left_out = Vec::new();
    while let Some(joined) = opening.join_next().await {
        let (i, host) = joined.map_err(|e| SessionError::Protocol(format!("stripe task: {e}")))?;
        match host {
            Ok(h) => hosts.push((i, h)),
            Err(e) if e.is_retryable() => left_out.push(StripeReport {
                host: cfg.stripe[i].server.clone(),
                failed: Some(format!("{e:#}")),
                ..StripeReport::default()
            }),
            Err(e) => return Err(e),
        }
    }
    hosts.sort_by_key(|(i, _)| *i);
    Ok((hosts.into_iter().map(|(_, h)| h).collect(), left_out))
}

/// The stripe hosts' reports in `cfg.stripe`'s order: those the engine ran and those left
/// out when their sessions would not open.
fn stripe_reports(
    cfg: &ClientConfig,
    ran: Vec<StripeReport>,
    left_out: Vec<StripeReport>,
) -> Vec<StripeReport> {
    let mut all: Vec<StripeReport> = ran.into_iter().chain(left_out).collect();
    all.sort_by_key(|r| cfg.stripe.iter().position(|h| h.server == r.host));
    all
}

/// A finished put's report: what the server granted, what each end's tuner did, the files'
/// digests. `(dialled, same_host)`: data connections opened, and whether to a loopback server.
async fn put_report(
    cfg: &ClientConfig,
    out: SenderOutcome,
    t0: Instant,
    (dialled, same_host): (usize, bool),
    security: (bool, Option<String>),
) -> TransferReport {
    let mut opts = cfg.opts.clone();
    if let Some((streams, block_size)) = out.granted {
        opts.streams = streams;
        opts.block_size = block_size;
    }
    let connections = dialled.min(usize::from(opts.streams));
    let (summary, streams, sender, timeline) = (out.summary, out.streams, out.sender, out.timeline);
    let tuning = Tuning::new(
        cfg,
        &opts,
        connections,
        Some(&out.tuning),
        Some(summary.receiver),
        same_host,
        (
            Pool::local(cfg, out.readers),
            Pool::remote(Some(summary.receiver)),
        ),
    );
    let mut errors = sender.errors();
    errors.extend(out.remote_errors);
    let manifest = sender
        .digests()
        .into_iter()
        .map(|(_, p, d)| (p, digest::hex(&d)))
        .collect();
    tokio::task::spawn_blocking(move || sender.finish())
        .await
        .ok();
    let ended = Ended {
        summary,
        streams,
        tuning,
        errors,
        manifest,
        security,
        timeline,
    };
    report("put", cfg, &opts, t0, ended)
}

/// Fetches `src` from the server into the local `dest`, retrying (and resuming) on failures
/// that a retry can fix.
pub async fn get(
    cfg: &ClientConfig,
    src: &str,
    dest: &Path,
    reporter: Arc<dyn Reporter>,
) -> Result<TransferReport, SessionError> {
    get_filtered(cfg, src, &Filter::default(), dest, reporter).await
}

/// [`get`] taking only what `filter` admits: the server still walks and offers the rest,
/// which this end answers `Skip` (a walk, not a transfer) and never makes.
pub async fn get_filtered(
    cfg: &ClientConfig,
    src: &str,
    filter: &Filter,
    dest: &Path,
    reporter: Arc<dyn Reporter>,
) -> Result<TransferReport, SessionError> {
    with_retries(cfg, &reporter, || {
        get_once(cfg, (src, filter), (dest, false), reporter.clone())
    })
    .await
}

/// [`get_filtered`] that makes `dest` itself the copy of `src` (a sync), where a get puts a
/// tree inside an existing directory `dest`.
pub async fn get_mirror(
    cfg: &ClientConfig,
    src: &str,
    filter: &Filter,
    dest: &Path,
    reporter: Arc<dyn Reporter>,
) -> Result<TransferReport, SessionError> {
    with_retries(cfg, &reporter, || {
        get_once(cfg, (src, filter), (dest, true), reporter.clone())
    })
    .await
}

/// [`get`] into the directory `into` opens for each attempt (a [`Root`], typically a scope of
/// a service's local root): nothing it writes can leave that directory, through a symlink
/// swapped in or otherwise.
pub async fn get_into(
    cfg: &ClientConfig,
    src: &str,
    into: impl Fn() -> Result<Root, SessionError>,
    reporter: Arc<dyn Reporter>,
) -> Result<TransferReport, SessionError> {
    let filter = Filter::default();
    with_retries(cfg, &reporter, || {
        let destination = into().map(|root| Destination {
            root,
            base: String::new(),
            rename_top: None,
        });
        let reporter = reporter.clone();
        let filter = &filter;
        async move { get_to(cfg, (src, filter), (destination?, None), reporter).await }
    })
    .await
}

/// Sets up a get's receiver before it answers any offer (a pulled copy's destination server:
/// its catalog's digests and commit hook).
pub(crate) type ReceiverSetup<'a> = dyn Fn(&Arc<Receiver>) + Send + Sync + 'a;

/// [`get`] into the `Destination` that `into` opens for each attempt, its receiver set up by
/// `setup`: a pulled copy's destination server, which confines what it stores beneath its
/// client's write scope and records it as a put would.
pub(crate) async fn get_to_destination(
    cfg: &ClientConfig,
    src: &str,
    into: impl Fn() -> Result<Destination, SessionError>,
    setup: &ReceiverSetup<'_>,
    reporter: Arc<dyn Reporter>,
) -> Result<TransferReport, SessionError> {
    let filter = Filter::default();
    with_retries(cfg, &reporter, || {
        let destination = into();
        let reporter = reporter.clone();
        let filter = &filter;
        async move { get_to(cfg, (src, filter), (destination?, Some(setup)), reporter).await }
    })
    .await
}

/// One attempt of a get of `src`, taking what the filter admits; `mirror`: `dest` is the
/// copy's own name (see [`get_mirror`]).
async fn get_once(
    cfg: &ClientConfig,
    (src, filter): (&str, &Filter),
    (dest, mirror): (&Path, bool),
    reporter: Arc<dyn Reporter>,
) -> Result<TransferReport, SessionError> {
    let destination = if mirror {
        mirror_destination(dest)?
    } else {
        local_destination(dest)?
    };
    get_to(cfg, (src, filter), (destination, None), reporter).await
}

/// One attempt of a get of `src` into `destination`, its receiver set up by `setup` first.
async fn get_to(
    cfg: &ClientConfig,
    (src, filter): (&str, &Filter),
    (destination, setup): (Destination, Option<&ReceiverSetup<'_>>),
    reporter: Arc<dyn Reporter>,
) -> Result<TransferReport, SessionError> {
    let t0 = Instant::now();
    let request = Frame::GetRequest {
        src: src.to_owned(),
        opts: cfg.opts.clone(),
    };
    let opened = async {
        if cfg.multipath {
            let (c, opts, joining, _, _) = open_paths(cfg, reporter.as_ref(), &request).await?;
            Ok::<_, SessionError>((c, opts, joining))
        } else {
            let opening = open(cfg, reporter.as_ref(), &request).await?;
            answered(cfg, opening).await
        }
    };
    let stripes = async {
        match cfg.stripe.is_empty() {
            true => Ok((Vec::new(), Vec::new())),
            false => open_stripe_reads(cfg, reporter.clone(), src).await,
        }
    };
    let (opened, stripes) = tokio::join!(opened, stripes);
    let ((c, opts, joining), (stripes, left_out)) = (opened?, stripes?);
    let joins = joining.into_joins();
    let security = security_of(&c.control, c.tls.as_ref());
    let (tx, rx) = flume::unbounded();
    let config = ReceiverConfig {
        existing: opts.existing,
        checksum: opts.checksum,
        tag: c.session.0,
        block_size: opts.block_size,
        modes: cfg.modes,
        links: cfg.links,
    };
    let receiver = Receiver::new(destination, config, tx, reporter)?;
    receiver.set_filter(filter.clone());
    if let Some(setup) = setup {
        setup(&receiver);
    }
    let same_host = c.addr.ip().is_loopback();
    let connections = usize::from(opts.streams);
    let writers = Writers::new(cfg.writers, cfg.tune_storage, CLIENT_MOST);
    let io = ReceiverIo {
        control: c.control,
        joins,
        receiver: receiver.clone(),
        control_out: rx,
        stripes: (
            stripes,
            opts.block_size,
            ferry_core::send::EARLY_PER_STREAM * u64::from(opts.streams),
            c.caps.has(Capabilities::STRIPE_DIGEST),
        ),
    };
    let run = RecvRun {
        writers,
        limits: limits(cfg, &opts),
        leave_early: true,
    };
    let out = drive_receiver(io, run).await?;
    let (summary, streams, tuned) = (out.summary, out.streams, out.tuned);
    let pools = (
        Pool::remote(tuned.as_ref().map(|t| t.sender)),
        Pool::local(cfg, out.writers),
    );
    let tuning = Tuning::new(
        cfg,
        &opts,
        connections,
        tuned.as_ref(),
        Some(summary.receiver),
        same_host,
        pools,
    );
    let errors = receiver.errors();
    let manifest = receiver.manifest();
    let ended = Ended {
        summary,
        streams,
        tuning,
        errors,
        manifest,
        security,
        timeline: out.timeline,
    };
    let mut report = report("get", cfg, &opts, t0, ended);
    report.stripes = stripe_reports(cfg, out.stripes, left_out);
    Ok(report)
}

/// Lists a remote directory (or describes a single remote file).
pub async fn list(
    cfg: &ClientConfig,
    path: &str,
    reporter: &dyn Reporter,
) -> Result<Vec<ListEntry>, SessionError> {
    // The same retries as a transfer: a listing is as easily cut by a restarting server.
    let (entries, _) = retrying(cfg.retry_for, reporter, || list_once(cfg, path, reporter)).await?;
    Ok(entries)
}

async fn list_once(
    cfg: &ClientConfig,
    path: &str,
    reporter: &dyn Reporter,
) -> Result<Vec<ListEntry>, SessionError> {
    let mut c = connect(cfg, reporter).await?;
    send(
        &mut c.control,
        &Frame::ListRequest {
            path: path.to_owned(),
        },
    )
    .await?;
    let mut out = Vec::new();
    loop {
        match expect_frame(&mut c.control, MAX_CONTROL_PAYLOAD, "control").await? {
            Frame::ListEntries { entries } => out.extend(entries),
            Frame::ListEnd => return Ok(out),
            other => {
                return Err(SessionError::Protocol(format!(
                    "unexpected {:?} in a listing",
                    other.frame_type()
                )))
            }
        }
    }
}

fn security_of(control: &Stream, tls: Option<&Arc<ClientTls>>) -> (bool, Option<String>) {
    (
        control.is_encrypted(),
        tls.and_then(|t| t.pin()).map(|f| f.to_string()),
    )
}

/// What a finished transfer brings to its report.
struct Ended {
    summary: ferry_proto::CompleteSummary,
    streams: Vec<StreamReport>,
    tuning: Tuning,
    errors: Vec<String>,
    manifest: Vec<(String, String)>,
    /// Whether it was encrypted, and the server's fingerprint.
    security: (bool, Option<String>),
    timeline: Timeline,
}

fn report(
    direction: &'static str,
    cfg: &ClientConfig,
    opts: &TransferOpts,
    t0: Instant,
    e: Ended,
) -> TransferReport {
    let Ended {
        summary: s,
        streams,
        tuning,
        errors,
        manifest,
        security: (encrypted, server_fingerprint),
        timeline,
    } = e;
    let seconds = t0.elapsed().as_secs_f64();
    let mut tuning = tuning;
    if s.bytes == 0 {
        // Nothing moved (everything skipped, say): no measurement names a bottleneck.
        tuning.bottleneck = "none";
    }
    TransferReport {
        direction,
        files: s.files,
        bytes: s.bytes,
        skipped: s.skipped,
        failed: s.failed,
        bad_blocks: s.bad_blocks,
        seconds,
        mib_per_s: s.bytes as f64 / (1 << 20) as f64 / seconds.max(1e-9),
        block_size: opts.block_size,
        block_size_from: cfg.block_from,
        checksum: digest::algo_name(opts.checksum),
        streams,
        tuning,
        attempts: 1,
        encrypted,
        server_fingerprint,
        errors,
        timeline,
        manifest,
        stripes: Vec::new(),
    }
}

/// A local path to send: its parent becomes the root, its name the top entry.
fn local_source(p: &Path) -> Result<Source, SessionError> {
    let err = |e: std::io::Error| SessionError::from(FsError::io(p.display().to_string(), e));
    // `absolute` drops `.` components but keeps `..`: a path ending in `..` (or `/`) is named
    // after the directory it resolves to.
    let mut abs = std::path::absolute(p).map_err(err)?;
    if abs.file_name().is_none() {
        abs = std::fs::canonicalize(&abs).map_err(err)?;
    }
    let (Some(parent), Some(name)) = (abs.parent(), abs.file_name()) else {
        return Err(err(std::io::Error::other(
            "cannot send `/` itself; name a directory below it",
        )));
    };
    let name = name
        .to_str()
        .ok_or_else(|| err(std::io::Error::other("file name is not UTF-8")))?
        .to_owned();
    // Fails early with a clear message when the source does not exist, naming it as given
    // (the file system names only the component it stopped at).
    let as_given = |e: FsError| match e {
        FsError::Io { cause, .. } => err(cause),
        other => SessionError::from(other),
    };
    let root = Root::open(parent).map_err(as_given)?;
    root.lstat(&name).map_err(as_given)?;
    Ok(Source {
        root,
        rel: name.clone(),
        name,
    })
}

/// Where a get lands locally, with the same rules as the server uses for put.
fn local_destination(dest: &Path) -> Result<Destination, SessionError> {
    let s = dest.to_string_lossy();
    let is_dir = dest.is_dir() || s.ends_with('/');
    if is_dir {
        std::fs::create_dir_all(dest).map_err(|e| FsError::io(s.to_string(), e))?;
        return Ok(Destination {
            root: Root::open(dest)?,
            base: String::new(),
            rename_top: None,
        });
    }
    let abs = std::path::absolute(dest).map_err(|e| FsError::io(s.to_string(), e))?;
    let parent = abs.parent().unwrap_or(Path::new("/"));
    let name = abs.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
        FsError::io(
            s.to_string(),
            std::io::Error::other("destination has no usable file name"),
        )
    })?;
    std::fs::create_dir_all(parent).map_err(|e| FsError::io(parent.display().to_string(), e))?;
    Ok(Destination {
        root: Root::open(parent)?,
        base: String::new(),
        rename_top: Some(name.to_owned()),
    })
}

/// `dest` as the top of what arrives, whether or not it exists yet: its parent is the root.
fn mirror_destination(dest: &Path) -> Result<Destination, SessionError> {
    let s = dest.to_string_lossy();
    let abs = std::path::absolute(dest).map_err(|e| FsError::io(s.to_string(), e))?;
    let (Some(parent), Some(name)) = (abs.parent(), abs.file_name().and_then(|n| n.to_str()))
    else {
        let why = std::io::Error::other("destination has no usable file name");
        return Err(FsError::io(s.to_string(), why).into());
    };
    std::fs::create_dir_all(parent).map_err(|e| FsError::io(parent.display().to_string(), e))?;
    Ok(Destination {
        root: Root::open(parent)?,
        base: String::new(),
        rename_top: Some(name.to_owned()),
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::{Duration, Instant};

    use super::{retrying, SessionError, FIRST_CONTACT_RETRY};

    fn refused() -> SessionError {
        SessionError::Connect {
            addr: "127.0.0.1:9".into(),
            cause: std::io::ErrorKind::ConnectionRefused.into(),
        }
    }

    /// Attempts made by `retrying` when attempt `n` (from 1) fails with `fail(n)`.
    async fn attempts(retry_for: Duration, fail: impl Fn(u32) -> SessionError) -> u32 {
        let n = AtomicU32::new(0);
        let r: Result<((), u32), _> = retrying(retry_for, &ferry_core::NoReporter, || {
            let i = n.fetch_add(1, Ordering::Relaxed) + 1;
            let e = fail(i);
            async move { Err(e) }
        })
        .await;
        assert!(r.is_err());
        n.load(Ordering::Relaxed)
    }

    #[tokio::test]
    async fn first_contact_is_retried_briefly_and_a_lost_server_for_retry_for() {
        // Never answered: retried within FIRST_CONTACT_RETRY (waits 1 s, 2 s), not 8 s.
        let t0 = Instant::now();
        assert_eq!(attempts(Duration::from_secs(8), |_| refused()).await, 3);
        assert!(t0.elapsed() < FIRST_CONTACT_RETRY, "{:?}", t0.elapsed());
        // A name that does not resolve: once.
        let unresolved = |_| SessionError::Resolve {
            server: "x.invalid:7070".into(),
            cause: "no".into(),
        };
        assert_eq!(attempts(Duration::from_secs(8), unresolved).await, 1);
        // Answered once (a session ran and was cut), then refused while it restarts: the
        // whole retry_for (waits 1, 2 and 4 s).
        let cut = |i| match i {
            1 => SessionError::Closed("control"),
            _ => refused(),
        };
        assert_eq!(attempts(Duration::from_secs(8), cut).await, 4);
        // retry_for 0 means never, even on first contact.
        assert_eq!(attempts(Duration::ZERO, |_| refused()).await, 1);
    }

    #[test]
    fn sources_are_named_after_what_they_resolve_to() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        let name = |p: &Path| super::local_source(p).unwrap().name;
        assert_eq!(name(&d.path().join("a/b/")), "b");
        assert_eq!(name(&d.path().join("a/./b")), "b");
        assert_eq!(name(&d.path().join("a/b/..")), "a");
        assert!(super::local_source(Path::new("/")).is_err());
        assert!(super::local_source(&d.path().join("missing")).is_err());
    }
}
