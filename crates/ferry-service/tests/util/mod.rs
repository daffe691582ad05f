//! Shared helpers: a real ferry server (ferry-net's `Server`, what `ferry serve` runs) on
//! 127.0.0.1:0, the service's pieces pointed at it, small trees, and bounded waits.
#![allow(dead_code)]

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
    _dir: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestServer {
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let mut config = ServerConfig::new(&root, TOKEN);
        config.auth_failure_delay = Duration::from_millis(50);
        let fingerprint = config.tls.as_ref().unwrap().fingerprint().to_string();
        let server = Server::bind("127.0.0.1:0".parse().unwrap(), config)
            .await
            .unwrap();
        let addr = server.local_addr().unwrap();
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(server.run(async {
            let _ = rx.await;
        }));
        Self {
            addr,
            root,
            fingerprint,
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
    let store = Arc::new(Store::open(None).unwrap());
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
