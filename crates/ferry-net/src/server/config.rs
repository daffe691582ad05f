//! What a server is told at start: its root, its tokens, its TLS identity and its limits.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::recv::Modes;

use super::access::{Access, AccessList};
use crate::transport::tls::Identity;

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
    /// The most catalog requests one control connection carries (a catalog session, with
    /// `Capabilities::CATALOG_SESSION`); 0: one request a connection, as a server without the bit.
    pub catalog_session_requests: u32,
    /// How long a catalog session waits for its next request before it ends.
    pub catalog_session_idle: Duration,
    /// Delay before answering a wrong token, so guessing is slow.
    pub auth_failure_delay: Duration,
    /// Reader threads (get) and writer threads (put) a session starts with.
    pub readers: usize,
    pub writers: usize,
    /// Tune each session's reader or writer threads while it runs, from that start.
    pub tune_storage: bool,
    /// Most reader or writer threads one session may run: what a client may ask for
    /// (`TransferOpts::storage_threads`) and how far tuning may grow a pool. Default: the
    /// host's cores, at least [`crate::AUTO_MAX_STORAGE_THREADS`].
    pub max_storage_threads: usize,
    /// Partial files and journals untouched for this long are removed by the periodic scan.
    pub partial_max_age: Duration,
    /// How often the root is scanned for such leftovers.
    pub partial_scan_interval: Duration,
    /// Which permission bits a put stores (setuid, setgid and world-write cleared by default).
    pub modes: Modes,
    /// Take part in third-party copies (`serve --third-party`): mint grants that let another
    /// server put here, and copy to another server when a client asks. Off by default: a
    /// source dials out wherever its clients say.
    pub third_party: bool,
    /// How long a grant stays usable before its first use, and between a failed session and
    /// the source's retry.
    pub grant_ttl: Duration,
    /// The `host:port` addresses a multipath client is told to dial its data connections to,
    /// one per network path (`Paths`). Empty: every address the server listens on when it
    /// listens on several, else the one the client's control connection reached.
    pub paths: Vec<String>,
    /// Take stripe sessions (`serve --stripe`): write the blocks of a striped put into the
    /// partial copies that another server on the same shared file system opened. Off by
    /// default: only a server that shares its file system with its peers needs it.
    pub stripe: bool,
    /// Where every stored file is registered (`serve --catalog`); `None`: nowhere. Its
    /// leftover intents are reconciled when the server binds.
    pub catalog: Option<Arc<ferry_catalog::Catalog>>,
    /// Bytes a second that `ferry verify` audits may read, all of them together (`serve
    /// --verify-rate`; 0: unlimited), so that an audit cannot starve transfers.
    pub verify_rate: u64,
    /// Declarative policies per path prefix (`[[policy]]` in `ferry serve --config`):
    /// replicas on peers, retention, digest algorithm. Empty: none.
    pub policies: Arc<super::policy::Policies>,
    /// The longest wait between two tries of a replication a policy owes.
    pub policy_retry_max: Duration,
    /// Paths replicated at once (each a put to one peer at a time).
    pub policy_concurrency: usize,
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
            catalog_session_requests: 10_000,
            catalog_session_idle: Duration::from_secs(30),
            auth_failure_delay: Duration::from_secs(1),
            readers: 4,
            writers: 4,
            tune_storage: true,
            max_storage_threads: crate::autotune::cores().max(crate::AUTO_MAX_STORAGE_THREADS)
                as usize,
            partial_max_age: Duration::from_secs(24 * 3600),
            partial_scan_interval: Duration::from_secs(3600),
            modes: Modes::default(),
            third_party: false,
            grant_ttl: Duration::from_secs(60),
            paths: Vec::new(),
            stripe: false,
            catalog: None,
            verify_rate: 256 << 20,
            policies: Arc::default(),
            policy_retry_max: Duration::from_secs(600),
            policy_concurrency: 4,
        }
    }

    /// A session's storage pool: `default` threads tuned from there (the server's choice), or
    /// the number the client asked for (`TransferOpts::storage_threads`), fixed, within
    /// [`Self::max_storage_threads`]. Returns (threads, tune, most threads).
    pub(crate) fn storage_pool(&self, default: usize, asked: u16) -> (usize, bool, usize) {
        let most = self.max_storage_threads.max(1);
        match asked {
            0 => (default.clamp(1, most), self.tune_storage, most),
            n => {
                let n = usize::from(n).min(most);
                (n, false, n)
            }
        }
    }
}
