//! Block and file digests.
//!
//! Blocks carry XXH3-128: it runs at memory speed, so checking every block before it is written
//! costs almost nothing. Whole files get a cryptographic or catalogue digest chosen by the user,
//! computed in offset order by the sender and, by the receiver, from blocks in any order: a
//! BLAKE3 tree ([`Blake3Tree`]) or in offset order with a read-back of what arrived ahead
//! (`recv`, the other algorithms).

use ferry_proto::ChecksumAlgo;
use md5::Digest as _;

/// Digest of one block as carried in `Block::digest`.
pub fn block_digest(data: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(data)
}

/// A running whole-file digest.
pub enum FileHasher {
    Blake3(Box<blake3::Hasher>),
    Xxh3(Box<xxhash_rust::xxh3::Xxh3>),
    Sha256(sha2::Sha256),
    Md5(md5::Md5),
}

impl FileHasher {
    pub fn new(algo: ChecksumAlgo) -> Self {
        match algo {
            ChecksumAlgo::Blake3 => Self::Blake3(Box::default()),
            ChecksumAlgo::Xxh3 => Self::Xxh3(Box::default()),
            ChecksumAlgo::Sha256 => Self::Sha256(sha2::Sha256::new()),
            ChecksumAlgo::Md5 => Self::Md5(md5::Md5::new()),
        }
    }

    pub fn update(&mut self, data: &[u8]) {
        match self {
            Self::Blake3(h) => {
                h.update(data);
            }
            Self::Xxh3(h) => h.update(data),
            Self::Sha256(h) => h.update(data),
            Self::Md5(h) => h.update(data),
        }
    }

    pub fn finalize(self) -> Vec<u8> {
        match self {
            Self::Blake3(h) => h.finalize().as_bytes().to_vec(),
            Self::Xxh3(h) => h.digest128().to_be_bytes().to_vec(),
            Self::Sha256(h) => h.finalize().to_vec(),
            Self::Md5(h) => h.finalize().to_vec(),
        }
    }
}

/// BLAKE3 of a file put together from pieces that arrive in any order.
///
/// BLAKE3 is a tree: every aligned power-of-two run of 1 KiB chunks that is not the whole
/// input is a subtree whose chaining value can be computed on its own
/// (`blake3::hazmat`), and merging them by the tree's shape gives exactly `blake3::hash` of
/// the whole. So a receiver can hash each block from memory as it arrives, on whichever
/// thread writes it, instead of reading back what arrived ahead of an in-order cursor (which
/// was most of a multi-stream file, and the end of a transfer waited for its catch-up).
/// Nothing about the digest changes on the wire.
///
/// Sans I/O: [`Blake3Tree::pieces`] hashes a block's data, [`Blake3Tree::insert`] files the
/// results, [`Blake3Tree::missing`] names what no block covered whole (a piece of a chunk at
/// an unaligned block edge: the caller reads those back), [`Blake3Tree::finish`] merges.
/// Nodes are kept as (level, index): level `k` covers `1 KiB << k` bytes from `index` times
/// that, cut at the end of the file. Siblings merge as soon as both are there, so what is
/// kept is a few nodes per gap between the blocks that have arrived, not one per chunk.
#[derive(Debug)]
pub struct Blake3Tree {
    size: u64,
    nodes: std::collections::HashMap<(u8, u64), blake3::hazmat::ChainingValue>,
    /// Set when the nodes outgrew [`Self::MAX_NODES`]: they were dropped, and the whole file
    /// is read back at the end.
    gave_up: bool,
}

/// One hashed subtree of a file: where it sits in the tree and its chaining value.
#[derive(Clone, Copy, Debug)]
pub struct Piece {
    level: u8,
    index: u64,
    cv: blake3::hazmat::ChainingValue,
}

const CHUNK: u64 = blake3::CHUNK_LEN as u64;

impl Piece {
    /// The piece for the subtree of `len` bytes at `at` (a span of [`Blake3Tree::spans`]).
    fn at(at: u64, len: u64, cv: blake3::hazmat::ChainingValue) -> Self {
        let level = (len.max(CHUNK) / CHUNK).trailing_zeros() as u8;
        Self {
            level,
            index: at / (CHUNK << level),
            cv,
        }
    }

    /// The subtree's chaining value: what a stripe host reports of a block it wrote.
    pub fn cv(&self) -> [u8; 32] {
        self.cv
    }
}

/// The BLAKE3 subtrees of one range of a file, hashed as the range's bytes come in order:
/// what one reader of a segment computes, so that several readers hash one file at once and
/// a [`Blake3Tree`] merges their pieces into exactly `blake3::hash` of the file.
pub struct RangeHasher {
    /// The subtrees still to hash, last first.
    spans: Vec<(u64, u64)>,
    /// The subtree being hashed: its start, its end and its hasher.
    current: Option<(u64, u64, blake3::Hasher)>,
    /// The next byte expected.
    at: u64,
    out: Vec<Piece>,
}

impl RangeHasher {
    /// For `[start, end)` of a file of `size` bytes (more than [`Blake3Tree::MIN_SIZE`]):
    /// `start` on a chunk edge (1 KiB), `end` too unless it is the file's end. `None` for a
    /// range that is not one.
    pub fn new(size: u64, start: u64, end: u64) -> Option<Self> {
        let valid = size > Blake3Tree::MIN_SIZE
            && start <= end
            && end <= size
            && start.is_multiple_of(CHUNK)
            && (end == size || end.is_multiple_of(CHUNK));
        valid.then(|| {
            let mut spans = Blake3Tree::spans(size, start, end);
            spans.reverse();
            Self {
                spans,
                current: None,
                at: start,
                out: Vec::new(),
            }
        })
    }

    /// The next bytes of the range, following the last ones given. Bytes past its end are
    /// ignored.
    pub fn update(&mut self, mut data: &[u8]) {
        use blake3::hazmat::HasherExt as _;
        while !data.is_empty() {
            let (start, end, hasher) = match &mut self.current {
                Some(c) => c,
                None => {
                    let Some((at, len)) = self.spans.pop() else {
                        return;
                    };
                    let mut h = blake3::Hasher::new();
                    h.set_input_offset(at);
                    self.current.insert((at, at + len, h))
                }
            };
            let take = ((*end - self.at) as usize).min(data.len());
            hasher.update(&data[..take]);
            self.at += take as u64;
            data = &data[take..];
            if self.at == *end {
                let piece = Piece::at(*start, *end - *start, hasher.finalize_non_root());
                self.out.push(piece);
                self.current = None;
            }
        }
    }

    /// The range's pieces, for [`Blake3Tree::insert`]; `None` unless every byte of the range
    /// was given.
    pub fn finish(self) -> Option<Vec<Piece>> {
        (self.current.is_none() && self.spans.is_empty()).then_some(self.out)
    }
}

impl Blake3Tree {
    /// Files of up to this many bytes are not worth a tree: they arrive as one block, hashed
    /// in order from memory anyway.
    pub const MIN_SIZE: u64 = 64 << 10;

    /// A tree for a file of `size` bytes, more than [`Self::MIN_SIZE`] (a file of one chunk
    /// has no subtrees to merge).
    pub fn new(size: u64) -> Option<Self> {
        (size > Self::MIN_SIZE).then(|| Self {
            size,
            nodes: Default::default(),
            gave_up: false,
        })
    }

    /// Nodes kept at most per file: 4,096 × 48 bytes of key and value, some 200 KB with the
    /// map's own overhead (computed, not measured). Blocks cut on chunk edges leave a few
    /// nodes per gap between the blocks in flight, and gaps close as blocks arrive; but a
    /// chunk split between two blocks stays a gap until the end, so a peer that cut every
    /// block off the edges could make the map a few percent of the file. Past this the tree
    /// gives up and the file is read back whole once written: slower, never unbounded.
    pub const MAX_NODES: usize = 4096;

    /// Whether the tree dropped its nodes ([`Self::MAX_NODES`]).
    pub fn gave_up(&self) -> bool {
        self.gave_up
    }

    /// After giving up: an empty tree for the read-back of the whole file.
    pub fn start_over(&mut self) {
        self.nodes = Default::default();
        self.gave_up = false;
    }

    /// The size of the file this tree is for.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Hashes the whole subtrees inside `data`, which sits at `offset` in a file of `size`
    /// bytes: aligned power-of-two runs of chunks, and the file's last, short chunk if the
    /// data reaches it. Bytes at unaligned edges are left out (see [`Self::missing`]). Runs
    /// without any lock; a range outside the file gives nothing.
    pub fn pieces(size: u64, offset: u64, data: &[u8]) -> Vec<Piece> {
        use blake3::hazmat::HasherExt as _;
        let Some(end) = offset.checked_add(data.len() as u64) else {
            return Vec::new();
        };
        if size <= Self::MIN_SIZE || end > size {
            return Vec::new();
        }
        let start = offset.next_multiple_of(CHUNK);
        // Only the file's end may cut a chunk short.
        let stop = if end == size { end } else { end - end % CHUNK };
        Self::spans(size, start, stop)
            .into_iter()
            .map(|(at, len)| {
                let from = (at - offset) as usize;
                let cv = blake3::Hasher::new()
                    .set_input_offset(at)
                    .update(&data[from..from + len as usize])
                    .finalize_non_root();
                Piece::at(at, len, cv)
            })
            .collect()
    }

    /// The pieces of the block of `len` bytes at `offset` in a file of `size` bytes from their
    /// chaining values, in the order [`Self::pieces`] gives them (another host hashed the
    /// bytes): where each sits follows from the block, only the values are the host's.
    /// `None` when their number is not the block's number of pieces.
    pub fn pieces_from(size: u64, offset: u64, len: u64, cvs: &[[u8; 32]]) -> Option<Vec<Piece>> {
        let end = offset.checked_add(len)?;
        if size <= Self::MIN_SIZE || end > size {
            return None;
        }
        let start = offset.next_multiple_of(CHUNK);
        let stop = if end == size { end } else { end - end % CHUNK };
        let spans = Self::spans(size, start, stop);
        (spans.len() == cvs.len()).then(|| {
            spans
                .into_iter()
                .zip(cvs)
                .map(|((at, len), cv)| Piece::at(at, len, *cv))
                .collect()
        })
    }

    /// The subtrees that `[start, stop)` of a file of `size` bytes splits into, in order, as
    /// (offset, length): aligned power-of-two runs of chunks, each as large as its alignment
    /// allows, none the whole file (the root is merged, not hashed), and the file's last,
    /// short chunk. `start` is on a chunk edge, and so is `stop` unless it is the file's end.
    fn spans(size: u64, start: u64, stop: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut at = start;
        while at < stop {
            let left = stop - at;
            let len = if left < CHUNK {
                left // the last chunk of the file
            } else {
                // The largest power of two that `at` is aligned to, that fits, and that is
                // not the whole file.
                let mut len = 1u64 << (63 - left.leading_zeros());
                if at > 0 {
                    len = len.min(1u64 << at.trailing_zeros());
                }
                while len >= size {
                    len /= 2;
                }
                len
            };
            out.push((at, len));
            at += len;
        }
        out
    }

    /// Files a piece of [`Self::pieces`] (computed for this file's size), merging it with its
    /// sibling while both are there. A piece that a node already filed covers (a copy of a
    /// block) is dropped.
    pub fn insert(&mut self, piece: Piece) {
        let Piece {
            mut level,
            mut index,
            mut cv,
        } = piece;
        if self.gave_up || self.covered(level, index) {
            return;
        }
        loop {
            let span = CHUNK << level;
            // Merged only below the root, and only with a sibling inside the file.
            let sibling = index ^ 1;
            let is_root = index / 2 == 0 && span.saturating_mul(2) >= self.size;
            let other = if is_root || sibling.saturating_mul(span) >= self.size {
                None
            } else {
                self.nodes.remove(&(level, sibling))
            };
            let Some(other) = other else {
                self.nodes.insert((level, index), cv);
                if self.nodes.len() > Self::MAX_NODES {
                    self.nodes = Default::default();
                    self.gave_up = true;
                }
                return;
            };
            let (l, r) = if index & 1 == 0 {
                (cv, other)
            } else {
                (other, cv)
            };
            cv = blake3::hazmat::merge_subtrees_non_root(&l, &r, blake3::hazmat::Mode::Hash);
            level += 1;
            index /= 2;
        }
    }

    /// Whether the node at (level, index) or one above it is filed.
    fn covered(&self, level: u8, index: u64) -> bool {
        // 2^10 << 53 bytes is past any file a u64 can size.
        (level..=53).any(|l| {
            let up = u32::from(l - level);
            self.nodes.contains_key(&(l, index >> up))
        })
    }

    /// The node covering `[offset, offset + len)`, a node of the file's tree.
    fn node(&self, offset: u64, len: u64) -> Option<&blake3::hazmat::ChainingValue> {
        let level = len.div_ceil(CHUNK).next_power_of_two().trailing_zeros() as u8;
        let span = CHUNK << level;
        offset
            .is_multiple_of(span)
            .then(|| self.nodes.get(&(level, offset / span)))
            .flatten()
    }

    /// Byte ranges of the file that no filed piece covers, in order: read them back and pass
    /// them through [`Self::pieces`] before [`Self::finish`].
    pub fn missing(&self) -> Vec<(u64, u64)> {
        if self.gave_up {
            return vec![(0, self.size)];
        }
        let mut out: Vec<(u64, u64)> = Vec::new();
        self.walk_missing(0, self.size, &mut out);
        out
    }

    fn walk_missing(&self, offset: u64, len: u64, out: &mut Vec<(u64, u64)>) {
        if offset != 0 || len != self.size {
            if self.node(offset, len).is_some() {
                return;
            }
            if len <= CHUNK {
                match out.last_mut() {
                    Some((_, end)) if *end == offset => *end += len,
                    _ => out.push((offset, offset + len)),
                }
                return;
            }
        }
        let left = blake3::hazmat::left_subtree_len(len);
        self.walk_missing(offset, left, out);
        self.walk_missing(offset + left, len - left, out);
    }

    fn chaining_value(&self, offset: u64, len: u64) -> Option<blake3::hazmat::ChainingValue> {
        if let Some(cv) = self.node(offset, len) {
            return Some(*cv);
        }
        if len <= CHUNK {
            return None;
        }
        let left = blake3::hazmat::left_subtree_len(len);
        let l = self.chaining_value(offset, left)?;
        let r = self.chaining_value(offset + left, len - left)?;
        Some(blake3::hazmat::merge_subtrees_non_root(
            &l,
            &r,
            blake3::hazmat::Mode::Hash,
        ))
    }

    /// The file's BLAKE3, or `None` while [`Self::missing`] is not empty.
    pub fn finish(&self) -> Option<Vec<u8>> {
        let left = blake3::hazmat::left_subtree_len(self.size);
        let l = self.chaining_value(0, left)?;
        let r = self.chaining_value(left, self.size - left)?;
        let root = blake3::hazmat::merge_subtrees_root(&l, &r, blake3::hazmat::Mode::Hash);
        Some(root.as_bytes().to_vec())
    }
}

/// The name users type and manifests print.
pub fn algo_name(algo: ChecksumAlgo) -> &'static str {
    match algo {
        ChecksumAlgo::Blake3 => "blake3",
        ChecksumAlgo::Xxh3 => "xxh3",
        ChecksumAlgo::Sha256 => "sha256",
        ChecksumAlgo::Md5 => "md5",
    }
}

pub fn parse_algo(s: &str) -> Option<ChecksumAlgo> {
    Some(match s.to_ascii_lowercase().as_str() {
        "blake3" | "b3" => ChecksumAlgo::Blake3,
        "xxh3" | "xxh3-128" => ChecksumAlgo::Xxh3,
        "sha256" | "sha-256" => ChecksumAlgo::Sha256,
        "md5" => ChecksumAlgo::Md5,
        _ => return None,
    })
}

/// Lower-case hex of `bytes`. By table, not `write!` per byte: a put spells every file's
/// digest for its report, which was 1 % of a tiny tree's client CPU through the formatter.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

/// The 32 bytes that 64 hex digits (either case) spell, for digests and fingerprints typed or
/// stored as text; `None` for anything else.
pub fn unhex32(s: &str) -> Option<[u8; 32]> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (o, pair) in out.iter_mut().zip(b.chunks_exact(2)) {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        *o = (hi * 16 + lo) as u8;
    }
    Some(out)
}

/// Whole-file digests known without reading the file: a server's catalog holds each stored
/// file's, for the size and mtime it was stored with. A comparison by content (a re-run's
/// proof of a same-size, same-mtime file; `sync --checksum`) asks here before it reads.
pub trait KnownDigests: Send + Sync {
    /// The `algo` digest of the file at wire path `path`, if one is known for exactly this
    /// size and mtime.
    fn known(&self, path: &str, size: u64, mtime_ns: i64, algo: ChecksumAlgo) -> Option<Vec<u8>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_spells_every_nibble_in_lower_case() {
        let all: Vec<u8> = (0..=255).collect();
        let want: String = all.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex(&all), want);
        assert_eq!(hex(&[]), "");
    }

    /// Deterministic bytes that differ at every offset (a repeated pattern would hide a piece
    /// filed at the wrong place).
    fn data(size: u64) -> Vec<u8> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        (0..size)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// Feeds `blocks` (offset, end) of `data` in the order given, then what `missing` names,
    /// as a receiver does.
    fn tree_digest(data: &[u8], blocks: &[(u64, u64)]) -> Vec<u8> {
        let size = data.len() as u64;
        let mut tree = Blake3Tree::new(size).expect("large enough");
        for &(s, e) in blocks {
            for p in Blake3Tree::pieces(size, s, &data[s as usize..e as usize]) {
                tree.insert(p);
            }
        }
        let missing = tree.missing();
        if tree.gave_up() {
            tree.start_over();
        }
        for (s, e) in missing {
            for p in Blake3Tree::pieces(size, s, &data[s as usize..e as usize]) {
                tree.insert(p);
            }
        }
        assert!(tree.missing().is_empty(), "read-back filled every gap");
        tree.finish().expect("complete")
    }

    /// Blocks hashed by another host and sent as chaining values only merge to exactly
    /// `blake3::hash`; the wrong number of values is refused, a wrong value changes the root,
    /// and no block of the largest size has more values than `Landed` may carry.
    #[test]
    fn pieces_rebuilt_from_their_chaining_values_merge_to_blake3() {
        const BLOCK: u64 = 256 << 10;
        for size in [
            BLOCK + 1,
            3 * BLOCK - 1,
            3 * BLOCK,
            3 * BLOCK + 1,
            5 * BLOCK + 777,
        ] {
            let d = data(size);
            let mut tree = Blake3Tree::new(size).unwrap();
            let mut forged = Blake3Tree::new(size).unwrap();
            for (i, s) in (0..size).step_by(BLOCK as usize).enumerate() {
                let e = (s + BLOCK).min(size);
                let block = &d[s as usize..e as usize];
                let cvs: Vec<[u8; 32]> = Blake3Tree::pieces(size, s, block)
                    .iter()
                    .map(Piece::cv)
                    .collect();
                assert!(Blake3Tree::pieces_from(size, s, e - s, &cvs[1..]).is_none());
                for p in Blake3Tree::pieces_from(size, s, e - s, &cvs).unwrap() {
                    tree.insert(p);
                }
                let mut lie = cvs.clone();
                if i == 1 {
                    lie[0][0] ^= 1;
                }
                for p in Blake3Tree::pieces_from(size, s, e - s, &lie).unwrap() {
                    forged.insert(p);
                }
            }
            assert!(tree.missing().is_empty(), "{size}");
            let want = blake3::hash(&d).as_bytes().to_vec();
            assert_eq!(tree.finish(), Some(want.clone()), "{size}");
            assert_ne!(forged.finish(), Some(want), "{size}");
        }
        let max = u64::from(ferry_proto::MAX_BLOCK_DATA);
        // The worst cut: a block of the largest size starting one chunk past a large
        // power of two, ending one chunk short of the next.
        for (size, offset, end) in [
            (4 * max, max, 2 * max),
            (4 * max + 1, 3 * max, 4 * max + 1),
            (3 * max, CHUNK, max + CHUNK),
            (1 << 40, (1 << 30) + CHUNK, (1 << 30) + max - CHUNK),
        ] {
            let n = Blake3Tree::spans(size, offset, end).len();
            assert!(n <= ferry_proto::MAX_LANDED_CVS, "{size} {offset}: {n}");
        }
    }

    /// A file cut into aligned segments, each hashed by a [`RangeHasher`] fed in uneven
    /// pieces, the segments merged in a scrambled order: exactly `blake3::hash`, at and around
    /// every edge a sender cuts on (chunks, segments, powers of two).
    #[test]
    fn segments_hashed_apart_merge_to_blake3() {
        const SEG: u64 = 256 << 10;
        let mut sizes = vec![Blake3Tree::MIN_SIZE + 1, 3 * SEG + 12_345, 1 << 22];
        for edge in [SEG, 2 * SEG, 4 * SEG, 5 * SEG] {
            sizes.extend([edge - CHUNK - 1, edge - 1, edge, edge + 1, edge + CHUNK + 1]);
        }
        for size in sizes {
            let d = data(size);
            let count = size.div_ceil(SEG);
            let mut tree = Blake3Tree::new(size).unwrap();
            // Odd segments first, then even ones backwards: merge order does not matter.
            let order = (0..count)
                .filter(|i| i % 2 == 1)
                .chain((0..count).filter(|i| i % 2 == 0).rev());
            for i in order {
                let (start, end) = (i * SEG, ((i + 1) * SEG).min(size));
                let mut h = RangeHasher::new(size, start, end).expect("a valid range");
                let mut at = start;
                let mut step = 1u64;
                while at < end {
                    // 1, 3, 9, ... bytes, then whatever is left: every alignment.
                    let len = step.min(end - at);
                    h.update(&d[at as usize..(at + len) as usize]);
                    at += len;
                    step = step * 3 % 70_001 + 1;
                }
                for p in h.finish().expect("the whole range was given") {
                    tree.insert(p);
                }
            }
            assert_eq!(tree.missing(), vec![], "size {size}");
            assert_eq!(
                tree.finish().unwrap(),
                blake3::hash(&d).as_bytes().to_vec(),
                "size {size}"
            );
        }
    }

    #[test]
    fn range_hasher_refuses_bad_ranges_and_short_input() {
        let size = 1u64 << 20;
        assert!(RangeHasher::new(Blake3Tree::MIN_SIZE, 0, 1024).is_none());
        assert!(RangeHasher::new(size, 1, 2048).is_none());
        assert!(RangeHasher::new(size, 0, 1500).is_none());
        assert!(RangeHasher::new(size, 2048, 1024).is_none());
        assert!(RangeHasher::new(size, 0, size + 1024).is_none());
        let mut h = RangeHasher::new(size, 0, 4096).unwrap();
        h.update(&[0; 4000]);
        assert!(h.finish().is_none(), "96 bytes were never given");
        let mut h = RangeHasher::new(size, 0, 4096).unwrap();
        h.update(&[0; 5000]);
        assert_eq!(h.finish().map(|p| p.len()), Some(1), "one 4 KiB subtree");
    }

    #[test]
    fn tree_of_aligned_blocks_is_blake3_without_read_back() {
        // The shapes a transfer cuts: 256 KiB head blocks, whole 1 MiB blocks, 64 KiB tail
        // cuts, a short last block; sizes at and around powers of two.
        for size in [
            (1u64 << 17) + 1,
            1 << 20,
            (1 << 20) + 1,
            (1 << 20) - 1,
            3 << 20,
            (5 << 20) + 12_345,
        ] {
            let d = data(size);
            let mut blocks = Vec::new();
            let mut at = 0;
            let mut n = 0u64;
            while at < size {
                let len = match n {
                    0..=3 => 256 << 10,
                    _ if size - at < (2 << 20) => 64 << 10,
                    _ => 1 << 20,
                }
                .min(size - at);
                blocks.push((at, at + len));
                at += len;
                n += 1;
            }
            blocks.reverse();
            let mut tree = Blake3Tree::new(size).unwrap();
            for &(s, e) in &blocks {
                for p in Blake3Tree::pieces(size, s, &d[s as usize..e as usize]) {
                    tree.insert(p);
                }
            }
            assert_eq!(
                tree.missing(),
                vec![],
                "size {size}: aligned blocks cover all"
            );
            assert_eq!(tree.finish().unwrap(), blake3::hash(&d).as_bytes().to_vec());
            // Merged as they came: a handful of nodes, not one per block.
            assert!(
                tree.nodes.len() <= 64,
                "size {size}: {} nodes",
                tree.nodes.len()
            );
        }
    }

    /// Blocks that each leave a lone chunk between two split ones (a peer choosing its cuts):
    /// the map stops at its bound, gives up, and the whole-file read-back still gives BLAKE3.
    #[test]
    fn cuts_off_the_chunk_edges_keep_the_tree_bounded() {
        let size = 24u64 << 20;
        let d = data(size);
        let mut tree = Blake3Tree::new(size).unwrap();
        let mut most = 0;
        let mut at = 0;
        while at < size {
            // [2jC - 1, 2jC + C + 1): one whole chunk, split chunks either side.
            let end = (at + 2 * CHUNK).min(size);
            let (s, e) = (at.saturating_sub(1), (end - CHUNK + 1).min(size));
            for p in Blake3Tree::pieces(size, s, &d[s as usize..e as usize]) {
                tree.insert(p);
            }
            most = most.max(tree.nodes.len());
            at = end;
        }
        assert!(tree.gave_up(), "12,288 lone chunks are more than the bound");
        assert!(most <= Blake3Tree::MAX_NODES, "{most} nodes kept");
        assert_eq!(tree.missing(), vec![(0, size)]);
        let blocks: Vec<(u64, u64)> = vec![];
        assert_eq!(
            tree_digest(&d, &blocks),
            blake3::hash(&d).as_bytes().to_vec()
        );
        tree.start_over();
        for p in Blake3Tree::pieces(size, 0, &d) {
            tree.insert(p);
        }
        assert_eq!(tree.finish().unwrap(), blake3::hash(&d).as_bytes().to_vec());
    }

    #[test]
    fn an_empty_tree_misses_the_whole_file() {
        let size = (1 << 20) + 7;
        let tree = Blake3Tree::new(size).unwrap();
        assert_eq!(tree.missing(), vec![(0, size)]);
        assert_eq!(tree.finish(), None);
        assert!(Blake3Tree::new(Blake3Tree::MIN_SIZE).is_none());
        // Outside the file: nothing, no panic.
        assert!(Blake3Tree::pieces(size, size - 10, &[0u8; 20]).is_empty());
        assert!(Blake3Tree::pieces(size, u64::MAX - 5, &[0u8; 20]).is_empty());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

        /// Blocks cut anywhere (unaligned edges included), in any order, some arriving twice
        /// (the sender's endgame): the tree gives BLAKE3 of the whole file.
        #[test]
        fn tree_of_blocks_in_any_order_is_blake3(
            size in proptest::prop_oneof![
                (Blake3Tree::MIN_SIZE + 1)..(700u64 << 10),
                proptest::sample::select(vec![1u64 << 17, (1 << 18) + 1, (1 << 19) - 1, 3 << 17]),
            ],
            cuts in proptest::collection::vec(0u64..u64::MAX, 0..12),
            aligned in proptest::bool::ANY,
            copies in proptest::collection::vec((0u64..u64::MAX, 0u64..u64::MAX), 0..4),
            seed in 0u64..u64::MAX,
        ) {
            let d = data(size);
            let mut points: Vec<u64> = cuts
                .iter()
                .map(|c| if aligned { (c % size) & !0xffff } else { c % size })
                .chain([0, size])
                .collect();
            points.sort_unstable();
            points.dedup();
            let mut blocks: Vec<(u64, u64)> = points.windows(2).map(|w| (w[0], w[1])).collect();
            for (a, b) in copies {
                let (s, e) = ((a % size).min(b % size), (a % size).max(b % size));
                if s < e {
                    blocks.push((s, e));
                }
            }
            let mut x = seed | 1;
            for i in (1..blocks.len()).rev() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                blocks.swap(i, (x % (i as u64 + 1)) as usize);
            }
            proptest::prop_assert_eq!(
                tree_digest(&d, &blocks),
                blake3::hash(&d).as_bytes().to_vec()
            );
        }
    }

    #[test]
    fn known_vectors() {
        let run = |a| {
            let mut h = FileHasher::new(a);
            h.update(b"ab");
            h.update(b"c");
            hex(&h.finalize())
        };
        assert_eq!(run(ChecksumAlgo::Md5), "900150983cd24fb0d6963f7d28e17f72");
        assert_eq!(
            run(ChecksumAlgo::Sha256),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            run(ChecksumAlgo::Blake3),
            "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
        );
    }
}
