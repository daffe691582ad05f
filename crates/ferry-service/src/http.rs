//! The API's listener (and `ferry serve`'s metrics listener): TLS on every API connection, a
//! bound on connections at once, on the TLS handshake's time and on the time to send a
//! request's headers; on shutdown it stops
//! accepting and lets each connection finish the request it is in, for a bounded time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::timing::Histogram;

/// Connections served at once; one more is closed at accept.
pub const MAX_CONNECTIONS: usize = 256;
/// How long a new connection may take to complete its TLS handshake: one that sends nothing,
/// or stalls partway, is closed then rather than holding one of the slots.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for requests in flight.
const DRAIN: Duration = Duration::from_secs(5);

/// Serves `app` on `listener` until `shutdown` resolves: over TLS with `tls`, else plain
/// HTTP (only the metrics endpoint of `ferry serve`, which says counts and takes nothing).
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    app: Router,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let tls = tls.map(|config| Tls {
        config,
        handshake_timeout: HANDSHAKE_TIMEOUT,
        handshakes: None,
    });
    serve_with(listener, tls, app, shutdown).await;
}

/// TLS on a listener's connections: its configuration, the bound on a handshake's time, and
/// where each completed handshake's time is counted (the API's `/metrics`: a new connection's
/// time less its request's).
#[derive(Clone)]
pub struct Tls {
    pub config: Arc<rustls::ServerConfig>,
    pub handshake_timeout: Duration,
    pub handshakes: Option<Arc<Histogram>>,
}

/// [`serve`], with TLS as `tls` says.
pub async fn serve_with(
    listener: TcpListener,
    tls: Option<Tls>,
    app: Router,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let acceptor = tls.map(|t| {
        let acceptor = TlsAcceptor::from(t.config);
        (acceptor, t.handshake_timeout, t.handshakes)
    });
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => break,
            // Reap finished connections as they end, so the set stays small.
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors, say: wait a little rather than spin.
                    tracing::warn!("accepting an API connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        // Answers are written in pieces (TLS records, head then body): without this, on a
        // kept-alive connection the second waits for the client's delayed ACK (40 ms).
        let _ = tcp.set_nodelay(true);
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracing::warn!("{peer}: refused, {MAX_CONNECTIONS} API connections already open");
            continue;
        };
        let (acceptor, app, stop) = (acceptor.clone(), app.clone(), stop_rx.clone());
        conns.spawn(async move {
            let _permit = permit;
            match acceptor {
                Some((acceptor, bound, times)) => {
                    let t = std::time::Instant::now();
                    match tokio::time::timeout(bound, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            if let Some(h) = &times {
                                h.observe(t.elapsed());
                            }
                            connection(tls, app, stop, peer).await;
                        }
                        Ok(Err(e)) => tracing::debug!("{peer}: TLS handshake: {e}"),
                        Err(_) => tracing::debug!("{peer}: no TLS handshake within {bound:?}"),
                    }
                }
                None => connection(tcp, app, stop, peer).await,
            }
        });
    }
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(DRAIN + Duration::from_secs(1), async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    conns.abort_all();
}

/// Serves one connection's requests until it closes, or, once `stop` changes, until the
/// request in flight is answered (bounded by [`DRAIN`]).
async fn connection<I>(io: I, app: Router, mut stop: watch::Receiver<bool>, peer: SocketAddr)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!("{peer}: {e}");
            }
        }
        _ = stop.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(DRAIN, conn).await;
        }
    }
}

/// Serves `GET /metrics` (what `render` says, in Prometheus' text format) in plain HTTP on
/// `listener` until `shutdown` resolves, with the API's bounds on connections and time.
pub async fn serve_metrics(
    listener: TcpListener,
    render: impl Fn() -> String + Clone + Send + Sync + 'static,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let app = Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let render = render.clone();
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            crate::api::METRICS_CONTENT_TYPE,
                        )],
                        render(),
                    )
                }
            }),
        )
        .fallback(|| async {
            (
                axum::http::StatusCode::NOT_FOUND,
                "only /metrics is served here\n",
            )
        });
    serve(listener, None, app, shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A connection that sends nothing, or stalls partway through its handshake, is closed at
    /// the bound instead of holding a slot; one that completes its handshake is served, and
    /// only its handshake is counted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_handshake_not_finished_within_the_bound_is_closed() {
        let dir = tempfile::tempdir().unwrap();
        let (config, fingerprint) = crate::tls::server_config(dir.path()).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let handshakes = Arc::new(Histogram::default());
        let tls = Tls {
            config,
            handshake_timeout: Duration::from_millis(300),
            handshakes: Some(handshakes.clone()),
        };
        let app = Router::new().route("/", axum::routing::get(|| async { "here" }));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_with(listener, Some(tls), app, async {
            let _ = stopped.await;
        }));
        let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        // A TLS record header's first bytes, then nothing.
        let mut partial = tokio::net::TcpStream::connect(addr).await.unwrap();
        partial.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
        for s in [&mut silent, &mut partial] {
            let mut buf = [0u8; 64];
            // The guard only keeps a server without the bound from hanging the test.
            let r = tokio::time::timeout(Duration::from_secs(120), s.read(&mut buf))
                .await
                .expect("the server closes the connection");
            assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
        }
        assert_eq!(handshakes.count(), 0);
        let client = crate::client::Client {
            addr: addr.to_string(),
            token: String::new(),
            trust: crate::tls::Trust::Pinned(fingerprint),
            timeout: Duration::from_secs(30),
            kept: None,
        };
        let a = client
            .request(hyper::Method::GET, "/", Vec::new(), false)
            .await
            .unwrap();
        assert_eq!((a.status, a.body.as_slice()), (200, &b"here"[..]));
        assert_eq!(handshakes.count(), 1);
        let _ = stop.send(());
        server.await.unwrap();
    }
}
