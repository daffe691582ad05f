//! Shared helpers: a real ferry server (ferry-net's `Server`, what `ferry serve` runs) on
//! 127.0.0.1:0, the service's pieces pointed at it, small trees, and bounded waits.
#![allow(dead_code)]

pub mod chromium;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_net::{Server, ServerConfig};
use ferry_service::{Endpoint, Endpoints, Job, Limits, Runner, Scheduler, State, Store};
use tokio::sync::oneshot;

pub const TOKEN: &str = "test-token-0123456789";
/// Small blocks: many progress reports even for a small file.
pub const BLOCK: u32 = 64 * 1024;

pub struct TestServer {
    pub addr: SocketAddr,
    pub root: PathBuf,
    pub fingerprint: String,
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
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let mut config = ServerConfig::new(&root, TOKEN);
        config.auth_failure_delay = Duration::from_millis(50);
        f(&mut config);
        let fingerprint = config.tls.as_ref().unwrap().fingerprint().to_string();
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

    /// How the service reaches this server: its token, its key pinned.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            server: self.addr.to_string(),
            token: TOKEN.into(),
            fingerprint: Some(self.fingerprint.clone()),
            plaintext: false,
        }
    }

    /// Waits until no session runs (a killed client's is over), at most 10 s.
    pub async fn settle(&self) {
        let t0 = Instant::now();
        while self.idle.idle_for() == Duration::ZERO {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the server's sessions end"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(15), t).await;
        }
    }
}

/// A runner for the service's local root `local`, reaching `endpoints`.
pub fn runner(local: &Path, endpoints: Vec<Endpoint>, known_hosts: PathBuf) -> Runner {
    Runner {
        endpoints: Endpoints::from_list(endpoints, known_hosts).unwrap(),
        local_root: Some(local.to_path_buf()),
        block_size: BLOCK,
        pace: None,
        fixed_streams: None,
        stall_stream: None,
    }
}

/// Limits for tests: fast backoff, frequent progress.
pub fn limits() -> Limits {
    Limits {
        first_backoff: Duration::from_millis(100),
        most_backoff: Duration::from_millis(400),
        progress_every: Duration::from_millis(50),
        ..Limits::default()
    }
}

/// A scheduler running on an in-memory store until the returned sender is dropped or sent.
pub fn start_scheduler(runner: Runner, limits: Limits) -> (Arc<Scheduler>, oneshot::Sender<()>) {
    start_scheduler_on(Arc::new(Store::open(None).unwrap()), runner, limits)
}

/// [`start_scheduler`] on a store the test has filled already.
pub fn start_scheduler_on(
    store: Arc<Store>,
    runner: Runner,
    limits: Limits,
) -> (Arc<Scheduler>, oneshot::Sender<()>) {
    let s = Scheduler::new(store, runner, limits);
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(s.clone().run(async {
        let _ = rx.await;
    }));
    (s, tx)
}

/// Writes a small tree under `dir/name`: a few files of assorted sizes in two levels.
pub fn make_tree(dir: &Path, name: &str) -> PathBuf {
    let top = dir.join(name);
    std::fs::create_dir_all(top.join("sub/deeper")).unwrap();
    let files: [(&str, usize); 5] = [
        ("a.txt", 0),
        ("b.bin", 1),
        ("sub/c.bin", 100_000),
        ("sub/deeper/d.bin", 300_001),
        ("e.bin", 65_536),
    ];
    for (i, (rel, len)) in files.iter().enumerate() {
        let data: Vec<u8> = (0..*len).map(|j| ((j * 31 + i * 7) % 251) as u8).collect();
        std::fs::write(top.join(rel), data).unwrap();
    }
    top
}

/// A file of `len` bytes that are not all alike.
pub fn make_file(path: &Path, len: usize) {
    let data: Vec<u8> = (0..len).map(|j| ((j * 131) % 253) as u8).collect();
    std::fs::write(path, data).unwrap();
}

/// Every file below `top` by relative path, with its bytes.
pub fn tree_bytes(top: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![top.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(top).unwrap().to_string_lossy().into_owned();
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// Polls the store until `id` satisfies `done`, at most `within`; panics with the job as it
/// last stood otherwise.
pub async fn wait_job(
    store: &Store,
    id: i64,
    within: Duration,
    done: impl Fn(&Job) -> bool,
) -> Job {
    let t0 = Instant::now();
    loop {
        let j = store.get(id).unwrap().unwrap();
        if done(&j) {
            return j;
        }
        assert!(
            t0.elapsed() < within,
            "job {id} did not get there in {within:?}: {j:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until job `id` has ended (done, failed or cancelled).
pub async fn wait_end(store: &Store, id: i64) -> Job {
    wait_job(store, id, Duration::from_secs(60), |j| j.state.is_final()).await
}

pub fn is(state: State) -> impl Fn(&Job) -> bool {
    move |j| j.state == state
}

/// A service on 127.0.0.1:0 in its own state directory, with tokens `alice`, `bob` and the
/// admin `ops`, reaching `server`; its local root is `local`.
pub struct TestService {
    pub addr: SocketAddr,
    pub fingerprint: ferry_net::Fingerprint,
    pub store: Arc<Store>,
    pub scheduler: Arc<Scheduler>,
    pub tokens: std::collections::HashMap<&'static str, String>,
    pub state: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestService {
    pub async fn start(server: &TestServer, local: &Path) -> Self {
        Self::start_with(server, local, |_| {}).await
    }

    pub async fn start_with(
        server: &TestServer,
        local: &Path,
        f: impl FnOnce(&mut ferry_service::ServiceConfig),
    ) -> Self {
        let state = tempfile::tempdir().unwrap();
        let tokens = make_tokens(state.path());
        let mut cfg =
            ferry_service::ServiceConfig::new("127.0.0.1:0".parse().unwrap(), state.path());
        cfg.admins = vec!["ops".into()];
        cfg.local_root = Some(local.to_path_buf());
        cfg.limits = limits();
        cfg.block_size = BLOCK;
        write_endpoints(state.path(), server);
        f(&mut cfg);
        let service = ferry_service::Service::bind(cfg).await.unwrap();
        let addr = service.local_addr().unwrap();
        let fingerprint = service.fingerprint();
        let scheduler = service.scheduler().clone();
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(service.run(async {
            let _ = rx.await;
        }));
        Self {
            addr,
            fingerprint,
            store: scheduler.store().clone(),
            scheduler,
            tokens,
            state,
            stop: Some(tx),
            task: Some(task),
        }
    }

    /// A client of this service with `who`'s token, pinned to its key.
    pub fn client(&self, who: &str) -> ferry_service::client::Client {
        ferry_service::client::Client {
            addr: self.addr.to_string(),
            token: self.tokens[who].clone(),
            trust: ferry_service::tls::Trust::Pinned(self.fingerprint),
            timeout: Duration::from_secs(10),
            kept: None,
        }
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(15), t)
                .await
                .expect("the service stops")
                .unwrap();
        }
    }
}

/// Tokens `alice`, `bob` and `ops` in the state directory's token file, as `ferry token add`
/// writes them.
pub fn make_tokens(state: &Path) -> std::collections::HashMap<&'static str, String> {
    let file = state.join(ferry_service::service::TOKENS_FILE);
    ["alice", "bob", "ops"]
        .into_iter()
        .map(|n| {
            let t = ferry_net::access::add_token(&file, n, vec![], vec![], false).unwrap();
            (n, t)
        })
        .collect()
}

/// The state directory's endpoints file, naming `server` with its token and key.
pub fn write_endpoints(state: &Path, server: &TestServer) {
    let text = format!(
        "[[endpoint]]\nserver = \"{}\"\ntoken = \"{TOKEN}\"\nfingerprint = \"{}\"\n",
        server.addr, server.fingerprint
    );
    std::fs::write(state.join(ferry_service::endpoints::ENDPOINTS_FILE), text).unwrap();
}

/// A job request of `sources` to `dest`, nothing else set.
pub fn request(sources: &[&str], dest: &str) -> ferry_service::api::SubmitRequest {
    ferry_service::api::SubmitRequest {
        sources: sources.iter().map(|s| s.to_string()).collect(),
        dest: dest.into(),
        sync: None,
        priority: 0,
        deadline: None,
        label: String::new(),
    }
}

/// Polls the API until job `id` satisfies `done`, at most `within`.
pub async fn wait_api(
    c: &ferry_service::client::Client,
    id: i64,
    within: Duration,
    done: impl Fn(&Job) -> bool,
) -> Job {
    let t0 = Instant::now();
    loop {
        let j = c.job(id).await.unwrap();
        if done(&j) {
            return j;
        }
        assert!(
            t0.elapsed() < within,
            "job {id} did not get there in {within:?}: {j:?}"
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}
