//! A stripe host's reads: blocks of a striped get, read from the file system this host shares
//! with the get's coordinator, which walks, offers and hashes every file itself.
//!
//! A stripe host decides nothing and keeps no state between blocks: the client names each
//! block by the path the coordinator offered, its size and mtime, and a range; the host maps
//! the path beneath the source it was allowed (as the coordinator's walk named it), opens the
//! file without following a link, checks that it is still the regular file of that size and
//! mtime, and reads the range. What it sends is vouched for end to end by the coordinator's
//! file digest, which the client verifies as it does every block's bytes.

use std::os::unix::fs::FileExt;

use ferry_proto::{Block, FileId, FileMeta};

use super::state::Source;
use crate::digest::block_digest;
use crate::error::FsError;
use crate::path::{join, validate_rel};
use crate::root::{Kind, Meta};

/// Why a stripe host did not read a block. [`ReadError::Changed`] and [`ReadError::Fs`]
/// leave the block to the coordinator (the client asks it there); the others are a peer
/// breaking the protocol.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{path} is not beneath the source of this session")]
    Outside { path: String },
    #[error("block of {len} bytes; this session's block size is {max}")]
    TooLarge { len: u64, max: u32 },
    /// Not the file the coordinator offered any more (or never was, on this host).
    #[error("{path} is not the regular file of {size} bytes that was offered")]
    Changed { path: String, size: u64 },
    #[error("{0}")]
    Fs(#[from] FsError),
}

impl ReadError {
    /// Whether the block goes to the coordinator instead (the session goes on).
    pub fn is_refusal(&self) -> bool {
        matches!(self, Self::Changed { .. } | Self::Fs(_))
    }
}

/// One block a striped get's client asks of a stripe host (`Fetch`).
#[derive(Clone, Debug)]
pub struct Wanted {
    pub file: FileId,
    pub path: String,
    pub size: u64,
    pub mtime_ns: i64,
    pub offset: u64,
    pub len: u32,
}

/// Reads blocks of files beneath one source, as a get of it names them.
pub struct StripeReader {
    source: Source,
    block_size: u32,
}

impl StripeReader {
    pub fn new(source: Source, block_size: u32) -> Self {
        Self { source, block_size }
    }

    /// Where the walk of this source found the file it offered as `wire`: the source's own
    /// name is its top (a file, or a directory), and what follows is beneath it.
    fn map(&self, wire: &str) -> Result<String, ReadError> {
        let outside = || ReadError::Outside {
            path: wire.to_owned(),
        };
        validate_rel(wire).map_err(|_| outside())?;
        let name = &self.source.name;
        if name.is_empty() && !wire.is_empty() {
            // A directory sent as its contents: each entry is named from inside it.
            return Ok(join(&self.source.rel, wire));
        }
        if wire == name {
            return Ok(self.source.rel.clone());
        }
        match wire
            .strip_prefix(name.as_str())
            .and_then(|r| r.strip_prefix('/'))
        {
            Some(rest) if !rest.is_empty() => Ok(join(&self.source.rel, rest)),
            _ => Err(outside()),
        }
    }

    /// Reads the block `w` names into a `Block` that does not carry the file digest (the
    /// coordinator's last block does) and is never early (its file is decided).
    pub fn read(&self, w: &Wanted) -> Result<Block, ReadError> {
        if w.len > self.block_size {
            return Err(ReadError::TooLarge {
                len: u64::from(w.len),
                max: self.block_size,
            });
        }
        let rel = self.map(&w.path)?;
        let file = self.source.root.open_read(&rel)?;
        let io = |e: std::io::Error| FsError::io(&w.path, e);
        let st = rustix::fs::fstat(&file).map_err(|e| io(e.into()))?;
        let meta = Meta::from_stat(&st);
        let changed = || ReadError::Changed {
            path: w.path.clone(),
            size: w.size,
        };
        if meta.kind != Kind::File || meta.size != w.size || meta.mtime_ns != w.mtime_ns {
            return Err(changed());
        }
        if w.offset
            .checked_add(u64::from(w.len))
            .is_none_or(|e| e > w.size)
        {
            return Err(changed());
        }
        let mut data = vec![0; w.len as usize];
        file.read_exact_at(&mut data, w.offset).map_err(io)?;
        let data = bytes::Bytes::from(data);
        Ok(Block {
            file: FileMeta {
                id: w.file,
                path: w.path.clone(),
                size: w.size,
                mode: meta.mode,
                mtime_ns: meta.mtime_ns,
            },
            offset: w.offset,
            digest: block_digest(&data),
            file_digest: None,
            early: false,
            data,
        })
    }
}
