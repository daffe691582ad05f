//! `ferry repl` and `ferry verify --repair`: replicas made and mended with the third-party copy
//! ([`crate::copy`]), not a transfer engine of their own. The client drives both; the servers
//! do what they do for any copy (the destination registers what it stores) plus one catalog
//! operation (`Replicated`, op 11) that records a copy elsewhere in a catalog that cannot see
//! it. docs/DESIGN.md, "The catalog".
//!
//! A shared catalog (the servers of a zone on one PostgreSQL database) needs no record: the
//! destination registers its file as a second replica of the same object, because it has the
//! same size, mtime, digest and algorithm (`ferry_catalog`'s registration keeps the other
//! replicas good then). Separate catalogs each know their own files; the source's is told
//! where the copy is, by the destination's own catalog name and physical path as its `stat`
//! shows them.

use std::sync::Arc;

use ferry_core::digest::parse_algo;
use ferry_core::Reporter;
use ferry_proto::{
    CatalogReplica, CatalogStat, ErrorCode, ExistingPolicy, FindRequest, Problem, ReplicaHealth,
};
use serde::Serialize;

use crate::catalog::{self as cat, Verified};
use crate::client::ClientConfig;
use crate::copy::{copy, CopyConfig, CopyReport};
use crate::error::SessionError;

/// Why a `repl` or a repair could not go on.
#[derive(Debug, thiserror::Error)]
pub enum ReplError {
    #[error(transparent)]
    Session(#[from] SessionError),
    /// What was asked cannot be done as asked (the message says why and what to do).
    #[error("{0}")]
    Refused(String),
}

/// What a `repl` did, as `--json` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct ReplReport {
    /// The source's path and the destination's, as the servers' roots see them.
    pub path: String,
    pub dest_path: String,
    pub tree: bool,
    /// The copy's own report.
    pub copy: CopyReport,
    /// The destination's catalog name, as the source's catalog recorded its replica (with
    /// separate catalogs; empty with a shared one, where the second replica is the
    /// destination's own registration).
    pub dest_server: String,
    /// Both servers answer from one catalog: the destination registered the second replica.
    pub shared_catalog: bool,
    /// Objects the source's catalog recorded the destination's copy of (separate catalogs).
    pub recorded: u64,
    /// Objects the destination's catalog recorded the source's copy of (likewise).
    pub recorded_at_dest: u64,
    /// What a catalog declined to record, and why (a zone's shared catalog takes no records).
    pub notes: Vec<String>,
}

/// Copies `src` (a registered file, or with `tree` a directory) from the source to `dest` on
/// the destination and makes the new copy a known replica: in a shared catalog by the
/// destination's registration, else by a record in the source's catalog. The copy replaces a
/// differing file at the destination (a replica follows its object), with the object's own
/// digest algorithm for a file.
pub async fn repl(
    cfg: &CopyConfig,
    src: &str,
    dest: &str,
    tree: bool,
    reporter: Arc<dyn Reporter>,
) -> Result<ReplReport, ReplError> {
    let mut cfg = cfg.clone();
    cfg.source.opts.existing = ExistingPolicy::Overwrite;
    let (src, dest) = (trimmed(src), trimmed(dest));
    let file = match cat::stat(&cfg.source, &format!("/{src}"), reporter.as_ref()).await {
        Ok(s) => Some(s),
        Err(SessionError::Remote { code, .. }) if code == ErrorCode::NOT_FOUND && tree => None,
        Err(SessionError::Remote { code, .. }) if code == ErrorCode::NOT_FOUND => {
            return Err(ReplError::Refused(format!(
                "/{src} is not a registered file on the source (a directory needs -r)"
            )));
        }
        Err(e) => return Err(e.into()),
    };
    let (name, dest_name) = (last(&src), last(&dest));
    let copied = match &file {
        Some(s) => {
            if let Some(algo) = parse_algo(&s.object.algo) {
                cfg.source.opts.checksum = algo;
            }
            copy(
                &cfg,
                &format!("/{src}"),
                &format!("/{dest}"),
                reporter.clone(),
            )
            .await?
        }
        None => {
            if src.is_empty() || dest.is_empty() {
                return Err(ReplError::Refused(
                    "repl -r takes a directory, not a server's whole root".into(),
                ));
            }
            if name != dest_name {
                return Err(ReplError::Refused(format!(
                    "repl -r keeps a directory's name: /{src} cannot become /{dest} (name \
                     the destination …/{name})"
                )));
            }
            // Into the parent: the tree keeps its name there, as `cp A:/d B:/p/` makes `/p/d`.
            let parent = match ferry_core::path::split_parent(&dest).0 {
                "" => "/".to_owned(),
                p => format!("/{p}/"),
            };
            copy(&cfg, &format!("/{src}"), &parent, reporter.clone()).await?
        }
    };
    let mut report = ReplReport {
        path: format!("/{src}"),
        dest_path: format!("/{dest}"),
        tree: file.is_none(),
        copy: copied,
        dest_server: String::new(),
        shared_catalog: false,
        recorded: 0,
        recorded_at_dest: 0,
        notes: Vec::new(),
    };
    if !report.copy.is_success() {
        return Ok(report);
    }
    // One object of the copy, seen through each server: its suffix below the top.
    let rest = match &file {
        Some(_) => String::new(),
        None => {
            let found = cat::find(
                &cfg.dest,
                FindRequest {
                    under: format!("/{dest}"),
                    conditions: Vec::new(),
                    name: None,
                    newer_ns: None,
                    larger: None,
                    limit: 1,
                },
                reporter.as_ref(),
            )
            .await?;
            let Some(o) = found.objects.first() else {
                // An empty tree: no object to record.
                return Ok(report);
            };
            match o.path.strip_prefix(&format!("{dest}/")) {
                Some(r) => format!("/{r}"),
                None => {
                    return Err(ReplError::Refused(format!(
                        "the destination's find under /{dest} answered /{}",
                        o.path
                    )))
                }
            }
        }
    };
    // The destination first: its stat waits for its own registrations.
    let there = cat::locate(&cfg.dest, &format!("/{dest}{rest}"), reporter.as_ref()).await?;
    let here = cat::locate(&cfg.source, &format!("/{src}{rest}"), reporter.as_ref()).await?;
    // A file's object as it was before the copy: in a shared catalog a copy of other bytes
    // would have replaced it.
    let before = file.as_ref().map_or(&here.object, |s| &s.object);
    let o = (before, &there.object);
    if (o.0.size, &o.0.digest, &o.0.algo) != (o.1.size, &o.1.digest, &o.1.algo) {
        return Err(ReplError::Refused(format!(
            "/{dest}{rest} was registered with another digest than /{src}{rest} on the \
             source: the source's file may have changed behind ferry's back (`ferry verify` \
             it); nothing was recorded"
        )));
    }
    // One catalog answers for both: the same row (registered once, at the same instant) and
    // the same replicas. Two catalogs never agree on when the object was stored.
    let shared = here.object == there.object && here.replicas == there.replicas;
    if shared {
        report.shared_catalog = true;
        return Ok(report);
    }
    // Each catalog is told of the good copies the other one knows at this path (the other
    // server's own among them; a catalog skips its own name), as their tops: the rest of each
    // object's path follows.
    // A copy at another path than the object's is recorded with its path there, so that a
    // get fetches it where it is.
    let tree = file.is_none();
    for (r, top, at) in candidates(&there, &rest) {
        let address = address_of(r, &here, &cfg.dest.server);
        let at = other_than(at, &src);
        let asked = cat::replicated(
            &cfg.source,
            &format!("/{src}"),
            tree,
            (&r.server, top, address),
            at,
            reporter.as_ref(),
        )
        .await;
        let Some(n) = recorded(asked, &cfg.source.server, at, &mut report.notes)? else {
            break;
        };
        if n > 0 && report.dest_server.is_empty() {
            report.dest_server = r.server.clone();
        }
        report.recorded += n;
    }
    for (r, top, at) in candidates(&here, &rest) {
        let address = address_of(r, &there, &cfg.source.server);
        let at = other_than(at, &dest);
        let asked = cat::replicated(
            &cfg.dest,
            &format!("/{dest}"),
            tree,
            (&r.server, top, address),
            at,
            reporter.as_ref(),
        )
        .await;
        let Some(n) = recorded(asked, &cfg.dest.server, at, &mut report.notes)? else {
            break;
        };
        report.recorded_at_dest += n;
    }
    Ok(report)
}

/// The good replicas `stat` shows of an object whose rest below the copy's top is `rest`
/// (`/sub/f`, or empty for a file), each with the copy's top on its server: its physical
/// path, and its path under that server's root (the replica's own, else the object's). A
/// replica without a path of its own whose physical path does not end with the object's was
/// recorded by an older ferry for a copy elsewhere: where it is there is not known.
fn candidates<'a>(
    stat: &'a CatalogStat,
    rest: &'a str,
) -> impl Iterator<Item = (&'a CatalogReplica, &'a str, &'a str)> + 'a {
    let object = stat.object.path.trim_start_matches('/');
    stat.replicas
        .iter()
        .filter(|r| r.state == ReplicaHealth::Good)
        .filter_map(move |r| {
            if r.path.is_empty() && !r.physical.ends_with(&format!("/{object}")) {
                return None;
            }
            let top = r.physical.strip_suffix(rest)?;
            let at = r.path_or(object).strip_suffix(rest)?;
            Some((r, top, at.trim_matches('/')))
        })
}

/// The copy's path for a record of it in the catalog of `path`'s server: empty when it is
/// the same path (an older server takes that record too).
fn other_than<'a>(at: &'a str, path: &str) -> &'a str {
    match at == path.trim_matches('/') {
        true => "",
        false => at,
    }
}

/// Where the server of `r` (a replica one side's catalog shows) is reachable, for the other
/// side's record: the address its catalog gave, else, for the side's own copy (a server the
/// other side does not know yet), the address this client reached that side at.
fn address_of<'a>(r: &'a CatalogReplica, other: &CatalogStat, dialed: &'a str) -> &'a str {
    if !r.address.is_empty() {
        return &r.address;
    }
    match other.replicas.iter().any(|o| o.server == r.server) {
        true => "",
        false => dialed,
    }
}

/// A record's count; a catalog that takes no records (a zone's shared one: its own servers
/// register their replicas), or an older server asked to record a copy at another path
/// (`at`), is a note, `None`, not a failure of the copy.
fn recorded(
    asked: Result<crate::catalog::Changed, SessionError>,
    server: &str,
    at: &str,
    notes: &mut Vec<String>,
) -> Result<Option<u64>, ReplError> {
    match asked {
        Ok(c) => Ok(Some(c.objects)),
        Err(SessionError::Remote { code, message }) if code == ErrorCode::BAD_REQUEST => {
            notes.push(format!("{server} recorded no replica: {message}"));
            Ok(None)
        }
        Err(SessionError::Remote { code, message })
            if code == ErrorCode::PROTOCOL && !at.is_empty() =>
        {
            notes.push(format!(
                "{server} recorded no replica: it cannot record a copy at another path (an \
                 older ferry): {message}"
            ));
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// What `verify --repair` did with each problem path.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Repairs {
    /// Paths restored from a good replica and verified good again, with the server each came
    /// from.
    pub repaired: Vec<(String, String)>,
    /// Paths not repaired, with why.
    pub unrepaired: Vec<(String, String)>,
}

impl Repairs {
    pub fn all_done(&self) -> bool {
        self.unrepaired.is_empty()
    }
}

/// Repairs what a verify of the target found bad or missing: for each such path, a server of
/// `from` (each with the target as its copy's destination) whose own replica verifies good
/// and carries the registered digest copies it over the bad one (a put: temp file, digest,
/// rename), and the target verifies it again, which marks its replica good. A path with no
/// good replica in the target's catalog is not repaired, nor one no server of `from` holds
/// good.
pub async fn repair(
    target: &ClientConfig,
    from: &[CopyConfig],
    verified: &Verified,
    reporter: Arc<dyn Reporter>,
) -> Repairs {
    let mut out = Repairs::default();
    for (problem, path) in &verified.problems {
        if *problem == Problem::Unregistered {
            continue;
        }
        let shown = format!("/{}", trimmed(path));
        match repair_one(target, from, &shown, reporter.clone()).await {
            Ok(server) => out.repaired.push((shown, server)),
            Err(why) => out.unrepaired.push((shown, why)),
        }
    }
    out
}

async fn repair_one(
    target: &ClientConfig,
    from: &[CopyConfig],
    path: &str,
    reporter: Arc<dyn Reporter>,
) -> Result<String, String> {
    let said = |e: SessionError| e.to_string();
    // With addresses: a server of `from` is matched to its replica (and so its path there).
    let stat = cat::locate(target, path, reporter.as_ref())
        .await
        .map_err(said)?;
    let good: Vec<&str> = stat
        .replicas
        .iter()
        .filter(|r| r.state == ReplicaHealth::Good)
        .map(|r| r.server.as_str())
        .collect();
    if good.is_empty() {
        return Err("no good replica to repair it from".into());
    }
    if from.is_empty() {
        return Err(format!(
            "a good replica is on {}: pass --from HOST[:PORT] to repair from it",
            good.join(", ")
        ));
    }
    let mut tried = Vec::new();
    for cfg in from {
        let server = cfg.source.server.clone();
        for there in paths_there(&stat, path, &server) {
            match repair_from(cfg, (&there, path), &stat, reporter.clone()).await {
                Ok(()) => return Ok(server),
                Err(why) if there == path => tried.push(format!("{server}: {why}")),
                Err(why) => tried.push(format!("{server} at {there}: {why}")),
            }
        }
    }
    Err(tried.join("; "))
}

/// Where a server of `--from` (reached at `dialed`) may hold `path` (as shown, `/…`): the
/// own path of a good replica whose server has that address, then the object's path, then
/// the other good replicas' own paths (a server's address is not always the one dialled).
fn paths_there(stat: &CatalogStat, path: &str, dialed: &str) -> Vec<String> {
    let good: Vec<&CatalogReplica> = stat
        .replicas
        .iter()
        .filter(|r| r.state == ReplicaHealth::Good)
        .collect();
    let own = |r: &CatalogReplica| match r.path.is_empty() {
        true => path.to_owned(),
        false => format!("/{}", r.path),
    };
    let mut out: Vec<String> = Vec::new();
    let first = good.iter().filter(|r| r.address == dialed).map(|r| own(r));
    let rest = good.iter().map(|r| own(r));
    for p in first.chain([path.to_owned()]).chain(rest) {
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// One attempt from one server, its copy at `there`: checked first (registered alike,
/// verified good), then copied over the target's at `path`, which is verified again.
async fn repair_from(
    cfg: &CopyConfig,
    (there, path): (&str, &str),
    stat: &CatalogStat,
    reporter: Arc<dyn Reporter>,
) -> Result<(), String> {
    let said = |e: SessionError| e.to_string();
    let theirs = cat::stat(&cfg.source, there, reporter.as_ref())
        .await
        .map_err(said)?;
    let (a, b) = (&theirs.object, &stat.object);
    if (a.size, a.mtime_ns, &a.digest, &a.algo) != (b.size, b.mtime_ns, &b.digest, &b.algo) {
        return Err("its copy is registered with other contents".into());
    }
    let checked = cat::verify(&cfg.source, there, false, reporter.as_ref())
        .await
        .map_err(said)?;
    if checked.counts.good != 1 || !checked.clean() {
        return Err("its copy does not verify".into());
    }
    let mut cfg = cfg.clone();
    cfg.source.opts.existing = ExistingPolicy::Overwrite;
    if let Some(algo) = parse_algo(&b.algo) {
        cfg.source.opts.checksum = algo;
    }
    let copied = copy(&cfg, there, path, reporter.clone())
        .await
        .map_err(said)?;
    if !copied.is_success() {
        return Err(format!("the copy failed: {}", copied.errors.join("; ")));
    }
    let again = cat::verify(&cfg.dest, path, false, reporter.as_ref())
        .await
        .map_err(said)?;
    if again.counts.good != 1 || !again.clean() {
        return Err("copied, and it still does not verify".into());
    }
    Ok(())
}

/// A path without its leading and trailing `/`: as the servers' catalogs name it.
fn trimmed(p: &str) -> String {
    p.trim_matches('/').to_owned()
}

fn last(p: &str) -> &str {
    ferry_core::path::split_parent(p).1
}
