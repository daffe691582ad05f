//! A catalog session: after a catalog request's answer the control connection may carry the
//! next catalog request (`Capabilities::CATALOG_SESSION` on both sides), so that a client
//! asking many questions pays for TCP, TLS and the login once. Each request is checked against
//! the session's grant as a first one is (`catalog_ops::serve`). Bounded by a request count
//! and an idle time (`ServerConfig::catalog_session_*`): a client's hold on a connection slot
//! and its token's session count ends; the bound answers the next request `session_ended`.
//!
//! What comes next is decided without I/O ([`Turns::next`]); [`serve`] reads and answers.

use std::time::Duration;

use ferry_proto::{CatalogRequest, ErrorCode, Frame, MAX_CONTROL_PAYLOAD};
use tracing::warn;

use super::access::Grant;
use super::catalog_ops;
use super::state::ServerState;
use super::wire::linger;
use crate::error::SessionError;
use crate::transport::conn::{expect_frame, send};
use crate::transport::stream::Stream;

/// What the connection brought while the session waited for its next request.
#[derive(Debug)]
pub(super) enum Arrived {
    Frame(Frame),
    /// The client closed the connection (between requests: the session's clean end).
    Closed,
    /// Nothing within the session's idle time.
    Idle,
}

/// What the session does next.
#[derive(Debug)]
pub(super) enum Turn {
    /// Answer this request; the session goes on after it.
    Serve(CatalogRequest),
    /// The client closed: end without a word.
    End,
    /// Send this error and end: a bound was reached, or the frame is none a session takes.
    Refuse(SessionError),
}

/// A session's count of requests against its bounds.
#[derive(Debug)]
pub(super) struct Turns {
    served: u32,
    most: u32,
    idle: Duration,
}

impl Turns {
    /// After the connection's first request: `most` requests in all, `idle` between them.
    pub(super) fn after_first(most: u32, idle: Duration) -> Self {
        Self {
            served: 1,
            most,
            idle,
        }
    }

    pub(super) fn served(&self) -> u32 {
        self.served
    }

    pub(super) fn next(&mut self, arrived: Arrived) -> Turn {
        let ended = |message: String| {
            Turn::Refuse(SessionError::Remote {
                code: ErrorCode::SESSION_ENDED,
                message,
            })
        };
        match arrived {
            Arrived::Closed => Turn::End,
            Arrived::Idle => ended(format!(
                "the catalog session was idle for {} s, this server's most; ask again on a new \
                 connection",
                self.idle.as_secs_f64()
            )),
            Arrived::Frame(Frame::CatalogRequest(CatalogRequest::Tar { .. })) => {
                Turn::Refuse(SessionError::Protocol(
                    "get --tar streams on a connection of its own, not in a catalog session".into(),
                ))
            }
            Arrived::Frame(Frame::CatalogRequest(_)) if self.served >= self.most => ended(format!(
                "the catalog session has had {} requests, this server's most; ask again on a new \
                 connection",
                self.most
            )),
            Arrived::Frame(Frame::CatalogRequest(request)) => {
                self.served += 1;
                Turn::Serve(request)
            }
            Arrived::Frame(other) => Turn::Refuse(SessionError::Protocol(format!(
                "unexpected {:?} in a catalog session (it carries catalog requests only)",
                other.frame_type()
            ))),
        }
    }
}

/// Whether the session goes on after `e` answered one of its requests: only after the
/// request's own refusal, which the client reads as such (`ErrorCode::ends_catalog_session`).
pub(super) fn goes_on_after(e: &SessionError) -> bool {
    !matches!(
        e,
        SessionError::Io(_) | SessionError::Closed(_) | SessionError::Tls(_)
    ) && !e.code().ends_catalog_session()
}

/// What a session did: its requests, and the file-system entries they changed.
pub(super) struct Session {
    pub(super) requests: u32,
    pub(super) files: u64,
}

/// Serves a catalog session's requests after its first (already answered) until the client
/// closes, a bound ends it or the connection fails. A request's own refusal is sent and the
/// session goes on.
pub(super) async fn serve(
    shared: &ServerState,
    stream: &mut Stream,
    grant: &Grant,
    caps: ferry_proto::Capabilities,
    files: u64,
) -> Result<Session, SessionError> {
    let config = &shared.config;
    let mut turns =
        Turns::after_first(config.catalog_session_requests, config.catalog_session_idle);
    let mut files = files;
    loop {
        let next = expect_frame(stream, MAX_CONTROL_PAYLOAD, "control");
        let arrived = match tokio::time::timeout(config.catalog_session_idle, next).await {
            Err(_) => Arrived::Idle,
            Ok(Ok(frame)) => Arrived::Frame(frame),
            // Between requests a client may go without TLS's close_notify, or a reset.
            Ok(Err(SessionError::Closed(_))) => Arrived::Closed,
            Ok(Err(SessionError::Io(e))) if gone(&e) => Arrived::Closed,
            Ok(Err(e)) => return refuse(stream, e).await,
        };
        let request = match turns.next(arrived) {
            Turn::End => {
                return Ok(Session {
                    requests: turns.served(),
                    files,
                })
            }
            Turn::Refuse(e) => return refuse(stream, e).await,
            Turn::Serve(request) => request,
        };
        let what = request.name();
        match catalog_ops::serve(shared, stream, grant, request, caps).await {
            Ok(n) => files += n,
            Err(e) if goes_on_after(&e) => {
                warn!(token = %grant.name, %what, result = %e, "catalog request refused");
                send(stream, &e.to_frame()).await?;
            }
            Err(e) => return refuse(stream, e).await,
        }
    }
}

fn gone(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionReset, UnexpectedEof};
    matches!(
        e.kind(),
        UnexpectedEof | ConnectionReset | ConnectionAborted
    )
}

/// Tells the client why the session ends (when the connection still carries it) and closes
/// so that it reads that.
async fn refuse(stream: &mut Stream, e: SessionError) -> Result<Session, SessionError> {
    if !matches!(e, SessionError::Io(_) | SessionError::Closed(_)) {
        let _ = send(stream, &e.to_frame()).await;
        linger(stream).await;
    }
    Err(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(path: &str) -> Arrived {
        Arrived::Frame(Frame::CatalogRequest(CatalogRequest::Stat {
            path: path.into(),
        }))
    }

    fn code_of(turn: Turn) -> ErrorCode {
        match turn {
            Turn::Refuse(e) => e.code(),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn requests_are_served_up_to_the_bound_then_the_session_ends() {
        let mut turns = Turns::after_first(3, Duration::from_secs(5));
        assert!(matches!(turns.next(stat("/a")), Turn::Serve(_)));
        assert!(matches!(turns.next(stat("/b")), Turn::Serve(_)));
        assert_eq!(turns.served(), 3);
        let Turn::Refuse(e) = turns.next(stat("/c")) else {
            panic!("the fourth request of three was served");
        };
        assert_eq!(e.code(), ErrorCode::SESSION_ENDED);
        assert!(e.to_string().contains("3 requests"), "{e}");
    }

    #[test]
    fn idle_ends_with_its_reason_and_a_close_ends_quietly() {
        let mut turns = Turns::after_first(10, Duration::from_secs(30));
        let Turn::Refuse(e) = turns.next(Arrived::Idle) else {
            panic!("idle did not end the session");
        };
        assert_eq!(e.code(), ErrorCode::SESSION_ENDED);
        assert!(e.to_string().contains("idle for 30 s"), "{e}");
        assert!(matches!(turns.next(Arrived::Closed), Turn::End));
    }

    #[test]
    fn a_data_request_or_a_tar_ends_the_session() {
        let mut turns = Turns::after_first(10, Duration::from_secs(5));
        let list = Arrived::Frame(Frame::ListRequest { path: "/".into() });
        assert_eq!(code_of(turns.next(list)), ErrorCode::PROTOCOL);
        let tar = Arrived::Frame(Frame::CatalogRequest(CatalogRequest::Tar {
            path: "/".into(),
            paths: Vec::new(),
        }));
        assert_eq!(code_of(turns.next(tar)), ErrorCode::PROTOCOL);
        // Neither was counted.
        assert_eq!(turns.served(), 1);
    }

    #[test]
    fn a_refusal_of_the_request_keeps_the_session_and_a_broken_one_ends_it() {
        let refused = SessionError::Remote {
            code: ErrorCode::DENIED,
            message: "out of scope".into(),
        };
        assert!(goes_on_after(&refused));
        let missing = SessionError::Remote {
            code: ErrorCode::NOT_FOUND,
            message: "not registered".into(),
        };
        assert!(goes_on_after(&missing));
        assert!(!goes_on_after(&SessionError::Protocol("garbled".into())));
        assert!(!goes_on_after(&SessionError::Timeout("verify")));
        assert!(!goes_on_after(&SessionError::Closed("control")));
    }
}
