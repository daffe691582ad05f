//! The service as one piece: the store in the state directory, the scheduler, and the API
//! listening with TLS, started together and stopped together.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ferry_net::access::Access;
use ferry_net::Fingerprint;

use crate::api::{self, App};
use crate::endpoints::{Endpoints, ENDPOINTS_FILE, KNOWN_HOSTS_FILE};
use crate::error::ServiceError;
use crate::notify::{Notifications, Notifier};
use crate::prober::ProbeSchedule;
use crate::runner::Runner;
use crate::scheduler::{Limits, Scheduler};
use crate::store::Store;

/// The job database in the state directory.
pub const JOBS_FILE: &str = "jobs.db";
/// This service's name in a shared queue, kept in the state directory across restarts.
pub const NAME_FILE: &str = "service-name";
/// The token file in the state directory unless another is named (ferry serve's name).
pub const TOKENS_FILE: &str = "tokens.toml";

/// What the `ferry service` process lets the block-buffer pool keep idle
/// (`ferry_core::buf::set_idle_limit`): two blocks of the default size. Its transfers are
/// paced by their links, not by page faults, and a pool that keeps its largest burst is
/// memory a long-lived daemon never gives back (docs/bench/NOTEBOOK.md, "Issue 40: the
/// service's p99 and memory").
pub const IDLE_POOL: usize = 16 << 20;

/// How the service is set up (`ferry service`'s options).
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    pub listen: SocketAddr,
    /// Holds the job database, the TLS key, the endpoints and known hosts.
    pub state_dir: PathBuf,
    /// Where the job queue is: `None`, `jobs.db` in the state directory; a PostgreSQL
    /// location, a queue several services share.
    pub store: Option<ferry_catalog::Location>,
    /// This service's name among those sharing a queue; `None`: the one kept in the state
    /// directory (made at the first start from the host's name).
    pub name: Option<String>,
    /// The token file; default `tokens.toml` in the state directory.
    pub tokens: Option<PathBuf>,
    /// The endpoints file; default `endpoints.toml` in the state directory.
    pub endpoints: Option<PathBuf>,
    /// Token names that may see and cancel every job.
    pub admins: Vec<String>,
    /// The directory local paths are below; `None`: only server-to-server copies.
    pub local_root: Option<PathBuf>,
    pub limits: Limits,
    pub block_size: u32,
    /// Test hook, see [`Runner::pace`].
    pub pace: Option<Duration>,
    /// Test hook, see [`Runner::fixed_streams`].
    pub fixed_streams: Option<u16>,
    /// Measure the links on this schedule; `None`: no probes (transfers still add samples).
    pub probe: Option<ProbeSchedule>,
    /// What runs when a job ends.
    pub notify: Notifications,
}

impl ServiceConfig {
    pub fn new(listen: SocketAddr, state_dir: impl Into<PathBuf>) -> Self {
        Self {
            listen,
            state_dir: state_dir.into(),
            store: None,
            name: None,
            tokens: None,
            endpoints: None,
            admins: Vec::new(),
            local_root: None,
            limits: Limits::default(),
            block_size: 8 << 20,
            pace: None,
            fixed_streams: None,
            probe: None,
            notify: Notifications::default(),
        }
    }
}

/// A bound, not yet running service.
pub struct Service {
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    fingerprint: Fingerprint,
    scheduler: Arc<Scheduler>,
    app: Arc<App>,
    probe: Option<ProbeSchedule>,
}

impl Service {
    /// Opens the store (queuing again what a crash left running), makes or loads the TLS key,
    /// reads the endpoints, and binds the API's address.
    pub async fn bind(cfg: ServiceConfig) -> Result<Self, ServiceError> {
        let io = |what: String| move |source| ServiceError::Io { what, source };
        std::fs::create_dir_all(&cfg.state_dir)
            .map_err(io(format!("creating {}", cfg.state_dir.display())))?;
        let name = match &cfg.name {
            Some(n) => n.clone(),
            None => service_name(&cfg.state_dir)?,
        };
        let location = cfg
            .store
            .clone()
            .unwrap_or_else(|| ferry_catalog::Location::Sqlite(cfg.state_dir.join(JOBS_FILE)));
        // Opening may wait on a PostgreSQL server (up to its connect timeout): off the
        // runtime's workers.
        let store = tokio::task::spawn_blocking(move || Store::open_at(&location, &name))
            .await
            .map_err(|e| ServiceError::Invalid(format!("opening the job store: {e}")))??;
        let store = Arc::new(store);
        let (tls, fingerprint) = crate::tls::server_config(&cfg.state_dir.join("tls"))?;
        let endpoints = Endpoints::load(
            &cfg.endpoints
                .clone()
                .unwrap_or_else(|| cfg.state_dir.join(ENDPOINTS_FILE)),
            cfg.state_dir.join(KNOWN_HOSTS_FILE),
        )?;
        if let Some(root) = &cfg.local_root {
            if !root.is_dir() {
                return Err(ServiceError::Invalid(format!(
                    "--local-root {}: not a directory",
                    root.display()
                )));
            }
        }
        let runner = Runner {
            endpoints,
            local_root: cfg.local_root.clone(),
            block_size: cfg.block_size,
            pace: cfg.pace,
            fixed_streams: cfg.fixed_streams,
            stall_stream: None,
        };
        let notifier = Arc::new(Notifier::new(cfg.notify.clone())?);
        let notifier = notifier.enabled().then_some(notifier);
        let scheduler = Scheduler::with_notifier(store, runner, cfg.limits.clone(), notifier);
        let tokens = cfg
            .tokens
            .clone()
            .unwrap_or_else(|| cfg.state_dir.join(TOKENS_FILE));
        let app = Arc::new(App {
            scheduler: scheduler.clone(),
            access: Access::file(tokens),
            admins: cfg.admins.clone(),
            slow_fraction: crate::history::SLOW_FRACTION,
            timing: Default::default(),
        });
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .map_err(io(format!("listening on {}", cfg.listen)))?;
        Ok(Self {
            listener,
            tls,
            fingerprint,
            scheduler,
            app,
            probe: cfg.probe.clone(),
        })
    }

    pub fn local_addr(&self) -> Result<SocketAddr, ServiceError> {
        self.listener
            .local_addr()
            .map_err(|source| ServiceError::Io {
                what: "the API's address".into(),
                source,
            })
    }

    /// What clients pin.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    pub fn scheduler(&self) -> &Arc<Scheduler> {
        &self.scheduler
    }

    /// Serves the API and runs the queue until `shutdown` resolves; running jobs are then
    /// stopped and queued again for the next start.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        // The transfers on threads of a lower priority, before the API's threads start.
        let bulk = match bulk_runtime() {
            Ok(rt) => {
                self.scheduler.run_transfers_on(rt.handle().clone());
                Some(rt)
            }
            Err(e) => {
                tracing::warn!("the transfers' runtime: {e}; they share the service's");
                None
            }
        };
        let (tx, rx) = tokio::sync::watch::channel(false);
        let stopped = move |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let sched = tokio::spawn(self.scheduler.clone().run(stopped(rx.clone())));
        let probes = self.probe.map(|p| {
            tokio::spawn(crate::prober::run(
                self.scheduler.clone(),
                p,
                stopped(rx.clone()),
            ))
        });
        // The API on threads of its own: on the jobs' runtime a request waits behind whatever
        // the workers are doing (a TLS record of a block, a digest), which made its tail (p99)
        // ten times its median under a thousand jobs (docs/bench/NOTEBOOK.md).
        let (api_stop, api_stopped) = tokio::sync::oneshot::channel::<()>();
        let api = match api_thread(self.listener, self.tls, self.app, api_stopped) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::error!("the API cannot start: {e}");
                None
            }
        };
        if api.is_some() {
            shutdown.await;
        }
        let _ = api_stop.send(());
        if let Some(t) = api {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
        let _ = tx.send(true);
        let _ = sched.await;
        if let Some(p) = probes {
            let _ = p.await;
        }
        // Its transfers were aborted with their jobs; a runtime is not dropped on a worker.
        if let Some(rt) = bulk {
            rt.shutdown_background();
        }
    }
}

/// How much lower than the service's own the CPU priority of the transfers' threads is (a
/// nice value added, per thread). Bulk work (TLS records of blocks, digests) then yields the
/// cores to the API's requests on a loaded host, rather than sharing them equally: a request
/// woken behind it waited for a whole slice (docs/bench/NOTEBOOK.md, "Issue 40: the API's
/// tail"). Lowering a thread's own priority needs no privilege.
pub const BULK_NICE: i32 = 10;

/// The runtime the jobs' transfers run on, each of its threads (workers and blocking pool,
/// and the threads they start, which inherit it) at [`BULK_NICE`] above the caller's nice
/// value. Set, not added at each thread's start: a blocking thread is started by a worker
/// already lowered, and adding again took it to 19 (measured, docs/bench/NOTEBOOK.md).
fn bulk_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let nice = (nice_now() + BULK_NICE).min(19);
    tokio::runtime::Builder::new_multi_thread()
        .thread_name("ferry-bulk")
        .on_thread_start(move || set_nice(nice))
        .enable_all()
        .build()
}

/// The calling thread's nice value.
fn nice_now() -> i32 {
    rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap_or(0)
}

/// Sets the calling thread's nice value (on Linux a nice value is the thread's, not the
/// process's); raising it needs no privilege, lowering it below the thread's own may fail.
pub fn set_nice(nice: i32) {
    let me = Some(rustix::thread::gettid());
    if let Err(e) = rustix::process::setpriority_process(me, nice) {
        tracing::debug!("setting a transfer thread's nice value to {nice}: {e}");
    }
}

/// Threads the API runs on (two workers of a runtime of their own), so that its answers do not
/// queue behind the jobs' work on the main runtime's workers.
const API_THREADS: usize = 2;

/// Starts the API's runtime on its own threads and serves `listener` there until `stop`.
fn api_thread(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Arc<App>,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let listener = listener.into_std()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(API_THREADS)
        .thread_name("ferry-api")
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("ferry-api".into())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => return tracing::error!("the API's listener: {e}"),
                };
                let stopped = async {
                    let _ = stop.await;
                };
                let tls = crate::http::Tls {
                    config: tls,
                    handshake_timeout: crate::http::HANDSHAKE_TIMEOUT,
                    handshakes: Some(app.timing.handshake.clone()),
                };
                crate::http::serve_with(listener, Some(tls), api::router(app), stopped).await;
            });
        })
}

/// The name kept in `state_dir`, or a new one (the host's name and a few random-enough hex
/// digits, so that two hosts of the same name stay apart) kept there for the next start.
fn service_name(state_dir: &std::path::Path) -> Result<String, ServiceError> {
    let path = state_dir.join(NAME_FILE);
    let io = |source| ServiceError::Io {
        what: format!("{}", path.display()),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(s) if !s.trim().is_empty() => return Ok(s.trim().to_owned()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "ferry".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tag = (u64::from(nanos) << 20) ^ u64::from(std::process::id());
    let name = format!("{host}-{:06x}", tag & 0xff_ffff);
    std::fs::write(&path, format!("{name}\n")).map_err(io)?;
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_sets_its_own_nice_only_and_its_threads_inherit_it() {
        let before = nice_now();
        let want = (before + 3).min(19);
        let (theirs, child) = std::thread::spawn(move || {
            set_nice(want);
            (nice_now(), std::thread::spawn(nice_now).join().unwrap())
        })
        .join()
        .unwrap();
        assert_eq!(theirs, want);
        assert_eq!(child, want);
        assert_eq!(nice_now(), before);
    }

    #[test]
    fn the_transfers_runtime_runs_below_the_caller_and_no_lower() {
        let before = nice_now();
        let want = (before + BULK_NICE).min(19);
        let rt = bulk_runtime().unwrap();
        // A blocking thread is started by a worker (already lowered): it gets the same.
        let (worker, blocking) = rt.block_on(async {
            tokio::spawn(async {
                let blocking = tokio::task::spawn_blocking(nice_now).await.unwrap();
                (nice_now(), blocking)
            })
            .await
            .unwrap()
        });
        assert_eq!((worker, blocking), (want, want));
        assert_eq!(nice_now(), before);
        rt.shutdown_background();
    }
}
