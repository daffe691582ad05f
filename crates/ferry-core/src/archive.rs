//! A tar archive read in place (`put --untar`): its headers are listed once, before anything
//! is sent, and each regular member is then a byte range of the archive that the sender reads
//! like a file. Nothing is unpacked here and no copy of the archive is made.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Component, Path};
use std::sync::Arc;

use crate::error::FsError;
use crate::root::{self, Meta, OFlags, Root};

/// Why an archive cannot be sent as its members.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error(
        "{path}: cannot unpack it in place: {why}; members are read where they lie in the \
         archive, so it must be a regular file (save a piped archive to a file first)"
    )]
    NotSeekable { path: String, why: String },
    #[error("{archive}: member `{member}` refused: {why}; nothing was sent")]
    Refused {
        archive: String,
        member: String,
        why: String,
    },
    #[error("{archive}: not a readable tar archive: {cause}")]
    Malformed { archive: String, cause: String },
}

/// One member to send, by its path below the destination.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub path: String,
    /// Permission bits, as a put keeps them (`& 0o7777`).
    pub mode: u32,
    pub mtime_ns: i64,
    pub kind: MemberKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberKind {
    /// A regular file: `size` bytes at `offset` in the archive. A hard link to an earlier
    /// member is that member's range again, as a put sends a hard-linked file twice.
    File {
        offset: u64,
        size: u64,
    },
    Dir,
    Symlink {
        target: String,
    },
}

/// An archive opened and listed: where it is (reopened by each reader like a walked file),
/// what it was when listed, and its members in archive order.
pub struct Archive {
    pub(crate) dir: Arc<OwnedFd>,
    pub(crate) name: String,
    /// Size and mtime when listed: a member is vouched for only if the archive is unchanged.
    pub(crate) meta: Meta,
    pub display: String,
    pub members: Vec<Member>,
}

impl std::fmt::Debug for Archive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Archive")
            .field("path", &self.display)
            .field("members", &self.members.len())
            .finish()
    }
}

impl Archive {
    /// Opens `path` and lists every member. Any member that could land outside the
    /// destination (absolute, `..`), or that ferry cannot store, refuses the whole archive.
    pub fn open(path: &Path) -> Result<Self, FsError> {
        let display = path.display().to_string();
        let not_seekable = |why: &str| ArchiveError::NotSeekable {
            path: display.clone(),
            why: why.to_owned(),
        };
        if path == Path::new("-") {
            return Err(not_seekable("standard input is a stream").into());
        }
        let io = |e: std::io::Error| FsError::io(display.clone(), e);
        // Resolved first: readers reopen the archive by name in its directory, never
        // following a link, like any walked file.
        let abs = std::fs::canonicalize(path).map_err(io)?;
        let (Some(parent), Some(name)) = (abs.parent(), abs.file_name().and_then(|n| n.to_str()))
        else {
            return Err(io(std::io::Error::other(
                "not a file name ferry can reopen",
            )));
        };
        let dir = Arc::new(Root::open(parent)?.open_dir("")?);
        let fd = root::open_in(&dir, name, OFlags::RDONLY | OFlags::NONBLOCK, 0).map_err(io)?;
        let st = rustix::fs::fstat(&fd).map_err(|e| io(e.into()))?;
        let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
        if kind != rustix::fs::FileType::RegularFile {
            return Err(not_seekable(&format!("it is {}", describe(kind))).into());
        }
        let meta = Meta::from_stat(&st);
        let members = list(&display, File::from(fd))?;
        Ok(Self {
            dir,
            name: name.to_owned(),
            meta,
            display,
            members,
        })
    }
}

fn describe(kind: rustix::fs::FileType) -> &'static str {
    use rustix::fs::FileType as T;
    match kind {
        T::Fifo => "a pipe",
        T::Socket => "a socket",
        T::CharacterDevice => "a character device",
        T::BlockDevice => "a block device",
        T::Directory => "a directory",
        _ => "not a regular file",
    }
}

/// Reads the headers only (member data is seeked over). A path given twice keeps its last
/// member, as `tar -x` leaves it.
fn list(archive: &str, file: File) -> Result<Vec<Member>, ArchiveError> {
    let malformed = |e: std::io::Error| ArchiveError::Malformed {
        archive: archive.to_owned(),
        cause: e.to_string(),
    };
    let mut tar = tar::Archive::new(file);
    let mut members: Vec<Member> = Vec::new();
    let mut at: HashMap<String, usize> = HashMap::new();
    for entry in tar.entries_with_seek().map_err(malformed)? {
        let entry = entry.map_err(malformed)?;
        let raw = entry.path_bytes();
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let refuse = |why: String| ArchiveError::Refused {
            archive: archive.to_owned(),
            member: shown.clone(),
            why,
        };
        let Some(member) = member(&entry, &members, &at).map_err(refuse)? else {
            continue;
        };
        match at.get(&member.path) {
            Some(&i) => members[i] = member,
            None => {
                at.insert(member.path.clone(), members.len());
                members.push(member);
            }
        }
    }
    Ok(members)
}

/// The member an entry stands for; `None` for one that stores nothing (the archive's `./`,
/// a global PAX header). `Err` says why it is refused.
fn member(
    entry: &tar::Entry<'_, File>,
    earlier: &[Member],
    at: &HashMap<String, usize>,
) -> Result<Option<Member>, String> {
    use tar::EntryType as T;
    let header = entry.header();
    let ty = header.entry_type();
    if matches!(ty, T::XGlobalHeader) {
        return Ok(None);
    }
    let path = confined(&entry.path().map_err(|e| e.to_string())?)?;
    let mode = header.mode().map_err(|e| e.to_string())? & 0o7777;
    let mtime = header.mtime().map_err(|e| e.to_string())?;
    let mtime_ns = i64::try_from(mtime)
        .ok()
        .and_then(|s| s.checked_mul(1_000_000_000))
        .ok_or_else(|| format!("mtime {mtime} is out of range"))?;
    if path.is_empty() {
        return match ty {
            T::Directory => Ok(None),
            _ => Err("it names the destination itself".to_owned()),
        };
    }
    let kind = match ty {
        T::Regular | T::Continuous => MemberKind::File {
            offset: entry.raw_file_position(),
            size: entry.size(),
        },
        T::Directory => MemberKind::Dir,
        T::Symlink => {
            let target = entry
                .link_name()
                .map_err(|e| e.to_string())?
                .ok_or("a symlink without a target")?;
            let target = target
                .to_str()
                .ok_or("its link target is not UTF-8")?
                .to_owned();
            MemberKind::Symlink { target }
        }
        T::Link => {
            let target = entry
                .link_name()
                .map_err(|e| e.to_string())?
                .ok_or("a hard link without a target")?;
            let target = confined(&target)?;
            match at.get(&target).map(|&i| &earlier[i].kind) {
                Some(k @ MemberKind::File { .. }) => k.clone(),
                _ => {
                    return Err(format!(
                        "a hard link to `{target}`, which is not an earlier regular member"
                    ))
                }
            }
        }
        T::GNUSparse => return Err("a sparse member; ferry reads members in place".to_owned()),
        other => {
            return Err(format!(
                "{} member; ferry stores files, directories and symlinks",
                kind_name(other)
            ))
        }
    };
    Ok(Some(Member {
        path,
        mode,
        mtime_ns,
        kind,
    }))
}

fn kind_name(ty: tar::EntryType) -> &'static str {
    use tar::EntryType as T;
    match ty {
        T::Char => "a character device",
        T::Block => "a block device",
        T::Fifo => "a FIFO",
        _ => "an unsupported",
    }
}

/// A member's path as a relative path below the destination, `.` components dropped; an
/// absolute path or a `..` is refused, never written outside.
pub fn confined(path: &Path) -> Result<String, String> {
    let mut out: Vec<&str> = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(s) => out.push(s.to_str().ok_or("its path is not UTF-8")?),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(
                    "its path has a `..` component, which would leave the destination".to_owned(),
                )
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(
                    "its path is absolute; members must stay inside the destination".to_owned(),
                )
            }
        }
    }
    Ok(out.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_paths_are_refused_and_dots_dropped() {
        assert_eq!(confined(Path::new("./a/./b/")).unwrap(), "a/b");
        assert!(confined(Path::new("../x")).unwrap_err().contains(".."));
        assert!(confined(Path::new("a/../../x")).unwrap_err().contains(".."));
        assert!(confined(Path::new("/abs"))
            .unwrap_err()
            .contains("absolute"));
    }
}
