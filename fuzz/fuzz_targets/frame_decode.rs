//! Feeds arbitrary bytes to the decoder as a driver would: a 5-byte header, then a payload.
//!
//! Beyond "never panics", it checks that whatever decodes re-encodes to exactly the same bytes:
//! the encoding is canonical, so any difference is a field read or written in the wrong place.

#![no_main]

use bytes::{Bytes, BytesMut};
use ferry_proto::{Frame, FrameHeader, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((header, payload)) = data.split_first_chunk::<HEADER_LEN>() else {
        return;
    };
    let Ok(header) = FrameHeader::parse(header) else {
        return;
    };
    let Ok(frame) = Frame::decode(header.ty, Bytes::copy_from_slice(payload)) else {
        return;
    };
    let mut encoded = BytesMut::new();
    frame.encode(&mut encoded);
    assert_eq!(
        &encoded[HEADER_LEN..],
        payload,
        "re-encoding changed the bytes"
    );
    let reencoded = encoded.split_off(HEADER_LEN).freeze();
    assert_eq!(Frame::decode(header.ty, reencoded), Ok(frame));
});
