//! The catalog (issue 39): a put registers every file it stores with the digest the client
//! computed, and a server killed (SIGKILL, a process of its own) in the middle of a put comes
//! back with every file under a final name registered and nothing registered missing.

mod util;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_catalog::{Catalog, Location, ReplicaState};
use ferry_net::{Server, ServerConfig};
use ferry_proto::ExistingPolicy;
use util::*;

fn open(path: &Path) -> Catalog {
    Catalog::open(&Location::Sqlite(path.to_owned()), "test").unwrap()
}

/// Files of `n` distinct small contents under `dir`, in a few subdirectories.
fn tree(dir: &Path, n: usize, len: usize) {
    for i in 0..n {
        write(
            &dir.join(format!("d{}/f{i:05}.bin", i % 7)),
            &bytes(len, i as u64 + 1),
        );
    }
}

/// Every regular file under `root` that is not a ferry temporary: path → BLAKE3.
fn final_files(root: &Path) -> BTreeMap<String, Vec<u8>> {
    snapshot(root)
        .into_iter()
        .filter(|(k, v)| v.0 == 'f' && !k.contains(".ferry-"))
        .map(|(k, v)| (k, hex_bytes(&v.1)))
        .collect()
}

fn hex_bytes(h: &str) -> Vec<u8> {
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
        .collect()
}

/// Every registered object: path → digest.
fn registered(c: &Catalog) -> BTreeMap<String, Vec<u8>> {
    c.find(&ferry_catalog::Query::default())
        .unwrap()
        .into_iter()
        .map(|o| (o.path, o.digest))
        .collect()
}

#[tokio::test]
async fn a_put_registers_every_file_with_the_clients_digest() {
    let state = tempfile::tempdir().unwrap();
    let db = state.path().join("catalog.sqlite");
    let catalog = Arc::new(open(&db));
    let c2 = catalog.clone();
    let server = TestServer::start_with(move |c| c.catalog = Some(c2)).await;
    let src = tempfile::tempdir().unwrap();
    let top = src.path().join("tree");
    tree(&top, 300, 3000);
    // One file larger than a block: its digest is the BLAKE3 tree of several blocks.
    write(&top.join("big.bin"), &bytes(3 * BLOCK as usize + 17, 99));
    ferry_net::client::put(
        &server.client(),
        std::slice::from_ref(&top),
        "in/",
        reporter(),
    )
    .await
    .unwrap();
    let want: BTreeMap<String, Vec<u8>> = final_files(&top)
        .into_iter()
        .map(|(k, v)| (format!("in/tree/{k}"), v))
        .collect();
    assert_eq!(want.len(), 301);
    assert_eq!(registered(&catalog), want);
    let s = catalog.stat("in/tree/big.bin").unwrap().unwrap();
    assert_eq!(s.object.size, 3 * u64::from(BLOCK) + 17);
    assert_eq!(s.object.algo, "blake3");
    assert_eq!(s.object.stored_by, "default");
    assert_eq!(s.replicas.len(), 1);
    assert_eq!(s.replicas[0].state, ReplicaState::Good);
    assert_eq!(
        PathBuf::from(&s.replicas[0].physical),
        server.root.join("in/tree/big.bin")
    );
    assert!(catalog.pending().unwrap().is_empty(), "no intent left");
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// a server killed mid-put, in a process of its own

const CHILD_ROOT: &str = "FERRY_CATALOG_SERVER_ROOT";
const CHILD_DB: &str = "FERRY_CATALOG_SERVER_DB";

/// The server the crash test kills: started by it as a process of its own, serving until its
/// stdin closes or it is killed. Does nothing when run any other way.
#[test]
#[ignore = "started by the crash test as its server process"]
fn catalog_server_process() {
    let (Some(root), Some(db)) = (std::env::var_os(CHILD_ROOT), std::env::var_os(CHILD_DB)) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut config = ServerConfig::new(Path::new(&root), TOKEN);
        config.allow_plaintext = true;
        config.catalog = Some(Arc::new(open(Path::new(&db))));
        let server = Server::bind("127.0.0.1:0".parse().unwrap(), config)
            .await
            .unwrap();
        let r = server.reconciled().unwrap();
        println!("RECONCILED {} {}", r.registered, r.dropped);
        println!("PORT {}", server.local_addr().unwrap().port());
        let stdin_closed = async {
            let _ = tokio::task::spawn_blocking(|| {
                let mut sink = String::new();
                while matches!(std::io::stdin().read_line(&mut sink), Ok(n) if n > 0) {}
            })
            .await;
        };
        server.run(stdin_closed).await;
    });
}

struct ServerProcess {
    child: Child,
    addr: SocketAddr,
    /// Intents registered and dropped at its start.
    reconciled: (u64, u64),
}

impl ServerProcess {
    fn start(root: &Path, db: &Path) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "catalog_server_process",
                "--ignored",
                "--nocapture",
            ])
            .env(CHILD_ROOT, root)
            .env(CHILD_DB, db)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut reconciled = (0, 0);
        let port = loop {
            let line = lines
                .next()
                .expect("the server process prints its port")
                .unwrap();
            if let Some(r) = line.strip_prefix("RECONCILED ") {
                let mut n = r.split(' ').map(|x| x.trim().parse::<u64>().unwrap());
                reconciled = (n.next().unwrap(), n.next().unwrap());
            }
            if let Some(p) = line.strip_prefix("PORT ") {
                break p.trim().parse::<u16>().unwrap();
            }
        };
        std::thread::spawn(move || for _ in lines {});
        Self {
            child,
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            reconciled,
        }
    }

    /// SIGKILL, as `kill -9`.
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Files stored under final names in `root/in`, counted cheaply while a put runs.
fn stored_count(root: &Path) -> usize {
    let Ok(dirs) = std::fs::read_dir(root.join("in/tree")) else {
        return 0;
    };
    dirs.flatten()
        .filter_map(|d| std::fs::read_dir(d.path()).ok())
        .flat_map(|r| r.flatten())
        .filter(|e| !e.file_name().to_string_lossy().starts_with(".ferry-"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_put_comes_back_with_its_catalog_in_step() {
    const FILES: usize = 2000;
    let dir = fast_tempdir();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let db = dir.path().join("catalog.sqlite");
    let src = tempfile::tempdir().unwrap();
    let top = src.path().join("tree");
    tree(&top, FILES, 2048);

    let server = ServerProcess::start(&root, &db);
    let mut cfg = client_config(server.addr.to_string());
    cfg.opts.existing = ExistingPolicy::Skip;
    let put = {
        let (cfg, top) = (cfg.clone(), top.clone());
        tokio::spawn(async move { ferry_net::client::put(&cfg, &[top], "in/", reporter()).await })
    };
    // Killed once some files are stored and before all are.
    let deadline = Instant::now() + Duration::from_secs(30);
    while stored_count(&root) < FILES / 10 {
        assert!(Instant::now() < deadline, "the put gets under way");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    server.kill();
    let _ = put.await.unwrap();
    let stored = final_files(&root);
    assert!(stored.len() < FILES, "killed before the put ended");

    // Back on the same root and catalog: every stored file is registered with its digest and
    // nothing registered is missing.
    let server = ServerProcess::start(&root, &db);
    let catalog = open(&db);
    assert_eq!(
        registered(&catalog),
        stored,
        "reconciled: {:?}",
        server.reconciled
    );
    eprintln!(
        "stored {} of {FILES} before the kill; at the restart {} intents registered, {} dropped",
        stored.len(),
        server.reconciled.0,
        server.reconciled.1
    );
    assert!(catalog.pending().unwrap().is_empty());

    // The rerun completes and registers the rest.
    let mut cfg = client_config(server.addr.to_string());
    cfg.opts.existing = ExistingPolicy::Skip;
    ferry_net::client::put(&cfg, std::slice::from_ref(&top), "in/", reporter())
        .await
        .unwrap();
    let stored = final_files(&root);
    assert_eq!(stored.len(), FILES);
    assert_eq!(registered(&catalog), stored);
    let want: BTreeMap<String, Vec<u8>> = final_files(&top)
        .into_iter()
        .map(|(k, v)| (format!("in/tree/{k}"), v))
        .collect();
    assert_eq!(stored, want);
}
