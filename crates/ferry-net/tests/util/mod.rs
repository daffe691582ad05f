//! Shared helpers: a real server on 127.0.0.1:0 in a temp dir, a client config, tree builders,
//! and digests computed independently of ferry's own code path (std::fs + blake3 directly).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferry_net::{ClientConfig, Fingerprint, Security, Server, ServerConfig, ServerTrust};
use ferry_proto::{ChecksumAlgo, ExistingPolicy, TransferOpts};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

pub const TOKEN: &str = "test-token-0123456789";
/// Small blocks make block boundaries cheap to test.
pub const BLOCK: u32 = 64 * 1024;

/// `RUST_LOG=ferry_net=debug` shows what client and server did, in the test's output (which
/// nextest prints for a failing test): how an intermittent failure gets explained.
pub fn log_if_asked() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub root: PathBuf,
    /// `None` when the test configured a plain-TCP-only server.
    pub fingerprint: Option<Fingerprint>,
    /// How long no session has run: zero while one does.
    pub idle: ferry_net::server::IdleProbe,
    _dir: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(f: impl FnOnce(&mut ServerConfig)) -> Self {
        Self::start_in(tempfile::tempdir().unwrap(), f).await
    }

    /// Like `start_with`, with the server's root inside `dir` (which the server then owns).
    pub async fn start_in(dir: tempfile::TempDir, f: impl FnOnce(&mut ServerConfig)) -> Self {
        log_if_asked();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let mut config = ServerConfig::new(&root, TOKEN);
        config.auth_failure_delay = Duration::from_millis(50);
        config.handshake_timeout = Duration::from_secs(2);
        // Raw frame clients (the hostile-input tests) speak plain TCP; the client API uses TLS.
        config.allow_plaintext = true;
        f(&mut config);
        let fingerprint = config.tls.as_ref().map(|id| id.fingerprint());
        let server = Server::bind("127.0.0.1:0".parse().unwrap(), config)
            .await
            .unwrap();
        let addr = server.local_addr().unwrap();
        let idle = server.idle_probe();
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(server.run(async {
            let _ = rx.await;
        }));
        Self {
            addr,
            root,
            fingerprint,
            idle,
            _dir: dir,
            stop: Some(tx),
            task: Some(task),
        }
    }

    /// A TLS client pinned to this server's key (plain TCP if the server has no key).
    pub fn client(&self) -> ClientConfig {
        let mut c = client_config(self.addr.to_string());
        if let Some(fp) = self.fingerprint {
            c.security = Security::Tls(ServerTrust::Pinned(fp));
        }
        c
    }

    /// Ends the server at once, as a kill -9 of its process would: every task it runs is
    /// dropped where it stands, no session ends cleanly.
    pub fn kill(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(15), t)
                .await
                .expect("server stops")
                .unwrap();
        }
    }
}

/// The client configuration the tests use, for any server address (a fake server's too).
pub fn client_config(server: String) -> ClientConfig {
    ClientConfig {
        server,
        token: TOKEN.into(),
        opts: TransferOpts {
            streams: 4,
            block_size: BLOCK,
            checksum: ChecksumAlgo::Blake3,
            existing: ExistingPolicy::Fail,
            tcp_window: 0,
            auto_start: 0,
            storage_threads: 0,
        },
        readers: 3,
        writers: 3,
        tune_storage: false,
        storage_from: "fixed",
        block_from: "fixed",
        connect_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(20),
        corrupt_blocks: Vec::new(),
        retry_for: Duration::ZERO,
        // Fake servers in the tests speak plain frames; `TestServer::client` switches to TLS.
        security: Security::Plaintext,
        start_from: Default::default(),
        force_streams: None,
        stall_stream: None,
        drain_at_end: false,
        helpers: 0,
        modes: Default::default(),
        links: Default::default(),
        multipath: false,
        bind: Vec::new(),
        stripe: Vec::new(),
    }
}

/// Puts `file` to `/`, retrying while the server answers busy: a server frees a connection slot
/// just after it closes the socket, so a client right behind a refused flood may still meet it.
/// Panics if it is still busy after `tries`.
pub async fn put_past_busy(
    cfg: &ClientConfig,
    file: &Path,
    tries: u32,
    pause: Duration,
) -> Result<ferry_net::TransferReport, ferry_net::SessionError> {
    for _ in 0..tries {
        match ferry_net::client::put(cfg, &[file.to_owned()], "/", reporter()).await {
            Err(ferry_net::SessionError::Remote { code, .. })
                if code == ferry_proto::ErrorCode::BUSY =>
            {
                tokio::time::sleep(pause).await;
            }
            other => return other,
        }
    }
    panic!("still busy after {tries} tries");
}

pub fn reporter() -> Arc<dyn ferry_core::Reporter> {
    Arc::new(ferry_core::NoReporter)
}

/// A reporter that counts the bytes reported.
#[derive(Default)]
pub struct CountBytes(pub AtomicU64);

impl ferry_core::Reporter for CountBytes {
    fn on_bytes(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
}

/// Deterministic pseudo-random bytes (xorshift), so content differs across offsets.
pub fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

pub fn write(path: &Path, data: &[u8]) {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).unwrap();
    }
    std::fs::write(path, data).unwrap();
}

/// What a tree looks like: relative path → (kind, digest or link target, mode, mtime secs).
pub fn snapshot(root: &Path) -> BTreeMap<String, (char, String, u32, i64)> {
    let mut out = BTreeMap::new();
    fn go(base: &Path, dir: &Path, out: &mut BTreeMap<String, (char, String, u32, i64)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let p = e.path();
            let rel = p.strip_prefix(base).unwrap().to_string_lossy().into_owned();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let ft = m.file_type();
            if ft.is_symlink() {
                out.insert(
                    rel,
                    (
                        'l',
                        std::fs::read_link(&p)
                            .unwrap()
                            .to_string_lossy()
                            .into_owned(),
                        0,
                        0,
                    ),
                );
            } else if ft.is_dir() {
                out.insert(
                    rel,
                    (
                        'd',
                        String::new(),
                        m.permissions().mode() & 0o7777,
                        m.mtime(),
                    ),
                );
                go(base, &p, out);
            } else {
                let digest = blake3::hash(&std::fs::read(&p).unwrap())
                    .to_hex()
                    .to_string();
                out.insert(
                    rel,
                    ('f', digest, m.permissions().mode() & 0o7777, m.mtime()),
                );
            }
        }
    }
    go(root, root, &mut out);
    out
}

/// Names in a tree that look like ferry's temporary files.
pub fn leftovers(root: &Path) -> Vec<String> {
    snapshot(root)
        .into_keys()
        .filter(|k| k.contains(".ferry-"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Raw protocol access, for tests that play a misbehaving peer, and cheap tree inspection.

/// A bare TCP connection that speaks frames, with every read bounded in time.
pub struct Raw {
    pub stream: tokio::net::TcpStream,
}

/// What a bounded read of one frame found.
#[derive(Debug)]
pub enum Read {
    Frame(ferry_proto::Frame),
    /// The peer closed (EOF at a frame boundary, or a reset).
    Closed,
    TimedOut,
}

impl Raw {
    pub async fn connect(addr: SocketAddr) -> Self {
        let stream =
            tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
                .await
                .expect("connect in time")
                .expect("connect");
        Self { stream }
    }

    pub fn from_stream(stream: tokio::net::TcpStream) -> Self {
        Self { stream }
    }

    pub async fn send(&mut self, frame: &ferry_proto::Frame) -> std::io::Result<()> {
        let mut buf = bytes::BytesMut::new();
        frame.encode(&mut buf);
        self.send_bytes(&buf).await
    }

    pub async fn send_bytes(&mut self, b: &[u8]) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        self.stream.write_all(b).await?;
        self.stream.flush().await
    }

    /// Reads one frame, waiting at most `within`. A malformed frame panics: tests only read
    /// frames from ferry, which must be well-formed.
    pub async fn recv(&mut self, within: Duration) -> Read {
        use tokio::io::AsyncReadExt;
        let fut = async {
            let mut head = [0u8; ferry_proto::HEADER_LEN];
            match self.stream.read_exact(&mut head).await {
                Ok(_) => {}
                Err(_) => return Read::Closed,
            }
            let header = ferry_proto::FrameHeader::parse(&head).expect("valid frame header");
            let mut payload = vec![0u8; header.len as usize];
            if self.stream.read_exact(&mut payload).await.is_err() {
                return Read::Closed;
            }
            Read::Frame(ferry_proto::Frame::decode(header.ty, payload.into()).expect("valid frame"))
        };
        tokio::time::timeout(within, fut)
            .await
            .unwrap_or(Read::TimedOut)
    }

    /// Reads one frame that must arrive within `within`.
    pub async fn expect(&mut self, within: Duration) -> ferry_proto::Frame {
        match self.recv(within).await {
            Read::Frame(f) => f,
            other => panic!("expected a frame, got {other:?}"),
        }
    }

    /// Reads (and discards) until the peer closes; false if it is still open after `within`.
    pub async fn closed_within(&mut self, within: Duration) -> bool {
        use tokio::io::AsyncReadExt;
        let fut = async {
            let mut buf = [0u8; 4096];
            loop {
                match self.stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        };
        tokio::time::timeout(within, fut).await.is_ok()
    }
}

/// A control `Hello` for a new session: a random identity and secret, as a client chooses
/// them (`session_of` reads them back).
pub fn hello_control(token: &str) -> ferry_proto::Frame {
    use std::hash::BuildHasher;
    let random = || std::collections::hash_map::RandomState::new().hash_one(0u8);
    let mut secret = [0u8; 32];
    for chunk in secret.chunks_mut(8) {
        chunk.copy_from_slice(&random().to_le_bytes());
    }
    ferry_proto::Frame::Hello {
        version: ferry_proto::PROTOCOL_VERSION,
        capabilities: ferry_proto::Capabilities::ours(),
        role: ferry_proto::Role::Control {
            token: token.into(),
            session: ferry_proto::SessionId(random()),
            secret,
        },
    }
}

/// The session identity and secret a control `Hello` chose.
pub fn session_of(hello: &ferry_proto::Frame) -> (ferry_proto::SessionId, [u8; 32]) {
    match hello {
        ferry_proto::Frame::Hello {
            role: ferry_proto::Role::Control {
                session, secret, ..
            },
            ..
        } => (*session, *secret),
        other => panic!("not a control Hello: {other:?}"),
    }
}

pub fn hello_data(
    session: ferry_proto::SessionId,
    secret: [u8; 32],
    stream: u16,
) -> ferry_proto::Frame {
    ferry_proto::Frame::Hello {
        version: ferry_proto::PROTOCOL_VERSION,
        capabilities: ferry_proto::Capabilities::ours(),
        role: ferry_proto::Role::Data {
            session,
            secret,
            stream,
        },
    }
}

/// Transfer options with one stream and BLAKE3, for raw sessions.
pub fn raw_opts(existing: ExistingPolicy) -> TransferOpts {
    TransferOpts {
        streams: 1,
        block_size: BLOCK,
        checksum: ChecksumAlgo::Blake3,
        existing,
        tcp_window: 0,
        auto_start: 0,
        storage_threads: 0,
    }
}

/// A well-formed block of file `id` at `path`: correct XXH3-128 block digest, and, when it ends
/// the file, the file's BLAKE3 digest (`whole` is the whole file's content).
pub fn raw_block(
    id: u64,
    path: &str,
    whole: &[u8],
    offset: usize,
    len: usize,
) -> ferry_proto::Frame {
    let data = bytes::Bytes::copy_from_slice(&whole[offset..offset + len]);
    let last = offset + len == whole.len();
    ferry_proto::Frame::Block(ferry_proto::Block {
        file: ferry_proto::FileMeta {
            id: ferry_proto::FileId(id),
            path: path.into(),
            size: whole.len() as u64,
            mode: 0o644,
            mtime_ns: 1_600_000_000_000_000_000,
        },
        offset: offset as u64,
        digest: xxhash_rust::xxh3::xxh3_128(&data),
        file_digest: last.then(|| bytes::Bytes::copy_from_slice(blake3::hash(whole).as_bytes())),
        early: false,
        data,
    })
}

/// Every path under `root` (names only, symlinks not followed), sorted; cheap enough to poll.
pub fn names(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            out.push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Names of ferry temporary files under `root`, without reading any content.
pub fn temp_names(root: &Path) -> Vec<String> {
    names(root)
        .into_iter()
        .filter(|n| n.rsplit('/').next().unwrap_or("").starts_with(".ferry-"))
        .collect()
}

/// Whether any regular file under `root` contains `needle` (symlinks are not followed).
pub fn any_file_contains(root: &Path, needle: &[u8]) -> bool {
    names(root).iter().any(|n| {
        let p = root.join(n);
        let is_file = std::fs::symlink_metadata(&p)
            .map(|m| m.file_type().is_file())
            .unwrap_or(false);
        is_file
            && std::fs::read(&p)
                .map(|d| d.windows(needle.len()).any(|w| w == needle))
                .unwrap_or(false)
    })
}

/// A temp dir on tmpfs (`/dev/shm`) when there is one, else the usual one: trees of thousands
/// of files are built and removed in a fraction of the time a disk shared with other jobs takes.
pub fn fast_tempdir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::tempdir_in(shm) {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

/// The `Offer` a sender makes before the data of a `Block` frame's file.
pub fn offer_of(block: &ferry_proto::Frame) -> ferry_proto::Frame {
    let ferry_proto::Frame::Block(b) = block else {
        panic!("offer_of takes a Block frame")
    };
    ferry_proto::Frame::Offer {
        entries: vec![ferry_proto::OfferEntry {
            file: b.file.id,
            path: b.file.path.clone(),
            size: b.file.size,
            mode: b.file.mode,
            mtime_ns: b.file.mtime_ns,
        }],
    }
}

/// Sends a block the way a real sender does: offer its file on the control connection, wait
/// for the receiver's decision (returned), then send the data on `data`.
pub async fn send_offered(
    control: &mut Raw,
    data: &mut Raw,
    block: ferry_proto::Frame,
) -> Vec<ferry_proto::FileDecision> {
    control.send(&offer_of(&block)).await.unwrap();
    let decisions = match control.expect(Duration::from_secs(10)).await {
        ferry_proto::Frame::Decisions { entries } => entries,
        other => panic!("expected Decisions, got {other:?}"),
    };
    data.send(&block).await.unwrap();
    decisions
}

/// How long the raw-frame tests wait for any one answer.
pub const T: Duration = Duration::from_secs(5);

/// Reads until the peer closes: the code of an `Error` frame if one came first, and whether
/// the connection was closed within `within`. Bytes that are not a frame fail the test: ferry
/// only ever answers with frames.
pub async fn refusal(raw: &mut Raw, within: Duration) -> (Option<ferry_proto::ErrorCode>, bool) {
    let (err, closed) = refusal_message(raw, within).await;
    (err.map(|(code, _)| code), closed)
}

/// Like [`refusal`], but also returns the message of the `Error` frame.
pub async fn refusal_message(
    raw: &mut Raw,
    within: Duration,
) -> (Option<(ferry_proto::ErrorCode, String)>, bool) {
    let deadline = tokio::time::Instant::now() + within;
    let mut err = None;
    for _ in 0..8 {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match raw.recv(left).await {
            Read::Frame(ferry_proto::Frame::Error { code, message }) => err = Some((code, message)),
            Read::Frame(other) => panic!("unexpected frame {other:?}"),
            Read::Closed => return (err, true),
            Read::TimedOut => return (err, false),
        }
    }
    (err, false)
}

/// An authenticated control connection with its session id and secret.
pub async fn control(server: &TestServer) -> (Raw, ferry_proto::SessionId, [u8; 32]) {
    control_at(server.addr).await
}

/// [`control`] to a server at `addr`.
pub async fn control_at(addr: SocketAddr) -> (Raw, ferry_proto::SessionId, [u8; 32]) {
    let mut c = Raw::connect(addr).await;
    c.send(&hello_control(TOKEN)).await.unwrap();
    match c.expect(T).await {
        ferry_proto::Frame::Welcome {
            session, secret, ..
        } => (c, session, secret),
        other => panic!("expected Welcome, got {other:?}"),
    }
}

/// A raw put session with one data connection, ready for frames.
pub async fn raw_put(server: &TestServer, dest: &str) -> (Raw, Raw) {
    let (mut c, session, secret) = control(server).await;
    c.send(&ferry_proto::Frame::PutRequest {
        dest: dest.into(),
        sources: 1,
        opts: raw_opts(ExistingPolicy::Fail),
    })
    .await
    .unwrap();
    match c.expect(T).await {
        ferry_proto::Frame::Ready { streams: 1, .. } => {}
        other => panic!("expected Ready for one stream, got {other:?}"),
    }
    let mut d = Raw::connect(server.addr).await;
    d.send(&hello_data(session, secret, 0)).await.unwrap();
    assert!(matches!(
        d.expect(T).await,
        ferry_proto::Frame::Welcome { .. }
    ));
    (c, d)
}

/// A TCP relay that counts the bytes it forwards (both ways), and optionally paces them to
/// `rate` bytes per second in each direction, so that a copy lasts long enough to be cut.
pub struct Relay {
    pub addr: SocketAddr,
    bytes: Arc<AtomicU64>,
    /// The address of every connection it took.
    peers: Arc<std::sync::Mutex<Vec<SocketAddr>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    pub async fn start(target: SocketAddr, rate: Option<u64>) -> Self {
        let (relay, to) = Self::start_later(rate).await;
        let _ = to.send(target);
        relay
    }

    /// A relay whose target is given later (a server that must know the relay's address
    /// before it starts); connections wait in its backlog until then.
    pub async fn start_later(rate: Option<u64>) -> (Self, oneshot::Sender<SocketAddr>) {
        let (to, target) = oneshot::channel::<SocketAddr>();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let bytes = Arc::new(AtomicU64::new(0));
        let peers = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (counted, seen) = (bytes.clone(), peers.clone());
        let task = tokio::spawn(async move {
            let Ok(target) = target.await else {
                return;
            };
            let mut pairs = tokio::task::JoinSet::new();
            while let Ok((inbound, peer)) = listener.accept().await {
                seen.lock().unwrap().push(peer);
                let Ok(outbound) = TcpStream::connect(target).await else {
                    continue;
                };
                let (ri, wi) = inbound.into_split();
                let (ro, wo) = outbound.into_split();
                pairs.spawn(pump(ri, wo, counted.clone(), rate));
                pairs.spawn(pump(ro, wi, counted.clone(), rate));
            }
        });
        let relay = Self {
            addr,
            bytes,
            peers,
            task,
        };
        (relay, to)
    }

    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    pub fn peers(&self) -> Vec<SocketAddr> {
        self.peers.lock().unwrap().clone()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    count: Arc<AtomicU64>,
    rate: Option<u64>,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        count.fetch_add(n as u64, Ordering::Relaxed);
        if let Some(rate) = rate {
            tokio::time::sleep(Duration::from_secs_f64(n as f64 / rate as f64)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
