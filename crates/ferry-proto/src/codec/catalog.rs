//! The catalog's frames: a user's request (`CatalogRequest`, an op byte then its fields) and
//! the server's answer (`CatalogAnswer`, a tag byte then its fields). Every count and string
//! is bounded before anything is allocated for it.

use bytes::{BufMut, BytesMut};

use super::{count, invalid, put_str, wire_len, Reader};
use crate::catalog::{
    CatalogAnswer, CatalogObject, CatalogReplica, CatalogRequest, CatalogStat, Compare,
    FindCondition, FindRequest, MetaEntry, Problem, ReplicaHealth, VerifyCounts, VerifyReport,
    MAX_ADDRESS, MAX_ALGO, MAX_FIND_CONDITIONS, MAX_FIND_LIMIT, MAX_FOUND_ENTRIES, MAX_META_ATTR,
    MAX_META_ENTRIES, MAX_META_UNIT, MAX_META_VALUE, MAX_PHYSICAL, MAX_POLICY_NOTE, MAX_REPLICAS,
    MAX_SERVER_NAME, MAX_TAR_PATHS, MAX_VERIFY_PROBLEMS,
};
use crate::catalog::{CatalogPolicy, PolicyOwed};
use crate::error::DecodeError;
use crate::frame::{Frame, MAX_DIGEST, MAX_PATH};

const OP_STAT: u8 = 1;
const OP_REMOVE: u8 = 2;
const OP_RENAME: u8 = 3;
const OP_MKDIR: u8 = 4;
const OP_META_SET: u8 = 5;
const OP_META_RM: u8 = 6;
const OP_META_LS: u8 = 7;
const OP_FIND: u8 = 8;
const OP_VERIFY: u8 = 9;
const OP_TAR: u8 = 10;
const OP_REPLICATED: u8 = 11;
const OP_LOCATE: u8 = 12;
/// `Replicated` with the other server's address.
const OP_REPLICATED_AT: u8 = 13;
/// `Replicated` with the copy's own path there (and an address, empty when unknown).
const OP_REPLICATED_PATH: u8 = 14;

const ANSWER_DONE: u8 = 1;
const ANSWER_STAT: u8 = 2;
const ANSWER_META: u8 = 3;
const ANSWER_FOUND: u8 = 4;
const ANSWER_VERIFIED: u8 = 5;
/// A stat whose replicas carry addresses (only when one has one: the encoding is canonical).
const ANSWER_STAT_AT: u8 = 6;
/// A stat whose replicas carry addresses and paths of their own (only when one has a path).
const ANSWER_STAT_PATH: u8 = 7;

/// A find's optional parts, present when their bit is set.
const FIND_NAME: u8 = 1;
const FIND_NEWER: u8 = 2;
const FIND_LARGER: u8 = 4;
const FIND_ALL: u8 = FIND_NAME | FIND_NEWER | FIND_LARGER;

const FOUND_LAST: u8 = 1;
const FOUND_MORE: u8 = 2;

/// Smallest encoded entry of each list: bound the capacity reserved by what the payload can
/// hold, whatever count it claims.
const MIN_META_LEN: usize = 2 + 2 + 2;
const MIN_REPLICA_LEN: usize = 2 + 2 + 1;
const MIN_OBJECT_LEN: usize = 2 + 8 + 8 + 1 + 2 + 2 + 8;
const MIN_CONDITION_LEN: usize = 1 + 2 + 2;
const MIN_PROBLEM_LEN: usize = 1 + 2;

pub(super) fn put_request(out: &mut BytesMut, req: &CatalogRequest) {
    match req {
        CatalogRequest::Stat { path } => {
            out.put_u8(OP_STAT);
            put_str(out, path);
        }
        CatalogRequest::Locate { path } => {
            out.put_u8(OP_LOCATE);
            put_str(out, path);
        }
        CatalogRequest::Remove { path, recursive } => {
            out.put_u8(OP_REMOVE);
            out.put_u8(u8::from(*recursive));
            put_str(out, path);
        }
        CatalogRequest::Rename { from, to } => {
            out.put_u8(OP_RENAME);
            put_str(out, from);
            put_str(out, to);
        }
        CatalogRequest::Mkdir { path, parents } => {
            out.put_u8(OP_MKDIR);
            out.put_u8(u8::from(*parents));
            put_str(out, path);
        }
        CatalogRequest::MetaSet { path, entry } => {
            out.put_u8(OP_META_SET);
            put_str(out, path);
            put_meta(out, entry);
        }
        CatalogRequest::MetaRm { path, attr, value } => {
            out.put_u8(OP_META_RM);
            put_str(out, path);
            put_str(out, attr);
            out.put_u8(u8::from(value.is_some()));
            if let Some(v) = value {
                put_str(out, v);
            }
        }
        CatalogRequest::MetaLs { path } => {
            out.put_u8(OP_META_LS);
            put_str(out, path);
        }
        CatalogRequest::Find(f) => {
            out.put_u8(OP_FIND);
            put_find(out, f);
        }
        CatalogRequest::Verify { path, recursive } => {
            out.put_u8(OP_VERIFY);
            out.put_u8(u8::from(*recursive));
            put_str(out, path);
        }
        CatalogRequest::Tar { path, paths } => {
            out.put_u8(OP_TAR);
            put_str(out, path);
            out.put_u16(wire_len(paths.len(), "tar paths"));
            for p in paths {
                put_str(out, p);
            }
        }
        CatalogRequest::Replicated {
            path,
            recursive,
            server,
            physical,
            address,
            at,
        } => {
            out.put_u8(match (at.is_empty(), address.is_empty()) {
                (false, _) => OP_REPLICATED_PATH,
                (true, true) => OP_REPLICATED,
                (true, false) => OP_REPLICATED_AT,
            });
            out.put_u8(u8::from(*recursive));
            put_str(out, path);
            put_str(out, server);
            put_str(out, physical);
            if !address.is_empty() || !at.is_empty() {
                put_str(out, address);
            }
            if !at.is_empty() {
                put_str(out, at);
            }
        }
    }
}

fn put_find(out: &mut BytesMut, f: &FindRequest) {
    put_str(out, &f.under);
    out.put_u32(f.limit);
    out.put_u16(wire_len(f.conditions.len(), "find conditions"));
    for c in &f.conditions {
        out.put_u8(c.compare as u8);
        put_str(out, &c.attr);
        put_str(out, &c.value);
    }
    let mut has = 0;
    has |= if f.name.is_some() { FIND_NAME } else { 0 };
    has |= if f.newer_ns.is_some() { FIND_NEWER } else { 0 };
    has |= if f.larger.is_some() { FIND_LARGER } else { 0 };
    out.put_u8(has);
    if let Some(n) = &f.name {
        put_str(out, n);
    }
    if let Some(t) = f.newer_ns {
        out.put_i64(t);
    }
    if let Some(n) = f.larger {
        out.put_u64(n);
    }
}

fn put_meta(out: &mut BytesMut, m: &MetaEntry) {
    put_str(out, &m.attr);
    put_str(out, &m.value);
    put_str(out, &m.unit);
}

fn flag(r: &mut Reader<'_>, field: &'static str) -> Result<bool, DecodeError> {
    match r.u8(field)? {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(invalid(field, other)),
    }
}

pub(super) fn decode_request(r: &mut Reader<'_>) -> Result<Frame, DecodeError> {
    let req = match r.u8("op")? {
        OP_STAT => CatalogRequest::Stat {
            path: r.str("path", MAX_PATH)?,
        },
        OP_REMOVE => CatalogRequest::Remove {
            recursive: flag(r, "recursive")?,
            path: r.str("path", MAX_PATH)?,
        },
        OP_RENAME => CatalogRequest::Rename {
            from: r.str("from", MAX_PATH)?,
            to: r.str("to", MAX_PATH)?,
        },
        OP_MKDIR => CatalogRequest::Mkdir {
            parents: flag(r, "parents")?,
            path: r.str("path", MAX_PATH)?,
        },
        OP_META_SET => CatalogRequest::MetaSet {
            path: r.str("path", MAX_PATH)?,
            entry: decode_meta(r)?,
        },
        OP_META_RM => CatalogRequest::MetaRm {
            path: r.str("path", MAX_PATH)?,
            attr: r.str("attr", MAX_META_ATTR)?,
            value: match flag(r, "has_value")? {
                true => Some(r.str("value", MAX_META_VALUE)?),
                false => None,
            },
        },
        OP_META_LS => CatalogRequest::MetaLs {
            path: r.str("path", MAX_PATH)?,
        },
        OP_FIND => CatalogRequest::Find(Box::new(decode_find(r)?)),
        OP_VERIFY => CatalogRequest::Verify {
            recursive: flag(r, "recursive")?,
            path: r.str("path", MAX_PATH)?,
        },
        OP_TAR => {
            let path = r.str("path", MAX_PATH)?;
            let n = count(r, "paths", MAX_TAR_PATHS)?;
            // Each path is at least its 2-byte length.
            let mut paths = Vec::with_capacity(n.min(r.remaining() / 2));
            for _ in 0..n {
                paths.push(r.str("paths", MAX_PATH)?);
            }
            CatalogRequest::Tar { path, paths }
        }
        op @ (OP_REPLICATED | OP_REPLICATED_AT | OP_REPLICATED_PATH) => {
            CatalogRequest::Replicated {
                recursive: flag(r, "recursive")?,
                path: r.str("path", MAX_PATH)?,
                server: r.str("server", MAX_SERVER_NAME)?,
                physical: r.str("physical", MAX_PHYSICAL)?,
                address: match op {
                    OP_REPLICATED => String::new(),
                    OP_REPLICATED_PATH => r.str("address", MAX_ADDRESS)?,
                    // Op 11 says "no address": an empty one here would be a second encoding.
                    _ => match r.str("address", MAX_ADDRESS)? {
                        a if a.is_empty() => return Err(invalid("address", 0u8)),
                        a => a,
                    },
                },
                at: match op {
                    // Likewise ops 11 and 13 say "at `path`".
                    OP_REPLICATED_PATH => match r.str("at", MAX_PATH)? {
                        a if a.is_empty() => return Err(invalid("at", 0u8)),
                        a => a,
                    },
                    _ => String::new(),
                },
            }
        }
        OP_LOCATE => CatalogRequest::Locate {
            path: r.str("path", MAX_PATH)?,
        },
        other => return Err(invalid("op", other)),
    };
    Ok(Frame::CatalogRequest(req))
}

fn decode_find(r: &mut Reader<'_>) -> Result<FindRequest, DecodeError> {
    let under = r.str("under", MAX_PATH)?;
    let limit = r.u32("limit")?;
    if limit == 0 || limit > MAX_FIND_LIMIT {
        return Err(invalid("limit", limit));
    }
    let n = count(r, "conditions", MAX_FIND_CONDITIONS)?;
    let mut conditions = Vec::with_capacity(n.min(r.remaining() / MIN_CONDITION_LEN));
    for _ in 0..n {
        let compare = match r.u8("compare")? {
            0 => Compare::Eq,
            1 => Compare::Gt,
            2 => Compare::Lt,
            other => return Err(invalid("compare", other)),
        };
        conditions.push(FindCondition {
            compare,
            attr: r.str("attr", MAX_META_ATTR)?,
            value: r.str("value", MAX_META_VALUE)?,
        });
    }
    let has = r.u8("has")?;
    if has & !FIND_ALL != 0 {
        return Err(invalid("has", has));
    }
    let name = match has & FIND_NAME {
        0 => None,
        _ => Some(r.str("name", MAX_PATH)?),
    };
    let newer_ns = match has & FIND_NEWER {
        0 => None,
        _ => Some(r.i64("newer")?),
    };
    let larger = match has & FIND_LARGER {
        0 => None,
        _ => Some(r.u64("larger")?),
    };
    Ok(FindRequest {
        under,
        conditions,
        name,
        newer_ns,
        larger,
        limit,
    })
}

fn decode_meta(r: &mut Reader<'_>) -> Result<MetaEntry, DecodeError> {
    Ok(MetaEntry {
        attr: r.str("attr", MAX_META_ATTR)?,
        value: r.str("value", MAX_META_VALUE)?,
        unit: r.str("unit", MAX_META_UNIT)?,
    })
}

pub(super) fn put_answer(out: &mut BytesMut, answer: &CatalogAnswer) {
    match answer {
        CatalogAnswer::Done { entries, objects } => {
            out.put_u8(ANSWER_DONE);
            out.put_u64(*entries);
            out.put_u64(*objects);
        }
        CatalogAnswer::Stat(s) => {
            let paths = s.replicas.iter().any(|r| !r.path.is_empty());
            let at = paths || s.replicas.iter().any(|r| !r.address.is_empty());
            out.put_u8(match (paths, at) {
                (true, _) => ANSWER_STAT_PATH,
                (false, true) => ANSWER_STAT_AT,
                (false, false) => ANSWER_STAT,
            });
            put_object(out, &s.object);
            out.put_u16(wire_len(s.replicas.len(), "replicas"));
            for rep in &s.replicas {
                put_str(out, &rep.server);
                put_str(out, &rep.physical);
                out.put_u8(rep.state as u8);
                if at {
                    put_str(out, &rep.address);
                }
                if paths {
                    put_str(out, &rep.path);
                }
            }
            put_metas(out, &s.metadata);
            if let Some(p) = &s.policy {
                put_policy(out, p);
            }
        }
        CatalogAnswer::Meta { entries } => {
            out.put_u8(ANSWER_META);
            put_metas(out, entries);
        }
        CatalogAnswer::Found {
            objects,
            last,
            more,
        } => {
            out.put_u8(ANSWER_FOUND);
            out.put_u8(found_flags(*last, *more));
            out.put_u16(wire_len(objects.len(), "found objects"));
            for o in objects {
                put_object(out, o);
            }
        }
        CatalogAnswer::Verified(v) => {
            out.put_u8(ANSWER_VERIFIED);
            out.put_u8(found_flags(v.last, v.more));
            let c = &v.counts;
            for n in [c.checked, c.good, c.bad, c.missing, c.unregistered, c.bytes] {
                out.put_u64(n);
            }
            out.put_u16(wire_len(v.problems.len(), "problems"));
            for (problem, path) in &v.problems {
                out.put_u8(*problem as u8);
                put_str(out, path);
            }
        }
    }
}

fn found_flags(last: bool, more: bool) -> u8 {
    let flags = if last { FOUND_LAST } else { 0 };
    flags | if more { FOUND_MORE } else { 0 }
}

/// Reads the flags of a `Found` or `Verified` frame: `more` speaks of the whole answer, so
/// only its last frame says it.
fn decode_flags(r: &mut Reader<'_>) -> Result<(bool, bool), DecodeError> {
    let flags = r.u8("flags")?;
    if flags & !(FOUND_LAST | FOUND_MORE) != 0 || flags == FOUND_MORE {
        return Err(invalid("flags", flags));
    }
    Ok((flags & FOUND_LAST != 0, flags & FOUND_MORE != 0))
}

fn decode_verified(r: &mut Reader<'_>) -> Result<VerifyReport, DecodeError> {
    let (last, more) = decode_flags(r)?;
    let counts = VerifyCounts {
        checked: r.u64("checked")?,
        good: r.u64("good")?,
        bad: r.u64("bad")?,
        missing: r.u64("missing")?,
        unregistered: r.u64("unregistered")?,
        bytes: r.u64("bytes")?,
    };
    let n = count(r, "problems", MAX_VERIFY_PROBLEMS)?;
    let mut problems = Vec::with_capacity(n.min(r.remaining() / MIN_PROBLEM_LEN));
    for _ in 0..n {
        let problem = match r.u8("problem")? {
            0 => Problem::Bad,
            1 => Problem::Missing,
            2 => Problem::Unregistered,
            other => return Err(invalid("problem", other)),
        };
        problems.push((problem, r.str("path", MAX_PATH)?));
    }
    Ok(VerifyReport {
        counts,
        problems,
        last,
        more,
    })
}

fn put_metas(out: &mut BytesMut, entries: &[MetaEntry]) {
    out.put_u16(wire_len(entries.len(), "metadata"));
    for m in entries {
        put_meta(out, m);
    }
}

fn put_object(out: &mut BytesMut, o: &CatalogObject) {
    put_str(out, &o.path);
    out.put_u64(o.size);
    out.put_i64(o.mtime_ns);
    out.put_u8(wire_len(o.digest.len(), "digest"));
    out.put_slice(&o.digest);
    put_str(out, &o.algo);
    put_str(out, &o.stored_by);
    out.put_i64(o.stored_at);
}

pub(super) fn decode_answer(r: &mut Reader<'_>) -> Result<Frame, DecodeError> {
    let answer = match r.u8("tag")? {
        ANSWER_DONE => CatalogAnswer::Done {
            entries: r.u64("entries")?,
            objects: r.u64("objects")?,
        },
        tag @ (ANSWER_STAT | ANSWER_STAT_AT | ANSWER_STAT_PATH) => {
            let paths = tag == ANSWER_STAT_PATH;
            let at = paths || tag == ANSWER_STAT_AT;
            let object = decode_object(r)?;
            let n = count(r, "replicas", MAX_REPLICAS)?;
            let mut replicas = Vec::with_capacity(n.min(r.remaining() / MIN_REPLICA_LEN));
            for _ in 0..n {
                replicas.push(CatalogReplica {
                    server: r.str("server", MAX_SERVER_NAME)?,
                    physical: r.str("physical", MAX_PHYSICAL)?,
                    state: match r.u8("state")? {
                        0 => ReplicaHealth::Good,
                        1 => ReplicaHealth::Stale,
                        2 => ReplicaHealth::Bad,
                        other => return Err(invalid("state", other)),
                    },
                    address: match at {
                        true => r.str("address", MAX_ADDRESS)?,
                        false => String::new(),
                    },
                    path: match paths {
                        true => r.str("replica path", MAX_PATH)?,
                        false => String::new(),
                    },
                });
            }
            // Addresses are sent only when one is known, paths only when one is a replica's
            // own: none would be another tag's encoding.
            if paths && replicas.iter().all(|r| r.path.is_empty()) {
                return Err(invalid("tag", tag));
            }
            if tag == ANSWER_STAT_AT && replicas.iter().all(|r| r.address.is_empty()) {
                return Err(invalid("tag", tag));
            }
            let metadata = decode_metas(r)?;
            // Trailing and optional: only a client that offered CATALOG_POLICY is sent it.
            let policy = match r.remaining() {
                0 => None,
                _ => Some(decode_policy(r)?),
            };
            CatalogAnswer::Stat(Box::new(CatalogStat {
                object,
                replicas,
                metadata,
                policy,
            }))
        }
        ANSWER_META => CatalogAnswer::Meta {
            entries: decode_metas(r)?,
        },
        ANSWER_FOUND => {
            let (last, more) = decode_flags(r)?;
            let n = count(r, "count", MAX_FOUND_ENTRIES)?;
            let mut objects = Vec::with_capacity(n.min(r.remaining() / MIN_OBJECT_LEN));
            for _ in 0..n {
                objects.push(decode_object(r)?);
            }
            CatalogAnswer::Found {
                objects,
                last,
                more,
            }
        }
        ANSWER_VERIFIED => CatalogAnswer::Verified(Box::new(decode_verified(r)?)),
        other => return Err(invalid("tag", other)),
    };
    Ok(Frame::CatalogAnswer(answer))
}

/// A stat's policy: a tag 1 (the only one: an absent policy is no bytes at all), then its
/// fields, then a flag for what it owes.
fn put_policy(out: &mut BytesMut, p: &CatalogPolicy) {
    out.put_u8(1);
    put_str(out, &p.prefix);
    out.put_u32(p.replicas);
    out.put_u64(p.retain_s);
    put_str(out, &p.checksum);
    match &p.owed {
        None => out.put_u8(0),
        Some(o) => {
            out.put_u8(1);
            out.put_u32(o.tries);
            out.put_u64(o.next_in_ms);
            put_str(out, &o.note);
        }
    }
}

fn decode_policy(r: &mut Reader<'_>) -> Result<CatalogPolicy, DecodeError> {
    match r.u8("policy")? {
        1 => {}
        other => return Err(invalid("policy", other)),
    }
    let prefix = r.str("policy prefix", MAX_PATH)?;
    let replicas = r.u32("replicas wanted")?;
    let retain_s = r.u64("retain")?;
    let checksum = r.str("policy checksum", MAX_ALGO)?;
    let owed = match r.u8("owed")? {
        0 => None,
        1 => Some(PolicyOwed {
            tries: r.u32("tries")?,
            next_in_ms: r.u64("next try")?,
            note: r.str("owed note", MAX_POLICY_NOTE)?,
        }),
        other => return Err(invalid("owed", other)),
    };
    Ok(CatalogPolicy {
        prefix,
        replicas,
        retain_s,
        checksum,
        owed,
    })
}

fn decode_metas(r: &mut Reader<'_>) -> Result<Vec<MetaEntry>, DecodeError> {
    let n = count(r, "metadata", MAX_META_ENTRIES)?;
    let mut out = Vec::with_capacity(n.min(r.remaining() / MIN_META_LEN));
    for _ in 0..n {
        out.push(decode_meta(r)?);
    }
    Ok(out)
}

fn decode_object(r: &mut Reader<'_>) -> Result<CatalogObject, DecodeError> {
    let path = r.str("path", MAX_PATH)?;
    let size = r.u64("size")?;
    let mtime_ns = r.i64("mtime")?;
    let len = usize::from(r.u8("digest_len")?);
    if len > MAX_DIGEST {
        return Err(DecodeError::TooLong {
            field: "digest",
            len,
            max: MAX_DIGEST,
        });
    }
    Ok(CatalogObject {
        path,
        size,
        mtime_ns,
        digest: r.take(len, "digest")?.to_vec(),
        algo: r.str("algo", MAX_ALGO)?,
        stored_by: r.str("stored_by", MAX_SERVER_NAME)?,
        stored_at: r.i64("stored_at")?,
    })
}
