//! Per-core speed of the digests ferry computes and of AES-256-GCM, measured in memory.

use std::time::Instant;

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM};
use ferry_core::digest::{algo_name, block_digest, FileHasher};
use ferry_proto::ChecksumAlgo;
use ferry_units::stats::median_or_zero;
use serde::Serialize;

use crate::ProbeProgress;

/// One measured speed.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Speed {
    /// Short name: `"xxh3-128 block"`, `"blake3"`, `"aes-256-gcm seal"`, …
    pub name: String,
    /// What ferry uses it for.
    pub role: String,
    /// Median over the passes, MiB/s on one core.
    pub mib_per_s: f64,
}

/// TLS records carry at most 16 KiB of plaintext; AES-GCM is measured on records of that size.
pub const TLS_RECORD: usize = 16 * 1024;

/// Pseudo-random bytes (not zeros: some code paths are faster on zeros).
pub(crate) fn fill_pseudo_random(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for chunk in buf.chunks_mut(8) {
        // xorshift64*
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let v = x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

fn rate(bytes: usize, start: Instant) -> f64 {
    bytes as f64 / (1 << 20) as f64 / start.elapsed().as_secs_f64().max(1e-9)
}

/// Measures every speed on `bytes` of data (at least one TLS record), `passes` times each, and
/// returns the medians: XXH3-128 block digest, the file digests (BLAKE3, XXH3-128, SHA-256,
/// MD5), and AES-256-GCM seal and open of 16 KiB records.
pub fn measure_speeds(bytes: usize, passes: u32, progress: &dyn ProbeProgress) -> Vec<Speed> {
    let bytes = bytes.max(TLS_RECORD).div_ceil(TLS_RECORD) * TLS_RECORD;
    let passes = passes.max(1);
    let mut data = vec![0u8; bytes];
    fill_pseudo_random(&mut data, 0x9E37_79B9_7F4A_7C15);
    let chunk = 8 << 20;
    let mut out = Vec::new();

    progress.on_step("speed: xxh3-128 block digest");
    let mut rates = Vec::new();
    for _ in 0..passes {
        let t = Instant::now();
        let mut acc = 0u128;
        for c in data.chunks(chunk) {
            acc ^= block_digest(c);
        }
        std::hint::black_box(acc);
        rates.push(rate(bytes, t));
    }
    out.push(Speed {
        name: "xxh3-128".into(),
        role: "block digest (every block)".into(),
        mib_per_s: median_or_zero(rates),
    });

    for algo in [
        ChecksumAlgo::Blake3,
        ChecksumAlgo::Xxh3,
        ChecksumAlgo::Sha256,
        ChecksumAlgo::Md5,
    ] {
        progress.on_step(&format!("speed: {} file digest", algo_name(algo)));
        let mut rates = Vec::new();
        for _ in 0..passes {
            let t = Instant::now();
            let mut h = FileHasher::new(algo);
            for c in data.chunks(chunk) {
                h.update(c);
            }
            std::hint::black_box(h.finalize());
            rates.push(rate(bytes, t));
        }
        out.push(Speed {
            name: algo_name(algo).into(),
            role: if algo == ChecksumAlgo::Blake3 {
                "file digest (default --checksum)".into()
            } else {
                format!("file digest (--checksum {})", algo_name(algo))
            },
            mib_per_s: median_or_zero(rates),
        });
    }

    progress.on_step("speed: aes-256-gcm, 16 KiB records");
    out.extend(aes_gcm(&mut data, passes));
    out
}

/// Seals every 16 KiB record of `data` in place and opens it again, `passes` times, timing both.
/// Nonces repeat across passes: harmless for a benchmark with a throwaway key, never for real
/// traffic.
fn aes_gcm(data: &mut [u8], passes: u32) -> Vec<Speed> {
    let mut key_bytes = [0u8; 32];
    fill_pseudo_random(&mut key_bytes, 42);
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &key_bytes).expect("32-byte key"));
    let nonce = |i: usize| {
        let mut n = [0u8; 12];
        n[4..].copy_from_slice(&(i as u64).to_be_bytes());
        Nonce::assume_unique_for_key(n)
    };
    let bytes = data.len();
    let mut tags: Vec<Tag> = Vec::with_capacity(bytes / TLS_RECORD);
    let (mut seal, mut open) = (Vec::new(), Vec::new());
    for _ in 0..passes {
        tags.clear();
        let t = Instant::now();
        for (i, rec) in data.chunks_mut(TLS_RECORD).enumerate() {
            tags.push(
                key.seal_in_place_separate_tag(nonce(i), Aad::empty(), rec)
                    .expect("seal"),
            );
        }
        seal.push(rate(bytes, t));
        let t = Instant::now();
        for (i, rec) in data.chunks_mut(TLS_RECORD).enumerate() {
            key.open_in_place_separate_tag(nonce(i), Aad::empty(), tags[i].as_ref(), rec)
                .expect("open what was just sealed");
        }
        open.push(rate(bytes, t));
    }
    vec![
        Speed {
            name: "aes-256-gcm seal".into(),
            role: "TLS send (16 KiB records)".into(),
            mib_per_s: median_or_zero(seal),
        },
        Speed {
            name: "aes-256-gcm open".into(),
            role: "TLS receive (16 KiB records)".into(),
            mib_per_s: median_or_zero(open),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_speeds_positive() {
        let s = measure_speeds(1 << 20, 1, &crate::NoProgress);
        let names: Vec<&str> = s.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "xxh3-128",
                "blake3",
                "xxh3",
                "sha256",
                "md5",
                "aes-256-gcm seal",
                "aes-256-gcm open"
            ]
        );
        assert!(s.iter().all(|s| s.mib_per_s > 0.0), "{s:?}");
    }
}
