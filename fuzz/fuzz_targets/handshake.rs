//! Feeds arbitrary bytes to the pre-authentication handshake as the server sees them: a 5-byte
//! header, then whatever follows as the payload.
//!
//! Beyond "never panics", it checks what the server relies on: the header check alone bounds
//! the payload it will read by `MAX_HELLO`, a payload of any other length than announced is
//! refused, and whatever is accepted re-encodes to exactly the input (the encoding is
//! canonical, so any difference is a field read in the wrong place or a value accepted that
//! the encoder could not have written).

#![no_main]

use bytes::BytesMut;
use ferry_proto::handshake::{check_hello_header, parse_hello, MAX_HELLO};
use ferry_proto::{ProtocolError, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((header, payload)) = data.split_first_chunk::<HEADER_LEN>() else {
        return;
    };
    let announced = check_hello_header(header);
    if let Ok(len) = announced {
        assert!(len <= MAX_HELLO as usize, "header check let {len} bytes through");
    }
    let parsed = parse_hello(header, payload);
    if let Err(e) = &parsed {
        // Every refusal can be told to the peer.
        let _ = ProtocolError::from(e.clone());
        return;
    }
    let hello = parsed.unwrap();
    assert_eq!(announced, Ok(payload.len()), "accepted a payload of another length");
    let mut encoded = BytesMut::new();
    hello.encode(&mut encoded);
    assert_eq!(&encoded[..], data, "re-encoding changed the bytes");
});
