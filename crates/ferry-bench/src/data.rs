//! The data sets: generated once (pseudo-random, incompressible, fixed seeds), kept between
//! invocations in the work directory, and digested (BLAKE3) to verify what arrived.

use std::fs::{self, File};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::plan::{splitmix64, Dataset};

/// Bumped when the generator changes, so that cached data sets are made again.
const GENERATOR_VERSION: u32 = 1;
/// Files per subdirectory of a tree.
pub const PER_DIR: u64 = 1000;

/// What a data set (or a received copy) holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Digest {
    pub files: u64,
    pub bytes: u64,
    /// A single file: BLAKE3 of its bytes (what `b3sum` prints). A tree: BLAKE3 over the sorted
    /// list of (relative path, size, BLAKE3 of the file).
    pub blake3: String,
}

#[derive(Serialize, Deserialize)]
struct Marker {
    version: u32,
    dataset: Dataset,
    digest: Digest,
}

/// A fast PRNG (xoshiro256**), seeded through splitmix64.
struct Rng([u64; 4]);

impl Rng {
    fn new(seed: u64) -> Rng {
        let mut st = seed;
        Rng([
            splitmix64(&mut st),
            splitmix64(&mut st),
            splitmix64(&mut st),
            splitmix64(&mut st),
        ])
    }
    fn next(&mut self) -> u64 {
        let s = &mut self.0;
        let r = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        r
    }
    fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next().to_le_bytes());
        }
        let rem = chunks.into_remainder();
        let last = self.next().to_le_bytes();
        rem.copy_from_slice(&last[..rem.len()]);
    }
}

fn seed_of(label: &str, index: u64) -> u64 {
    let h = blake3::hash(label.as_bytes());
    u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes")) ^ index
}

fn write_random(path: &Path, bytes: u64, seed: u64) -> Result<()> {
    let f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut w = BufWriter::with_capacity(1 << 20, f);
    let mut rng = Rng::new(seed);
    let mut buf = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        rng.fill(&mut buf[..n]);
        w.write_all(&buf[..n])?;
        left -= n as u64;
    }
    w.flush()?;
    Ok(())
}

/// Relative path of file `i` of a tree.
pub fn tree_file_path(i: u64) -> PathBuf {
    PathBuf::from(format!("d{:03}", i / PER_DIR)).join(format!("f{i:06}"))
}

/// Makes sure `dir/<label>` holds the data set and returns its digest. A copy made earlier (with
/// its marker file) is reused after re-digesting it, which also brings it into the page cache.
pub fn ensure(dir: &Path, ds: &Dataset) -> Result<(PathBuf, Digest)> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let label = ds.label();
    let path = dir.join(&label);
    let marker_path = dir.join(format!(".{label}.json"));
    if let Ok(text) = fs::read_to_string(&marker_path) {
        if let Ok(m) = serde_json::from_str::<Marker>(&text) {
            if m.version == GENERATOR_VERSION && &m.dataset == ds && path.exists() {
                let d = digest_path(&path)?;
                if d == m.digest {
                    return Ok((path, d));
                }
                eprintln!("ferry-bench: cached {label} changed on disk; making it again");
            }
        }
    }
    let _ = fs::remove_file(&marker_path);
    remove_path(&path)?;
    let tmp = dir.join(format!(".{label}.tmp"));
    remove_path(&tmp)?;
    match ds {
        Dataset::File { bytes } => write_random(&tmp, *bytes, seed_of(&label, 0))?,
        Dataset::Tree { .. } | Dataset::Mixed { .. } | Dataset::Real { .. } => {
            write_tree(&tmp, &label, ds.sizes().into_iter())?
        }
    }
    fs::rename(&tmp, &path)?;
    let d = digest_path(&path)?;
    if d.files != ds.files() || d.bytes != ds.bytes() {
        bail!(
            "generated {label} has {} files / {} bytes, expected {} / {}",
            d.files,
            d.bytes,
            ds.files(),
            ds.bytes()
        );
    }
    let marker = Marker {
        version: GENERATOR_VERSION,
        dataset: ds.clone(),
        digest: d.clone(),
    };
    fs::write(&marker_path, serde_json::to_string_pretty(&marker)?)?;
    Ok((path, d))
}

fn write_tree(root: &Path, label: &str, sizes: impl Iterator<Item = u64>) -> Result<()> {
    fs::create_dir_all(root)?;
    for (i, size) in sizes.enumerate() {
        let rel = tree_file_path(i as u64);
        let p = root.join(&rel);
        if (i as u64).is_multiple_of(PER_DIR) {
            fs::create_dir_all(p.parent().expect("has a parent"))?;
        }
        write_random(&p, size, seed_of(label, i as u64 + 1))?;
    }
    Ok(())
}

/// Removes a file or a tree; nothing there is fine.
pub fn remove_path(p: &Path) -> Result<()> {
    match fs::symlink_metadata(p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("stat {}", p.display())),
        Ok(m) if m.is_dir() => {
            fs::remove_dir_all(p).with_context(|| format!("removing {}", p.display()))
        }
        Ok(_) => fs::remove_file(p).with_context(|| format!("removing {}", p.display())),
    }
}

/// Gives every file of a data set a new mtime. A real server keeps what the last run put there,
/// and ferry skips a file whose copy has the same size and mtime and the same content (the
/// content is compared, `--overwrite` or not): without a new stamp every run after the first
/// against `--remote` moved nothing and reported the data set's bytes over a second.
pub fn restamp(p: &Path, when: std::time::SystemTime) -> Result<()> {
    let set = |f: &Path| -> Result<()> {
        File::open(f)
            .and_then(|h| h.set_modified(when))
            .with_context(|| format!("setting the mtime of {}", f.display()))
    };
    let m = fs::symlink_metadata(p).with_context(|| format!("{} is missing", p.display()))?;
    if !m.is_dir() {
        return set(p);
    }
    let mut files = Vec::new();
    walk(p, Path::new(""), &mut files)?;
    for rel in &files {
        set(&p.join(rel))?;
    }
    Ok(())
}

fn hash_file(p: &Path) -> Result<(u64, blake3::Hash)> {
    let mut f = File::open(p).with_context(|| format!("opening {}", p.display()))?;
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf)?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((n, h.finalize()))
}

fn walk(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let dir = root.join(rel);
    let mut names: Vec<_> = fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<std::io::Result<_>>()?;
    names.sort();
    for n in names {
        let r = rel.join(&n);
        let m = fs::symlink_metadata(root.join(&r))?;
        if m.is_dir() {
            walk(root, &r, out)?;
        } else {
            out.push(r);
        }
    }
    Ok(())
}

/// Digest of a file or a tree (see [`Digest`]).
pub fn digest_path(p: &Path) -> Result<Digest> {
    let m = fs::symlink_metadata(p).with_context(|| format!("{} is missing", p.display()))?;
    if !m.is_dir() {
        let (bytes, h) = hash_file(p)?;
        return Ok(Digest {
            files: 1,
            bytes,
            blake3: h.to_hex().to_string(),
        });
    }
    let mut files = Vec::new();
    walk(p, Path::new(""), &mut files)?;
    let mut h = blake3::Hasher::new();
    let mut bytes = 0;
    for rel in &files {
        let (n, fh) = hash_file(&p.join(rel))?;
        bytes += n;
        h.update(rel.to_string_lossy().as_bytes());
        h.update(&[0]);
        h.update(&n.to_le_bytes());
        h.update(fh.as_bytes());
    }
    Ok(Digest {
        files: files.len() as u64,
        bytes,
        blake3: h.finalize().to_hex().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::KIB;

    #[test]
    fn restamp_sets_every_file_and_keeps_the_digest() {
        let t = tempfile::tempdir().unwrap();
        let ds = Dataset::Tree {
            files: 1200,
            file_bytes: 100,
        };
        let (p, d) = ensure(t.path(), &ds).unwrap();
        let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_123);
        restamp(&p, when).unwrap();
        for i in [0, 999, 1199] {
            let m = fs::metadata(p.join(tree_file_path(i))).unwrap();
            assert_eq!(m.modified().unwrap(), when, "file {i}");
        }
        assert_eq!(digest_path(&p).unwrap(), d);
        let one = t.path().join("one");
        fs::write(&one, b"x").unwrap();
        restamp(&one, when).unwrap();
        assert_eq!(fs::metadata(&one).unwrap().modified().unwrap(), when);
        assert!(restamp(&t.path().join("absent"), when).is_err());
    }

    #[test]
    fn generate_reuse_and_digest() {
        let t = tempfile::tempdir().unwrap();
        let ds = Dataset::Tree {
            files: 1500,
            file_bytes: KIB + 3,
        };
        let (p, d) = ensure(t.path(), &ds).unwrap();
        assert_eq!(d.files, 1500);
        assert_eq!(d.bytes, 1500 * (KIB + 3));
        assert!(p.join("d001/f001499").is_file());
        // reused, same digest
        let (_, d2) = ensure(t.path(), &ds).unwrap();
        assert_eq!(d, d2);
        // a copy digests the same; a changed byte does not
        let copy = t.path().join("copy");
        fs::create_dir_all(copy.join("d000")).unwrap();
        fs::create_dir_all(copy.join("d001")).unwrap();
        for i in 0..1500 {
            fs::copy(p.join(tree_file_path(i)), copy.join(tree_file_path(i))).unwrap();
        }
        assert_eq!(digest_path(&copy).unwrap(), d);
        let victim = copy.join(tree_file_path(7));
        let mut bytes = fs::read(&victim).unwrap();
        bytes[100] ^= 1;
        fs::write(&victim, bytes).unwrap();
        assert_ne!(digest_path(&copy).unwrap().blake3, d.blake3);
        // a damaged cache is made again
        fs::write(p.join(tree_file_path(3)), b"x").unwrap();
        let (_, d3) = ensure(t.path(), &ds).unwrap();
        assert_eq!(d3, d);
    }

    #[test]
    fn real_tree_is_written_with_its_sizes() {
        let t = tempfile::tempdir().unwrap();
        let ds = Dataset::Real { files: 60 };
        let (p, d) = ensure(t.path(), &ds).unwrap();
        assert_eq!((d.files, d.bytes), (60, ds.bytes()));
        for (i, want) in ds.sizes().into_iter().enumerate() {
            let got = fs::metadata(p.join(tree_file_path(i as u64)))
                .unwrap()
                .len();
            assert_eq!(got, want, "file {i}");
        }
        // Made again elsewhere, the same bytes.
        let t2 = tempfile::tempdir().unwrap();
        assert_eq!(ensure(t2.path(), &ds).unwrap().1, d);
    }

    #[test]
    fn single_file_digest_is_b3sum() {
        let t = tempfile::tempdir().unwrap();
        let ds = Dataset::File { bytes: 100_003 };
        let (p, d) = ensure(t.path(), &ds).unwrap();
        let data = fs::read(&p).unwrap();
        assert_eq!(data.len(), 100_003);
        assert_eq!(d.blake3, blake3::hash(&data).to_hex().to_string());
        // incompressible-looking: no long runs, all byte values present
        let mut seen = [false; 256];
        data.iter().for_each(|&b| seen[b as usize] = true);
        assert!(seen.iter().all(|&s| s));
    }
}
