//! Shared helpers: a real server on 127.0.0.1:0 in a temp dir, a client config, tree builders,
//! and digests computed independently of ferry's own code path (std::fs + blake3 directly).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ferry_net::{ClientConfig, Server, ServerConfig};
use ferry_proto::{ChecksumAlgo, ExistingPolicy, TransferOpts};
use tokio::sync::oneshot;

pub const TOKEN: &str = "test-token-0123456789";
/// Small blocks make block boundaries cheap to test.
pub const BLOCK: u32 = 64 * 1024;

pub struct TestServer {
    pub addr: SocketAddr,
    pub root: PathBuf,
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
        config.handshake_timeout = Duration::from_secs(2);
        f(&mut config);
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
            _dir: dir,
            stop: Some(tx),
            task: Some(task),
        }
    }

    pub fn client(&self) -> ClientConfig {
        ClientConfig {
            server: self.addr.to_string(),
            token: TOKEN.into(),
            opts: TransferOpts {
                streams: 4,
                block_size: BLOCK,
                checksum: ChecksumAlgo::Blake3,
                existing: ExistingPolicy::Fail,
                tcp_window: 0,
            },
            readers: 3,
            writers: 3,
            connect_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(20),
            corrupt_blocks: Vec::new(),
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

pub fn reporter() -> Arc<dyn ferry_core::Reporter> {
    Arc::new(ferry_core::NoReporter)
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
