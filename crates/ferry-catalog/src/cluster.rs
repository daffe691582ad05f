//! A throwaway PostgreSQL for tests: a cluster made with Debian's binaries in a directory of
//! the temporary directory, reached through a unix socket there (no TCP), each test in a
//! schema of its own; stopped and deleted when dropped, so a test run leaves nothing behind.
//!
//! Test support (the feature `test-cluster`), never part of a server. As root, the cluster
//! runs as the `postgres` user (PostgreSQL refuses root), so the temporary directory must let
//! that user through.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::db::Db;
use crate::pg::{Pg, PgUrl};
use crate::Location;

/// How long a new cluster may take to accept connections.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// A running cluster; stopped and deleted on drop.
pub struct TestCluster {
    dir: PathBuf,
    bin: PathBuf,
    /// The user the cluster runs as when the tests run as root.
    owner: Option<(u32, u32)>,
    server: Option<Child>,
    next: AtomicU32,
    /// The TCP port on loopback where the server also speaks TLS, if it was started so.
    tls_port: Option<u16>,
}

impl TestCluster {
    /// Makes and starts a cluster; why not, when this machine cannot (no PostgreSQL
    /// installed, no `postgres` user, a temporary directory that user cannot reach).
    pub fn start() -> Result<Self, String> {
        Self::start_with(None)
    }

    /// As [`Self::start`], the server also listening on a port of 127.0.0.1 and speaking TLS
    /// there with this certificate chain and key (PEM), as a catalog's database across a
    /// network would ([`Self::tls_port`]).
    pub fn start_tls(cert_pem: &str, key_pem: &str) -> Result<Self, String> {
        Self::start_with(Some((cert_pem, key_pem)))
    }

    fn start_with(tls: Option<(&str, &str)>) -> Result<Self, String> {
        let bin = binaries()?;
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ferry-pg-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut cluster = Self {
            dir,
            bin,
            owner: None,
            server: None,
            next: AtomicU32::new(0),
            tls_port: None,
        };
        cluster.init(tls)?;
        Ok(cluster)
    }

    fn init(&mut self, tls: Option<(&str, &str)>) -> Result<(), String> {
        let socket = self.dir.join(".s.PGSQL.5432");
        if socket.as_os_str().len() > 100 {
            return Err(format!("{}: too long for a unix socket", socket.display()));
        }
        std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| e.to_string())?;
        if is_root() {
            let owner = postgres_user()?;
            std::os::unix::fs::chown(&self.dir, Some(owner.0), Some(owner.1))
                .map_err(|e| format!("chown {}: {e}", self.dir.display()))?;
            self.owner = Some(owner);
            let reach = self.command("test").arg("-w").arg(&self.dir).status();
            if !reach.is_ok_and(|s| s.success()) {
                return Err(format!(
                    "the postgres user cannot reach {} (a directory above it without x for \
                     others?)",
                    self.dir.display()
                ));
            }
        }
        let data = self.dir.join("data");
        let out = self
            .command(self.bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C"])
            .arg("--no-sync")
            .output()
            .map_err(|e| format!("initdb: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "initdb: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        if let Some((cert, key)) = tls {
            // PostgreSQL refuses a key that others may read, or that its user does not own.
            for (name, pem, mode) in [("server.crt", cert, 0o644), ("server.key", key, 0o600)] {
                let path = self.dir.join(name);
                std::fs::write(&path, pem).map_err(|e| format!("{}: {e}", path.display()))?;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                    .map_err(|e| e.to_string())?;
                if let Some((uid, gid)) = self.owner {
                    std::os::unix::fs::chown(&path, Some(uid), Some(gid))
                        .map_err(|e| e.to_string())?;
                }
            }
            let probe = std::net::TcpListener::bind(("127.0.0.1", 0)).map_err(|e| e.to_string())?;
            self.tls_port = Some(probe.local_addr().map_err(|e| e.to_string())?.port());
        }
        self.run()
    }

    /// Starts the server on the cluster's data and waits until it takes connections.
    fn run(&mut self) -> Result<(), String> {
        let data = self.dir.join("data");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("log"))
            .map_err(|e| e.to_string())?;
        if let Some((uid, gid)) = self.owner {
            std::os::unix::fs::chown(self.dir.join("log"), Some(uid), Some(gid))
                .map_err(|e| e.to_string())?;
        }
        let server = self
            .command(self.bin.join("postgres"))
            .arg("-D")
            .arg(&data)
            .arg("-k")
            .arg(&self.dir)
            .args(self.listen_args())
            .args(["-c", "fsync=off"])
            .args(["-c", "synchronous_commit=off", "-c", "full_page_writes=off"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("postgres: {e}"))?;
        self.server = Some(server);
        self.wait_ready()
    }

    /// Only the socket; or also TLS on loopback (the socket's name follows the port).
    fn listen_args(&self) -> Vec<String> {
        let Some(port) = self.tls_port else {
            return vec!["-c".into(), "listen_addresses=".into()];
        };
        let file = |name: &str| self.dir.join(name).display().to_string();
        [
            "listen_addresses=127.0.0.1".to_owned(),
            format!("port={port}"),
            "ssl=on".to_owned(),
            format!("ssl_cert_file={}", file("server.crt")),
            format!("ssl_key_file={}", file("server.key")),
        ]
        .into_iter()
        .flat_map(|setting| ["-c".to_owned(), setting])
        .collect()
    }

    /// The loopback port where the server speaks TLS, if started with [`Self::start_tls`].
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// Restarts the server as an administrator would (`pg_ctl stop -m fast`: every connection
    /// is cut, what was committed is kept) and starts it again on the same data.
    pub fn restart(&mut self) -> Result<(), String> {
        self.stop("fast");
        self.run()
    }

    /// Stops the server, keeping its data, until [`Self::resume`] (a database that went
    /// away for a while).
    pub fn pause(&mut self) {
        self.stop("fast");
    }

    /// Starts the server [`Self::pause`] stopped.
    pub fn resume(&mut self) -> Result<(), String> {
        self.run()
    }

    /// Stops the server: `immediate` when nothing in it needs keeping (the cluster runs
    /// with asynchronous commits, so that loses the last ones), `fast` to keep them.
    fn stop(&mut self, mode: &str) {
        if let Some(mut server) = self.server.take() {
            let stopped = self
                .command(self.bin.join("pg_ctl"))
                .arg("-D")
                .arg(self.dir.join("data"))
                .args(["-m", mode, "-w", "stop"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            if !stopped.is_ok_and(|s| s.success()) {
                let _ = server.kill();
            }
            let _ = server.wait();
        }
    }

    /// `program` as the cluster's owner.
    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        match self.owner {
            Some((uid, gid)) => {
                let mut c = Command::new("setpriv");
                c.arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={gid}"))
                    .arg("--clear-groups")
                    .arg(program);
                c
            }
            None => Command::new(program),
        }
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let start = Instant::now();
        loop {
            if let Some(status) = self
                .server
                .as_mut()
                .and_then(|s| s.try_wait().ok().flatten())
            {
                let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
                return Err(format!("postgres exited ({status}): {}", log.trim()));
            }
            let url = self.url("postgres");
            if Pg::connect(&PgUrl::parse(&url).map_err(|e| e.to_string())?).is_ok() {
                return Ok(());
            }
            if start.elapsed() > READY_WITHIN {
                return Err(format!("postgres not ready within {READY_WITHIN:?}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The location of database `db` of this cluster, as `--catalog` takes it.
    pub fn url(&self, db: &str) -> String {
        format!(
            "host={} port={} user=postgres dbname={db} connect_timeout=5",
            self.dir.display(),
            self.tls_port.unwrap_or(5432)
        )
    }

    /// A new, empty catalog in this cluster: one for each test. A schema of its own, in the
    /// `postgres` database, as isolated as a database and much quicker to make (no copy of a
    /// template).
    pub fn database(&self) -> Location {
        Location::parse(&self.database_url()).expect("the cluster's own location")
    }

    /// [`Self::database`], as `--catalog` takes it.
    pub fn database_url(&self) -> String {
        let name = format!("ferry_{}", self.next.fetch_add(1, Ordering::Relaxed));
        let admin = PgUrl::parse(&self.url("postgres")).expect("the cluster's own location");
        let mut admin = Pg::connect(&admin).expect("the cluster is up");
        // The name is this function's own, never input.
        admin
            .batch(&format!("CREATE SCHEMA {name}"))
            .expect("a new schema");
        format!("{} options='-c search_path={name}'", self.url("postgres"))
    }

    /// The directory the cluster lives in (and its socket).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for TestCluster {
    /// Stops the server at once (nothing in it is kept) and deletes its directory.
    fn drop(&mut self) {
        self.stop("immediate");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Where PostgreSQL's programs are: `FERRY_PG_BIN`, else Debian's newest
/// `/usr/lib/postgresql/N/bin`.
fn binaries() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("FERRY_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|e| format!("no PostgreSQL in /usr/lib/postgresql ({e}); install `postgresql`"))?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| "no initdb under /usr/lib/postgresql/*/bin; install `postgresql`".into())
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The `postgres` user's uid and gid, from /etc/passwd.
fn postgres_user() -> Result<(u32, u32), String> {
    let passwd = std::fs::read_to_string("/etc/passwd").map_err(|e| e.to_string())?;
    passwd
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.first() == Some(&"postgres"))
                .then(|| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))?
        })
        .ok_or_else(|| "no `postgres` user to run the cluster as; install `postgresql`".into())
}
