//! The HTTP API (JSON): submit, list, show and cancel jobs, and `/metrics` in Prometheus'
//! text format; the dashboard's files (`crate::dashboard`) beside them. Every `/api` request
//! carries a bearer token from ferry's token file (the one `ferry token add` writes); a token
//! sees and cancels only the jobs it submitted, unless the service names it an admin. Bodies
//! are bounded and every request has a time limit.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ferry_net::access::{Access, Grant};
use serde::{Deserialize, Serialize};

use crate::error::ServiceError;
use crate::history::{
    self, JobRates, LinkHistory, LinkSample, LinkStatus, Links, MAX_HISTORY, RECENT,
};
use crate::job::{Job, NewJob, SyncMode};
use crate::location::Location;
use crate::runner::classify;
use crate::scheduler::Scheduler;
use crate::timing::{self, Histogram};

/// The largest request body taken: a job naming many long paths fits, a flood does not.
pub const MAX_BODY: usize = 256 * 1024;
/// How long one request may take before it is answered 503.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Prometheus' text exposition format.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Jobs a listing returns unless asked for fewer.
const DEFAULT_LIST: usize = 100;

/// What the handlers share.
pub struct App {
    pub scheduler: Arc<Scheduler>,
    pub access: Access,
    /// Token names that may see and cancel every job.
    pub admins: Vec<String>,
    /// A link is flagged when its latest rate is below this fraction of its recent median.
    pub slow_fraction: f64,
    /// Where requests' time went, for `/metrics`.
    pub timing: ApiTiming,
}

/// The endpoints timed apart (method, route); every other request is timed as `other`.
const TIMED: [(&str, &str); 4] = [
    ("POST", "/api/jobs"),
    ("GET", "/api/jobs"),
    ("GET", "/api/jobs/{id}"),
    ("GET", "/metrics"),
];

/// Per endpoint ([`TIMED`], then the rest): each request's time in the handler, and in its
/// store calls (waiting for the store's lock included); and each new connection's TLS
/// handshake, from its accept. The time a request waited for a thread is none of them: a
/// client's time less the handler's (and on a new connection, the handshake's) is that.
#[derive(Debug, Default)]
pub struct ApiTiming {
    handler: [Histogram; TIMED.len() + 1],
    store: [Histogram; TIMED.len() + 1],
    /// Shared with the listener ([`crate::http::Tls`]).
    pub handshake: Arc<Histogram>,
}

tokio::task_local! {
    // Which of `ApiTiming`'s slots the request being handled counts in.
    static ENDPOINT: usize;
}

/// `req`'s slot in [`ApiTiming`].
fn endpoint_of(req: &Request) -> usize {
    let path = req.uri().path();
    let route = match path.strip_prefix("/api/jobs/") {
        Some(id) if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) => "/api/jobs/{id}",
        _ => path,
    };
    let method = req.method().as_str();
    TIMED
        .iter()
        .position(|&(m, r)| m == method && r == route)
        .unwrap_or(TIMED.len())
}

/// The router, with its limits.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/api/jobs", post(submit).get(list))
        .route("/api/jobs/{id}", get(show))
        .route("/api/jobs/{id}/cancel", post(cancel))
        .route("/api/jobs/{id}/rates", get(rates))
        .route("/api/links", get(links))
        .route("/api/links/{name}/history", get(link_history))
        .route("/metrics", get(metrics))
        .merge(crate::dashboard::routes())
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such endpoint") })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(middleware::from_fn_with_state(app.clone(), time_limit))
        .with_state(app)
}

/// Runs `f`, a store call, off the scheduling of other requests. The store's calls wait on its
/// lock and on the database; the API has its own runtime ([`crate::service`]), so on its
/// multi-thread workers `f` runs in place (`block_in_place` hands this worker's other tasks to
/// another), sparing the two thread hand-offs of the blocking pool, each a wait for a core on a
/// loaded host (docs/bench/NOTEBOOK.md, "Issue 40: the API's tail"). Elsewhere (a
/// current-thread runtime) it goes to the blocking pool.
async fn blocking<T: Send + 'static>(
    app: &Arc<App>,
    f: impl FnOnce(&App) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let multi = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    let t = std::time::Instant::now();
    let r = if multi {
        tokio::task::block_in_place(|| f(app))
    } else {
        let app = app.clone();
        tokio::task::spawn_blocking(move || f(&app))
            .await
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
    };
    if let Ok(i) = ENDPOINT.try_with(|i| *i) {
        app.timing.store[i].observe(t.elapsed());
    }
    r
}

/// Bounds each request's time, and times it for `/metrics`.
async fn time_limit(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let i = endpoint_of(&req);
    let t = std::time::Instant::now();
    let r = ENDPOINT
        .scope(i, tokio::time::timeout(REQUEST_TIMEOUT, next.run(req)))
        .await;
    app.timing.handler[i].observe(t.elapsed());
    match r {
        Ok(r) => r,
        Err(_) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the request took too long")
            .into_response(),
    }
}

/// The API's and the store's histograms in Prometheus' text format.
fn timing_metrics(app: &App, out: &mut String) {
    let names = TIMED
        .iter()
        .map(|&(m, r)| format!("{m} {r}"))
        .chain(std::iter::once("other".to_owned()));
    let per_endpoint = [
        (
            "ferry_service_api_handler_seconds",
            "Time from a request's routing to its answer, by endpoint (TLS and queueing for a thread not included).",
            &app.timing.handler,
        ),
        (
            "ferry_service_api_store_seconds",
            "Time a request spent in the job store's calls (waiting for its lock included), by endpoint.",
            &app.timing.store,
        ),
    ];
    for (name, help, histograms) in per_endpoint {
        timing::header(out, name, help);
        for (h, n) in histograms.iter().zip(names.clone()) {
            h.render(out, name, &format!("endpoint=\"{}\"", label(&n)));
        }
    }
    let (wait, hold) = app.scheduler.store().lock_times();
    let whole = [
        (
            "ferry_service_store_lock_wait_seconds",
            "Time a job store call (the API's or the scheduler's) waited for the store's lock.",
            wait,
        ),
        (
            "ferry_service_store_lock_hold_seconds",
            "Time a job store call held the store's lock.",
            hold,
        ),
    ];
    for (name, help, h) in whole {
        timing::header(out, name, help);
        h.render(out, name, "");
    }
    let name = "ferry_service_api_tls_handshake_seconds";
    timing::header(
        out,
        name,
        "Time from a connection's accept to its completed TLS handshake (the client's round trip included).",
    );
    app.timing.handshake.render(out, name, "");
}

/// An error answer: a status and `{"error": "..."}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

#[derive(Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            Json(ErrorBody {
                error: self.message,
            }),
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        r
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        let status = match &e {
            ServiceError::Invalid(_) => StatusCode::BAD_REQUEST,
            ServiceError::NotFound(_) => StatusCode::NOT_FOUND,
            ServiceError::Ended { .. } => StatusCode::CONFLICT,
            ServiceError::Forbidden(_) => StatusCode::FORBIDDEN,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, e.to_string())
    }
}

/// Who is asking: the token's name, its scopes, whether it is an admin.
struct Caller {
    grant: Grant,
    admin: bool,
}

impl Caller {
    fn may_see(&self, job: &Job) -> bool {
        self.admin || job.owner == self.grant.name
    }
}

fn caller(app: &App, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, m);
    let value = headers
        .get(header::AUTHORIZATION)
        .ok_or_else(|| unauthorized("no token: send `Authorization: Bearer TOKEN`"))?;
    let token = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .ok_or_else(|| unauthorized("the Authorization header must be `Bearer TOKEN`"))?;
    let list = app.access.current().map_err(|e| {
        tracing::warn!("token file: {e}");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the service cannot read its token file",
        )
    })?;
    let grant = list
        .authenticate(token)
        .ok_or_else(|| unauthorized("unknown or revoked token"))?;
    let admin = app.admins.contains(&grant.name);
    Ok(Caller { grant, admin })
}

/// A job as submitted over the API.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    pub sources: Vec<String>,
    pub dest: String,
    #[serde(default)]
    pub sync: Option<String>,
    #[serde(default)]
    pub priority: i64,
    /// Unix seconds.
    #[serde(default)]
    pub deadline: Option<i64>,
    #[serde(default)]
    pub label: String,
}

/// The caller's scopes on the service's local root: a put reads its sources there, a get
/// writes its destination.
fn check_scopes(c: &Caller, req: &SubmitRequest) -> Result<(), ApiError> {
    let forbidden = |what: &str, p: &str| {
        ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "token `{}` may not {what} {p} on the service's host",
                c.grant.name
            ),
        )
    };
    for s in &req.sources {
        if let Location::Local(rel) = Location::parse(s)? {
            if !c.grant.may_read(&rel) {
                return Err(forbidden("read", s));
            }
        }
    }
    if let Location::Local(rel) = Location::parse(&req.dest)? {
        if !c.grant.may_write(&rel) {
            return Err(forbidden("write", &req.dest));
        }
    }
    Ok(())
}

/// Every server a job names is one of the endpoints: a job for any other could never run,
/// and refusing it here keeps the queue, and the links the optimizer tracks, to servers the
/// service reaches.
fn check_endpoints(app: &App, req: &SubmitRequest) -> Result<(), ApiError> {
    let endpoints = &app.scheduler.runner().endpoints;
    for l in req.sources.iter().chain(std::iter::once(&req.dest)) {
        if let Some(server) = Location::parse(l)?.server() {
            if !endpoints.has(server) {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "no endpoint {server}: the service reaches only the servers of its \
                         endpoints file"
                    ),
                ));
            }
        }
    }
    Ok(())
}

async fn submit(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Job>), ApiError> {
    let c = caller(&app, &headers)?;
    let body = body.map_err(|e| {
        let why = format!("request body: {} (at most {MAX_BODY} bytes)", e.body_text());
        ApiError::new(e.status(), why)
    })?;
    let req: SubmitRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("bad job: {e}")))?;
    check_scopes(&c, &req)?;
    let (kind, server) = classify(&req.sources, &req.dest)?;
    check_endpoints(&app, &req)?;
    let sync = match req.sync.as_deref() {
        None => SyncMode::Off,
        Some(s) => SyncMode::parse(s)?,
    };
    if sync != SyncMode::Off && kind == crate::Kind::Cp {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "sync between two servers is not supported yet; submit it without --sync",
        ));
    }
    let job = NewJob {
        kind,
        sources: req.sources,
        dest: req.dest,
        sync,
        priority: req.priority,
        deadline: req.deadline,
        label: req.label,
        owner: c.grant.name.clone(),
        server,
    };
    let job = blocking(&app, move |app| Ok(app.scheduler.store().submit(&job)?)).await?;
    app.scheduler.wake();
    Ok((StatusCode::CREATED, Json(job)))
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    limit: Option<usize>,
}

async fn list(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Result<Json<Vec<Job>>, ApiError> {
    let c = caller(&app, &headers)?;
    let owner = (!c.admin).then(|| c.grant.name.clone());
    let limit = q.limit.unwrap_or(DEFAULT_LIST);
    let jobs = blocking(&app, move |app| {
        Ok(app.scheduler.store().list(owner.as_deref(), limit)?)
    })
    .await?;
    Ok(Json(jobs))
}

/// The job `id` names, if the caller may see it; another's job is "no job", as a missing one.
fn visible(app: &App, c: &Caller, id: &str) -> Result<Job, ApiError> {
    let id: i64 = id
        .parse()
        .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, format!("{id:?} is not a job id")))?;
    match app.scheduler.store().get(id)? {
        Some(j) if c.may_see(&j) => Ok(j),
        _ => Err(ServiceError::NotFound(id).into()),
    }
}

async fn show(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Job>, ApiError> {
    let c = caller(&app, &headers)?;
    Ok(Json(
        blocking(&app, move |app| visible(app, &c, &id)).await?,
    ))
}

async fn cancel(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Job>, ApiError> {
    let c = caller(&app, &headers)?;
    let job = blocking(&app, move |app| {
        let job = visible(app, &c, &id)?;
        app.scheduler.store().cancel(job.id)?;
        app.scheduler.stop(job.id);
        app.scheduler.ended(job.id);
        Ok(app
            .scheduler
            .store()
            .get(job.id)?
            .ok_or(ServiceError::NotFound(job.id))?)
    })
    .await?;
    Ok(Json(job))
}

async fn rates(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<JobRates>, ApiError> {
    let c = caller(&app, &headers)?;
    let rates = blocking(&app, move |app| {
        let job = visible(app, &c, &id)?;
        let samples = app.scheduler.store().rates(job.id)?;
        Ok(JobRates {
            job: job.id,
            samples,
        })
    })
    .await?;
    Ok(Json(rates))
}

/// Every link's state; any valid token may read them (server names and rates, no job's
/// paths).
async fn links(State(app): State<Arc<App>>, headers: HeaderMap) -> Result<Json<Links>, ApiError> {
    caller(&app, &headers)?;
    let links = blocking(&app, |app| Ok(link_statuses(app)?)).await?;
    Ok(Json(Links { links }))
}

/// Every link's state, judged from enough of its newest samples to find 20 of each source
/// (all links' at one take of the store's lock).
fn link_statuses(app: &App) -> Result<Vec<LinkStatus>, ServiceError> {
    let names: Vec<&str> = app.scheduler.runner().endpoints.servers().collect();
    let samples = app.scheduler.store().links_samples(&names, LINK_SAMPLES)?;
    Ok(statuses(app, &names, &samples))
}

/// How many of a link's newest samples its state is judged from.
const LINK_SAMPLES: usize = RECENT * 20;

/// Each of `names`' state from its `samples`.
fn statuses(app: &App, names: &[&str], samples: &[Vec<LinkSample>]) -> Vec<LinkStatus> {
    names
        .iter()
        .zip(samples)
        .map(|(name, samples)| {
            let mut status = history::status(name, samples, app.slow_fraction);
            status.tuning = app.scheduler.link_tuning(name);
            status
        })
        .collect()
}

#[derive(Debug, Deserialize)]
struct HistoryQuery {
    since_ms: Option<i64>,
}

async fn link_history(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    q: Result<Query<HistoryQuery>, QueryRejection>,
) -> Result<Json<LinkHistory>, ApiError> {
    caller(&app, &headers)?;
    let Query(q) = q.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    if !app.scheduler.runner().endpoints.has(&name) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no link {name:?}: links are the servers of the service's endpoints"),
        ));
    }
    let since = q.since_ms.unwrap_or(i64::MIN);
    let history = blocking(&app, move |app| {
        let samples = app
            .scheduler
            .store()
            .link_samples(&name, since, MAX_HISTORY)?;
        Ok(LinkHistory { name, samples })
    })
    .await?;
    Ok(Json(history))
}

/// Each link's latest rate and RTT, its recent median, and whether it is flagged.
fn link_metrics(links: &[LinkStatus], out: &mut String) {
    type Metric = (&'static str, &'static str, fn(&LinkStatus) -> Option<f64>);
    let metrics: [Metric; 6] = [
        (
            "ferry_service_link_rate_bytes_per_second",
            "The latest measured rate of the path to each server (probe or transfer).",
            |l| l.last.map(|s| s.rate),
        ),
        (
            "ferry_service_link_median_rate_bytes_per_second",
            "The median of the samples the latest is judged against.",
            |l| l.median_rate,
        ),
        (
            "ferry_service_link_rtt_seconds",
            "The latest probe's round-trip time to each server.",
            |l| l.last.and_then(|s| s.rtt_ms).map(|ms| ms / 1000.0),
        ),
        (
            "ferry_service_link_flagged",
            "1 when the path's latest rate fell below its fraction of the recent median.",
            |l| Some(if l.flagged { 1.0 } else { 0.0 }),
        ),
        (
            "ferry_service_link_jobs_limit",
            "Jobs the link optimizer lets run at once against each server.",
            |l| l.tuning.as_ref().map(|t| t.jobs as f64),
        ),
        (
            "ferry_service_link_streams",
            "Streams the transfers to each server settled on together (0: not known yet).",
            |l| l.tuning.as_ref().map(|t| f64::from(t.streams)),
        ),
    ];
    for (name, help, value) in metrics {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
        for l in links {
            if let Some(v) = value(l) {
                out.push_str(&format!("{name}{{link=\"{}\"}} {v}\n", label(&l.name)));
            }
        }
    }
}

/// A Prometheus label value: backslash, quote and newline escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Prometheus' text format: jobs by state, the queue's depth, jobs running, bytes moved.
/// Counts only, no names or paths: it needs no token.
async fn metrics(State(app): State<Arc<App>>) -> Result<Response, ApiError> {
    let out = blocking(&app, render_metrics).await?;
    Ok(([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], out).into_response())
}

fn render_metrics(app: &App) -> Result<String, ApiError> {
    let s = &app.scheduler;
    // The job counts and the links' samples at one take of the store's lock.
    let names: Vec<&str> = s.runner().endpoints.servers().collect();
    let seen = s.store().overview(&names, LINK_SAMPLES)?;
    let counts = seen.counts;
    let mut out = String::new();
    out.push_str("# HELP ferry_service_jobs Jobs the service holds, by state.\n");
    out.push_str("# TYPE ferry_service_jobs gauge\n");
    for (state, n) in &counts {
        out.push_str(&format!(
            "ferry_service_jobs{{state=\"{}\"}} {n}\n",
            state.as_str()
        ));
    }
    let queued = counts
        .iter()
        .find(|c| c.0 == crate::State::Queued)
        .map_or(0, |c| c.1);
    out.push_str("# HELP ferry_service_queue_depth Jobs waiting to run.\n");
    out.push_str("# TYPE ferry_service_queue_depth gauge\n");
    out.push_str(&format!("ferry_service_queue_depth {queued}\n"));
    out.push_str("# HELP ferry_service_running_jobs Jobs running now.\n");
    out.push_str("# TYPE ferry_service_running_jobs gauge\n");
    out.push_str(&format!("ferry_service_running_jobs {}\n", s.running()));
    out.push_str(
        "# HELP ferry_service_transferred_bytes_total Bytes moved by jobs since the service started.\n",
    );
    out.push_str("# TYPE ferry_service_transferred_bytes_total counter\n");
    out.push_str(&format!(
        "ferry_service_transferred_bytes_total {}\n",
        s.moved()
    ));
    link_metrics(&statuses(app, &names, &seen.links), &mut out);
    timing_metrics(app, &mut out);
    Ok(out)
}
