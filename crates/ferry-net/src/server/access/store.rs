//! The token file on disk: reading it (re-read when it changes), writing it atomically, and
//! adding and revoking tokens.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::token::{everything, hash_token, AccessError, AccessList, Grant, TokenEntry, TokenFile};

/// Where the server gets its tokens from.
#[derive(Debug)]
pub enum Access {
    Fixed(Arc<AccessList>),
    /// A token file, re-read when anything `stat` says about it changes.
    File {
        path: PathBuf,
        cache: Mutex<Option<(FileStamp, Arc<AccessList>)>>,
    },
}

/// What `stat` says of the token file: a revoke must be seen at the next login, and comparing
/// the modification time alone missed one written within the same timestamp tick (file
/// systems stamp with a clock that advances every few milliseconds). `ferry token` replaces the
/// file (a new inode); an editor may rewrite it in place (size, ctime).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    /// Read so soon after the last change (the same second) that a rewrite in place, of the
    /// same size and within the same tick, would leave every field above as it is: such a
    /// reading is never trusted, and the file is read again at the next login.
    racy: bool,
}

impl FileStamp {
    fn of(meta: &std::fs::Metadata, now: SystemTime) -> Self {
        use std::os::unix::fs::MetadataExt;
        let changed = SystemTime::UNIX_EPOCH
            + Duration::new(
                u64::try_from(meta.ctime()).unwrap_or(0),
                u32::try_from(meta.ctime_nsec()).unwrap_or(0),
            );
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
            // A clock set back (now before the change) counts as racy too.
            racy: !matches!(now.duration_since(changed), Ok(d) if d >= Self::SETTLE),
        }
    }

    /// Far more than any file system's timestamp tick.
    const SETTLE: Duration = Duration::from_secs(1);

    /// Whether a list read with stamp `self` still stands for a file that now has `now`.
    fn still_valid(&self, now: &Self) -> bool {
        !self.racy
            && (self.dev, self.ino, self.size, self.mtime, self.ctime)
                == (now.dev, now.ino, now.size, now.mtime, now.ctime)
    }
}

impl Access {
    pub fn file(path: impl Into<PathBuf>) -> Self {
        Self::File {
            path: path.into(),
            cache: Mutex::new(None),
        }
    }

    /// The current list. A file that has become unreadable or invalid is an error (every login
    /// fails, and the server logs why) rather than a fallback to the last good list, so a
    /// revoked token cannot keep working because of a typo elsewhere in the file.
    pub fn current(&self) -> Result<Arc<AccessList>, AccessError> {
        match self {
            Self::Fixed(l) => Ok(l.clone()),
            Self::File { path, cache } => {
                let stamp = std::fs::metadata(path)
                    .map(|m| FileStamp::of(&m, SystemTime::now()))
                    .map_err(|source| AccessError::Io {
                        path: path.clone(),
                        source,
                    })?;
                let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
                if let Some((seen, list)) = c.as_ref() {
                    if seen.still_valid(&stamp) {
                        return Ok(list.clone());
                    }
                }
                // Stamped before reading: a change during the read shows as a new stamp next
                // time, never as an old stamp on new contents.
                let list = Arc::new(AccessList::from_file(&load(path)?)?);
                *c = Some((stamp, list.clone()));
                Ok(list)
            }
        }
    }
}

/// Reads a token file; a missing file is an empty list.
pub fn load(path: &Path) -> Result<TokenFile, AccessError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(TokenFile::default()),
        Err(source) => {
            return Err(AccessError::Io {
                path: path.to_owned(),
                source,
            })
        }
    };
    toml::from_str(&text).map_err(|e| AccessError::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

/// Writes a token file atomically (temp file, fsync, rename), mode 0600.
pub fn save(path: &Path, file: &TokenFile) -> Result<(), AccessError> {
    let io = |source| AccessError::Io {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let text = format!(
        "# ferry tokens: managed by `ferry token add|list|revoke`. Only hashes are stored.\n{}",
        toml::to_string(file).map_err(|e| AccessError::Invalid(e.to_string()))?
    );
    let tmp = path.with_extension("toml.tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io)?;
    f.write_all(text.as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    Ok(())
}

/// A new random token: 24 bytes from the OS, hex.
pub fn new_token() -> String {
    let mut b = [0u8; 24];
    getrandom::fill(&mut b).expect("the OS random source works");
    ferry_core::digest::hex(&b)
}

/// Adds a token named `name` to the file and returns its secret (shown once, never stored).
pub fn add_token(
    path: &Path,
    name: &str,
    read: Vec<String>,
    write: Vec<String>,
    read_only: bool,
) -> Result<String, AccessError> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
    {
        return Err(AccessError::Invalid(format!(
            "`{name}`: token names are letters, digits and - _ . @"
        )));
    }
    let mut file = load(path)?;
    if file.tokens.iter().any(|t| t.name == name) {
        return Err(AccessError::Exists(name.to_owned()));
    }
    let token = new_token();
    let entry = TokenEntry {
        name: name.to_owned(),
        sha256: ferry_core::digest::hex(&hash_token(&token)),
        read: if read.is_empty() { everything() } else { read },
        write: if write.is_empty() {
            everything()
        } else {
            write
        },
        read_only,
    };
    // Refuse a bad prefix now rather than at the first login.
    Grant::from_entry(&entry)?;
    file.tokens.push(entry);
    save(path, &file)?;
    Ok(token)
}

pub fn revoke_token(path: &Path, name: &str) -> Result<(), AccessError> {
    let mut file = load(path)?;
    let before = file.tokens.len();
    file.tokens.retain(|t| t.name != name);
    if file.tokens.len() == before {
        return Err(AccessError::NoSuchToken(name.to_owned()));
    }
    save(path, &file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_authenticate_revoke_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let t1 = add_token(&path, "alice", vec!["/a".into()], vec![], true).unwrap();
        let t2 = add_token(&path, "bob", vec![], vec![], false).unwrap();
        assert!(matches!(
            add_token(&path, "alice", vec![], vec![], false),
            Err(AccessError::Exists(_))
        ));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&t1) && !text.contains(&t2), "secrets stored");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0);
        let access = Access::file(&path);
        let list = access.current().unwrap();
        let alice = list.authenticate(&t1).unwrap();
        assert_eq!(alice.name, "alice");
        assert!(alice.may_read("a/b") && !alice.may_read("b") && !alice.may_write("a"));
        assert_eq!(list.authenticate(&t2).unwrap().name, "bob");
        assert!(list.authenticate("nope").is_none());
        // Revocation is seen at once, without a restart.
        revoke_token(&path, "alice").unwrap();
        assert!(access.current().unwrap().authenticate(&t1).is_none());
        assert!(access.current().unwrap().authenticate(&t2).is_some());
        assert!(matches!(
            revoke_token(&path, "alice"),
            Err(AccessError::NoSuchToken(_))
        ));
    }

    /// A revoke within the same timestamp tick as the reading before it: the file's
    /// modification time is put back to exactly what the server saw (as a coarse clock would
    /// leave it), and the revoke is still seen, by the file's new inode.
    #[test]
    fn revoke_in_the_same_tick_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let t1 = add_token(&path, "alice", vec![], vec![], false).unwrap();
        let t2 = add_token(&path, "bob", vec![], vec![], false).unwrap();
        let access = Access::file(&path);
        assert!(access.current().unwrap().authenticate(&t1).is_some());
        let seen = std::fs::metadata(&path).unwrap().modified().unwrap();
        revoke_token(&path, "alice").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(seen)
            .unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().modified().unwrap(), seen);
        let list = access.current().unwrap();
        assert!(
            list.authenticate(&t1).is_none(),
            "revoked token still works"
        );
        assert!(list.authenticate(&t2).is_some());
    }

    /// An edit in place that keeps the size (another token's hash in its place) is seen too,
    /// also when the modification time is put back.
    #[test]
    fn edit_in_place_of_the_same_size_is_seen() {
        use std::io::{Seek, Write};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let t1 = add_token(&path, "alice", vec![], vec![], false).unwrap();
        let access = Access::file(&path);
        assert!(access.current().unwrap().authenticate(&t1).is_some());
        let meta = std::fs::metadata(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let other = ferry_core::digest::hex(&hash_token("another token"));
        let edited = text.replace(&ferry_core::digest::hex(&hash_token(&t1)), &other);
        assert_eq!(edited.len(), text.len());
        let mut f = std::fs::File::options().write(true).open(&path).unwrap();
        f.rewind().unwrap();
        f.write_all(edited.as_bytes()).unwrap();
        f.set_modified(meta.modified().unwrap()).unwrap();
        drop(f);
        let list = access.current().unwrap();
        assert!(list.authenticate(&t1).is_none(), "the edit was not seen");
        assert!(list.authenticate("another token").is_some());
    }

    /// The stamp's fields each count, and a reading taken within a second of the file's last
    /// change is never trusted: an edit in the same tick would leave the stamp as it was.
    #[test]
    fn stamps_compare_every_field_and_distrust_fresh_readings() {
        let settled = FileStamp {
            dev: 1,
            ino: 2,
            size: 3,
            mtime: (4, 5),
            ctime: (6, 7),
            racy: false,
        };
        assert!(settled.still_valid(&settled));
        for changed in [
            FileStamp { dev: 9, ..settled },
            FileStamp { ino: 9, ..settled },
            FileStamp { size: 9, ..settled },
            FileStamp {
                mtime: (4, 9),
                ..settled
            },
            FileStamp {
                ctime: (6, 9),
                ..settled
            },
        ] {
            assert!(!settled.still_valid(&changed), "{changed:?}");
        }
        let fresh = FileStamp {
            racy: true,
            ..settled
        };
        assert!(!fresh.still_valid(&settled));

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let now = SystemTime::now();
        assert!(FileStamp::of(&meta, now).racy);
        assert!(!FileStamp::of(&meta, now + Duration::from_secs(2)).racy);
        // A clock set back before the change: not trusted either.
        assert!(FileStamp::of(&meta, now - Duration::from_secs(3600)).racy);
    }

    #[test]
    fn broken_token_file_is_an_error_not_a_fallback() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        std::fs::write(&path, "[[token]]\nname = 1\n").unwrap();
        let e = Access::file(&path).current().unwrap_err().to_string();
        assert!(e.contains("tokens.toml"), "{e}");
    }
}
