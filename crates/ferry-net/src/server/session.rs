//! One accepted connection: TLS (or plain TCP where allowed) and `Hello` under one deadline,
//! then either a control connection (log in, take the request, run the transfer) or a data
//! connection (join the session it names).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_proto::{handshake, Capabilities, ErrorCode, Frame, Role, SessionId, HEADER_LEN};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit as Permit;
use tracing::{debug, info, warn};

use super::access::AccessList;
use super::access::Grant;
use super::admission::{TokenSession, Unproven};
use super::grants::{self, Lease, Refused};
use super::registry::{find_session, Found, Opening};
use super::request::{prepare, Work};
use super::state::{ActiveSession, ServerState};
use super::wire::{closed_by_peer, linger, refuse_plainly, welcome};
use super::{catalog_session, stripe};
use crate::engine::{
    drive_receiver, drive_sender, Limits, ReceiverIo, RecvRun, SendRun, SenderIo, Writers,
};
use crate::error::SessionError;
use crate::transport::conn::send;
use crate::transport::stream::{Recorder, Stream, TLS_HANDSHAKE_RECORD};
use crate::transport::tcp::{open_receive_window, tune};

/// `unproven` counts the connection against its address until it authenticates (see
/// `admission`).
pub(super) async fn handle(
    shared: Arc<ServerState>,
    tcp: TcpStream,
    peer: SocketAddr,
    permit: Permit,
    unproven: Unproven,
) -> Result<(), SessionError> {
    tune(&tcp);
    // One deadline for TLS and Hello together: a client that trickles bytes cannot hold a
    // connection slot longer than this.
    let deadline = tokio::time::Instant::now() + shared.config.handshake_timeout;
    let mut stream = tokio::time::timeout_at(deadline, open_transport(&shared, tcp))
        .await
        .map_err(|_| SessionError::Timeout("waiting for the TLS handshake"))??;
    let (role, caps) = match tokio::time::timeout_at(deadline, read_hello(&mut stream)).await {
        Ok(Ok(hello)) => hello,
        Ok(Err(e)) => {
            let _ = send(&mut stream, &e.to_frame()).await;
            linger(&mut stream).await;
            return Err(e);
        }
        Err(_) => return Err(SessionError::Timeout("waiting for Hello")),
    };
    match role {
        Role::Control {
            token,
            session,
            secret,
        } => {
            // Its data connections may be waiting already: they wait while this one lives.
            let _opening = Opening::enter(&shared.registry, session);
            let (grant, lease) = log_in(&shared, &mut stream, peer, &token).await?;
            drop(unproven);
            // A grant's session is bounded by its grant (one at a time), which its client's
            // counted session holds: not counted again, or a copy could never run under a
            // cap of one.
            let _running = match lease {
                None => Some(enter_token_session(&shared, &mut stream, peer, &grant).await?),
                Some(_) => None,
            };
            let login = Login { grant, lease };
            control_session(&shared, stream, login, peer, session, secret, caps).await
        }
        Role::Data {
            session,
            secret,
            stream: index,
        } => {
            let join = Join {
                session,
                secret,
                index,
            };
            data_connection(&shared, stream, deadline, join, permit, unproven).await
        }
    }
}

/// Starts TLS, or accepts plain TCP where allowed; the first byte says which the client wants.
async fn open_transport(shared: &ServerState, stream: TcpStream) -> Result<Stream, SessionError> {
    let mut first = [0u8; 1];
    if stream.peek(&mut first).await? == 0 {
        return Err(SessionError::Closed("control"));
    }
    if first[0] == TLS_HANDSHAKE_RECORD {
        let Some(acceptor) = &shared.tls else {
            // Take the ClientHello off the socket first: closing with unread bytes sends a
            // reset, which the client would take for a network failure and retry. The plain
            // frame then fails its TLS parse, which it reports as a mismatch.
            let frame = Frame::Error {
                code: ErrorCode::ENCRYPTION,
                message: "this server only serves plain TCP (--no-encrypt)".into(),
            };
            refuse_plainly(stream, &frame).await;
            return Err(SessionError::Tls(
                "client started TLS; this server only serves plain TCP".into(),
            ));
        };
        let tls = acceptor
            .accept(Recorder::new(stream))
            .await
            .map_err(|e| SessionError::Tls(format!("handshake failed: {e}")))?;
        return Ok(Stream::Tls(Box::new(tokio_rustls::TlsStream::Server(tls))));
    }
    if !shared.config.allow_plaintext {
        let frame = Frame::Error {
            code: ErrorCode::ENCRYPTION,
            message: "this server requires TLS: connect without --no-encrypt (plain TCP is \
                      only accepted by `ferry serve --allow-plaintext`)"
                .into(),
        };
        refuse_plainly(stream, &frame).await;
        return Err(SessionError::Tls("client offered plain TCP".into()));
    }
    Ok(Stream::Plain(stream))
}

/// Reads the first frame of a connection, which must be a small `Hello`. The sans-I/O parser
/// in `ferry_proto::handshake` (fuzzed) decides; nothing larger than `MAX_HELLO` is read.
async fn read_hello(stream: &mut Stream) -> Result<(Role, Capabilities), SessionError> {
    let refused = |e: handshake::HandshakeError| {
        let e = ferry_proto::ProtocolError::from(e);
        SessionError::Remote {
            code: e.code,
            message: e.reason,
        }
    };
    let mut head = [0u8; HEADER_LEN];
    stream.read_exact(&mut head).await?;
    let len = handshake::check_hello_header(&head).map_err(refused)?;
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).await?;
    let hello = handshake::parse_hello(&head, &payload).map_err(refused)?;
    let caps = hello.session_capabilities();
    Ok((hello.role, caps))
}

/// Logs in with a third-party grant. A refused grant is not counted against the address's
/// login brake: its 256-bit secret cannot be guessed, and a source that a client handed a
/// bogus grant must not be locked out for everyone else's copies. It still waits the failure
/// delay. A grant whose minting token was revoked since, or no longer covers its path, is
/// refused too.
async fn grant_login(
    shared: &ServerState,
    list: &AccessList,
    peer: SocketAddr,
    token: &str,
) -> Result<(Grant, Option<Lease>), Frame> {
    let redeemed = shared.grants.redeem(token).and_then(|(g, lease)| {
        let covered = list.named(&g.name).is_some_and(|o| g.still_covered_by(o));
        if covered {
            Ok((g, lease))
        } else {
            Err(Refused::Invalid)
        }
    });
    match redeemed {
        Ok((g, lease)) => {
            // The session's own line (`log_session`) says who; this one only at debug.
            debug!(%peer, token = %g.name, "login with a third-party grant");
            Ok((g, Some(lease)))
        }
        Err(Refused::InUse) => Err(Frame::Error {
            code: ErrorCode::BUSY,
            message: "the third-party grant is in use by another session; try again".into(),
        }),
        Err(Refused::Invalid) => {
            warn!(%peer, "third-party grant refused");
            shared.metrics.auth_failed();
            tokio::time::sleep(shared.config.auth_failure_delay).await;
            Err(Frame::Error {
                code: ErrorCode::AUTH,
                message: "third-party grant refused: unknown, revoked, expired or spent".into(),
            })
        }
    }
}

/// Who logged in: a token's scopes, or a third-party grant's with its lease.
struct Login {
    grant: Grant,
    lease: Option<Lease>,
}

/// Logs a control connection in, or tells the client why not and closes.
async fn log_in(
    shared: &ServerState,
    stream: &mut Stream,
    peer: SocketAddr,
    token: &str,
) -> Result<(Grant, Option<Lease>), SessionError> {
    match login(shared, peer, token).await {
        Ok(g) => Ok(g),
        Err(frame) => {
            let _ = send(stream, &frame).await;
            linger(stream).await;
            let Frame::Error { code, message } = frame else {
                unreachable!("login fails with an Error frame")
            };
            Err(SessionError::Remote { code, message })
        }
    }
}

/// Counts the session against its token's cap, or tells the client it is busy and closes.
async fn enter_token_session<'a>(
    shared: &'a ServerState,
    stream: &mut Stream,
    peer: SocketAddr,
    grant: &Grant,
) -> Result<TokenSession<'a>, SessionError> {
    if let Some(running) = shared.per_token.enter(&grant.name) {
        return Ok(running);
    }
    let message = format!(
        "token `{}` already runs {} sessions on this server, its most at once; \
         try again when one ends",
        grant.name, shared.config.max_sessions_per_token
    );
    warn!(%peer, token = %grant.name, "session refused: too many for the token");
    shared.metrics.refused_busy();
    let _ = send(
        stream,
        &Frame::Error {
            code: ErrorCode::BUSY,
            message: message.clone(),
        },
    )
    .await;
    linger(stream).await;
    Err(SessionError::Remote {
        code: ErrorCode::BUSY,
        message,
    })
}

/// What a data connection's `Hello` names: its session, the session's secret, and its index.
struct Join {
    session: SessionId,
    secret: [u8; 32],
    index: u16,
}

/// Hands a data connection to its session, or refuses it.
async fn data_connection(
    shared: &ServerState,
    mut stream: Stream,
    deadline: tokio::time::Instant,
    join: Join,
    permit: Permit,
    unproven: Unproven,
) -> Result<(), SessionError> {
    let Join {
        session,
        secret,
        index,
    } = join;
    // Held at most until the deadline, and no longer than the client keeps it open
    // (an attempt that failed before its session opened leaves its dials behind).
    let found = tokio::time::timeout_at(deadline, async {
        tokio::select! {
            f = find_session(&shared.registry, session, &secret, index) => Some(f),
            () = closed_by_peer(&stream) => None,
        }
    })
    .await;
    let (code, message) = match found {
        Ok(Some(Found::Join(joins))) => {
            drop(unproven);
            open_receive_window(std::os::fd::AsFd::as_fd(stream.tcp()));
            welcome(&mut stream, session, secret).await?;
            let _ = joins.send(Ok((index, stream, Some(permit)))).await;
            return Ok(());
        }
        Ok(None) => return Err(SessionError::Closed("data")),
        Ok(Some(Found::NotGranted(granted))) => (
            ErrorCode::NOT_GRANTED,
            format!("data connection {index} not granted: the session has {granted}"),
        ),
        Ok(Some(Found::Refused | Found::Unknown)) | Err(_) => (
            ErrorCode::AUTH,
            "unknown session or wrong secret".to_owned(),
        ),
    };
    let refusal = Frame::Error {
        code,
        message: message.clone(),
    };
    let _ = send(&mut stream, &refusal).await;
    // A sender's data may follow its Hello.
    linger(&mut stream).await;
    Err(SessionError::Protocol(format!(
        "data connection refused: {message}"
    )))
}

/// Checks a token (or a third-party grant), slowing down addresses that keep failing. The
/// error is the frame to send.
async fn login(
    shared: &ServerState,
    peer: SocketAddr,
    token: &str,
) -> Result<(Grant, Option<Lease>), Frame> {
    let ip = peer.ip();
    let braked = shared
        .brake
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .check(ip, Instant::now());
    if let Err(wait) = braked {
        warn!(%peer, "login refused: too many failures from this address");
        return Err(Frame::Error {
            code: ErrorCode::SLOW_DOWN,
            message: format!(
                "too many failed logins from {ip}; try again in {} s",
                wait.as_secs().max(1)
            ),
        });
    }
    let list = match shared.config.access.current() {
        Ok(l) => l,
        Err(e) => {
            warn!("cannot read the token file: {e}");
            return Err(Frame::Error {
                code: ErrorCode::INTERNAL,
                message: "the server cannot read its token file; see its log".into(),
            });
        }
    };
    if token.starts_with(grants::PREFIX) {
        return grant_login(shared, &list, peer, token).await;
    }
    match list.authenticate(token) {
        Some(g) => {
            // Failures stay counted: a success with one token must not buy guesses at others.
            debug!(%peer, token = %g.name, "login");
            Ok((g, None))
        }
        None => {
            warn!(%peer, "wrong token");
            shared.metrics.auth_failed();
            shared
                .brake
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .failed(ip, Instant::now());
            tokio::time::sleep(shared.config.auth_failure_delay).await;
            Err(Frame::Error {
                code: ErrorCode::AUTH,
                message: "authentication failed: wrong token".into(),
            })
        }
    }
}

/// Runs a logged-in control connection's request and logs the session in one line: what an
/// operator (or a log collector) needs to account for it without following its connections.
async fn control_session(
    shared: &ServerState,
    stream: Stream,
    login: Login,
    peer: SocketAddr,
    session: SessionId,
    secret: [u8; 32],
    caps: Capabilities,
) -> Result<(), SessionError> {
    let started = Instant::now();
    let token = login.grant.name.clone();
    let outcome = run_request(shared, stream, login, session, secret, caps).await;
    let took = started.elapsed();
    log_session(&token, peer, took, &outcome);
    match &outcome {
        Ok(s) => {
            let secs = took.as_secs_f64();
            let rate = (s.bytes > 0 && secs > 0.0).then(|| (s.bytes as f64 / secs) as u64);
            shared.metrics.session_ok(s.what, rate);
        }
        Err(_) => shared.metrics.session_failed(),
    }
    outcome.map(|_| ())
}

/// What a session did, for its log line: `put`, `get`, `list`, `probe`, `grant` or `copy`.
struct Served {
    what: &'static str,
    files: u64,
    bytes: u64,
}

/// The session's one line at the default level: who, what, how much, how fast, and how it ended.
fn log_session(
    token: &str,
    peer: SocketAddr,
    took: Duration,
    outcome: &Result<Served, SessionError>,
) {
    let secs = (took.as_secs_f64() * 1000.0).round() / 1000.0;
    match outcome {
        Ok(s) => {
            let rate = if secs > 0.0 {
                (s.bytes as f64 / secs) as u64
            } else {
                0
            };
            info!(
                %token,
                %peer,
                what = %s.what,
                files = s.files,
                bytes = s.bytes,
                secs,
                bytes_per_sec = rate,
                result = %"ok",
                "session"
            );
        }
        Err(e) => warn!(%token, %peer, secs, result = %e, "session"),
    }
}

/// Takes a logged-in control connection's request and runs it to the end.
async fn run_request(
    shared: &ServerState,
    mut stream: Stream,
    login: Login,
    session: SessionId,
    secret: [u8; 32],
    caps: Capabilities,
) -> Result<Served, SessionError> {
    let _active = ActiveSession::enter(shared);
    let Login { grant, lease } = login;
    // Errors before the transfer starts are reported here; the engines report their own.
    let work = match prepare(shared, &mut stream, &grant, session, secret, caps).await {
        Ok(w) => w,
        Err(e) => {
            if !matches!(e, SessionError::Io(_) | SessionError::Closed(_)) {
                let _ = send(&mut stream, &e.to_frame()).await;
                // A putting client's first offers may follow its request.
                linger(&mut stream).await;
            }
            return Err(e);
        }
    };
    let idle = shared.config.idle_timeout;
    match work {
        Work::Done { what, files, bytes } => Ok(Served { what, files, bytes }),
        Work::Catalog {
            what,
            files,
            refused,
            session,
        } => {
            if let Some(e) = refused {
                warn!(token = %grant.name, %what, result = %e, "catalog request refused");
                send(&mut stream, &e.to_frame()).await?;
            }
            if !session {
                return Ok(Served {
                    what,
                    files,
                    bytes: 0,
                });
            }
            let s = catalog_session::serve(shared, &mut stream, &grant, caps, files).await?;
            Ok(Served {
                // One line for the session; one request keeps its own name.
                what: if s.requests > 1 { "catalog" } else { what },
                files: s.files,
                bytes: 0,
            })
        }
        Work::Put {
            receiver,
            control,
            block_size,
            writers,
            joins,
            pending,
        } => {
            receiver.forget_manifest();
            let (start, tune, most) = shared.config.storage_pool(shared.config.writers, writers);
            let writers = Writers::new(start, tune, most);
            let limits = Limits::new(idle, block_size);
            // Registered while it runs (closed to joins once all have joined), so that a
            // connection dialled beyond the grant is refused at once.
            let receiving = drive_receiver(
                ReceiverIo {
                    control: stream,
                    joins,
                    receiver,
                    control_out: control,
                    stripes: (Vec::new(), 0, 0, false),
                },
                RecvRun {
                    writers,
                    limits,
                    leave_early: false,
                },
            );
            let outcome = match &lease {
                None => receiving.await,
                Some(l) => tokio::select! {
                    o = receiving => o,
                    () = l.revoked() => Err(SessionError::Remote {
                        code: ErrorCode::AUTH,
                        message: "the third-party grant was revoked by its client".into(),
                    }),
                },
            };
            drop(pending);
            let summary = outcome?.summary;
            let served = Served {
                what: "put",
                files: summary.files,
                bytes: summary.bytes,
            };
            if let Some(lease) = lease {
                lease.complete(summary);
            }
            Ok(served)
        }
        Work::Get {
            sender,
            frames,
            offers,
            plan,
            opts,
            data,
            permits: _permits,
            pending: _pending,
        } => {
            let reporter = shared.metrics.sending();
            let limits = Limits::new(idle, opts.block_size);
            let io = SenderIo {
                control: stream,
                data,
                sender,
                frames,
                control_out: offers,
                reporter,
                stripes: Vec::new(),
            };
            let run = SendRun {
                limits,
                plan,
                welcome: None,
                awaiting: None,
                stripe_whole: false,
            };
            // A pulled copy's get (a read grant) ends when its grant is revoked, and spends it
            // when it completes, as a granted put does.
            let sending = drive_sender(io, run);
            let result = match &lease {
                None => sending.await?,
                Some(l) => tokio::select! {
                    o = sending => o?,
                    () = l.revoked() => return Err(SessionError::Remote {
                        code: ErrorCode::AUTH,
                        message: "the read grant was revoked by its client".into(),
                    }),
                },
            };
            let (summary, sender) = (result.summary, result.sender);
            let _ = tokio::task::spawn_blocking(move || sender.finish()).await;
            let served = Served {
                what: "get",
                files: summary.files,
                bytes: summary.bytes,
            };
            if let Some(lease) = lease {
                lease.complete(summary);
            }
            Ok(served)
        }
        Work::Stripe {
            writer,
            block_size,
            data,
            permits: _permits,
            pending: _pending,
        } => {
            let serving = stripe::serve(stream, writer, data, block_size, idle);
            // A striped copy's stripe session ends when its grant is revoked (its client
            // closed the minting session), as a granted put does.
            let landed = match &lease {
                None => serving.await?,
                Some(l) => tokio::select! {
                    o = serving => o?,
                    () = l.revoked() => return Err(SessionError::Remote {
                        code: ErrorCode::AUTH,
                        message: "the stripe grant was revoked by its client".into(),
                    }),
                },
            };
            Ok(Served {
                what: "stripe",
                files: landed.blocks,
                bytes: landed.bytes,
            })
        }
        Work::StripeRead {
            reader,
            data,
            permits: _permits,
            pending: _pending,
        } => {
            let serving = stripe::serve_reads(stream, reader, data, idle);
            // A pulled copy's stripe read session ends when its grant is revoked.
            let sent = match &lease {
                None => serving.await?,
                Some(l) => tokio::select! {
                    o = serving => o?,
                    () = l.revoked() => return Err(SessionError::Remote {
                        code: ErrorCode::AUTH,
                        message: "the stripe read grant was revoked by its client".into(),
                    }),
                },
            };
            Ok(Served {
                what: "stripe read",
                files: sent.blocks,
                bytes: sent.bytes,
            })
        }
    }
}
