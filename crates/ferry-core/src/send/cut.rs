//! How long each block is: whole blocks, except near either end of a transfer, and never
//! across an edge of what the receiver already has.

/// Blocks are cut smaller at both ends of a transfer, so that every stream has data as soon
/// as it can send and none is left alone with a whole block at the end.
///
/// At the start, the first `streams` blocks are `MIN_CUT_BLOCK` and each next `streams`
/// twice as large, up to the block size: one reader fills every stream at once instead of
/// reading and hashing 16 whole blocks first (BLAKE3 and XXH3 alone take ~3 ms per 8 MiB at
/// the per-core rates in DESIGN.md), and TCP's slow start sends little per stream in the
/// first round trips anyway. On the bed (16 streams, 100 ms, one transfer each) the first
/// 2 MB arrived at 0.63 s with the head cut and 0.75 s without.
///
/// Near the end, a block is at most the bytes left to read divided by `TAIL_SPLIT × streams`.
/// A stream carries a whole block at its own share of the path, and at long RTT one stream's
/// share is small and slow to grow (BBR raises its estimate by a quarter per eight round
/// trips). With 16 streams at 100 ms, the last 8 MiB block of the slowest stream took another
/// second after every other stream had finished: 11 % of a 1 GiB transfer. Cut this way, the
/// last blocks leave every stream at about the same time; 4 rather than 2 leaves room for a
/// stream running at a quarter of the average rate.
pub const TAIL_SPLIT: u64 = 4;

/// The smallest block either end is cut into: 34 ms at a sixteenth of 1 Gbit/s, large
/// enough that per-block costs (a frame, a digest, a write, a journal record) stay small:
/// 1 GiB over 16 connections becomes 420 blocks instead of 128.
pub const MIN_CUT_BLOCK: u64 = 256 << 10;

/// The length of a file's next block: `left` bytes of the file still to read, `block` the
/// session's block size, `queued` blocks queued so far, `remaining` the bytes of the whole
/// transfer still to read once the walk is over (unknown before). A whole block, except near
/// either end of the transfer (see [`TAIL_SPLIT`]).
pub(super) fn cut(left: u64, block: u64, streams: u64, queued: u64, remaining: Option<u64>) -> u64 {
    let streams = streams.max(1);
    let doublings = (queued / streams).min(32);
    let mut len = left.min(block).min(MIN_CUT_BLOCK << doublings);
    if let Some(remaining) = remaining {
        // Whole 64 KiB multiples keep the reads aligned.
        let share = (remaining / (TAIL_SPLIT * streams)) & !0xffff;
        len = len.min(share.max(MIN_CUT_BLOCK));
    }
    // No sliver of a block after this one: the rest of the file goes with it.
    if left <= block && left - len < MIN_CUT_BLOCK {
        return left;
    }
    len
}

/// `len` shortened so that `[offset, offset + len)` does not straddle an edge of the
/// receiver's ranges. An earlier session cut its blocks where it was in its own transfer, so
/// its ranges need not end where this session's blocks do, and a block across an edge would
/// be sent whole although part of it is there.
pub(super) fn clip_to_ranges(have: &[(u64, u64)], offset: u64, len: u64) -> u64 {
    let end = offset.saturating_add(len);
    have.iter()
        .flat_map(|&(s, e)| [s, e])
        .filter(|&edge| edge > offset && edge < end)
        .min()
        .map_or(len, |edge| edge - offset)
}

/// Whether `[start, end)` lies inside one of the receiver's ranges.
pub(super) fn covered(have: &[(u64, u64)], start: u64, end: u64) -> bool {
    have.iter().any(|&(s, e)| s <= start && end <= e)
}
