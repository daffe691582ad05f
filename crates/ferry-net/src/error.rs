//! Errors of a session, typed by who is at fault so the caller knows whether a retry can help.

use std::io;

use ferry_core::FsError;
use ferry_proto::{DecodeError, ErrorCode};

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The connection failed: a retry may well succeed.
    // The cause is part of the message and deliberately not a `source`: `{:#}` would print it twice.
    #[error("connection failed: {0}")]
    Io(io::Error),
    /// The server could not be reached at `addr` (refused, unreachable, no answer). Named with
    /// the address and port tried, so a wrong port or host shows in the message itself.
    #[error("connecting to {addr}: {cause}")]
    Connect { addr: String, cause: io::Error },
    /// The server's name does not resolve: a retry would ask the same resolver the same thing.
    #[error("cannot resolve {server}: {cause}")]
    Resolve { server: String, cause: String },
    /// The peer sent bytes that are not a valid frame.
    #[error("peer sent a malformed frame: {0}")]
    Decode(#[from] DecodeError),
    /// The peer sent a valid frame at the wrong time.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The peer refused or failed the request and said why.
    #[error("{message} (remote error: {code})")]
    Remote { code: ErrorCode, message: String },
    /// Nothing happened for too long.
    #[error("timed out {0}")]
    Timeout(&'static str),
    /// A local file-system problem that stops the whole transfer.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// The peer closed a connection the session still needed.
    #[error("peer closed the {0} connection unexpectedly")]
    Closed(&'static str),
    /// The catalog could not be read or written.
    #[error(transparent)]
    Catalog(#[from] ferry_catalog::CatalogError),
    /// TLS could not be set up: a configuration or protocol mismatch, which a retry repeats.
    #[error("TLS: {0}")]
    Tls(String),
    /// The server presented another key than the one pinned for it. Like ssh, this is refused:
    /// either the server was reinstalled or someone is in the middle.
    #[error(
        "the server key of {host} has CHANGED: pinned {expected}, presented {presented}. \
         Someone may be intercepting the connection, or the server's key was replaced. \
         If you trust the new key, {fix}"
    )]
    ServerKeyChanged {
        host: String,
        expected: String,
        presented: String,
        fix: String,
    },
}

impl From<crate::transport::tls::TlsError> for SessionError {
    fn from(e: crate::transport::tls::TlsError) -> Self {
        Self::Tls(e.to_string())
    }
}

impl From<io::Error> for SessionError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

impl SessionError {
    /// Whether running the same transfer again may succeed without changing anything.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Io(_) | Self::Connect { .. } | Self::Timeout(_) | Self::Closed(_) => true,
            Self::Remote { code, .. } => {
                matches!(*code, ErrorCode::BUSY | ErrorCode::TIMEOUT)
            }
            Self::Decode(_)
            | Self::Resolve { .. }
            | Self::Protocol(_)
            | Self::Fs(_)
            | Self::Tls(_)
            | Self::Catalog(_)
            | Self::ServerKeyChanged { .. } => false,
        }
    }

    /// The frame that tells the peer why the session ends.
    pub fn to_frame(&self) -> ferry_proto::Frame {
        let message = match self {
            // Already a message for the peer; its Display adds the code, which the frame carries.
            Self::Remote { message, .. } => message.clone(),
            other => other.to_string(),
        };
        ferry_proto::Frame::Error {
            code: self.code(),
            message,
        }
    }

    /// Whether the server never answered: its address could not be resolved or connected to.
    /// Such a failure on first contact is retried only briefly (`client::FIRST_CONTACT_RETRY`):
    /// a server that was never there is more often a wrong address than a restart.
    pub fn is_unreached(&self) -> bool {
        matches!(self, Self::Connect { .. } | Self::Resolve { .. })
    }

    /// The digest algorithm a server's policy registers, when this is its refusal of a put
    /// made with another (`checksum_policy`): what to put again with when the user left the
    /// choice to ferry.
    pub fn policy_checksum(&self) -> Option<ferry_proto::ChecksumAlgo> {
        match self {
            Self::Remote { code, message } => code
                .policy_checksum(message)
                .and_then(ferry_core::digest::parse_algo),
            _ => None,
        }
    }

    /// The code to send to the peer when this error ends a session.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Decode(_) | Self::Protocol(_) => ErrorCode::PROTOCOL,
            Self::Remote { code, .. } => *code,
            Self::Timeout(_) => ErrorCode::TIMEOUT,
            Self::Fs(e) => e.code(),
            Self::Io(_)
            | Self::Connect { .. }
            | Self::Resolve { .. }
            | Self::Closed(_)
            | Self::Catalog(_) => ErrorCode::IO,
            Self::Tls(_) | Self::ServerKeyChanged { .. } => ErrorCode::ENCRYPTION,
        }
    }
}

/// `message` from a peer said within `context` (`"put to dtn2"`): `context: message`, except
/// that a `checksum_policy` refusal keeps its algorithm first, the word a client reads it by
/// (`ErrorCode::policy_checksum`), so that a copy's client can run again with it.
pub(crate) fn within(code: ErrorCode, context: &str, message: &str) -> String {
    match code.policy_checksum(message) {
        Some(algo) => format!(
            "{algo}: {context}: {}",
            message.get(algo.len() + 2..).unwrap_or_default()
        ),
        None => format!("{context}: {message}"),
    }
}

#[cfg(test)]
#[test]
fn a_checksum_policy_refusal_keeps_its_algorithm_first_within_a_context() {
    let said = within(
        ErrorCode::CHECKSUM_POLICY,
        "put to b:1",
        "sha256: /sums/f: the policy for /sums registers sha256 digests",
    );
    assert_eq!(
        said,
        "sha256: put to b:1: /sums/f: the policy for /sums registers sha256 digests"
    );
    assert_eq!(
        ErrorCode::CHECKSUM_POLICY.policy_checksum(&said),
        Some("sha256")
    );
    assert_eq!(
        within(ErrorCode::DENIED, "put to b:1", "sha256: no"),
        "put to b:1: sha256: no"
    );
}
