//! ferry's wire protocol, with no I/O.
//!
//! This crate knows frames and their byte layout and nothing about sockets, files or clocks, so
//! it can be property-tested and fuzzed in isolation (the quinn-proto / rustls split). A driver
//! reads [`HEADER_LEN`] bytes, checks them with [`FrameHeader::parse`] (which bounds the payload
//! length per frame type before anything is allocated), reads the payload and hands it to
//! [`Frame::decode`]. Encoding goes into a caller's buffer; `Block` data can be written
//! separately after [`Block::encode_head`] so that megabytes of file data are never copied.
//! A connection's first frame, read before authentication, goes through [`handshake`].
#![forbid(unsafe_code)]

pub mod catalog;
mod codec;
mod error;
mod frame;
pub mod handshake;
pub mod journal;

pub use catalog::*;
pub use codec::FrameHeader;
pub use error::{negotiate_version, DecodeError, ProtocolError};
pub use frame::*;

/// A block's digest on the wire (`Block::digest`): XXH3-128 of its bytes, which catches a
/// corrupted or misplaced block; the whole file's digest is what proves it end to end.
pub fn block_digest(data: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(data)
}
