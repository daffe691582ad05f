//! Third-party copies, on each of the two servers. The destination mints a grant for a client
//! and holds it while the client's session stays open ([`mint`]); the source runs the put a
//! client would run, from its own confined scope to the destination, logging in with the grant
//! and pinning the destination's key, and reports progress to the client ([`copy`]). The data
//! flows between the two servers; the client's connections carry control frames only.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::filter::Filter;
use ferry_core::recv::{Destination, Links, Modes};
use ferry_core::root::Kind;
use ferry_core::send::Source;
use ferry_core::{path, Reporter};
use ferry_proto::{
    CompleteSummary, CopyProgress, CopyRequest, ErrorCode, Frame, MAX_CONTROL_PAYLOAD,
    MAX_COPY_SET, MAX_REPORT,
};
use tracing::info;

use super::access::Grant;
use super::grants::Outcome;
use super::state::ServerState;
use crate::client::{
    self, ClientConfig, ReceiverSetup, Security, StartFrom, StripeHost, TransferReport,
};
use crate::error::SessionError;
use crate::tls::{Fingerprint, ServerTrust};
use crate::transport::conn::{expect_frame, send};
use crate::transport::stream::Stream;
use crate::transport::tcp::peer_closed;

/// How often a source tells its client how the copy goes (and checks that the client is
/// still there: a copy whose client left is abandoned, and the client's rerun resumes it).
const PROGRESS_EVERY: Duration = Duration::from_millis(500);

/// How long a source retries its put at most. In practice less: the destination refuses the
/// grant once it lapsed, and the client gives up on a source that makes no progress for its
/// own `--retry-for`.
const SOURCE_RETRY_FOR: Duration = Duration::from_secs(24 * 3600);

/// Refuses a third-party request on a server that does not take part in them.
pub(super) fn allowed(shared: &ServerState) -> Result<(), SessionError> {
    if shared.config.third_party {
        return Ok(());
    }
    Err(SessionError::Remote {
        code: ErrorCode::DENIED,
        message: "this server does not take part in third-party copies; its administrator \
                  enables them with `ferry serve --third-party`"
            .into(),
    })
}

/// The destination's side: mints a grant for `scope` (already checked against the client's
/// token), sends it, and holds it until the client closes its session, which revokes it.
/// Meanwhile it tells the client when a session with the grant has stored everything (this
/// server's own `Complete`, not the source's word). A grant left unused for its time to live
/// ends the session.
pub(super) async fn mint(
    shared: &ServerState,
    stream: &mut Stream,
    scope: Grant,
) -> Result<(), SessionError> {
    let dest = scope.pinned_dest().unwrap_or_default().to_owned();
    let (grant, mut minted) = shared
        .grants
        .mint(scope)
        .map_err(|_| SessionError::Remote {
            code: ErrorCode::BUSY,
            message: "this server holds too many third-party grants; try again later".into(),
        })?;
    let ttl = shared.grants.ttl();
    let ttl_ms = u32::try_from(ttl.as_millis()).unwrap_or(u32::MAX);
    send(stream, &Frame::Granted { grant, ttl_ms }).await?;
    info!(dest = %format!("/{dest}"), "third-party grant minted");
    let mut check = tokio::time::interval(Duration::from_millis(100));
    let mut completed: Option<Instant> = None;
    loop {
        tokio::select! {
            outcome = minted.outcome() => {
                if let Some(Outcome::Complete(summary)) = outcome {
                    send(stream, &Frame::Complete(summary)).await?;
                    completed = Some(Instant::now());
                }
            }
            _ = check.tick() => {
                if peer_closed(stream.tcp()) {
                    return Ok(());
                }
                match completed {
                    // Its client has what it needs; a client that never closes is not waited
                    // for beyond the idle timeout.
                    Some(t) if t.elapsed() > shared.config.idle_timeout => return Ok(()),
                    Some(_) => {}
                    None if minted.expired() => {
                        return Err(SessionError::Remote {
                            code: ErrorCode::TIMEOUT,
                            message: format!(
                                "the third-party grant for `{dest}` was not used within {} s",
                                ttl.as_secs()
                            ),
                        });
                    }
                    None => {}
                }
            }
        }
    }
}

/// The source's side: puts what `sources` opens into `request.dest` on `request.peer` with
/// the grant, as a client would (parallel streams, tuning, resume, retries until the
/// destination says the grant lapsed), while the client hears its progress. Ends with
/// `CopyDone` and returns the files and bytes stored, or with the error that ended the put.
pub(super) async fn copy<F>(
    shared: &ServerState,
    stream: &mut Stream,
    request: CopyRequest,
    (sources, filter): (F, &Filter),
) -> Result<(u64, u64), SessionError>
where
    F: Fn() -> Result<Vec<Source>, SessionError>,
{
    let cfg = client_config(shared, &request, &request.peer);
    let progress = Arc::new(Progress::default());
    info!(
        peer = %request.peer,
        dest = %request.dest,
        only = request.only,
        stripes = request.stripes.len(),
        "third-party copy"
    );
    // A chosen set of paths lands in `dest` as a directory, whatever exists there yet.
    let dest = match request.only {
        true => format!("{}/", request.dest.trim_end_matches('/')),
        false => request.dest.clone(),
    };
    let put = client::put_sources_filtered(&cfg, sources, filter, &dest, progress.clone());
    let result = reporting(shared, stream, put, &progress).await?;
    let report = result.map_err(|e| to_peer("copying to", &request.peer, e))?;
    remember(shared, &request.peer, &report);
    done(stream, report).await
}

/// The destination's side of a pulled copy: gets `request.src` from the source at
/// `request.peer` (pinned by the key the client trusts, logged in to with the read grant it
/// minted; striped over `request.stripes`, each with its stripe read grant) into what `into`
/// opens, as a client's get would (parallel streams, tuning, verification, journaled resume,
/// retries until the source says the grant lapsed), while the client hears its progress.
/// `links`: which symlinks it makes (the source chooses their targets). Ends with `CopyDone`.
pub(super) async fn pull<F>(
    shared: &ServerState,
    stream: &mut Stream,
    request: CopyRequest,
    (into, setup, links): (F, &ReceiverSetup<'_>, Links),
) -> Result<(u64, u64), SessionError>
where
    F: Fn() -> Result<Destination, SessionError>,
{
    // Remembered apart from pushes to the same server: the path's other direction.
    let key = format!("pull:{}", request.peer);
    let mut cfg = client_config(shared, &request, &key);
    let (writers, tune_storage, _) = shared
        .config
        .storage_pool(shared.config.writers, request.opts.storage_threads);
    // The source chooses its own readers; a number the client gave is this server's writers.
    cfg.opts.storage_threads = 0;
    (cfg.writers, cfg.tune_storage, cfg.links) = (writers, tune_storage, links);
    cfg.modes = shared.config.modes;
    let progress = Arc::new(Progress::default());
    info!(
        peer = %request.peer,
        src = %request.src,
        stripes = request.stripes.len(),
        "pulled third-party copy"
    );
    let get = client::get_to_destination(&cfg, &request.src, into, setup, progress.clone());
    let result = reporting(shared, stream, get, &progress).await?;
    let report = result.map_err(|e| to_peer("copying from", &request.peer, e))?;
    remember(shared, &key, &report);
    done(stream, report).await
}

/// Runs `transfer` while telling the client how it goes every [`PROGRESS_EVERY`]; a client
/// that left ends it (dropping the transfer closes its connections; the destination keeps
/// what is verified for the client's rerun).
async fn reporting(
    shared: &ServerState,
    stream: &mut Stream,
    transfer: impl std::future::Future<Output = Result<TransferReport, SessionError>>,
    progress: &Progress,
) -> Result<Result<TransferReport, SessionError>, SessionError> {
    tokio::pin!(transfer);
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    let idle = shared.config.idle_timeout;
    loop {
        tokio::select! {
            r = &mut transfer => return Ok(r),
            _ = tick.tick() => {
                if peer_closed(stream.tcp()) {
                    return Err(SessionError::Closed("control"));
                }
                let frame = Frame::CopyProgress(progress.snapshot());
                tokio::time::timeout(idle, send(stream, &frame))
                    .await
                    .map_err(|_| SessionError::Timeout("the client to read progress"))??;
            }
        }
    }
}

/// Ends a copy's session with `CopyDone`: the summary and the report of the transfer this
/// server ran. Returns the files and bytes stored.
async fn done(stream: &mut Stream, report: TransferReport) -> Result<(u64, u64), SessionError> {
    let summary = CompleteSummary {
        files: report.files,
        bytes: report.bytes,
        skipped: report.skipped,
        failed: report.failed,
        bad_blocks: report.bad_blocks,
        receiver: ferry_proto::Load::default(),
    };
    let report = report_json(&report);
    let stored = (summary.files, summary.bytes);
    send(stream, &Frame::CopyDone { summary, report }).await?;
    Ok(stored)
}

/// Reads the `CopyPaths` that follow a `CopyRequest` with `only`: the paths below its source
/// to send (with the directories that lead to them), as a filter that lets through those
/// alone. Bounded by [`MAX_COPY_SET`] bytes in all.
pub(super) async fn read_only(
    shared: &ServerState,
    stream: &mut Stream,
) -> Result<Filter, SessionError> {
    let (mut paths, mut bytes) = (HashSet::new(), 0usize);
    loop {
        let frame = tokio::time::timeout(
            shared.config.idle_timeout,
            expect_frame(stream, MAX_CONTROL_PAYLOAD, "control"),
        )
        .await
        .map_err(|_| SessionError::Timeout("waiting for the paths of a copy"))??;
        let Frame::CopyPaths {
            paths: more_paths,
            more,
        } = frame
        else {
            return Err(SessionError::Protocol(format!(
                "expected the paths of a copy, got {:?}",
                frame.frame_type()
            )));
        };
        for p in more_paths {
            bytes = bytes.saturating_add(p.len());
            if bytes > MAX_COPY_SET {
                return Err(bad_request(format!(
                    "a copy may name at most {} MiB of paths; copy a subtree at a time",
                    MAX_COPY_SET >> 20
                )));
            }
            let rel = path::normalize_remote(&p)
                .ok()
                .filter(|r| !r.is_empty() && *r == p)
                .ok_or_else(|| bad_request(format!("`{p}` is not a path below the source")))?;
            paths.insert(rel);
        }
        if !more {
            return Ok(Filter::only(paths));
        }
    }
}

/// The source of a copy of chosen paths: a directory, sent as its contents only (into the
/// destination itself).
pub(super) fn contents_of(mut source: Source) -> Result<Source, SessionError> {
    let meta = source.root.lstat(&source.rel)?;
    if meta.kind != Kind::Dir {
        return Err(bad_request(format!(
            "`{}` is not a directory: a copy of chosen paths takes them from one",
            source.name
        )));
    }
    source.name = String::new();
    Ok(source)
}

fn bad_request(message: String) -> SessionError {
    SessionError::Remote {
        code: ErrorCode::BAD_REQUEST,
        message,
    }
}

/// The source's put to the destination: the client's options (already within this server's
/// limits), this server's reader pool, the destination pinned by the key the client trusts,
/// and a start from what the last copy there settled on.
fn client_config(shared: &ServerState, request: &CopyRequest, key: &str) -> ClientConfig {
    let config = &shared.config;
    let mut opts = request.opts.clone();
    let mut start_from = StartFrom::Default;
    let remembered = shared
        .paths
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(key)
        .copied();
    let remembered = remembered.unwrap_or_default();
    let mut helpers = 0;
    if opts.is_auto() {
        if let Some((streams, settled)) = remembered.streams {
            opts.auto_start = streams.clamp(1, opts.streams);
            start_from = StartFrom::Profile { settled };
        }
        // Over a path an earlier copy measured as long and fast, as a client's put does.
        if let Some((rtt_us, rate)) = remembered.path {
            helpers = crate::ramp_helpers(Duration::from_micros(rtt_us), rate);
            opts.streams = opts.streams.saturating_add(helpers);
        }
    }
    let (readers, tune_storage, _) = config.storage_pool(config.readers, 0);
    ClientConfig {
        server: request.peer.clone(),
        token: request.grant.clone(),
        opts,
        readers,
        writers: config.writers,
        tune_storage,
        storage_from: "default",
        block_from: "default",
        connect_timeout: config.handshake_timeout,
        idle_timeout: config.idle_timeout,
        corrupt_blocks: Vec::new(),
        // Until the destination says the grant lapsed (`auth`, not retried) or the client
        // leaves: the destination keeps it usable for its time to live after each failed
        // session, however long the copy ran before.
        retry_for: SOURCE_RETRY_FOR,
        security: Security::Tls(ServerTrust::Pinned(Fingerprint(request.fingerprint))),
        start_from,
        force_streams: None,
        stall_stream: None,
        drain_at_end: false,
        helpers,
        modes: Modes::default(),
        links: Links::Any,
        multipath: false,
        bind: Vec::new(),
        // A striped copy: the other hosts of the destination (a push) or of the source (a
        // pull), each pinned by the key the client trusts it by and logged in to with the
        // stripe grant it minted.
        stripe: request
            .stripes
            .iter()
            .map(|s| StripeHost {
                server: s.addr.clone(),
                security: Security::Tls(ServerTrust::Pinned(Fingerprint(s.fingerprint))),
                token: Some(s.grant.clone()),
            })
            .collect(),
    }
}

/// Keeps what the tuner held at the end and what the path measured, for the next copy to the
/// same destination.
fn remember(shared: &ServerState, peer: &str, report: &TransferReport) {
    if !report.is_success() {
        return;
    }
    let t = &report.tuning;
    let streams = t
        .worth_remembering()
        .then(|| (u16::try_from(t.streams).unwrap_or(u16::MAX), t.settled));
    let path = report.path_measured();
    let mut paths = shared.paths.lock().unwrap_or_else(|e| e.into_inner());
    // One entry per destination a client named; bounded like the grant table.
    if paths.len() >= 4096 && !paths.contains_key(peer) {
        return;
    }
    let entry = paths.entry(peer.to_owned()).or_default();
    entry.streams = streams.or(entry.streams);
    entry.path = path.or(entry.path);
}

/// A failed put to the destination (or get from the source), as the client is told: the code
/// it failed with (so that `busy` and `timeout` stay retryable), and where.
fn to_peer(doing: &str, peer: &str, e: SessionError) -> SessionError {
    let Frame::Error { code, message } = e.to_frame() else {
        unreachable!("to_frame makes an Error frame")
    };
    SessionError::Remote {
        code,
        message: crate::error::within(code, &format!("{doing} {peer}"), &message),
    }
}

/// The source's report as JSON, within what a `CopyDone` may carry: a report too long (a
/// very long timeline) goes without its timeline.
fn report_json(report: &TransferReport) -> String {
    let json = serde_json::to_string(report).unwrap_or_default();
    if json.len() <= MAX_REPORT {
        return json;
    }
    let mut short = report.clone();
    short.timeline = Default::default();
    short.streams.clear();
    let json = serde_json::to_string(&short).unwrap_or_default();
    if json.len() <= MAX_REPORT {
        json
    } else {
        String::from("{}")
    }
}

/// Counts what the source's put reports, for the client's progress.
#[derive(Default)]
struct Progress {
    found_files: AtomicU64,
    found_bytes: AtomicU64,
    walk_done: AtomicBool,
    files: AtomicU64,
    bytes: AtomicU64,
}

impl Progress {
    fn snapshot(&self) -> CopyProgress {
        CopyProgress {
            found_files: self.found_files.load(Ordering::Relaxed),
            found_bytes: self.found_bytes.load(Ordering::Relaxed),
            walk_done: self.walk_done.load(Ordering::Relaxed),
            files: self.files.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }
}

impl Reporter for Progress {
    fn on_discovered(&self, files: u64, bytes: u64) {
        self.found_files.fetch_add(files, Ordering::Relaxed);
        self.found_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
    fn on_walk_done(&self) {
        self.walk_done.store(true, Ordering::Relaxed);
    }
    fn on_bytes(&self, n: u64) {
        self.bytes.fetch_add(n, Ordering::Relaxed);
    }
    fn on_file_done(&self) {
        self.files.fetch_add(1, Ordering::Relaxed);
    }
}
