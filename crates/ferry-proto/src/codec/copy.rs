//! The frames of a third-party copy (the grant a destination mints, the request a source
//! takes, and what the source reports back to the client) and of several paths (`Paths`).

use bytes::{BufMut, BytesMut};

use super::{
    count, decode_complete, decode_opts, invalid, put_complete, put_opts, put_str, Reader,
};
use crate::error::DecodeError;
use crate::frame::{
    CompleteSummary, CopyProgress, CopyRequest, CopyStripe, Frame, MAX_ADDR, MAX_COPY_PATHS,
    MAX_COPY_STRIPES, MAX_PATH, MAX_PATHS, MAX_REPORT, MAX_TOKEN,
};

pub(super) fn put_copy_request(out: &mut BytesMut, c: &CopyRequest) {
    put_str(out, &c.src);
    put_str(out, &c.dest);
    put_str(out, &c.peer);
    out.put_slice(&c.fingerprint);
    put_str(out, &c.grant);
    put_opts(out, &c.opts);
    let flags = u8::from(c.only)
        | if c.stripes.is_empty() { 0 } else { STRIPED }
        | if c.pull { PULLED } else { 0 };
    if flags != 0 {
        out.put_u8(flags);
    }
    if !c.stripes.is_empty() {
        out.put_u16(super::wire_len(c.stripes.len(), "copy stripes"));
        for s in &c.stripes {
            put_str(out, &s.addr);
            out.put_slice(&s.fingerprint);
            put_str(out, &s.grant);
        }
    }
}

/// A `CopyRequest`'s trailing flags: bit 0 `only`, bit 1 stripe hosts follow, bit 2 `pull`.
const ONLY: u8 = 1;
const STRIPED: u8 = 2;
const PULLED: u8 = 4;

pub(super) fn decode_copy_request(r: &mut Reader<'_>) -> Result<Frame, DecodeError> {
    let src = r.str("src", MAX_PATH)?;
    let dest = r.str("dest", MAX_PATH)?;
    let peer = r.str("peer", MAX_ADDR)?;
    let fingerprint = r.array("fingerprint")?;
    let grant = r.str("grant", MAX_TOKEN)?;
    let opts = decode_opts(r)?;
    // One trailing flags byte, absent from a plain copy's request (the layout older servers
    // know); any other byte is left for `finish` to refuse as trailing.
    let flags = match r.buf.get(r.pos) {
        Some(&f) if f != 0 && f & !(ONLY | STRIPED | PULLED) == 0 => r.u8("flags")?,
        _ => 0,
    };
    let mut stripes = Vec::new();
    if flags & STRIPED != 0 {
        let n = count(r, "stripes", MAX_COPY_STRIPES)?;
        if n == 0 {
            return Err(invalid("stripes", 0u8));
        }
        for _ in 0..n {
            stripes.push(CopyStripe {
                addr: r.str("stripe addr", MAX_ADDR)?,
                fingerprint: r.array("stripe fingerprint")?,
                grant: r.str("stripe grant", MAX_TOKEN)?,
            });
        }
    }
    Ok(Frame::CopyRequest(Box::new(CopyRequest {
        src,
        dest,
        peer,
        fingerprint,
        grant,
        opts,
        only: flags & ONLY != 0,
        stripes,
        pull: flags & PULLED != 0,
    })))
}

/// Smallest encoded path (an empty one): bounds the capacity reserved by what the payload can
/// hold, whatever count it claims.
const MIN_PATH_LEN: usize = 2;

pub(super) fn put_copy_paths(out: &mut BytesMut, paths: &[String], more: bool) {
    out.put_u8(u8::from(more));
    out.put_u16(super::wire_len(paths.len(), "copy paths"));
    for p in paths {
        put_str(out, p);
    }
}

pub(super) fn decode_copy_paths(r: &mut Reader<'_>) -> Result<Frame, DecodeError> {
    let more = match r.u8("more")? {
        0 => false,
        1 => true,
        other => return Err(invalid("more", other)),
    };
    let n = count(r, "count", MAX_COPY_PATHS)?;
    let mut paths = Vec::with_capacity(n.min(r.remaining() / MIN_PATH_LEN));
    for _ in 0..n {
        paths.push(r.str("path", MAX_PATH)?);
    }
    Ok(Frame::CopyPaths { paths, more })
}

pub(super) fn put_copy_progress(out: &mut BytesMut, p: &CopyProgress) {
    out.put_u64(p.found_files);
    out.put_u64(p.found_bytes);
    out.put_u8(u8::from(p.walk_done));
    out.put_u64(p.files);
    out.put_u64(p.bytes);
}

pub(super) fn decode_copy_progress(r: &mut Reader<'_>) -> Result<Frame, DecodeError> {
    let found_files = r.u64("found_files")?;
    let found_bytes = r.u64("found_bytes")?;
    let walk_done = match r.u8("walk_done")? {
        0 => false,
        1 => true,
        other => return Err(invalid("walk_done", other)),
    };
    Ok(Frame::CopyProgress(CopyProgress {
        found_files,
        found_bytes,
        walk_done,
        files: r.u64("files")?,
        bytes: r.u64("bytes")?,
    }))
}

pub(super) fn put_copy_done(out: &mut BytesMut, summary: &CompleteSummary, report: &str) {
    put_complete(out, summary);
    put_long_str(out, report);
}

pub(super) fn decode_copy_done(r: &mut Reader<'_>) -> Result<Frame, DecodeError> {
    let summary = decode_complete(r)?;
    let len = r.u32("report_len")?;
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    if len > MAX_REPORT {
        return Err(DecodeError::TooLong {
            field: "report",
            len,
            max: MAX_REPORT,
        });
    }
    let bytes = r.take(len, "report")?;
    let report = std::str::from_utf8(bytes)
        .map_err(|_| DecodeError::InvalidUtf8 { field: "report" })?
        .to_owned();
    Ok(Frame::CopyDone { summary, report })
}

/// A string with a `u32` length: a report may be longer than a `str`'s 64 KiB.
fn put_long_str(out: &mut BytesMut, s: &str) {
    out.put_u32(super::wire_len(s.len(), "report"));
    out.put_slice(s.as_bytes());
}

pub(super) fn put_granted(out: &mut BytesMut, grant: &str, ttl_ms: u32) {
    put_str(out, grant);
    out.put_u32(ttl_ms);
}

pub(super) fn decode_granted(r: &mut Reader<'_>) -> Result<Frame, DecodeError> {
    Ok(Frame::Granted {
        grant: r.str("grant", MAX_TOKEN)?,
        ttl_ms: r.u32("ttl_ms")?,
    })
}

pub(super) fn put_paths(out: &mut BytesMut, addrs: &[String]) {
    out.put_u16(super::wire_len(addrs.len(), "paths"));
    for a in addrs {
        put_str(out, a);
    }
}

pub(super) fn decode_paths(r: &mut Reader<'_>) -> Result<Frame, DecodeError> {
    let n = count(r, "count", MAX_PATHS)?;
    let mut addrs = Vec::with_capacity(n);
    for _ in 0..n {
        addrs.push(r.str("addr", MAX_ADDR)?);
    }
    Ok(Frame::Paths { addrs })
}
