//! A stripe host's writes: blocks of a striped put written into partial copies that another
//! server of the same shared file system (the put's coordinator) opened, decides and commits.
//!
//! A stripe host creates nothing, renames nothing and keeps no state between blocks: it opens
//! the partial copy of the block's file by the name the coordinator gave it
//! (`.ferry-<xxh3 of its name>.part`, which only files of more than one block have), without
//! `O_CREAT`, without following a link, beneath the destination it was allowed; writes the
//! block at its offset and makes it durable. With BLAKE3 file digests it also hashes the block
//! as it writes it, so that the coordinator merges the chaining values into the file's tree
//! instead of reading the block back once the client says it landed.

use std::fs::File;
use std::os::unix::fs::FileExt;

use ferry_proto::{Block, ChecksumAlgo};

use super::config::Destination;
use super::opening::journaled_temp;
use crate::digest::{block_digest, Blake3Tree};
use crate::error::FsError;
use crate::path::split_parent;
use crate::root;

/// Why a stripe host did not write a block. `NotStriped` and `BadDigest` leave the block to
/// the coordinator (the client sends it there); the others are a peer breaking the protocol.
#[derive(Debug, thiserror::Error)]
pub enum StripeError {
    /// Early blocks (the coordinator may still discard the partial copy) go to the
    /// coordinator only.
    #[error("block of {path} at {offset} is not for a stripe host")]
    NotStriped { path: String, offset: u64 },
    #[error("block of {path} at {offset} failed its digest")]
    BadDigest { path: String, offset: u64 },
    #[error("block of {len} bytes; this session's block size is {max}")]
    TooLarge { len: u64, max: u32 },
    #[error("block of {path} at {offset} ends beyond the file's size")]
    OutOfRange { path: String, offset: u64 },
    /// The partial copy is not there (not opened yet, or already committed), or a write failed.
    #[error("{0}")]
    Fs(#[from] FsError),
}

impl StripeError {
    /// Whether the block goes to the coordinator instead (the session goes on).
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            Self::NotStriped { .. } | Self::BadDigest { .. } | Self::Fs(_)
        )
    }
}

/// Files of at most this many bytes stay on a striped put's coordinator even when it shares
/// partial copies (`STRIPE_WHOLE`): they have no BLAKE3 tree (so a landed block would be read
/// back), a shared copy costs them a journal, and they are a small part of any tree's bytes
/// (0.6% of the bench's mixed tree, 1 KiB to 8 MiB log-uniform).
pub const WHOLE_MIN_SIZE: u64 = Blake3Tree::MIN_SIZE;

/// Whether a stripe host with sessions of `block_size` may write `block`: not an early block
/// (until its file's decision the coordinator may still discard or truncate the partial copy),
/// not empty, and not larger than the host's blocks. Then with `whole` (the coordinator gives
/// every file of more than [`WHOLE_MIN_SIZE`] a shared partial copy and takes the file digest
/// apart, `STRIPE_WHOLE`), any block of such a file; without, only one that does not carry
/// the file digest, of a file of more than one block (no other has a shared partial copy).
/// The client keeps the others off stripe hosts' connections by the same rule, so that no
/// block crosses a stripe host's link only to be handed back.
pub fn for_stripe_host(block: &Block, block_size: u32, whole: bool) -> bool {
    let len = block.data.len() as u64;
    let size = block.file.size;
    let shared = match whole {
        true => size > WHOLE_MIN_SIZE || size > u64::from(block_size),
        false => block.file_digest.is_none() && size > u64::from(block_size),
    };
    !block.early && shared && len > 0 && len <= u64::from(block_size)
}

/// Writes blocks into existing partial copies beneath one destination.
pub struct StripeWriter {
    dest: Destination,
    block_size: u32,
    /// The session's file digest is BLAKE3 on chunk-aligned blocks: the coordinator hashes
    /// files as trees, and each block written here is hashed for it.
    tree: bool,
}

impl StripeWriter {
    pub fn new(dest: Destination, block_size: u32, checksum: ChecksumAlgo) -> Self {
        let tree = checksum == ChecksumAlgo::Blake3
            && u64::from(block_size).is_multiple_of(blake3::CHUNK_LEN as u64);
        Self {
            dest,
            block_size,
            tree,
        }
    }

    /// Checks a block, writes it into its file's partial copy and syncs it (`fdatasync`).
    /// Opens the copy for each block: a copy committed meanwhile is not found by its partial
    /// name, so a late block never reaches a final name through a descriptor kept open.
    /// Returns the BLAKE3 chaining values of the subtrees inside the bytes it wrote
    /// ([`Blake3Tree::pieces`]), none without a tree.
    pub fn write(&self, block: &Block) -> Result<Vec<[u8; 32]>, StripeError> {
        let path = &block.file.path;
        let len = block.data.len() as u64;
        if len > u64::from(self.block_size) {
            return Err(StripeError::TooLarge {
                len,
                max: self.block_size,
            });
        }
        // Whether the coordinator shared this file's partial copy is its business: if not,
        // the name is not there (or is an older attempt's, which the coordinator never takes
        // a landed block from) and the block is handed back.
        if !for_stripe_host(block, self.block_size, true) {
            return Err(StripeError::NotStriped {
                path: path.clone(),
                offset: block.offset,
            });
        }
        if block
            .offset
            .checked_add(len)
            .is_none_or(|e| e > block.file.size)
        {
            return Err(StripeError::OutOfRange {
                path: path.clone(),
                offset: block.offset,
            });
        }
        if block_digest(&block.data) != block.digest {
            return Err(StripeError::BadDigest {
                path: path.clone(),
                offset: block.offset,
            });
        }
        let rel = self.dest.map(path)?;
        let (dir_rel, name) = split_parent(&rel);
        let dir = self.dest.root.open_dir(dir_rel)?;
        let temp = journaled_temp(name);
        let io = |e: std::io::Error| FsError::io(crate::path::join(dir_rel, &temp), e);
        // Non-blocking, then checked: a FIFO standing in the partial's place must not hold
        // the writer.
        let flags = root::OFlags::WRONLY | root::OFlags::NONBLOCK;
        let file = File::from(root::open_in(&dir, &temp, flags, 0).map_err(io)?);
        if !file.metadata().map_err(io)?.is_file() {
            return Err(io(std::io::Error::other("not a regular file")).into());
        }
        file.write_all_at(&block.data, block.offset).map_err(io)?;
        file.sync_data().map_err(io)?;
        if !self.tree {
            return Ok(Vec::new());
        }
        let pieces = Blake3Tree::pieces(block.file.size, block.offset, &block.data);
        Ok(pieces.iter().map(|p| p.cv()).collect())
    }
}
