//! Catalog sessions (issue 39): several catalog requests on one control connection, each
//! checked against the session's token as a first one is; the server's bounds (a request
//! count, an idle time) end a session with `session_ended`, which the client answers by
//! asking again on a new connection; a server without the capability gets a connection a
//! request.

use crate::util;

use std::sync::Arc;
use std::time::Duration;

use ferry_catalog::{Catalog, Location};
use ferry_core::NoReporter;
use ferry_net::access::{self, Access};
use ferry_net::catalog::CatalogSession;
use ferry_net::{ClientConfig, SessionError};
use ferry_proto::{ErrorCode, FindRequest, MetaEntry};
use util::*;

const R: &NoReporter = &NoReporter;

fn memory_catalog() -> Arc<Catalog> {
    Arc::new(Catalog::open(&Location::Memory, "test").unwrap())
}

fn refusal<T: std::fmt::Debug>(r: Result<T, SessionError>) -> (ErrorCode, String) {
    match r {
        Err(SessionError::Remote { code, message }) => (code, message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn entry(attr: &str, value: &str) -> MetaEntry {
    MetaEntry {
        attr: attr.into(),
        value: value.into(),
        unit: String::new(),
    }
}

/// Puts `a.dat`, `b.dat` and `sub/c.dat` into `dest` on the server.
async fn put_tree(cfg: &ClientConfig, dest: &str) {
    let src = tempfile::tempdir().unwrap();
    let top = src.path().join("tree");
    write(&top.join("a.dat"), &bytes(3000, 1));
    write(&top.join("b.dat"), &bytes(10, 2));
    write(&top.join("sub/c.dat"), &bytes(5000, 3));
    let r = ferry_net::client::put(cfg, std::slice::from_ref(&top), dest, reporter())
        .await
        .unwrap();
    assert!(r.is_success(), "{r:?}");
}

/// A server with a catalog and `/in/tree` put, its session bounds set by `bounds`.
async fn server_with(bounds: impl FnOnce(&mut ferry_net::ServerConfig) + Send) -> TestServer {
    let catalog = memory_catalog();
    let server = TestServer::start_with(move |c| {
        c.catalog = Some(catalog);
        bounds(c);
    })
    .await;
    put_tree(&server.client(), "/in/").await;
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_stats_and_a_meta_set_then_stat_share_one_connection() {
    let server = server_with(|_| {}).await;
    let cfg = server.client();
    let mut s = CatalogSession::new(&cfg, R);
    for (path, size) in [
        ("/in/tree/a.dat", 3000),
        ("/in/tree/b.dat", 10),
        ("/in/tree/sub/c.dat", 5000),
    ] {
        let st = s.stat(path).await.unwrap();
        assert_eq!(st.object.path, path.trim_start_matches('/'));
        assert_eq!(st.object.size, size);
    }
    // A path that is not registered is that request's refusal; the session goes on.
    let (code, _) = refusal(s.stat("/in/tree/none").await);
    assert_eq!(code, ErrorCode::NOT_FOUND);
    s.meta_set("/in/tree/a.dat", entry("run", "7"))
        .await
        .unwrap();
    let st = s.locate("/in/tree/a.dat").await.unwrap();
    assert_eq!(st.metadata, [entry("run", "7")]);
    assert_eq!(
        s.meta_ls("/in/tree/a.dat").await.unwrap(),
        [entry("run", "7")]
    );
    let found = s
        .find(FindRequest {
            under: "/in".into(),
            conditions: Vec::new(),
            name: Some("*.dat".into()),
            newer_ns: None,
            larger: None,
            limit: 100,
        })
        .await
        .unwrap();
    assert_eq!(found.objects.len(), 3);
    s.mkdir("/in/made", false).await.unwrap();
    s.rename("/in/tree/b.dat", "/in/made/b.dat").await.unwrap();
    assert_eq!(s.stat("/in/made/b.dat").await.unwrap().object.size, 10);
    assert_eq!(s.connections(), 1, "every request on the first connection");
    s.close().await;
    assert!(server.root.join("in/made/b.dat").is_file());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_out_of_scope_mid_session_is_refused_and_the_rest_stand() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    let writer = access::add_token(
        &tokens,
        "writer",
        vec!["/pub".into(), "/incoming".into()],
        vec!["/incoming".into()],
        false,
    )
    .unwrap();
    let admin = access::add_token(&tokens, "admin", vec![], vec![], false).unwrap();
    let catalog = memory_catalog();
    let server = TestServer::start_with(move |c| {
        c.access = Arc::new(Access::file(&tokens));
        c.catalog = Some(catalog);
    })
    .await;
    let mut cfg = server.client();
    cfg.token = admin;
    for dest in ["/pub/", "/priv/", "/incoming/"] {
        put_tree(&cfg, dest).await;
    }
    cfg.token = writer;
    let mut s = CatalogSession::new(&cfg, R);
    let before = s.stat("/pub/tree/a.dat").await.unwrap();
    s.meta_set("/incoming/tree/a.dat", entry("k", "1"))
        .await
        .unwrap();
    // Out of the token's scopes, in the middle of the session: refused, nothing done.
    let (code, _) = refusal(s.stat("/priv/tree/a.dat").await);
    assert_eq!(code, ErrorCode::DENIED);
    let (code, _) = refusal(s.meta_set("/pub/tree/a.dat", entry("k", "2")).await);
    assert_eq!(code, ErrorCode::DENIED);
    let (code, _) = refusal(s.remove("/priv/tree", true).await);
    assert_eq!(code, ErrorCode::DENIED);
    // What was answered and done before stands, and the session goes on under the same token.
    assert_eq!(s.stat("/pub/tree/a.dat").await.unwrap(), before);
    assert_eq!(
        s.meta_ls("/incoming/tree/a.dat").await.unwrap(),
        [entry("k", "1")]
    );
    assert!(s.meta_ls("/pub/tree/a.dat").await.unwrap().is_empty());
    assert_eq!(s.connections(), 1);
    s.close().await;
    assert!(server.root.join("priv/tree/a.dat").is_file());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_bound_ends_a_session_with_session_ended() {
    let server = server_with(|c| c.catalog_session_requests = 2).await;
    let cfg = server.client();
    // Seen as the error by a caller that asks for it.
    let mut s = CatalogSession::new(&cfg, R).ask_again_when_ended(false);
    s.stat("/in/tree/a.dat").await.unwrap();
    s.stat("/in/tree/b.dat").await.unwrap();
    let (code, message) = refusal(s.stat("/in/tree/sub/c.dat").await);
    assert_eq!(code, ErrorCode::SESSION_ENDED);
    assert!(message.contains("2 requests"), "{message}");
    // The next request opens a new connection.
    s.stat("/in/tree/sub/c.dat").await.unwrap();
    assert_eq!(s.connections(), 2);
    s.close().await;
    // By default the refused request is asked again on a new connection.
    let mut s = CatalogSession::new(&cfg, R);
    for _ in 0..5 {
        s.stat("/in/tree/a.dat").await.unwrap();
    }
    assert_eq!(s.connections(), 3, "two requests a connection");
    s.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_ends_with_its_reason_and_the_next_request_opens_another() {
    let server = server_with(|c| c.catalog_session_idle = Duration::from_millis(200)).await;
    let cfg = server.client();
    for ask_again in [false, true] {
        let mut s = CatalogSession::new(&cfg, R).ask_again_when_ended(ask_again);
        s.stat("/in/tree/a.dat").await.unwrap();
        // The server ends the session once idle: no session runs any longer.
        let mut waited = 0;
        while server.idle.idle_for().is_zero() {
            assert!(waited < 1000, "the idle session never ended");
            tokio::time::sleep(Duration::from_millis(20)).await;
            waited += 1;
        }
        if !ask_again {
            // What the server said as it ended the session, to a caller that asks for it.
            let (code, message) = refusal(s.stat("/in/tree/b.dat").await);
            assert_eq!(code, ErrorCode::SESSION_ENDED);
            assert!(message.contains("idle"), "{message}");
        }
        // The next request goes on a new connection.
        s.stat("/in/tree/b.dat").await.unwrap();
        assert_eq!(s.connections(), 2);
        s.close().await;
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_catalog_sessions_gets_a_connection_a_request() {
    // `catalog_session_requests = 0`: the Welcome leaves the bit out, as an older server's.
    let server = server_with(|c| c.catalog_session_requests = 0).await;
    let cfg = server.client();
    let mut s = CatalogSession::new(&cfg, R);
    s.stat("/in/tree/a.dat").await.unwrap();
    let (code, _) = refusal(s.stat("/in/tree/none").await);
    assert_eq!(code, ErrorCode::NOT_FOUND);
    s.meta_set("/in/tree/a.dat", entry("x", "1")).await.unwrap();
    assert_eq!(
        s.stat("/in/tree/a.dat").await.unwrap().metadata,
        [entry("x", "1")]
    );
    assert_eq!(s.connections(), 4, "one connection a request");
    s.close().await;
    server.stop().await;
}
