//! The stream count the tuner settled on, per server, so that the next transfer to the same
//! server starts there (HARP's lesson, docs/TUNING.md: a good prior saves the search).
//!
//! One JSON file, `profiles.json` in the client's state directory, replaced atomically (written
//! to a temporary file in the same directory, synced, renamed over). At most [`MAX_ENTRIES`]
//! servers are kept; the least recently updated go first. A missing or unreadable file is no
//! profile: tuning then starts from the default.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// Servers remembered at most.
pub const MAX_ENTRIES: usize = 256;

const FILE_NAME: &str = "profiles.json";

/// What was learnt about one server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Streams the tuner held at the end of the last auto-tuned transfer of bulk data.
    pub streams: u32,
    /// Whether its search had finished (otherwise `streams` is the best measured so far).
    pub settled: bool,
    /// Seconds since the Unix epoch.
    pub updated: u64,
}

/// What the last large transfer to one server measured of the path: how many ramp helpers a
/// transfer opens (`ferry_net::ramp_helpers`) depends on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathEntry {
    /// The data connections' smallest round-trip time, microseconds.
    pub rtt_us: u64,
    /// Payload bytes per second the transfer held (`Timeline::held_rate`, or its average if
    /// higher): what the path carried once the transfer was going.
    pub bytes_per_s: u64,
    /// Seconds since the Unix epoch.
    pub updated: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct ProfileFile {
    version: u32,
    endpoints: BTreeMap<String, Entry>,
    /// Absent from files written before it was kept.
    #[serde(default)]
    paths: BTreeMap<String, PathEntry>,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Sets `key` to `entry` and keeps at most [`MAX_ENTRIES`] in `map`, forgetting the least
/// recently updated others.
fn insert_bounded<T>(map: &mut BTreeMap<String, T>, key: &str, entry: T, updated: fn(&T) -> u64) {
    map.insert(key.to_owned(), entry);
    while map.len() > MAX_ENTRIES {
        let oldest = map
            .iter()
            .filter(|(k, _)| k.as_str() != key)
            .min_by_key(|(k, e)| (updated(e), (*k).clone()))
            .map(|(k, _)| k.clone());
        match oldest {
            Some(k) => map.remove(&k),
            None => break,
        };
    }
}

/// The profile store in one directory.
#[derive(Clone, Debug)]
pub struct Profiles {
    dir: PathBuf,
}

impl Profiles {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// In the client's state directory: `$FERRY_STATE_DIR`, `$XDG_STATE_HOME/ferry` or
    /// `~/.local/state/ferry`.
    pub fn default_location() -> Option<Self> {
        crate::state::state_dir().ok().map(Self::new)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE_NAME)
    }

    fn read(&self) -> ProfileFile {
        std::fs::read(self.path())
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// What was remembered for `endpoint` (`host:port`).
    pub fn load(&self, endpoint: &str) -> Option<Entry> {
        self.read().endpoints.get(endpoint).copied()
    }

    /// What was last measured of the path to `endpoint`.
    pub fn load_path(&self, endpoint: &str) -> Option<PathEntry> {
        self.read().paths.get(endpoint).copied()
    }

    /// Remembers, now, what one transfer to `endpoint` taught: the stream count its tuner
    /// held (and whether it settled), the path it measured (round trip, rate), or both, in
    /// one replacement of the file. Nothing to remember writes nothing.
    pub fn remember(
        &self,
        endpoint: &str,
        streams: Option<(u32, bool)>,
        path: Option<(u64, u64)>,
    ) -> Result<()> {
        self.remember_at(endpoint, streams, path, unix_now())
    }

    fn remember_at(
        &self,
        endpoint: &str,
        streams: Option<(u32, bool)>,
        path: Option<(u64, u64)>,
        now: u64,
    ) -> Result<()> {
        if streams.is_none() && path.is_none() {
            return Ok(());
        }
        let mut file = self.read();
        if let Some((streams, settled)) = streams {
            let entry = Entry {
                streams,
                settled,
                updated: now,
            };
            insert_bounded(&mut file.endpoints, endpoint, entry, |e| e.updated);
        }
        if let Some((rtt_us, bytes_per_s)) = path {
            let entry = PathEntry {
                rtt_us,
                bytes_per_s,
                updated: now,
            };
            insert_bounded(&mut file.paths, endpoint, entry, |e| e.updated);
        }
        self.write(file)
    }

    #[cfg(test)]
    fn save_at(&self, endpoint: &str, streams: u32, settled: bool, now: u64) -> Result<()> {
        self.remember_at(endpoint, Some((streams, settled)), None, now)
    }

    #[cfg(test)]
    fn save_path_at(&self, endpoint: &str, rtt_us: u64, bytes_per_s: u64, now: u64) -> Result<()> {
        self.remember_at(endpoint, None, Some((rtt_us, bytes_per_s)), now)
    }

    fn write(&self, mut file: ProfileFile) -> Result<()> {
        file.version = 1;
        ferry_probe::store::write_atomically(
            &self.dir,
            FILE_NAME,
            &serde_json::to_vec_pretty(&file)?,
        )
        .with_context(|| format!("replacing {}", self.path().display()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_streams_come_back_per_endpoint() {
        let d = tempfile::tempdir().unwrap();
        let p = Profiles::new(d.path().join("state/ferry"));
        assert_eq!(p.load("dtn2:7070"), None, "nothing before the first save");
        p.save_at("dtn2:7070", 8, true, 100).unwrap();
        p.save_at("dtn3:7070", 2, false, 101).unwrap();
        let e = p.load("dtn2:7070").unwrap();
        assert_eq!((e.streams, e.settled, e.updated), (8, true, 100));
        assert_eq!(p.load("dtn3:7070").unwrap().streams, 2);
        // A new result replaces the old one.
        p.save_at("dtn2:7070", 6, true, 102).unwrap();
        assert_eq!(p.load("dtn2:7070").unwrap().streams, 6);
        // Another store (the next process) reads the same file.
        let again = Profiles::new(d.path().join("state/ferry"));
        assert_eq!(again.load("dtn3:7070").unwrap().streams, 2);
        // Only the file itself is left behind, no temporary files.
        let names: Vec<_> = std::fs::read_dir(d.path().join("state/ferry"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(FILE_NAME)]);
    }

    #[test]
    fn the_store_is_bounded_and_forgets_the_oldest() {
        let d = tempfile::tempdir().unwrap();
        let p = Profiles::new(d.path());
        for i in 0..MAX_ENTRIES + 10 {
            p.save_at(&format!("h{i}:7070"), 4, true, i as u64).unwrap();
        }
        assert_eq!(p.read().endpoints.len(), MAX_ENTRIES);
        for i in 0..10 {
            assert_eq!(p.load(&format!("h{i}:7070")), None, "h{i} was the oldest");
        }
        assert!(p.load(&format!("h{}:7070", MAX_ENTRIES + 9)).is_some());
        // Updating an old entry makes it new again: the next eviction takes another.
        p.save_at("h10:7070", 5, true, 10_000).unwrap();
        p.save_at("new:7070", 3, true, 10_001).unwrap();
        assert_eq!(p.load("h10:7070").unwrap().streams, 5);
        assert_eq!(p.load("h11:7070"), None);
        assert_eq!(p.read().endpoints.len(), MAX_ENTRIES);
    }

    #[test]
    fn paths_are_kept_beside_the_stream_counts() {
        let d = tempfile::tempdir().unwrap();
        let p = Profiles::new(d.path());
        // A file from before paths were kept still loads, and keeps its streams.
        std::fs::write(
            p.path(),
            br#"{"version":1,"endpoints":{"dtn2:7070":{"streams":8,"settled":true,"updated":5}}}"#,
        )
        .unwrap();
        assert_eq!(p.load_path("dtn2:7070"), None);
        p.save_path_at("dtn2:7070", 100_000, 115_000_000, 6)
            .unwrap();
        let e = p.load_path("dtn2:7070").unwrap();
        assert_eq!(
            (e.rtt_us, e.bytes_per_s, e.updated),
            (100_000, 115_000_000, 6)
        );
        assert_eq!(p.load("dtn2:7070").unwrap().streams, 8);
        // And a stream count saved later leaves the path alone.
        p.save_at("dtn2:7070", 16, false, 7).unwrap();
        assert_eq!(p.load_path("dtn2:7070").unwrap().rtt_us, 100_000);
        // Bounded like the stream counts, oldest first.
        for i in 0..MAX_ENTRIES + 3 {
            p.save_path_at(&format!("h{i}:7070"), 1, 1, 100 + i as u64)
                .unwrap();
        }
        assert_eq!(p.read().paths.len(), MAX_ENTRIES);
        assert_eq!(p.load_path("dtn2:7070"), None, "the oldest went first");
        assert_eq!(p.load_path("h0:7070"), None);
        assert!(p.load_path("h3:7070").is_some());
    }

    #[test]
    fn a_damaged_file_is_no_profile_and_is_replaced() {
        let d = tempfile::tempdir().unwrap();
        let p = Profiles::new(d.path());
        std::fs::write(p.path(), b"{ not json").unwrap();
        assert_eq!(p.load("dtn2:7070"), None);
        p.save_at("dtn2:7070", 4, false, 1).unwrap();
        assert_eq!(p.load("dtn2:7070").unwrap().streams, 4);
    }
}
