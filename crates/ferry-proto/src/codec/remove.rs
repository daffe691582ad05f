//! The frames of a server-side removal (a sync's `--delete`): the paths asked for, and what
//! became of them.

use bytes::{BufMut, BytesMut};

use super::{count, invalid, put_message, put_str, wire_len, Reader};
use crate::error::DecodeError;
use crate::frame::{ErrorCode, Frame, RemoveFailure, MAX_MESSAGE, MAX_PATH, MAX_REMOVE_PATHS};

/// Smallest encoded path (an empty one) and failure (empty message): bound the capacity
/// reserved by what the payload can hold, whatever count it claims.
const MIN_PATH_LEN: usize = 2;
const MIN_FAILURE_LEN: usize = 2 + 2 + 2;

pub(super) fn put_remove_request(out: &mut BytesMut, paths: &[String], more: bool) {
    out.put_u8(u8::from(more));
    out.put_u16(wire_len(paths.len(), "remove paths"));
    for p in paths {
        put_str(out, p);
    }
}

pub(super) fn decode_remove_request(r: &mut Reader<'_>) -> Result<Frame, DecodeError> {
    let more = match r.u8("more")? {
        0 => false,
        1 => true,
        other => return Err(invalid("more", other)),
    };
    let n = count(r, "count", MAX_REMOVE_PATHS)?;
    let mut paths = Vec::with_capacity(n.min(r.remaining() / MIN_PATH_LEN));
    for _ in 0..n {
        paths.push(r.str("path", MAX_PATH)?);
    }
    Ok(Frame::RemoveRequest { paths, more })
}

pub(super) fn put_removed(out: &mut BytesMut, removed: u16, failures: &[RemoveFailure]) {
    out.put_u16(removed);
    out.put_u16(wire_len(failures.len(), "remove failures"));
    for f in failures {
        out.put_u16(f.index);
        out.put_u16(f.code.0);
        put_message(out, &f.message);
    }
}

pub(super) fn decode_removed(r: &mut Reader<'_>) -> Result<Frame, DecodeError> {
    let removed = r.u16("removed")?;
    if usize::from(removed) > MAX_REMOVE_PATHS {
        return Err(invalid("removed", removed));
    }
    let n = count(r, "count", MAX_REMOVE_PATHS)?;
    let mut failures = Vec::with_capacity(n.min(r.remaining() / MIN_FAILURE_LEN));
    for _ in 0..n {
        let index = r.u16("index")?;
        if usize::from(index) >= MAX_REMOVE_PATHS {
            return Err(invalid("index", index));
        }
        failures.push(RemoveFailure {
            index,
            code: ErrorCode(r.u16("code")?),
            message: r.str("message", MAX_MESSAGE)?,
        });
    }
    Ok(Frame::Removed { removed, failures })
}
