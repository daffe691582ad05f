//! Per-core speed of each digest ferry computes, as the median of 5 passes over 256 MiB in
//! memory: `cargo run --release -p ferry-core --example digest_speed`.
//! Tells whether a `--checksum` choice can become the bottleneck of a transfer.

use std::time::Instant;

use ferry_core::digest::{algo_name, block_digest, FileHasher};
use ferry_proto::ChecksumAlgo;
use ferry_units::stats::upper_median;

fn main() {
    let data: Vec<u8> = (0..256u64 << 20)
        .map(|i| (i.wrapping_mul(0x9E37_79B9) >> 13) as u8)
        .collect();
    let mib = data.len() as f64 / (1 << 20) as f64;
    let mut rates = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let mut acc = 0u128;
        for chunk in data.chunks(8 << 20) {
            acc ^= block_digest(chunk);
        }
        std::hint::black_box(acc);
        rates.push(mib / t.elapsed().as_secs_f64());
    }
    println!(
        "{:<28} {:>8.0} MiB/s",
        "block digest (xxh3-128)",
        upper_median(&mut rates).unwrap_or(0.0)
    );
    for algo in [
        ChecksumAlgo::Blake3,
        ChecksumAlgo::Xxh3,
        ChecksumAlgo::Sha256,
        ChecksumAlgo::Md5,
    ] {
        let mut rates = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            let mut h = FileHasher::new(algo);
            for chunk in data.chunks(8 << 20) {
                h.update(chunk);
            }
            std::hint::black_box(h.finalize());
            rates.push(mib / t.elapsed().as_secs_f64());
        }
        println!(
            "{:<28} {:>8.0} MiB/s",
            format!("file digest ({})", algo_name(algo)),
            upper_median(&mut rates).unwrap_or(0.0)
        );
    }
}
