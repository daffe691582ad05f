//! A client of the service's API (what `ferry submit`, `jobs`, `job` and `cancel` use): one
//! HTTP/1.1 request a connection, over TLS pinned to the service's certificate, with a time
//! limit on the whole exchange and a bound on the answer's size.

use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
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
        let stream = crate::tls::connect(&self.addr, &self.trust).await?;
        let http = |e: hyper::Error| ServiceError::Invalid(format!("HTTP: {e}"));
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(http)?;
        let driver = tokio::spawn(conn);
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, &self.addr)
            .header(hyper::header::CONTENT_TYPE, "application/json");
        if auth {
            req = req.header(
                hyper::header::AUTHORIZATION,
                format!("Bearer {}", self.token),
            );
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| ServiceError::Invalid(e.to_string()))?;
        let res = sender.send_request(req).await.map_err(http)?;
        let status = res.status().as_u16();
        let body = Limited::new(res.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| ServiceError::Invalid(format!("reading the answer: {e}")))?
            .to_bytes()
            .to_vec();
        driver.abort();
        Ok(Answer { status, body })
    }
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
