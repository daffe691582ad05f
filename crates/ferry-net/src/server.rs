//! The daemon: one port for control and data connections, a connection cap, timeouts on every
//! wait, and graceful shutdown. An error in one connection is logged and never reaches the
//! listener (the mini-redis skeleton).

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_core::recv::{Destination, Links, Modes, Receiver, ReceiverConfig};
use ferry_core::root::Kind;
use ferry_core::send::{Sender, SenderConfig, Source};
use ferry_core::{path, FsError, NoReporter, Root};
use ferry_proto::{
    handshake, Capabilities, ErrorCode, Frame, ListEntry, Role, SessionId, TransferOpts,
    HEADER_LEN, MAX_CONTROL_PAYLOAD, MAX_LIST_ENTRIES, PROTOCOL_VERSION,
};
use subtle::ConstantTimeEq;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, mpsc, OwnedSemaphorePermit as Permit, Semaphore};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use crate::access::{self, Access, AccessList, Grant, LoginBrake};
use crate::admission::{PerAddress, Unproven};
use crate::conn::{expect_frame, send};
use crate::engine::{
    drive_receiver, drive_sender, frame_queue, Joined, Joins, Limits, ReceiverIo, RecvRun, SendRun,
    SenderIo, StreamPlan, Writers,
};
use crate::error::SessionError;
use crate::stream::{Recorder, Stream, TLS_HANDSHAKE_RECORD};
use crate::tcp::tune;
use crate::tls::Identity;

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub root: PathBuf,
    /// The tokens that may log in, and what each may touch.
    pub access: Arc<Access>,
    /// The server's TLS key and certificate. `None` serves plain TCP only, which requires
    /// `allow_plaintext`.
    pub tls: Option<Identity>,
    /// Accept clients that connect without TLS (`serve --allow-plaintext`). Never implied.
    pub allow_plaintext: bool,
    /// Where relative remote paths point, relative to the root: empty for a daemon (every
    /// path is under the root), the user's home for `serve --oneshot` (so `host:file` means
    /// `~/file`, as with scp).
    pub base: String,
    /// Connections open at once (control and data together); more are refused with `BUSY`.
    pub max_connections: usize,
    /// Connections from one address (IPv6: one /64) that have not authenticated yet, that is
    /// not logged in or not joined to their session: more are refused with `BUSY`, so that
    /// one address cannot fill `max_connections` with connections that never log in. Never
    /// below `max_streams + 1`, what one client dials at once (`Server::bind` raises it).
    pub max_unauthenticated_per_address: usize,
    /// Sessions one token may run at once; more are refused with `BUSY`. With the per-session
    /// bounds this bounds what one token can make the server hold (SECURITY.md).
    pub max_sessions_per_token: usize,
    /// How long a data connection waits for a session that no control connection has named:
    /// a client dials its data connections alongside its control connection, so one may say
    /// its `Hello` first, but not by long. A session named by a control connection still
    /// logging in or preparing is waited for up to `handshake_timeout`.
    pub unknown_session_grace: Duration,
    pub max_streams: u16,
    /// Upper bound on a session's buffered block data: streams × block size is lowered to fit.
    pub session_memory: u64,
    pub handshake_timeout: Duration,
    pub idle_timeout: Duration,
    /// Delay before answering a wrong token, so guessing is slow.
    pub auth_failure_delay: Duration,
    /// Reader threads (get) and writer threads (put) a session starts with.
    pub readers: usize,
    pub writers: usize,
    /// Tune each session's reader or writer threads while it runs, from that start.
    pub tune_storage: bool,
    /// Partial files and journals untouched for this long are removed by the periodic scan.
    pub partial_max_age: Duration,
    /// How often the root is scanned for such leftovers.
    pub partial_scan_interval: Duration,
    /// Which permission bits a put stores (setuid, setgid and world-write cleared by default).
    pub modes: Modes,
}

impl ServerConfig {
    /// A TLS server with a fresh in-memory identity and one full-access token.
    pub fn new(root: impl Into<PathBuf>, token: impl Into<String>) -> Self {
        Self {
            root: root.into(),
            access: Arc::new(Access::Fixed(Arc::new(AccessList::single(
                "default",
                &token.into(),
            )))),
            tls: Some(Identity::generate().expect("generating a P-256 key works")),
            allow_plaintext: false,
            base: String::new(),
            max_connections: 512,
            max_unauthenticated_per_address: 128,
            max_sessions_per_token: 16,
            unknown_session_grace: Duration::from_secs(3),
            max_streams: 64,
            session_memory: 1 << 30,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            auth_failure_delay: Duration::from_secs(1),
            readers: 4,
            writers: 4,
            tune_storage: true,
            partial_max_age: Duration::from_secs(24 * 3600),
            partial_scan_interval: Duration::from_secs(3600),
            modes: Modes::default(),
        }
    }
}

/// A session waiting for its data connections to join.
struct Pending {
    secret: [u8; 32],
    /// Data connections granted: a connection with an index beyond is refused on its own.
    streams: u16,
    /// A joining data connection travels with its connection-cap permit, so that it counts
    /// against the cap for as long as it is open, not just while it shakes hands.
    joins: mpsc::Sender<Joined>,
}

pub(crate) struct Shared {
    pub(crate) config: ServerConfig,
    root: Root,
    tls: Option<TlsAcceptor>,
    brake: Mutex<LoginBrake>,
    /// The connection cap; auto-tuned sessions size their spare connections by what is free.
    connections: Arc<Semaphore>,
    /// When the last session ended (or the server started), for `serve --oneshot`'s exit.
    last_session_end: Mutex<Instant>,
    pending: Mutex<HashMap<SessionId, Pending>>,
    /// Sessions named by a control connection's `Hello` that is still open, by how many: its
    /// data connections are waited for while it logs in and prepares (see `find_session`).
    opening: Mutex<HashMap<SessionId, usize>>,
    /// Connections not authenticated yet, per address.
    unproven: Arc<PerAddress>,
    /// Sessions running now, per token name.
    per_token: Mutex<HashMap<String, usize>>,
    /// Told whenever a session opens to its data connections: a client sends their `Hello`
    /// alongside its control `Hello`, so one may arrive before its session is registered.
    registered: tokio::sync::Notify,
    /// Sessions running now; when the last ends, idle buffers go back to the system.
    active: std::sync::atomic::AtomicUsize,
}

/// Counts a running session; the last one to end releases idle block buffers, so a daemon
/// between bursts does not keep hundreds of MiB it no longer needs.
struct ActiveSession<'a>(&'a Shared);

impl<'a> ActiveSession<'a> {
    fn enter(shared: &'a Shared) -> Self {
        shared
            .active
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Self(shared)
    }
}

impl Drop for ActiveSession<'_> {
    fn drop(&mut self) {
        if self
            .0
            .active
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel)
            == 1
        {
            ferry_core::buf::release();
            trim_heap();
        }
        *self
            .0
            .last_session_end
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }
}

/// Asks the C allocator to return freed memory to the system (glibc keeps large freed chunks
/// in its arenas otherwise).
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions; it only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

pub struct Server {
    listener: TcpListener,
    shared: Arc<Shared>,
}

impl Server {
    pub async fn bind(addr: SocketAddr, config: ServerConfig) -> Result<Self, SessionError> {
        let root = Root::open(&config.root)?;
        let tls = match &config.tls {
            Some(id) => Some(TlsAcceptor::from(id.server_config()?)),
            None if config.allow_plaintext => None,
            None => {
                return Err(SessionError::Tls(
                    "a server without a TLS identity must allow plain TCP explicitly".into(),
                ))
            }
        };
        // A deep accept queue: with the default (128), a burst of connections beyond it sees
        // a connection the server never accepted, and hangs instead of getting BUSY.
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        crate::tcp::open_listen_window(&socket);
        if crate::tcp::fast_open() {
            // Inert unless the host allows server-side Fast Open (DESIGN.md, "TCP").
            let _ = crate::tcp::allow_fast_open_listen(std::os::fd::AsFd::as_fd(&socket));
        }
        let listener = socket.listen(4096)?;
        let connections = Arc::new(Semaphore::new(config.max_connections));
        // A client dials its control connection and every data connection together: a cap
        // below that would refuse one of its own connections.
        let one_client = usize::from(config.max_streams) + 1;
        let unproven = PerAddress::new(config.max_unauthenticated_per_address.max(one_client));
        Ok(Self {
            listener,
            shared: Arc::new(Shared {
                config,
                root,
                tls,
                brake: Mutex::default(),
                connections,
                last_session_end: Mutex::new(Instant::now()),
                pending: Mutex::default(),
                opening: Mutex::default(),
                unproven,
                per_token: Mutex::default(),
                registered: tokio::sync::Notify::new(),
                active: Default::default(),
            }),
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// How long no session has been running (zero while one runs): `serve --oneshot` exits
    /// when this grows too long.
    pub fn idle_probe(&self) -> IdleProbe {
        IdleProbe(self.shared.clone())
    }

    /// Counts the leftovers of interrupted transfers under the root and removes those older
    /// than `partial_max_age` (a blocking walk of the tree).
    pub fn scan_partials(&self) -> ferry_core::partials::PartialReport {
        let c = &self.shared.config;
        ferry_core::partials::scan(&c.root, c.partial_max_age, std::time::SystemTime::now())
    }

    /// Serves until `shutdown` resolves, then stops accepting, tells every session to end, and
    /// waits (bounded) for them.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let limit = self.shared.connections.clone();
        // Refusals are answered (so a client sees "busy", not a reset), but only so many at
        // once: beyond that a flood is simply dropped.
        let refusals = Arc::new(Semaphore::new(4096));
        let (stop_tx, _) = broadcast::channel::<()>(1);
        let mut tasks = JoinSet::new();
        tokio::pin!(shutdown);
        let mut backoff = Duration::from_millis(10);
        let mut scan = tokio::time::interval(self.shared.config.partial_scan_interval);
        scan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        scan.tick().await; // the first tick is immediate; the caller scans at start
        loop {
            let accepted = tokio::select! {
                a = self.listener.accept() => a,
                _ = &mut shutdown => break,
                Some(_) = tasks.join_next() => continue,
                _ = scan.tick() => {
                    let c = self.shared.config.clone();
                    tasks.spawn(async move {
                        let now = std::time::SystemTime::now();
                        let r = tokio::task::spawn_blocking(move || {
                            ferry_core::partials::scan(&c.root, c.partial_max_age, now)
                        })
                        .await;
                        if let Ok(r) = r {
                            info!(
                                kept_files = r.kept_files, kept_bytes = r.kept_bytes,
                                removed_files = r.removed_files, removed_bytes = r.removed_bytes,
                                "partial transfers scanned"
                            );
                        }
                    });
                    continue;
                }
            };
            let (stream, peer) = match accepted {
                Ok(x) => {
                    backoff = Duration::from_millis(10);
                    x
                }
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    warn!("accept failed: {e}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            };
            // Per address first: a flood from one address is turned away before it takes a
            // slot that anyone else could have had.
            let Some(unproven) = self.shared.unproven.admit(peer.ip()) else {
                debug!(%peer, "refused: too many unauthenticated connections from this address");
                if let Ok(p) = refusals.clone().try_acquire_owned() {
                    let message = format!(
                        "too many connections from {} that have not logged in ({}); try again",
                        peer.ip(),
                        self.shared.unproven.cap()
                    );
                    tasks.spawn(refuse_busy(stream, p, message));
                }
                continue;
            };
            let Ok(permit) = limit.clone().try_acquire_owned() else {
                if let Ok(p) = refusals.clone().try_acquire_owned() {
                    let message = "server is at its connection limit; try again".to_owned();
                    tasks.spawn(refuse_busy(stream, p, message));
                }
                continue;
            };
            let shared = self.shared.clone();
            let mut stop = stop_tx.subscribe();
            tasks.spawn(async move {
                tokio::select! {
                    r = handle(shared, stream, peer, permit, unproven) => {
                        if let Err(e) = r {
                            debug!(%peer, "connection ended: {e}");
                        }
                    }
                    _ = stop.recv() => {}
                }
            });
        }
        info!(
            "shutting down: no new connections; ending {} active",
            tasks.len()
        );
        drop(self.listener);
        let _ = stop_tx.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
    }
}

/// See [`Server::idle_probe`].
#[derive(Clone)]
pub struct IdleProbe(Arc<Shared>);

impl IdleProbe {
    pub fn idle_for(&self) -> Duration {
        if self.0.active.load(std::sync::atomic::Ordering::Acquire) > 0 {
            return Duration::ZERO;
        }
        self.0
            .last_session_end
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
    }
}

async fn refuse_busy(stream: TcpStream, _slot: Permit, message: String) {
    let frame = Frame::Error {
        code: ErrorCode::BUSY,
        message,
    };
    // Always in plain TCP, at once and without a TLS handshake, so a flood costs no crypto: a
    // TLS client reads the frame from the bytes that failed its handshake (`Recorder`).
    let mut s = Stream::Plain(stream);
    let _ = tokio::time::timeout(Duration::from_secs(1), send(&mut s, &frame)).await;
    let _ = s.shutdown().await;
    // Take the client's first bytes (its Hello, which follows the connection at once) off the
    // socket before closing: closing with them unread sends a reset instead of a FIN. Briefly:
    // a flood must not hold refusal slots.
    let _ = tokio::time::timeout(Duration::from_millis(20), async {
        let mut sink = [0u8; 4096];
        while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// Starts TLS, or accepts plain TCP where allowed; the first byte says which the client wants.
async fn transport(shared: &Shared, stream: TcpStream) -> Result<Stream, SessionError> {
    let mut first = [0u8; 1];
    if stream.peek(&mut first).await? == 0 {
        return Err(SessionError::Closed("control"));
    }
    if first[0] == TLS_HANDSHAKE_RECORD {
        let Some(acceptor) = &shared.tls else {
            // Take the ClientHello off the socket first: closing with unread bytes sends a
            // reset, which the client would take for a network failure and retry. The plain
            // frame then fails its TLS parse, which it reports as a mismatch.
            let frame = Frame::Error {
                code: ErrorCode::ENCRYPTION,
                message: "this server only serves plain TCP (--no-encrypt)".into(),
            };
            refuse_plainly(stream, &frame).await;
            return Err(SessionError::Tls(
                "client started TLS; this server only serves plain TCP".into(),
            ));
        };
        let tls = acceptor
            .accept(Recorder::new(stream))
            .await
            .map_err(|e| SessionError::Tls(format!("handshake failed: {e}")))?;
        return Ok(Stream::Tls(Box::new(tokio_rustls::TlsStream::Server(tls))));
    }
    if !shared.config.allow_plaintext {
        let frame = Frame::Error {
            code: ErrorCode::ENCRYPTION,
            message: "this server requires TLS: connect without --no-encrypt (plain TCP is \
                      only accepted by `ferry serve --allow-plaintext`)"
                .into(),
        };
        refuse_plainly(stream, &frame).await;
        return Err(SessionError::Tls("client offered plain TCP".into()));
    }
    Ok(Stream::Plain(stream))
}

/// Sends a plain `Error` frame and closes. What the client sent first is read off the socket
/// before: closing with unread bytes sends a reset, which the client would take for a network
/// failure (and retry) instead of reading the refusal.
async fn refuse_plainly(stream: TcpStream, frame: &Frame) {
    let mut plain = Stream::Plain(stream);
    let mut first = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_millis(500), plain.read(&mut first)).await;
    let _ = send(&mut plain, frame).await;
    let _ = plain.shutdown().await;
}

/// Reads the first frame of a connection, which must be a small `Hello`. The sans-I/O parser
/// in `ferry_proto::handshake` (fuzzed) decides; nothing larger than `MAX_HELLO` is read.
async fn read_hello(stream: &mut Stream) -> Result<(Role, Capabilities), SessionError> {
    let refused = |e: handshake::HandshakeError| {
        let e = ferry_proto::ProtocolError::from(e);
        SessionError::Remote {
            code: e.code,
            message: e.reason,
        }
    };
    let mut head = [0u8; HEADER_LEN];
    stream.read_exact(&mut head).await?;
    let len = handshake::check_hello_header(&head).map_err(refused)?;
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).await?;
    let hello = handshake::parse_hello(&head, &payload).map_err(refused)?;
    let caps = hello.session_capabilities();
    Ok((hello.role, caps))
}

/// `unproven` counts the connection against its address until it authenticates (see
/// `admission`).
async fn handle(
    shared: Arc<Shared>,
    tcp: TcpStream,
    peer: SocketAddr,
    permit: Permit,
    unproven: Unproven,
) -> Result<(), SessionError> {
    tune(&tcp);
    // One deadline for TLS and Hello together: a client that trickles bytes cannot hold a
    // connection slot longer than this.
    let deadline = tokio::time::Instant::now() + shared.config.handshake_timeout;
    let mut stream = tokio::time::timeout_at(deadline, transport(&shared, tcp))
        .await
        .map_err(|_| SessionError::Timeout("waiting for the TLS handshake"))??;
    let (role, caps) = match tokio::time::timeout_at(deadline, read_hello(&mut stream)).await {
        Ok(Ok(hello)) => hello,
        Ok(Err(e)) => {
            let _ = send(&mut stream, &e.to_frame()).await;
            linger(&mut stream).await;
            return Err(e);
        }
        Err(_) => return Err(SessionError::Timeout("waiting for Hello")),
    };
    match role {
        Role::Control {
            token,
            session,
            secret,
        } => {
            // Its data connections may be waiting already: they wait while this one lives.
            let _opening = Opening::enter(&shared, session);
            let grant = match login(&shared, peer, &token).await {
                Ok(g) => g,
                Err(frame) => {
                    let _ = send(&mut stream, &frame).await;
                    linger(&mut stream).await;
                    let Frame::Error { code, message } = frame else {
                        unreachable!("login fails with an Error frame")
                    };
                    return Err(SessionError::Remote { code, message });
                }
            };
            drop(unproven);
            let Some(_running) = TokenSession::enter(&shared, &grant.name) else {
                let message = format!(
                    "token `{}` already runs {} sessions on this server, its most at once; \
                     try again when one ends",
                    grant.name, shared.config.max_sessions_per_token
                );
                warn!(%peer, token = %grant.name, "session refused: too many for the token");
                let _ = send(
                    &mut stream,
                    &Frame::Error {
                        code: ErrorCode::BUSY,
                        message: message.clone(),
                    },
                )
                .await;
                linger(&mut stream).await;
                return Err(SessionError::Remote {
                    code: ErrorCode::BUSY,
                    message,
                });
            };
            control_session(&shared, stream, grant, session, secret, caps).await
        }
        Role::Data {
            session,
            secret,
            stream: index,
        } => {
            // Held at most until the deadline, and no longer than the client keeps it open
            // (an attempt that failed before its session opened leaves its dials behind).
            let found = tokio::time::timeout_at(deadline, async {
                tokio::select! {
                    f = find_session(&shared, session, &secret, index) => Some(f),
                    () = closed_by_peer(&stream) => None,
                }
            })
            .await;
            let (code, message) = match found {
                Ok(Some(Found::Join(joins))) => {
                    drop(unproven);
                    crate::tcp::open_receive_window(std::os::fd::AsFd::as_fd(stream.tcp()));
                    welcome(&mut stream, session, secret).await?;
                    let _ = joins.send(Ok((index, stream, Some(permit)))).await;
                    return Ok(());
                }
                Ok(None) => return Err(SessionError::Closed("data")),
                Ok(Some(Found::NotGranted(granted))) => (
                    ErrorCode::NOT_GRANTED,
                    format!("data connection {index} not granted: the session has {granted}"),
                ),
                Ok(Some(Found::Refused | Found::Unknown)) | Err(_) => (
                    ErrorCode::AUTH,
                    "unknown session or wrong secret".to_owned(),
                ),
            };
            let refusal = Frame::Error {
                code,
                message: message.clone(),
            };
            let _ = send(&mut stream, &refusal).await;
            // A sender's data may follow its Hello.
            linger(&mut stream).await;
            Err(SessionError::Protocol(format!(
                "data connection refused: {message}"
            )))
        }
    }
}

/// Counts a session against its token's `max_sessions_per_token` while it runs.
struct TokenSession<'a>(&'a Shared, String);

impl<'a> TokenSession<'a> {
    fn enter(shared: &'a Shared, token: &str) -> Option<Self> {
        let mut map = shared.per_token.lock().unwrap_or_else(|e| e.into_inner());
        let n = map.entry(token.to_owned()).or_default();
        if *n >= shared.config.max_sessions_per_token.max(1) {
            return None;
        }
        *n += 1;
        Some(Self(shared, token.to_owned()))
    }
}

impl Drop for TokenSession<'_> {
    fn drop(&mut self) {
        let mut map = self.0.per_token.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.1);
            }
        }
    }
}

/// Resolves once the peer has closed the connection (checked every 100 ms: its unread bytes,
/// a `Hello`'s early blocks, say nothing).
async fn closed_by_peer(stream: &Stream) {
    let mut check = tokio::time::interval(Duration::from_millis(100));
    loop {
        check.tick().await;
        if crate::tcp::peer_closed(stream.tcp()) {
            return;
        }
    }
}

/// What a data connection's session says to it.
enum Found {
    Join(mpsc::Sender<Joined>),
    /// Its index is beyond the session's grant.
    NotGranted(u16),
    /// Every granted connection has joined, or the secret is wrong.
    Refused,
    /// No control connection has named the session within the grace.
    Unknown,
}

/// A session named by an open control connection (`Shared::opening`), until it closes.
struct Opening<'a>(&'a Shared, SessionId);

impl<'a> Opening<'a> {
    fn enter(shared: &'a Shared, session: SessionId) -> Self {
        *shared
            .opening
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(session)
            .or_insert(0) += 1;
        Self(shared, session)
    }
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        {
            let mut opening = self.0.opening.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = opening.get_mut(&self.1) {
                *n -= 1;
                if *n == 0 {
                    opening.remove(&self.1);
                }
            }
        }
        // Its data connections, if any still wait, are refused now rather than at their
        // deadline (once their grace is over).
        self.0.registered.notify_waiters();
    }
}

/// The session a data connection names, once the session is open to its data connections (it
/// may not be yet: the client sends the data connections' `Hello` without waiting for the
/// control connection's `Welcome`); the caller bounds the wait. A session stays registered
/// while it runs, so a connection dialled beyond the grant is refused at once, not held.
///
/// A session that no open control connection has named is waited for only for
/// `unknown_session_grace` (its control connection may say its `Hello` a little later): a
/// connection for a made-up session gives its slot back then, not at the handshake deadline.
async fn find_session(shared: &Shared, session: SessionId, secret: &[u8; 32], index: u16) -> Found {
    let grace = tokio::time::Instant::now() + shared.config.unknown_session_grace;
    loop {
        let registered = shared.registered.notified();
        tokio::pin!(registered);
        // Enabled before the look, so that a registration right after it is not missed.
        registered.as_mut().enable();
        {
            let pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(p) = pending.get(&session) {
                return if !bool::from(p.secret.ct_eq(secret)) {
                    Found::Refused
                } else if index >= p.streams {
                    Found::NotGranted(p.streams)
                } else if p.joins.is_closed() {
                    Found::Refused
                } else {
                    Found::Join(p.joins.clone())
                };
            }
        }
        let named = shared
            .opening
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&session);
        if named {
            registered.await;
        } else if tokio::time::timeout_at(grace, registered).await.is_err() {
            // One more look: registered just as the grace ended.
            let pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
            let opening = shared.opening.lock().unwrap_or_else(|e| e.into_inner());
            if !pending.contains_key(&session) && !opening.contains_key(&session) {
                return Found::Unknown;
            }
        }
    }
}

/// Closes a refused connection so that the client reads the refusal. Clients send their
/// request right behind the Hello; closing with those bytes unread would send a reset, and a
/// reset can destroy the refusal before the client has read it. So: end our side, then take
/// what the client sent until it closes too, bounded in bytes and time.
async fn linger(stream: &mut Stream) {
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

/// Checks a token, slowing down addresses that keep failing. The error is the frame to send.
async fn login(shared: &Shared, peer: SocketAddr, token: &str) -> Result<Grant, Frame> {
    let ip = peer.ip();
    let braked = shared
        .brake
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .check(ip, Instant::now());
    if let Err(wait) = braked {
        warn!(%peer, "login refused: too many failures from this address");
        return Err(Frame::Error {
            code: ErrorCode::SLOW_DOWN,
            message: format!(
                "too many failed logins from {ip}; try again in {} s",
                wait.as_secs().max(1)
            ),
        });
    }
    let list = match shared.config.access.current() {
        Ok(l) => l,
        Err(e) => {
            warn!("cannot read the token file: {e}");
            return Err(Frame::Error {
                code: ErrorCode::INTERNAL,
                message: "the server cannot read its token file; see its log".into(),
            });
        }
    };
    match list.authenticate(token) {
        Some(g) => {
            // Failures stay counted: a success with one token must not buy guesses at others.
            info!(%peer, token = %g.name, "login");
            Ok(g)
        }
        None => {
            warn!(%peer, "wrong token");
            shared
                .brake
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .failed(ip, Instant::now());
            tokio::time::sleep(shared.config.auth_failure_delay).await;
            Err(Frame::Error {
                code: ErrorCode::AUTH,
                message: "authentication failed: wrong token".into(),
            })
        }
    }
}

async fn welcome(stream: &mut Stream, session: SessionId, secret: [u8; 32]) -> std::io::Result<()> {
    let frame = Frame::Welcome {
        version: PROTOCOL_VERSION,
        capabilities: Capabilities::ours(),
        session,
        secret,
    };
    send(stream, &frame).await
}

/// The work a control connection asked for, ready to run.
enum Work<'a> {
    Done,
    /// The data connections are still joining: the engine answers offers meanwhile, and the
    /// session stays open to them (`pending`) until all have joined or it ends.
    Put {
        receiver: Arc<Receiver>,
        control: flume::Receiver<Frame>,
        block_size: u32,
        joins: Joins,
        pending: Unregister<'a>,
    },
    /// The sender started before the data connections joined: its first offers went out
    /// while they did.
    Get {
        sender: Sender,
        frames: flume::Receiver<Frame>,
        offers: flume::Receiver<Frame>,
        plan: StreamPlan,
        opts: TransferOpts,
        data: Vec<Stream>,
        permits: Vec<Permit>,
        /// Registered while the session runs (see `gather`).
        pending: Unregister<'a>,
    },
}

async fn control_session(
    shared: &Shared,
    mut stream: Stream,
    grant: Grant,
    session: SessionId,
    secret: [u8; 32],
    caps: Capabilities,
) -> Result<(), SessionError> {
    let _active = ActiveSession::enter(shared);
    // Errors before the transfer starts are reported here; the engines report their own.
    let work = match prepare(shared, &mut stream, &grant, session, secret, caps).await {
        Ok(w) => w,
        Err(e) => {
            if !matches!(e, SessionError::Io(_) | SessionError::Closed(_)) {
                let _ = send(&mut stream, &e.to_frame()).await;
                // A putting client's first offers may follow its request.
                linger(&mut stream).await;
            }
            return Err(e);
        }
    };
    let idle = shared.config.idle_timeout;
    match work {
        Work::Done => Ok(()),
        Work::Put {
            receiver,
            control,
            block_size,
            joins,
            pending,
        } => {
            receiver.forget_manifest();
            let writers = Writers::new(shared.config.writers, shared.config.tune_storage);
            let limits = Limits::new(idle, block_size);
            // Registered while it runs (closed to joins once all have joined), so that a
            // connection dialled beyond the grant is refused at once.
            let outcome = drive_receiver(
                ReceiverIo {
                    control: stream,
                    joins,
                    receiver,
                    control_out: control,
                },
                RecvRun {
                    writers,
                    limits,
                    leave_early: false,
                },
            )
            .await;
            drop(pending);
            let summary = outcome?.summary;
            info!(files = summary.files, bytes = summary.bytes, "put complete");
            Ok(())
        }
        Work::Get {
            sender,
            frames,
            offers,
            plan,
            opts,
            data,
            permits: _permits,
            pending: _pending,
        } => {
            let reporter = Arc::new(NoReporter);
            let limits = Limits::new(idle, opts.block_size);
            let io = SenderIo {
                control: stream,
                data,
                sender,
                frames,
                control_out: offers,
                reporter,
            };
            let run = SendRun {
                limits,
                plan,
                welcome: None,
                awaiting: None,
            };
            let result = drive_sender(io, run).await?;
            let (summary, sender) = (result.summary, result.sender);
            let _ = tokio::task::spawn_blocking(move || sender.finish()).await;
            info!(files = summary.files, bytes = summary.bytes, "get complete");
            Ok(())
        }
    }
}

async fn prepare<'a>(
    shared: &'a Shared,
    stream: &mut Stream,
    grant: &Grant,
    session: SessionId,
    secret: [u8; 32],
    caps: Capabilities,
) -> Result<Work<'a>, SessionError> {
    welcome(stream, session, secret).await?;
    let request = tokio::time::timeout(
        shared.config.idle_timeout,
        expect_frame(stream, MAX_CONTROL_PAYLOAD, "control"),
    )
    .await
    .map_err(|_| SessionError::Timeout("waiting for a request"))??;
    match request {
        Frame::ListRequest { path } => {
            let rel = resolve(shared, &path)?;
            let Some(prefix) = grant.read_scope(&rel) else {
                return Err(denied(grant, "list", &path));
            };
            let listed = async {
                let scope = shared.root.scope(prefix, false)?;
                list(&scope, stream, access::inside(&rel, prefix)).await
            };
            listed.await.map_err(|e| as_requested(e, &path))?;
            Ok(Work::Done)
        }
        Frame::PutRequest {
            dest,
            sources,
            opts,
        } => {
            let rel = resolve(shared, &dest)?;
            let Some(prefix) = grant.write_scope(&rel) else {
                return Err(denied(grant, "write to", &dest));
            };
            // Everything the put touches is resolved beneath its scope's directory, so a
            // symlink stored inside the scope cannot lead a write out of it.
            let asked = dest.clone();
            let dest = shared
                .root
                .scope(prefix, true)
                .map_err(SessionError::from)
                .and_then(|scope| {
                    let inner = access::inside(&rel, prefix).to_owned();
                    resolve_dest(&scope, &dest, inner, sources)
                })
                .map_err(|e| as_requested(e, &asked))?;
            let opts = clamp(shared, opts);
            // Creating the destination may fail (not a directory, outside the root): find out
            // before any data connection is opened, and tell the client why.
            let (tx, control) = flume::unbounded();
            let config = ReceiverConfig {
                existing: opts.existing,
                checksum: opts.checksum,
                tag: session.0,
                block_size: opts.block_size,
                modes: shared.config.modes,
                // What a stored link points to is the writer's business: the server itself
                // never follows one out of the scope it was written in.
                links: Links::Any,
            };
            let receiver = Receiver::new(dest, config, tx, Arc::new(NoReporter))
                .map_err(|e| as_requested(e.into(), &asked))?;
            let (joins, pending) = announce(shared, stream, session, secret, &opts).await?;
            Ok(Work::Put {
                receiver,
                control,
                block_size: opts.block_size,
                joins,
                pending,
            })
        }
        Frame::GetRequest { src, opts } => {
            let rel = resolve(shared, &src)?;
            let Some(prefix) = grant.read_scope(&rel) else {
                return Err(denied(grant, "read", &src));
            };
            let inner = access::inside(&rel, prefix).to_owned();
            let scope = shared
                .root
                .scope(prefix, false)
                .and_then(|scope| scope.lstat(&inner).map(|_| scope))
                .map_err(|e| as_requested(e.into(), &src))?;
            let name = path::split_parent(&rel).1;
            let name = if name.is_empty() {
                "root".to_owned()
            } else {
                name.to_owned()
            };
            let source = Source {
                root: scope,
                rel: inner,
                name,
            };
            let opts = clamp(shared, opts);
            // The walk starts now and its offers go out while the data connections join: a
            // client that answers them meanwhile has its decisions here when they have.
            let plan = StreamPlan {
                tune_storage: shared.config.tune_storage,
                early_tuned: caps.has(Capabilities::EARLY_TUNED),
                helpers: ramp_helpers_asked(caps, &opts),
                ..StreamPlan::from_opts(&opts)
            };
            let (tx, frames) = frame_queue(&plan, opts.streams);
            let (ctl_tx, offers) = flume::unbounded();
            let config = SenderConfig {
                block_size: opts.block_size,
                streams: opts.streams,
                checksum: opts.checksum,
                readers: crate::autotune::storage_gate(
                    shared.config.readers,
                    shared.config.tune_storage,
                ),
                corrupt_blocks: Vec::new(),
                digest_cache: Arc::default(),
            };
            let sender = Sender::start(vec![source], config, tx, ctl_tx, Arc::new(NoReporter));
            // The grant is this server's own: blocks are cut by it from the first.
            sender.grant(opts.block_size, opts.streams);
            let gathered = gather(shared, stream, session, secret, &opts, Some(&offers)).await;
            let (data, permits, pending) = match gathered {
                Ok(g) => g,
                Err(e) => {
                    sender.close();
                    return Err(e);
                }
            };
            Ok(Work::Get {
                sender,
                frames,
                offers,
                plan,
                opts,
                data,
                permits,
                pending,
            })
        }
        probe @ Frame::ProbeRequest { .. } => {
            crate::probe::serve(shared, stream, grant, session, secret, probe).await?;
            Ok(Work::Done)
        }
        other => Err(SessionError::Protocol(format!(
            "unexpected {:?} as a request",
            other.frame_type()
        ))),
    }
}

/// A remote path as a path under the root: absolute paths from the root, relative ones from
/// the configured base.
fn resolve(shared: &Shared, raw: &str) -> Result<String, SessionError> {
    let rel = path::normalize_remote(raw).map_err(FsError::from)?;
    if raw.starts_with('/') || shared.config.base.is_empty() {
        Ok(rel)
    } else {
        Ok(path::join(&shared.config.base, &rel))
    }
}

/// A failure to find or open the path a request named, named as the client wrote it: the file
/// system names the component it stopped at (`no` for `/no/such`), which the client never typed.
fn as_requested(e: SessionError, raw: &str) -> SessionError {
    match e {
        SessionError::Fs(FsError::Io { cause, .. }) => SessionError::Fs(FsError::Io {
            path: raw.to_owned(),
            cause,
        }),
        SessionError::Fs(FsError::Escapes { .. }) => SessionError::Fs(FsError::Escapes {
            path: raw.to_owned(),
        }),
        other => other,
    }
}

fn denied(grant: &Grant, what: &str, path: &str) -> SessionError {
    SessionError::Remote {
        code: ErrorCode::DENIED,
        message: format!(
            "permission denied: token `{}` may not {what} `{path}`",
            grant.name
        ),
    }
}

/// The ramp helpers among a get's granted connections: those beyond the 16 an auto-tuned
/// client tunes, when the client says it means them so (`Capabilities::RAMP_HELPERS`). A client
/// without the bit has every connection tuned, as before.
fn ramp_helpers_asked(caps: Capabilities, opts: &TransferOpts) -> u16 {
    if !opts.is_auto() || !caps.has(Capabilities::RAMP_HELPERS) {
        return 0;
    }
    opts.streams.saturating_sub(ferry_proto::RAMP_HELPERS_FROM)
}

/// Lowers what a client asked for to what this server allows, keeping memory bounded.
fn clamp(shared: &Shared, mut opts: TransferOpts) -> TransferOpts {
    let config = &shared.config;
    opts.streams = opts.streams.clamp(1, config.max_streams.max(1));
    if opts.is_auto() {
        // An auto-tuned session opens connections it may never use. Beyond its starting count,
        // it gets at most an eighth of the free connection slots, so that a burst of clients
        // fills the cap with sessions, not with idle spares (32 clients × 16 would exceed 512).
        let spare = (shared.connections.available_permits() / 8) as u16;
        let floor = opts.auto_start.max(1);
        opts.streams = opts.streams.min(floor.max(spare)).max(1);
        opts.auto_start = opts.auto_start.min(opts.streams);
    }
    // Frames in flight per session: one per stream, the writer queue and one per writer.
    let slots = u64::from(opts.streams) + 3 * config.writers.max(1) as u64;
    // Never below `MIN_GRANTED_BLOCK` (unless asked): a client's early blocks are cut to it.
    while u64::from(opts.block_size) * slots > config.session_memory
        && opts.block_size > ferry_proto::MIN_GRANTED_BLOCK
    {
        opts.block_size = (opts.block_size / 2).max(ferry_proto::MIN_GRANTED_BLOCK);
    }
    opts
}

/// Keeps a session open to its data connections while it lives.
pub(crate) struct Unregister<'a>(&'a Shared, SessionId);

impl Drop for Unregister<'_> {
    fn drop(&mut self) {
        self.0
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.1);
    }
}

/// Opens the session to its data connections and announces its parameters (`Ready`); the
/// connections join through the returned channel until the guard is dropped.
async fn announce<'a>(
    shared: &'a Shared,
    stream: &mut Stream,
    session: SessionId,
    secret: [u8; 32],
    opts: &TransferOpts,
) -> Result<(Joins, Unregister<'a>), SessionError> {
    let n = opts.streams as usize;
    let (tx, rx) = mpsc::channel(n);
    {
        let mut pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
        // The client chose the identity; one already open is not taken over.
        if pending.contains_key(&session) {
            return Err(SessionError::Protocol(
                "a session with this identity is already open".into(),
            ));
        }
        pending.insert(
            session,
            Pending {
                secret,
                streams: opts.streams,
                joins: tx,
            },
        );
    }
    shared.registered.notify_waiters();
    let guard = Unregister(shared, session);
    send(
        stream,
        &Frame::Ready {
            streams: opts.streams,
            block_size: opts.block_size,
        },
    )
    .await?;
    let deadline = tokio::time::Instant::now() + shared.config.handshake_timeout;
    Ok((Joins::new(rx, n, deadline, opts.tcp_window), guard))
}

/// Announces the session's parameters and waits for all its data connections (a `get` and a
/// probe, whose server sends on them; a `put`'s server answers offers meanwhile instead). A
/// get's `offers` are written to the control connection meanwhile.
///
/// The returned guard keeps the session registered (closed to joins) while the caller runs it,
/// so that a connection dialled beyond the grant is refused at once rather than held.
pub(crate) async fn gather<'a>(
    shared: &'a Shared,
    stream: &mut Stream,
    session: SessionId,
    secret: [u8; 32],
    opts: &TransferOpts,
    mut offers: Option<&flume::Receiver<Frame>>,
) -> Result<(Vec<Stream>, Vec<Permit>, Unregister<'a>), SessionError> {
    let (mut joins, guard) = announce(shared, stream, session, secret, opts).await?;
    let deadline = joins.deadline();
    let mut slots: Vec<Option<Stream>> = (0..opts.streams).map(|_| None).collect();
    // A client that gives up (a data connection refused as busy, say) closes its control
    // connection: notice it, rather than hold what already joined until the deadline. Peeked
    // on the socket, never read: a client may already be sending frames that belong to the
    // engine (a get's decisions, or its error). Once bytes wait there a peek says nothing
    // more, so the connection's TCP state is checked instead.
    let mut watch_control = true;
    while !joins.complete() {
        let mut probe = [0u8; 1];
        let (index, s) = tokio::select! {
            j = joins.next() => j?,
            r = stream.tcp().peek(&mut probe), if watch_control => {
                match r {
                    Ok(0) | Err(_) => return Err(SessionError::Closed("control")),
                    Ok(_) => watch_control = false,
                }
                continue;
            }
            () = closed_by_peer(stream), if !watch_control => {
                return Err(SessionError::Closed("control"));
            }
            f = async move { offers.expect("polled only with offers").recv_async().await },
                if offers.is_some() =>
            {
                match f {
                    // Bounded like the joining: a client that reads nothing holds nothing.
                    Ok(frame) => tokio::time::timeout_at(deadline, send(stream, &frame))
                        .await
                        .map_err(|_| SessionError::Timeout("waiting for the client to read offers"))??,
                    Err(_) => offers = None,
                }
                continue;
            }
        };
        slots[index] = Some(s);
    }
    let data = slots.into_iter().flatten().collect();
    Ok((data, joins.into_permits(), guard))
}

/// Where a put lands: inside `dest` if it is a directory (or clearly meant as one), else
/// under the name `dest` itself, like `cp`.
fn resolve_dest(
    root: &Root,
    dest: &str,
    rel: String,
    sources: u32,
) -> Result<Destination, SessionError> {
    let is_dir = match root.lstat(&rel) {
        Ok(m) => m.kind == Kind::Dir,
        Err(e) if e.is_not_found() => false,
        Err(e) => return Err(e.into()),
    };
    let dest = if is_dir || dest.ends_with('/') || sources > 1 || rel.is_empty() {
        Destination {
            root: root.subroot("")?,
            base: rel,
            rename_top: None,
        }
    } else {
        let (parent, name) = path::split_parent(&rel);
        Destination {
            root: root.subroot("")?,
            base: parent.to_owned(),
            rename_top: Some(name.to_owned()),
        }
    };
    Ok(dest)
}

async fn list(root: &Root, stream: &mut Stream, rel: &str) -> Result<(), SessionError> {
    let rel = rel.to_owned();
    let meta = root.lstat(&rel)?;
    let entry = |name: String, m: ferry_core::root::Meta| ListEntry {
        name,
        kind: match m.kind {
            Kind::File => ferry_proto::EntryKind::File,
            Kind::Dir => ferry_proto::EntryKind::Dir,
            Kind::Symlink => ferry_proto::EntryKind::Symlink,
            Kind::Other => ferry_proto::EntryKind::Other,
        },
        size: m.size,
        mode: m.mode,
        mtime_ns: m.mtime_ns,
    };
    let mut entries = Vec::new();
    if meta.kind == Kind::Dir {
        for (name, _) in root.read_dir(&rel)?.entries {
            if let Ok(m) = root.lstat(&path::join(&rel, &name)) {
                entries.push(entry(name, m));
            }
        }
    } else {
        entries.push(entry(path::split_parent(&rel).1.to_owned(), meta));
    }
    for chunk in entries.chunks(MAX_LIST_ENTRIES) {
        send(
            stream,
            &Frame::ListEntries {
                entries: chunk.to_vec(),
            },
        )
        .await?;
    }
    send(stream, &Frame::ListEnd).await?;
    Ok(())
}
