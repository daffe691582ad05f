//! Resume-journal tests through the public API only, as the file side would use it.

use bytes::BytesMut;
use ferry_proto::journal::*;
use ferry_proto::{ChecksumAlgo, DecodeError, MAX_BLOCK_DATA, MAX_PATH, MIN_BLOCK_SIZE};
use proptest::collection::vec;
use proptest::prelude::*;
use xxhash_rust::xxh3::xxh3_64;

fn encode(header: &JournalHeader, records: &[JournalRecord]) -> Vec<u8> {
    let mut out = BytesMut::new();
    header.encode(&mut out);
    for record in records {
        record.encode(&mut out);
    }
    out.to_vec()
}

fn header_len(header: &JournalHeader) -> usize {
    encode(header, &[]).len()
}

/// A header with `body` as its body, `version` as its version and a correct checksum, for
/// reaching the body's field checks with bodies the encoder would never write.
fn raw_header(version: u16, body: &[u8]) -> Vec<u8> {
    let mut out = JOURNAL_MAGIC.to_vec();
    out.extend_from_slice(&version.to_be_bytes());
    out.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
    out.extend_from_slice(body);
    let crc = xxh3_64(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

/// The body of `header` as the encoder writes it.
fn body_of(header: &JournalHeader) -> Vec<u8> {
    let encoded = encode(header, &[]);
    encoded[12..encoded.len() - 8].to_vec()
}

/// A record with any tag and a correct checksum.
fn raw_record(tag: u8, offset: u64, len: u32, digest: u128) -> Vec<u8> {
    let mut out = vec![tag];
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&digest.to_be_bytes());
    let crc = xxh3_64(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

fn header_error(bytes: &[u8]) -> JournalError {
    decode_journal(bytes).expect_err("the header must be refused")
}

// ---------------------------------------------------------------------------------------------
// Strategies: valid values only, i.e. within every limit the decoder enforces.

fn checksum() -> impl Strategy<Value = ChecksumAlgo> {
    prop_oneof![
        Just(ChecksumAlgo::Blake3),
        Just(ChecksumAlgo::Xxh3),
        Just(ChecksumAlgo::Sha256),
        Just(ChecksumAlgo::Md5),
    ]
}

/// Any chars, control and non-ASCII included: at most 256 bytes, well within `MAX_PATH` (the
/// exact limit is tested separately).
fn text() -> impl Strategy<Value = String> {
    vec(any::<char>(), 0..64).prop_map(String::from_iter)
}

fn header() -> impl Strategy<Value = JournalHeader> {
    (
        prop_oneof![Just(0u64), 0..(1u64 << 24), any::<u64>(), Just(u64::MAX)],
        any::<i64>(),
        any::<u32>(),
        prop_oneof![
            Just(MIN_BLOCK_SIZE),
            Just(MAX_BLOCK_DATA),
            MIN_BLOCK_SIZE..=MAX_BLOCK_DATA
        ],
        checksum(),
        text(),
    )
        .prop_map(
            |(size, mtime_ns, mode, block_size, checksum, path)| JournalHeader {
                size,
                mtime_ns,
                mode,
                block_size,
                checksum,
                path,
            },
        )
}

/// A record that lies within a file of `size` bytes, empty ones and ones ending the file
/// included.
fn record(size: u64) -> impl Strategy<Value = JournalRecord> {
    (any::<u64>(), any::<u32>(), any::<u128>(), any::<bool>()).prop_map(
        move |(offset, len, digest, at_end)| {
            let max_len = size.min(u64::from(MAX_BLOCK_DATA));
            let len = u64::from(len) % (max_len + 1);
            let room = size - len; // offsets 0..=room keep the block within the file
            let offset = if at_end {
                room
            } else {
                offset.checked_rem(room.wrapping_add(1)).unwrap_or(offset)
            };
            JournalRecord {
                offset,
                len: u32::try_from(len).unwrap(),
                digest,
            }
        },
    )
}

fn journal() -> impl Strategy<Value = (JournalHeader, Vec<JournalRecord>)> {
    header().prop_flat_map(|header| {
        let size = header.size;
        (Just(header), vec(record(size), 0..12))
    })
}

fn nonempty_journal() -> impl Strategy<Value = (JournalHeader, Vec<JournalRecord>)> {
    header().prop_flat_map(|header| {
        let size = header.size;
        (Just(header), vec(record(size), 1..12))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn roundtrip((header, records) in journal()) {
        let bytes = encode(&header, &records);
        prop_assert_eq!(bytes.len(), header_len(&header) + records.len() * RECORD_LEN);
        prop_assert_eq!(
            decode_journal(&bytes),
            Ok(Journal { header, records, valid_len: bytes.len(), torn: false })
        );
    }

    /// A crash mid-append leaves a journal cut anywhere: the whole records before the cut
    /// survive, a cut inside the header loses the journal, and nothing panics.
    #[test]
    fn truncation_keeps_the_whole_records_before_the_cut(
        (header, records) in journal(),
        cut in any::<prop::sample::Index>(),
    ) {
        let bytes = encode(&header, &records);
        let hlen = header_len(&header);
        let cut = cut.index(bytes.len() + 1);
        let decoded = decode_journal(&bytes[..cut]);
        if cut < hlen {
            prop_assert!(decoded.is_err(), "cut at {} inside the header: {:?}", cut, decoded);
        } else {
            let whole = (cut - hlen) / RECORD_LEN;
            prop_assert_eq!(
                decoded,
                Ok(Journal {
                    header,
                    records: records[..whole].to_vec(),
                    valid_len: hlen + whole * RECORD_LEN,
                    torn: cut != hlen + whole * RECORD_LEN,
                })
            );
        }
    }

    #[test]
    fn a_bit_flip_in_a_record_ends_the_journal_before_it(
        (header, records) in nonempty_journal(),
        which in any::<prop::sample::Index>(),
        bit in 0..RECORD_LEN * 8,
    ) {
        let mut bytes = encode(&header, &records);
        let hlen = header_len(&header);
        let which = which.index(records.len());
        bytes[hlen + which * RECORD_LEN + bit / 8] ^= 1 << (bit % 8);
        prop_assert_eq!(
            decode_journal(&bytes),
            Ok(Journal {
                header,
                records: records[..which].to_vec(),
                valid_len: hlen + which * RECORD_LEN,
                torn: true,
            })
        );
    }

    #[test]
    fn a_bit_flip_in_the_header_is_an_error(
        (header, records) in journal(),
        bit in any::<prop::sample::Index>(),
    ) {
        let mut bytes = encode(&header, &records);
        let hlen = header_len(&header);
        let bit = bit.index(hlen * 8);
        bytes[bit / 8] ^= 1 << (bit % 8);
        let err = header_error(&bytes);
        match bit / 8 {
            0..=7 => prop_assert_eq!(err, JournalError::BadMagic),
            8..=9 => prop_assert!(matches!(err, JournalError::UnsupportedVersion(v) if v != 1)),
            // body_len moves where the checksum is read: any header error will do.
            10..=11 => {}
            _ => prop_assert_eq!(err, JournalError::HeaderChecksum),
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..1024)) {
        check_arbitrary_input(&bytes);
    }

    /// Random bytes rarely get past the magic; after a valid header they exercise the records.
    #[test]
    fn arbitrary_records_never_panic(header in header(), tail in vec(any::<u8>(), 0..1024)) {
        let mut bytes = encode(&header, &[]);
        bytes.extend_from_slice(&tail);
        let journal = check_arbitrary_input(&bytes).expect("the header is valid");
        prop_assert_eq!(journal.header, header);
    }

    #[test]
    fn garbage_after_valid_records_never_loses_them(
        (header, records) in journal(),
        garbage in vec(any::<u8>(), 1..256),
    ) {
        let mut bytes = encode(&header, &records);
        let valid = bytes.len();
        bytes.extend_from_slice(&garbage);
        let journal = check_arbitrary_input(&bytes).expect("the header is valid");
        prop_assert!(journal.records.starts_with(&records));
        prop_assert!(journal.valid_len >= valid);
        // Garbage that happens to be whole valid records is astronomically unlikely.
        prop_assert!(journal.torn);
        prop_assert_eq!(journal.valid_len, valid);
    }

    /// Overwriting bytes anywhere, and cutting, reaches every check without panicking.
    #[test]
    fn corrupted_journals_never_panic(
        (header, records) in journal(),
        flips in vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut bytes = encode(&header, &records);
        for (at, value) in flips {
            let at = at.index(bytes.len());
            bytes[at] = value;
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        check_arbitrary_input(&bytes);
    }
}

/// What the fuzz target checks: no panic, and whatever decodes is a canonical prefix of the
/// input (re-encoding reproduces exactly the bytes it accepted), with no allocation beyond one
/// record per `RECORD_LEN` input bytes.
fn check_arbitrary_input(bytes: &[u8]) -> Option<Journal> {
    let journal = decode_journal(bytes).ok()?;
    assert!(journal.valid_len <= bytes.len());
    assert_eq!(journal.torn, journal.valid_len != bytes.len());
    let hlen = header_len(&journal.header);
    assert_eq!(journal.valid_len, hlen + journal.records.len() * RECORD_LEN);
    assert!(journal.records.capacity() <= bytes.len() / RECORD_LEN);
    assert_eq!(
        encode(&journal.header, &journal.records),
        &bytes[..journal.valid_len]
    );
    Some(journal)
}

// ---------------------------------------------------------------------------------------------
// A sample journal, for the exhaustive checks and the fuzz seed corpus.

fn sample_header() -> JournalHeader {
    JournalHeader {
        size: 10 << 20,
        mtime_ns: 1_700_000_000_123_456_789,
        mode: 0o644,
        block_size: 4 << 20,
        checksum: ChecksumAlgo::Blake3,
        path: "dir/ünïcode.bin".into(),
    }
}

fn sample_records() -> Vec<JournalRecord> {
    vec![
        JournalRecord {
            offset: 4 << 20,
            len: 4 << 20,
            digest: 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
        },
        JournalRecord {
            offset: 0,
            len: 4 << 20,
            digest: 1,
        },
        JournalRecord {
            offset: 8 << 20,
            len: 2 << 20,
            digest: u128::MAX,
        },
    ]
}

#[test]
fn every_truncation_of_the_sample() {
    let (header, records) = (sample_header(), sample_records());
    let bytes = encode(&header, &records);
    let hlen = header_len(&header);
    for cut in 0..=bytes.len() {
        let decoded = decode_journal(&bytes[..cut]);
        if cut < hlen {
            assert!(
                matches!(
                    decoded,
                    Err(JournalError::Header(DecodeError::Truncated { .. }))
                ),
                "cut at {cut}: {decoded:?}"
            );
        } else {
            let journal = decoded.unwrap();
            let whole = (cut - hlen) / RECORD_LEN;
            assert_eq!(journal.records, records[..whole]);
            assert_eq!(journal.valid_len, hlen + whole * RECORD_LEN);
            assert_eq!(journal.torn, journal.valid_len != cut);
        }
    }
}

#[test]
fn truncated_header_names_the_field() {
    let bytes = encode(&sample_header(), &[]);
    let field = |cut: usize| match header_error(&bytes[..cut]) {
        JournalError::Header(DecodeError::Truncated { field }) => field,
        other => panic!("cut at {cut}: {other:?}"),
    };
    assert_eq!(field(0), "magic");
    assert_eq!(field(7), "magic");
    assert_eq!(field(9), "version");
    assert_eq!(field(11), "body_len");
    assert_eq!(field(12), "body");
    assert_eq!(field(bytes.len() - 9), "body");
    assert_eq!(field(bytes.len() - 8), "header_crc");
    assert_eq!(field(bytes.len() - 1), "header_crc");
}

/// Regenerates `fuzz/corpus/journal_decode` after a layout change:
/// `cargo test -p ferry-proto --test journal -- --ignored write_fuzz_seeds`.
#[test]
#[ignore = "writes into fuzz/corpus; run by hand"]
fn write_fuzz_seeds() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/journal_decode");
    std::fs::create_dir_all(&dir).unwrap();
    let (header, records) = (sample_header(), sample_records());
    let full = encode(&header, &records);
    let torn = full[..full.len() - 5].to_vec();
    let empty_file = JournalHeader {
        size: 0,
        path: String::new(),
        ..sample_header()
    };
    let seeds = [
        ("00-header-only", encode(&header, &[])),
        ("01-three-records", full),
        ("02-torn-tail", torn),
        (
            "03-empty-file",
            encode(
                &empty_file,
                &[JournalRecord {
                    offset: 0,
                    len: 0,
                    digest: 0,
                }],
            ),
        ),
        ("04-pinned", pinned_bytes().to_vec()),
    ];
    for (name, bytes) in seeds {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// Pinned bytes: if these change, the journal layout changed and JOURNAL_VERSION must too.

fn pinned_header() -> JournalHeader {
    JournalHeader {
        size: 0x0102,
        mtime_ns: -1,
        mode: 0o644,
        block_size: 1 << 20,
        checksum: ChecksumAlgo::Xxh3,
        path: "a/b".into(),
    }
}

fn pinned_record() -> JournalRecord {
    JournalRecord {
        offset: 0x10,
        len: 0x20,
        digest: 0x11,
    }
}

#[rustfmt::skip]
fn pinned_bytes() -> &'static [u8] {
    &[
        b'F', b'E', b'R', b'R', b'Y', b'J', b'N', b'L', // magic
        0, 1,                                           // version
        0, 30,                                          // body_len
        0, 0, 0, 0, 0, 0, 0x01, 0x02,                   // size
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // mtime_ns -1
        0, 0, 0x01, 0xa4,                               // mode 0o644
        0, 0x10, 0, 0,                                  // block_size 1 MiB
        2,                                              // checksum: XXH3
        0, 3, b'a', b'/', b'b',                         // path
        PINNED_HEADER_CRC[0], PINNED_HEADER_CRC[1], PINNED_HEADER_CRC[2], PINNED_HEADER_CRC[3],
        PINNED_HEADER_CRC[4], PINNED_HEADER_CRC[5], PINNED_HEADER_CRC[6], PINNED_HEADER_CRC[7],
        0x01,                                           // tag: block
        0, 0, 0, 0, 0, 0, 0, 0x10,                      // offset
        0, 0, 0, 0x20,                                  // len
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x11, // digest
        PINNED_RECORD_CRC[0], PINNED_RECORD_CRC[1], PINNED_RECORD_CRC[2], PINNED_RECORD_CRC[3],
        PINNED_RECORD_CRC[4], PINNED_RECORD_CRC[5], PINNED_RECORD_CRC[6], PINNED_RECORD_CRC[7],
    ]
}

/// XXH3-64 of the pinned header's first 42 bytes and of the record's first 29, as computed by
/// the C reference implementation (libxxhash 0.8.1), not by the crate under test.
const PINNED_HEADER_CRC: [u8; 8] = 0x6bc2_3d92_87cb_07d2_u64.to_be_bytes();
const PINNED_RECORD_CRC: [u8; 8] = 0xf3bd_db8f_9dfa_3810_u64.to_be_bytes();

#[test]
fn pinned_header_and_record() {
    let expected = pinned_bytes();
    assert_eq!(encode(&pinned_header(), &[pinned_record()]), expected);
    assert_eq!(
        decode_journal(expected),
        Ok(Journal {
            header: pinned_header(),
            records: vec![pinned_record()],
            valid_len: expected.len(),
            torn: false,
        })
    );
}

#[test]
fn a_record_is_exactly_record_len_bytes() {
    assert_eq!(RECORD_LEN, 37);
    let mut out = BytesMut::from(&b"xyz"[..]);
    pinned_record().encode(&mut out);
    assert_eq!(out.len(), 3 + RECORD_LEN);
    assert_eq!(&out[..3], b"xyz", "encode appends");
}

#[test]
fn header_encode_appends() {
    let mut out = BytesMut::from(&b"xyz"[..]);
    pinned_header().encode(&mut out);
    assert_eq!(&out[..3], b"xyz");
    assert_eq!(
        &out[3..],
        &pinned_bytes()[..pinned_bytes().len() - RECORD_LEN]
    );
}

// ---------------------------------------------------------------------------------------------
// Records: each way of being invalid ends decoding there, and keeps what came before.

/// Decodes `header` followed by `records` (raw bytes each) and returns how many records
/// survived, checking `valid_len` and `torn` agree with that.
fn surviving(header: &JournalHeader, records: &[Vec<u8>]) -> usize {
    let mut bytes = encode(header, &[]);
    let hlen = bytes.len();
    for record in records {
        bytes.extend_from_slice(record);
    }
    let journal = decode_journal(&bytes).unwrap();
    let n = journal.records.len();
    assert_eq!(journal.valid_len, hlen + n * RECORD_LEN);
    assert_eq!(journal.torn, n < records.len());
    n
}

fn record_bytes(offset: u64, len: u32) -> Vec<u8> {
    raw_record(0x01, offset, len, 0xd1)
}

#[test]
fn a_record_past_the_end_of_the_file_ends_decoding() {
    let header = JournalHeader {
        size: 100,
        ..sample_header()
    };
    let ok = record_bytes(0, 50);
    assert_eq!(surviving(&header, &[ok.clone(), record_bytes(50, 50)]), 2);
    assert_eq!(surviving(&header, &[ok.clone(), record_bytes(100, 0)]), 2);
    assert_eq!(
        surviving(&header, &[ok.clone(), record_bytes(51, 50), ok.clone()]),
        1
    );
    assert_eq!(
        surviving(&header, &[ok.clone(), record_bytes(101, 0), ok.clone()]),
        1
    );
    assert_eq!(surviving(&header, &[record_bytes(0, 101), ok.clone()]), 0);
    let huge = record_bytes(u64::MAX, u32::MAX);
    assert_eq!(surviving(&header, &[ok, huge]), 1);
}

#[test]
fn record_offsets_cannot_overflow() {
    let header = JournalHeader {
        size: u64::MAX,
        ..sample_header()
    };
    assert_eq!(surviving(&header, &[record_bytes(u64::MAX - 7, 7)]), 1);
    assert_eq!(surviving(&header, &[record_bytes(u64::MAX - 7, 8)]), 0);
    assert_eq!(surviving(&header, &[record_bytes(u64::MAX, 1)]), 0);
}

#[test]
fn record_lengths_are_limited() {
    let header = JournalHeader {
        size: u64::MAX,
        ..sample_header()
    };
    assert_eq!(surviving(&header, &[record_bytes(0, MAX_BLOCK_DATA)]), 1);
    assert_eq!(
        surviving(&header, &[record_bytes(0, MAX_BLOCK_DATA + 1)]),
        0
    );
    assert_eq!(surviving(&header, &[record_bytes(0, u32::MAX)]), 0);
}

#[test]
fn empty_records_are_kept() {
    // An empty file is one empty block; the file side may journal it like any other.
    let header = JournalHeader {
        size: 0,
        ..sample_header()
    };
    assert_eq!(surviving(&header, &[record_bytes(0, 0)]), 1);
    assert_eq!(surviving(&header, &[record_bytes(1, 0)]), 0);
}

#[test]
fn unknown_record_tags_end_decoding() {
    let ok = record_bytes(0, 1);
    for tag in [0x00, 0x02, 0x7f, 0xff] {
        let unknown = raw_record(tag, 0, 1, 0xd1);
        assert_eq!(
            surviving(&sample_header(), &[ok.clone(), unknown, ok.clone()]),
            1
        );
    }
}

#[test]
fn record_checksums_are_checked() {
    let ok = record_bytes(0, 1);
    let mut bad = ok.clone();
    bad[RECORD_LEN - 1] ^= 0x80;
    assert_eq!(
        surviving(&sample_header(), &[ok.clone(), bad, ok.clone()]),
        1
    );
    // All zeros (preallocated or zero-filled after a crash) is not a record.
    assert_eq!(surviving(&sample_header(), &[ok, vec![0; RECORD_LEN]]), 1);
}

#[test]
fn duplicates_and_disorder_are_kept_as_written() {
    let records = vec![
        JournalRecord {
            offset: 8,
            len: 8,
            digest: 2,
        },
        JournalRecord {
            offset: 0,
            len: 8,
            digest: 1,
        },
        JournalRecord {
            offset: 8,
            len: 8,
            digest: 2,
        },
    ];
    let header = JournalHeader {
        size: 16,
        ..sample_header()
    };
    let journal = decode_journal(&encode(&header, &records)).unwrap();
    assert_eq!(journal.records, records);
}

// ---------------------------------------------------------------------------------------------
// Header: every way of being invalid is an error naming what is wrong.

#[test]
fn the_magic_is_checked() {
    let mut bytes = encode(&sample_header(), &sample_records());
    bytes[7] = b'X';
    assert_eq!(header_error(&bytes), JournalError::BadMagic);
    // A short file that is not even the start of the magic is another file, not a torn journal.
    assert_eq!(header_error(b"FERRX"), JournalError::BadMagic);
    assert_eq!(header_error(b"{}"), JournalError::BadMagic);
    // A frame's magic is not a journal's.
    assert_eq!(header_error(b"FERRY\r\n\x1a\0\x01"), JournalError::BadMagic);
    assert_eq!(
        header_error(b"FERRY"),
        JournalError::Header(DecodeError::Truncated { field: "magic" })
    );
    assert_eq!(
        header_error(b""),
        JournalError::Header(DecodeError::Truncated { field: "magic" })
    );
}

#[test]
fn other_versions_are_refused() {
    let body = body_of(&sample_header());
    assert!(decode_journal(&raw_header(1, &body)).is_ok());
    for version in [0, 2, u16::MAX] {
        assert_eq!(
            header_error(&raw_header(version, &body)),
            JournalError::UnsupportedVersion(version)
        );
    }
    assert_eq!(
        JournalError::UnsupportedVersion(2).to_string(),
        "journal version 2 is not supported (this ferry reads version 1)"
    );
}

#[test]
fn the_body_length_is_limited() {
    let mut body = body_of(&sample_header());
    body.resize(MAX_HEADER_BODY + 1, 0);
    assert_eq!(
        header_error(&raw_header(1, &body)),
        JournalError::Header(DecodeError::TooLong {
            field: "body_len",
            len: MAX_HEADER_BODY + 1,
            max: MAX_HEADER_BODY,
        })
    );
    // At the limit the length is accepted, and the padding is refused as trailing bytes.
    let used = body_of(&sample_header()).len();
    body.truncate(MAX_HEADER_BODY);
    assert_eq!(
        header_error(&raw_header(1, &body)),
        JournalError::Header(DecodeError::TrailingBytes {
            frame: "journal header",
            extra: MAX_HEADER_BODY - used,
        })
    );
}

#[test]
fn the_body_must_be_consumed_exactly() {
    let mut body = body_of(&sample_header());
    body.push(0);
    assert_eq!(
        header_error(&raw_header(1, &body)),
        JournalError::Header(DecodeError::TrailingBytes {
            frame: "journal header",
            extra: 1,
        })
    );
    // A body too short for its fields names the first field that does not fit.
    let body = body_of(&sample_header());
    let short = |len: usize| header_error(&raw_header(1, &body[..len]));
    assert_eq!(
        short(0),
        JournalError::Header(DecodeError::Truncated { field: "size" })
    );
    assert_eq!(
        short(10),
        JournalError::Header(DecodeError::Truncated { field: "mtime_ns" })
    );
    assert_eq!(
        short(body.len() - 1),
        JournalError::Header(DecodeError::Truncated { field: "path" })
    );
}

#[test]
fn the_header_checksum_is_checked() {
    let mut bytes = encode(&sample_header(), &[]);
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    assert_eq!(header_error(&bytes), JournalError::HeaderChecksum);
    assert_eq!(
        JournalError::HeaderChecksum.to_string(),
        "journal header checksum mismatch"
    );
}

#[test]
fn block_sizes_are_range_checked() {
    for (block_size, ok) in [
        (MIN_BLOCK_SIZE, true),
        (MAX_BLOCK_DATA, true),
        (MIN_BLOCK_SIZE - 1, false),
        (MAX_BLOCK_DATA + 1, false),
        (0, false),
        (u32::MAX, false),
    ] {
        let header = JournalHeader {
            block_size,
            ..sample_header()
        };
        let decoded = decode_journal(&encode(&header, &[]));
        if ok {
            assert_eq!(decoded.unwrap().header, header);
        } else {
            assert_eq!(
                decoded,
                Err(JournalError::Header(DecodeError::InvalidValue {
                    field: "block_size",
                    value: u64::from(block_size),
                }))
            );
        }
    }
}

#[test]
fn checksum_algorithms_are_checked() {
    for algo in [
        ChecksumAlgo::Blake3,
        ChecksumAlgo::Xxh3,
        ChecksumAlgo::Sha256,
        ChecksumAlgo::Md5,
    ] {
        let header = JournalHeader {
            checksum: algo,
            ..sample_header()
        };
        assert_eq!(
            decode_journal(&encode(&header, &[])).unwrap().header,
            header
        );
    }
    let mut body = body_of(&sample_header());
    for value in [0u8, 5, 0xff] {
        body[24] = value;
        assert_eq!(
            header_error(&raw_header(1, &body)),
            JournalError::Header(DecodeError::InvalidValue {
                field: "checksum",
                value: u64::from(value),
            })
        );
    }
}

#[test]
fn paths_are_limited_and_utf8() {
    let at_limit = JournalHeader {
        path: "p".repeat(MAX_PATH),
        ..sample_header()
    };
    assert_eq!(
        decode_journal(&encode(&at_limit, &[])).unwrap().header,
        at_limit
    );
    // The encoder writes what it is given; the decoder refuses it.
    let over = JournalHeader {
        path: "p".repeat(MAX_PATH + 1),
        ..sample_header()
    };
    let err = header_error(&encode(&over, &[]));
    assert_eq!(
        err,
        JournalError::Header(DecodeError::TooLong {
            field: "path",
            len: MAX_PATH + 1,
            max: MAX_PATH,
        })
    );
    assert_eq!(
        err.to_string(),
        "journal header: field `path`: too long (4097 > 4096)"
    );

    let mut body = body_of(&JournalHeader {
        path: "ab".into(),
        ..sample_header()
    });
    let len = body.len();
    body[len - 1] = 0xff;
    assert_eq!(
        header_error(&raw_header(1, &body)),
        JournalError::Header(DecodeError::InvalidUtf8 { field: "path" })
    );
}

#[test]
fn a_header_error_reads_as_one_line() {
    // No source chain: the field error is part of the message, not repeated as its cause.
    let err = JournalError::Header(DecodeError::Truncated { field: "path" });
    assert_eq!(err.to_string(), "journal header: field `path`: truncated");
    assert!(std::error::Error::source(&err).is_none());
}
