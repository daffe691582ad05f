//! The client of a third-party copy: server A puts into server B while this client only
//! holds a control session to each. B mints a grant for this one transfer; A presents it,
//! pinning B by the key this client trusts B by; the data flows from A to B directly. A
//! pulled copy turns the roles around: A (and each other host of a source endpoint) mints a
//! read grant, and B gets with it. docs/PROTOCOL.md, "Third-party copies", "Pulled copies".

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::Reporter;
use ferry_proto::{
    Capabilities, CompleteSummary, CopyProgress, CopyRequest, CopyStripe, ErrorCode, Frame,
    MAX_CONTROL_PAYLOAD, MAX_COPY_PATHS, MAX_COPY_SET, MAX_COPY_STRIPES,
};
use serde::Serialize;

use crate::client::{connect, retrying, ClientConfig, Connected};
use crate::conn::{expect_frame, send};
use crate::error::SessionError;
use crate::stream::Stream;

/// How long the client waits for the destination's own word once the source says it is done:
/// the destination tells its minting session right after it sent its `Complete` to the source.
const CONFIRM_WITHIN: Duration = Duration::from_secs(30);

/// The two servers of a copy, each as this client reaches it (its own token, trust and
/// timeouts). `source.opts` are the transfer's options (streams, block size, checksum, the
/// existing-file policy); `source.retry_for` is how long the whole copy is retried.
#[derive(Clone, Debug)]
pub struct CopyConfig {
    pub source: ClientConfig,
    pub dest: ClientConfig,
    /// The destination's `host:port` as the source reaches it, when it differs from the one
    /// this client uses (another network, a data interface); default `dest.server`.
    pub dest_addr: Option<String>,
}

/// What a finished copy did, as `--json` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct CopyReport {
    pub direction: &'static str,
    /// What the destination itself says it stored (its `Complete` to this client).
    pub files: u64,
    pub bytes: u64,
    pub skipped: u64,
    pub failed: u64,
    pub bad_blocks: u64,
    pub seconds: f64,
    pub mib_per_s: f64,
    /// Sessions it took: more than 1 when the copy resumed after a failure.
    pub attempts: u32,
    pub source: String,
    pub destination: String,
    /// The destination's key, as this client pinned it and handed it to the source.
    pub destination_fingerprint: String,
    /// The report of the transfer the running server ran, as it sent it (streams, tuning,
    /// bottleneck, stripe hosts): the source's put, or a pulled copy's destination's get.
    pub source_report: serde_json::Value,
    pub errors: Vec<String>,
}

impl CopyReport {
    pub fn is_success(&self) -> bool {
        self.failed == 0 && self.errors.is_empty()
    }
}

/// Copies `src` on the source server into `dest` on the destination, retrying (and resuming:
/// the destination keeps what is verified) on failures that a retry can fix. A source of
/// several hosts (`cfg.source.stripe`) is pulled, as [`pull`] does.
pub async fn copy(
    cfg: &CopyConfig,
    src: &str,
    dest: &str,
    reporter: Arc<dyn Reporter>,
) -> Result<CopyReport, SessionError> {
    let how = match cfg.source.stripe.is_empty() {
        true => How::Push,
        false => How::Pull,
    };
    copy_chosen(cfg, (src, None), dest, how, reporter).await
}

/// [`copy`] that the destination runs as a get from the source, the source's other hosts
/// (`cfg.source.stripe`) sending blocks too: the client asks the source for a read grant, each
/// other host for a stripe read grant, and the destination to pull with them. It serves a
/// source that cannot reach the destination (a firewall that lets the destination connect
/// out only) and a source of several hosts.
pub async fn pull(
    cfg: &CopyConfig,
    src: &str,
    dest: &str,
    reporter: Arc<dyn Reporter>,
) -> Result<CopyReport, SessionError> {
    copy_chosen(cfg, (src, None), dest, How::Pull, reporter).await
}

/// Which server runs a copy's transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum How {
    /// The source puts into the destination with the destination's grant.
    Push,
    /// The destination gets from the source with the source's read grant.
    Pull,
}

/// [`copy`] of only `paths` below the directory `src` (each `/`-separated below it: the files
/// to send and every directory leading to them), into `dest` itself: a sync's changed files.
pub async fn copy_only(
    cfg: &CopyConfig,
    src: &str,
    paths: &[String],
    dest: &str,
    reporter: Arc<dyn Reporter>,
) -> Result<CopyReport, SessionError> {
    let bytes: usize = paths.iter().map(String::len).sum();
    if bytes > MAX_COPY_SET {
        return Err(SessionError::Protocol(format!(
            "{} paths ({} MiB) are more than one copy may name ({} MiB); sync a subtree at a \
             time",
            paths.len(),
            bytes >> 20,
            MAX_COPY_SET >> 20
        )));
    }
    copy_chosen(cfg, (src, Some(paths)), dest, How::Push, reporter).await
}

async fn copy_chosen(
    cfg: &CopyConfig,
    (src, only): (&str, Option<&[String]>),
    dest: &str,
    how: How,
    reporter: Arc<dyn Reporter>,
) -> Result<CopyReport, SessionError> {
    refuse_unsupported(cfg, only.is_some(), how)?;
    let t0 = Instant::now();
    let (mut report, attempts) = retrying(cfg.source.retry_for, reporter.as_ref(), || {
        let reporter = reporter.clone();
        async move {
            match how {
                How::Push => push_once(cfg, (src, only), dest, reporter).await,
                How::Pull => pull_once(cfg, src, dest, reporter).await,
            }
        }
    })
    .await?;
    report.attempts = attempts;
    report.seconds = t0.elapsed().as_secs_f64();
    report.mib_per_s = report.bytes as f64 / f64::from(1 << 20) / report.seconds.max(1e-9);
    Ok(report)
}

/// Refuses, before anything is asked of a server, a copy this client cannot run as asked:
/// a pushed copy's source stripes nothing (its hosts would have to read for it), a pulled
/// copy's destination stripes nothing (its get writes on one host), and a copy of chosen
/// paths is pushed.
fn refuse_unsupported(cfg: &CopyConfig, only: bool, how: How) -> Result<(), SessionError> {
    let why = match how {
        How::Push if !cfg.source.stripe.is_empty() => {
            "a copy pushed by its source (a sync between servers) stripes only its destination; \
             name one host of the source"
        }
        How::Pull if only => {
            "a copy of chosen paths (a sync between servers) is pushed by its source, not pulled"
        }
        How::Pull if !cfg.dest.stripe.is_empty() => {
            "a copy stripes its source (pulled by the destination) or its destination (pushed \
             by the source), not both yet: name one host of either endpoint"
        }
        _ => return Ok(()),
    };
    Err(SessionError::Protocol(why.into()))
}

/// One attempt of a pushed copy: the destination mints a grant (its other hosts each a stripe
/// grant), the source puts with it.
async fn push_once(
    cfg: &CopyConfig,
    (src, only): (&str, Option<&[String]>),
    dest: &str,
    reporter: Arc<dyn Reporter>,
) -> Result<CopyReport, SessionError> {
    let t0 = Instant::now();
    let (granted, grant, fingerprint) = ask_grant(cfg, dest, reporter.as_ref()).await?;
    // Held until the copy ends: closing a stripe host's minting session revokes its grant.
    let ask = Frame::StripeGrantRequest {
        dest: dest.to_owned(),
    };
    let needs = (
        Capabilities::STRIPE | Capabilities::STRIPE_COPY,
        "striped copies (an older ferry, or not serve --stripe)",
    );
    let (_minting, stripes) = ask_stripe_grants(&cfg.dest, ask, needs, reporter.clone()).await?;
    let mut source = connect(&cfg.source, reporter.as_ref())
        .await
        .map_err(|e| at("source", &cfg.source.server, e))?;
    if !stripes.is_empty() && !source.caps.has(Capabilities::STRIPE_COPY) {
        return Err(SessionError::Remote {
            code: ErrorCode::DENIED,
            message: format!(
                "source {} cannot run a striped copy (an older ferry); copy to one host of \
                 the destination",
                cfg.source.server
            ),
        });
    }
    let request = CopyRequest {
        src: src.to_owned(),
        dest: dest.to_owned(),
        peer: cfg
            .dest_addr
            .clone()
            .unwrap_or_else(|| cfg.dest.server.clone()),
        fingerprint: fingerprint.0,
        grant,
        opts: cfg.source.opts.clone(),
        only: only.is_some(),
        stripes,
        pull: false,
    };
    send(&mut source.control, &Frame::CopyRequest(Box::new(request))).await?;
    if let Some(paths) = only {
        send_paths(&mut source.control, paths)
            .await
            .map_err(|e| at("source", &cfg.source.server, e))?;
    }
    let runner = (Side::Source, source.control);
    let ended = watch(cfg, runner, Some(granted.control), reporter.as_ref()).await?;
    Ok(copy_report(cfg, ended, fingerprint, t0))
}

/// One attempt of a pulled copy: the source mints a read grant (its other hosts each a
/// stripe read grant), the destination gets with it. The destination is asked first, so that
/// one that cannot pull is refused before any grant is minted.
async fn pull_once(
    cfg: &CopyConfig,
    src: &str,
    dest: &str,
    reporter: Arc<dyn Reporter>,
) -> Result<CopyReport, SessionError> {
    let t0 = Instant::now();
    let server = &cfg.dest.server;
    let mut runner = connect(&cfg.dest, reporter.as_ref())
        .await
        .map_err(|e| at("destination", server, e))?;
    // The report names the destination's key, as this client pinned it.
    let Some(dest_key) = runner.tls.as_ref().and_then(|t| t.pin()) else {
        return Err(SessionError::Tls(
            "a third-party copy needs TLS to every server".into(),
        ));
    };
    if !runner.caps.has(Capabilities::PULL_COPY) {
        return Err(SessionError::Remote {
            code: ErrorCode::DENIED,
            message: format!("destination {server} cannot pull a copy (an older ferry)"),
        });
    }
    let ask = Frame::ReadGrantRequest {
        src: src.to_owned(),
        stripe: false,
    };
    let needs = (Capabilities::PULL_COPY, "pulled copies (an older ferry)");
    // Held until the copy ends: closing a minting session revokes its grant.
    let (_minting, grant, fingerprint) = minted(&cfg.source, ask, needs, reporter.as_ref())
        .await
        .map_err(|e| at("source", &cfg.source.server, e))?;
    let ask = Frame::ReadGrantRequest {
        src: src.to_owned(),
        stripe: true,
    };
    let needs = (
        Capabilities::STRIPE | Capabilities::STRIPE_READ | Capabilities::PULL_COPY,
        "striped pulled copies (an older ferry, or not serve --stripe)",
    );
    let (_stripe_minting, stripes) =
        ask_stripe_grants(&cfg.source, ask, needs, reporter.clone()).await?;
    let request = CopyRequest {
        src: src.to_owned(),
        dest: dest.to_owned(),
        peer: cfg.source.server.clone(),
        fingerprint: fingerprint.0,
        grant,
        opts: cfg.source.opts.clone(),
        only: false,
        stripes,
        pull: true,
    };
    send(&mut runner.control, &Frame::CopyRequest(Box::new(request))).await?;
    let ended = watch(cfg, (Side::Dest, runner.control), None, reporter.as_ref()).await?;
    Ok(copy_report(cfg, ended, dest_key, t0))
}

/// What a copy did: the destination's own summary, the running server's report and errors.
fn copy_report(
    cfg: &CopyConfig,
    ((summary, json), confirmed): Ended,
    fingerprint: crate::tls::Fingerprint,
    t0: Instant,
) -> CopyReport {
    let source_report: serde_json::Value =
        serde_json::from_str(&json).unwrap_or(serde_json::Value::Null);
    let mut errors: Vec<String> = source_report
        .get("errors")
        .and_then(|e| e.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|m| m.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    if confirmed.files + confirmed.skipped < summary.files + summary.skipped {
        errors.push(format!(
            "the source reports {} files stored, the destination {}",
            summary.files, confirmed.files
        ));
    }
    let seconds = t0.elapsed().as_secs_f64();
    CopyReport {
        direction: "copy",
        files: confirmed.files,
        bytes: confirmed.bytes,
        skipped: confirmed.skipped,
        failed: confirmed.failed.max(summary.failed),
        bad_blocks: confirmed.bad_blocks,
        seconds,
        mib_per_s: confirmed.bytes as f64 / f64::from(1 << 20) / seconds.max(1e-9),
        attempts: 1,
        source: cfg.source.server.clone(),
        destination: cfg.dest.server.clone(),
        destination_fingerprint: fingerprint.to_string(),
        source_report,
        errors,
    }
}

/// Sends the paths of a copy of chosen paths, each `CopyPaths` within a control frame. A
/// source that refused the request (an older server, a path out of scope) may have closed by
/// then: its `Error` is the failure, not the write that found it gone.
async fn send_paths(control: &mut Stream, paths: &[String]) -> Result<(), SessionError> {
    // Room for the frame's own fields; each path costs its length and a u16.
    const BUDGET: usize = MAX_CONTROL_PAYLOAD as usize - 64;
    let mut chunks: Vec<&[String]> = Vec::new();
    let (mut start, mut size) = (0, 0);
    for (i, p) in paths.iter().enumerate() {
        if i > start && (i - start == MAX_COPY_PATHS || size + p.len() + 2 > BUDGET) {
            chunks.push(&paths[start..i]);
            (start, size) = (i, 0);
        }
        size += p.len() + 2;
    }
    chunks.push(&paths[start..]);
    let last = chunks.len() - 1;
    for (i, chunk) in chunks.into_iter().enumerate() {
        let frame = Frame::CopyPaths {
            paths: chunk.to_vec(),
            more: i < last,
        };
        if let Err(e) = send(control, &frame).await {
            let said = tokio::time::timeout(
                Duration::from_secs(5),
                expect_frame(control, MAX_CONTROL_PAYLOAD, "control"),
            )
            .await;
            return Err(match said {
                Ok(Ok(Frame::Error { code, message })) => SessionError::Remote { code, message },
                _ => e.into(),
            });
        }
    }
    Ok(())
}

/// Logs in to the destination and asks it for a grant for `dest`. Returns the session that
/// holds the grant (closing it revokes the grant), the grant, and the destination's key.
async fn ask_grant(
    cfg: &CopyConfig,
    dest: &str,
    reporter: &dyn Reporter,
) -> Result<(Connected, String, crate::tls::Fingerprint), SessionError> {
    let ask = Frame::GrantRequest {
        dest: dest.to_owned(),
        existing: cfg.source.opts.existing,
    };
    minted(&cfg.dest, ask, (0, "third-party copies"), reporter)
        .await
        .map_err(|e| at("destination", &cfg.dest.server, e))
}

/// Logs in to each of `side`'s other hosts (`side.stripe`, all at once) and asks each for a
/// stripe grant with `ask` (a push's destination hosts write, a pull's source hosts read).
/// Returns the sessions that hold the grants (closing one revokes its grant) and the hosts as
/// the server running the copy is to reach them. A host that cannot take part (`needs`: the
/// capability bits it must set, and what it then takes; not `serve --stripe` or
/// `--third-party`, an older ferry) fails the copy here, named, before any data moves: the
/// user asked for striping.
async fn ask_stripe_grants(
    side: &ClientConfig,
    ask: Frame,
    needs: (u64, &'static str),
    reporter: Arc<dyn Reporter>,
) -> Result<(Vec<Connected>, Vec<CopyStripe>), SessionError> {
    if side.stripe.len() > MAX_COPY_STRIPES {
        return Err(SessionError::Protocol(format!(
            "a copy stripes over at most {MAX_COPY_STRIPES} other hosts, not {}",
            side.stripe.len()
        )));
    }
    let mut asking = tokio::task::JoinSet::new();
    for (i, host) in side.stripe.iter().cloned().enumerate() {
        let host_cfg = ClientConfig {
            server: host.server.clone(),
            security: host.security.clone(),
            token: host.token.clone().unwrap_or_else(|| side.token.clone()),
            stripe: Vec::new(),
            multipath: false,
            ..side.clone()
        };
        let (ask, reporter) = (ask.clone(), reporter.clone());
        asking.spawn(async move {
            let asked = minted(&host_cfg, ask, needs, reporter.as_ref()).await;
            let stripe = asked.map(|(c, grant, fingerprint)| {
                let addr = host_cfg.server.clone();
                let fingerprint = fingerprint.0;
                (
                    c,
                    CopyStripe {
                        addr,
                        fingerprint,
                        grant,
                    },
                )
            });
            (i, stripe.map_err(|e| at("stripe host", &host.server, e)))
        });
    }
    let mut hosts = Vec::with_capacity(asking.len());
    while let Some(joined) = asking.join_next().await {
        let (i, host) = joined.map_err(|e| SessionError::Protocol(format!("stripe task: {e}")))?;
        hosts.push((i, host?));
    }
    hosts.sort_by_key(|(i, _)| *i);
    Ok(hosts.into_iter().map(|(_, h)| h).unzip())
}

/// Logs in to `cfg.server`, checks that it sets the capability bits `needs.0` (else it takes
/// no `needs.1`), and asks it for a grant with `ask`. Returns the session that holds the grant
/// (closing it revokes the grant), the grant, and the server's key, which the server the
/// grant is handed to pins.
async fn minted(
    cfg: &ClientConfig,
    ask: Frame,
    (needs, what): (u64, &str),
    reporter: &dyn Reporter,
) -> Result<(Connected, String, crate::tls::Fingerprint), SessionError> {
    let mut c = connect(cfg, reporter).await?;
    let Some(fingerprint) = c.tls.as_ref().and_then(|t| t.pin()) else {
        return Err(SessionError::Tls(
            "a third-party copy needs TLS to every server: each server pins the key of the \
             other it reaches"
                .into(),
        ));
    };
    if !c.caps.has(needs) {
        return Err(SessionError::Remote {
            code: ErrorCode::DENIED,
            message: format!("takes no {what}"),
        });
    }
    send(&mut c.control, &ask).await?;
    let reply = tokio::time::timeout(
        cfg.connect_timeout,
        expect_frame(&mut c.control, MAX_CONTROL_PAYLOAD, "control"),
    )
    .await
    .map_err(|_| SessionError::Timeout("waiting for a grant"))??;
    match reply {
        Frame::Granted { grant, .. } => Ok((c, grant, fingerprint)),
        other => Err(SessionError::Protocol(format!(
            "expected a grant, got {}",
            other.frame_type().name()
        ))),
    }
}

/// What the source said at the end (the destination's summary as it received it, and its
/// report) and what the destination said itself.
type Ended = ((CompleteSummary, String), CompleteSummary);

/// Follows the control session of the server that runs the copy (`runner`: the source of a
/// push, the destination of a pull) to its end: its progress and `CopyDone`; and, for a push,
/// the destination's own `Complete` on `confirming`. A pull's `CopyDone` is the destination's
/// own word. Either one's error ends the copy.
async fn watch(
    cfg: &CopyConfig,
    (runner, stream): (Side, Stream),
    confirming: Option<Stream>,
    reporter: &dyn Reporter,
) -> Result<Ended, SessionError> {
    // Each control connection is read by a task of its own: reading a frame is not cancel
    // safe, so two reads cannot race in one select.
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let mut readers = tokio::task::JoinSet::new();
    readers.spawn(read_all(stream, runner, tx.clone()));
    if let Some(dest) = confirming {
        readers.spawn(read_all(dest, Side::Dest, tx));
    } else {
        drop(tx);
    }
    let mut seen = CopyProgress::default();
    let mut done = None;
    let mut confirmed = None;
    let mut deadline = None;
    // The runner reports every 500 ms: silence for the idle timeout is a lost server. One
    // that reports but moves nothing (retrying a peer that is gone) is given the client's own
    // time to retry.
    let (silent, stalled) = (
        cfg.source.idle_timeout,
        cfg.source.retry_for.max(cfg.source.idle_timeout),
    );
    let mut moved = tokio::time::Instant::now();
    let mut last = CopyProgress::default();
    loop {
        if let (Some(_), Some(_)) = (&done, &confirmed) {
            break;
        }
        let until = match deadline {
            Some(d) => d,
            None => (tokio::time::Instant::now() + silent).min(moved + stalled),
        };
        let next = tokio::time::timeout_at(until, rx.recv())
            .await
            .map_err(|_| {
                SessionError::Timeout(match deadline {
                    Some(_) => "the destination to confirm the copy",
                    None => "the server running the copy, which went silent or stopped moving data",
                })
            })?;
        let Some((side, frame)) = next else {
            return Err(SessionError::Closed("control"));
        };
        let frame = frame.map_err(|e| at(side.name(), side.server(cfg), e))?;
        match (side, frame) {
            (side, Frame::CopyProgress(p)) if side == runner => {
                if p != last {
                    moved = tokio::time::Instant::now();
                    last = p;
                }
                seen = advance(reporter, seen, p);
            }
            (side, Frame::CopyDone { summary, report }) if side == runner => {
                if runner == Side::Dest {
                    confirmed = Some(summary.clone());
                }
                done = Some((summary, report));
                deadline = Some(tokio::time::Instant::now() + CONFIRM_WITHIN);
            }
            (Side::Dest, Frame::Complete(summary)) if runner == Side::Source => {
                confirmed = Some(summary)
            }
            (side, other) => return Err(unexpected(side.name(), side.server(cfg), other)),
        }
    }
    Ok((done.unwrap_or_default(), confirmed.unwrap_or_default()))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Source,
    Dest,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Source => "source",
            Side::Dest => "destination",
        }
    }

    fn server(self, cfg: &CopyConfig) -> &str {
        match self {
            Side::Source => &cfg.source.server,
            Side::Dest => &cfg.dest.server,
        }
    }
}

/// Forwards the frames of one control connection up to its last: an error, or the frame that
/// ends the side's part (`CopyDone`, the destination's `Complete`); a server may close right
/// after it.
async fn read_all(
    mut stream: Stream,
    side: Side,
    tx: tokio::sync::mpsc::Sender<(Side, Result<Frame, SessionError>)>,
) {
    loop {
        let frame = expect_frame(&mut stream, MAX_CONTROL_PAYLOAD, "control").await;
        let last = !matches!(frame, Ok(Frame::CopyProgress(_)));
        if tx.send((side, frame)).await.is_err() || last {
            return;
        }
    }
}

/// Tells the reporter what changed since the last progress frame.
fn advance(reporter: &dyn Reporter, seen: CopyProgress, now: CopyProgress) -> CopyProgress {
    let found_files = now.found_files.saturating_sub(seen.found_files);
    let found_bytes = now.found_bytes.saturating_sub(seen.found_bytes);
    if found_files > 0 || found_bytes > 0 {
        reporter.on_discovered(found_files, found_bytes);
    }
    if now.walk_done && !seen.walk_done {
        reporter.on_walk_done();
    }
    let bytes = now.bytes.saturating_sub(seen.bytes);
    if bytes > 0 {
        reporter.on_bytes(bytes);
    }
    // At most so many per frame: a source's counts are not trusted to size a loop.
    let files = now.files.min(seen.files.saturating_add(10_000));
    for _ in seen.files..files {
        reporter.on_file_done();
    }
    CopyProgress {
        files: files.max(seen.files),
        bytes: now.bytes.max(seen.bytes),
        found_files: now.found_files.max(seen.found_files),
        found_bytes: now.found_bytes.max(seen.found_bytes),
        walk_done: now.walk_done || seen.walk_done,
    }
}

/// A failure named with the server it came from. An `Error` frame for a request an older
/// server does not know says so.
fn at(side: &str, server: &str, e: SessionError) -> SessionError {
    match e {
        SessionError::Remote { code, message } => {
            let message = if code == ErrorCode::PROTOCOL && message.contains("unknown frame type") {
                format!(
                    "{side} {server} does not support third-party copies (an older ferry): \
                     {message}"
                )
            } else if code == ErrorCode::PROTOCOL && message.contains("copy_request frame") {
                format!(
                    "{side} {server} cannot send a chosen set of paths, as a sync between \
                     servers needs (an older ferry): {message}"
                )
            } else {
                crate::error::within(code, &format!("{side} {server}"), &message)
            };
            SessionError::Remote { code, message }
        }
        other => other,
    }
}

fn unexpected(side: &str, server: &str, frame: Frame) -> SessionError {
    match frame {
        Frame::Error { code, message } => at(side, server, SessionError::Remote { code, message }),
        other => SessionError::Protocol(format!(
            "{side} {server} sent {:?} during a third-party copy",
            other.frame_type()
        )),
    }
}
