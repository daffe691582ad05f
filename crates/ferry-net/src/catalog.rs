//! The client's side of the catalog operations (`ferry stat`, `rm`, `mv`, `mkdir`, `meta`,
//! `find`, `verify`): one control connection per request, answered by the server from its
//! catalog under the token's scopes.

use ferry_core::Reporter;
use ferry_proto::{
    CatalogAnswer, CatalogObject, CatalogRequest, CatalogStat, ErrorCode, FindRequest, Frame,
    MetaEntry, Problem, VerifyCounts, MAX_CONTROL_PAYLOAD, MAX_TAR_PATHS, MAX_VERIFY_LISTED,
};

use crate::client::{connect, ClientConfig};
use crate::conn::{expect_frame, send};
use crate::error::SessionError;

/// What a change did: file-system entries removed, moved or made, and catalog entries
/// (objects, or metadata entries) changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Changed {
    pub entries: u64,
    pub objects: u64,
}

/// A find's answer: the objects in path order, and whether more matched than the limit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Found {
    pub objects: Vec<CatalogObject>,
    pub more: bool,
}

/// Everything the server's catalog knows of `path`.
pub async fn stat(
    cfg: &ClientConfig,
    path: &str,
    reporter: &dyn Reporter,
) -> Result<CatalogStat, SessionError> {
    let request = CatalogRequest::Stat {
        path: path.to_owned(),
    };
    match ask(cfg, request, reporter).await? {
        CatalogAnswer::Stat(s) => Ok(*s),
        other => Err(unexpected(&other)),
    }
}

/// [`stat`] with each replica's server address (`Locate`, op 12), for a client choosing where
/// to fetch from. A server older than op 12 refuses it as a protocol error: its `stat` then,
/// whose replicas carry no address.
pub async fn locate(
    cfg: &ClientConfig,
    path: &str,
    reporter: &dyn Reporter,
) -> Result<CatalogStat, SessionError> {
    let request = CatalogRequest::Locate {
        path: path.to_owned(),
    };
    match ask(cfg, request, reporter).await {
        Ok(CatalogAnswer::Stat(s)) => Ok(*s),
        Ok(other) => Err(unexpected(&other)),
        Err(SessionError::Remote { code, .. }) if code == ErrorCode::PROTOCOL => {
            stat(cfg, path, reporter).await
        }
        Err(e) => Err(e),
    }
}

/// Removes a file or symlink (with `recursive`, a tree) and forgets it in the catalog.
pub async fn remove(
    cfg: &ClientConfig,
    path: &str,
    recursive: bool,
    reporter: &dyn Reporter,
) -> Result<Changed, SessionError> {
    let request = CatalogRequest::Remove {
        path: path.to_owned(),
        recursive,
    };
    changed(ask(cfg, request, reporter).await?)
}

/// Renames `from` to `to` on one server (into `to` when it is a directory), and the catalog's
/// entries with it.
pub async fn rename(
    cfg: &ClientConfig,
    from: &str,
    to: &str,
    reporter: &dyn Reporter,
) -> Result<Changed, SessionError> {
    let request = CatalogRequest::Rename {
        from: from.to_owned(),
        to: to.to_owned(),
    };
    changed(ask(cfg, request, reporter).await?)
}

/// Makes a directory (with `parents`, its missing parents too).
pub async fn mkdir(
    cfg: &ClientConfig,
    path: &str,
    parents: bool,
    reporter: &dyn Reporter,
) -> Result<Changed, SessionError> {
    let request = CatalogRequest::Mkdir {
        path: path.to_owned(),
        parents,
    };
    changed(ask(cfg, request, reporter).await?)
}

/// Adds a metadata entry to a registered object.
pub async fn meta_set(
    cfg: &ClientConfig,
    path: &str,
    entry: MetaEntry,
    reporter: &dyn Reporter,
) -> Result<Changed, SessionError> {
    let request = CatalogRequest::MetaSet {
        path: path.to_owned(),
        entry,
    };
    changed(ask(cfg, request, reporter).await?)
}

/// Removes an attribute of an object (only the entry of `value` when given).
pub async fn meta_rm(
    cfg: &ClientConfig,
    path: &str,
    attr: &str,
    value: Option<&str>,
    reporter: &dyn Reporter,
) -> Result<Changed, SessionError> {
    let request = CatalogRequest::MetaRm {
        path: path.to_owned(),
        attr: attr.to_owned(),
        value: value.map(str::to_owned),
    };
    changed(ask(cfg, request, reporter).await?)
}

/// An object's metadata, by attribute then value.
pub async fn meta_ls(
    cfg: &ClientConfig,
    path: &str,
    reporter: &dyn Reporter,
) -> Result<Vec<MetaEntry>, SessionError> {
    let request = CatalogRequest::MetaLs {
        path: path.to_owned(),
    };
    match ask(cfg, request, reporter).await? {
        CatalogAnswer::Meta { entries } => Ok(entries),
        other => Err(unexpected(&other)),
    }
}

/// Records in the server's catalog that `server` (another server's catalog name) holds a good
/// copy of each object at `path` (with `recursive`, under it too) that this server holds good,
/// at `physical` followed by the rest of the object's path, reachable at `address` (empty:
/// unknown): what `repl` leaves in a source's catalog that does not see the destination's.
pub async fn replicated(
    cfg: &ClientConfig,
    path: &str,
    recursive: bool,
    (server, physical, address): (&str, &str, &str),
    reporter: &dyn Reporter,
) -> Result<Changed, SessionError> {
    let request = CatalogRequest::Replicated {
        path: path.to_owned(),
        recursive,
        server: server.to_owned(),
        physical: physical.to_owned(),
        address: address.to_owned(),
    };
    changed(ask(cfg, request, reporter).await?)
}

/// The objects `find` matches, at most its limit, answered from the server's catalog.
pub async fn find(
    cfg: &ClientConfig,
    find: FindRequest,
    reporter: &dyn Reporter,
) -> Result<Found, SessionError> {
    let limit = find.limit as usize;
    let mut c = connect(cfg, reporter).await?;
    send(
        &mut c.control,
        &Frame::CatalogRequest(CatalogRequest::Find(Box::new(find))),
    )
    .await?;
    let mut found = Found::default();
    loop {
        match answer(&mut c.control).await? {
            CatalogAnswer::Found {
                objects,
                last,
                more,
            } => {
                found.objects.extend(objects);
                if found.objects.len() > limit {
                    return Err(SessionError::Protocol(format!(
                        "the server answered a find with more than its limit of {limit}"
                    )));
                }
                if last {
                    found.more = more;
                    return Ok(found);
                }
            }
            other => return Err(unexpected(&other)),
        }
    }
}

/// A verify's answer: its counts, and the problem paths (at most [`MAX_VERIFY_LISTED`]; `more`
/// when some were counted and not listed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verified {
    pub counts: VerifyCounts,
    pub problems: Vec<(Problem, String)>,
    pub more: bool,
}

impl Verified {
    /// Whether everything checked was good (and, when the tree was walked, nothing was there
    /// that the catalog does not know).
    pub fn clean(&self) -> bool {
        let c = &self.counts;
        c.bad == 0 && c.missing == 0 && c.unregistered == 0
    }
}

/// Has the server re-read and re-hash every object it holds at or under `path` and compare
/// them with the catalog (with `recursive`, also report files it does not know). A long
/// audit's progress frames keep the connection alive: each is awaited for `idle_timeout`.
pub async fn verify(
    cfg: &ClientConfig,
    path: &str,
    recursive: bool,
    reporter: &dyn Reporter,
) -> Result<Verified, SessionError> {
    let request = CatalogRequest::Verify {
        path: path.to_owned(),
        recursive,
    };
    let mut c = connect(cfg, reporter).await?;
    send(&mut c.control, &Frame::CatalogRequest(request)).await?;
    let mut out = Verified::default();
    loop {
        let next = tokio::time::timeout(cfg.idle_timeout, answer(&mut c.control))
            .await
            .map_err(|_| SessionError::Timeout("waiting for the verify's progress"))??;
        let CatalogAnswer::Verified(report) = next else {
            return Err(unexpected(&next));
        };
        out.problems.extend(report.problems);
        if out.problems.len() > MAX_VERIFY_LISTED {
            return Err(SessionError::Protocol(format!(
                "the server listed more than {MAX_VERIFY_LISTED} problems in a verify"
            )));
        }
        out.counts = report.counts;
        if report.last {
            out.more = report.more;
            return Ok(out);
        }
    }
}

/// Streams the tree at `path` (only `paths` below it, when any) as a tar into `out`, as the
/// server writes it: each member's bytes checked there against its registered digest. A
/// member that fails the check ends it with the server's error naming the member; what `out`
/// has then is a truncated archive (no end-of-archive blocks). Returns the bytes written.
pub async fn get_tar<W>(
    cfg: &ClientConfig,
    path: &str,
    paths: Vec<String>,
    out: &mut W,
    reporter: &dyn Reporter,
) -> Result<u64, SessionError>
where
    W: tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncWriteExt;
    if paths.len() > MAX_TAR_PATHS {
        return Err(SessionError::Protocol(format!(
            "get --tar names at most {MAX_TAR_PATHS} paths; name their parent instead"
        )));
    }
    let request = CatalogRequest::Tar {
        path: path.to_owned(),
        paths,
    };
    let mut c = connect(cfg, reporter).await?;
    send(&mut c.control, &Frame::CatalogRequest(request)).await?;
    let mut written = 0u64;
    loop {
        let next = expect_frame(&mut c.control, MAX_CONTROL_PAYLOAD, "control");
        let frame = tokio::time::timeout(cfg.idle_timeout, next)
            .await
            .map_err(|_| SessionError::Timeout("waiting for the tar's next bytes"))??;
        let Frame::TarData { data, last } = frame else {
            return Err(SessionError::Protocol(format!(
                "unexpected {:?} in a tar stream",
                frame.frame_type()
            )));
        };
        out.write_all(&data).await.map_err(SessionError::Io)?;
        written += data.len() as u64;
        if last {
            out.flush().await.map_err(SessionError::Io)?;
            return Ok(written);
        }
    }
}

/// Sends one request on a new control connection and reads its one answer.
async fn ask(
    cfg: &ClientConfig,
    request: CatalogRequest,
    reporter: &dyn Reporter,
) -> Result<CatalogAnswer, SessionError> {
    let mut c = connect(cfg, reporter).await?;
    send(&mut c.control, &Frame::CatalogRequest(request)).await?;
    answer(&mut c.control).await
}

async fn answer(control: &mut crate::stream::Stream) -> Result<CatalogAnswer, SessionError> {
    match expect_frame(control, MAX_CONTROL_PAYLOAD, "control").await? {
        Frame::CatalogAnswer(a) => Ok(a),
        other => Err(SessionError::Protocol(format!(
            "unexpected {:?} answering a catalog request",
            other.frame_type()
        ))),
    }
}

fn changed(answer: CatalogAnswer) -> Result<Changed, SessionError> {
    match answer {
        CatalogAnswer::Done { entries, objects } => Ok(Changed { entries, objects }),
        other => Err(unexpected(&other)),
    }
}

fn unexpected(answer: &CatalogAnswer) -> SessionError {
    let kind = match answer {
        CatalogAnswer::Done { .. } => "done",
        CatalogAnswer::Stat(_) => "stat",
        CatalogAnswer::Meta { .. } => "meta",
        CatalogAnswer::Found { .. } => "found",
        CatalogAnswer::Verified(_) => "verified",
    };
    SessionError::Protocol(format!(
        "unexpected `{kind}` answer to this catalog request"
    ))
}
