//! Notifications when a job ends (done, failed, cancelled): a command the admin configured,
//! run with the job's JSON on stdin, and/or a JSON POST to the admin's webhook URL. Both run
//! in tasks of their own with time limits, a few at once, so a slow or hanging hook never
//! holds up the scheduler; what fails is logged. The command is an argv, never a shell
//! string, so nothing in a job (its label, its paths) can become part of a command line.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::Semaphore;

use crate::error::ServiceError;
use crate::job::Job;

/// Hooks and webhook calls in flight at once; more wait their turn.
const AT_ONCE: usize = 8;
/// The most of a webhook's answer read (it is only logged).
const MAX_ANSWER: usize = 64 * 1024;
/// Where Debian (and most Linux systems) keep the CA bundle, when `SSL_CERT_FILE` is not set.
const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// What to run when a job ends (`ferry service --on-end-command`, `--on-end-webhook`).
#[derive(Clone, Debug)]
pub struct Notifications {
    /// The program and its arguments; the job's JSON on stdin, `FERRY_JOB_ID` and
    /// `FERRY_JOB_STATE` in its environment.
    pub command: Option<Vec<OsString>>,
    /// How long the command may run before it (and its process group) is killed.
    pub command_limit: Duration,
    /// `http://` or `https://` URL the job's JSON is POSTed to.
    pub webhook: Option<String>,
    /// CA certificates (PEM) an https webhook's certificate must chain to; default the
    /// system's bundle.
    pub webhook_ca: Option<PathBuf>,
    /// Each POST's time limit, connection and TLS included.
    pub webhook_limit: Duration,
    /// POSTs tried in all; between them the wait doubles from `webhook_backoff`.
    pub webhook_attempts: u32,
    pub webhook_backoff: Duration,
}

impl Default for Notifications {
    fn default() -> Self {
        Self {
            command: None,
            command_limit: Duration::from_secs(60),
            webhook: None,
            webhook_ca: None,
            webhook_limit: Duration::from_secs(10),
            webhook_attempts: 3,
            webhook_backoff: Duration::from_secs(1),
        }
    }
}

/// A webhook URL taken apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub https: bool,
    /// As in the URL (an IPv6 address without its brackets).
    pub host: String,
    pub port: u16,
    /// Path and query, at least `/`.
    pub path: String,
}

impl Target {
    /// Reads `http[s]://HOST[:PORT][/PATH]`; user info and fragments are refused.
    pub fn parse(url: &str) -> Result<Self, ServiceError> {
        let bad = |why: &str| ServiceError::Invalid(format!("webhook URL {url:?}: {why}"));
        let (https, rest) = if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(bad("expected http:// or https://"));
        };
        if url.contains('#') || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad("no fragment, spaces or control characters"));
        }
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if authority.contains('@') {
            return Err(bad("user info is not supported"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or_else(|| bad("unclosed ["))?;
            (h, after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let port = match port {
            Some(p) => p.parse().map_err(|_| bad("bad port"))?,
            None if https => 443,
            None => 80,
        };
        let path = if path.starts_with('?') {
            format!("/{path}")
        } else {
            path.to_owned()
        };
        Ok(Self {
            https,
            host: host.to_owned(),
            port,
            path,
        })
    }

    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Runs the notifications of ended jobs.
pub struct Notifier {
    cfg: Notifications,
    target: Option<Target>,
    tls: Option<tokio_rustls::TlsConnector>,
    slots: Arc<Semaphore>,
    /// The runtime the service's jobs run on (the one this was made on, if any): a cancel
    /// through the API ends a job from the API's own runtime, whose end must not drop the
    /// notification in flight.
    runtime: Option<tokio::runtime::Handle>,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl Notifier {
    /// Checks the configuration now (a bad URL, an empty command, an unreadable CA file stop
    /// the service at start, not at the first job's end).
    pub fn new(cfg: Notifications) -> Result<Self, ServiceError> {
        if cfg.command.as_ref().is_some_and(|c| c.is_empty()) {
            return Err(ServiceError::Invalid("--on-end-command: empty".into()));
        }
        let target = cfg.webhook.as_deref().map(Target::parse).transpose()?;
        let tls = match &target {
            Some(t) if t.https => Some(connector(cfg.webhook_ca.as_deref())?),
            _ => None,
        };
        Ok(Self {
            cfg,
            target,
            tls,
            slots: Arc::new(Semaphore::new(AT_ONCE)),
            runtime: tokio::runtime::Handle::try_current().ok(),
        })
    }

    /// Whether anything is configured.
    pub fn enabled(&self) -> bool {
        self.cfg.command.is_some() || self.target.is_some()
    }

    /// Notifies of `job`'s end in the background; returns at once.
    pub fn job_ended(self: &Arc<Self>, job: Job) {
        if !self.enabled() {
            return;
        }
        let me = self.clone();
        let send = async move {
            let Ok(_slot) = me.slots.clone().acquire_owned().await else {
                return;
            };
            let body = match serde_json::to_vec(&job) {
                Ok(b) => b,
                Err(e) => return tracing::warn!("job {}: notification: {e}", job.id),
            };
            let hook = async {
                if me.cfg.command.is_some() {
                    match me.run_command(&job, &body).await {
                        Ok(s) if s.success() => {}
                        Ok(s) => tracing::warn!("job {}: --on-end-command {s}", job.id),
                        Err(e) => tracing::warn!("job {}: --on-end-command: {e}", job.id),
                    }
                }
            };
            let post = async {
                if me.target.is_some() {
                    if let Err(e) = me.post_with_retries(&body).await {
                        tracing::warn!("job {}: --on-end-webhook: {e}", job.id);
                    }
                }
            };
            tokio::join!(hook, post);
        };
        match &self.runtime {
            Some(rt) => drop(rt.spawn(send)),
            None => drop(tokio::spawn(send)),
        }
    }

    /// Runs the command for `job` with `body` on stdin, killing its process group at the
    /// time limit.
    pub async fn run_command(&self, job: &Job, body: &[u8]) -> Result<ExitStatus, ServiceError> {
        let argv = self
            .cfg
            .command
            .as_deref()
            .ok_or_else(|| ServiceError::Invalid("no --on-end-command".into()))?;
        let io = |what: &str| {
            let what = format!("{what} {:?}", argv[0]);
            move |source| ServiceError::Io { what, source }
        };
        let mut child = tokio::process::Command::new(&argv[0])
            .args(&argv[1..])
            .env("FERRY_JOB_ID", job.id.to_string())
            .env("FERRY_JOB_STATE", job.state.as_str())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own group: the time limit kills what it started too.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(io("starting"))?;
        let mut stdin = child.stdin.take();
        let run = async {
            if let Some(mut s) = stdin.take() {
                // A hook that does not read its stdin is its own business.
                let _ = s.write_all(body).await;
            }
            child.wait().await
        };
        let ran = tokio::time::timeout(self.cfg.command_limit, run).await;
        match ran {
            Ok(status) => status.map_err(io("waiting for")),
            Err(_) => {
                if let Some(pid) = child.id() {
                    if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                        let _ =
                            rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
                    }
                }
                let _ = child.kill().await;
                Err(ServiceError::Invalid(format!(
                    "{:?} ran past its {:?} and was killed",
                    argv[0], self.cfg.command_limit
                )))
            }
        }
    }

    /// POSTs `body` until a 2xx answer, a 4xx (the receiver refuses it: trying again will
    /// not help) or the attempts are spent, waiting longer between each.
    pub async fn post_with_retries(&self, body: &[u8]) -> Result<u16, ServiceError> {
        let mut wait = self.cfg.webhook_backoff;
        let mut attempt = 1;
        loop {
            let r = tokio::time::timeout(self.cfg.webhook_limit, self.post(body))
                .await
                .unwrap_or_else(|_| {
                    Err(ServiceError::Invalid(format!(
                        "no answer within {:?}",
                        self.cfg.webhook_limit
                    )))
                });
            let why = match r {
                Ok(s) if (200..300).contains(&s) => return Ok(s),
                Ok(s) if (400..500).contains(&s) => {
                    return Err(ServiceError::Api {
                        status: s,
                        message: "the webhook refused the notification".into(),
                    })
                }
                Ok(s) => format!("answered {s}"),
                Err(e) => e.to_string(),
            };
            if attempt >= self.cfg.webhook_attempts {
                return Err(ServiceError::Invalid(format!(
                    "gave up after {attempt} attempt(s): {why}"
                )));
            }
            tracing::debug!("webhook attempt {attempt}: {why}; again in {wait:?}");
            tokio::time::sleep(wait).await;
            wait = wait.saturating_mul(2);
            attempt += 1;
        }
    }

    /// One POST; its status.
    async fn post(&self, body: &[u8]) -> Result<u16, ServiceError> {
        let t = self
            .target
            .as_ref()
            .ok_or_else(|| ServiceError::Invalid("no --on-end-webhook".into()))?;
        let addr = t.authority();
        let tcp = tokio::net::TcpStream::connect(&addr)
            .await
            .map_err(|source| ServiceError::Io {
                what: format!("connecting to the webhook at {addr}"),
                source,
            })?;
        match &self.tls {
            None => exchange(tcp, t, body).await,
            Some(tls) => {
                let name = ServerName::try_from(t.host.clone())
                    .map_err(|e| ServiceError::Tls(format!("{}: {e}", t.host)))?;
                let stream = tls
                    .connect(name, tcp)
                    .await
                    .map_err(|e| ServiceError::Tls(format!("the webhook at {addr}: {e}")))?;
                exchange(stream, t, body).await
            }
        }
    }
}

/// One HTTP/1.1 POST of `body` on `stream`.
async fn exchange<S>(stream: S, t: &Target, body: &[u8]) -> Result<u16, ServiceError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let http = |e: hyper::Error| ServiceError::Invalid(format!("HTTP: {e}"));
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(http)?;
    let driver = tokio::spawn(conn);
    let req = Request::builder()
        .method(Method::POST)
        .uri(&t.path)
        .header(hyper::header::HOST, t.authority())
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(
            hyper::header::USER_AGENT,
            concat!("ferry-service/", env!("CARGO_PKG_VERSION")),
        )
        .body(Full::new(Bytes::copy_from_slice(body)))
        .map_err(|e| ServiceError::Invalid(e.to_string()))?;
    let res = sender.send_request(req).await.map_err(http)?;
    let status = res.status().as_u16();
    // Read (a bounded part of) the answer so the receiver sees a clean end.
    let _ = Limited::new(res.into_body(), MAX_ANSWER).collect().await;
    driver.abort();
    Ok(status)
}

/// A TLS client that trusts the CA certificates in `ca`, else the system's bundle
/// (`SSL_CERT_FILE`, else Debian's path): a webhook is an ordinary web server, not a ferry
/// peer with a pinned key.
fn connector(ca: Option<&std::path::Path>) -> Result<tokio_rustls::TlsConnector, ServiceError> {
    let path = ca.map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("SSL_CERT_FILE")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(SYSTEM_CA_BUNDLE))
    });
    let tls =
        |e: String| ServiceError::Tls(format!("webhook CA certificates {}: {e}", path.display()));
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(&path).map_err(|e| tls(e.to_string()))?;
    for c in certs {
        let c = c.map_err(|e| tls(e.to_string()))?;
        // A bundle may hold a certificate this TLS stack cannot use; the others still count.
        let _ = roots.add(c);
    }
    if roots.is_empty() {
        return Err(tls("no usable certificate".into()));
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(cfg)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_urls_are_read_or_refused_with_why() {
        let t = Target::parse("http://hooks.example:8080/ferry?x=1").unwrap();
        assert_eq!(
            (t.https, t.host.as_str(), t.port, t.path.as_str()),
            (false, "hooks.example", 8080, "/ferry?x=1")
        );
        let t = Target::parse("https://hooks.example").unwrap();
        assert_eq!((t.port, t.path.as_str()), (443, "/"));
        let t = Target::parse("http://[::1]:9/h").unwrap();
        assert_eq!(
            (t.host.as_str(), t.authority()),
            ("::1", "[::1]:9".to_owned())
        );
        for bad in [
            "ftp://x/",
            "hooks.example/x",
            "http://user:pw@x/",
            "http://x:notaport/",
            "http:///path",
            "http://x/a b",
            "http://x/#frag",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_empty_command_or_a_missing_ca_file_is_refused_at_start() {
        let cfg = Notifications {
            command: Some(vec![]),
            ..Notifications::default()
        };
        assert!(Notifier::new(cfg).is_err());
        let cfg = Notifications {
            webhook: Some("https://x/".into()),
            webhook_ca: Some("/nonexistent/ca.pem".into()),
            ..Notifications::default()
        };
        let e = Notifier::new(cfg).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
        assert!(!Notifier::new(Notifications::default()).unwrap().enabled());
    }
}
