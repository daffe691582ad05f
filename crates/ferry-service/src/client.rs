//! A client of the service's API (what `ferry submit`, `jobs`, `job` and `cancel` use): HTTP/1.1
//! over TLS pinned to the service's certificate, with a time limit on the whole exchange and a
//! bound on the answer's size. By default each request has a connection of its own (the CLI
//! makes one request); a client that asks often (a dashboard, the bench's poller) keeps one
//! open between requests ([`KeptConnection`]) and pays the TCP and TLS handshakes once.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;

use crate::api::{ErrorBody, SubmitRequest};
use crate::error::ServiceError;
use crate::history::{JobRates, LinkHistory, Links};
use crate::job::Job;
use crate::tls::Trust;

/// The largest answer read: a listing of the most jobs with long paths fits.
const MAX_ANSWER: usize = 64 << 20;

#[derive(Clone, Debug)]
pub struct Client {
    /// `host:port` of the service.
    pub addr: String,
    pub token: String,
    pub trust: Trust,
    /// For one request, connection and TLS included.
    pub timeout: Duration,
    /// `Some`: requests go over this connection, kept open between them (HTTP/1.1
    /// keep-alive) and made again when the service has closed it; `None`: a new connection
    /// for each request.
    pub kept: Option<KeptConnection>,
}

/// A connection to the service kept open between requests; clones share it, and requests over
/// it are made one at a time (HTTP/1.1 has no multiplexing).
#[derive(Clone, Default)]
pub struct KeptConnection(Arc<tokio::sync::Mutex<Option<SendRequest<Full<Bytes>>>>>);

impl std::fmt::Debug for KeptConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptConnection").finish_non_exhaustive()
    }
}

/// A request's answer: its status and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Client {
    pub async fn submit(&self, req: &SubmitRequest) -> Result<Job, ServiceError> {
        let body = serde_json::to_vec(req).map_err(|e| ServiceError::Invalid(e.to_string()))?;
        self.json(Method::POST, "/api/jobs", body).await
    }

    pub async fn jobs(&self, limit: usize) -> Result<Vec<Job>, ServiceError> {
        self.json(Method::GET, &format!("/api/jobs?limit={limit}"), Vec::new())
            .await
    }

    pub async fn job(&self, id: i64) -> Result<Job, ServiceError> {
        self.json(Method::GET, &format!("/api/jobs/{id}"), Vec::new())
            .await
    }

    pub async fn cancel(&self, id: i64) -> Result<Job, ServiceError> {
        self.json(Method::POST, &format!("/api/jobs/{id}/cancel"), Vec::new())
            .await
    }

    /// Job `id`'s rate over time.
    pub async fn rates(&self, id: i64) -> Result<JobRates, ServiceError> {
        self.json(Method::GET, &format!("/api/jobs/{id}/rates"), Vec::new())
            .await
    }

    /// Every link's state.
    pub async fn links(&self) -> Result<Links, ServiceError> {
        self.json(Method::GET, "/api/links", Vec::new()).await
    }

    /// Link `name`'s samples since `since_ms` (unix ms), or its newest.
    pub async fn link_history(
        &self,
        name: &str,
        since_ms: Option<i64>,
    ) -> Result<LinkHistory, ServiceError> {
        let mut path = format!("/api/links/{}/history", escape(name));
        if let Some(t) = since_ms {
            path.push_str(&format!("?since_ms={t}"));
        }
        self.json(Method::GET, &path, Vec::new()).await
    }

    /// A request whose 2xx answer is JSON of type `T`; any other answer is its error.
    async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Vec<u8>,
    ) -> Result<T, ServiceError> {
        let a = self.request(method, path, body, true).await?;
        if !(200..300).contains(&a.status) {
            let message = serde_json::from_slice::<ErrorBody>(&a.body)
                .map(|e| e.error)
                .unwrap_or_else(|_| String::from_utf8_lossy(&a.body).into_owned());
            return Err(ServiceError::Api {
                status: a.status,
                message,
            });
        }
        serde_json::from_slice(&a.body)
            .map_err(|e| ServiceError::Invalid(format!("the service's answer: {e}")))
    }

    /// Any request, `auth`: with the token (tests send ones without).
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        body: Vec<u8>,
        auth: bool,
    ) -> Result<Answer, ServiceError> {
        tokio::time::timeout(self.timeout, self.exchange(method, path, body, auth))
            .await
            .map_err(|_| {
                ServiceError::Invalid(format!(
                    "the service at {} did not answer within {:?}",
                    self.addr, self.timeout
                ))
            })?
    }

    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Vec<u8>,
        auth: bool,
    ) -> Result<Answer, ServiceError> {
        let body = Bytes::from(body);
        let Some(kept) = &self.kept else {
            let mut sender = self.connect().await?;
            return send(&mut sender, self.build(&method, path, body, auth)?).await;
        };
        let mut slot = kept.0.lock().await;
        if let Some(mut sender) = slot.take() {
            // Kept open: ready unless the service closed it (idle too long, or stopping).
            if sender.ready().await.is_ok() {
                match send(&mut sender, self.build(&method, path, body.clone(), auth)?).await {
                    Ok(a) => {
                        *slot = Some(sender);
                        return Ok(a);
                    }
                    // Closed as the request went: a request that changes nothing is made
                    // again on a new connection; a submit is not (it may have been taken).
                    Err(e) if method != Method::GET => return Err(e),
                    Err(_) => {}
                }
            }
        }
        let mut sender = self.connect().await?;
        let a = send(&mut sender, self.build(&method, path, body, auth)?).await?;
        *slot = Some(sender);
        Ok(a)
    }

    /// A new TLS connection, HTTP/1.1 over it driven by a task of its own until the sender
    /// is dropped.
    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, ServiceError> {
        let stream = crate::tls::connect(&self.addr, &self.trust).await?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(http)?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    fn build(
        &self,
        method: &Method,
        path: &str,
        body: Bytes,
        auth: bool,
    ) -> Result<Request<Full<Bytes>>, ServiceError> {
        let mut req = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(hyper::header::HOST, &self.addr)
            .header(hyper::header::CONTENT_TYPE, "application/json");
        if auth {
            req = req.header(
                hyper::header::AUTHORIZATION,
                format!("Bearer {}", self.token),
            );
        }
        req.body(Full::new(body))
            .map_err(|e| ServiceError::Invalid(e.to_string()))
    }
}

fn http(e: hyper::Error) -> ServiceError {
    ServiceError::Invalid(format!("HTTP: {e}"))
}

/// One request over `sender` and its whole answer.
async fn send(
    sender: &mut SendRequest<Full<Bytes>>,
    req: Request<Full<Bytes>>,
) -> Result<Answer, ServiceError> {
    let res = sender.send_request(req).await.map_err(http)?;
    let status = res.status().as_u16();
    let body = Limited::new(res.into_body(), MAX_ANSWER)
        .collect()
        .await
        .map_err(|e| ServiceError::Invalid(format!("reading the answer: {e}")))?
        .to_bytes()
        .to_vec();
    Ok(Answer { status, body })
}

/// `s` as one path segment: unreserved characters and `:` as they are, the rest %-escaped.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
