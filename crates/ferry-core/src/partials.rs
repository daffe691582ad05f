//! Leftovers of interrupted transfers: temporary files and resume journals.
//!
//! They are kept on purpose (a re-run resumes from them), so something must bound them: the
//! server scans its root, reports the space they hold, and removes those untouched for longer
//! than a configured age. A journal still locked by a running session is never touched.

use std::fs::File;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// What a scan found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartialReport {
    /// Temporary files and journals still kept, and the bytes they hold.
    pub kept_files: u64,
    pub kept_bytes: u64,
    /// Those removed for being older than the age limit.
    pub removed_files: u64,
    pub removed_bytes: u64,
}

fn is_leftover(name: &str) -> bool {
    name.starts_with(".ferry-") && (name.ends_with(".part") || name.ends_with(".journal"))
}

/// Whether another process (or session) holds the lock of this journal.
fn in_use(path: &Path) -> bool {
    let Ok(f) = File::open(path) else {
        return false;
    };
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {
            let _ = rustix::fs::flock(&f, rustix::fs::FlockOperation::Unlock);
            false
        }
        Err(_) => true,
    }
}

/// Walks `root` (never following symlinks), counting leftovers and removing those not modified
/// for `max_age`. Bounded by the tree; errors on single entries are skipped.
pub fn scan(root: &Path, max_age: Duration, now: SystemTime) -> PartialReport {
    let mut report = PartialReport::default();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(ft) = entry.file_type() else { continue };
            if ft.is_dir() {
                stack.push(entry.path());
                continue;
            }
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if !ft.is_file() || !is_leftover(name) {
                continue;
            }
            let Ok(meta) = entry.metadata() else { continue };
            let age = meta
                .modified()
                .ok()
                .and_then(|m| now.duration_since(m).ok())
                .unwrap_or_default();
            let path = entry.path();
            let busy = if name.ends_with(".journal") {
                in_use(&path)
            } else {
                // A temporary file is busy when its journal is.
                in_use(&path.with_extension("journal"))
            };
            if age > max_age && !busy && std::fs::remove_file(&path).is_ok() {
                report.removed_files += 1;
                report.removed_bytes += meta.len();
            } else {
                report.kept_files += 1;
                report.kept_bytes += meta.len();
            }
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_keeps_fresh_and_removes_old() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/.ferry-1.part"), [0u8; 100]).unwrap();
        std::fs::write(dir.path().join("sub/.ferry-1.journal"), [0u8; 10]).unwrap();
        std::fs::write(dir.path().join("keep.txt"), [0u8; 1000]).unwrap();
        let r = scan(dir.path(), Duration::from_secs(3600), SystemTime::now());
        assert_eq!(
            r,
            PartialReport {
                kept_files: 2,
                kept_bytes: 110,
                removed_files: 0,
                removed_bytes: 0
            }
        );
        // Held journal: never removed, however old.
        let held = File::open(dir.path().join("sub/.ferry-1.journal")).unwrap();
        rustix::fs::flock(&held, rustix::fs::FlockOperation::LockExclusive).unwrap();
        let later = SystemTime::now() + Duration::from_secs(7200);
        let r = scan(dir.path(), Duration::from_secs(3600), later);
        assert_eq!(r.removed_files, 0);
        drop(held);
        let r = scan(dir.path(), Duration::from_secs(3600), later);
        assert_eq!(
            (r.removed_files, r.removed_bytes, r.kept_files),
            (2, 110, 0)
        );
        assert!(dir.path().join("keep.txt").exists());
    }
}
