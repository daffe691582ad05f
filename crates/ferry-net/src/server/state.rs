//! What every connection of a server shares: its configuration, root, TLS acceptor, limits and
//! session registry, and the count of sessions running.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_core::Root;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use super::admission::{LoginBrake, PerAddress, PerToken};
use super::config::ServerConfig;
use super::grants::Grants;
use super::metrics::Metrics;
use super::registry::Registry;

pub(super) struct ServerState {
    pub(super) config: ServerConfig,
    pub(super) root: Root,
    pub(super) tls: Option<TlsAcceptor>,
    pub(super) brake: Mutex<LoginBrake>,
    /// The connection cap; auto-tuned sessions size their spare connections by what is free.
    pub(super) connections: Arc<Semaphore>,
    /// When the last session ended (or the server started), for `serve --oneshot`'s exit.
    last_session_end: Mutex<Instant>,
    pub(super) registry: Registry,
    /// Connections not authenticated yet, per address.
    pub(super) unproven: Arc<PerAddress>,
    /// Sessions running now, per token name.
    pub(super) per_token: PerToken,
    /// Third-party grants minted and not revoked.
    pub(super) grants: Grants,
    /// What third-party copies learnt of each destination, so that the next copy there
    /// starts from it.
    pub(super) paths: Mutex<std::collections::HashMap<String, Remembered>>,
    /// Sessions running now; when the last ends, idle buffers go back to the system.
    active: AtomicUsize,
    /// What the server has done, for `/metrics`.
    pub(super) metrics: Arc<Metrics>,
    /// The pace all `ferry verify` audits share (`verify_rate`).
    pub(super) verify_pace: Arc<super::verify::Pace>,
}

impl ServerState {
    pub(super) fn new(config: ServerConfig, root: Root, tls: Option<TlsAcceptor>) -> Self {
        let connections = Arc::new(Semaphore::new(config.max_connections));
        // A client dials its control connection and every data connection together: a cap
        // below that would refuse one of its own connections.
        let one_client = usize::from(config.max_streams) + 1;
        let unproven = PerAddress::new(config.max_unauthenticated_per_address.max(one_client));
        Self {
            registry: Registry::new(config.handshake_timeout, config.unknown_session_grace),
            per_token: PerToken::new(config.max_sessions_per_token),
            grants: Grants::new(config.grant_ttl),
            paths: Mutex::default(),
            verify_pace: Arc::new(super::verify::Pace::new(config.verify_rate)),
            config,
            root,
            tls,
            brake: Mutex::default(),
            connections,
            last_session_end: Mutex::new(Instant::now()),
            unproven,
            active: AtomicUsize::default(),
            metrics: Arc::default(),
        }
    }

    pub(super) fn active_sessions(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }
}

impl ServerState {
    /// A remote path as a path under the root: absolute paths from the root, relative ones
    /// from the configured base; `..` and the like are refused (`normalize_remote`).
    pub(super) fn resolve(&self, raw: &str) -> Result<String, crate::error::SessionError> {
        let rel = ferry_core::path::normalize_remote(raw).map_err(ferry_core::FsError::from)?;
        if raw.starts_with('/') || self.config.base.is_empty() {
            Ok(rel)
        } else {
            Ok(ferry_core::path::join(&self.config.base, &rel))
        }
    }
}

/// What a source remembers of a destination from its last copies there.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Remembered {
    /// The streams the tuner held at the end, and whether its search had ended.
    pub(super) streams: Option<(u16, bool)>,
    /// The path's round trip (µs) and rate (bytes/s), for ramp helpers.
    pub(super) path: Option<(u64, u64)>,
}

/// Counts a running session; the last one to end releases idle block buffers, so a daemon
/// between bursts does not keep hundreds of MiB it no longer needs.
pub(super) struct ActiveSession<'a>(&'a ServerState);

impl<'a> ActiveSession<'a> {
    pub(super) fn enter(shared: &'a ServerState) -> Self {
        shared.active.fetch_add(1, Ordering::AcqRel);
        Self(shared)
    }
}

impl Drop for ActiveSession<'_> {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::AcqRel) == 1 {
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

/// See [`Server::idle_probe`](super::Server::idle_probe).
#[derive(Clone)]
pub struct IdleProbe(pub(super) Arc<ServerState>);

impl IdleProbe {
    pub fn idle_for(&self) -> Duration {
        if self.0.active.load(Ordering::Acquire) > 0 {
            return Duration::ZERO;
        }
        self.0
            .last_session_end
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
    }
}
