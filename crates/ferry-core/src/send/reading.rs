//! Reading files: each in order, its digest in the same pass, its blocks queued for the
//! streams (early, before its decision, or as the decision asks); and a block read again when
//! the receiver found it damaged.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use ferry_proto::{Block, ChecksumAlgo, Decision, ErrorCode, FileId, Frame};

use super::cut::{clip_to_ranges, covered};
use super::segments::{read_split, record_digest, segment_size, Place};
use super::state::{FileRecord, SenderState};
use crate::digest::{block_digest, FileHasher};
use crate::error::FsError;
use crate::root::{self, Kind, Meta, OFlags};

/// Opens a source file and checks it is still the regular file the walk saw.
///
/// `O_NONBLOCK`, because the name may no longer be that file: opening a FIFO swapped in
/// after the walk would wait for a writer, and held a reader thread (eight of them in
/// issue 35) until someone came. Regular files ignore the flag. What was opened is checked on
/// the descriptor, so a swap after the open changes nothing either.
pub(super) fn open_checked(record: &FileRecord) -> Result<(File, Meta), FsError> {
    let path = &record.meta.path;
    let fd = root::open_in(
        &record.dir,
        &record.name,
        OFlags::RDONLY | OFlags::NONBLOCK,
        0,
    )
    .map_err(|e| FsError::io(path, e))?;
    let file = File::from(fd);
    let st = rustix::fs::fstat(&file).map_err(|e| FsError::io(path, e))?;
    let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
    if kind != rustix::fs::FileType::RegularFile {
        let why = format!(
            "is {} now, not the regular file it was when listed",
            describe_type(kind)
        );
        return Err(FsError::io(path, std::io::Error::other(why)));
    }
    Ok((file, Meta::from_stat(&st)))
}

/// What a special file is, in words: `lstat` of `name` in `dir`.
pub(super) fn special_kind(dir: &OwnedFd, name: &str) -> &'static str {
    match rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => describe_type(rustix::fs::FileType::from_raw_mode(st.st_mode)),
        Err(_) => "not a regular file",
    }
}

pub(super) fn describe_type(kind: rustix::fs::FileType) -> &'static str {
    use rustix::fs::FileType as T;
    match kind {
        T::RegularFile => "a regular file",
        T::Directory => "a directory",
        T::Symlink => "a symlink",
        T::Fifo => "a FIFO",
        T::Socket => "a socket",
        T::CharacterDevice => "a character device",
        T::BlockDevice => "a block device",
        T::Unknown => "of an unknown type",
    }
}

/// Reads one file in order and queues its blocks. Returns false when the transfer is over.
///
/// A file whose decision has not come yet is read and sent at once, its blocks marked early
/// (`Block::early`), and the decision is taken in when it comes: the first blocks of a session
/// then leave with the data connections' `Hello`, a round trip before any decision can be
/// back (DESIGN.md, "Starting a session in few round trips"). The receiver uses early blocks
/// only for a file it decided to receive: after a decision other than `Send` or `Resume` they
/// were bandwidth spent for nothing, never data written.
pub(super) fn send_file(shared: &SenderState, record: &Arc<FileRecord>) -> bool {
    let meta = &record.meta;
    // Counted as it is read, or all at once when this reader is done with the file.
    let mut unpassed = Unpassed {
        counter: &shared.passed_bytes,
        left: meta.size,
    };
    let decision = match shared.take_decision(meta.id) {
        Some(d) => d,
        None if shared.early_room() => {
            match stream_file(shared, record, Vec::new(), &mut unpassed, true) {
                Streamed::Finished => return true,
                Streamed::Over => return false,
                Streamed::Decided(d) => d,
                // Every block went early. The decision still matters when the receiver holds
                // the same size and mtime: it dropped the early blocks and waits for our word.
                // (Handing such files to a thread of their own, so that the reader goes on,
                // sent more files early but measured no faster on a tree of tiny files.)
                Streamed::AllEarly => match shared.wait_decision(meta.id) {
                    None => return false,
                    Some(Decision::Send | Decision::Resume { .. }) => {
                        shared.reporter.on_file_done();
                        return true;
                    }
                    Some(d) => d,
                },
            }
        }
        None => match shared.wait_decision(meta.id) {
            Some(d) => d,
            None => return false,
        },
    };
    tracing::trace!(
        file = record.meta.id.0,
        ?decision,
        "reader has its decision"
    );
    answer(shared, record, decision, &mut unpassed)
}

/// Sends what `decision` asks of a file not sent yet (or sent early only in part). Returns
/// false when the transfer is over.
pub(super) fn answer(
    shared: &SenderState,
    record: &Arc<FileRecord>,
    decision: Decision,
    unpassed: &mut Unpassed<'_>,
) -> bool {
    let meta = &record.meta;
    match decision {
        Decision::Send => stream_file(shared, record, Vec::new(), unpassed, false).more(),
        Decision::Resume { have } => stream_file(shared, record, have, unpassed, false).more(),
        // The receiver has resolved these already; nothing is sent.
        Decision::Skip => true,
        // Reported by `Sender::decide` when it arrived.
        Decision::Fail { .. } => true,
        Decision::Complete { digest } => {
            let key = (meta.path.clone(), meta.size, meta.mtime_ns);
            let cached = shared.config.digest_cache.get(&key, shared.config.checksum);
            let ours = match cached {
                Some(d) => d,
                None => match digest_file(shared, record) {
                    Ok(d) => d,
                    Err(e) => {
                        return shared.fail_file(
                            record,
                            e.code(),
                            format!("reading {}: {e}", meta.path),
                        )
                    }
                },
            };
            if ours[..] != digest[..] {
                // Same size and mtime, different content: send it; the receiver's policy decides.
                return stream_file(shared, record, Vec::new(), unpassed, false).more();
            }
            shared.cache().insert(key, ours.clone());
            *record.digest.lock().unwrap_or_else(|e| e.into_inner()) = Some(ours);
            shared.reporter.on_file_done();
            // On the control connection: on a data connection it could wait behind early
            // blocks of this very file, which the receiver only drops.
            shared
                .control
                .send(Frame::Skipped { file: meta.id })
                .is_ok()
        }
    }
}

/// How a reading of a file ended.
pub(super) enum Streamed {
    /// Every block it had to send is queued, or it failed and the receiver was told.
    Finished,
    /// The transfer is over (the frame queue is gone): the reader stops.
    Over,
    /// Read early, a decision came that ends the early reading: `Skip`, `Fail` or `Complete`.
    Decided(Decision),
    /// Read early to the end before any decision came.
    AllEarly,
}

impl Streamed {
    /// Whether the reader goes on with other files; for a reading that was never early.
    pub(super) fn more(self) -> bool {
        match self {
            Self::Over => false,
            Self::Finished | Self::Decided(_) | Self::AllEarly => true,
        }
    }

    /// After telling the receiver that a file failed: `told` is whether the queue took it.
    pub(super) fn failed(told: bool) -> Self {
        if told {
            Self::Finished
        } else {
            Self::Over
        }
    }
}

/// The whole-file digest of a source file, read in order.
pub(super) fn digest_file(shared: &SenderState, record: &FileRecord) -> Result<Vec<u8>, FsError> {
    let (file, _) = open_checked(record)?;
    let mut hasher = FileHasher::new(shared.config.checksum);
    let block = shared.block_size();
    let mut offset = 0;
    while offset < record.meta.size {
        let len = (record.meta.size - offset).min(block);
        let data = read_block(&file, record.base + offset, len)
            .map_err(|e| FsError::io(&record.meta.path, e))?;
        hasher.update(&data);
        offset += len;
    }
    Ok(hasher.finalize())
}

/// Bytes of one file not yet counted in `passed_bytes`. What is left when the reader is done
/// with the file (sent, found complete at the receiver, skipped, failed midway) is counted
/// then: a file that failed must not keep the rest of the transfer from being cut at its end.
pub(super) struct Unpassed<'a> {
    pub(super) counter: &'a AtomicU64,
    pub(super) left: u64,
}

impl Unpassed<'_> {
    pub(super) fn pass(&mut self, n: u64) {
        let n = n.min(self.left);
        self.left -= n;
        self.counter.fetch_add(n, Ordering::Relaxed);
    }
}

impl Drop for Unpassed<'_> {
    fn drop(&mut self) {
        self.counter.fetch_add(self.left, Ordering::Relaxed);
    }
}

/// Reads one file in order, hashing all of it, and queues every block the receiver does not
/// already have (`have`), and always the last one (it carries the file digest).
///
/// `early`: the file's decision has not come; blocks go out marked early, and the decision is
/// looked for before each block. `Send` and `Resume` are taken in on the way (the blocks sent
/// so far are all the receiver needs of them, and the digest goes on from where it is); any
/// other ends the reading.
pub(super) fn stream_file(
    shared: &SenderState,
    record: &Arc<FileRecord>,
    mut have: Vec<(u64, u64)>,
    unpassed: &mut Unpassed<'_>,
    mut early: bool,
) -> Streamed {
    let meta = &record.meta;
    let mut reading = match FileReading::open(shared, record) {
        Ok(r) => r,
        Err(over) => return over,
    };
    let block = shared.block_size();
    if let Some(seg) = segment_size(shared.config.checksum, meta.size, block) {
        let place = Place { have, early };
        let opened = (reading.file, reading.before);
        return read_split(shared, record, opened, seg, place, unpassed);
    }
    let mut offset = 0u64;
    loop {
        if shared.is_skipped(meta.id) {
            return Streamed::Finished;
        }
        if early {
            match early_decision(shared, meta.id) {
                Ok(None) => {}
                Ok(Some(Decision::Send)) => early = false,
                Ok(Some(Decision::Resume { have: h })) => {
                    early = false;
                    have = h;
                }
                Ok(Some(d)) => return Streamed::Decided(d),
                Err(over) => return over,
            }
        }
        let len = next_len(shared, &have, offset, meta.size - offset);
        let read = match reading.read(offset, len, unpassed) {
            Ok(r) => r,
            Err(over) => return over,
        };
        let last = offset + len == meta.size;
        if covered(&have, offset, offset + len) {
            if !last {
                offset += len;
                continue;
            }
            if !early && shared.digest_apart.load(Ordering::Acquire) {
                return digest_apart(shared, record, read.file_digest);
            }
        }
        if !queue_block(shared, record, offset, read, early) {
            return Streamed::Over;
        }
        offset += len;
        if last {
            // A file sent early is done once its decision says so (`send_file`).
            if early {
                return Streamed::AllEarly;
            }
            shared.reporter.on_file_done();
            return Streamed::Finished;
        }
    }
}

/// The receiver has every block of a file (a striped get's stripe hosts brought them) and
/// takes its digest apart: on the control connection, which carries its offer before it.
fn digest_apart(shared: &SenderState, record: &FileRecord, digest: Option<Bytes>) -> Streamed {
    let Some(digest) = digest else {
        // Only the last block's read has the digest; not reached for any other.
        return Streamed::failed(shared.fail_file(
            record,
            ErrorCode::IO,
            format!("no digest of {}", record.meta.path),
        ));
    };
    shared.reporter.on_file_done();
    let told = shared.control.send(Frame::FileDigest {
        file: record.meta.id,
        digest,
    });
    match told {
        Ok(()) => Streamed::Finished,
        Err(_) => Streamed::Over,
    }
}

/// The decision on a file being sent early, if it has come; once the early budget is spent,
/// waits for it. `Err` when the session ended first.
pub(super) fn early_decision(
    shared: &SenderState,
    id: FileId,
) -> Result<Option<Decision>, Streamed> {
    match shared.take_decision(id) {
        Some(d) => Ok(Some(d)),
        None if shared.early_room() => Ok(None),
        // The early budget is spent: the rest waits for the decision.
        None => match shared.wait_decision(id) {
            Some(d) => Ok(Some(d)),
            None => Err(Streamed::Over),
        },
    }
}

/// The length of the next block at `offset`, `left` bytes before the end of the file. What
/// the receiver has is read (for the file digest) in whole blocks; the cuts are for what is
/// sent.
pub(super) fn next_len(shared: &SenderState, have: &[(u64, u64)], offset: u64, left: u64) -> u64 {
    let whole = clip_to_ranges(have, offset, left.min(shared.block_size()));
    if whole < left && covered(have, offset, offset + whole) {
        whole
    } else {
        clip_to_ranges(have, offset, shared.block_len(left))
    }
}

/// Queues a block read (altered first if a test asked for it). False when the transfer is
/// over.
pub(super) fn queue_block(
    shared: &SenderState,
    record: &FileRecord,
    offset: u64,
    read: BlockRead,
    early: bool,
) -> bool {
    let BlockRead {
        mut data,
        digest,
        file_digest,
    } = read;
    let len = data.len() as u64;
    let seq = shared.block_seq.fetch_add(1, Ordering::Relaxed);
    if len > 0
        && shared
            .corrupt
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&seq)
    {
        data[0] ^= 0xff;
    }
    let frame = Frame::Block(Block {
        file: record.meta.clone(),
        offset,
        digest,
        file_digest,
        early,
        data: crate::buf::freeze(data),
    });
    if !shared.push(frame) {
        return false;
    }
    if early {
        shared.early_sent.fetch_add(len, Ordering::Relaxed);
    }
    true
}

/// A block read: its bytes, their digest, and on the file's last block the file digest.
pub(super) struct BlockRead {
    pub(super) data: Vec<u8>,
    pub(super) digest: u128,
    pub(super) file_digest: Option<Bytes>,
}

/// One file being read in order, its digest computed as it goes.
struct FileReading<'a> {
    shared: &'a SenderState,
    record: &'a FileRecord,
    file: File,
    /// The file as it was opened: a file that changes while it is read is not vouched for.
    before: Meta,
    hasher: FileHasher,
}

impl<'a> FileReading<'a> {
    /// Opens the file, still the one the walk saw. `Err` after telling the receiver why not.
    fn open(shared: &'a SenderState, record: &'a FileRecord) -> Result<Self, Streamed> {
        let meta = &record.meta;
        let fail = |code, msg| Streamed::failed(shared.fail_file(record, code, msg));
        let (file, before) = open_checked(record)
            .map_err(|e| fail(e.code(), format!("cannot read {}: {e}", meta.path)))?;
        if before.kind != Kind::File || (before.size, before.mtime_ns) != record.listed {
            return Err(fail(
                ErrorCode::IO,
                format!(
                    "{} changed between listing and reading; run again to send it",
                    meta.path
                ),
            ));
        }
        Ok(Self {
            shared,
            record,
            file,
            before,
            hasher: FileHasher::new(shared.config.checksum),
        })
    }

    fn fail(&self, msg: String) -> Streamed {
        Streamed::failed(self.shared.fail_file(self.record, ErrorCode::IO, msg))
    }

    fn changed(&self) -> String {
        changed(&self.record.meta.path)
    }

    /// Reads and hashes `len` bytes at `offset`; the last block of the file also gets the file
    /// digest, once the file is seen unchanged. `Err` after telling the receiver why not.
    fn read(
        &mut self,
        offset: u64,
        len: u64,
        unpassed: &mut Unpassed<'_>,
    ) -> Result<BlockRead, Streamed> {
        let meta = &self.record.meta;
        let data = match read_block(&self.file, self.record.base + offset, len) {
            Ok(d) => d,
            Err(e) => return Err(self.fail(read_failed(&self.file, self.before, &meta.path, &e))),
        };
        self.shared.read_bytes.fetch_add(len, Ordering::Relaxed);
        unpassed.pass(len);
        self.hasher.update(&data);
        let digest = block_digest(&data);
        let file_digest = if offset + len == meta.size {
            Some(self.finish()?)
        } else {
            None
        };
        Ok(BlockRead {
            data,
            digest,
            file_digest,
        })
    }

    /// The file digest, kept for the manifest, the digest cache and a resend of the last block.
    fn finish(&mut self) -> Result<Bytes, Streamed> {
        // The end of the file: make sure it did not change under us before vouching for it.
        let after = rustix::fs::fstat(&self.file).map(|st| Meta::from_stat(&st));
        if after.ok() != Some(self.before) {
            return Err(self.fail(self.changed()));
        }
        let d = std::mem::replace(&mut self.hasher, FileHasher::new(ChecksumAlgo::Xxh3)).finalize();
        record_digest(self.shared, self.record, &d);
        Ok(Bytes::from(d))
    }
}

/// Reads exactly `len` bytes at `offset` into a fresh buffer. The buffer is filled by the
/// kernel without being zeroed first (a memset of every block cost ~8% of the sender's CPU);
/// a file that got shorter is an error, not a short block. One `pread` per block: a seek and
/// `read_to_end` made three system calls of it (its second read only to find the end), a
/// tenth of a small file's syscalls on the sender (notebook, "Issue 37: the tiny tree's CPU
/// per file, both ends").
pub(super) fn read_block(file: &File, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    let want = usize::try_from(len).map_err(|_| std::io::Error::other("block too large"))?;
    let mut data = crate::buf::take(want);
    while data.len() < want {
        let (done, at) = (data.len(), offset + data.len() as u64);
        // Only up to `want`: a pooled buffer may be larger than the block.
        let spare = &mut data.spare_capacity_mut()[..want - done];
        let n = match rustix::io::pread(file, spare, at) {
            Ok((filled, _)) => filled.len(),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        // SAFETY: `pread` initialised the first `n` bytes of the spare capacity.
        unsafe { data.set_len(done + n) };
    }
    Ok(data)
}

/// Reads a block again after the receiver found it damaged.
pub(super) fn resend_block(shared: &SenderState, id: FileId, offset: u64, len: u32) -> bool {
    let record = shared
        .records
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&id)
        .cloned();
    let Some(record) = record else {
        shared.error(format!("receiver asked again for unknown file {id:?}"));
        return true;
    };
    let meta = &record.meta;
    let len = u64::from(len).min(meta.size.saturating_sub(offset));
    let result = open_checked(&record).and_then(|(file, now)| {
        let data =
            read_block(&file, record.base + offset, len).map_err(|e| FsError::io(&meta.path, e))?;
        Ok((now, data))
    });
    let (now, data) = match result {
        Ok(x) => x,
        Err(e) => {
            return shared.fail_file(&record, e.code(), format!("re-reading {}: {e}", meta.path))
        }
    };
    if (now.size, now.mtime_ns) != record.listed {
        return shared.fail_file(
            &record,
            ErrorCode::IO,
            format!(
                "{} changed while being sent; not stored; run again to send it",
                meta.path
            ),
        );
    }
    let file_digest = if offset + len == meta.size {
        record
            .final_digest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    } else {
        None
    };
    // Asked for again by a receiver that is writing the file: it has its decision.
    let frame = Frame::Block(Block {
        file: meta.clone(),
        offset,
        digest: block_digest(&data),
        file_digest,
        early: false,
        data: crate::buf::freeze(data),
    });
    shared.push(frame)
}

/// What a reader reports when a source file changed under it.
pub(super) fn changed(path: &str) -> String {
    format!("{path} changed while being sent; not stored; run again to send it")
}

/// Why a read of a source file failed: a file that shrank or changed under the reader (it is
/// no longer what it was when opened, `before`) is a changed file, not a broken disk.
pub(super) fn read_failed(file: &File, before: Meta, path: &str, e: &std::io::Error) -> String {
    let now = rustix::fs::fstat(file).map(|st| Meta::from_stat(&st)).ok();
    if now != Some(before) {
        changed(path)
    } else {
        format!("reading {path}: {e}")
    }
}
