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

/// Connections served at once; one more is closed at accept.
pub const MAX_CONNECTIONS: usize = 256;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
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
    let acceptor = tls.map(TlsAcceptor::from);
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
                Some(acceptor) => {
                    let accepting = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp));
                    if let Ok(Ok(tls)) = accepting.await {
                        connection(tls, app, stop, peer).await;
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
