//! A directory that all file operations of a transfer are confined to.
//!
//! Paths are never resolved by string: every operation opens the parent directory with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` relative to the root's fd and then acts on
//! the last component relative to that parent, which the kernel does not follow. A `..`, an
//! absolute symlink, or a symlink swapped in mid-transfer that leads outside therefore fails with
//! `EXDEV` instead of touching anything outside the root. Symlinks that stay inside are followed,
//! as `cp` would.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

pub use rustix::fs::OFlags;
use rustix::fs::{self as rfs, AtFlags, FileType, Mode, ResolveFlags, Timespec, Timestamps};

use crate::error::FsError;
use crate::path::{split_parent, validate_rel};

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS);

/// What a path names, without following a final symlink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

/// `lstat` of an entry, reduced to what ferry transfers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    pub kind: Kind,
    pub size: u64,
    pub mode: u32,
    pub mtime_ns: i64,
}

impl Meta {
    // The casts are no-ops on x86_64 but not on every target rustix supports.
    #[allow(clippy::unnecessary_cast)]
    pub fn from_stat(st: &rfs::Stat) -> Self {
        let kind = match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => Kind::File,
            FileType::Directory => Kind::Dir,
            FileType::Symlink => Kind::Symlink,
            _ => Kind::Other,
        };
        Self {
            kind,
            size: st.st_size as u64,
            mode: st.st_mode & 0o7777,
            mtime_ns: (st.st_mtime as i64)
                .saturating_mul(1_000_000_000)
                .saturating_add(st.st_mtime_nsec as i64),
        }
    }
}

/// Converts nanoseconds since the epoch into the kernel's timestamp pair (atime = mtime).
pub fn timestamps(mtime_ns: i64) -> Timestamps {
    let ts = Timespec {
        tv_sec: mtime_ns.div_euclid(1_000_000_000),
        tv_nsec: mtime_ns.rem_euclid(1_000_000_000) as _,
    };
    Timestamps {
        last_access: ts,
        last_modification: ts,
    }
}

/// An open directory that confines every relative path given to it.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
    path: PathBuf,
}

impl Root {
    /// Opens `path` (which must be a directory) as a root.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, FsError> {
        let path = path.as_ref();
        let fd = rfs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| FsError::io(path.display().to_string(), e))?;
        Ok(Self {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// Where this root is, for messages only; never used to resolve anything.
    pub fn display_path(&self) -> &Path {
        &self.path
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Opens a sub-directory as a new root confined to it.
    pub fn subroot(&self, rel: &str) -> Result<Self, FsError> {
        let fd = self.open_dir(rel)?;
        Ok(Self {
            fd,
            path: self.path.join(rel),
        })
    }

    /// Opens `prefix` (a token's scope) as a new root, refusing a symlink anywhere in it
    /// (`RESOLVE_NO_SYMLINKS`): a client that may write somewhere could otherwise plant a link
    /// where another scope begins and move that scope. With `create`, a missing prefix is made
    /// first (`mkdir -p`, as a put to it would). Every path of an operation is then resolved
    /// beneath this directory, so a symlink inside the scope cannot lead out of it.
    pub fn scope(&self, prefix: &str, create: bool) -> Result<Self, FsError> {
        validate_rel(prefix)?;
        if prefix.is_empty() {
            return self.subroot("");
        }
        let open = || {
            rfs::openat2(
                &self.fd,
                prefix,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
                RESOLVE | ResolveFlags::NO_SYMLINKS,
            )
        };
        let fd = match open() {
            Err(rustix::io::Errno::NOENT) if create => {
                // Made one component at a time from parents opened without following any link,
                // so a missing scope is never created somewhere a link points to.
                for (i, _) in prefix
                    .match_indices('/')
                    .chain(std::iter::once((prefix.len(), "")))
                {
                    let (parent, name) = split_parent(&prefix[..i]);
                    let dir = rfs::openat2(
                        &self.fd,
                        if parent.is_empty() { "." } else { parent },
                        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                        Mode::empty(),
                        RESOLVE | ResolveFlags::NO_SYMLINKS,
                    )
                    .map_err(|e| FsError::io(parent, e))?;
                    match rfs::mkdirat(&dir, name, Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                        Err(e) => return Err(FsError::io(&prefix[..i], e)),
                    }
                }
                open()
            }
            r => r,
        }
        .map_err(|e| match e {
            rustix::io::Errno::LOOP => FsError::io(
                prefix,
                std::io::Error::other(
                    "a symlink in a token's scope: scopes must be real directories",
                ),
            ),
            e => FsError::io(prefix, e),
        })?;
        Ok(Self {
            fd,
            path: self.path.join(prefix),
        })
    }

    /// Opens a directory beneath the root (the root itself for `""`).
    pub fn open_dir(&self, rel: &str) -> Result<OwnedFd, FsError> {
        validate_rel(rel)?;
        let p = if rel.is_empty() { "." } else { rel };
        rfs::openat2(
            &self.fd,
            p,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
        .map_err(|e| FsError::io(rel, e))
    }

    /// Opens the parent of `rel` and returns it with the final component.
    fn parent<'a>(&self, rel: &'a str) -> Result<(OwnedFd, &'a str), FsError> {
        validate_rel(rel)?;
        let (parent, name) = split_parent(rel);
        if name.is_empty() {
            return Err(FsError::io(rel, rustix::io::Errno::INVAL));
        }
        Ok((self.open_dir(parent)?, name))
    }

    /// `lstat` beneath the root: a final symlink is reported, not followed.
    pub fn lstat(&self, rel: &str) -> Result<Meta, FsError> {
        if rel.is_empty() {
            let st = rfs::fstat(&self.fd).map_err(|e| FsError::io(rel, e))?;
            return Ok(Meta::from_stat(&st));
        }
        let (dir, name) = self.parent(rel)?;
        let st =
            rfs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| FsError::io(rel, e))?;
        Ok(Meta::from_stat(&st))
    }

    /// Opens a regular file for reading. A final symlink is refused (`O_NOFOLLOW`), so a link
    /// swapped in after the walk saw a file cannot redirect the read.
    pub fn open_read(&self, rel: &str) -> Result<File, FsError> {
        validate_rel(rel)?;
        let fd = rfs::openat2(
            &self.fd,
            rel,
            // NONBLOCK: a FIFO swapped in would otherwise block the open until a writer came.
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
        .map_err(|e| FsError::io(rel, e))?;
        Ok(File::from(fd))
    }

    /// Reads a symlink's target.
    pub fn read_link(&self, rel: &str) -> Result<String, FsError> {
        let (dir, name) = self.parent(rel)?;
        let target = rfs::readlinkat(&dir, name, Vec::new()).map_err(|e| FsError::io(rel, e))?;
        target
            .into_string()
            .map_err(|_| FsError::io(rel, std::io::Error::other("symlink target is not UTF-8")))
    }

    /// Lists a directory's entries (names only, without `.` and `..`), sorted for determinism.
    pub fn read_dir(&self, rel: &str) -> Result<Listing, FsError> {
        let fd = self.open_dir(rel)?;
        list_dir(&fd).map_err(|e| FsError::io(rel, e))
    }

    /// Creates `rel` and any missing parents, like `mkdir -p`, each step confined.
    pub fn create_dir_all(&self, rel: &str) -> Result<(), FsError> {
        self.make_dir_all(rel).map(|_| ())
    }

    /// [`Self::create_dir_all`], and whether this call made `rel` itself (its `mkdir`
    /// succeeded here, so it was empty then): a receiver need not look for a file in the way
    /// in a directory it made.
    pub fn make_dir_all(&self, rel: &str) -> Result<bool, FsError> {
        validate_rel(rel)?;
        if rel.is_empty() {
            return Ok(false);
        }
        // Fast path: most calls find the directory already there.
        if self.open_dir(rel).is_ok() {
            return Ok(false);
        }
        let mut made = false;
        let mut done = 0;
        for (i, _) in rel
            .match_indices('/')
            .chain(std::iter::once((rel.len(), "")))
        {
            let prefix = &rel[..i];
            let (dir, name) = self.parent(prefix)?;
            match rfs::mkdirat(&dir, name, Mode::from_raw_mode(0o755)) {
                Ok(()) => made = true,
                Err(rustix::io::Errno::EXIST) => {
                    made = false;
                    // Must be a directory (or a link to one inside the root).
                    self.open_dir(prefix)?;
                }
                Err(e) => return Err(FsError::io(prefix, e)),
            }
            done = i;
        }
        debug_assert_eq!(done, rel.len());
        Ok(made)
    }

    /// Creates a new file `name` in directory `dir_rel` with `O_EXCL`, readable only by the
    /// owner until it is finished.
    pub fn create_new_in(&self, dir: &OwnedFd, dir_rel: &str, name: &str) -> Result<File, FsError> {
        let fd = rfs::openat2(
            dir,
            name,
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
            RESOLVE,
        )
        .map_err(|e| FsError::io(crate::path::join(dir_rel, name), e))?;
        Ok(File::from(fd))
    }

    /// Unlinks a file (not a directory) beneath the root; missing is fine.
    pub fn remove_file(&self, rel: &str) -> Result<(), FsError> {
        let (dir, name) = self.parent(rel)?;
        match rfs::unlinkat(&dir, name, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(FsError::io(rel, e)),
        }
    }

    /// Removes a file, a symlink (never its target) or an empty directory beneath the root,
    /// for a sync's `--delete`; missing is fine. The root itself is not removed: its path is
    /// `rel` = "" and [`Self::parent`] refuses that.
    pub fn remove(&self, rel: &str) -> Result<(), FsError> {
        let (dir, name) = self.parent(rel)?;
        let gone = |r: Result<(), rustix::io::Errno>| match r {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(FsError::io(rel, e)),
        };
        match rfs::unlinkat(&dir, name, AtFlags::empty()) {
            Err(rustix::io::Errno::ISDIR) => gone(rfs::unlinkat(&dir, name, AtFlags::REMOVEDIR)),
            other => gone(other),
        }
    }

    /// Sets mode and mtime of a directory. A final symlink is not followed (`O_NOFOLLOW`): a
    /// link that stands where the sender had a directory is refused, never the directory it
    /// points to changed.
    pub fn set_dir_meta(&self, rel: &str, mode: u32, mtime_ns: i64) -> Result<(), FsError> {
        validate_rel(rel)?;
        let p = if rel.is_empty() { "." } else { rel };
        let fd = rfs::openat2(
            &self.fd,
            p,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
        .map_err(|e| FsError::io(rel, e))?;
        rfs::fchmod(&fd, Mode::from_raw_mode(mode & 0o7777)).map_err(|e| FsError::io(rel, e))?;
        rfs::futimens(&fd, &timestamps(mtime_ns)).map_err(|e| FsError::io(rel, e))?;
        Ok(())
    }
}

/// `lstat` of a single name inside an open directory.
pub fn lstat_in(dir: &OwnedFd, name: &str) -> std::io::Result<Meta> {
    let st = rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(Meta::from_stat(&st))
}

/// Opens a single name inside an open directory without following a symlink there. With
/// `name` a plain component and `dir` already beneath the root, this is as confined as
/// `openat2(RESOLVE_BENEATH)` and much cheaper than walking the whole path again.
pub fn open_in(dir: &OwnedFd, name: &str, flags: OFlags, mode: u32) -> std::io::Result<OwnedFd> {
    debug_assert!(!name.contains('/') && name != ".." && name != ".");
    rfs::openat(
        dir,
        name,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
    )
    .map_err(Into::into)
}

/// A directory's entries: UTF-8 names (sorted) with their type when the file system reports
/// it, and, apart, the names that cannot travel because the wire carries UTF-8 only.
#[derive(Debug, Default)]
pub struct Listing {
    pub entries: Vec<(String, Option<Kind>)>,
    /// Non-UTF-8 names, lossily converted for messages.
    pub unusable: Vec<String>,
}

/// Lists an open directory. One unusable name does not hide its siblings.
pub fn list_dir(dir: &OwnedFd) -> std::io::Result<Listing> {
    let dup = rustix::io::dup(dir)?;
    let mut d = rfs::Dir::new(dup)?;
    let mut out = Vec::new();
    let mut unusable = Vec::new();
    while let Some(ent) = d.read() {
        let ent = ent?;
        let name = ent.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let Ok(name) = std::str::from_utf8(name) else {
            unusable.push(String::from_utf8_lossy(name).into_owned());
            continue;
        };
        let kind = match ent.file_type() {
            FileType::RegularFile => Some(Kind::File),
            FileType::Directory => Some(Kind::Dir),
            FileType::Symlink => Some(Kind::Symlink),
            FileType::Unknown => None,
            _ => Some(Kind::Other),
        };
        out.push((name.to_owned(), kind));
    }
    out.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    Ok(Listing {
        entries: out,
        unusable,
    })
}

/// Renames `from` to `to` within one directory; with `replace` false an existing `to` is kept
/// and `EEXIST` returned (`RENAME_NOREPLACE`), so a file that appeared meanwhile is never lost.
pub fn rename_in(dir: &OwnedFd, from: &str, to: &str, replace: bool) -> std::io::Result<()> {
    let flags = if replace {
        rfs::RenameFlags::empty()
    } else {
        rfs::RenameFlags::NOREPLACE
    };
    rfs::renameat_with(dir, from, dir, to, flags).map_err(Into::into)
}

/// Creates an unnamed file in `dir` (`O_TMPFILE`), for [`link_unnamed`] to give it its name
/// once complete and durable: no hidden name to create, rename away or leave behind after a
/// crash (an unlinked inode vanishes). Refused where the file system or kernel lacks it
/// (`EOPNOTSUPP`, `EISDIR`, `EINVAL`) and where `/proc` is missing, which the link needs.
pub fn open_unnamed(dir: &OwnedFd, mode: u32) -> std::io::Result<OwnedFd> {
    if !proc_fd_links() {
        return Err(std::io::Error::from(std::io::ErrorKind::Unsupported));
    }
    rfs::openat(
        dir,
        ".",
        OFlags::RDWR | OFlags::TMPFILE | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
    )
    .map_err(Into::into)
}

/// Gives the unnamed file `file` (from [`open_unnamed`]) the name `name` in `dir`. An existing
/// `name` is kept and `EEXIST` returned, as [`rename_in`] does without `replace`.
///
/// By the descriptor itself (`linkat(AT_EMPTY_PATH)`) where the kernel lets this process
/// (`CAP_DAC_READ_SEARCH`, or since Linux 6.10 the file's opener), else through
/// `/proc/self/fd`, whose path walk costs a few microseconds per file; which one works is
/// learnt on the first link.
pub fn link_unnamed(file: BorrowedFd<'_>, dir: &OwnedFd, name: &str) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicBool, Ordering};
    /// Cleared once the kernel refused `AT_EMPTY_PATH` (`ENOENT`, its answer without the right).
    static EMPTY_PATH: AtomicBool = AtomicBool::new(true);
    debug_assert!(!name.contains('/') && name != ".." && name != ".");
    if EMPTY_PATH.load(Ordering::Relaxed) {
        match rfs::linkat(file, "", dir, name, AtFlags::EMPTY_PATH) {
            Err(rustix::io::Errno::NOENT) => EMPTY_PATH.store(false, Ordering::Relaxed),
            r => return r.map_err(Into::into),
        }
    }
    let proc = format!("/proc/self/fd/{}", file.as_raw_fd());
    rfs::linkat(rfs::CWD, proc.as_str(), dir, name, AtFlags::SYMLINK_FOLLOW).map_err(Into::into)
}

/// Whether this process can name its descriptors through `/proc/self/fd` (checked once).
fn proc_fd_links() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| Path::new("/proc/self/fd").is_dir())
}

/// A reference to whatever `name` in `dir` is now, to be held across a rename that replaces it.
///
/// Replacing a file frees its blocks inside the `rename` when that drops its last link: 0.16–0.21 s
/// for 1 GiB on tmpfs here, more the larger the file. The rename is on the way to
/// telling the client its file is done; with this descriptor open the replaced inode lives until
/// it is closed, so the freeing moves to [`close_later`]. `O_PATH` opens no file for I/O: a
/// FIFO or device in the way is not touched. `None` when nothing is there (or it cannot be
/// opened: the rename then frees it as before).
pub fn hold(dir: &OwnedFd, name: &str) -> Option<OwnedFd> {
    rfs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()
}

/// Closes descriptors on a background thread, so that freeing the files they kept alive (see
/// [`hold`]) is not on the caller's path. One thread per process, started on first use. At most
/// [`MAX_HELD`] descriptors wait for it: beyond that (the thread busy freeing a huge file while
/// batches of thousands of replaced files come in) they close on the caller's thread, as without
/// it, so replaced files can neither exhaust the process's descriptors nor block a finalizer.
pub fn close_later(fds: Vec<OwnedFd>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc::{channel, Sender};
    use std::sync::OnceLock;
    // The queue needs no bound of its own: `QUEUED` bounds what waits in it.
    static REAPER: OnceLock<Option<Sender<Vec<OwnedFd>>>> = OnceLock::new();
    static QUEUED: AtomicUsize = AtomicUsize::new(0);
    let n = fds.len();
    if n == 0 || QUEUED.fetch_add(n, Ordering::AcqRel) + n > MAX_HELD {
        QUEUED.fetch_sub(n, Ordering::AcqRel);
        return;
    }
    let tx = REAPER.get_or_init(|| {
        let (tx, rx) = channel::<Vec<OwnedFd>>();
        std::thread::Builder::new()
            .name("ferry-reaper".into())
            .spawn(move || {
                for batch in rx {
                    let n = batch.len();
                    drop(batch);
                    QUEUED.fetch_sub(n, Ordering::AcqRel);
                }
            })
            .ok()
            .map(|_| tx)
    });
    if !matches!(tx.as_ref().map(|tx| tx.send(fds)), Some(Ok(()))) {
        // No thread: the descriptors came back and close here.
        QUEUED.fetch_sub(n, Ordering::AcqRel);
    }
}

/// Most descriptors [`close_later`] keeps waiting for its thread.
pub const MAX_HELD: usize = 1024;

/// Creates a symlink `name` in `dir`.
pub fn symlink_in(dir: &OwnedFd, name: &str, target: &str) -> std::io::Result<()> {
    rfs::symlinkat(target, dir, name).map_err(Into::into)
}

/// Sets a symlink's own mtime.
pub fn set_link_mtime(dir: &OwnedFd, name: &str, mtime_ns: i64) -> std::io::Result<()> {
    rfs::utimensat(dir, name, &timestamps(mtime_ns), AtFlags::SYMLINK_NOFOLLOW).map_err(Into::into)
}

/// Sets mode and mtime on an open file. `may_have_mode`: it was created with the mode's
/// permission bits, so it may have the mode already (unless the umask or a default ACL took
/// some): looked at first, as a `fstat` changes nothing and costs far less than a `fchmod`,
/// which dirties the inode (on ext4 a journal handle of its own).
pub fn set_file_meta(
    file: &File,
    mode: u32,
    mtime_ns: i64,
    may_have_mode: bool,
) -> std::io::Result<()> {
    let mode = mode & 0o7777;
    let has = may_have_mode && rfs::fstat(file)?.st_mode & 0o7777 == mode;
    if !has {
        rfs::fchmod(file, Mode::from_raw_mode(mode))?;
    }
    rfs::futimens(file, &timestamps(mtime_ns))?;
    Ok(())
}

/// Flushes the whole file system holding `fd`: one call makes a batch of small files durable
/// instead of one fsync latency per file.
pub fn syncfs(fd: impl AsFd) -> std::io::Result<()> {
    rfs::syncfs(fd).map_err(Into::into)
}

pub fn fsync(fd: impl AsFd) -> std::io::Result<()> {
    rfs::fsync(fd).map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;

    #[test]
    fn a_held_file_outlives_its_replacement_until_closed() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("dest"), vec![1u8; 100_000]).unwrap();
        std::fs::write(t.path().join("temp"), b"new").unwrap();
        std::os::unix::fs::symlink("dest", t.path().join("link")).unwrap();
        let dir: OwnedFd = File::open(t.path()).unwrap().into();
        assert!(hold(&dir, "absent").is_none());
        // A symlink is held as itself, not followed.
        let link = hold(&dir, "link").unwrap();
        assert_eq!(rfs::fstat(&link).unwrap().st_size, 4);
        let old = hold(&dir, "dest").unwrap();
        rename_in(&dir, "temp", "dest", true).unwrap();
        assert_eq!(std::fs::read(t.path().join("dest")).unwrap(), b"new");
        // The replaced inode is unlinked but alive: its blocks are freed when `old` closes.
        let st = rfs::fstat(&old).unwrap();
        assert_eq!((st.st_nlink, st.st_size), (0, 100_000));
        close_later(vec![old, link]);
        close_later(Vec::new());
    }

    #[test]
    fn an_unnamed_file_gets_its_name_only_where_none_is() {
        let t = tempfile::tempdir().unwrap();
        let dir: OwnedFd = File::open(t.path()).unwrap().into();
        let names = || -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(t.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            v.sort();
            v
        };
        let Ok(fd) = open_unnamed(&dir, 0o600) else {
            // A file system without O_TMPFILE: the receiver falls back to a temporary name.
            return;
        };
        File::from(rustix::io::dup(&fd).unwrap())
            .write_all_at(b"new", 0)
            .unwrap();
        assert!(names().is_empty(), "an unnamed file has no entry");
        std::fs::write(t.path().join("taken"), b"old").unwrap();
        let e = link_unnamed(fd.as_fd(), &dir, "taken").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{e}");
        assert_eq!(std::fs::read(t.path().join("taken")).unwrap(), b"old");
        link_unnamed(fd.as_fd(), &dir, "free").unwrap();
        assert_eq!(std::fs::read(t.path().join("free")).unwrap(), b"new");
        assert_eq!(names(), ["free", "taken"]);
    }

    #[test]
    fn a_scope_is_a_real_directory_and_confines_beneath_itself() {
        let outer = tempfile::tempdir().unwrap();
        let root_dir = outer.path().join("root");
        std::fs::create_dir_all(root_dir.join("priv")).unwrap();
        std::fs::create_dir_all(root_dir.join("in")).unwrap();
        std::os::unix::fs::symlink("../priv", root_dir.join("in/esc")).unwrap();
        std::os::unix::fs::symlink("priv", root_dir.join("lnk")).unwrap();
        let root = Root::open(&root_dir).unwrap();
        // A missing scope is made when asked, component by component.
        root.scope("new/a/b", true).unwrap();
        assert!(root_dir.join("new/a/b").is_dir());
        assert!(root.scope("absent", false).is_err());
        // No link anywhere in the prefix, and nothing made through one.
        let e = root.scope("lnk", false).unwrap_err().to_string();
        assert!(e.contains("symlink"), "{e}");
        assert!(root.scope("lnk/x", true).is_err());
        assert!(root.scope("in/esc/x", true).is_err());
        assert!(!root_dir.join("priv/x").exists());
        // Beneath the scope, a link out of it is refused.
        let scope = root.scope("in", false).unwrap();
        assert!(scope.create_dir_all("esc/y").is_err());
        assert!(scope.read_dir("esc").is_err());
        assert!(!root_dir.join("priv/y").exists());
        // Directory metadata is never set through a final link.
        assert!(root.set_dir_meta("lnk", 0o700, 0).is_err());
        let mode = std::fs::metadata(root_dir.join("priv")).unwrap();
        assert_ne!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o700
        );
    }

    #[test]
    fn confines_symlinks_and_dotdot() {
        let outer = tempfile::tempdir().unwrap();
        let root_dir = outer.path().join("root");
        std::fs::create_dir(&root_dir).unwrap();
        std::fs::write(outer.path().join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink("../secret", root_dir.join("up")).unwrap();
        std::os::unix::fs::symlink("/etc", root_dir.join("abs")).unwrap();
        std::os::unix::fs::symlink("..", root_dir.join("dotdot")).unwrap();
        let root = Root::open(&root_dir).unwrap();
        assert!(root.open_read("up").is_err());
        assert!(matches!(
            root.open_read("abs/passwd"),
            Err(FsError::Escapes { .. })
        ));
        assert!(root.open_read("dotdot/secret").is_err());
        assert!(root.create_dir_all("dotdot/x").is_err());
        assert!(root.create_dir_all("abs/x").is_err());
        assert!(!outer.path().join("x").exists());
        assert!(root.make_dir_all("a/b/c").unwrap(), "made here");
        assert!(root_dir.join("a/b/c").is_dir());
        assert!(!root.make_dir_all("a/b/c").unwrap(), "there already");
        assert!(
            !root.make_dir_all("a/b").unwrap(),
            "made as a parent, not asked for"
        );
        assert!(root.make_dir_all("a/b/d").unwrap());
        assert_eq!(root.lstat("up").unwrap().kind, Kind::Symlink);
    }
}
