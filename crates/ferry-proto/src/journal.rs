//! Byte layout of the resume journal; `docs/PROTOCOL.md` ("Resume journal") is its prose twin.
//!
//! The receiver keeps, next to each partial temporary file, an append-only journal: a header
//! naming the file it belongs to, then one fixed-size record per block written and verified.
//! After a crash, [`decode_journal`] recovers what can be proven and the file side re-reads and
//! re-verifies every recorded block before trusting it, so the codec's job is only to separate
//! intact records from whatever a crash left behind.
//!
//! Decoding treats the journal as untrusted (a crash tears it, a disk flips bits, anything may sit
//! at its path): every read is bounds-checked, nothing is allocated out of proportion to the
//! input, and no input panics. A bad header is an error (the partial file is discarded); after a
//! good header, the first record that is incomplete, fails its checksum or contradicts the header
//! ends decoding, and everything from there on is ignored rather than refused.
//!
//! Encoding trusts its input, like the frame codec: it writes the values it is given and leaves
//! the limits to the decoder. A journal whose header breaks a limit decodes as an error, which
//! costs a resume, never data.

use std::ops::Range;

use bytes::{BufMut, BytesMut};
use xxhash_rust::xxh3::xxh3_64;

use crate::error::DecodeError;
use crate::frame::{ChecksumAlgo, MAX_BLOCK_DATA, MAX_PATH, MIN_BLOCK_SIZE};

/// Bytes every journal starts with.
pub const JOURNAL_MAGIC: [u8; 8] = *b"FERRYJNL";

/// The journal layout this build writes and reads. Bumped on any incompatible change.
pub const JOURNAL_VERSION: u16 = 1;

/// Size of one encoded [`JournalRecord`], its checksum included.
pub const RECORD_LEN: usize = 37;

/// Largest header body (`body_len`). The largest valid body is 27 bytes of fixed fields plus a
/// [`MAX_PATH`]-byte path; the rest is room for fields a later version might add.
pub const MAX_HEADER_BODY: usize = 8192;

/// Tag of a [`JournalRecord`]: a block that was written and verified.
const TAG_BLOCK: u8 = 0x01;

/// Record bytes covered by the record's checksum: everything before it.
const RECORD_BODY_LEN: usize = RECORD_LEN - 8;

/// What the journal belongs to: the file being received and the transfer parameters it was
/// received with. A resume whose file or parameters differ starts from zero instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalHeader {
    /// Size of the complete file.
    pub size: u64,
    /// The source's modification time, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
    pub mode: u32,
    pub block_size: u32,
    pub checksum: ChecksumAlgo,
    /// Path relative to the transfer's destination, as in `Block`.
    pub path: String,
}

/// One block of the file that was written and verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalRecord {
    pub offset: u64,
    pub len: u32,
    /// XXH3-128 of the block's data, as carried by its `Block` frame.
    pub digest: u128,
}

/// What [`decode_journal`] could prove from a journal's bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Journal {
    pub header: JournalHeader,
    /// The valid records in journal order, neither deduplicated nor sorted.
    pub records: Vec<JournalRecord>,
    /// Bytes of input that are a valid header plus whole valid records: where the next record goes.
    pub valid_len: usize,
    /// Whether anything followed the last valid record (a torn or corrupt tail).
    pub torn: bool,
}

/// Why a journal's header is unusable. Bad records are never an error: they end the journal.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum JournalError {
    #[error("bad magic: not a ferry resume journal")]
    BadMagic,
    #[error("journal version {0} is not supported (this ferry reads version {JOURNAL_VERSION})")]
    UnsupportedVersion(u16),
    /// A header field is truncated, out of range or malformed; the error names the field.
    #[error("journal header: {0}")]
    Header(DecodeError),
    #[error("journal header checksum mismatch")]
    HeaderChecksum,
}

impl JournalHeader {
    /// Appends the whole header, checksum included, to `out`.
    ///
    /// # Panics
    ///
    /// If the path is so long (about 64 KiB) that the body length does not fit its `u16`
    /// prefix. Paths longer than [`MAX_PATH`] but shorter than that are written, and refused by
    /// the decoder.
    pub fn encode(&self, out: &mut BytesMut) {
        let start = out.len();
        out.put_slice(&JOURNAL_MAGIC);
        out.put_u16(JOURNAL_VERSION);
        out.put_u16(0); // body_len, patched below
        let body_start = out.len();
        out.put_u64(self.size);
        out.put_i64(self.mtime_ns);
        out.put_u32(self.mode);
        out.put_u32(self.block_size);
        out.put_u8(self.checksum as u8);
        out.put_u16(wire_len(self.path.len(), "journal path"));
        out.put_slice(self.path.as_bytes());
        let body_len: u16 = wire_len(out.len() - body_start, "journal header body");
        out[body_start - 2..body_start].copy_from_slice(&body_len.to_be_bytes());
        let crc = xxh3_64(&out[start..]);
        out.put_u64(crc);
    }
}

impl JournalRecord {
    /// Appends exactly [`RECORD_LEN`] bytes to `out`: the record and its checksum.
    pub fn encode(&self, out: &mut BytesMut) {
        let start = out.len();
        out.put_u8(TAG_BLOCK);
        out.put_u64(self.offset);
        out.put_u32(self.len);
        out.put_u128(self.digest);
        let crc = xxh3_64(&out[start..]);
        out.put_u64(crc);
    }
}

/// Decodes a journal: its header, then every record up to the first that is incomplete,
/// corrupt or inconsistent with the header.
///
/// Only the header can fail: a journal without a usable header proves nothing. A bad record is
/// what a crash in the middle of an append leaves, so it ends the journal quietly; `torn` says
/// that something was ignored and `valid_len` where appending may continue. Never panics, and
/// allocates at most the header's path and one [`JournalRecord`] per [`RECORD_LEN`] input bytes.
pub fn decode_journal(input: &[u8]) -> Result<Journal, JournalError> {
    let (header, header_len) = decode_header(input)?;
    let rest = input.get(header_len..).unwrap_or_default();
    let mut records = Vec::with_capacity(rest.len() / RECORD_LEN);
    for chunk in rest.chunks_exact(RECORD_LEN) {
        match decode_record(chunk, header.size) {
            Some(record) => records.push(record),
            None => break,
        }
    }
    let valid_len = header_len + records.len() * RECORD_LEN;
    Ok(Journal {
        header,
        records,
        valid_len,
        torn: valid_len != input.len(),
    })
}

/// The header and its encoded length. Magic and version come first because they say how to read
/// the rest; the checksum is verified before the body's fields are, so that a damaged header is
/// reported as damaged rather than as whichever field the damage happened to hit.
fn decode_header(input: &[u8]) -> Result<(JournalHeader, usize), JournalError> {
    // A short input that is not even the start of the magic is some other file, not a torn
    // journal.
    if !JOURNAL_MAGIC.starts_with(input.get(..JOURNAL_MAGIC.len()).unwrap_or(input)) {
        return Err(JournalError::BadMagic);
    }
    let mut r = Reader { buf: input, pos: 0 };
    if r.array::<8>("magic")? != JOURNAL_MAGIC {
        return Err(JournalError::BadMagic);
    }
    let version = r.u16("version")?;
    if version != JOURNAL_VERSION {
        return Err(JournalError::UnsupportedVersion(version));
    }
    let body_len = usize::from(r.u16("body_len")?);
    if body_len > MAX_HEADER_BODY {
        return Err(JournalError::Header(DecodeError::TooLong {
            field: "body_len",
            len: body_len,
            max: MAX_HEADER_BODY,
        }));
    }
    let body = r.take(body_len, "body")?;
    let covered = r.pos;
    let crc = r.u64("header_crc")?;
    let header_len = r.pos;
    if input.get(..covered).map(xxh3_64) != Some(crc) {
        return Err(JournalError::HeaderChecksum);
    }

    let mut b = Reader { buf: body, pos: 0 };
    let header = JournalHeader {
        size: b.u64("size")?,
        mtime_ns: b.i64("mtime_ns")?,
        mode: b.u32("mode")?,
        block_size: match b.u32("block_size")? {
            n @ MIN_BLOCK_SIZE..=MAX_BLOCK_DATA => n,
            other => return Err(invalid("block_size", other)),
        },
        checksum: match b.u8("checksum")? {
            1 => ChecksumAlgo::Blake3,
            2 => ChecksumAlgo::Xxh3,
            3 => ChecksumAlgo::Sha256,
            4 => ChecksumAlgo::Md5,
            other => return Err(invalid("checksum", other)),
        },
        path: b.str("path", MAX_PATH)?,
    };
    match b.remaining() {
        0 => Ok((header, header_len)),
        extra => Err(JournalError::Header(DecodeError::TrailingBytes {
            frame: "journal header",
            extra,
        })),
    }
}

/// One record, or `None` if it must end the journal.
fn decode_record(chunk: &[u8], size: u64) -> Option<JournalRecord> {
    let (body, crc) = chunk.split_at_checked(RECORD_BODY_LEN)?;
    if u64::from_be_bytes(crc.try_into().ok()?) != xxh3_64(body) {
        return None;
    }
    let (&tag, body) = body.split_first()?;
    if tag != TAG_BLOCK {
        return None;
    }
    let (offset, body) = body.split_first_chunk::<8>()?;
    let (len, body) = body.split_first_chunk::<4>()?;
    let digest: [u8; 16] = body.try_into().ok()?;
    let record = JournalRecord {
        offset: u64::from_be_bytes(*offset),
        len: u32::from_be_bytes(*len),
        digest: u128::from_be_bytes(digest),
    };
    // The file side writes `len` bytes at `offset` into a file of `size` bytes when it
    // re-verifies the record; one that points outside the file was not written by us.
    let end = record.offset.checked_add(u64::from(record.len))?;
    (record.len <= MAX_BLOCK_DATA && end <= size).then_some(record)
}

/// Converts a local length to its length prefix type; see the panics of [`JournalHeader::encode`].
fn wire_len<T: TryFrom<usize>>(len: usize, what: &str) -> T {
    T::try_from(len)
        .unwrap_or_else(|_| panic!("{what} of length {len} does not fit its length prefix"))
}

fn invalid(field: &'static str, value: impl Into<u64>) -> JournalError {
    JournalError::Header(DecodeError::InvalidValue {
        field,
        value: value.into(),
    })
}

/// Cursor over an untrusted header. Reads fail with `Truncated` naming the field instead of
/// panicking. (The frame codec has its own over `Bytes`; this one borrows a plain slice.)
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// Claims the next `n` bytes, or fails without moving if fewer are left.
    fn advance(&mut self, n: usize, field: &'static str) -> Result<Range<usize>, JournalError> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.buf.len() => {
                let range = self.pos..end;
                self.pos = end;
                Ok(range)
            }
            _ => Err(truncated(field)),
        }
    }

    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], JournalError> {
        let range = self.advance(n, field)?;
        self.buf.get(range).ok_or_else(|| truncated(field))
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], JournalError> {
        self.take(N, field)?
            .try_into()
            .map_err(|_| truncated(field))
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, JournalError> {
        self.array(field).map(u8::from_be_bytes)
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, JournalError> {
        self.array(field).map(u16::from_be_bytes)
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, JournalError> {
        self.array(field).map(u32::from_be_bytes)
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, JournalError> {
        self.array(field).map(u64::from_be_bytes)
    }

    fn i64(&mut self, field: &'static str) -> Result<i64, JournalError> {
        self.array(field).map(i64::from_be_bytes)
    }

    /// A u16-length-prefixed UTF-8 string, its limit checked before the bytes are touched.
    fn str(&mut self, field: &'static str, max: usize) -> Result<String, JournalError> {
        let len = usize::from(self.u16(field)?);
        if len > max {
            return Err(JournalError::Header(DecodeError::TooLong {
                field,
                len,
                max,
            }));
        }
        let bytes = self.take(len, field)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| JournalError::Header(DecodeError::InvalidUtf8 { field }))
    }
}

fn truncated(field: &'static str) -> JournalError {
    JournalError::Header(DecodeError::Truncated { field })
}
