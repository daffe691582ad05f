//! The accept loop: a connection cap, a per-address cap on connections not logged in yet,
//! refusals answered with `BUSY`, a periodic scan for stale partial files, and graceful
//! shutdown. An error in one connection is logged and never reaches the listener (the
//! mini-redis skeleton).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::Root;
use ferry_proto::{ErrorCode, Frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, OwnedSemaphorePermit as Permit, Semaphore};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use super::config::ServerConfig;
use super::session::handle;
use super::state::{IdleProbe, ServerState};
use crate::error::SessionError;
use crate::transport::conn::send;
use crate::transport::stream::Stream;
use crate::transport::tcp;

pub struct Server {
    /// One per address the server listens on (`--listen` repeated: one per network path).
    listeners: Vec<TcpListener>,
    shared: Arc<ServerState>,
    /// What the catalog's reconciliation at bind did (`None`: no catalog).
    reconciled: Option<ferry_catalog::Reconciled>,
}

impl Server {
    pub async fn bind(addr: SocketAddr, config: ServerConfig) -> Result<Self, SessionError> {
        Self::bind_all(&[addr], config).await
    }

    /// Listens on every one of `addrs` (at least one), all serving the same sessions: a data
    /// connection may join its session through any of them. With several and no
    /// `config.paths`, they are what a multipath client is told (`Paths`).
    pub async fn bind_all(
        addrs: &[SocketAddr],
        mut config: ServerConfig,
    ) -> Result<Self, SessionError> {
        if addrs.is_empty() {
            return Err(SessionError::Io(std::io::Error::other(
                "no address to listen on",
            )));
        }
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
        let mut listeners = Vec::with_capacity(addrs.len());
        for addr in addrs {
            listeners.push(listen(*addr)?);
        }
        if config.paths.is_empty() && listeners.len() > 1 {
            for l in &listeners {
                config.paths.push(l.local_addr()?.to_string());
            }
        }
        // Before any session: what a crash left in flight is settled first.
        let reconciled = match config.catalog.clone() {
            Some(catalog) => {
                super::catalog::log_register_errors(&catalog);
                // Before the intents are reconciled: a crash's files owe their replicas too.
                if !config.policies.is_empty() {
                    let policies = config.policies.clone();
                    catalog.set_wanted(Arc::new(move |p: &str| policies.wanted(p)));
                }
                let dir = config.root.clone();
                let done =
                    tokio::task::spawn_blocking(move || super::catalog::reconcile(&catalog, &dir))
                        .await
                        .map_err(|e| SessionError::Io(std::io::Error::other(e)))??;
                Some(done)
            }
            None => None,
        };
        Ok(Self {
            listeners,
            shared: Arc::new(ServerState::new(config, root, tls)),
            reconciled,
        })
    }

    /// What the catalog's reconciliation at bind did: intents registered and dropped.
    pub fn reconciled(&self) -> Option<ferry_catalog::Reconciled> {
        self.reconciled
    }

    /// The first address the server listens on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listeners[0].local_addr()
    }

    /// Every address the server listens on.
    pub fn local_addrs(&self) -> std::io::Result<Vec<SocketAddr>> {
        self.listeners.iter().map(TcpListener::local_addr).collect()
    }

    /// How long no session has been running (zero while one runs): `serve --oneshot` exits
    /// when this grows too long.
    pub fn idle_probe(&self) -> IdleProbe {
        IdleProbe(self.shared.clone())
    }

    /// The server's counters, readable while it runs (`ferry serve --metrics-listen`).
    pub fn metrics(&self) -> super::MetricsView {
        super::MetricsView(self.shared.clone())
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
                           // Aborted at shutdown: a replication cut off stays owed, for the next start.
        let replicator = tokio::spawn(super::replicate::run(self.shared.clone()));
        loop {
            let accepted = tokio::select! {
                a = accept_any(&self.listeners) => a,
                _ = &mut shutdown => break,
                Some(_) = tasks.join_next() => continue,
                _ = scan.tick() => {
                    tasks.spawn(scan_in_background(self.shared.config.clone()));
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
            self.admit(stream, peer, &refusals, &stop_tx, &mut tasks);
        }
        info!(
            "shutting down: no new connections; ending {} active",
            tasks.len()
        );
        drop(self.listeners);
        replicator.abort();
        let _ = stop_tx.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
    }

    /// Serves an accepted connection in its own task until it ends or `stop` says so, or
    /// refuses it as busy when its address or the server is at its cap.
    fn admit(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        refusals: &Arc<Semaphore>,
        stop: &broadcast::Sender<()>,
        tasks: &mut JoinSet<()>,
    ) {
        // Per address first: a flood from one address is turned away before it takes a
        // slot that anyone else could have had.
        let Some(unproven) = self.shared.unproven.admit(peer.ip()) else {
            self.shared.metrics.refused_busy();
            debug!(%peer, "refused: too many unauthenticated connections from this address");
            if let Ok(p) = refusals.clone().try_acquire_owned() {
                let message = format!(
                    "too many connections from {} that have not logged in ({}); try again",
                    peer.ip(),
                    self.shared.unproven.cap()
                );
                tasks.spawn(refuse_busy(stream, p, message));
            }
            return;
        };
        let Ok(permit) = self.shared.connections.clone().try_acquire_owned() else {
            self.shared.metrics.refused_busy();
            if let Ok(p) = refusals.clone().try_acquire_owned() {
                let message = "server is at its connection limit; try again".to_owned();
                tasks.spawn(refuse_busy(stream, p, message));
            }
            return;
        };
        let shared = self.shared.clone();
        let mut stop = stop.subscribe();
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
}

/// Removes stale partial transfers under the root, off the async threads, and logs the count.
async fn scan_in_background(c: ServerConfig) {
    let now = std::time::SystemTime::now();
    let r = tokio::task::spawn_blocking(move || {
        ferry_core::partials::scan(&c.root, c.partial_max_age, now)
    })
    .await;
    if let Ok(r) = r {
        info!(
            kept_files = r.kept_files,
            kept_bytes = r.kept_bytes,
            removed_files = r.removed_files,
            removed_bytes = r.removed_bytes,
            "partial transfers scanned"
        );
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

/// A listening socket on `addr`. A deep accept queue: with the default (128), a burst of
/// connections beyond it sees a connection the server never accepted, and hangs instead of
/// getting BUSY.
fn listen(addr: SocketAddr) -> Result<TcpListener, SessionError> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    tcp::open_listen_window(&socket);
    if tcp::fast_open() {
        // Inert unless the host allows server-side Fast Open (DESIGN.md, "TCP").
        let _ = tcp::allow_fast_open_listen(std::os::fd::AsFd::as_fd(&socket));
    }
    Ok(socket.listen(4096)?)
}

/// The next connection on any of the listeners.
async fn accept_any(listeners: &[TcpListener]) -> std::io::Result<(TcpStream, SocketAddr)> {
    std::future::poll_fn(|cx| {
        for l in listeners {
            if let std::task::Poll::Ready(r) = l.poll_accept(cx) {
                return std::task::Poll::Ready(r);
            }
        }
        std::task::Poll::Pending
    })
    .await
}
