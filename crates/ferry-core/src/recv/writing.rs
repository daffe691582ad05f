//! Writing blocks: check each, write the bytes no other copy covers, and feed the file's
//! digest, in order (reading back what came ahead) or as a tree.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use bytes::Bytes;
use ferry_proto::journal::JournalRecord;
use ferry_proto::{Block, ErrorCode, ExistingPolicy, FileId, Frame};

use super::config::RecvError;
use super::receiver::Receiver;
use super::state::{cannot_create, free_parts, lock, start_writeback, FileEntry, Slot};
use crate::digest::{block_digest, Blake3Tree, FileHasher, Piece};
use crate::error::FsError;

impl Receiver {
    /// Checks a block, writes the bytes of it that no other copy covers, and feeds the file's
    /// digest; the file goes on to verification once every byte is in.
    pub(super) fn handle_block(&self, block: Block) -> Result<(), RecvError> {
        let Some(entry) = self.admit(&block)? else {
            return Ok(());
        };
        self.take_block(&entry, &block, false);
        Ok(())
    }

    /// A block a stripe host wrote into this file's partial copy (a striped put), taken in as
    /// if written here (journal, ranges, digest) without writing it again. When the file is
    /// hashed as a BLAKE3 tree and `cvs` are the block's pieces, they are merged as they are:
    /// the tree's root must still equal the sender's file digest, so wrong values fail the
    /// file, never pass it. Otherwise the block is read back from the copy and checked
    /// against the digest the client vouches for; one that does not match, or that cannot be
    /// read, is asked for again (`Resend`).
    pub(super) fn handle_landed(&self, landed: Landed) -> Result<(), RecvError> {
        let Landed {
            file,
            offset,
            len,
            digest,
            cvs,
        } = landed;
        if len > self.config.block_size {
            return Err(RecvError::BlockTooLarge {
                file,
                len: u64::from(len),
                max: self.config.block_size,
            });
        }
        let entry = lock(&self.files)
            .get(&file)
            .cloned()
            .ok_or(RecvError::Unoffered(file))?;
        let size = entry.meta.size;
        if offset + u64::from(len) > size {
            return Err(RecvError::Inconsistent(file));
        }
        let (copy, tree) = match &mut *lock(&entry.slot) {
            // Only a journaled copy has the name a stripe host opens: the bytes of any other
            // are not where the host wrote them, whatever its chaining values say.
            Slot::Writing(w) if w.journal.is_some() => (w.file.clone(), w.tree.is_some()),
            Slot::Writing(_) => {
                let _ = self.control.send(Frame::Resend { file, offset, len });
                return Ok(());
            }
            _ => return Ok(()), // done, failed or skipped meanwhile
        };
        let span = Span {
            offset,
            len: u64::from(len),
            digest,
            file_digest: None,
        };
        let pieces = tree
            .then(|| Blake3Tree::pieces_from(size, offset, u64::from(len), &cvs))
            .flatten();
        if let Some(pieces) = pieces {
            self.reporter.on_landed(true);
            let Some(mut claim) = self.claim(&entry, lock(&entry.slot), &span) else {
                return Ok(());
            };
            claim.landed = true;
            let written = WriteOutcome {
                result: Ok(()),
                pieces,
            };
            self.record(&entry, &span, claim, written, None);
            return Ok(());
        }
        self.reporter.on_landed(false);
        let mut data = vec![0; len as usize];
        let read = copy.map(|f| f.read_exact_at(&mut data, offset));
        if !matches!(read, Some(Ok(()))) || block_digest(&data) != digest {
            self.counters.bad_blocks.fetch_add(1, Ordering::Relaxed);
            let _ = self.control.send(Frame::Resend { file, offset, len });
            return Ok(());
        }
        let block = Block {
            file: entry.meta.clone(),
            offset,
            digest,
            file_digest: None,
            early: false,
            data: data.into(),
        };
        self.take_block(&entry, &block, true);
        Ok(())
    }

    /// The file digest of a file whose last block a stripe host wrote (the client has it from
    /// the block it sent there): verified against as a block's would be, once every byte is in.
    pub(super) fn handle_file_digest(&self, file: FileId, digest: Bytes) -> Result<(), RecvError> {
        let entry = lock(&self.files)
            .get(&file)
            .cloned()
            .ok_or(RecvError::Unoffered(file))?;
        let mut slot = lock(&entry.slot);
        let Slot::Writing(w) = &mut *slot else {
            return Ok(()); // done, failed or skipped meanwhile
        };
        w.expected = Some(digest);
        self.advance(&entry, slot, None);
        Ok(())
    }

    /// Writes (unless `landed`: on disk already) and records an admitted block.
    fn take_block(&self, entry: &FileEntry, block: &Block, landed: bool) {
        let Some(slot) = self.writable(entry, lock(&entry.slot), block) else {
            return;
        };
        let span = Span::of(block);
        let Some(mut claim) = self.claim(entry, slot, &span) else {
            return;
        };
        claim.landed = landed;
        // Written (and hashed, in tree mode) without holding the slot, so other blocks of the
        // same file proceed in parallel.
        let written = claim.write(block, entry.meta.size);
        self.record(entry, &span, claim, written, Some(&block.data));
    }

    /// The file a block is for, if the block is to be written: `None` for an early block of a
    /// file not being received, and for a damaged block (asked for again).
    fn admit(&self, block: &Block) -> Result<Option<Arc<FileEntry>>, RecvError> {
        let id = block.file.id;
        let len = block.data.len() as u64;
        // The session's memory budget is sized in blocks of the agreed size: a peer that sends
        // larger ones breaks the protocol, whatever the wire's own 64 MiB limit allows.
        if len > u64::from(self.config.block_size) {
            return Err(RecvError::BlockTooLarge {
                file: id,
                len,
                max: self.config.block_size,
            });
        }
        let entry = self.lookup(&block.file)?;
        if block.early && !matches!(*lock(&entry.slot), Slot::Writing(_)) {
            // Sent before the sender knew the decision, for a file not being received (in
            // place already, skipped, failed, or done by the copies of it that came after).
            return Ok(None);
        }
        if block_digest(&block.data) != block.digest {
            self.counters.bad_blocks.fetch_add(1, Ordering::Relaxed);
            self.reporter.on_bad_block();
            let _ = self.control.send(Frame::Resend {
                file: id,
                offset: block.offset,
                len: len as u32,
            });
            return Ok(None);
        }
        Ok(Some(entry))
    }

    /// The file's slot, ready for a block: a file found in place with the same size and mtime
    /// that the sender sends anyway differs from ours, and the policy decides whether it is
    /// replaced. `None` when the block is not written.
    fn writable<'e>(
        &self,
        entry: &'e FileEntry,
        mut slot: MutexGuard<'e, Slot>,
        block: &Block,
    ) -> Option<MutexGuard<'e, Slot>> {
        if !matches!(*slot, Slot::Present) {
            return Some(slot);
        }
        if block.early {
            return None; // the sender compares digests first; see `admit`
        }
        if self.config.existing != ExistingPolicy::Overwrite {
            drop(slot);
            let msg = format!(
                "{}: exists with the same size and mtime but different content \
                 (use --overwrite to replace it)",
                entry.meta.path
            );
            self.fail(entry, ErrorCode::EXISTS, msg, true);
            return None;
        }
        match self.open_writing(&entry.meta, false) {
            Ok(w) => {
                *slot = Slot::Writing(Box::new(w));
                Some(slot)
            }
            Err((code, msg)) => {
                *slot = Slot::Failed;
                drop(slot);
                self.mark_failed(block.file.id, code, msg, true);
                None
            }
        }
    }

    /// Reserves the parts of the block that neither what is written nor another write under
    /// way covers, so that every byte of the file is written once. `None` when there is
    /// nothing to write: the block may still complete the file (its digest).
    fn claim(
        &self,
        entry: &FileEntry,
        mut slot: MutexGuard<'_, Slot>,
        block: &Span<'_>,
    ) -> Option<Claim> {
        let Slot::Writing(w) = &mut *slot else {
            return None; // skipped, failed or already done: late or duplicate block
        };
        if let Some(d) = block.file_digest {
            w.expected = Some(d.clone());
        }
        let len = block.len;
        let end = block.offset + len;
        let parts = free_parts(&w.written, &w.reserved, block.offset, end);
        if parts.is_empty() && len > 0 {
            // Already here (or being written by another copy): after a resume, the last block
            // comes again for its file digest even when the receiver has it, and it may be the
            // last block to arrive (or the only one, when the partial copy was whole). It
            // completes the file then.
            self.advance(entry, slot, None);
            return None;
        }
        // A block that overlaps bytes already written, or being written, writes only its own:
        // an honest copy carries the same bytes there, and a peer that sends others cannot
        // make the stored bytes differ from the ones digested.
        let whole = parts.len() <= 1 && parts.first().is_none_or(|&p| p == (block.offset, end));
        let file = match w.file() {
            Ok(f) => f,
            Err(e) => {
                let (code, msg) = cannot_create(&entry.meta.path, &w.dir_rel, e);
                drop(slot);
                self.fail(entry, code, msg, true);
                return None;
            }
        };
        let tree = w.tree.is_some();
        w.inflight += 1;
        w.reserved.extend_from_slice(&parts);
        Some(Claim {
            file,
            parts,
            whole,
            tree,
            landed: false,
        })
    }

    /// Takes in a claimed write once it is done: releases its parts, counts what it added, and
    /// journals the block if it was written whole. `data`: the block's bytes, when in memory.
    fn record(
        &self,
        entry: &FileEntry,
        block: &Span<'_>,
        claim: Claim,
        written: WriteOutcome,
        data: Option<&[u8]>,
    ) {
        let len = block.len;
        let mut slot = lock(&entry.slot);
        let Slot::Writing(w) = &mut *slot else {
            return;
        };
        w.inflight -= 1;
        for p in &claim.parts {
            if let Some(i) = w.reserved.iter().position(|r| r == p) {
                w.reserved.swap_remove(i);
            }
        }
        if let Err(e) = written.result {
            let msg = format!("writing {}: {e}", entry.meta.path);
            let code = FsError::io(&entry.meta.path, e).code();
            drop(slot);
            self.fail(entry, code, msg, true);
            return;
        }
        if let Some(t) = w.tree.as_mut() {
            for p in written.pieces {
                t.insert(p);
            }
        }
        // A copy of a block can arrive on two connections (the sender's endgame) and both may
        // be written before either is recorded: the second counts for nothing.
        let mut new = 0;
        for &(s, e) in &claim.parts {
            new += w.written.uncovered(s, e);
            w.written.insert(s, e);
        }
        if new == 0 && len > 0 {
            self.advance(entry, slot, None);
            return;
        }
        if !claim.whole {
            // Hashed from what was stored, read back; not journaled (a record claims the
            // block's digest for all its bytes): after a crash it is sent again.
            self.reporter.on_bytes(new);
            self.advance(entry, slot, None);
            return;
        }
        if let Some(j) = w.journal.as_mut() {
            // After the data: a record never claims a block that was not written.
            j.append(&JournalRecord {
                offset: block.offset,
                len: len as u32,
                digest: block.digest,
            });
        }
        // Only what no earlier copy or piece of it covered.
        self.reporter.on_bytes(new);
        self.advance(entry, slot, data.map(|d| (block.offset, d)));
    }

    /// Feeds the in-order digest with what has been written from its cursor on and, once the
    /// whole file is hashed (in tree mode: written) and its digest has arrived, hands it to
    /// verification. `slot` holds the file's `Writing` state; `fresh` is the block just
    /// written.
    ///
    /// The block just written, when it is next, is hashed from memory under the file's lock:
    /// blocks arrive nearly in order, so that is most of the bytes, with no read-back, and
    /// the other writers wait only for one block's hash. Data written ahead of a gap that
    /// has just closed is read back and hashed outside the lock: one writer takes the hasher
    /// out, hashes, puts it back and looks again, while the others go on writing and leave
    /// their blocks to it (each is in `written` before this is called). Under the lock, a gap
    /// closing 120 MiB behind the newest block held every writer of the file for the 115 ms
    /// of the read-back (1 GiB put at 100 ms on the bed), and the full writer queues that such
    /// stalls leave are what drew the writer tuner to probe more writers (`drive_receiver`).
    pub(super) fn advance<'e>(
        &self,
        entry: &'e FileEntry,
        mut slot: MutexGuard<'e, Slot>,
        mut fresh: Option<(u64, &[u8])>,
    ) {
        loop {
            let Slot::Writing(w) = &mut *slot else {
                return;
            };
            if w.tree.is_some() {
                break; // each writer hashed its own block
            }
            if let Some(algo) = w.hasher_due.take() {
                w.hasher = Some(FileHasher::new(algo));
            }
            match (fresh.take(), w.hasher.as_mut()) {
                (Some((offset, data)), Some(h)) if offset == w.cursor => {
                    h.update(data);
                    w.cursor += data.len() as u64;
                }
                _ => {}
            }
            let from = w.cursor;
            let Some(end) = w.written.run_end(from) else {
                break;
            };
            let Some(mut hasher) = w.hasher.take() else {
                return; // another writer is reading back; it will look again
            };
            let file = w.file();
            drop(slot);
            let hashed = file.and_then(|f| hash_back(&f, &mut hasher, from, end));
            slot = lock(&entry.slot);
            let Slot::Writing(w) = &mut *slot else {
                return; // failed or aborted meanwhile
            };
            w.hasher = Some(hasher);
            if let Err(e) = hashed {
                let msg = format!("reading back {}: {e}", entry.meta.path);
                drop(slot);
                self.fail(entry, ErrorCode::IO, msg, true);
                return;
            }
            w.cursor = end;
        }
        let Slot::Writing(w) = &mut *slot else {
            return;
        };
        let hashed = match w.tree {
            Some(_) => w.written.contains(0, entry.meta.size),
            None => w.cursor == entry.meta.size && w.hasher.is_some(),
        };
        if hashed && w.expected.is_some() && w.inflight == 0 {
            let Slot::Writing(w) = std::mem::replace(&mut *slot, Slot::Finalizing) else {
                unreachable!("matched Writing above")
            };
            drop(slot);
            self.verify_and_queue(entry, *w);
        }
    }
}

/// Feeds `hasher` with `[from, end)` of `file`, read back (from the page cache: it was just
/// written).
pub(super) fn hash_back(
    file: &File,
    hasher: &mut FileHasher,
    from: u64,
    end: u64,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; (end - from).min(1 << 20) as usize];
    let mut at = from;
    while at < end {
        let n = (end - at).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], at)?;
        hasher.update(&buf[..n]);
        at += n as u64;
    }
    Ok(())
}

/// A stripe host's `Landed`, as the receiver takes it.
pub struct Landed {
    pub file: FileId,
    pub offset: u64,
    pub len: u32,
    pub digest: u128,
    pub cvs: Vec<[u8; 32]>,
}

/// Where a block sits and what it claims, apart from its bytes (a landed block's are on
/// disk, not in memory).
struct Span<'a> {
    offset: u64,
    len: u64,
    digest: u128,
    file_digest: Option<&'a Bytes>,
}

impl<'a> Span<'a> {
    fn of(block: &'a Block) -> Self {
        Self {
            offset: block.offset,
            len: block.data.len() as u64,
            digest: block.digest,
            file_digest: block.file_digest.as_ref(),
        }
    }
}

/// The parts of a block that one writer writes, reserved in the file's state while it does.
struct Claim {
    file: Arc<File>,
    parts: Vec<(u64, u64)>,
    /// The parts are the whole block: it is journaled, and hashed in order from memory.
    whole: bool,
    /// The file's digest is a tree: each writer hashes what it writes.
    tree: bool,
    /// The bytes are in the file already (a stripe host wrote them): hashed, not written.
    landed: bool,
}

/// What a claimed write did: its outcome and, in tree mode, the digest pieces of its bytes.
struct WriteOutcome {
    result: std::io::Result<()>,
    pieces: Vec<Piece>,
}

/// Files smaller than this are left to their batch's sync to write back. Started per file, the
/// writeback of a small file is an I/O of its own (about 65 µs of CPU each on ext4 here:
/// 10,000 × 10 KiB with a `syncfs` per 900 files, 1.45 against 0.80 s; docs/bench/NOTEBOOK.md,
/// "Issue 37: small files into ext4"); the batch's `syncfs` writes them all in one pass, and a
/// small file is committed right after its block lands anyway.
const WRITEBACK_MIN_SIZE: u64 = 1 << 20;

impl Claim {
    fn write(&self, block: &Block, size: u64) -> WriteOutcome {
        let mut pieces = Vec::new();
        for &(s, e) in &self.parts {
            let data = &block.data[(s - block.offset) as usize..(e - block.offset) as usize];
            if !self.landed {
                if let Err(e) = self.file.write_all_at(data, s) {
                    return WriteOutcome {
                        result: Err(e),
                        pieces,
                    };
                }
                if size >= WRITEBACK_MIN_SIZE {
                    start_writeback(&self.file, s, e - s);
                }
            }
            if self.tree {
                pieces.extend(Blake3Tree::pieces(size, s, data));
            }
        }
        WriteOutcome {
            result: Ok(()),
            pieces,
        }
    }
}
