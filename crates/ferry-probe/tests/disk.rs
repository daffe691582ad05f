//! `probe_disk` on small temporary directories: positive rates, nothing left behind.

use std::path::Path;
use std::sync::Mutex;

use ferry_probe::disk::{probe_disk, Direction, DiskOptions, IoMode};
use ferry_probe::{ProbeError, ProbeProgress};

const MIB: u64 = 1 << 20;

fn tiny() -> DiskOptions {
    DiskOptions {
        threads: vec![1, 2],
        max_threads: 2,
        request_sizes: vec![MIB, 4 * MIB],
        bytes_per_point: 8 * MIB,
        max_seconds_per_point: 2.0,
        small_files: 50,
        small_file_threads: vec![1, 2],
        fsync_samples: 10,
        ..DiskOptions::quick()
    }
}

#[derive(Default)]
struct Steps(Mutex<Vec<String>>);

impl ProbeProgress for Steps {
    fn on_step(&self, what: &str) {
        self.0.lock().unwrap().push(what.to_string());
    }
}

fn is_empty_dir(p: &Path) -> bool {
    std::fs::read_dir(p).unwrap().next().is_none()
}

#[test]
fn quick_probe_measures_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let steps = Steps::default();
    let rep = probe_disk(dir.path(), &tiny(), &steps).unwrap();

    assert!(rep.cleaned_up);
    assert!(
        is_empty_dir(dir.path()),
        "left behind in {}",
        dir.path().display()
    );

    assert!(!rep.points.is_empty());
    for p in &rep.points {
        assert!(p.error.is_none(), "{p:?}");
        assert!(p.mib_per_s > 0.0 && p.bytes > 0, "{p:?}");
    }
    for dir in [Direction::Write, Direction::Read] {
        // The grid: 2 threads × 2 sizes, buffered, loose.
        let grid = rep
            .points
            .iter()
            .filter(|p| p.direction == dir && p.mode == IoMode::Buffered)
            .count();
        assert!(grid >= 4, "{dir:?}: {grid}");
        assert!(rep.recommendations.iter().any(|r| r.direction == dir));
    }
    // The other issue orders at the best point.
    let orders: std::collections::BTreeSet<_> = rep.points.iter().map(|p| p.order).collect();
    assert_eq!(orders.len(), 3);
    if rep.direct_io_refused.is_none() {
        assert!(rep.points.iter().any(|p| p.mode == IoMode::Direct));
    }
    assert!(rep.cache.dropped.is_some());

    assert_eq!(rep.small_files.len(), 2);
    assert!(rep
        .small_files
        .iter()
        .all(|f| f.files == 50 && f.files_per_s > 0.0));
    let fsync = rep.fsync.as_ref().unwrap();
    assert!(fsync.samples > 0 && fsync.median_s > 0.0 && fsync.p99_s >= fsync.median_s);

    let text = rep.render_text();
    assert!(text.contains("\nrecommendation\n  writes: "), "{text}");
    assert!(text.contains("\n  reads: "), "{text}");
    assert!(!rep.summary().is_empty());
    assert!(steps
        .0
        .lock()
        .unwrap()
        .iter()
        .any(|s| s.starts_with("write: 1 thread")));
    serde_json::to_string(&rep).unwrap();
}

#[test]
fn tmpfs_keeps_its_pages_cached() {
    let shm = Path::new("/dev/shm");
    let dir = tempfile::tempdir_in(shm).map_err(|e| format!("no writable /dev/shm: {e}"));
    let Some(dir) = ferry_netem::needs("tmpfs_keeps_its_pages_cached", dir) else {
        return;
    };
    let fs_is_tmpfs = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.contains(" /dev/shm ") && l.contains(" - tmpfs "));
    let opts = DiskOptions {
        threads: vec![1],
        request_sizes: vec![MIB],
        small_files: 0,
        fsync_samples: 0,
        repeats: 2,
        ..tiny()
    };
    let rep = probe_disk(dir.path(), &opts, &ferry_probe::NoProgress).unwrap();
    assert!(is_empty_dir(dir.path()));
    assert!(rep.points.iter().all(|p| p.mib_per_s > 0.0));
    assert!(rep.points.iter().all(|p| p.runs_mib_per_s.len() == 2));
    // tmpfs refuses O_DIRECT before Linux 6.6 and accepts it since.
    if rep.direct_io_refused.is_some() {
        assert!(rep.points.iter().all(|p| p.mode == IoMode::Buffered));
        assert!(rep.render_text().contains("refused"));
    }
    if fs_is_tmpfs {
        // The pages are the storage: they cannot be dropped, and the report says so.
        assert_eq!(rep.cache.dropped, Some(false));
        assert!(rep
            .notes
            .iter()
            .any(|n| n.starts_with("tmpfs keeps files in memory")));
        assert!(rep.render_text().contains("could not be dropped"));
    }
}

/// A panic in the middle of a probe (here from the progress callback) still removes the
/// temporary directory.
#[test]
fn cleans_up_after_a_panic() {
    struct PanicAtRead;
    impl ProbeProgress for PanicAtRead {
        fn on_step(&self, what: &str) {
            if what.starts_with("read: 2 threads") {
                panic!("injected");
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let r = std::panic::catch_unwind(|| probe_disk(&path, &tiny(), &PanicAtRead));
    assert!(r.is_err());
    assert!(is_empty_dir(dir.path()));
}

#[test]
fn refuses_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, b"x").unwrap();
    assert!(matches!(
        probe_disk(&file, &tiny(), &ferry_probe::NoProgress),
        Err(ProbeError::NotADirectory { .. })
    ));
    let bad = DiskOptions {
        request_sizes: vec![1000],
        ..tiny()
    };
    assert!(matches!(
        probe_disk(dir.path(), &bad, &ferry_probe::NoProgress),
        Err(ProbeError::InvalidOptions(_))
    ));
    let bad = DiskOptions {
        threads: vec![32],
        ..tiny()
    };
    assert!(matches!(
        probe_disk(dir.path(), &bad, &ferry_probe::NoProgress),
        Err(ProbeError::InvalidOptions(_))
    ));
    assert!(matches!(
        probe_disk(
            &dir.path().join("missing"),
            &tiny(),
            &ferry_probe::NoProgress
        ),
        Err(ProbeError::Io { .. })
    ));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}
