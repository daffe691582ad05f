//! The server's first look at a connection, before anyone is authenticated.
//!
//! Everything a peer can make the server do before it has proven anything happens here, as pure
//! functions over bytes, so that this surface is fuzzed and property-tested on its own
//! (`fuzz/fuzz_targets/handshake.rs`, `tests/handshake.rs`) instead of only through sockets. A
//! driver reads [`HEADER_LEN`] bytes, asks [`check_hello_header`] how many more to read (at most
//! [`MAX_HELLO`], so the allocation is bounded before the payload exists), reads exactly that
//! many and hands both to [`parse_hello`]. Every refusal is a [`HandshakeError`] that names the
//! field at fault and converts into the [`ProtocolError`] to send back; nothing here panics.

use bytes::{Bytes, BytesMut};

use crate::codec::FrameHeader;
use crate::error::{negotiate_version, DecodeError, ProtocolError};
use crate::frame::{
    Capabilities, ErrorCode, Frame, FrameType, Role, HEADER_LEN, MAX_STREAMS, MAX_TOKEN,
    PROTOCOL_VERSION,
};

/// Largest `Hello` payload accepted. A `Hello` is at most 8 + 2 + 8 + 1 + 2 + 256 + 8 + 32 = 317
/// bytes; the bound is far below the 1 MiB control limit because before authentication a peer
/// may not make the server allocate more than this per connection.
pub const MAX_HELLO: u32 = 1024;

/// Shortest token: an empty token would authenticate against an empty configured one, so it is
/// never a credential.
pub const MIN_TOKEN: usize = 1;

/// A well-formed `Hello` whose version this build speaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The negotiated protocol version (today: equal to [`PROTOCOL_VERSION`]).
    pub version: u16,
    /// The peer's capability bits as sent; see [`Hello::session_capabilities`].
    pub capabilities: Capabilities,
    pub role: Role,
}

impl Hello {
    /// What the session may use: the bits both sides have.
    pub fn session_capabilities(&self) -> Capabilities {
        self.capabilities.intersect(Capabilities::known())
    }

    /// The frame this `Hello` was parsed from, for encoding (clients, tests, fuzzing).
    pub fn to_frame(&self) -> Frame {
        Frame::Hello {
            version: self.version,
            capabilities: self.capabilities,
            role: self.role.clone(),
        }
    }

    /// Appends the encoded frame (header and payload) to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        self.to_frame().encode(out);
    }
}

/// Why a connection's first frame was refused.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum HandshakeError {
    #[error("field `type`: connection did not start with a ferry Hello (got {} frame {ty:#04x})", FrameType(*.ty).name())]
    NotHello { ty: u8 },
    #[error(
        "field `len`: Hello of {len} bytes is larger than allowed before authentication ({max})"
    )]
    TooLarge { len: u32, max: u32 },
    #[error("field `len`: header announces {declared} payload bytes, {actual} were given")]
    LengthMismatch { declared: u32, actual: usize },
    #[error("hello: {0}")]
    Decode(#[from] DecodeError),
    #[error("field `version`: peer speaks protocol version {peer}, this ferry speaks {ours}; upgrade the older side")]
    Version { peer: u16, ours: u16 },
    #[error("field `token`: {len} bytes, must be {min}..={max}")]
    Token { len: usize, min: usize, max: usize },
    #[error("field `stream`: data connection index {stream} is beyond the most streams a session may have ({max})")]
    Stream { stream: u16, max: u16 },
}

impl HandshakeError {
    /// The code the peer is told. A bad token length is an authentication failure (the peer
    /// may simply hold the wrong credential); everything else is a broken protocol, except
    /// the version, which the peer can fix by upgrading.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Version { .. } => ErrorCode::VERSION,
            Self::Token { .. } => ErrorCode::AUTH,
            _ => ErrorCode::PROTOCOL,
        }
    }
}

impl From<HandshakeError> for ProtocolError {
    fn from(err: HandshakeError) -> Self {
        ProtocolError::new(err.code(), err.to_string())
    }
}

/// Checks the first header of a connection and returns how many payload bytes to read next.
///
/// Called before the payload is read, so that an unknown type, another frame type, or a
/// length above [`MAX_HELLO`] (up to `u32::MAX` on the wire) is refused before anything is
/// allocated for it.
pub fn check_hello_header(header: &[u8; HEADER_LEN]) -> Result<usize, HandshakeError> {
    let [ty, len @ ..] = *header;
    let len = u32::from_be_bytes(len);
    if FrameType(ty) != FrameType::HELLO {
        return Err(HandshakeError::NotHello { ty });
    }
    if len > MAX_HELLO {
        return Err(HandshakeError::TooLarge {
            len,
            max: MAX_HELLO,
        });
    }
    // The generic per-type bound is larger; checking it too keeps one notion of a valid header.
    FrameHeader::parse(header)?;
    // `len <= MAX_HELLO`, so this never saturates.
    Ok(usize::try_from(len).unwrap_or(usize::MAX))
}

/// Parses a connection's first frame: its header and exactly the payload the header announced.
///
/// Refuses anything but a `Hello` of at most [`MAX_HELLO`] bytes, a payload of another length
/// than announced (short or with trailing bytes), a malformed payload (bad magic, unknown role,
/// truncated or trailing fields), a version this build does not speak, a token outside
/// [`MIN_TOKEN`]`..=`[`MAX_TOKEN`] bytes, and a data stream index of [`MAX_STREAMS`] or more.
pub fn parse_hello(header: &[u8; HEADER_LEN], payload: &[u8]) -> Result<Hello, HandshakeError> {
    let declared = check_hello_header(header)?;
    if payload.len() != declared {
        return Err(HandshakeError::LengthMismatch {
            declared: u32::try_from(declared).unwrap_or(u32::MAX),
            actual: payload.len(),
        });
    }
    let Frame::Hello {
        version,
        capabilities,
        role,
    } = Frame::decode(FrameType::HELLO, Bytes::copy_from_slice(payload))?
    else {
        // `Frame::decode` of a HELLO payload yields a Hello or an error; kept total anyway.
        return Err(HandshakeError::NotHello {
            ty: FrameType::HELLO.0,
        });
    };
    let version = negotiate_version(version).map_err(|_| HandshakeError::Version {
        peer: version,
        ours: PROTOCOL_VERSION,
    })?;
    match &role {
        Role::Control { token, .. } if !(MIN_TOKEN..=MAX_TOKEN).contains(&token.len()) => {
            return Err(HandshakeError::Token {
                len: token.len(),
                min: MIN_TOKEN,
                max: MAX_TOKEN,
            })
        }
        Role::Data { stream, .. } if *stream >= MAX_STREAMS => {
            return Err(HandshakeError::Stream {
                stream: *stream,
                max: MAX_STREAMS,
            })
        }
        _ => {}
    }
    Ok(Hello {
        version,
        capabilities,
        role,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::SessionId;

    fn split(hello: &Hello) -> ([u8; HEADER_LEN], Vec<u8>) {
        let mut out = BytesMut::new();
        hello.encode(&mut out);
        let payload = out.split_off(HEADER_LEN).to_vec();
        (out[..].try_into().unwrap(), payload)
    }

    fn control(token: &str) -> Hello {
        Hello {
            version: PROTOCOL_VERSION,
            capabilities: Capabilities::ours(),
            role: Role::Control {
                token: token.into(),
                session: SessionId(7),
                secret: [9; 32],
            },
        }
    }

    #[test]
    fn valid_hello_round_trips() {
        let h = control("secret");
        let (head, payload) = split(&h);
        assert_eq!(parse_hello(&head, &payload), Ok(h));
    }

    #[test]
    fn refusals_name_their_field() {
        let (head, payload) = split(&control("secret"));
        let mut long = payload.clone();
        long.push(0);
        let e = parse_hello(&head, &long).unwrap_err();
        assert!(e.to_string().contains("`len`"), "{e}");

        let e = check_hello_header(&[0x01, 0xff, 0xff, 0xff, 0xff]).unwrap_err();
        assert_eq!(
            e,
            HandshakeError::TooLarge {
                len: u32::MAX,
                max: MAX_HELLO
            }
        );
        let e = check_hello_header(&[0xff; HEADER_LEN]).unwrap_err();
        assert_eq!(e, HandshakeError::NotHello { ty: 0xff });
        assert_eq!(e.code(), ErrorCode::PROTOCOL);

        let (head, payload) = split(&control(""));
        let e = parse_hello(&head, &payload).unwrap_err();
        assert_eq!(e.code(), ErrorCode::AUTH);
        assert!(e.to_string().contains("token"), "{e}");

        let mut v2 = control("x");
        v2.version += 1;
        let (head, payload) = split(&v2);
        let e = ProtocolError::from(parse_hello(&head, &payload).unwrap_err());
        assert_eq!(e.code, ErrorCode::VERSION);
    }
}
