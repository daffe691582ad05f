//! A `CatalogRequest` (`ferry stat`, `rm`, `mv`, `mkdir`, `meta`, `find`, `verify`): checked
//! against the token's scopes (reads, verify included, need its read scope on the path,
//! changes its write scope), the path resolved like any other request's, then answered with
//! one `CatalogAnswer` (a find's and a verify's in several; the audit itself is in `verify`).
//! The catalog's work and the file system's run off the runtime's threads.
//!
//! Files and catalog stay in step: a removal is durable before its rows go, and a rename that
//! the catalog refuses is renamed back. A server without a catalog (`--catalog none`) still
//! removes, renames and makes directories, and refuses stat, meta, find and verify.

use std::sync::{Arc, Mutex};

use ferry_catalog::{Avu, Catalog, CatalogError, Condition, Query};
use ferry_core::path::{join, split_parent};
use ferry_core::root::Kind;
use ferry_core::FsError;
use ferry_proto::{
    Capabilities, CatalogAnswer, CatalogObject, CatalogPolicy, CatalogReplica, CatalogRequest,
    CatalogStat, Compare, ErrorCode, FindRequest, Frame, MetaEntry, PolicyOwed, ReplicaHealth,
    MAX_FOUND_ENTRIES, MAX_META_ENTRIES, MAX_POLICY_NOTE, MAX_REPLICAS,
};

use super::access::{self, denied, Grant};
use super::files::{self, Removed, Stopped};
use super::state::ServerState;
use crate::error::SessionError;
use crate::transport::conn::send;
use crate::transport::stream::Stream;

/// Serves one request; returns the file-system entries it changed (for the session's log).
pub(super) async fn serve(
    shared: &ServerState,
    stream: &mut Stream,
    grant: &Grant,
    request: CatalogRequest,
    caps: Capabilities,
) -> Result<u64, SessionError> {
    // A third-party grant may put one tree, nothing else.
    if grant.pinned_dest().is_some() {
        return Err(denied(grant, request.name(), "anything"));
    }
    let catalog = shared.config.catalog.clone();
    // Addresses only to a client that asked for them: an older one reads tag 2 alone; a
    // replica's own path only to one that reads tag 7.
    let addresses = matches!(request, CatalogRequest::Locate { .. });
    let paths = caps.has(Capabilities::REPLICA_PATH);
    let answer = match request {
        CatalogRequest::Stat { path } | CatalogRequest::Locate { path } => {
            let rel = readable(shared, grant, &path)?;
            let catalog = needed(catalog)?;
            // Only a client that reads it is told the policy (an older one would refuse it).
            let policy = match caps.has(Capabilities::CATALOG_POLICY) {
                true => shared.config.policies.for_path(&rel).cloned(),
                false => None,
            };
            let owes = policy.as_ref().is_some_and(|p| p.replicas > 1);
            let stat = blocking(move || {
                let stat = catalog.stat(&rel)?;
                let owed = match owes && stat.is_some() {
                    true => catalog.owed(&rel)?,
                    false => None,
                };
                Ok::<_, CatalogError>((stat, owed))
            })
            .await?;
            match stat.map_err(|e| refused(e, &path))? {
                (Some(s), owed) => {
                    let mut stat = stat_of(s, addresses, paths);
                    stat.policy = policy.map(|p| policy_of(&p, owed));
                    CatalogAnswer::Stat(Box::new(stat))
                }
                (None, _) => return Err(not_registered(&path)),
            }
        }
        CatalogRequest::MetaLs { path } => {
            let rel = readable(shared, grant, &path)?;
            let catalog = needed(catalog)?;
            let entries = blocking(move || catalog.meta_ls(&rel))
                .await?
                .map_err(|e| refused(e, &path))?;
            CatalogAnswer::Meta {
                entries: entries.into_iter().map(entry_of).collect(),
            }
        }
        CatalogRequest::MetaSet { path, entry } => {
            let (rel, _) = writable(shared, grant, &path)?;
            let catalog = needed(catalog)?;
            blocking(move || meta_set(&catalog, &rel, &path, entry)).await??;
            done(0, 1)
        }
        CatalogRequest::MetaRm { path, attr, value } => {
            let (rel, _) = writable(shared, grant, &path)?;
            let catalog = needed(catalog)?;
            let n = blocking(move || catalog.meta_rm(&rel, &attr, value.as_deref()))
                .await?
                .map_err(|e| refused(e, &path))?;
            done(0, n)
        }
        CatalogRequest::Find(find) => {
            let rel = readable(shared, grant, &find.under)?;
            let catalog = needed(catalog)?;
            return answer_find(stream, catalog, rel, *find).await;
        }
        CatalogRequest::Verify { path, recursive } => {
            let rel = readable(shared, grant, &path)?;
            let prefix = grant.read_scope(&rel).unwrap_or_default().to_owned();
            let catalog = needed(catalog)?;
            return super::verify::serve(shared, stream, catalog, (rel, prefix), recursive).await;
        }
        CatalogRequest::Tar { path, paths } => {
            let rel = readable(shared, grant, &path)?;
            let prefix = grant.read_scope(&rel).unwrap_or_default().to_owned();
            let asked = (path, paths);
            return super::bundle::serve(shared, stream, catalog, (rel, prefix), asked).await;
        }
        CatalogRequest::Replicated {
            path,
            recursive,
            server,
            physical,
            address,
            at,
        } => {
            // A record of a copy elsewhere, made by the client's `repl` with what it may read
            // here: it never touches this server's own replicas or files (SECURITY.md). The
            // other server's address is kept only once a replica of it was recorded.
            let rel = readable(shared, grant, &path)?;
            let catalog = needed(catalog)?;
            let n = blocking(move || {
                let at = Some(at.as_str()).filter(|a| !a.is_empty());
                let n = catalog.record_replicas(&rel, recursive, &server, &physical, at)?;
                if n > 0 && !address.is_empty() {
                    catalog.note_address(&server, &address)?;
                }
                Ok::<_, CatalogError>(n)
            })
            .await?
            .map_err(|e| refused(e, &path))?;
            done(0, n)
        }
        CatalogRequest::Remove { path, recursive } => {
            remove(shared, grant, catalog, &path, recursive).await?
        }
        CatalogRequest::Rename { from, to } => rename(shared, grant, catalog, &from, &to).await?,
        CatalogRequest::Mkdir { path, parents } => {
            let (rel, prefix) = writable(shared, grant, &path)?;
            let inner = access::inside(&rel, &prefix).to_owned();
            let made = match shared.root.scope(&prefix, true) {
                Ok(scope) => blocking(move || files::mkdir(&scope, &inner, parents)).await?,
                Err(e) => Err(e),
            };
            made.map_err(|e| fs_refused("mkdir", &path, e))?;
            done(1, 0)
        }
    };
    let entries = match &answer {
        CatalogAnswer::Done { entries, .. } => *entries,
        _ => 0,
    };
    send(stream, &Frame::CatalogAnswer(answer)).await?;
    Ok(entries)
}

/// Adds a metadata entry, keeping each object within [`MAX_META_ENTRIES`]: the count and the
/// insert are one step for every session of this server.
fn meta_set(catalog: &Catalog, rel: &str, raw: &str, entry: MetaEntry) -> Result<(), SessionError> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let avu = Avu {
        attr: entry.attr,
        value: entry.value,
        unit: entry.unit,
    };
    let have = catalog.meta_ls(rel).map_err(|e| refused(e, raw))?;
    let replaces = have
        .iter()
        .any(|a| a.attr == avu.attr && a.value == avu.value);
    if !replaces && have.len() >= MAX_META_ENTRIES {
        return Err(SessionError::Remote {
            code: ErrorCode::BAD_REQUEST,
            message: format!(
                "`{raw}` has {} metadata entries, at most {MAX_META_ENTRIES} an object",
                have.len()
            ),
        });
    }
    catalog.meta_set(rel, &avu).map_err(|e| refused(e, raw))
}

/// Answers a find from the catalog (never the file system): at most `limit` objects in frames
/// of [`MAX_FOUND_ENTRIES`], the last saying whether more matched.
async fn answer_find(
    stream: &mut Stream,
    catalog: Arc<Catalog>,
    under: String,
    find: FindRequest,
) -> Result<u64, SessionError> {
    let limit = find.limit as usize;
    let mut conditions = Vec::with_capacity(find.conditions.len());
    for c in find.conditions {
        let number = || {
            c.value
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|n| n.is_finite())
                .ok_or_else(|| SessionError::Remote {
                    code: ErrorCode::BAD_REQUEST,
                    message: format!(
                        "find: `{}` compares with a number, and {:?} is not one",
                        c.attr, c.value
                    ),
                })
        };
        conditions.push(match c.compare {
            Compare::Eq => Condition::Eq {
                attr: c.attr.clone(),
                value: c.value.clone(),
            },
            Compare::Gt => Condition::Gt {
                n: number()?,
                attr: c.attr.clone(),
            },
            Compare::Lt => Condition::Lt {
                n: number()?,
                attr: c.attr.clone(),
            },
        });
    }
    let query = Query {
        under: Some(under),
        conditions,
        name: find.name,
        newer_ns: find.newer_ns,
        larger: find.larger,
        // One past the limit: whether more match.
        limit: limit + 1,
    };
    let mut found = blocking(move || catalog.find(&query))
        .await?
        .map_err(|e| refused(e, "find"))?;
    let more = found.len() > limit;
    found.truncate(limit);
    let objects: Vec<CatalogObject> = found.into_iter().map(object_of).collect();
    let chunks: Vec<&[CatalogObject]> = objects.chunks(MAX_FOUND_ENTRIES).collect();
    let last_chunk = chunks.len().saturating_sub(1);
    for i in 0..chunks.len().max(1) {
        let part = chunks.get(i).map_or(Vec::new(), |c| c.to_vec());
        let last = i == last_chunk;
        let answer = CatalogAnswer::Found {
            objects: part,
            last,
            more: last && more,
        };
        send(stream, &Frame::CatalogAnswer(answer)).await?;
    }
    Ok(0)
}

/// `rm`: the file (or tree) removed durably first, then its catalog rows; rows of files a
/// failed removal did take are dropped too, so that the catalog never names a file that is
/// gone because of it.
async fn remove(
    shared: &ServerState,
    grant: &Grant,
    catalog: Option<Arc<Catalog>>,
    raw: &str,
    recursive: bool,
) -> Result<CatalogAnswer, SessionError> {
    let (rel, prefix) = writable(shared, grant, raw)?;
    let inner = access::inside(&rel, &prefix).to_owned();
    if inner.is_empty() {
        return Err(SessionError::Remote {
            code: ErrorCode::BAD_REQUEST,
            message: format!("rm `{raw}`: the top of a write scope (or the root) is never removed"),
        });
    }
    retained(shared, catalog.as_ref(), &rel, recursive, "rm", raw).await?;
    let scope = match shared.root.scope(&prefix, false) {
        Ok(s) => Some(s),
        Err(e) if e.is_not_found() => None,
        Err(e) => return Err(fs_refused("rm", raw, e)),
    };
    let raw_owned = raw.to_owned();
    blocking(move || {
        let removed = match &scope {
            Some(scope) => files::remove(scope, &inner, recursive),
            None => Ok(Removed::Gone),
        };
        let forget = |files: &[String]| -> Result<u64, CatalogError> {
            let Some(catalog) = &catalog else {
                return Ok(0);
            };
            let mut n = 0;
            for f in files {
                n += u64::from(catalog.remove(&join(&prefix, f))?);
            }
            Ok(n)
        };
        let (entries, objects) = match removed {
            Ok(Removed::Gone) | Ok(Removed::One) => {
                let entries = u64::from(matches!(removed, Ok(Removed::One)));
                let objects = match &catalog {
                    Some(c) if recursive => c.remove_prefix(&rel),
                    Some(c) => c.remove(&rel).map(u64::from),
                    None => Ok(0),
                };
                let objects = objects.map_err(|e| refused(e, &raw_owned))?;
                if entries == 0 && objects == 0 {
                    return Err(fs_refused("rm", &raw_owned, not_found(&inner)));
                }
                (entries, objects)
            }
            Ok(Removed::Tree { entries, .. }) => {
                let objects = match &catalog {
                    Some(c) => c.remove_prefix(&rel),
                    None => Ok(0),
                };
                (entries, objects.map_err(|e| refused(e, &raw_owned))?)
            }
            Err(Stopped { error, files }) => {
                let forgot = forget(&files);
                let mut e = fs_refused("rm", &raw_owned, error);
                if let (SessionError::Remote { message, .. }, Err(c)) = (&mut e, forgot) {
                    message.push_str(&format!(
                        "; and the catalog could not forget what was removed: {c}"
                    ));
                }
                return Err(e);
            }
        };
        Ok(done(entries, objects))
    })
    .await?
}

/// `mv` within this server: the file (or tree) renamed first, then its catalog rows; when the
/// catalog refuses, the rename is undone. Into an existing directory, as `mv` does.
async fn rename(
    shared: &ServerState,
    grant: &Grant,
    catalog: Option<Arc<Catalog>>,
    raw_from: &str,
    raw_to: &str,
) -> Result<CatalogAnswer, SessionError> {
    let (from, from_prefix) = writable(shared, grant, raw_from)?;
    let (mut to, to_prefix) = writable(shared, grant, raw_to)?;
    let refuse = |why: &str| SessionError::Remote {
        code: ErrorCode::BAD_REQUEST,
        message: format!("mv `{raw_from}` `{raw_to}`: {why}"),
    };
    if access::inside(&from, &from_prefix).is_empty() {
        return Err(refuse(
            "the top of a write scope (or the root) is never moved",
        ));
    }
    let src = shared
        .root
        .scope(&from_prefix, false)
        .map_err(|e| fs_refused("mv", raw_from, e))?;
    let dest = shared
        .root
        .scope(&to_prefix, false)
        .map_err(|e| fs_refused("mv", raw_to, e))?;
    let from_inner = access::inside(&from, &from_prefix).to_owned();
    src.lstat(&from_inner)
        .map_err(|e| fs_refused("mv", raw_from, e))?;
    // Onto an existing directory: into it, under the same name.
    let to_inner = access::inside(&to, &to_prefix).to_owned();
    if matches!(dest.lstat(&to_inner), Ok(m) if m.kind == Kind::Dir) {
        to = join(&to, split_parent(&from).1);
    }
    let to_inner = access::inside(&to, &to_prefix).to_owned();
    if to_inner.is_empty() {
        return Err(refuse(
            "the top of a write scope (or the root) is never replaced",
        ));
    }
    if to == from || to.starts_with(&format!("{from}/")) {
        return Err(refuse("a directory cannot move into itself"));
    }
    // Renamed away is as gone from its path as removed: a retention policy refuses both.
    retained(shared, catalog.as_ref(), &from, true, "mv", raw_from).await?;
    let (raw_from, raw_to) = (raw_from.to_owned(), raw_to.to_owned());
    blocking(move || {
        files::rename(&src, &from_inner, &dest, &to_inner)
            .map_err(|e| fs_refused("mv", &raw_from, e))?;
        let Some(catalog) = catalog else {
            return Ok(done(1, 0));
        };
        match catalog.rename(&from, &to) {
            Ok(n) => Ok(done(1, n)),
            // Nothing registered there: a file the catalog never knew moves alone.
            Err(CatalogError::NotFound(_)) => Ok(done(1, 0)),
            Err(e) => {
                let mut err = refused(e, &raw_to);
                let back = files::rename(&dest, &to_inner, &src, &from_inner);
                if let SessionError::Remote { message, .. } = &mut err {
                    message.insert_str(0, &format!("mv `{raw_from}` `{raw_to}`: "));
                    match back {
                        Ok(()) => message.push_str(" (the file was moved back)"),
                        Err(b) => message.push_str(&format!(
                            "; moving the file back failed too, it is at `{raw_to}`: {b}"
                        )),
                    }
                }
                Err(err)
            }
        }
    })
    .await?
}

/// Refuses `op` on `rel` (with `tree`, its tree) while a retention policy keeps an object
/// there (`policy::retention_refusal`); a server without a catalog has no retention to keep.
pub(super) async fn retained(
    shared: &ServerState,
    catalog: Option<&Arc<Catalog>>,
    rel: &str,
    tree: bool,
    op: &str,
    raw: &str,
) -> Result<(), SessionError> {
    let policies = shared.config.policies.clone();
    let Some(catalog) = catalog.filter(|_| !policies.is_empty()).cloned() else {
        return Ok(());
    };
    let r = rel.to_owned();
    let now = super::replicate::now_ns();
    let why =
        blocking(move || super::policy::retention_refusal(&policies, &catalog, &r, tree, now))
            .await?
            .map_err(|e| refused(e, raw))?;
    match why {
        None => Ok(()),
        Some(why) => Err(SessionError::Remote {
            code: ErrorCode::DENIED,
            message: format!("{op} `{raw}`: {why}"),
        }),
    }
}

/// The path under the root and the read scope that grants it.
fn readable(shared: &ServerState, grant: &Grant, raw: &str) -> Result<String, SessionError> {
    let rel = shared.resolve(raw)?;
    match grant.read_scope(&rel) {
        Some(_) => Ok(rel),
        None => Err(denied(grant, "read", raw)),
    }
}

/// The path under the root and the write scope that grants it.
fn writable(
    shared: &ServerState,
    grant: &Grant,
    raw: &str,
) -> Result<(String, String), SessionError> {
    let rel = shared.resolve(raw)?;
    match grant.write_scope(&rel) {
        Some(prefix) => {
            let prefix = prefix.to_owned();
            Ok((rel, prefix))
        }
        None => Err(denied(grant, "change", raw)),
    }
}

fn needed(catalog: Option<Arc<Catalog>>) -> Result<Arc<Catalog>, SessionError> {
    catalog.ok_or_else(|| SessionError::Remote {
        code: ErrorCode::BAD_REQUEST,
        message: "this server keeps no catalog (it runs with --catalog none): stat, meta, \
                  find and verify need one"
            .into(),
    })
}

/// Runs catalog or file-system work on the blocking pool; the outer error is the pool's.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, SessionError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| SessionError::Remote {
            code: ErrorCode::INTERNAL,
            message: format!("catalog operation stopped: {e}"),
        })
}

fn done(entries: u64, objects: u64) -> CatalogAnswer {
    CatalogAnswer::Done { entries, objects }
}

fn not_registered(raw: &str) -> SessionError {
    SessionError::Remote {
        code: ErrorCode::NOT_FOUND,
        message: format!("`{raw}` is not in the catalog"),
    }
}

fn not_found(rel: &str) -> FsError {
    FsError::io(rel, std::io::Error::from(std::io::ErrorKind::NotFound))
}

/// A catalog error as the client reads it: what it asked that the catalog refuses, or that
/// the catalog failed.
fn refused(e: CatalogError, raw: &str) -> SessionError {
    let code = match &e {
        CatalogError::NotFound(_) => ErrorCode::NOT_FOUND,
        CatalogError::Exists(_) => ErrorCode::EXISTS,
        CatalogError::TooLong { .. }
        | CatalogError::Empty(_)
        | CatalogError::BadCondition(..)
        | CatalogError::BadPath(..)
        | CatalogError::Shared => ErrorCode::BAD_REQUEST,
        _ => ErrorCode::IO,
    };
    let message = match e {
        CatalogError::NotFound(_) => format!("`{raw}` is not in the catalog"),
        CatalogError::Exists(p) => {
            format!("`{p}` is in the catalog already (with no file there, `ferry rm` it first)")
        }
        other => format!("`{raw}`: {other}"),
    };
    SessionError::Remote { code, message }
}

/// A file-system error, named by the path as the client wrote it.
fn fs_refused(op: &str, raw: &str, e: FsError) -> SessionError {
    let cause = match &e {
        FsError::Io { cause, .. } => cause.to_string(),
        FsError::Escapes { .. } => "refused: resolves outside the scope".to_owned(),
        FsError::Path(p) => p.to_string(),
        FsError::Archive(a) => a.to_string(),
    };
    SessionError::Remote {
        code: e.code(),
        message: format!("{op} `{raw}`: {cause}"),
    }
}

fn object_of(o: ferry_catalog::Object) -> CatalogObject {
    CatalogObject {
        path: o.path,
        size: o.size,
        mtime_ns: o.mtime_ns,
        digest: o.digest,
        algo: o.algo,
        stored_by: o.stored_by,
        stored_at: o.stored_at,
    }
}

fn entry_of(a: Avu) -> MetaEntry {
    MetaEntry {
        attr: a.attr,
        value: a.value,
        unit: a.unit,
    }
}

/// The catalog's stat on the wire; each replica's address only when `addresses` (a `Locate`),
/// its own path only when `paths` (a client that reads them).
fn stat_of(s: ferry_catalog::Stat, addresses: bool, paths: bool) -> CatalogStat {
    CatalogStat {
        object: object_of(s.object),
        replicas: s
            .replicas
            .into_iter()
            .take(MAX_REPLICAS)
            .map(|r| CatalogReplica {
                server: r.server,
                physical: r.physical,
                state: match r.state {
                    ferry_catalog::ReplicaState::Good => ReplicaHealth::Good,
                    ferry_catalog::ReplicaState::Stale => ReplicaHealth::Stale,
                    ferry_catalog::ReplicaState::Bad => ReplicaHealth::Bad,
                },
                address: match addresses {
                    true => r.address,
                    false => String::new(),
                },
                path: match paths {
                    true => r.path.unwrap_or_default(),
                    false => String::new(),
                },
            })
            .collect(),
        metadata: s
            .metadata
            .into_iter()
            .take(MAX_META_ENTRIES)
            .map(entry_of)
            .collect(),
        policy: None,
    }
}

/// A policy as `stat` shows it, with what it still owes for the object.
fn policy_of(p: &super::policy::Policy, owed: Option<ferry_catalog::Owed>) -> CatalogPolicy {
    let now = super::replicate::now_ns();
    CatalogPolicy {
        prefix: p.prefix.clone(),
        replicas: p.replicas,
        retain_s: p.retain.map_or(0, |d| d.as_secs()),
        checksum: p
            .checksum
            .map(|a| ferry_core::digest::algo_name(a).to_owned())
            .unwrap_or_default(),
        owed: owed.map(|o| PolicyOwed {
            tries: o.tries,
            next_in_ms: u64::try_from(o.next_at.saturating_sub(now) / 1_000_000).unwrap_or(0),
            note: cut(&o.note, MAX_POLICY_NOTE).to_owned(),
        }),
    }
}

/// `s` within `max` bytes, cut on a character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The wire's metadata bounds are the catalog's.
#[cfg(test)]
#[test]
fn bounds_agree() {
    assert_eq!(ferry_proto::MAX_META_ATTR, ferry_catalog::MAX_ATTR);
    assert_eq!(ferry_proto::MAX_META_VALUE, ferry_catalog::MAX_VALUE);
    assert_eq!(ferry_proto::MAX_META_UNIT, ferry_catalog::MAX_UNIT);
    assert_eq!(ferry_proto::MAX_PATH, ferry_catalog::MAX_PATH);
}
