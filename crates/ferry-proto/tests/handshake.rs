//! The pre-authentication handshake under arbitrary input: the property the `handshake` fuzz
//! target checks, run for a bounded number of cases so that CI exercises it on every build.

use bytes::BytesMut;
use ferry_proto::handshake::{check_hello_header, parse_hello, HandshakeError, Hello, MAX_HELLO};
use ferry_proto::*;
use proptest::collection::vec;
use proptest::prelude::*;

fn split(hello: &Hello) -> ([u8; HEADER_LEN], Vec<u8>) {
    let mut out = BytesMut::new();
    hello.encode(&mut out);
    let payload = out.split_off(HEADER_LEN).to_vec();
    (out[..].try_into().expect("5-byte header"), payload)
}

/// Hellos the server must accept: this version, any capability bits, a token of 1..=256 bytes
/// (as UTF-8 of any chars) or a data role with a stream index below `MAX_STREAMS`.
fn valid_hello() -> impl Strategy<Value = Hello> {
    let token = vec(any::<char>(), 1..64)
        .prop_map(String::from_iter)
        .prop_filter("token fits", |t| t.len() <= MAX_TOKEN);
    let role = prop_oneof![
        (token, any::<u64>(), any::<[u8; 32]>()).prop_map(|(token, s, secret)| {
            Role::Control {
                token,
                session: SessionId(s),
                secret,
            }
        }),
        (any::<u64>(), any::<[u8; 32]>(), 0..MAX_STREAMS).prop_map(|(s, secret, stream)| {
            Role::Data {
                session: SessionId(s),
                secret,
                stream,
            }
        }),
    ];
    (any::<u64>(), role).prop_map(|(caps, role)| Hello {
        version: PROTOCOL_VERSION,
        capabilities: Capabilities(caps),
        role,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Any bytes: never a panic, and the header check alone bounds what the server reads.
    #[test]
    fn arbitrary_bytes_never_panic(header in any::<[u8; HEADER_LEN]>(), payload in vec(any::<u8>(), 0..400)) {
        if let Ok(len) = check_hello_header(&header) {
            prop_assert!(len <= MAX_HELLO as usize);
        }
        match parse_hello(&header, &payload) {
            Ok(h) => {
                // Whatever is accepted is canonical: it re-encodes to the same bytes.
                let (h2, p2) = split(&h);
                prop_assert_eq!(h2, header);
                prop_assert_eq!(p2, payload);
            }
            Err(e) => {
                let p = ProtocolError::from(e);
                prop_assert!(!p.reason.is_empty());
            }
        }
    }

    /// Arbitrary bytes behind a valid Hello header of the right length reach the payload
    /// decoder (random headers mostly stop at the type byte).
    #[test]
    fn arbitrary_payload_never_panics(payload in vec(any::<u8>(), 0..=MAX_HELLO as usize)) {
        let mut header = [0u8; HEADER_LEN];
        header[0] = FrameType::HELLO.0;
        header[1..].copy_from_slice(&(payload.len() as u32).to_be_bytes());
        let _ = parse_hello(&header, &payload);
        // And with the magic in place, so the fields behind it are exercised too.
        let mut with_magic = payload.clone();
        let n = with_magic.len().min(MAGIC.len());
        with_magic[..n].copy_from_slice(&MAGIC[..n]);
        let _ = parse_hello(&header, &with_magic);
    }

    /// encode ∘ parse is the identity on valid hellos.
    #[test]
    fn valid_hellos_round_trip(h in valid_hello()) {
        let (header, payload) = split(&h);
        prop_assert_eq!(parse_hello(&header, &payload), Ok(h));
    }

    /// Trailing bytes (in the payload, or beyond the announced length) and a short payload are
    /// refused, never silently ignored.
    #[test]
    fn wrong_lengths_refused(h in valid_hello(), extra in vec(any::<u8>(), 1..16), cut in 1usize..8) {
        let (header, payload) = split(&h);
        // Beyond the announced length.
        let mut long = payload.clone();
        long.extend_from_slice(&extra);
        let is_mismatch = matches!(
            parse_hello(&header, &long),
            Err(HandshakeError::LengthMismatch { .. })
        );
        prop_assert!(is_mismatch);
        // Inside the announced length: the decoder finds them.
        let mut announced = header;
        announced[1..].copy_from_slice(&(long.len() as u32).to_be_bytes());
        let trailing = matches!(
            parse_hello(&announced, &long),
            Err(HandshakeError::Decode(DecodeError::TrailingBytes { .. }))
        );
        prop_assert!(trailing);
        // Short.
        let short = &payload[..payload.len().saturating_sub(cut)];
        prop_assert!(parse_hello(&header, short).is_err());
    }
}

#[test]
fn largest_lengths_refused_before_the_payload() {
    // The wire length is a u32: its largest value, and the literal 0xff bytes a client
    // claiming a 2^64-1 length would send.
    for header in [[0x01, 0xff, 0xff, 0xff, 0xff], [0xff; HEADER_LEN]] {
        let e = check_hello_header(&header).unwrap_err();
        assert_eq!(e.code(), ErrorCode::PROTOCOL, "{e}");
    }
    let mut at_limit = [0x01, 0, 0, 0, 0];
    at_limit[1..].copy_from_slice(&MAX_HELLO.to_be_bytes());
    assert_eq!(check_hello_header(&at_limit), Ok(MAX_HELLO as usize));
    at_limit[1..].copy_from_slice(&(MAX_HELLO + 1).to_be_bytes());
    assert!(matches!(
        check_hello_header(&at_limit),
        Err(HandshakeError::TooLarge { .. })
    ));
}
