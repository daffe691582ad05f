//! The file-system half of `ferry rm`, `mv` and `mkdir`: each path resolved beneath the
//! directory of the write scope that grants it (`Root::scope`, opened without following any
//! symlink), its parent opened with `RESOLVE_BENEATH` and its last component never followed,
//! so neither `..` nor a link leads an operation out of the scope. Every change is made
//! durable (its directories synced) before the catalog is told. Blocking: called off the
//! runtime's threads.

use std::os::fd::OwnedFd;

use ferry_core::path::{join, split_parent};
use ferry_core::root::{fsync, syncfs, Kind};
use ferry_core::{FsError, Root};
use rustix::fs::{mkdirat, renameat_with, Mode, RenameFlags};

/// What [`remove`] found and did.
pub(super) enum Removed {
    /// Nothing was there.
    Gone,
    /// A file, a symlink or an empty directory was removed.
    One,
    /// A tree was removed, this many entries of it.
    Tree { entries: u64 },
}

/// Why a removal stopped; `files` were removed before it did (relative to the scope).
pub(super) struct Stopped {
    pub(super) error: FsError,
    pub(super) files: Vec<String>,
}

impl From<FsError> for Stopped {
    fn from(error: FsError) -> Self {
        Self {
            error,
            files: Vec::new(),
        }
    }
}

/// Removes `rel` beneath `scope`: a file or symlink (never its target), or with `recursive`
/// a directory and everything in it; durable when it returns.
pub(super) fn remove(scope: &Root, rel: &str, recursive: bool) -> Result<Removed, Stopped> {
    let meta = match scope.lstat(rel) {
        Ok(m) => m,
        Err(e) if e.is_not_found() => return Ok(Removed::Gone),
        Err(e) => return Err(e.into()),
    };
    if meta.kind != Kind::Dir {
        scope.remove(rel)?;
        sync_parent(scope, rel)?;
        return Ok(Removed::One);
    }
    if !recursive {
        let why = std::io::Error::other("is a directory (rm -r removes a tree)");
        return Err(FsError::io(rel, why).into());
    }
    let mut files = Vec::new();
    let entries = match remove_tree(scope, rel, &mut files) {
        Ok(n) => n,
        Err(error) => return Err(Stopped { error, files }),
    };
    // One flush for the whole tree rather than one per directory.
    let synced = scope
        .open_dir("")
        .and_then(|top| syncfs(&top).map_err(|e| FsError::io(rel, e)));
    if let Err(error) = synced {
        return Err(Stopped { error, files });
    }
    Ok(Removed::Tree { entries })
}

/// Removes a tree depth first without recursion (a deep tree cannot exhaust the stack): each
/// directory is listed, its files and links removed, its subdirectories visited, and it is
/// removed once empty. Returns the entries removed; `files` collects the files and links.
fn remove_tree(scope: &Root, top: &str, files: &mut Vec<String>) -> Result<u64, FsError> {
    let mut entries = 0u64;
    let mut stack = vec![(top.to_owned(), false)];
    while let Some((dir, emptied)) = stack.pop() {
        if emptied {
            scope.remove(&dir)?;
            entries += 1;
            continue;
        }
        let listing = scope.read_dir(&dir)?;
        if let Some(name) = listing.unusable.first() {
            let why = std::io::Error::other(format!("holds {name:?}, a name that is not UTF-8"));
            return Err(FsError::io(&dir, why));
        }
        stack.push((dir.clone(), true));
        for (name, kind) in listing.entries {
            let child = join(&dir, &name);
            let kind = match kind {
                Some(k) => k,
                None => scope.lstat(&child)?.kind,
            };
            if kind == Kind::Dir {
                stack.push((child, false));
            } else {
                scope.remove(&child)?;
                entries += 1;
                files.push(child);
            }
        }
    }
    Ok(entries)
}

/// Renames `from` (beneath `src`) to `to` (beneath `dest`), refusing to replace anything
/// there (`RENAME_NOREPLACE`); both directories synced when it returns.
pub(super) fn rename(src: &Root, from: &str, dest: &Root, to: &str) -> Result<(), FsError> {
    let (from_dir, from_name) = parent(src, from)?;
    let (to_dir, to_name) = parent(dest, to)?;
    renameat_with(
        &from_dir,
        from_name,
        &to_dir,
        to_name,
        RenameFlags::NOREPLACE,
    )
    .map_err(|e| FsError::io(from, e))?;
    fsync(&to_dir).map_err(|e| FsError::io(to, e))?;
    fsync(&from_dir).map_err(|e| FsError::io(from, e))
}

/// Makes the directory `rel` beneath `scope` (with `parents`, its missing parents too, and an
/// existing directory is fine); durable when it returns.
pub(super) fn mkdir(scope: &Root, rel: &str, parents: bool) -> Result<(), FsError> {
    if parents {
        scope.create_dir_all(rel)?;
        return sync_parent(scope, rel);
    }
    let (dir, name) = parent(scope, rel)?;
    mkdirat(&dir, name, Mode::from_raw_mode(0o755)).map_err(|e| FsError::io(rel, e))?;
    fsync(&dir).map_err(|e| FsError::io(rel, e))
}

/// The parent directory of `rel`, opened beneath `scope`, and the last component.
fn parent<'a>(scope: &Root, rel: &'a str) -> Result<(OwnedFd, &'a str), FsError> {
    let (dir, name) = split_parent(rel);
    if name.is_empty() {
        return Err(FsError::io(rel, rustix::io::Errno::INVAL));
    }
    Ok((scope.open_dir(dir)?, name))
}

fn sync_parent(scope: &Root, rel: &str) -> Result<(), FsError> {
    let dir = scope.open_dir(split_parent(rel).0)?;
    fsync(&dir).map_err(|e| FsError::io(rel, e))
}
