//! Byte layout of every frame; `docs/PROTOCOL.md` is its prose twin and must change with it.
//!
//! Decoding treats the payload as hostile: every read is bounds-checked and every length is
//! checked against its limit and against the bytes actually present before anything is
//! allocated. Strings copy at most what the payload holds, `Block` data is borrowed from it, and
//! a listing reserves no more entries than the payload could contain. So a peer's bytes can
//! produce an error, never a panic or an allocation out of proportion to what it sent.
//!
//! Encoding trusts its input (it comes from this process): it writes the values it is given
//! and leaves the limits to the peer's decoder, which names the field that broke one. The
//! exceptions: over-long messages are cut (see [`Frame::encode`]), and a length that does not
//! fit its length prefix at all panics, because writing it would desynchronise the stream.

use std::ops::Range;

use bytes::{BufMut, Bytes, BytesMut};

mod catalog;
mod copy;
mod remove;

use crate::error::DecodeError;
use crate::frame::{
    Block, Capabilities, ChecksumAlgo, CompleteSummary, Decision, EntryKind, ErrorCode,
    ExistingPolicy, FileDecision, FileId, FileMeta, Frame, FrameType, ListEntry, Load, OfferEntry,
    ProbeDirection, ProbeStream, Role, SessionId, TransferOpts, TuneReport, TuneStep, TuneVerdict,
    HEADER_LEN, MAGIC, MAX_BLOCK_DATA, MAX_DIGEST, MAX_LANDED_CVS, MAX_LIST_ENTRIES, MAX_MESSAGE,
    MAX_OFFER_ENTRIES, MAX_PATH, MAX_PROBE_INTERVALS, MAX_RESUME_RANGES, MAX_STORAGE_THREADS,
    MAX_STREAMS, MAX_TAR_DATA, MAX_TOKEN, MAX_TUNE_STEPS, MIN_BLOCK_SIZE,
};

const ROLE_CONTROL: u8 = 0;
const ROLE_DATA: u8 = 1;

/// `Block.flags` bit 0: sent before the sender had the file's decision.
const BLOCK_EARLY: u8 = 1;

/// Smallest encoding of a [`ListEntry`] (empty name): bounds the capacity reserved for a listing
/// by what the payload can actually hold, whatever count it claims.
const MIN_ENTRY_LEN: usize = 2 + 1 + 8 + 4 + 8;

/// The fixed 5-byte prefix of every frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub ty: FrameType,
    /// Payload length, not counting the header.
    pub len: u32,
}

impl FrameHeader {
    /// Validates a header before its payload is read, so that an unknown type or an oversized
    /// length is refused before the driver allocates a buffer for it.
    pub fn parse(buf: &[u8; HEADER_LEN]) -> Result<Self, DecodeError> {
        let [ty, len @ ..] = *buf;
        let header = Self {
            ty: FrameType(ty),
            len: u32::from_be_bytes(len),
        };
        check_payload_len(header.ty, header.len)?;
        Ok(header)
    }

    pub fn encode(&self, out: &mut BytesMut) {
        out.put_u8(self.ty.0);
        out.put_u32(self.len);
    }
}

fn check_payload_len(ty: FrameType, len: u32) -> Result<(), DecodeError> {
    let max = ty
        .max_payload()
        .ok_or(DecodeError::UnknownFrameType(ty.0))?;
    if len > max {
        return Err(DecodeError::FrameTooLarge {
            frame: ty.name(),
            len,
            max,
        });
    }
    Ok(())
}

impl Frame {
    pub fn frame_type(&self) -> FrameType {
        match self {
            Frame::Hello { .. } => FrameType::HELLO,
            Frame::Welcome { .. } => FrameType::WELCOME,
            Frame::Error { .. } => FrameType::ERROR,
            Frame::PutRequest { .. } => FrameType::PUT_REQUEST,
            Frame::GetRequest { .. } => FrameType::GET_REQUEST,
            Frame::ListRequest { .. } => FrameType::LIST_REQUEST,
            Frame::Ready { .. } => FrameType::READY,
            Frame::ListEntries { .. } => FrameType::LIST_ENTRIES,
            Frame::ListEnd => FrameType::LIST_END,
            Frame::Block(_) => FrameType::BLOCK,
            Frame::Dir { .. } => FrameType::DIR,
            Frame::Symlink { .. } => FrameType::SYMLINK,
            Frame::Sent { .. } => FrameType::SENT,
            Frame::Resend { .. } => FrameType::RESEND,
            Frame::Skipped { .. } => FrameType::SKIPPED,
            Frame::Offer { .. } => FrameType::OFFER,
            Frame::Decisions { .. } => FrameType::DECISIONS,
            Frame::EntryFailed { .. } => FrameType::ENTRY_FAILED,
            Frame::FileFailed { .. } => FrameType::FILE_FAILED,
            Frame::Complete(_) => FrameType::COMPLETE,
            Frame::Tuned(_) => FrameType::TUNED,
            Frame::ProbeRequest { .. } => FrameType::PROBE_REQUEST,
            Frame::ProbeResult { .. } => FrameType::PROBE_RESULT,
            Frame::ProbeData { .. } => FrameType::PROBE_DATA,
            Frame::GrantRequest { .. } => FrameType::GRANT_REQUEST,
            Frame::Granted { .. } => FrameType::GRANTED,
            Frame::CopyRequest(_) => FrameType::COPY_REQUEST,
            Frame::Paths { .. } => FrameType::PATHS,
            Frame::CopyProgress(_) => FrameType::COPY_PROGRESS,
            Frame::CopyDone { .. } => FrameType::COPY_DONE,
            Frame::StripeRequest { .. } => FrameType::STRIPE_REQUEST,
            Frame::Landed { .. } => FrameType::LANDED,
            Frame::RemoveRequest { .. } => FrameType::REMOVE_REQUEST,
            Frame::Removed { .. } => FrameType::REMOVED,
            Frame::CopyPaths { .. } => FrameType::COPY_PATHS,
            Frame::CatalogRequest(_) => FrameType::CATALOG_REQUEST,
            Frame::CatalogAnswer(_) => FrameType::CATALOG_ANSWER,
            Frame::TarData { .. } => FrameType::TAR_DATA,
            Frame::FileDigest { .. } => FrameType::FILE_DIGEST,
            Frame::StripeRead { .. } => FrameType::STRIPE_READ,
            Frame::Fetch { .. } => FrameType::FETCH,
            Frame::StripeGrantRequest { .. } => FrameType::STRIPE_GRANT_REQUEST,
            Frame::ReadGrantRequest { .. } => FrameType::READ_GRANT_REQUEST,
        }
    }

    /// Decodes the payload of a frame whose header has been parsed.
    ///
    /// The whole payload must be consumed: trailing bytes mean the peer's layout differs from
    /// ours, and silently ignoring them would hide exactly the drift the version number guards.
    /// `Block` data and file digests are zero-copy slices of `payload`.
    pub fn decode(ty: FrameType, payload: Bytes) -> Result<Frame, DecodeError> {
        check_payload_len(ty, u32::try_from(payload.len()).unwrap_or(u32::MAX))?;
        let mut r = Reader {
            buf: &payload,
            pos: 0,
        };
        let frame = match ty {
            FrameType::HELLO => decode_hello(&mut r)?,
            FrameType::WELCOME => Frame::Welcome {
                version: r.u16("version")?,
                capabilities: Capabilities(r.u64("capabilities")?),
                session: SessionId(r.u64("session")?),
                secret: r.array("secret")?,
            },
            FrameType::ERROR => Frame::Error {
                code: ErrorCode(r.u16("code")?),
                message: r.str("message", MAX_MESSAGE)?,
            },
            FrameType::PUT_REQUEST => Frame::PutRequest {
                dest: r.str("dest", MAX_PATH)?,
                sources: r.u32("sources")?,
                opts: decode_opts(&mut r)?,
            },
            FrameType::GET_REQUEST => Frame::GetRequest {
                src: r.str("src", MAX_PATH)?,
                opts: decode_opts(&mut r)?,
            },
            FrameType::LIST_REQUEST => Frame::ListRequest {
                path: r.str("path", MAX_PATH)?,
            },
            FrameType::READY => Frame::Ready {
                streams: decode_streams(&mut r)?,
                block_size: decode_block_size(&mut r)?,
            },
            FrameType::LIST_ENTRIES => decode_list_entries(&mut r)?,
            FrameType::LIST_END => Frame::ListEnd,
            FrameType::BLOCK => Frame::Block(decode_block(&mut r)?),
            FrameType::DIR => Frame::Dir {
                path: r.str("path", MAX_PATH)?,
                mode: r.u32("mode")?,
                mtime_ns: r.i64("mtime_ns")?,
            },
            FrameType::SYMLINK => Frame::Symlink {
                path: r.str("path", MAX_PATH)?,
                target: r.str("target", MAX_PATH)?,
                mtime_ns: r.i64("mtime_ns")?,
            },
            FrameType::SENT => decode_sent(&mut r)?,
            FrameType::RESEND => Frame::Resend {
                file: FileId(r.u64("file")?),
                offset: r.u64("offset")?,
                len: r.u32("len")?,
            },
            FrameType::SKIPPED => Frame::Skipped {
                file: FileId(r.u64("file")?),
            },
            FrameType::FILE_FAILED => Frame::FileFailed {
                file: FileId(r.u64("file")?),
                code: ErrorCode(r.u16("code")?),
                message: r.str("message", MAX_MESSAGE)?,
            },
            FrameType::COMPLETE => Frame::Complete(decode_complete(&mut r)?),
            FrameType::TUNED => Frame::Tuned(decode_tuned(&mut r)?),
            FrameType::OFFER => decode_offer(&mut r)?,
            FrameType::DECISIONS => decode_decisions(&mut r)?,
            FrameType::ENTRY_FAILED => Frame::EntryFailed {
                path: r.str("path", MAX_PATH)?,
                code: ErrorCode(r.u16("code")?),
                message: r.str("message", MAX_MESSAGE)?,
            },
            FrameType::PROBE_REQUEST => decode_probe_request(&mut r)?,
            FrameType::PROBE_RESULT => decode_probe_result(&mut r)?,
            FrameType::TAR_DATA => {
                let last = match r.u8("last")? {
                    0 => false,
                    1 => true,
                    other => return Err(invalid("last", other)),
                };
                let len = usize::try_from(r.u32("data_len")?).unwrap_or(usize::MAX);
                if len > MAX_TAR_DATA {
                    return Err(DecodeError::TooLong {
                        field: "data",
                        len,
                        max: MAX_TAR_DATA,
                    });
                }
                Frame::TarData {
                    data: r.bytes(len, "data")?,
                    last,
                }
            }
            FrameType::PROBE_DATA => {
                let len = r.u32("data_len")?;
                Frame::ProbeData {
                    data: r.bytes(usize::try_from(len).unwrap_or(usize::MAX), "data")?,
                }
            }
            FrameType::GRANT_REQUEST => Frame::GrantRequest {
                dest: r.str("dest", MAX_PATH)?,
                existing: decode_existing(&mut r)?,
            },
            FrameType::GRANTED => copy::decode_granted(&mut r)?,
            FrameType::COPY_REQUEST => copy::decode_copy_request(&mut r)?,
            FrameType::PATHS => copy::decode_paths(&mut r)?,
            FrameType::COPY_PROGRESS => copy::decode_copy_progress(&mut r)?,
            FrameType::COPY_DONE => copy::decode_copy_done(&mut r)?,
            FrameType::STRIPE_REQUEST => Frame::StripeRequest {
                dest: r.str("dest", MAX_PATH)?,
                opts: decode_opts(&mut r)?,
            },
            FrameType::LANDED => decode_landed(&mut r)?,
            FrameType::FILE_DIGEST => decode_file_digest(&mut r)?,
            FrameType::STRIPE_READ => Frame::StripeRead {
                src: r.str("src", MAX_PATH)?,
                opts: decode_opts(&mut r)?,
            },
            FrameType::FETCH => decode_fetch(&mut r)?,
            FrameType::STRIPE_GRANT_REQUEST => Frame::StripeGrantRequest {
                dest: r.str("dest", MAX_PATH)?,
            },
            FrameType::READ_GRANT_REQUEST => Frame::ReadGrantRequest {
                src: r.str("src", MAX_PATH)?,
                stripe: match r.u8("stripe")? {
                    0 => false,
                    1 => true,
                    other => return Err(invalid("stripe", other)),
                },
            },
            FrameType::REMOVE_REQUEST => remove::decode_remove_request(&mut r)?,
            FrameType::REMOVED => remove::decode_removed(&mut r)?,
            FrameType::COPY_PATHS => copy::decode_copy_paths(&mut r)?,
            FrameType::CATALOG_REQUEST => catalog::decode_request(&mut r)?,
            FrameType::CATALOG_ANSWER => catalog::decode_answer(&mut r)?,
            _ => return Err(DecodeError::UnknownFrameType(ty.0)),
        };
        r.finish(ty)?;
        Ok(frame)
    }

    /// Appends the header and payload to `out`.
    ///
    /// Messages longer than [`MAX_MESSAGE`] are cut at a character boundary, because a
    /// diagnostic that is too long should still reach the peer rather than be refused by it.
    ///
    /// # Panics
    ///
    /// If a string exceeds 65535 bytes, a listing 65535 entries, a file digest 255 bytes or the
    /// payload 4 GiB: lengths the wire format cannot express (all far beyond its limits).
    pub fn encode(&self, out: &mut BytesMut) {
        encode_frame(out, self.frame_type(), 0, |out| self.encode_payload(out));
    }

    /// The payload of a frame of a transfer (files, their blocks and the session's end); the
    /// frames that set a session up, list or probe go to [`Self::encode_setup_payload`].
    fn encode_payload(&self, out: &mut BytesMut) {
        match self {
            Frame::Block(block) => {
                put_block_head(out, block);
                out.put_slice(&block.data);
            }
            Frame::Dir {
                path,
                mode,
                mtime_ns,
            } => {
                put_str(out, path);
                out.put_u32(*mode);
                out.put_i64(*mtime_ns);
            }
            Frame::Symlink {
                path,
                target,
                mtime_ns,
            } => {
                put_str(out, path);
                put_str(out, target);
                out.put_i64(*mtime_ns);
            }
            Frame::Sent {
                files,
                dirs,
                symlinks,
                bytes,
            } => {
                for n in [files, dirs, symlinks, bytes] {
                    out.put_u64(*n);
                }
            }
            Frame::Resend { file, offset, len } => {
                out.put_u64(file.0);
                out.put_u64(*offset);
                out.put_u32(*len);
            }
            Frame::Skipped { file } => out.put_u64(file.0),
            Frame::FileFailed {
                file,
                code,
                message,
            } => {
                out.put_u64(file.0);
                out.put_u16(code.0);
                put_message(out, message);
            }
            Frame::Complete(c) => put_complete(out, c),
            Frame::Tuned(t) => put_tuned(out, t),
            Frame::Offer { entries } => put_offer(out, entries),
            Frame::EntryFailed {
                path,
                code,
                message,
            } => {
                put_str(out, path);
                out.put_u16(code.0);
                put_message(out, message);
            }
            Frame::Decisions { entries } => put_decisions(out, entries),
            Frame::Hello { .. }
            | Frame::Welcome { .. }
            | Frame::Error { .. }
            | Frame::PutRequest { .. }
            | Frame::GetRequest { .. }
            | Frame::ListRequest { .. }
            | Frame::Ready { .. }
            | Frame::ListEntries { .. }
            | Frame::ListEnd
            | Frame::ProbeRequest { .. }
            | Frame::ProbeResult { .. }
            | Frame::ProbeData { .. } => self.encode_setup_payload(out),
            Frame::GrantRequest { dest, existing } => {
                put_str(out, dest);
                out.put_u8(*existing as u8);
            }
            Frame::Granted { grant, ttl_ms } => copy::put_granted(out, grant, *ttl_ms),
            Frame::StripeGrantRequest { dest } => put_str(out, dest),
            Frame::ReadGrantRequest { src, stripe } => {
                put_str(out, src);
                out.put_u8(u8::from(*stripe));
            }
            Frame::CopyRequest(c) => copy::put_copy_request(out, c),
            Frame::Paths { addrs } => copy::put_paths(out, addrs),
            Frame::CopyProgress(p) => copy::put_copy_progress(out, p),
            Frame::CopyDone { summary, report } => copy::put_copy_done(out, summary, report),
            Frame::StripeRequest { dest, opts } => {
                put_str(out, dest);
                put_opts(out, opts);
            }
            Frame::Landed {
                file,
                offset,
                len,
                digest,
                cvs,
            } => {
                out.put_u64(file.0);
                out.put_u64(*offset);
                out.put_u32(*len);
                out.put_u128(*digest);
                out.put_u8(cvs.len() as u8);
                for cv in cvs {
                    out.put_slice(cv);
                }
            }
            Frame::RemoveRequest { paths, more } => remove::put_remove_request(out, paths, *more),
            Frame::Removed { removed, failures } => remove::put_removed(out, *removed, failures),
            Frame::CopyPaths { paths, more } => copy::put_copy_paths(out, paths, *more),
            Frame::CatalogRequest(req) => catalog::put_request(out, req),
            Frame::CatalogAnswer(answer) => catalog::put_answer(out, answer),
            Frame::TarData { data, last } => {
                out.put_u8(u8::from(*last));
                out.put_u32(wire_len(data.len(), "tar data"));
                out.put_slice(data);
            }
            Frame::FileDigest { file, digest } => {
                out.put_u64(file.0);
                out.put_u8(wire_len(digest.len(), "file digest"));
                out.put_slice(digest);
            }
            Frame::StripeRead { src, opts } => {
                put_str(out, src);
                put_opts(out, opts);
            }
            Frame::Fetch {
                file,
                path,
                size,
                mtime_ns,
                offset,
                len,
            } => {
                out.put_u64(file.0);
                put_str(out, path);
                out.put_u64(*size);
                out.put_i64(*mtime_ns);
                out.put_u64(*offset);
                out.put_u32(*len);
            }
        }
    }

    /// The payload of a frame that sets a session up, lists a directory or probes the network.
    fn encode_setup_payload(&self, out: &mut BytesMut) {
        match self {
            Frame::Hello {
                version,
                capabilities,
                role,
            } => put_hello(out, *version, *capabilities, role),
            Frame::Welcome {
                version,
                capabilities,
                session,
                secret,
            } => {
                out.put_u16(*version);
                out.put_u64(capabilities.0);
                out.put_u64(session.0);
                out.put_slice(secret);
            }
            Frame::Error { code, message } => {
                out.put_u16(code.0);
                put_message(out, message);
            }
            Frame::PutRequest {
                dest,
                sources,
                opts,
            } => {
                put_str(out, dest);
                out.put_u32(*sources);
                put_opts(out, opts);
            }
            Frame::GetRequest { src, opts } => {
                put_str(out, src);
                put_opts(out, opts);
            }
            Frame::ListRequest { path } => put_str(out, path),
            Frame::Ready {
                streams,
                block_size,
            } => {
                out.put_u16(*streams);
                out.put_u32(*block_size);
            }
            Frame::ListEntries { entries } => put_list_entries(out, entries),
            Frame::ListEnd => {}
            Frame::ProbeRequest {
                direction,
                streams,
                duration_ms,
                window,
            } => {
                out.put_u8(*direction as u8);
                out.put_u16(*streams);
                out.put_u32(*duration_ms);
                out.put_u32(*window);
            }
            Frame::ProbeResult {
                interval_ms,
                intervals,
                streams,
            } => put_probe_result(out, *interval_ms, intervals, streams),
            Frame::ProbeData { data } => {
                out.put_u32(wire_len(data.len(), "probe data"));
                out.put_slice(data);
            }
            // Encoded by `encode_payload`, which never sends them here.
            Frame::Block(_)
            | Frame::Dir { .. }
            | Frame::Symlink { .. }
            | Frame::Sent { .. }
            | Frame::Resend { .. }
            | Frame::Skipped { .. }
            | Frame::FileFailed { .. }
            | Frame::Complete(_)
            | Frame::Tuned(_)
            | Frame::Offer { .. }
            | Frame::EntryFailed { .. }
            | Frame::Decisions { .. }
            | Frame::GrantRequest { .. }
            | Frame::Granted { .. }
            | Frame::CopyRequest(_)
            | Frame::Paths { .. }
            | Frame::CopyProgress(_)
            | Frame::CopyDone { .. }
            | Frame::StripeRequest { .. }
            | Frame::Landed { .. }
            | Frame::RemoveRequest { .. }
            | Frame::Removed { .. }
            | Frame::CopyPaths { .. }
            | Frame::CatalogRequest(_)
            | Frame::CatalogAnswer(_)
            | Frame::TarData { .. }
            | Frame::FileDigest { .. }
            | Frame::StripeRead { .. }
            | Frame::Fetch { .. }
            | Frame::StripeGrantRequest { .. }
            | Frame::ReadGrantRequest { .. } => {}
        }
    }
}

impl Block {
    /// Appends the frame header and every field up to and including the data length, but not
    /// the data, so that a driver can write `data` straight from its own buffer (vectored
    /// write) instead of copying megabytes into `out`. The header already counts the data.
    ///
    /// An empty `file_digest` encodes as absent. Panics like [`Frame::encode`].
    pub fn encode_head(&self, out: &mut BytesMut) {
        encode_frame(out, FrameType::BLOCK, self.data.len(), |out| {
            put_block_head(out, self);
        });
    }
}

/// Writes a header for `ty`, then the payload written by `body`, then patches the header's length
/// to the body's length plus `tail`: bytes the caller will write after `out` (Block data).
/// Patching spares each frame type a second, hand-maintained size computation.
fn encode_frame(out: &mut BytesMut, ty: FrameType, tail: usize, body: impl FnOnce(&mut BytesMut)) {
    let start = out.len();
    FrameHeader { ty, len: 0 }.encode(out);
    body(out);
    let len = (out.len() - start - HEADER_LEN)
        .checked_add(tail)
        .and_then(|len| u32::try_from(len).ok())
        .expect("frame payload longer than u32::MAX bytes");
    out[start + 1..start + HEADER_LEN].copy_from_slice(&len.to_be_bytes());
}

fn put_block_head(out: &mut BytesMut, block: &Block) {
    let Block {
        file,
        offset,
        digest,
        file_digest,
        early,
        data,
    } = block;
    out.put_u64(file.id.0);
    put_str(out, &file.path);
    out.put_u64(file.size);
    out.put_u32(file.mode);
    out.put_i64(file.mtime_ns);
    out.put_u64(*offset);
    out.put_u128(*digest);
    let file_digest = file_digest.as_deref().unwrap_or_default();
    out.put_u8(wire_len(file_digest.len(), "file digest"));
    out.put_slice(file_digest);
    out.put_u8(if *early { BLOCK_EARLY } else { 0 });
    out.put_u32(wire_len(data.len(), "block data"));
}

fn put_hello(out: &mut BytesMut, version: u16, capabilities: Capabilities, role: &Role) {
    out.put_slice(&MAGIC);
    out.put_u16(version);
    out.put_u64(capabilities.0);
    match role {
        Role::Control {
            token,
            session,
            secret,
        } => {
            out.put_u8(ROLE_CONTROL);
            put_str(out, token);
            out.put_u64(session.0);
            out.put_slice(secret);
        }
        Role::Data {
            session,
            secret,
            stream,
        } => {
            out.put_u8(ROLE_DATA);
            out.put_u64(session.0);
            out.put_slice(secret);
            out.put_u16(*stream);
        }
    }
}

fn put_complete(out: &mut BytesMut, c: &CompleteSummary) {
    for n in [c.files, c.bytes, c.skipped, c.failed, c.bad_blocks] {
        out.put_u64(n);
    }
    put_load(out, &c.receiver);
}

fn put_decisions(out: &mut BytesMut, entries: &[FileDecision]) {
    out.put_u16(wire_len(entries.len(), "decisions"));
    for e in entries {
        out.put_u64(e.file.0);
        put_decision(out, &e.decision);
    }
}

fn put_list_entries(out: &mut BytesMut, entries: &[ListEntry]) {
    out.put_u16(wire_len(entries.len(), "list entries"));
    for entry in entries {
        put_str(out, &entry.name);
        out.put_u8(entry.kind as u8);
        out.put_u64(entry.size);
        out.put_u32(entry.mode);
        out.put_i64(entry.mtime_ns);
    }
}

fn put_tuned(out: &mut BytesMut, t: &TuneReport) {
    out.put_u16(t.streams);
    out.put_u16(t.start);
    out.put_u8(t.flags);
    put_load(out, &t.sender);
    out.put_u8(wire_len(t.steps.len(), "tune steps"));
    for step in &t.steps {
        out.put_u32(step.at_ms);
        out.put_u16(step.streams);
        out.put_u64(step.rate);
        out.put_u16(step.noise_permille);
        out.put_u8(step.verdict as u8);
    }
}

fn put_offer(out: &mut BytesMut, entries: &[OfferEntry]) {
    out.put_u16(wire_len(entries.len(), "offer entries"));
    for e in entries {
        out.put_u64(e.file.0);
        put_str(out, &e.path);
        out.put_u64(e.size);
        out.put_u32(e.mode);
        out.put_i64(e.mtime_ns);
    }
}

fn put_probe_result(
    out: &mut BytesMut,
    interval_ms: u16,
    intervals: &[u64],
    streams: &[ProbeStream],
) {
    out.put_u16(interval_ms);
    out.put_u16(wire_len(intervals.len(), "probe intervals"));
    for b in intervals {
        out.put_u64(*b);
    }
    out.put_u16(wire_len(streams.len(), "probe streams"));
    for s in streams {
        out.put_u64(s.bytes);
        out.put_u32(s.rtt_us);
        out.put_u32(s.min_rtt_us);
        out.put_u32(s.snd_cwnd);
        out.put_u32(s.snd_mss);
        out.put_u32(s.total_retrans);
    }
}

/// A landed block is a block: not empty, at most the largest block, and within a file's
/// possible size.
fn decode_landed(r: &mut Reader<'_>) -> Result<Frame, DecodeError> {
    let file = FileId(r.u64("file")?);
    let offset = r.u64("offset")?;
    let len = r.u32("len")?;
    if len == 0 || len > MAX_BLOCK_DATA {
        return Err(invalid("len", len));
    }
    if offset
        .checked_add(u64::from(len))
        .is_none_or(|e| e > i64::MAX as u64)
    {
        return Err(invalid("offset", offset));
    }
    let digest = r.u128("digest")?;
    let n = usize::from(r.u8("cvs")?);
    if n > MAX_LANDED_CVS {
        return Err(DecodeError::TooLong {
            field: "cvs",
            len: n,
            max: MAX_LANDED_CVS,
        });
    }
    let cvs = (0..n)
        .map(|_| r.array::<32>("cv"))
        .collect::<Result<_, _>>()?;
    Ok(Frame::Landed {
        file,
        offset,
        len,
        digest,
        cvs,
    })
}

/// A fetched block is a block: not empty, at most the largest block, within the file's size,
/// which is itself a possible one.
fn decode_fetch(r: &mut Reader<'_>) -> Result<Frame, DecodeError> {
    let file = FileId(r.u64("file")?);
    let path = r.str("path", MAX_PATH)?;
    let size = r.u64("size")?;
    if size > i64::MAX as u64 {
        return Err(invalid("size", size));
    }
    let mtime_ns = r.i64("mtime_ns")?;
    let offset = r.u64("offset")?;
    let len = r.u32("len")?;
    if len == 0 || len > MAX_BLOCK_DATA {
        return Err(invalid("len", len));
    }
    if offset.checked_add(u64::from(len)).is_none_or(|e| e > size) {
        return Err(invalid("offset", offset));
    }
    Ok(Frame::Fetch {
        file,
        path,
        size,
        mtime_ns,
        offset,
        len,
    })
}

/// A file digest is never empty: a block carries none by leaving it out.
fn decode_file_digest(r: &mut Reader<'_>) -> Result<Frame, DecodeError> {
    let file = FileId(r.u64("file")?);
    let digest = match usize::from(r.u8("digest_len")?) {
        0 => return Err(invalid("digest_len", 0u8)),
        len if len > MAX_DIGEST => {
            return Err(DecodeError::TooLong {
                field: "digest",
                len,
                max: MAX_DIGEST,
            })
        }
        len => r.bytes(len, "digest")?,
    };
    Ok(Frame::FileDigest { file, digest })
}

fn decode_sent(r: &mut Reader<'_>) -> Result<Frame, DecodeError> {
    Ok(Frame::Sent {
        files: r.u64("files")?,
        dirs: r.u64("dirs")?,
        symlinks: r.u64("symlinks")?,
        bytes: r.u64("bytes")?,
    })
}

fn decode_complete(r: &mut Reader<'_>) -> Result<CompleteSummary, DecodeError> {
    Ok(CompleteSummary {
        files: r.u64("files")?,
        bytes: r.u64("bytes")?,
        skipped: r.u64("skipped")?,
        failed: r.u64("failed")?,
        bad_blocks: r.u64("bad_blocks")?,
        receiver: decode_load(r)?,
    })
}

fn decode_probe_request(r: &mut Reader<'_>) -> Result<Frame, DecodeError> {
    Ok(Frame::ProbeRequest {
        direction: match r.u8("direction")? {
            0 => ProbeDirection::ClientToServer,
            1 => ProbeDirection::ServerToClient,
            other => return Err(invalid("direction", other)),
        },
        streams: decode_streams(r)?,
        duration_ms: r.u32("duration_ms")?,
        window: r.u32("window")?,
    })
}

fn put_opts(out: &mut BytesMut, opts: &TransferOpts) {
    out.put_u16(opts.streams);
    out.put_u32(opts.block_size);
    out.put_u8(opts.checksum as u8);
    out.put_u8(opts.existing as u8);
    out.put_u32(opts.tcp_window);
    out.put_u16(opts.auto_start);
    out.put_u16(opts.storage_threads);
}

fn put_load(out: &mut BytesMut, load: &Load) {
    out.put_u16(load.cpu_permille);
    out.put_u16(load.starved_permille);
    out.put_u16(load.blocked_permille);
    out.put_u16(load.threads);
}

fn decode_load(r: &mut Reader<'_>) -> Result<Load, DecodeError> {
    Ok(Load {
        cpu_permille: r.u16("cpu_permille")?,
        starved_permille: r.u16("starved_permille")?,
        blocked_permille: r.u16("blocked_permille")?,
        threads: r.u16("threads")?,
    })
}

fn decode_tuned(r: &mut Reader<'_>) -> Result<TuneReport, DecodeError> {
    let streams = r.u16("streams")?;
    let start = r.u16("start")?;
    let flags = r.u8("flags")?;
    if flags & !TuneReport::ALL != 0 {
        return Err(invalid("flags", flags));
    }
    let sender = decode_load(r)?;
    let n = usize::from(r.u8("tune steps")?);
    if n > MAX_TUNE_STEPS {
        return Err(DecodeError::TooLong {
            field: "tune steps",
            len: n,
            max: MAX_TUNE_STEPS,
        });
    }
    let mut steps = Vec::with_capacity(n);
    for _ in 0..n {
        steps.push(TuneStep {
            at_ms: r.u32("at_ms")?,
            streams: r.u16("streams")?,
            rate: r.u64("rate")?,
            noise_permille: r.u16("noise_permille")?,
            verdict: match r.u8("verdict")? {
                0 => TuneVerdict::Baseline,
                1 => TuneVerdict::Kept,
                2 => TuneVerdict::Rejected,
                3 => TuneVerdict::Drift,
                other => return Err(invalid("verdict", other)),
            },
        });
    }
    Ok(TuneReport {
        streams,
        start,
        flags,
        sender,
        steps,
    })
}

fn put_str(out: &mut BytesMut, s: &str) {
    out.put_u16(wire_len(s.len(), "string"));
    out.put_slice(s.as_bytes());
}

fn put_message(out: &mut BytesMut, message: &str) {
    let mut end = message.len().min(MAX_MESSAGE);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    put_str(out, message.get(..end).unwrap_or_default());
}

/// Converts a local length to its length prefix type; see the panics of [`Frame::encode`].
fn wire_len<T: TryFrom<usize>>(len: usize, what: &str) -> T {
    T::try_from(len)
        .unwrap_or_else(|_| panic!("{what} of length {len} does not fit its length prefix"))
}

fn decode_hello(r: &mut Reader<'_>) -> Result<Frame, DecodeError> {
    if r.array::<8>("magic")? != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let version = r.u16("version")?;
    let capabilities = Capabilities(r.u64("capabilities")?);
    let role = match r.u8("role")? {
        ROLE_CONTROL => Role::Control {
            token: r.str("token", MAX_TOKEN)?,
            session: SessionId(r.u64("session")?),
            secret: r.array("secret")?,
        },
        ROLE_DATA => Role::Data {
            session: SessionId(r.u64("session")?),
            secret: r.array("secret")?,
            stream: r.u16("stream")?,
        },
        other => return Err(invalid("role", other)),
    };
    Ok(Frame::Hello {
        version,
        capabilities,
        role,
    })
}

fn decode_opts(r: &mut Reader<'_>) -> Result<TransferOpts, DecodeError> {
    Ok(TransferOpts {
        streams: decode_streams(r)?,
        block_size: decode_block_size(r)?,
        checksum: match r.u8("checksum")? {
            1 => ChecksumAlgo::Blake3,
            2 => ChecksumAlgo::Xxh3,
            3 => ChecksumAlgo::Sha256,
            4 => ChecksumAlgo::Md5,
            other => return Err(invalid("checksum", other)),
        },
        existing: decode_existing(r)?,
        tcp_window: r.u32("tcp_window")?,
        auto_start: match r.u16("auto_start")? {
            n @ 0..=MAX_STREAMS => n,
            other => return Err(invalid("auto_start", other)),
        },
        storage_threads: match r.u16("storage_threads")? {
            n @ 0..=MAX_STORAGE_THREADS => n,
            other => return Err(invalid("storage_threads", other)),
        },
    })
}

/// Checked at decode time (not left to the session) so that no stream count or block size
/// outside the protocol's range ever reaches code that sizes buffers or spawns tasks from it.
fn decode_existing(r: &mut Reader<'_>) -> Result<ExistingPolicy, DecodeError> {
    match r.u8("existing")? {
        0 => Ok(ExistingPolicy::Fail),
        1 => Ok(ExistingPolicy::Overwrite),
        2 => Ok(ExistingPolicy::Skip),
        other => Err(invalid("existing", other)),
    }
}

fn decode_streams(r: &mut Reader<'_>) -> Result<u16, DecodeError> {
    match r.u16("streams")? {
        n @ 1..=MAX_STREAMS => Ok(n),
        other => Err(invalid("streams", other)),
    }
}

fn decode_block_size(r: &mut Reader<'_>) -> Result<u32, DecodeError> {
    match r.u32("block_size")? {
        n @ MIN_BLOCK_SIZE..=MAX_BLOCK_DATA => Ok(n),
        other => Err(invalid("block_size", other)),
    }
}

fn decode_list_entries(r: &mut Reader<'_>) -> Result<Frame, DecodeError> {
    let count = usize::from(r.u16("count")?);
    if count > MAX_LIST_ENTRIES {
        return Err(DecodeError::TooLong {
            field: "count",
            len: count,
            max: MAX_LIST_ENTRIES,
        });
    }
    let mut entries = Vec::with_capacity(count.min(r.remaining() / MIN_ENTRY_LEN));
    for _ in 0..count {
        entries.push(ListEntry {
            name: r.str("name", MAX_PATH)?,
            kind: match r.u8("kind")? {
                0 => EntryKind::File,
                1 => EntryKind::Dir,
                2 => EntryKind::Symlink,
                3 => EntryKind::Other,
                other => return Err(invalid("kind", other)),
            },
            size: r.u64("size")?,
            mode: r.u32("mode")?,
            mtime_ns: r.i64("mtime_ns")?,
        });
    }
    Ok(Frame::ListEntries { entries })
}

fn put_decision(out: &mut BytesMut, decision: &Decision) {
    match decision {
        Decision::Send => out.put_u8(0),
        Decision::Resume { have } => {
            out.put_u8(1);
            out.put_u16(wire_len(have.len(), "resume ranges"));
            for (start, end) in have {
                out.put_u64(*start);
                out.put_u64(*end);
            }
        }
        Decision::Complete { digest } => {
            out.put_u8(2);
            out.put_u8(wire_len(digest.len(), "digest"));
            out.put_slice(digest);
        }
        Decision::Skip => out.put_u8(3),
        Decision::Fail { code, message } => {
            out.put_u8(4);
            out.put_u16(code.0);
            put_message(out, message);
        }
    }
}

/// Reads an entry count and checks it against its bound before anything is allocated.
fn count(r: &mut Reader<'_>, field: &'static str, max: usize) -> Result<usize, DecodeError> {
    let n = usize::from(r.u16(field)?);
    if n > max {
        return Err(DecodeError::TooLong { field, len: n, max });
    }
    Ok(n)
}

/// Smallest encoded offer entry: id, empty path, size, mode, mtime.
const MIN_OFFER_LEN: usize = 8 + 2 + 8 + 4 + 8;

fn decode_offer(r: &mut Reader<'_>) -> Result<Frame, DecodeError> {
    let n = count(r, "count", MAX_OFFER_ENTRIES)?;
    let mut entries = Vec::with_capacity(n.min(r.remaining() / MIN_OFFER_LEN));
    for _ in 0..n {
        entries.push(OfferEntry {
            file: FileId(r.u64("file")?),
            path: r.str("path", MAX_PATH)?,
            size: r.u64("size")?,
            mode: r.u32("mode")?,
            mtime_ns: r.i64("mtime_ns")?,
        });
    }
    Ok(Frame::Offer { entries })
}

fn decode_decisions(r: &mut Reader<'_>) -> Result<Frame, DecodeError> {
    let n = count(r, "count", MAX_OFFER_ENTRIES)?;
    // Smallest entry: an id and a one-byte decision.
    let mut entries = Vec::with_capacity(n.min(r.remaining() / 9));
    for _ in 0..n {
        let file = FileId(r.u64("file")?);
        let decision = match r.u8("decision")? {
            0 => Decision::Send,
            1 => {
                let ranges = count(r, "ranges", MAX_RESUME_RANGES)?;
                let mut have = Vec::with_capacity(ranges.min(r.remaining() / 16));
                for _ in 0..ranges {
                    let (start, end) = (r.u64("range_start")?, r.u64("range_end")?);
                    if start >= end {
                        return Err(DecodeError::Inconsistent {
                            field: "range_end",
                            reason: "a range must not be empty or reversed",
                        });
                    }
                    have.push((start, end));
                }
                Decision::Resume { have }
            }
            2 => {
                let len = usize::from(r.u8("digest_len")?);
                if len == 0 || len > MAX_DIGEST {
                    return Err(invalid("digest_len", len as u64));
                }
                Decision::Complete {
                    digest: r.bytes(len, "digest")?,
                }
            }
            3 => Decision::Skip,
            4 => Decision::Fail {
                code: ErrorCode(r.u16("code")?),
                message: r.str("message", MAX_MESSAGE)?,
            },
            other => return Err(invalid("decision", other)),
        };
        entries.push(FileDecision { file, decision });
    }
    Ok(Frame::Decisions { entries })
}

fn decode_probe_result(r: &mut Reader<'_>) -> Result<Frame, DecodeError> {
    let interval_ms = match r.u16("interval_ms")? {
        0 => return Err(invalid("interval_ms", 0u16)),
        n => n,
    };
    let n = count(r, "intervals", MAX_PROBE_INTERVALS)?;
    let mut intervals = Vec::with_capacity(n.min(r.remaining() / 8));
    for _ in 0..n {
        intervals.push(r.u64("interval")?);
    }
    let n = count(r, "streams", usize::from(MAX_STREAMS))?;
    let mut streams = Vec::with_capacity(n.min(r.remaining() / 28));
    for _ in 0..n {
        streams.push(ProbeStream {
            bytes: r.u64("bytes")?,
            rtt_us: r.u32("rtt_us")?,
            min_rtt_us: r.u32("min_rtt_us")?,
            snd_cwnd: r.u32("snd_cwnd")?,
            snd_mss: r.u32("snd_mss")?,
            total_retrans: r.u32("total_retrans")?,
        });
    }
    Ok(Frame::ProbeResult {
        interval_ms,
        intervals,
        streams,
    })
}

fn decode_block(r: &mut Reader<'_>) -> Result<Block, DecodeError> {
    let file = FileMeta {
        id: FileId(r.u64("file")?),
        path: r.str("path", MAX_PATH)?,
        size: r.u64("size")?,
        mode: r.u32("mode")?,
        mtime_ns: r.i64("mtime_ns")?,
    };
    let offset = r.u64("offset")?;
    let digest = r.u128("digest")?;
    let file_digest = match usize::from(r.u8("file_digest_len")?) {
        0 => None,
        len if len > MAX_DIGEST => {
            return Err(DecodeError::TooLong {
                field: "file_digest",
                len,
                max: MAX_DIGEST,
            })
        }
        len => Some(r.bytes(len, "file_digest")?),
    };
    let flags = r.u8("flags")?;
    if flags & !BLOCK_EARLY != 0 {
        return Err(invalid("flags", flags));
    }
    let data_len = r.u32("data_len")?;
    if data_len > MAX_BLOCK_DATA {
        return Err(DecodeError::TooLong {
            field: "data",
            len: usize::try_from(data_len).unwrap_or(usize::MAX),
            max: usize::try_from(MAX_BLOCK_DATA).unwrap_or(usize::MAX),
        });
    }
    let data = r.bytes(usize::try_from(data_len).unwrap_or(usize::MAX), "data")?;

    // The receiver writes at `offset` into a file it preallocates to `size` and finalises the
    // file on the block carrying its digest; a block that contradicts either would make it
    // write past the end or verify a file that is still incomplete.
    let end = offset
        .checked_add(u64::from(data_len))
        .ok_or(DecodeError::Inconsistent {
            field: "offset",
            reason: "offset + data length overflows",
        })?;
    if end > file.size {
        return Err(DecodeError::Inconsistent {
            field: "data",
            reason: "block extends past the end of the file",
        });
    }
    if file_digest.is_some() && end != file.size {
        return Err(DecodeError::Inconsistent {
            field: "file_digest",
            reason: "present on a block that does not end the file",
        });
    }
    Ok(Block {
        file,
        offset,
        digest,
        file_digest,
        early: flags & BLOCK_EARLY != 0,
        data,
    })
}

fn invalid(field: &'static str, value: impl Into<u64>) -> DecodeError {
    DecodeError::InvalidValue {
        field,
        value: value.into(),
    }
}

/// Cursor over an untrusted payload. Reads fail with `Truncated` naming the field instead of
/// panicking, which is what lets `Frame::decode` promise it never panics.
struct Reader<'a> {
    buf: &'a Bytes,
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// Claims the next `n` bytes, or fails without moving if fewer are left.
    fn advance(&mut self, n: usize, field: &'static str) -> Result<Range<usize>, DecodeError> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.buf.len() => {
                let range = self.pos..end;
                self.pos = end;
                Ok(range)
            }
            _ => Err(DecodeError::Truncated { field }),
        }
    }

    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let range = self.advance(n, field)?;
        self.buf.get(range).ok_or(DecodeError::Truncated { field })
    }

    /// A zero-copy slice sharing the payload's allocation.
    fn bytes(&mut self, n: usize, field: &'static str) -> Result<Bytes, DecodeError> {
        // `advance` returned a range within `buf`, so `slice` cannot panic.
        Ok(self.buf.slice(self.advance(n, field)?))
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        self.take(N, field)?
            .try_into()
            .map_err(|_| DecodeError::Truncated { field })
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        self.array(field).map(u8::from_be_bytes)
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        self.array(field).map(u16::from_be_bytes)
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        self.array(field).map(u32::from_be_bytes)
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        self.array(field).map(u64::from_be_bytes)
    }

    fn i64(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        self.array(field).map(i64::from_be_bytes)
    }

    fn u128(&mut self, field: &'static str) -> Result<u128, DecodeError> {
        self.array(field).map(u128::from_be_bytes)
    }

    /// A u16-length-prefixed UTF-8 string. The limit is checked before the bytes are touched,
    /// so the allocation is bounded by `max` as well as by the payload.
    fn str(&mut self, field: &'static str, max: usize) -> Result<String, DecodeError> {
        let len = usize::from(self.u16(field)?);
        if len > max {
            return Err(DecodeError::TooLong { field, len, max });
        }
        let bytes = self.take(len, field)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| DecodeError::InvalidUtf8 { field })
    }

    fn finish(self, ty: FrameType) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(DecodeError::TrailingBytes {
                frame: ty.name(),
                extra,
            }),
        }
    }
}
