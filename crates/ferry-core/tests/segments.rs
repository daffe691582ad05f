//! The sender's readers on files of every size, large ones read by several readers at once
//! (segments): every byte is queued exactly once, every block's digest is its data's, and the
//! file digest on the last block is what `b3sum` prints for the file.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::gate::Gate;
use ferry_core::send::{Sender, SenderConfig, Source};
use ferry_core::{NoReporter, Root};
use ferry_proto::{ChecksumAlgo, Decision, FileDecision, Frame};

const MIB: u64 = 1 << 20;
const KIB: u64 = 1 << 10;

/// Deterministic bytes that differ at every offset.
fn pattern(seed: u64, len: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// What the blocks of one file came to.
#[derive(Default)]
struct Got {
    /// offset -> length of each block queued.
    blocks: BTreeMap<u64, u64>,
    /// Offsets of the blocks sent early (before the file's decision was in).
    early: Vec<u64>,
    file_digest: Option<Vec<u8>>,
    /// The digest sent apart on control (`FileDigest`), when the receiver had every block.
    digest_apart: Option<Vec<u8>>,
}

/// Sends the tree under `dir/src` through a [`Sender`] with `readers` readers, answering every
/// offer with `decide(path)`, and returns each file's blocks by path. Each block's data is
/// checked against the source file and its digest against its data as it comes.
fn send_tree(
    dir: &Path,
    readers: u32,
    block: u32,
    decide: impl Fn(&str) -> Decision + Send + 'static,
) -> BTreeMap<String, Got> {
    send_tree_with(dir, readers, block, false, decide)
}

/// [`send_tree`], with the receiver taking a file's digest apart when it has every block
/// (`apart`: `Sender::digest_apart`).
fn send_tree_with(
    dir: &Path,
    readers: u32,
    block: u32,
    apart: bool,
    decide: impl Fn(&str) -> Decision + Send + 'static,
) -> BTreeMap<String, Got> {
    let root = Root::open(dir).unwrap();
    let source = Source {
        root,
        rel: "src".into(),
        name: "src".into(),
    };
    let config = SenderConfig {
        block_size: block,
        streams: 4,
        checksum: ChecksumAlgo::Blake3,
        readers: Arc::new(Gate::new(readers, readers)),
        corrupt_blocks: Vec::new(),
        digest_cache: Arc::default(),
    };
    let (tx, frames) = flume::bounded(64);
    let (ctl_tx, control) = flume::unbounded();
    let sender = Arc::new(Sender::start(
        vec![source],
        config,
        tx,
        ctl_tx,
        Arc::new(NoReporter),
    ));
    sender.grant(block, 4);
    if apart {
        sender.digest_apart();
    }
    // The receiver's side of the offers: a decision for every file, by its path; and the
    // digests sent apart, by path.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let apart_got = Arc::new(std::sync::Mutex::new(Vec::<(String, Vec<u8>)>::new()));
    let answering = {
        let (sender, stop, apart_got) = (sender.clone(), stop.clone(), apart_got.clone());
        std::thread::spawn(move || {
            let mut paths = std::collections::HashMap::new();
            let deadline = Instant::now() + Duration::from_secs(120);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline {
                let Ok(frame) = control.recv_timeout(Duration::from_millis(20)) else {
                    continue;
                };
                if let Frame::FileDigest { file, digest } = &frame {
                    let path: &String = &paths[file];
                    let rel = path.strip_prefix("src/").unwrap().to_string();
                    apart_got.lock().unwrap().push((rel, digest.to_vec()));
                }
                if let Frame::Offer { entries } = frame {
                    for e in &entries {
                        paths.insert(e.file, e.path.clone());
                    }
                    let decisions = entries
                        .iter()
                        .map(|e| FileDecision {
                            file: e.file,
                            decision: decide(&e.path),
                        })
                        .collect();
                    sender.decide(decisions);
                }
            }
        })
    };
    let base = dir.join("src");
    let mut got: BTreeMap<String, Got> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut done = false;
    while Instant::now() < deadline {
        match frames.recv_timeout(Duration::from_millis(50)) {
            Ok(Frame::Block(b)) => {
                let rel = b.file.path.strip_prefix("src/").unwrap().to_string();
                let len = b.data.len() as u64;
                assert_eq!(
                    b.digest,
                    ferry_core::digest::block_digest(&b.data),
                    "{rel}: block at {} carries its data's digest",
                    b.offset
                );
                let mut want = vec![0; len as usize];
                std::fs::File::open(base.join(&rel))
                    .unwrap()
                    .read_exact_at(&mut want, b.offset)
                    .unwrap();
                assert!(
                    want[..] == b.data[..],
                    "{rel}: block at {} is the file's bytes",
                    b.offset
                );
                let g = got.entry(rel.clone()).or_default();
                assert!(
                    g.blocks.insert(b.offset, len).is_none(),
                    "{rel}: the block at {} was queued twice",
                    b.offset
                );
                if b.early {
                    g.early.push(b.offset);
                }
                if let Some(d) = b.file_digest {
                    assert!(
                        g.file_digest.is_none(),
                        "{rel}: two blocks carry the digest"
                    );
                    g.file_digest = Some(d.to_vec());
                }
            }
            Ok(_) => {}
            Err(_) if sender.all_queued() && frames.is_empty() => {
                done = true;
                break;
            }
            Err(_) => {}
        }
    }
    assert!(done, "every file was queued within the deadline");
    sender.close();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    answering.join().unwrap();
    let sender = Arc::into_inner(sender).expect("the answering thread is gone");
    drop(frames);
    sender.finish();
    for (rel, d) in std::mem::take(&mut *apart_got.lock().unwrap()) {
        let g = got.entry(rel.clone()).or_default();
        assert!(g.digest_apart.is_none(), "{rel}: two digests apart");
        g.digest_apart = Some(d);
    }
    got
}

/// `b3sum`'s digest of each file, or `None` where b3sum is not installed (CI installs it:
/// there its absence fails the test).
fn b3sum(paths: &[std::path::PathBuf]) -> Option<Vec<String>> {
    let out = match std::process::Command::new("b3sum")
        .arg("--no-names")
        .args(paths)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "b3sum is not installed (scripts/bench-deps.sh installs it): {e}"
            );
            eprintln!("b3sum is not installed; comparing with the blake3 crate only");
            return None;
        }
    };
    assert!(out.status.success(), "b3sum failed");
    Some(
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect(),
    )
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The digest of a file, read in full by the blake3 crate (what b3sum computes).
fn blake3_of(path: &Path) -> String {
    let mut h = blake3::Hasher::new();
    h.update_reader(std::fs::File::open(path).unwrap()).unwrap();
    h.finalize().to_hex().to_string()
}

#[test]
fn every_size_arrives_once_with_the_digest_b3sum_prints() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    // With 1 MiB blocks a segment is 16 MiB: files over 32 MiB are split. Sizes at and around
    // chunk (1 KiB), block, segment and power-of-two edges.
    let mut sizes = vec![
        0,
        1,
        1023,
        1024,
        1025,
        64 * KIB,
        64 * KIB + 1,
        MIB - 1,
        MIB + 1,
    ];
    for edge in [32 * MIB, 48 * MIB, 64 * MIB] {
        sizes.extend([edge - KIB - 1, edge - 1, edge, edge + 1, edge + KIB + 1]);
    }
    sizes.push(100 * MIB + 12_345);
    let mut paths = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let p = src.join(format!("f{i:02}-{size}"));
        std::fs::write(&p, pattern(i as u64, size)).unwrap();
        paths.push(p);
    }
    let got = send_tree(dir.path(), 4, MIB as u32, |_| Decision::Send);
    let sums = b3sum(&paths);
    for (i, (p, &size)) in paths.iter().zip(&sizes).enumerate() {
        let name = p.file_name().unwrap().to_str().unwrap();
        let g = got
            .get(name)
            .unwrap_or_else(|| panic!("{name}: no block queued"));
        // The blocks tile the file exactly: no gap, no overlap.
        let mut at = 0;
        for (&off, &len) in &g.blocks {
            assert_eq!(off, at, "{name}: blocks tile the file");
            at += len;
        }
        assert_eq!(at, size, "{name}: blocks cover the file");
        let digest = hex(g
            .file_digest
            .as_deref()
            .expect("the last block carries the digest"));
        assert_eq!(digest, blake3_of(p), "{name}: the blake3 crate's digest");
        if let Some(sums) = &sums {
            assert_eq!(digest, sums[i], "{name}: b3sum's digest");
        }
    }
}

/// A file of several GiB (sparse, with written bytes at and around its segment and GiB
/// edges), read in segments by four readers: the digest is b3sum's.
#[test]
fn a_file_of_several_gib_has_the_digest_b3sum_prints() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let size = 3 * 1024 * MIB + 12_345;
    let path = src.join("big");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(size).unwrap();
    for (k, at) in [0, 32 * MIB - 7, 1024 * MIB - 1, 2048 * MIB + 5, size - 5000]
        .into_iter()
        .enumerate()
    {
        f.write_all_at(&pattern(k as u64 + 100, 4096.min(size - at)), at)
            .unwrap();
    }
    (&f).flush().unwrap();
    drop(f);
    let got = send_tree(dir.path(), 4, 8 * MIB as u32, |_| Decision::Send);
    let g = &got["big"];
    assert_eq!(g.blocks.values().sum::<u64>(), size);
    let digest = hex(g.file_digest.as_deref().unwrap());
    assert_eq!(digest, blake3_of(&path));
    if let Some(sums) = b3sum(std::slice::from_ref(&path)) {
        assert_eq!(digest, sums[0], "b3sum's digest");
    }
}

/// A split file resumed: the ranges the receiver has are not sent again (the last block
/// always is: it carries the digest), and the digest still covers the whole file.
#[test]
fn a_resumed_split_file_sends_only_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let size = 70 * MIB + 333;
    let path = src.join("r");
    std::fs::write(&path, pattern(7, size)).unwrap();
    let have = vec![(0, 20 * MIB + 4096), (33 * MIB, 50 * MIB), (70 * MIB, size)];
    let decided = have.clone();
    let got = send_tree(dir.path(), 3, MIB as u32, move |_| Decision::Resume {
        have: decided.clone(),
    });
    let g = &got["r"];
    // Blocks sent early, before the decision, are the protocol's bet; the rest must be gaps.
    let early: u64 = g.early.iter().map(|o| g.blocks[o]).sum();
    assert!(early <= 4 * 256 * KIB, "{early} bytes early");
    let sent: u64 = g.blocks.values().sum::<u64>() - early;
    let last = g.blocks.iter().next_back().map(|(&o, &l)| (o, l)).unwrap();
    assert_eq!(last.0 + last.1, size, "the last block is sent");
    for (&off, &len) in &g.blocks {
        let inside = have.iter().any(|&(s, e)| s <= off && off + len <= e);
        assert!(
            !inside || off + len == size || g.early.contains(&off),
            "block at {off} (+{len}) was already there"
        );
    }
    let missing: u64 = size - have.iter().map(|(s, e)| e - s).sum::<u64>();
    assert_eq!(sent, missing + last.1, "only the gaps and the last block");
    assert_eq!(hex(g.file_digest.as_deref().unwrap()), blake3_of(&path));
}

/// One-block files the receiver has whole (a striped get's stripe hosts brought them): with
/// `digest_apart` each one not sent early is read and hashed, and only its digest goes, on
/// control; one that left early (before its decision) keeps its block with the digest. Either
/// way each file's digest arrives once and is the file's.
#[test]
fn a_file_the_receiver_has_whole_gets_its_digest_apart() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let n = 60u64;
    for i in 0..n {
        std::fs::write(src.join(format!("s{i}")), pattern(i, 1000 + i * 1500)).unwrap();
    }
    let got = send_tree_with(dir.path(), 2, MIB as u32, true, |_| Decision::Resume {
        have: Vec::new(),
    });
    // With no ranges had, every file's block is sent: nothing apart.
    assert!(got.values().all(|g| g.digest_apart.is_none()));
    let sizes: std::collections::HashMap<String, u64> =
        (0..n).map(|i| (format!("s{i}"), 1000 + i * 1500)).collect();
    let whole = sizes.clone();
    let got = send_tree_with(dir.path(), 2, MIB as u32, true, move |p| {
        let rel = p.strip_prefix("src/").unwrap();
        Decision::Resume {
            have: vec![(0, whole[rel])],
        }
    });
    let mut apart = 0;
    for i in 0..n {
        let rel = format!("s{i}");
        let want = blake3_of(&src.join(&rel));
        let g = got
            .get(&rel)
            .unwrap_or_else(|| panic!("{rel}: nothing arrived"));
        match (&g.file_digest, &g.digest_apart) {
            (Some(_), None) => assert_eq!(g.early, [0], "{rel}: only an early block is sent"),
            (None, Some(d)) => {
                assert!(
                    g.blocks.is_empty(),
                    "{rel}: a block went with the digest apart"
                );
                apart += 1;
                assert_eq!(hex(d), want, "{rel}");
                continue;
            }
            other => panic!("{rel}: {other:?}"),
        }
        assert_eq!(hex(g.file_digest.as_deref().unwrap()), want, "{rel}");
    }
    // The early budget covers a few files at most: most went apart.
    assert!(apart > n / 2, "{apart} of {n}");
}
