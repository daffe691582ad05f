//! How long each block is: whole blocks, except near either end of a transfer, and never
//! across an edge of what the receiver already has.

// How long a block is, at either end of a transfer: the session's decision.
pub(super) use ferry_session::cut::cut;
pub use ferry_session::cut::{MIN_CUT_BLOCK, TAIL_SPLIT};

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
