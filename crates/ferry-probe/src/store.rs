//! Saved profiles: one JSON object per file in a state directory, keyed by endpoint or device,
//! each entry stamped with when it was measured. Replaced atomically (temporary file, fsync,
//! rename) so a crash leaves the old file or the new one, and bounded in entries (the oldest
//! measurements go first).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// A profile that says when it was measured (RFC 3339 UTC, so text order is time order).
pub trait Stamped {
    fn measured_at(&self) -> &str;
}

/// Every entry of `file` in `dir` (empty when the file is missing or unreadable).
pub fn load<T: DeserializeOwned>(dir: &Path, file: &str) -> BTreeMap<String, T> {
    std::fs::read(dir.join(file))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Stores `value` under `key`, keeping at most `max` entries. Returns the file's path.
pub fn save<T: Serialize + DeserializeOwned + Stamped>(
    dir: &Path,
    file: &str,
    key: &str,
    value: T,
    max: usize,
) -> std::io::Result<PathBuf> {
    let mut all: BTreeMap<String, T> = load(dir, file);
    all.insert(key.to_owned(), value);
    while all.len() > max {
        let oldest = all
            .iter()
            .min_by(|a, b| a.1.measured_at().cmp(b.1.measured_at()))
            .map(|(k, _)| k.clone());
        match oldest {
            Some(k) => all.remove(&k),
            None => break,
        };
    }
    let mut text = serde_json::to_vec_pretty(&all).map_err(std::io::Error::other)?;
    text.push(b'\n');
    write_atomically(dir, file, &text)
}

/// Replaces `file` in `dir` with `bytes`: a temporary file beside it, fsync, rename, then an
/// fsync of the directory, so a crash leaves the old file or the new one. Returns the path.
pub fn write_atomically(dir: &Path, file: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(file);
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(&path).map_err(|e| e.error)?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(path)
}
