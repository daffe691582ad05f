//! Runs one attempt of a job through ferry-net's client library (never the ferry binary):
//! the client configuration for each server from the endpoints, the sources confined to the
//! service's local root, and a [`JobReporter`] that counts what the transfer reports.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferry_core::filter::Filter;
use ferry_core::send::Source;
use ferry_core::{Reporter, Root};
use ferry_net::copy::CopyConfig;
use ferry_net::sync::{Direction, SyncOpts};
use ferry_net::{ClientConfig, SessionError};
use ferry_proto::{ChecksumAlgo, ExistingPolicy, TransferOpts};

use crate::endpoints::Endpoints;
use crate::job::{Job, Kind, Progress, SyncMode};
use crate::location::{name_of, under, Location};

/// How the service's transfers are tuned and reach their servers.
#[derive(Clone, Debug)]
pub struct Runner {
    pub endpoints: Endpoints,
    /// The directory local paths of put and get jobs are below; `None`: only cp jobs run.
    pub local_root: Option<PathBuf>,
    pub block_size: u32,
    /// Test hook: each reported block waits this long, so that a test can stop the service
    /// while a job is surely running.
    pub pace: Option<Duration>,
    /// Test hook: every transfer runs this many streams, untuned, so that a test can bound
    /// what a cut costs per connection.
    pub fixed_streams: Option<u16>,
    /// Test hook: data connection `i` of every put never writes its first block (ferry-net's
    /// `ClientConfig::stall_stream`), so that the endgame must send a copy of it.
    pub stall_stream: Option<usize>,
}

/// What an attempt that ran to its end did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The files that failed (a job with any is failed, not retried).
    pub errors: Vec<String>,
    /// The streams ferry's tuner settled on in the attempt's last transfer, if it settled.
    pub streams: Option<u32>,
}

impl Outcome {
    /// Takes in one transfer's report: its errors, and its tuner's settled count.
    fn add(&mut self, r: &ferry_net::TransferReport) {
        self.errors.extend(r.errors.iter().cloned());
        if r.tuning.mode == "auto" && r.tuning.settled && r.tuning.streams > 0 {
            self.streams = Some(r.tuning.streams);
        }
    }
}

/// Why an attempt failed, and whether another may succeed.
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub retryable: bool,
}

impl From<SessionError> for Failure {
    fn from(e: SessionError) -> Self {
        Self {
            retryable: e.is_retryable(),
            message: e.to_string(),
        }
    }
}

fn refused(message: String) -> Failure {
    Failure {
        message,
        retryable: false,
    }
}

/// Checks that `rel` below the local root names no symlink on its way or at its end, making
/// its parent directories with `create` (`Root::scope`, which never follows a link), and
/// returns its path: for the sync modes, which take paths. The plain put and get open their
/// files beneath the root themselves, so a link swapped in later cannot lead them out either.
fn confined(root: &Path, rel: &str, create: bool) -> Result<PathBuf, Failure> {
    let why = |e: ferry_core::FsError| {
        refused(format!(
            "{rel}: {e} (a job's local path may not pass through a symlink)"
        ))
    };
    let (dir, name) = ferry_core::path::split_parent(rel);
    let scope = Root::open(root)
        .and_then(|r| r.scope(dir, create))
        .map_err(why)?;
    if !name.is_empty() {
        if let Ok(m) = scope.lstat(name) {
            if m.kind == ferry_core::root::Kind::Symlink {
                return Err(refused(format!(
                    "{rel}: a symlink (a job's local path may not pass through a symlink)"
                )));
            }
        }
    }
    Ok(under(root, rel))
}

/// A job's counters as the transfer reports them; the scheduler writes them to the store.
#[derive(Debug, Default)]
pub struct JobReporter {
    files_done: AtomicU64,
    files_total: AtomicU64,
    bytes_done: AtomicU64,
    bytes_total: AtomicU64,
    /// Every byte any job moved, for `/metrics`.
    moved: Arc<AtomicU64>,
    pace: Option<Duration>,
}

impl JobReporter {
    pub fn new(moved: Arc<AtomicU64>, pace: Option<Duration>) -> Self {
        Self {
            moved,
            pace,
            ..Self::default()
        }
    }

    /// The counters now; `rate` is left to the caller, who knows the interval.
    pub fn snapshot(&self) -> Progress {
        Progress {
            files_done: self.files_done.load(Ordering::Relaxed),
            files_total: self.files_total.load(Ordering::Relaxed),
            bytes_done: self.bytes_done.load(Ordering::Relaxed),
            bytes_total: self.bytes_total.load(Ordering::Relaxed),
            rate: 0.0,
        }
    }
}

impl Reporter for JobReporter {
    fn on_discovered(&self, files: u64, bytes: u64) {
        self.files_total.fetch_add(files, Ordering::Relaxed);
        self.bytes_total.fetch_add(bytes, Ordering::Relaxed);
    }

    fn on_bytes(&self, n: u64) {
        self.bytes_done.fetch_add(n, Ordering::Relaxed);
        self.moved.fetch_add(n, Ordering::Relaxed);
        if let Some(d) = self.pace {
            pause(d);
        }
    }

    fn on_file_done(&self) {
        self.files_done.fetch_add(1, Ordering::Relaxed);
    }
}

/// Sleeps on the calling thread (the test hook); on a multi-thread runtime, its other tasks
/// move to other workers meanwhile.
fn pause(d: Duration) {
    let multi = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi {
        tokio::task::block_in_place(|| std::thread::sleep(d));
    } else {
        std::thread::sleep(d);
    }
}

/// A job's sources and destination, read and checked: which way it goes, and the server
/// whose per-server limit it counts against.
pub fn classify(sources: &[String], dest: &str) -> Result<(Kind, String), crate::ServiceError> {
    let bad = |m: &str| Err(crate::ServiceError::Invalid(m.to_owned()));
    let dest = Location::parse(dest)?;
    let srcs = sources
        .iter()
        .map(|s| Location::parse(s))
        .collect::<Result<Vec<_>, _>>()?;
    let remote_srcs: Vec<&str> = srcs.iter().filter_map(Location::server).collect();
    let Some(first) = srcs.first() else {
        return bad("a job needs at least one source");
    };
    if !remote_srcs.is_empty() && remote_srcs.len() != srcs.len() {
        return bad("a job's sources are all local or all on one server, not both");
    }
    if remote_srcs.iter().any(|s| Some(*s) != first.server()) {
        return bad("a job's remote sources must all be on one server");
    }
    match (first.server(), dest.server()) {
        (None, Some(d)) => Ok((Kind::Put, d.to_owned())),
        (Some(s), None) => Ok((Kind::Get, s.to_owned())),
        (Some(_), Some(d)) => Ok((Kind::Cp, d.to_owned())),
        (None, None) => bad("source and destination are both local: nothing for ferry to move"),
    }
}

impl Runner {
    /// One attempt of `job`, reporting to `reporter`, its transfers' tuners starting from
    /// `streams` when given (the link optimizer's share). `Ok`: the transfers ran to their end.
    pub async fn run(
        &self,
        job: &Job,
        reporter: Arc<JobReporter>,
        streams: Option<u32>,
    ) -> Result<Outcome, Failure> {
        let dest = Location::parse(&job.dest).map_err(|e| refused(e.to_string()))?;
        let srcs = job
            .sources
            .iter()
            .map(|s| Location::parse(s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| refused(e.to_string()))?;
        let reporter: Arc<dyn Reporter> = reporter;
        match (job.kind, dest) {
            (Kind::Put, Location::Remote { server, path }) => {
                let cfg = self.client(&server, job.sync, streams)?;
                self.put(&cfg, &srcs, &path, job.sync, reporter).await
            }
            (Kind::Get, Location::Local(rel)) => {
                self.get(&srcs, &rel, job.sync, reporter, streams).await
            }
            (Kind::Cp, Location::Remote { server, path }) => {
                if job.sync != SyncMode::Off {
                    return Err(refused(
                        "sync between two servers is not supported yet".into(),
                    ));
                }
                self.cp(&srcs, &server, &path, reporter, streams).await
            }
            (kind, _) => Err(refused(format!(
                "job {}: a {} whose destination does not fit it",
                job.id,
                kind.as_str()
            ))),
        }
    }

    fn root(&self) -> Result<&Path, Failure> {
        self.local_root.as_deref().ok_or_else(|| {
            refused("the service has no --local-root: it runs only server-to-server copies".into())
        })
    }

    /// The client configuration a probe of `server` starts from (its `opts` are the probe's).
    pub fn probe_client(&self, server: &str) -> Result<ClientConfig, Failure> {
        self.client(server, SyncMode::Off, None)
    }

    /// The client configuration for `server`: the endpoint's token and trust, streams tuned
    /// by ferry (from `streams` when the optimizer gives a start), no retries of its own (the
    /// scheduler retries, with the job's attempts counted).
    fn client(
        &self,
        server: &str,
        sync: SyncMode,
        streams: Option<u32>,
    ) -> Result<ClientConfig, Failure> {
        let (token, security) = self
            .endpoints
            .reach(server)
            .map_err(|e| refused(e.to_string()))?;
        Ok(ClientConfig {
            server: server.to_owned(),
            token,
            opts: TransferOpts {
                streams: self.fixed_streams.unwrap_or(ferry_net::AUTO_MAX_STREAMS),
                block_size: self.block_size,
                checksum: ChecksumAlgo::Blake3,
                existing: match sync {
                    SyncMode::Off => ExistingPolicy::Fail,
                    SyncMode::Size | SyncMode::Mtime | SyncMode::Checksum => {
                        ExistingPolicy::Overwrite
                    }
                },
                tcp_window: 0,
                auto_start: match streams {
                    _ if self.fixed_streams.is_some() => 0,
                    Some(n) => u16::try_from(n)
                        .unwrap_or(u16::MAX)
                        .clamp(1, ferry_net::AUTO_MAX_STREAMS),
                    None => ferry_net::DEFAULT_STREAMS,
                },
                storage_threads: 0,
            },
            readers: 4,
            writers: 4,
            tune_storage: true,
            storage_from: "default",
            block_from: "fixed",
            connect_timeout: Duration::from_secs(15),
            idle_timeout: Duration::from_secs(120),
            corrupt_blocks: Vec::new(),
            retry_for: Duration::ZERO,
            security,
            // What the link's earlier transfers settled on, shared out: a profile of sorts.
            start_from: match streams {
                Some(_) => ferry_net::StartFrom::Profile { settled: false },
                None => Default::default(),
            },
            force_streams: None,
            stall_stream: self.stall_stream,
            drain_at_end: false,
            helpers: 0,
            modes: Default::default(),
            links: Default::default(),
            multipath: false,
            bind: Vec::new(),
            stripe: Vec::new(),
        })
    }

    async fn put(
        &self,
        cfg: &ClientConfig,
        srcs: &[Location],
        dest: &str,
        sync: SyncMode,
        reporter: Arc<dyn Reporter>,
    ) -> Result<Outcome, Failure> {
        let root = self.root()?.to_path_buf();
        let rels: Vec<String> = srcs
            .iter()
            .filter_map(|s| match s {
                Location::Local(rel) => Some(rel.clone()),
                Location::Remote { .. } => None,
            })
            .collect();
        if sync == SyncMode::Size {
            let mut out = Outcome::default();
            for rel in &rels {
                confined(&root, rel, false)?;
                let to = format!("{}/{}", dest.trim_end_matches('/'), name_of(rel));
                let errors = crate::sizesync::put(cfg, &root, rel, &to, reporter.clone()).await?;
                out.errors.extend(errors);
            }
            return Ok(out);
        }
        if let Some(checksum) = sync.compares() {
            let mut out = Outcome::default();
            for rel in &rels {
                let to = format!("{}/{}", dest.trim_end_matches('/'), name_of(rel));
                let dir = Direction::Put {
                    src: confined(&root, rel, false)?,
                    dest: to,
                };
                let r = ferry_net::sync::sync(
                    cfg,
                    &dir,
                    &Filter::default(),
                    checksum,
                    reporter.clone(),
                )
                .await?;
                if let Some(t) = &r.transfer {
                    out.add(t);
                }
                out.errors.extend(r.delete_errors);
            }
            return Ok(out);
        }
        // Opened below the local root for each attempt: a symlink cannot lead a source out.
        let sources = || -> Result<Vec<Source>, SessionError> {
            rels.iter()
                .map(|rel| {
                    if rel.is_empty() {
                        let why = std::io::Error::other("cannot send the local root itself");
                        return Err(ferry_core::FsError::io("/".to_owned(), why).into());
                    }
                    Ok(Source {
                        root: Root::open(&root)?,
                        rel: rel.clone(),
                        name: name_of(rel).to_owned(),
                    })
                })
                .collect()
        };
        let r = ferry_net::client::put_sources(cfg, sources, dest, reporter).await?;
        let mut out = Outcome::default();
        out.add(&r);
        Ok(out)
    }

    /// Gets each source into `rel` below the local root, which is made if missing and may not
    /// pass through a symlink.
    async fn get(
        &self,
        srcs: &[Location],
        rel: &str,
        sync: SyncMode,
        reporter: Arc<dyn Reporter>,
        streams: Option<u32>,
    ) -> Result<Outcome, Failure> {
        let root = self.root()?.to_path_buf();
        confined(&root, rel, true)?;
        let into = || Ok(Root::open(&root)?.scope(rel, true)?);
        let mut out = Outcome::default();
        for s in srcs {
            let Location::Remote { server, path } = s else {
                continue;
            };
            let cfg = self.client(server, sync, streams)?;
            if sync == SyncMode::Size || sync.compares().is_some() {
                let name = format!("{}/{}", rel.trim_end_matches('/'), name_of(path));
                let to = confined(&root, name.trim_start_matches('/'), true)?;
                if sync == SyncMode::Size {
                    let errors = crate::sizesync::get(&cfg, path, &to, reporter.clone()).await?;
                    out.errors.extend(errors);
                    continue;
                }
                let dir = Direction::Get {
                    src: path.clone(),
                    dest: to,
                };
                let r = ferry_net::sync::sync(
                    &cfg,
                    &dir,
                    &Filter::default(),
                    sync.compares().unwrap_or_default(),
                    reporter.clone(),
                )
                .await?;
                if let Some(t) = &r.transfer {
                    out.add(t);
                }
                continue;
            }
            let r = ferry_net::client::get_into(&cfg, path, into, reporter.clone()).await?;
            out.add(&r);
        }
        Ok(out)
    }

    async fn cp(
        &self,
        srcs: &[Location],
        server: &str,
        dest: &str,
        reporter: Arc<dyn Reporter>,
        streams: Option<u32>,
    ) -> Result<Outcome, Failure> {
        let mut out = Outcome::default();
        for s in srcs {
            let Location::Remote { server: from, path } = s else {
                continue;
            };
            let cfg = CopyConfig {
                source: self.client(from, SyncMode::Off, streams)?,
                dest: self.client(server, SyncMode::Off, None)?,
                dest_addr: None,
            };
            let r = ferry_net::copy::copy(&cfg, path, dest, reporter.clone()).await?;
            // The source's own put carries the data: its tuner's count, as it reported it.
            let tuning = &r.source_report["tuning"];
            if tuning["mode"] == "auto" && tuning["settled"] == true {
                let n = tuning["streams"]
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok());
                out.streams = n.filter(|n| *n > 0).or(out.streams);
            }
            out.errors.extend(r.errors);
        }
        Ok(out)
    }
}

impl SyncMode {
    /// The `ferry sync` options this mode runs with; `None` for a plain transfer, or a sync by
    /// size (`sizesync`, which ferry sync has no comparison for).
    fn compares(self) -> Option<SyncOpts> {
        match self {
            SyncMode::Off | SyncMode::Size => None,
            SyncMode::Mtime | SyncMode::Checksum => Some(SyncOpts {
                checksum: self == SyncMode::Checksum,
                delete: false,
                dry_run: false,
            }),
        }
    }
}
