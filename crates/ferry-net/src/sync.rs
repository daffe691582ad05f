//! `ferry sync`: makes a destination tree a copy of a source tree, one of them on a server, or
//! both on two servers ([`sync_between`]: the changed files go from one to the other as one
//! third-party copy, never through this client).
//!
//! Both trees are listed first (the local one walked, the remote one listed a directory at a
//! time), through the same filter. A file whose size and mtime match at the destination is
//! unchanged: it is left out of the transfer (`Filter::for_sync`), so neither end opens it;
//! with `checksum` every file goes to the transfer, whose receiver proves a same-size,
//! same-mtime file by digest (`Decision::Complete`) and replaces any other. Files that differ
//! are replaced as a put or get replaces them (a partial file, then a rename). Only once the
//! transfer has stored and verified every file does `delete` remove what the destination has
//! and the source has not; what the filter leaves out is neither sent nor removed.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferry_core::filter::Filter;
use ferry_core::send::Source;
use ferry_core::{path, FsError, Reporter, Root};
use ferry_proto::{EntryKind, ErrorCode, ExistingPolicy, Frame, MAX_REMOVE_PATHS};
use serde::Serialize;

use crate::client::{self, ClientConfig, TransferReport};
use crate::conn::{expect_frame, send};
use crate::copy::{self, CopyConfig, CopyReport};
use crate::error::SessionError;

/// One entry of a listed tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: EntryKind,
    pub size: u64,
    pub mtime_ns: i64,
}

/// A tree by `/`-separated path below its top, the top itself as `""` (a single file is that
/// one entry); a missing top is the empty tree.
pub type Tree = BTreeMap<String, Entry>;

/// Which way a sync goes.
#[derive(Clone, Debug)]
pub enum Direction {
    /// A local tree to a server path.
    Put { src: PathBuf, dest: String },
    /// A server path to a local tree.
    Get { src: String, dest: PathBuf },
}

/// What a sync does (and a dry run prints).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Plan {
    /// Files missing at the destination or differing in size or mtime (every file, with
    /// `checksum`), and symlinks missing or differing, by path below the top.
    pub send: Vec<String>,
    /// Files left alone, not read on either end.
    pub unchanged: usize,
    /// What the destination has and the source has not, contents before their directory
    /// (empty without `delete`).
    pub delete: Vec<String>,
}

/// How a sync ended.
#[derive(Debug, Serialize)]
pub struct SyncReport {
    pub plan: Plan,
    /// The transfer's report; `None` when nothing needed sending (or between two servers).
    pub transfer: Option<TransferReport>,
    /// Between two servers: the third-party copy's report; `None` when nothing needed sending.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copy: Option<CopyReport>,
    /// Paths removed, and the removals that failed (with why).
    pub deleted: usize,
    pub delete_errors: Vec<String>,
}

impl SyncReport {
    fn planned(plan: Plan) -> Self {
        Self {
            plan,
            transfer: None,
            copy: None,
            deleted: 0,
            delete_errors: Vec::new(),
        }
    }

    /// Every file arrived and every removal asked for was done.
    pub fn is_success(&self) -> bool {
        self.sent_all() && self.delete_errors.is_empty()
    }

    /// The transfer or copy (if one ran) stored and verified every file.
    pub fn sent_all(&self) -> bool {
        self.transfer
            .as_ref()
            .is_none_or(TransferReport::is_success)
            && self.copy.as_ref().is_none_or(CopyReport::is_success)
    }
}

/// What a sync is asked to do beyond copying.
#[derive(Clone, Copy, Debug, Default)]
pub struct SyncOpts {
    pub checksum: bool,
    pub delete: bool,
    pub dry_run: bool,
}

/// Ferry's own partial files and resume journals: never removed (a rerun resumes from them).
fn is_partial(rel: &str) -> bool {
    let name = path::split_parent(rel).1;
    name.starts_with(".ferry-") && (name.ends_with(".part") || name.ends_with(".journal"))
}

/// Compares the trees: what to send, what is unchanged, what to remove.
pub fn plan(src: &Tree, dest: &Tree, opts: SyncOpts) -> (Plan, HashSet<String>) {
    let mut plan = Plan::default();
    let mut unchanged = HashSet::new();
    for (rel, s) in src.iter() {
        let same = dest
            .get(rel)
            .is_some_and(|d| d.kind == s.kind && d.size == s.size && d.mtime_ns == s.mtime_ns);
        match s.kind {
            EntryKind::File if same && !opts.checksum => {
                unchanged.insert(rel.clone());
            }
            EntryKind::File => plan.send.push(rel.clone()),
            // A link's size is its target's length and its mtime goes with it (ferry keeps
            // it): one made again, or pointed elsewhere, differs; the walk sends every link,
            // so only the transfer has to run.
            EntryKind::Symlink if !same => plan.send.push(rel.clone()),
            _ => {}
        }
    }
    plan.unchanged = unchanged.len();
    if opts.delete {
        plan.delete = dest
            .keys()
            .filter(|rel| !rel.is_empty() && !src.contains_key(*rel) && !is_partial(rel))
            .rev()
            .cloned()
            .collect();
    }
    (plan, unchanged)
}

/// Walks a local tree through `filter` (rules relative to `top`); an excluded directory is
/// not entered, a missing `top` is an empty tree.
pub fn local_tree(top: &Path, filter: &Filter) -> Result<Tree, SessionError> {
    let mut tree = Tree::new();
    let meta = match std::fs::symlink_metadata(top) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(tree),
        Err(e) => return Err(FsError::io(top.display().to_string(), e).into()),
    };
    tree.insert(String::new(), entry_of(&meta));
    if !meta.is_dir() {
        return Ok(tree);
    }
    let mut dirs = vec![String::new()];
    while let Some(dir) = dirs.pop() {
        let at = top.join(&dir);
        let read = std::fs::read_dir(&at).map_err(|e| FsError::io(at.display().to_string(), e))?;
        for item in read {
            let item = item.map_err(|e| FsError::io(at.display().to_string(), e))?;
            let Some(name) = item.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let rel = path::join(&dir, &name);
            let Ok(m) = item.path().symlink_metadata() else {
                continue;
            };
            if !filter.allows(&rel, m.is_dir()) {
                continue;
            }
            if m.is_dir() {
                dirs.push(rel.clone());
            }
            tree.insert(rel, entry_of(&m));
        }
    }
    Ok(tree)
}

fn entry_of(m: &std::fs::Metadata) -> Entry {
    use std::os::unix::fs::MetadataExt;
    let kind = if m.is_dir() {
        EntryKind::Dir
    } else if m.is_symlink() {
        EntryKind::Symlink
    } else if m.is_file() {
        EntryKind::File
    } else {
        EntryKind::Other
    };
    Entry {
        kind,
        size: m.len(),
        mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
    }
}

/// Lists a remote tree a directory at a time through `filter`; a missing `top` is an empty
/// tree. A `top` that lists as one non-directory of its own name is a single file.
pub async fn remote_tree(
    cfg: &ClientConfig,
    top: &str,
    filter: &Filter,
    reporter: &dyn Reporter,
) -> Result<Tree, SessionError> {
    let mut tree = Tree::new();
    let first = match client::list(cfg, top, reporter).await {
        Ok(l) => l,
        Err(e) if e.code() == ErrorCode::NOT_FOUND => return Ok(tree),
        Err(e) => return Err(e),
    };
    let base = path::split_parent(top.trim_end_matches('/')).1;
    if let [one] = first.as_slice() {
        if one.kind != EntryKind::Dir && one.name == base && !top.ends_with('/') {
            tree.insert(String::new(), listed(one));
            return Ok(tree);
        }
    }
    let top_dir = Entry {
        kind: EntryKind::Dir,
        size: 0,
        mtime_ns: 0,
    };
    tree.insert(String::new(), top_dir);
    let mut pending = vec![(String::new(), first)];
    while let Some((dir, entries)) = pending.pop() {
        for e in entries {
            let rel = path::join(&dir, &e.name);
            let is_dir = e.kind == EntryKind::Dir;
            if !filter.allows(&rel, is_dir) {
                continue;
            }
            if is_dir {
                let below = format!("{}/{rel}", top.trim_end_matches('/'));
                pending.push((rel.clone(), client::list(cfg, &below, reporter).await?));
            }
            tree.insert(rel, listed(&e));
        }
    }
    Ok(tree)
}

fn listed(e: &ferry_proto::ListEntry) -> Entry {
    Entry {
        kind: e.kind,
        size: e.size,
        mtime_ns: e.mtime_ns,
    }
}

/// Both trees compared: what the sync does, and whether it needs a transfer at all.
struct Compared {
    plan: Plan,
    unchanged: HashSet<String>,
    /// The source is one file: it syncs to one file, with nothing below it to remove.
    single: bool,
    transfer: bool,
}

/// Compares the listed trees (`src_name` names the source in an error).
fn compare(
    src: &Tree,
    dest: &Tree,
    src_name: &str,
    opts: SyncOpts,
) -> Result<Compared, SessionError> {
    // A missing source is an error, never an empty tree that --delete would empty DEST by.
    if src.is_empty() {
        let why = std::io::Error::from(std::io::ErrorKind::NotFound);
        return Err(FsError::io(src_name, why).into());
    }
    let single = src.get("").is_some_and(|e| e.kind != EntryKind::Dir);
    let opts = SyncOpts {
        delete: opts.delete && !single,
        ..opts
    };
    let (plan, unchanged) = plan(src, dest, opts);
    let nothing_new = plan.send.is_empty() && (single || dirs_present(src, dest));
    Ok(Compared {
        plan,
        unchanged,
        single,
        transfer: !nothing_new,
    })
}

/// Runs a sync: lists both trees, sends what differs, then (with `delete`, and only if every
/// file arrived) removes what the source lacks. A dry run stops after the plan.
pub async fn sync(
    cfg: &ClientConfig,
    dir: &Direction,
    filter: &Filter,
    opts: SyncOpts,
    reporter: Arc<dyn Reporter>,
) -> Result<SyncReport, SessionError> {
    let mut cfg = cfg.clone();
    cfg.opts.existing = ExistingPolicy::Overwrite;
    let (src, dest) = match dir {
        Direction::Put { src, dest } => (
            local_tree(src, filter)?,
            remote_tree(&cfg, dest, filter, reporter.as_ref()).await?,
        ),
        Direction::Get { src, dest } => (
            remote_tree(&cfg, src, filter, reporter.as_ref()).await?,
            local_tree(dest, filter)?,
        ),
    };
    let name = match dir {
        Direction::Put { src, .. } => src.display().to_string(),
        Direction::Get { src, .. } => src.clone(),
    };
    let compared = compare(&src, &dest, &name, opts)?;
    let mut report = SyncReport::planned(compared.plan);
    if opts.dry_run {
        return Ok(report);
    }
    if compared.transfer {
        let filter = filter.clone().for_sync(compared.unchanged);
        let t = transfer(&cfg, dir, &filter, reporter.clone()).await?;
        let ok = t.is_success();
        report.transfer = Some(t);
        if !ok {
            return Ok(report);
        }
    }
    if !report.plan.delete.is_empty() {
        let (deleted, errors) = match dir {
            Direction::Put { dest, .. } => {
                remove_remote(&cfg, dest, &report.plan.delete, reporter.as_ref()).await?
            }
            Direction::Get { dest, .. } => remove_local(dest, &report.plan.delete),
        };
        report.deleted = deleted;
        report.delete_errors = errors;
    }
    Ok(report)
}

/// Runs a sync between two servers: lists both trees through the same filter, has the
/// source send what differs straight to the destination (one third-party copy of the chosen
/// paths; the data never crosses this client), then (with `delete`, and only once the
/// destination confirmed every file stored and verified) removes there what the source lacks.
/// A server that takes no part in third-party copies refuses; nothing is proxied.
pub async fn sync_between(
    cfg: &CopyConfig,
    (src, dest): (&str, &str),
    filter: &Filter,
    opts: SyncOpts,
    reporter: Arc<dyn Reporter>,
) -> Result<SyncReport, SessionError> {
    let mut cfg = cfg.clone();
    // What the grant allows on the destination: replacing what differs.
    cfg.source.opts.existing = ExistingPolicy::Overwrite;
    let src_tree = remote_tree(&cfg.source, src, filter, reporter.as_ref()).await?;
    let dest_tree = remote_tree(&cfg.dest, dest, filter, reporter.as_ref()).await?;
    let compared = compare(&src_tree, &dest_tree, src, opts)?;
    let mut report = SyncReport::planned(compared.plan);
    if opts.dry_run {
        return Ok(report);
    }
    if compared.transfer {
        let copied = if compared.single {
            if dest_tree.get("").is_some_and(|e| e.kind == EntryKind::Dir) {
                let why = std::io::Error::other("the source is a file and this a directory");
                return Err(FsError::io(dest, why).into());
            }
            copy::copy(&cfg, src, dest.trim_end_matches('/'), reporter.clone()).await?
        } else {
            let paths = chosen(&src_tree, &report.plan);
            copy::copy_only(&cfg, src, &paths, dest, reporter.clone()).await?
        };
        let ok = copied.is_success();
        report.copy = Some(copied);
        if !ok {
            return Ok(report);
        }
    }
    if !report.plan.delete.is_empty() {
        let removed = remove_remote(&cfg.dest, dest, &report.plan.delete, reporter.as_ref());
        (report.deleted, report.delete_errors) = removed.await?;
    }
    Ok(report)
}

/// What a copy between servers sends: the files that differ, and every directory and link of
/// the listed source (as a put's walk sends them, for the destination to make).
fn chosen(src: &Tree, plan: &Plan) -> Vec<String> {
    let others = src
        .iter()
        .filter(|(rel, e)| !rel.is_empty() && e.kind != EntryKind::File)
        .map(|(rel, _)| rel.clone());
    others.chain(plan.send.iter().cloned()).collect()
}

/// Whether every directory of the source is one at the destination (else a transfer makes
/// them, even with no file to send).
fn dirs_present(src: &Tree, dest: &Tree) -> bool {
    src.iter()
        .filter(|(_, e)| e.kind == EntryKind::Dir)
        .all(|(rel, _)| dest.get(rel).is_some_and(|d| d.kind == EntryKind::Dir))
}

/// The transfer of a sync: a put or get whose top is the destination's own name.
async fn transfer(
    cfg: &ClientConfig,
    dir: &Direction,
    filter: &Filter,
    reporter: Arc<dyn Reporter>,
) -> Result<TransferReport, SessionError> {
    match dir {
        Direction::Put { src, dest } => {
            // Into the parent, under the destination's own name, whether or not it exists.
            let dest = dest.trim_end_matches('/');
            let (into, name) = match dest.rfind('/') {
                Some(i) => (dest[..=i].to_owned(), &dest[i + 1..]),
                None => ("./".to_owned(), dest),
            };
            let sources = || -> Result<Vec<Source>, SessionError> {
                let abs = std::path::absolute(src)
                    .map_err(|e| FsError::io(src.display().to_string(), e))?;
                let (Some(p), Some(n)) = (abs.parent(), abs.file_name().and_then(|n| n.to_str()))
                else {
                    let why = std::io::Error::other("cannot sync `/` itself");
                    return Err(FsError::io(src.display().to_string(), why).into());
                };
                Ok(vec![Source {
                    root: Root::open(p)?,
                    rel: n.to_owned(),
                    name: name.to_owned(),
                }])
            };
            client::put_sources_filtered(cfg, sources, filter, &into, reporter).await
        }
        Direction::Get { src, dest } => client::get_mirror(cfg, src, filter, dest, reporter).await,
    }
}

/// Removes `rels` (below `top` on the server) over one control connection, at most
/// [`MAX_REMOVE_PATHS`] a request; returns how many are gone and why the others are not.
pub async fn remove_remote(
    cfg: &ClientConfig,
    top: &str,
    rels: &[String],
    reporter: &dyn Reporter,
) -> Result<(usize, Vec<String>), SessionError> {
    let top = top.trim_end_matches('/');
    let mut c = client::connect(cfg, reporter).await?;
    let chunks: Vec<&[String]> = rels.chunks(MAX_REMOVE_PATHS).collect();
    let (mut removed, mut errors) = (0usize, Vec::new());
    for (i, chunk) in chunks.iter().enumerate() {
        let paths = chunk.iter().map(|r| format!("{top}/{r}")).collect();
        let more = i + 1 < chunks.len();
        send(&mut c.control, &Frame::RemoveRequest { paths, more }).await?;
        match expect_frame(&mut c.control, ferry_proto::MAX_CONTROL_PAYLOAD, "control").await? {
            Frame::Removed {
                removed: n,
                failures,
            } => {
                removed += usize::from(n);
                errors.extend(failures.into_iter().map(|f| {
                    let at = chunk.get(usize::from(f.index)).map_or("?", String::as_str);
                    format!("removing {at}: {}", f.message)
                }));
            }
            Frame::Error { code, message } => return Err(SessionError::Remote { code, message }),
            other => {
                return Err(SessionError::Protocol(format!(
                    "unexpected {:?} answering a removal",
                    other.frame_type()
                )))
            }
        }
    }
    Ok((removed, errors))
}

/// Removes `rels` below the local `top`, each confined beneath it (`Root::remove`).
pub fn remove_local(top: &Path, rels: &[String]) -> (usize, Vec<String>) {
    let root = match Root::open(top) {
        Ok(r) => r,
        Err(e) => return (0, vec![e.to_string()]),
    };
    let (mut removed, mut errors) = (0usize, Vec::new());
    for rel in rels {
        match root.remove(rel) {
            Ok(()) => removed += 1,
            Err(e) => errors.push(format!("removing {rel}: {e}")),
        }
    }
    (removed, errors)
}
