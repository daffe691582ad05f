//! How a file is cut into blocks: whole blocks in the middle of a transfer, small ones at
//! either end, so every connection starts early and they all finish together.

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
pub fn cut(left: u64, block: u64, streams: u64, queued: u64, remaining: Option<u64>) -> u64 {
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

/// File bytes a session may send early (before their decision), per data connection asked
/// for: one head block each ([`MIN_CUT_BLOCK`]). That is all a connection's first flight can
/// carry (10 segments of at most 9,000 bytes) with room to spare, and the decisions are back
/// when the round trip after it begins; more would only fill socket buffers with bytes that
/// are wasted when the receiver holds the file already (a re-run, a resume).
pub const EARLY_PER_STREAM: u64 = MIN_CUT_BLOCK;

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// Blocks of one file of `size` sent alone over `streams` connections.
    fn blocks(size: u64, block: u64, streams: u64) -> Vec<u64> {
        let (mut out, mut offset) = (Vec::new(), 0);
        while offset < size {
            let len = cut(
                size - offset,
                block,
                streams,
                out.len() as u64,
                Some(size - offset),
            );
            assert!(len > 0 && len <= block, "{len} at {offset}");
            out.push(len);
            offset += len;
        }
        assert_eq!(out.iter().sum::<u64>(), size);
        out
    }

    #[test]
    fn a_transfer_starts_and_ends_in_small_blocks() {
        let b = blocks(1 << 30, 8 * MIB, 16);
        // The first round of blocks gives every stream a small one, the next rounds double.
        assert!(b[..16].iter().all(|&l| l == MIN_CUT_BLOCK));
        assert!(b[16..32].iter().all(|&l| l == 2 * MIN_CUT_BLOCK));
        assert!(b.contains(&(8 * MIB)));
        // The last round of blocks is small enough for every stream to finish together.
        assert!(
            b[b.len() - 16..].iter().all(|&l| l <= 2 * MIN_CUT_BLOCK),
            "{:?}",
            &b[b.len() - 16..]
        );
        // The cutting costs blocks, not many: 128 whole blocks would do without it.
        assert!(b.len() < 450, "{} blocks", b.len());
    }

    #[test]
    fn a_tail_block_is_a_share_of_what_is_left() {
        // 64 MiB left over 4 streams: 4 MiB each.
        assert_eq!(cut(1 << 30, 8 * MIB, 4, 1000, Some(64 * MIB)), 4 * MIB);
        // Before the walk is over nothing is known about the tail.
        assert_eq!(cut(1 << 30, 8 * MIB, 4, 1000, None), 8 * MIB);
        // Never below the floor, however little is left.
        assert_eq!(cut(1 << 30, 8 * MIB, 4, 1000, Some(1000)), MIN_CUT_BLOCK);
    }

    #[test]
    fn no_sliver_is_left_behind_a_block() {
        // 300 KiB left of a file: one block, not 256 KiB and then 44 KiB.
        assert_eq!(cut(300 << 10, 8 * MIB, 4, 0, Some(300 << 10)), 300 << 10);
        // A small file is one block.
        assert_eq!(cut(10 << 10, 8 * MIB, 16, 0, None), 10 << 10);
        assert_eq!(cut(0, 8 * MIB, 16, 0, None), 0);
    }

    #[test]
    fn a_block_size_below_the_floor_is_kept() {
        assert!(blocks(10 * MIB, 64 << 10, 8).iter().all(|&l| l == 64 << 10));
    }
}
