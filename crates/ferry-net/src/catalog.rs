//! The client's side of the catalog operations (`ferry stat`, `rm`, `mv`, `mkdir`, `meta`,
//! `find`, `verify`): answered by the server from its catalog under the token's scopes. Several
//! requests share one control connection where the server keeps catalog sessions
//! ([`CatalogSession`]); a verify and a tar stream take a connection each.

use ferry_core::Reporter;
use ferry_proto::{
    Capabilities, CatalogAnswer, CatalogObject, CatalogRequest, CatalogStat, ErrorCode,
    FindRequest, Frame, MetaEntry, Problem, VerifyCounts, MAX_CONTROL_PAYLOAD, MAX_TAR_PATHS,
    MAX_VERIFY_LISTED,
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

/// Several catalog requests to one server over one control connection (a catalog session,
/// where the server's `Welcome` sets `Capabilities::CATALOG_SESSION`): TCP, TLS and the login
/// once, not once a request. Against a server without it each request opens its own
/// connection, as before. A connection the server ended (its request count or idle bound) is
/// replaced: a request it refused so (`session_ended`, nothing of it done) is asked again on a
/// new one, as is a read whose reused connection failed before its answer.
pub struct CatalogSession<'a> {
    cfg: &'a ClientConfig,
    reporter: &'a dyn Reporter,
    /// The connection the next request goes on, kept after an answer when the server keeps
    /// catalog sessions.
    kept: Option<crate::stream::Stream>,
    opened: u32,
    ask_again: bool,
}

/// What one request's answer was: one frame, or a find's several gathered.
enum Reply {
    One(CatalogAnswer),
    Found(Found),
}

impl<'a> CatalogSession<'a> {
    /// A session to `cfg`'s server; the connection opens with the first request.
    pub fn new(cfg: &'a ClientConfig, reporter: &'a dyn Reporter) -> Self {
        Self {
            cfg,
            reporter,
            kept: None,
            opened: 0,
            ask_again: true,
        }
    }

    /// Whether a request the server's session bound refused is asked again on a new
    /// connection (the default) or returned as the error (`session_ended`): for a caller that
    /// wants to see the bound.
    pub fn ask_again_when_ended(mut self, yes: bool) -> Self {
        self.ask_again = yes;
        self
    }

    /// Control connections opened so far.
    pub fn connections(&self) -> u32 {
        self.opened
    }

    /// Ends the session: TLS's close_notify, then the connection closes.
    pub async fn close(mut self) {
        if let Some(mut c) = self.kept.take() {
            let _ = tokio::io::AsyncWriteExt::shutdown(&mut c).await;
        }
    }

    /// Everything the server's catalog knows of `path`.
    pub async fn stat(&mut self, path: &str) -> Result<CatalogStat, SessionError> {
        let request = CatalogRequest::Stat {
            path: path.to_owned(),
        };
        match self.one(request).await? {
            CatalogAnswer::Stat(s) => Ok(*s),
            other => Err(unexpected(&other)),
        }
    }

    /// [`Self::stat`] with each replica's server address (`Locate`, op 12), for a client
    /// choosing where to fetch from. A server older than op 12 refuses it as a protocol error:
    /// its `stat` then, whose replicas carry no address.
    pub async fn locate(&mut self, path: &str) -> Result<CatalogStat, SessionError> {
        let request = CatalogRequest::Locate {
            path: path.to_owned(),
        };
        match self.one(request).await {
            Ok(CatalogAnswer::Stat(s)) => Ok(*s),
            Ok(other) => Err(unexpected(&other)),
            Err(SessionError::Remote { code, .. }) if code == ErrorCode::PROTOCOL => {
                self.stat(path).await
            }
            Err(e) => Err(e),
        }
    }

    /// Removes a file or symlink (with `recursive`, a tree) and forgets it in the catalog.
    pub async fn remove(&mut self, path: &str, recursive: bool) -> Result<Changed, SessionError> {
        let request = CatalogRequest::Remove {
            path: path.to_owned(),
            recursive,
        };
        changed(self.one(request).await?)
    }

    /// Renames `from` to `to` on one server (into `to` when it is a directory), and the
    /// catalog's entries with it.
    pub async fn rename(&mut self, from: &str, to: &str) -> Result<Changed, SessionError> {
        let request = CatalogRequest::Rename {
            from: from.to_owned(),
            to: to.to_owned(),
        };
        changed(self.one(request).await?)
    }

    /// Makes a directory (with `parents`, its missing parents too).
    pub async fn mkdir(&mut self, path: &str, parents: bool) -> Result<Changed, SessionError> {
        let request = CatalogRequest::Mkdir {
            path: path.to_owned(),
            parents,
        };
        changed(self.one(request).await?)
    }

    /// Adds a metadata entry to a registered object.
    pub async fn meta_set(
        &mut self,
        path: &str,
        entry: MetaEntry,
    ) -> Result<Changed, SessionError> {
        let request = CatalogRequest::MetaSet {
            path: path.to_owned(),
            entry,
        };
        changed(self.one(request).await?)
    }

    /// Removes an attribute of an object (only the entry of `value` when given).
    pub async fn meta_rm(
        &mut self,
        path: &str,
        attr: &str,
        value: Option<&str>,
    ) -> Result<Changed, SessionError> {
        let request = CatalogRequest::MetaRm {
            path: path.to_owned(),
            attr: attr.to_owned(),
            value: value.map(str::to_owned),
        };
        changed(self.one(request).await?)
    }

    /// An object's metadata, by attribute then value.
    pub async fn meta_ls(&mut self, path: &str) -> Result<Vec<MetaEntry>, SessionError> {
        let request = CatalogRequest::MetaLs {
            path: path.to_owned(),
        };
        match self.one(request).await? {
            CatalogAnswer::Meta { entries } => Ok(entries),
            other => Err(unexpected(&other)),
        }
    }

    /// See [`replicated`].
    pub async fn replicated(
        &mut self,
        path: &str,
        recursive: bool,
        (server, physical, address): (&str, &str, &str),
        at: &str,
    ) -> Result<Changed, SessionError> {
        let request = CatalogRequest::Replicated {
            path: path.to_owned(),
            recursive,
            server: server.to_owned(),
            physical: physical.to_owned(),
            address: address.to_owned(),
            at: at.to_owned(),
        };
        changed(self.one(request).await?)
    }

    /// The objects `find` matches, at most its limit, answered from the server's catalog.
    pub async fn find(&mut self, find: FindRequest) -> Result<Found, SessionError> {
        match self.ask(CatalogRequest::Find(Box::new(find))).await? {
            Reply::Found(found) => Ok(found),
            Reply::One(other) => Err(unexpected(&other)),
        }
    }

    async fn one(&mut self, request: CatalogRequest) -> Result<CatalogAnswer, SessionError> {
        match self.ask(request).await? {
            Reply::One(answer) => Ok(answer),
            Reply::Found(_) => Err(SessionError::Protocol(
                "a find's answer to another catalog request".into(),
            )),
        }
    }

    /// Sends `request` on the kept connection (or a new one) and reads its answer; asks again
    /// once on a new connection where the kept one had ended before the request was done.
    async fn ask(&mut self, request: CatalogRequest) -> Result<Reply, SessionError> {
        // Only reads are asked again after a failure the server did not explain: a change
        // may have been done before the connection broke.
        let read = matches!(
            request,
            CatalogRequest::Stat { .. }
                | CatalogRequest::Locate { .. }
                | CatalogRequest::MetaLs { .. }
                | CatalogRequest::Find(_)
        );
        let limit = match &request {
            CatalogRequest::Find(f) => Some(f.limit as usize),
            _ => None,
        };
        // A kept connection the server has closed since (its idle bound) is not used; a
        // caller that wants to see the bound is told the server's reason.
        if let Some(mut c) = self.kept.take() {
            if !crate::tcp::peer_closed(c.tcp()) {
                self.kept = Some(c);
            } else if !self.ask_again {
                let said = expect_frame(&mut c, MAX_CONTROL_PAYLOAD, "control");
                let heard = tokio::time::timeout(self.cfg.connect_timeout, said).await;
                if let Ok(Err(e @ SessionError::Remote { .. })) = heard {
                    return Err(e);
                }
            }
        }
        let mut reused = self.kept.is_some();
        loop {
            let (mut control, keeps) = match self.kept.take() {
                Some(c) => (c, true),
                None => self.open().await?,
            };
            let asked = Frame::CatalogRequest(request.clone());
            let outcome = match send(&mut control, &asked).await {
                Ok(()) => reply(&mut control, limit).await,
                Err(e) => Err(e.into()),
            };
            let ended = |e: &SessionError| match e {
                SessionError::Remote { code, .. } => *code == ErrorCode::SESSION_ENDED,
                SessionError::Io(_) | SessionError::Closed(_) => read,
                _ => false,
            };
            match outcome {
                Err(e) if reused && self.ask_again && ended(&e) => {
                    reused = false;
                    continue;
                }
                Ok(reply) => {
                    if keeps {
                        self.kept = Some(control);
                    }
                    return Ok(reply);
                }
                Err(e) => {
                    // The request's own refusal leaves the session open.
                    if let SessionError::Remote { code, .. } = &e {
                        if keeps && !code.ends_catalog_session() {
                            self.kept = Some(control);
                        }
                    }
                    return Err(e);
                }
            }
        }
    }

    /// A new control connection; whether it may carry more than one request.
    async fn open(&mut self) -> Result<(crate::stream::Stream, bool), SessionError> {
        let c = connect(self.cfg, self.reporter).await?;
        self.opened += 1;
        Ok((c.control, c.caps.has(Capabilities::CATALOG_SESSION)))
    }
}

/// Reads a request's answer: one frame, or (a find, `limit` given) its frames to the last.
async fn reply(
    control: &mut crate::stream::Stream,
    limit: Option<usize>,
) -> Result<Reply, SessionError> {
    let Some(limit) = limit else {
        return Ok(Reply::One(answer(control).await?));
    };
    let mut found = Found::default();
    loop {
        match answer(control).await? {
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
                    return Ok(Reply::Found(found));
                }
            }
            other => return Err(unexpected(&other)),
        }
    }
}

/// Everything the server's catalog knows of `path` (one request: [`CatalogSession`] for
/// several).
pub async fn stat(
    cfg: &ClientConfig,
    path: &str,
    reporter: &dyn Reporter,
) -> Result<CatalogStat, SessionError> {
    CatalogSession::new(cfg, reporter).stat(path).await
}

/// [`CatalogSession::locate`], one request.
pub async fn locate(
    cfg: &ClientConfig,
    path: &str,
    reporter: &dyn Reporter,
) -> Result<CatalogStat, SessionError> {
    CatalogSession::new(cfg, reporter).locate(path).await
}

/// Removes a file or symlink (with `recursive`, a tree) and forgets it in the catalog.
pub async fn remove(
    cfg: &ClientConfig,
    path: &str,
    recursive: bool,
    reporter: &dyn Reporter,
) -> Result<Changed, SessionError> {
    CatalogSession::new(cfg, reporter)
        .remove(path, recursive)
        .await
}

/// Renames `from` to `to` on one server (into `to` when it is a directory), and the catalog's
/// entries with it.
pub async fn rename(
    cfg: &ClientConfig,
    from: &str,
    to: &str,
    reporter: &dyn Reporter,
) -> Result<Changed, SessionError> {
    CatalogSession::new(cfg, reporter).rename(from, to).await
}

/// Makes a directory (with `parents`, its missing parents too).
pub async fn mkdir(
    cfg: &ClientConfig,
    path: &str,
    parents: bool,
    reporter: &dyn Reporter,
) -> Result<Changed, SessionError> {
    CatalogSession::new(cfg, reporter)
        .mkdir(path, parents)
        .await
}

/// Adds a metadata entry to a registered object.
pub async fn meta_set(
    cfg: &ClientConfig,
    path: &str,
    entry: MetaEntry,
    reporter: &dyn Reporter,
) -> Result<Changed, SessionError> {
    CatalogSession::new(cfg, reporter)
        .meta_set(path, entry)
        .await
}

/// Removes an attribute of an object (only the entry of `value` when given).
pub async fn meta_rm(
    cfg: &ClientConfig,
    path: &str,
    attr: &str,
    value: Option<&str>,
    reporter: &dyn Reporter,
) -> Result<Changed, SessionError> {
    CatalogSession::new(cfg, reporter)
        .meta_rm(path, attr, value)
        .await
}

/// An object's metadata, by attribute then value.
pub async fn meta_ls(
    cfg: &ClientConfig,
    path: &str,
    reporter: &dyn Reporter,
) -> Result<Vec<MetaEntry>, SessionError> {
    CatalogSession::new(cfg, reporter).meta_ls(path).await
}

/// Records in the server's catalog that `server` (another server's catalog name) holds a good
/// copy of each object at `path` (with `recursive`, under it too) that this server holds good,
/// at `physical` followed by the rest of the object's path, reachable at `address` (empty:
/// unknown): what `repl` leaves in a source's catalog that does not see the destination's.
/// `at` is the copy's path on `server` when not `path` (empty: at `path`): an older server
/// refuses it as a protocol error, and records nothing.
pub async fn replicated(
    cfg: &ClientConfig,
    path: &str,
    recursive: bool,
    there: (&str, &str, &str),
    at: &str,
    reporter: &dyn Reporter,
) -> Result<Changed, SessionError> {
    CatalogSession::new(cfg, reporter)
        .replicated(path, recursive, there, at)
        .await
}

/// The objects `find` matches, at most its limit, answered from the server's catalog.
pub async fn find(
    cfg: &ClientConfig,
    find: FindRequest,
    reporter: &dyn Reporter,
) -> Result<Found, SessionError> {
    CatalogSession::new(cfg, reporter).find(find).await
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
