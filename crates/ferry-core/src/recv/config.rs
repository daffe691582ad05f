//! What a receiver is given (where files go, the session's settings) and what it holds a peer
//! to: the limits of a session and the errors that end it.

use ferry_proto::{ChecksumAlgo, ExistingPolicy, FileId};

use super::policy::{Links, Modes};
use crate::error::FsError;
use crate::path::{join, validate_rel};
use crate::root::{self, Root};

/// Where received entries go: `base` (a directory under `root`), with the transfer's top entry
/// optionally renamed (as `cp src dst` does when `dst` is not a directory).
#[derive(Debug)]
pub struct Destination {
    pub root: Root,
    pub base: String,
    pub rename_top: Option<String>,
}

impl Destination {
    /// Maps a wire path to a path under the root, refusing anything that is not plainly relative.
    pub fn map(&self, wire: &str) -> Result<String, FsError> {
        validate_rel(wire)?;
        if wire.is_empty() {
            return Err(FsError::Path(crate::error::PathError::EmptyComponent(
                String::new(),
            )));
        }
        let mapped = match &self.rename_top {
            Some(top) => match wire.split_once('/') {
                Some((_, rest)) => join(top, rest),
                None => top.clone(),
            },
            None => wire.to_owned(),
        };
        Ok(join(&self.base, &mapped))
    }
}

#[derive(Clone, Debug)]
pub struct ReceiverConfig {
    pub existing: ExistingPolicy,
    pub checksum: ChecksumAlgo,
    /// Distinguishes this transfer's temporary files from any other's.
    pub tag: u64,
    /// The session's block size: files larger than one block are journaled for resume, and a
    /// partial copy is resumed only if it was written with the same block size.
    pub block_size: u32,
    /// Which permission bits are stored.
    pub modes: Modes,
    /// Which symlinks are made.
    pub links: Links,
}

/// A problem that ends the whole transfer, not just one file.
#[derive(Debug, thiserror::Error)]
pub enum RecvError {
    #[error("peer sent a frame that does not belong on a data connection")]
    UnexpectedFrame,
    #[error("peer sent inconsistent metadata for file {0:?}")]
    Inconsistent(FileId),
    #[error("peer sent data for file {0:?}, which it never offered")]
    Unoffered(FileId),
    #[error(
        "peer sent a block of {len} bytes for file {file:?}; this session's block size is {max}"
    )]
    BlockTooLarge { file: FileId, len: u64, max: u32 },
    #[error(
        "peer offered more files ahead of their data than a session may hold ({files} files, \
         {bytes} bytes of paths; at most {MAX_OPEN_OFFERS} files and {MAX_OPEN_OFFER_BYTES} bytes)"
    )]
    TooManyOffers { files: u64, bytes: u64 },
}

/// Offered files a receiver holds at once that are not stored, skipped or failed yet. A sender
/// offers at most about 16,600 files ahead of its data (its walk queue, one offer batch, the
/// files its readers hold): this is four times that, so a peer that offers without sending
/// cannot make a session hold paths without bound (issue 35: 120,064 offers with 3 KB paths
/// took a server from 193 to 833 MB).
pub const MAX_OPEN_OFFERS: u64 = 65_536;

/// Bytes the open offers of a session may charge: each its path plus [`OFFER_COST`]. 16,640
/// offers with paths of the longest kind (4,096 bytes) charge 72 MB.
pub const MAX_OPEN_OFFER_BYTES: u64 = 96 << 20;

/// What an open offer costs beyond its path: its entry and its writing state.
pub const OFFER_COST: u64 = 256;

/// Error messages a receiver keeps for its report; more are counted, not kept.
pub const MAX_KEPT_ERRORS: usize = 1_000;

/// Creates and removes a hidden file in the destination directory, so that a destination that
/// cannot be written at all (read-only, no permission) fails the transfer once, naming the
/// directory, instead of failing every file on its own.
pub(super) fn check_writable(dest: &Destination, tag: u64) -> Result<(), FsError> {
    let shown = || match dest.base.as_str() {
        "" => dest.root.display_path().display().to_string(),
        base => dest.root.display_path().join(base).display().to_string(),
    };
    let dir = dest.root.open_dir(&dest.base)?;
    let name = format!(".ferry-{tag:016x}-w.part");
    let flags = root::OFlags::WRONLY | root::OFlags::CREATE | root::OFlags::EXCL;
    match root::open_in(&dir, &name, flags, 0o600) {
        Ok(fd) => {
            drop(fd);
            let _ = rustix::fs::unlinkat(&dir, name.as_str(), rustix::fs::AtFlags::empty());
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(FsError::io(shown(), e)),
    }
}
