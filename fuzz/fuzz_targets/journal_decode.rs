//! Feeds arbitrary bytes to the resume-journal decoder as the file side would after a crash.
//!
//! Beyond "never panics", it checks what the file side relies on: the accepted part is a prefix
//! of the input made of the header and whole records, and re-encoding what was decoded gives
//! back exactly that prefix (the encoding is canonical, so any difference is a field read or
//! written in the wrong place, or a record accepted that the encoder could not have written).
//!
//! A fuzzer cannot forge the checksums, so almost every mutation would stop at them. Each input
//! is therefore decoded twice: as it is (the checksums are checked), and with every checksum
//! recomputed over the bytes it covers (the fields behind them are checked).

#![no_main]

use bytes::BytesMut;
use ferry_proto::journal::{decode_journal, Journal, RECORD_LEN};
use libfuzzer_sys::fuzz_target;
use xxhash_rust::xxh3::xxh3_64;

fuzz_target!(|data: &[u8]| {
    check(data);
    if let Some(fixed) = with_checksums_fixed(data) {
        check(&fixed);
    }
});

fn check(data: &[u8]) {
    let Ok(journal) = decode_journal(data) else {
        return;
    };
    assert!(journal.valid_len <= data.len(), "valid_len past the input");
    assert_eq!(journal.torn, journal.valid_len != data.len());
    assert!(
        journal.records.capacity() <= data.len() / RECORD_LEN,
        "allocation out of proportion to the input"
    );

    let mut encoded = BytesMut::new();
    journal.header.encode(&mut encoded);
    let header_len = encoded.len();
    assert!(header_len <= journal.valid_len);
    assert_eq!(
        journal.records.len(),
        (journal.valid_len - header_len) / RECORD_LEN
    );
    assert_eq!((journal.valid_len - header_len) % RECORD_LEN, 0);
    for record in &journal.records {
        record.encode(&mut encoded);
    }
    assert_eq!(
        &encoded[..],
        &data[..journal.valid_len],
        "re-encoding changed the bytes"
    );
    // Decoding the valid prefix alone gives the same journal, with nothing torn.
    let prefix = Journal {
        torn: false,
        ..journal
    };
    assert_eq!(decode_journal(&encoded), Ok(prefix));
}

/// `data` with the header checksum (where `body_len` puts it) and each whole record's checksum
/// recomputed, or `None` if the input does not reach the header checksum.
fn with_checksums_fixed(data: &[u8]) -> Option<Vec<u8>> {
    let mut fixed = data.to_vec();
    let body_len = u16::from_be_bytes(fixed.get(10..12)?.try_into().ok()?);
    let crc_at = 12 + usize::from(body_len);
    let crc = xxh3_64(fixed.get(..crc_at)?);
    fixed
        .get_mut(crc_at..crc_at + 8)?
        .copy_from_slice(&crc.to_be_bytes());
    for record in fixed[crc_at + 8..].chunks_exact_mut(RECORD_LEN) {
        let (covered, crc) = record.split_at_mut(RECORD_LEN - 8);
        crc.copy_from_slice(&xxh3_64(covered).to_be_bytes());
    }
    Some(fixed)
}
