//! Block and file digests.
//!
//! Blocks carry XXH3-128: it runs at memory speed, so checking every block before it is written
//! costs almost nothing. Whole files get a cryptographic or catalogue digest chosen by the user,
//! computed in offset order on both ends (see `recv::InOrderHasher` for out-of-order arrival).

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

pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
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

#[cfg(test)]
mod tests {
    use super::*;

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
