//! Errors of the wire protocol.
//!
//! [`DecodeError`] is what a malformed frame produces locally; it names the offending field so
//! that a log line is enough to tell which side encoded what wrongly. [`ProtocolError`] is what
//! travels to the peer (an `Error` frame) or ends a session, and so carries a wire [`ErrorCode`].

use std::fmt;

use crate::frame::{ErrorCode, PROTOCOL_VERSION};

/// Why a frame could not be decoded.
///
/// Kept flat, `Clone` and `Eq` so that tests and fuzzers can compare errors exactly and callers
/// can turn any of them into a [`ProtocolError`] without matching on it.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DecodeError {
    #[error("field `{field}`: truncated")]
    Truncated { field: &'static str },
    #[error("field `{field}`: too long ({len} > {max})")]
    TooLong {
        field: &'static str,
        len: usize,
        max: usize,
    },
    #[error("{frame} frame: {extra} trailing bytes")]
    TrailingBytes { frame: &'static str, extra: usize },
    #[error("unknown frame type {0:#04x}")]
    UnknownFrameType(u8),
    #[error("{frame} frame: payload of {len} bytes exceeds the limit of {max}")]
    FrameTooLarge {
        frame: &'static str,
        len: u32,
        max: u32,
    },
    #[error("bad magic: the peer is not ferry")]
    BadMagic,
    #[error("field `{field}`: invalid value {value}")]
    InvalidValue { field: &'static str, value: u64 },
    #[error("field `{field}`: invalid utf-8")]
    InvalidUtf8 { field: &'static str },
    #[error("field `{field}`: {reason}")]
    Inconsistent {
        field: &'static str,
        reason: &'static str,
    },
}

/// An error that ends a request or a session, in the form the peer receives it.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("{reason} (code {code})")]
pub struct ProtocolError {
    pub code: ErrorCode,
    pub reason: String,
}

impl ProtocolError {
    pub fn new(code: ErrorCode, reason: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.into(),
        }
    }
}

/// A frame we cannot decode means the peer broke the protocol, whichever field it was.
impl From<DecodeError> for ProtocolError {
    fn from(err: DecodeError) -> Self {
        Self::new(ErrorCode::PROTOCOL, err.to_string())
    }
}

/// Checks the version a peer announced in `Hello`/`Welcome` and returns the one to speak.
///
/// There is exactly one version so far, so negotiation is an equality check; the function exists
/// so that both sides word the mismatch the same way and a future range check has one home.
pub fn negotiate_version(peer: u16) -> Result<u16, ProtocolError> {
    if peer == PROTOCOL_VERSION {
        Ok(peer)
    } else {
        Err(ProtocolError::new(
            ErrorCode::VERSION,
            format!(
                "peer speaks protocol version {peer}, this ferry speaks {PROTOCOL_VERSION}; \
                 upgrade the older side"
            ),
        ))
    }
}

impl ErrorCode {
    /// Short lower-case name of a known code, `None` for codes from a newer peer.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Self::PROTOCOL => "protocol",
            Self::VERSION => "version",
            Self::AUTH => "auth",
            Self::BAD_REQUEST => "bad_request",
            Self::NOT_FOUND => "not_found",
            Self::PERMISSION => "permission",
            Self::EXISTS => "exists",
            Self::IO => "io",
            Self::CORRUPT => "corrupt",
            Self::BUSY => "busy",
            Self::TIMEOUT => "timeout",
            Self::INTERNAL => "internal",
            Self::NO_SPACE => "no_space",
            Self::ENCRYPTION => "encryption",
            Self::DENIED => "denied",
            Self::SLOW_DOWN => "slow_down",
            Self::NOT_GRANTED => "not_granted",
            Self::SESSION_ENDED => "session_ended",
            Self::CHECKSUM_POLICY => "checksum_policy",
            _ => return None,
        })
    }
}

/// Name and number (`auth 3`): the name for people, the number because a newer peer may send a
/// code this build has no name for.
impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} {}", self.0),
            None => write!(f, "{}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_mismatch_is_explained() {
        assert_eq!(negotiate_version(PROTOCOL_VERSION), Ok(PROTOCOL_VERSION));
        let err = negotiate_version(PROTOCOL_VERSION + 1).unwrap_err();
        assert_eq!(err.code, ErrorCode::VERSION);
        assert_eq!(
            err.to_string(),
            format!(
                "peer speaks protocol version {}, this ferry speaks {}; upgrade the older side \
                 (code version 2)",
                PROTOCOL_VERSION + 1,
                PROTOCOL_VERSION
            )
        );
    }

    #[test]
    fn a_checksum_policy_refusal_names_its_algorithm_and_no_other_error_does() {
        let c = ErrorCode::CHECKSUM_POLICY;
        assert_eq!(c.name(), Some("checksum_policy"));
        let said = "sha256: /sums/f: the policy for /sums registers sha256 digests";
        assert_eq!(c.policy_checksum(said), Some("sha256"));
        assert_eq!(c.policy_checksum("no algorithm here"), None);
        assert_eq!(ErrorCode::BAD_REQUEST.policy_checksum(said), None);
    }

    #[test]
    fn decode_errors_become_protocol_errors() {
        let err = ProtocolError::from(DecodeError::Truncated { field: "path" });
        assert_eq!(err.code, ErrorCode::PROTOCOL);
        assert_eq!(err.to_string(), "field `path`: truncated (code protocol 1)");
    }

    #[test]
    fn unknown_codes_display_as_numbers() {
        assert_eq!(ErrorCode::AUTH.to_string(), "auth 3");
        assert_eq!(ErrorCode(999).to_string(), "999");
    }
}
