//! `ferry probe disk PATH`: read and write throughput against threads, request size, issue
//! order and buffered or direct I/O; small-file create rate; fdatasync latency; and what to use.
//!
//! Everything happens in a hidden temporary directory inside PATH (`.ferry-probe-XXXXXX`), which
//! is removed at the end, on error and on panic (a drop guard). Each point is bounded by
//! [`DiskOptions::bytes_per_point`] and [`DiskOptions::max_seconds_per_point`].
//!
//! - **Writes** go to a new file per point (so block allocation is part of the cost, as for
//!   ferry's receiver), each thread with its own descriptor, one `pwrite` per request; the
//!   point's time includes the `fdatasync` at the end, so buffered writes measure the device, not
//!   the page cache.
//! - **Reads** read one test file written and `fdatasync`ed beforehand; before every buffered
//!   read point its pages are dropped with `posix_fadvise(DONTNEED)` and the share still in the
//!   page cache is checked with `mincore`, so the report says whether reads measured the device.
//!   Each thread has its own descriptor (its own readahead state), one `pread` per request.
//! - **Direct I/O** uses O_DIRECT with 4 KiB-aligned buffers; a file system that refuses it
//!   (tmpfs) gets a note and no direct points.
//! - **Issue order**: see [`crate::order`] for the exact definitions of serial, loose and none.
//!
//! The default sweep is staged: a grid of threads × request sizes (buffered, loose order) for
//! each direction; then, at each direction's best grid point, the other issue orders; then
//! direct I/O at that request size across thread counts. [`Sweep::Full`] measures every
//! combination instead.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::fsio::{self, AlignedBuf, DIRECT_ALIGN};
pub use crate::fsio::{BlockDevice, FsInfo};
use crate::order::{request_offsets, run_requests, IssueOrder};
use crate::{ProbeError, ProbeProgress};
use ferry_units::stats::{mean, percentile_nearest_rank, upper_median_by};
use ferry_units::units::{
    format_bytes as bytes, format_secs as secs, format_thousands as num, size_flag, MIB,
};

/// Read or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Write,
    Read,
}

impl Direction {
    pub fn name(self) -> &'static str {
        match self {
            Direction::Write => "write",
            Direction::Read => "read",
        }
    }
}

/// Through the page cache, or around it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IoMode {
    Buffered,
    /// O_DIRECT, 4 KiB-aligned buffers, offsets and lengths.
    Direct,
}

impl IoMode {
    pub fn name(self) -> &'static str {
        match self {
            IoMode::Buffered => "buffered",
            IoMode::Direct => "direct",
        }
    }
}

/// Which combinations are measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Sweep {
    /// Threads × request sizes (buffered, loose) per direction; then the other orders and
    /// direct I/O at the best of that grid.
    Staged,
    /// Every combination of threads, request size, order and mode.
    Full,
}

/// What `probe_disk` measures, and its bounds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DiskOptions {
    /// Thread counts to try (those above `max_threads` are dropped).
    pub threads: Vec<usize>,
    pub max_threads: usize,
    /// Request sizes (bytes; multiples of 4 KiB).
    pub request_sizes: Vec<u64>,
    pub orders: Vec<IssueOrder>,
    pub modes: Vec<IoMode>,
    pub directions: Vec<Direction>,
    pub sweep: Sweep,
    /// Bytes read or written per point at most; also the size of the read test file.
    pub bytes_per_point: u64,
    /// Seconds per point at most, all its runs together (each run stops issuing requests after
    /// `max_seconds_per_point / repeats`).
    pub max_seconds_per_point: f64,
    /// Runs per point; the point reports the run with the median rate. Other work on the
    /// machine makes single runs noisy.
    pub repeats: usize,
    /// Small files to create per small-file run (0: none).
    pub small_files: usize,
    pub small_file_size: usize,
    /// Thread counts of the small-file runs.
    pub small_file_threads: Vec<usize>,
    /// fdatasync latency samples (0: none).
    pub fsync_samples: usize,
    /// Seed of the random order (`IssueOrder::None`).
    pub seed: u64,
}

impl Default for DiskOptions {
    /// The staged sweep: threads 1, 2, 4, 8, 16; requests 1, 4, 16, 64 MiB; 256 MiB or 3 s per
    /// point, in 3 runs (median); 2000 small files on 1 and 4 threads; 200 fdatasync samples.
    fn default() -> Self {
        DiskOptions {
            threads: vec![1, 2, 4, 8, 16],
            max_threads: 16,
            request_sizes: vec![MIB, 4 * MIB, 16 * MIB, 64 * MIB],
            orders: IssueOrder::ALL.to_vec(),
            modes: vec![IoMode::Buffered, IoMode::Direct],
            directions: vec![Direction::Write, Direction::Read],
            sweep: Sweep::Staged,
            bytes_per_point: 256 * MIB,
            max_seconds_per_point: 3.0,
            repeats: 3,
            small_files: 2000,
            small_file_size: 4096,
            small_file_threads: vec![1, 4],
            fsync_samples: 200,
            seed: 0x5eed,
        }
    }
}

impl DiskOptions {
    /// A quick look (seconds, not minutes): threads 1, 2, 4; requests 1, 4, 16 MiB; 64 MiB or
    /// 1 s per point, one run; 500 small files; 50 fdatasync samples.
    pub fn quick() -> Self {
        DiskOptions {
            threads: vec![1, 2, 4],
            max_threads: 4,
            request_sizes: vec![MIB, 4 * MIB, 16 * MIB],
            bytes_per_point: 64 * MIB,
            max_seconds_per_point: 1.0,
            repeats: 1,
            small_files: 500,
            fsync_samples: 50,
            ..Self::default()
        }
    }

    /// The default sizes and bounds, but every combination of threads, request size, issue
    /// order and I/O mode.
    pub fn full() -> Self {
        DiskOptions {
            sweep: Sweep::Full,
            ..Self::default()
        }
    }

    /// Thread counts to use: deduplicated, sorted, within 1..=max_threads.
    pub fn effective_threads(&self) -> Vec<usize> {
        let set: BTreeSet<usize> = self
            .threads
            .iter()
            .copied()
            .filter(|&t| t >= 1 && t <= self.max_threads.max(1))
            .collect();
        set.into_iter().collect()
    }

    fn validate(&self) -> Result<(), ProbeError> {
        let bad = |s: String| Err(ProbeError::InvalidOptions(s));
        if self.effective_threads().is_empty() && !self.directions.is_empty() {
            return bad(format!(
                "no thread count in {:?} is within max_threads {}",
                self.threads, self.max_threads
            ));
        }
        if let Some(s) = self
            .request_sizes
            .iter()
            .find(|&&s| s == 0 || s % DIRECT_ALIGN as u64 != 0)
        {
            return bad(format!(
                "request size {s} is not a positive multiple of 4 KiB"
            ));
        }
        if self.request_sizes.is_empty() && !self.directions.is_empty() {
            return bad("no request size".into());
        }
        if self.bytes_per_point < DIRECT_ALIGN as u64 {
            return bad("bytes per point below 4 KiB".into());
        }
        if self.repeats == 0 || self.repeats > 100 {
            return bad("repeats must be within 1..=100".into());
        }
        if self.max_seconds_per_point.is_nan() || self.max_seconds_per_point <= 0.0 {
            return bad("max seconds per point must be positive".into());
        }
        if self.orders.is_empty() || self.modes.is_empty() {
            return bad("no issue order or no I/O mode".into());
        }
        Ok(())
    }

    fn max_time(&self) -> Duration {
        Duration::from_secs_f64(self.max_seconds_per_point.min(3600.0))
    }

    fn run_time(&self) -> Duration {
        self.max_time() / self.repeats.max(1) as u32
    }
}

/// One measured combination.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DiskPoint {
    pub direction: Direction,
    pub threads: usize,
    pub request_size: u64,
    pub order: IssueOrder,
    pub mode: IoMode,
    /// Rate of every run (MiB/s); the point's other fields are those of the median run.
    pub runs_mib_per_s: Vec<f64>,
    /// Requests completed.
    pub requests: u64,
    pub bytes: u64,
    /// Wall time from the first request to the last completion (writes: and the fdatasync).
    pub seconds: f64,
    pub mib_per_s: f64,
    /// Stopped by `max_seconds_per_point` before all its bytes.
    pub timed_out: bool,
    /// Writes: time of the closing fdatasync (included in `seconds`).
    pub sync_seconds: Option<f64>,
    /// Buffered reads: share of the file still in the page cache after dropping it, the most
    /// of any run (0 = the reads came from the device).
    pub resident_before: Option<f64>,
    pub error: Option<String>,
}

/// Create rate of small files: create (O_EXCL) + write + close, no fsync per file.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SmallFiles {
    pub threads: usize,
    pub files: u64,
    pub file_size: usize,
    pub seconds: f64,
    pub files_per_s: f64,
    pub timed_out: bool,
    /// One syncfs after the run (what ferry's finalizer pays once per batch).
    pub syncfs_seconds: Option<f64>,
    pub error: Option<String>,
}

/// Latency of `fdatasync` after a 4 KiB write (appending to one file).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FsyncLatency {
    pub samples: usize,
    pub median_s: f64,
    pub p99_s: f64,
    pub max_s: f64,
    pub mean_s: f64,
    pub error: Option<String>,
}

/// Whether reads measured the device or the page cache.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CacheDrop {
    pub method: String,
    /// `Some(true)`: every buffered read point started with (almost) nothing cached.
    pub dropped: Option<bool>,
    /// The largest share of the test file found cached at the start of a buffered read point.
    pub max_resident: Option<f64>,
    pub note: String,
}

/// The thread count and request size to use for one direction.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Recommendation {
    pub direction: Direction,
    pub mode: IoMode,
    pub order: IssueOrder,
    /// The fewest threads (then the smallest requests) within 10% of the best.
    pub threads: usize,
    pub request_size: u64,
    pub mib_per_s: f64,
    /// The fastest point measured.
    pub best_threads: usize,
    pub best_request_size: u64,
    pub best_mib_per_s: f64,
    /// `"writes: 2 threads, 16 MiB requests (…)"`.
    pub text: String,
}

/// Everything `probe_disk` measured.
#[derive(Debug, Clone, Serialize)]
pub struct DiskReport {
    pub path: PathBuf,
    pub filesystem: Option<FsInfo>,
    pub device: Option<BlockDevice>,
    pub free_bytes: Option<u64>,
    pub options: DiskOptions,
    /// `None` when O_DIRECT works here; otherwise why direct points were skipped.
    pub direct_io_refused: Option<String>,
    pub cache: CacheDrop,
    pub points: Vec<DiskPoint>,
    /// Combinations not measured, and why.
    pub skipped: Vec<String>,
    pub small_files: Vec<SmallFiles>,
    pub fsync: Option<FsyncLatency>,
    pub recommendations: Vec<Recommendation>,
    /// One request size for both directions (ferry has one --block-size per transfer): the one
    /// whose worse direction comes closest to its best.
    pub common_request_size: Option<u64>,
    pub notes: Vec<String>,
    pub seconds: f64,
    /// The temporary directory was removed.
    pub cleaned_up: bool,
    /// Where the profile that transfers start from was saved (set by the caller).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Spec {
    direction: Direction,
    threads: usize,
    request_size: u64,
    order: IssueOrder,
    mode: IoMode,
}

impl Spec {
    fn describe(&self) -> String {
        format!(
            "{}: {} thread{}, {} requests, {} order, {}",
            self.direction.name(),
            self.threads,
            if self.threads == 1 { "" } else { "s" },
            bytes(self.request_size),
            self.order,
            self.mode.name()
        )
    }
}

struct Ctx<'a> {
    dir: PathBuf,
    opts: &'a DiskOptions,
    progress: &'a dyn ProbeProgress,
    direct_ok: bool,
    read_file: Option<PathBuf>,
    next_id: usize,
    points: Vec<DiskPoint>,
    skipped: Vec<String>,
}

/// Probes the file system at `path` (a directory). Fails only when the probe cannot run at all
/// (not a directory, no space, the temporary directory cannot be made, bad options); a failed
/// measurement is recorded in its point instead.
pub fn probe_disk(
    path: &Path,
    opts: &DiskOptions,
    progress: &dyn ProbeProgress,
) -> Result<DiskReport, ProbeError> {
    let started = Instant::now();
    opts.validate()?;
    let (path, free) = check_target(path, opts)?;
    let reads = opts.directions.contains(&Direction::Read);
    let (filesystem, device) = fsio::describe(&path);
    let mut notes = Vec::new();
    if let Some(fs) = &filesystem {
        if matches!(fs.fs_type.as_str(), "tmpfs" | "ramfs") {
            notes.push(format!(
                "{} keeps files in memory: every rate here is a memory rate, not a device's",
                fs.fs_type
            ));
        }
    }

    // The guard: removed on every return path and on unwinding.
    let tmp = tempfile::Builder::new()
        .prefix(".ferry-probe-")
        .tempdir_in(&path)
        .map_err(io_err("create a temporary directory in", &path))?;

    let direct_io_refused = if opts.modes.contains(&IoMode::Direct) && !opts.directions.is_empty() {
        fsio::check_direct(tmp.path()).err().map(|e| {
            notes.push(format!(
                "O_DIRECT refused here ({e}): direct I/O points skipped"
            ));
            e
        })
    } else {
        None
    };

    let mut ctx = Ctx {
        dir: tmp.path().to_path_buf(),
        opts,
        progress,
        direct_ok: direct_io_refused.is_none(),
        read_file: None,
        next_id: 0,
        points: Vec::new(),
        skipped: Vec::new(),
    };

    ctx.sweep_directions()?;

    let small_files = opts
        .small_file_threads
        .iter()
        .filter(|_| opts.small_files > 0)
        .map(|&t| small_files(&ctx.dir, t.max(1), opts, progress))
        .collect();
    let fsync = (opts.fsync_samples > 0).then(|| fsync_latency(&ctx.dir, opts, progress));

    let cache = cache_drop(&ctx.points, reads);
    let in_memory = filesystem
        .as_ref()
        .is_some_and(|f| matches!(f.fs_type.as_str(), "tmpfs" | "ramfs"));
    if cache.dropped == Some(false) && !in_memory {
        notes.push(
            "buffered reads found the test file still in the page cache: their rates measure \
             memory, not the device (direct reads do not)"
                .into(),
        );
    }
    let recommendations = recommend(&ctx.points, cache.dropped == Some(false));
    let common_request_size = common_request_size(&ctx.points, &recommendations);
    let Ctx {
        points, skipped, ..
    } = ctx;

    let mut report = DiskReport {
        path,
        filesystem,
        device,
        free_bytes: free,
        options: opts.clone(),
        direct_io_refused,
        cache,
        points,
        skipped,
        small_files,
        fsync,
        recommendations,
        common_request_size,
        notes,
        seconds: 0.0,
        cleaned_up: false,
        profile: None,
    };
    progress.on_step("removing the temporary directory");
    let tmp_path = tmp.path().to_path_buf();
    match tmp.close() {
        Ok(()) => report.cleaned_up = true,
        Err(e) => report
            .notes
            .push(format!("could not remove {}: {e}", tmp_path.display())),
    }
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Wraps an I/O error with what was being done to which path.
fn io_err(what: &'static str, p: &Path) -> impl FnOnce(std::io::Error) -> ProbeError {
    let p = p.to_path_buf();
    move |source| ProbeError::Io {
        what,
        path: p,
        source,
    }
}

/// The directory to probe, resolved, and its free space, refused when it is not a directory
/// or has less free space than the probe's files need.
fn check_target(path: &Path, opts: &DiskOptions) -> Result<(PathBuf, Option<u64>), ProbeError> {
    let meta = std::fs::metadata(path).map_err(io_err("stat", path))?;
    if !meta.is_dir() {
        return Err(ProbeError::NotADirectory {
            path: path.to_path_buf(),
        });
    }
    let path = std::fs::canonicalize(path).map_err(io_err("resolve", path))?;
    let free = fsio::free_bytes(&path).ok();
    let reads = opts.directions.contains(&Direction::Read);
    let writes = opts.directions.contains(&Direction::Write);
    let needed = if reads { opts.bytes_per_point } else { 0 }
        + if writes { opts.bytes_per_point } else { 0 }
        + (opts.small_files * opts.small_file_size.max(4096)) as u64
            * opts.small_file_threads.len().max(1) as u64
        + opts.fsync_samples as u64 * 4096
        + 16 * MIB;
    if let Some(free) = free {
        if free < needed {
            return Err(ProbeError::NoSpace {
                path: path.clone(),
                needed,
                free,
            });
        }
    }
    Ok((path, free))
}

impl Ctx<'_> {
    /// The sweeps of every direction asked for: writes first, then reads (from a test file
    /// written for them).
    fn sweep_directions(&mut self) -> Result<(), ProbeError> {
        for dir in [Direction::Write, Direction::Read] {
            if !self.opts.directions.contains(&dir) {
                continue;
            }
            if dir == Direction::Read {
                self.progress.on_step(&format!(
                    "read: writing a {} test file",
                    bytes(self.opts.bytes_per_point)
                ));
                self.make_read_file()
                    .map_err(io_err("write the read test file in", &self.dir))?;
            }
            self.sweep(dir);
        }
        Ok(())
    }

    fn primary_mode(&self) -> Option<IoMode> {
        if self.opts.modes.contains(&IoMode::Buffered) {
            Some(IoMode::Buffered)
        } else if self.direct_ok {
            Some(IoMode::Direct)
        } else {
            None
        }
    }

    fn primary_order(&self) -> IssueOrder {
        if self.opts.orders.contains(&IssueOrder::Loose) {
            IssueOrder::Loose
        } else {
            self.opts.orders[0]
        }
    }

    fn sweep(&mut self, dir: Direction) {
        let threads = self.opts.effective_threads();
        let mut sizes = self.opts.request_sizes.clone();
        sizes.sort_unstable();
        sizes.dedup();
        let mut modes: Vec<IoMode> = self
            .opts
            .modes
            .iter()
            .copied()
            .filter(|&m| m == IoMode::Buffered || self.direct_ok)
            .collect();
        modes.sort();
        modes.dedup();
        let mut orders = self.opts.orders.clone();
        orders.sort();
        orders.dedup();

        match self.opts.sweep {
            Sweep::Full => {
                for &mode in &modes {
                    for &order in &orders {
                        for &request_size in &sizes {
                            for &t in &threads {
                                self.point(Spec {
                                    direction: dir,
                                    threads: t,
                                    request_size,
                                    order,
                                    mode,
                                });
                            }
                        }
                    }
                }
            }
            Sweep::Staged => {
                let Some(mode) = self.primary_mode() else {
                    return;
                };
                let order = self.primary_order();
                let first = self.points.len();
                for &request_size in &sizes {
                    for &t in &threads {
                        self.point(Spec {
                            direction: dir,
                            threads: t,
                            request_size,
                            order,
                            mode,
                        });
                    }
                }
                let Some(best) = self.points[first..]
                    .iter()
                    .filter(|p| p.error.is_none() && p.mib_per_s > 0.0)
                    .max_by(|a, b| a.mib_per_s.total_cmp(&b.mib_per_s))
                    .map(|p| (p.threads, p.request_size))
                else {
                    return;
                };
                for &o in orders.iter().filter(|&&o| o != order) {
                    self.point(Spec {
                        direction: dir,
                        threads: best.0,
                        request_size: best.1,
                        order: o,
                        mode,
                    });
                }
                for &m in modes.iter().filter(|&&m| m != mode) {
                    for &t in &threads {
                        self.point(Spec {
                            direction: dir,
                            threads: t,
                            request_size: best.1,
                            order,
                            mode: m,
                        });
                    }
                }
            }
        }
    }

    fn make_read_file(&mut self) -> std::io::Result<()> {
        let p = self.dir.join("read-test");
        let len = self.opts.bytes_per_point.div_ceil(DIRECT_ALIGN as u64) * DIRECT_ALIGN as u64;
        let f = OpenOptions::new().write(true).create_new(true).open(&p)?;
        let chunk = (16 * MIB).min(len) as usize;
        let buf = AlignedBuf::new(chunk, self.opts.seed);
        let mut off = 0;
        while off < len {
            let n = (len - off).min(chunk as u64) as usize;
            f.write_all_at(&buf[..n], off)?;
            off += n as u64;
        }
        f.sync_data()?;
        let _ = fsio::drop_cache(&f);
        self.read_file = Some(p);
        Ok(())
    }

    fn point(&mut self, spec: Spec) {
        let requests = self.opts.bytes_per_point / spec.request_size;
        if requests == 0 {
            self.skipped.push(format!(
                "{}: request larger than the {} per point",
                spec.describe(),
                bytes(self.opts.bytes_per_point)
            ));
            return;
        }
        if (requests as usize) < spec.threads {
            self.skipped.push(format!(
                "{}: only {requests} requests in {} per point, fewer than threads",
                spec.describe(),
                bytes(self.opts.bytes_per_point)
            ));
            return;
        }
        self.progress.on_step(&spec.describe());
        let mut runs = Vec::new();
        for _ in 0..self.opts.repeats.max(1) {
            self.next_id += 1;
            let seed = self.opts.seed ^ (self.next_id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let offsets = request_offsets(spec.order, requests as usize, spec.request_size, seed);
            let p = match spec.direction {
                Direction::Write => self.write_point(spec, &offsets),
                Direction::Read => self.read_point(spec, &offsets),
            };
            let failed = p.error.is_some();
            runs.push(p);
            if failed {
                break;
            }
        }
        self.points.push(median_run(spec, runs));
    }

    fn write_point(&mut self, spec: Spec, offsets: &[u64]) -> DiskPoint {
        let path = self.dir.join(format!("write-{}", self.next_id));
        let mut point = empty_point(spec);
        let file = match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(f) => f,
            Err(e) => {
                point.error = Some(format!("create {}: {e}", path.display()));
                return point;
            }
        };
        let direct = spec.mode == IoMode::Direct;
        let size = spec.request_size as usize;
        let out = run_requests(
            spec.order,
            offsets,
            spec.threads,
            self.opts.run_time(),
            |t| {
                let f = fsio::open(&path, true, direct)?;
                let buf = AlignedBuf::new(size, self.opts.seed ^ t as u64);
                Ok(move |off: u64| f.write_all_at(&buf, off))
            },
        );
        let sync_start = Instant::now();
        let sync = file.sync_data();
        let sync_s = sync_start.elapsed().as_secs_f64();
        drop(file);
        let _ = std::fs::remove_file(&path);
        point.requests = out.requests;
        point.bytes = out.requests * spec.request_size;
        point.seconds = out.elapsed.as_secs_f64() + sync_s;
        point.sync_seconds = Some(sync_s);
        point.timed_out = out.timed_out;
        point.error = out
            .error
            .map(|e| e.to_string())
            .or_else(|| sync.err().map(|e| format!("fdatasync: {e}")));
        point.mib_per_s = rate(point.bytes, point.seconds);
        point
    }

    fn read_point(&mut self, spec: Spec, offsets: &[u64]) -> DiskPoint {
        let mut point = empty_point(spec);
        let Some(path) = self.read_file.clone() else {
            point.error = Some("no read test file".into());
            return point;
        };
        let len = self.opts.bytes_per_point;
        if spec.mode == IoMode::Buffered {
            if let Ok(f) = File::open(&path) {
                let _ = fsio::drop_cache(&f);
                point.resident_before = fsio::resident_fraction(&f, len).ok();
            }
        }
        let direct = spec.mode == IoMode::Direct;
        let size = spec.request_size as usize;
        let out = run_requests(
            spec.order,
            offsets,
            spec.threads,
            self.opts.run_time(),
            |t| {
                let f = fsio::open(&path, false, direct)?;
                let mut buf = AlignedBuf::new(size, t as u64);
                Ok(move |off: u64| f.read_exact_at(&mut buf, off))
            },
        );
        point.requests = out.requests;
        point.bytes = out.requests * spec.request_size;
        point.seconds = out.elapsed.as_secs_f64();
        point.timed_out = out.timed_out;
        point.error = out.error.map(|e| e.to_string());
        point.mib_per_s = rate(point.bytes, point.seconds);
        point
    }
}

/// The run with the median rate (the failed one, if any failed), with every run's rate.
fn median_run(spec: Spec, mut runs: Vec<DiskPoint>) -> DiskPoint {
    let rates: Vec<f64> = runs.iter().map(|r| r.mib_per_s).collect();
    let resident = runs
        .iter()
        .filter_map(|r| r.resident_before)
        .reduce(f64::max);
    let mut p = match runs.iter().position(|r| r.error.is_some()) {
        Some(i) => runs.swap_remove(i),
        None => match upper_median_by(runs, |r| r.mib_per_s) {
            Some(p) => p,
            None => return empty_point(spec),
        },
    };
    p.runs_mib_per_s = rates;
    p.resident_before = resident;
    p
}

fn empty_point(spec: Spec) -> DiskPoint {
    DiskPoint {
        direction: spec.direction,
        threads: spec.threads,
        request_size: spec.request_size,
        order: spec.order,
        mode: spec.mode,
        runs_mib_per_s: Vec::new(),
        requests: 0,
        bytes: 0,
        seconds: 0.0,
        mib_per_s: 0.0,
        timed_out: false,
        sync_seconds: None,
        resident_before: None,
        error: None,
    }
}

fn rate(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 / MIB as f64 / seconds
    } else {
        0.0
    }
}

fn small_files(
    dir: &Path,
    threads: usize,
    opts: &DiskOptions,
    progress: &dyn ProbeProgress,
) -> SmallFiles {
    progress.on_step(&format!(
        "small files: {} × {} on {threads} thread{}",
        opts.small_files,
        bytes(opts.small_file_size as u64),
        if threads == 1 { "" } else { "s" }
    ));
    let sub = dir.join(format!("small-{threads}"));
    let mut res = SmallFiles {
        threads,
        files: 0,
        file_size: opts.small_file_size,
        seconds: 0.0,
        files_per_s: 0.0,
        timed_out: false,
        syncfs_seconds: None,
        error: None,
    };
    if let Err(e) = std::fs::create_dir(&sub) {
        res.error = Some(format!("mkdir: {e}"));
        return res;
    }
    let next = AtomicUsize::new(0);
    let created = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let timed_out = AtomicBool::new(false);
    let error = Mutex::new(None::<String>);
    let barrier = Barrier::new(threads + 1);
    let max_time = opts.max_time();
    let data = vec![0x5au8; opts.small_file_size];
    let start = std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                barrier.wait();
                let deadline = Instant::now() + max_time;
                loop {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    if Instant::now() >= deadline {
                        timed_out.store(true, Ordering::SeqCst);
                        return;
                    }
                    let k = next.fetch_add(1, Ordering::SeqCst);
                    if k >= opts.small_files {
                        return;
                    }
                    let r = OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(sub.join(format!("f{k}")))
                        .and_then(|mut f| f.write_all(&data));
                    match r {
                        Ok(()) => {
                            created.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => {
                            error.lock().unwrap().get_or_insert(e.to_string());
                            stop.store(true, Ordering::SeqCst);
                            return;
                        }
                    }
                }
            });
        }
        barrier.wait();
        Instant::now()
    });
    res.seconds = start.elapsed().as_secs_f64();
    res.files = created.load(Ordering::SeqCst) as u64;
    res.files_per_s = if res.seconds > 0.0 {
        res.files as f64 / res.seconds
    } else {
        0.0
    };
    res.timed_out = timed_out.load(Ordering::SeqCst) && (res.files as usize) < opts.small_files;
    res.error = error.into_inner().unwrap();
    if let Ok(d) = File::open(&sub) {
        let t = Instant::now();
        if fsio::syncfs(&d).is_ok() {
            res.syncfs_seconds = Some(t.elapsed().as_secs_f64());
        }
    }
    let _ = std::fs::remove_dir_all(&sub);
    res
}

fn fsync_latency(dir: &Path, opts: &DiskOptions, progress: &dyn ProbeProgress) -> FsyncLatency {
    progress.on_step(&format!(
        "fdatasync latency: {} samples",
        opts.fsync_samples
    ));
    let path = dir.join("fsync-test");
    let mut samples = Vec::with_capacity(opts.fsync_samples);
    let r = (|| -> std::io::Result<()> {
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)?;
        let buf = [0xa5u8; 4096];
        // Warm-up: creating the file's first extent is not what is measured.
        f.write_all_at(&buf, 0)?;
        f.sync_data()?;
        let deadline = Instant::now() + opts.max_time();
        for i in 1..=opts.fsync_samples as u64 {
            if Instant::now() >= deadline {
                break;
            }
            f.write_all_at(&buf, i * 4096)?;
            let t = Instant::now();
            f.sync_data()?;
            samples.push(t.elapsed().as_secs_f64());
        }
        Ok(())
    })();
    let _ = std::fs::remove_file(&path);
    let mut res = latency_stats(&mut samples);
    res.error = r.err().map(|e| e.to_string());
    res
}

fn latency_stats(samples: &mut [f64]) -> FsyncLatency {
    samples.sort_by(|a, b| a.total_cmp(b));
    // Nearest rank: each figure is a sample that was measured.
    let at = |q: f64| percentile_nearest_rank(samples, q).unwrap_or(0.0);
    FsyncLatency {
        samples: samples.len(),
        median_s: at(0.5),
        p99_s: at(0.99),
        max_s: samples.last().copied().unwrap_or(0.0),
        mean_s: mean(samples).unwrap_or(0.0),
        error: None,
    }
}

fn cache_drop(points: &[DiskPoint], reads: bool) -> CacheDrop {
    let method = "fdatasync, then posix_fadvise(POSIX_FADV_DONTNEED) before each buffered read \
                  point; residency checked with mincore"
        .to_string();
    let resident: Vec<f64> = points.iter().filter_map(|p| p.resident_before).collect();
    if !reads || resident.is_empty() {
        return CacheDrop {
            method,
            dropped: None,
            max_resident: None,
            note: if reads {
                "no buffered read point checked the page cache".into()
            } else {
                "no reads measured".into()
            },
        };
    }
    let max = resident.iter().copied().fold(0.0, f64::max);
    let dropped = max <= 0.05;
    CacheDrop {
        method,
        dropped: Some(dropped),
        max_resident: Some(max),
        note: if dropped {
            format!(
                "dropped before every buffered read (at most {:.0}% of the file stayed cached): \
                 reads measured the device",
                max * 100.0
            )
        } else {
            format!(
                "could not be dropped (up to {:.0}% of the file stayed cached): buffered reads \
                 measured memory",
                max * 100.0
            )
        },
    }
}

/// Per direction: among the points of the primary mode and order (buffered and loose when
/// measured), the fewest threads, then the smallest requests, within 10% of the best rate.
/// Noisy points ([`DiskPoint::noisy`]) are left out: a rate its own runs disagree on is no
/// ground for a setting. A direction with nothing else gets no recommendation.
pub fn recommend(points: &[DiskPoint], reads_cached: bool) -> Vec<Recommendation> {
    let mut out = Vec::new();
    for dir in [Direction::Write, Direction::Read] {
        let ok: Vec<&DiskPoint> = points
            .iter()
            .filter(|p| p.direction == dir && usable(p))
            .collect();
        let mode = if ok.iter().any(|p| p.mode == IoMode::Buffered) {
            IoMode::Buffered
        } else {
            IoMode::Direct
        };
        let order = if ok
            .iter()
            .any(|p| p.mode == mode && p.order == IssueOrder::Loose)
        {
            IssueOrder::Loose
        } else {
            match ok.iter().find(|p| p.mode == mode) {
                Some(p) => p.order,
                None => continue,
            }
        };
        let cands: Vec<&DiskPoint> = ok
            .into_iter()
            .filter(|p| p.mode == mode && p.order == order)
            .collect();
        let Some(best) = cands
            .iter()
            .max_by(|a, b| a.mib_per_s.total_cmp(&b.mib_per_s))
        else {
            continue;
        };
        let pick = cands
            .iter()
            .filter(|p| p.mib_per_s >= 0.9 * best.mib_per_s)
            .min_by_key(|p| (p.threads, p.request_size))
            .unwrap_or(best);
        let plural = if dir == Direction::Write {
            "writes"
        } else {
            "reads"
        };
        let flag = if dir == Direction::Write {
            "--writers"
        } else {
            "--readers"
        };
        let mut text = format!(
            "{plural}: {} thread{}, {} requests ({} MiB/s",
            pick.threads,
            if pick.threads == 1 { "" } else { "s" },
            bytes(pick.request_size),
            num(pick.mib_per_s)
        );
        if pick.threads != best.threads || pick.request_size != best.request_size {
            let _ = write!(
                text,
                "; best {} MiB/s with {} thread{}, {}",
                num(best.mib_per_s),
                best.threads,
                if best.threads == 1 { "" } else { "s" },
                bytes(best.request_size)
            );
        }
        // The block size is one for both directions (`common_request_size`), printed and
        // saved once, not per direction.
        let _ = write!(text, "): ferry {flag} {}", pick.threads);
        if dir == Direction::Read && reads_cached {
            text.push_str(" (reads came from the page cache)");
        }
        out.push(Recommendation {
            direction: dir,
            mode,
            order,
            threads: pick.threads,
            request_size: pick.request_size,
            mib_per_s: pick.mib_per_s,
            best_threads: best.threads,
            best_request_size: best.request_size,
            best_mib_per_s: best.mib_per_s,
            text,
        });
    }
    out
}

/// A point a recommendation may rest on: measured without error, and not noisy.
fn usable(p: &DiskPoint) -> bool {
    p.error.is_none() && p.mib_per_s > 0.0 && !p.noisy()
}

/// The request size whose worse direction reaches the largest share of that direction's best
/// (each direction at its best thread count for that size); the recommended size itself when
/// the directions agree on one.
fn common_request_size(points: &[DiskPoint], recs: &[Recommendation]) -> Option<u64> {
    let first = recs.first()?.request_size;
    if recs.iter().all(|r| r.request_size == first) {
        return Some(first);
    }
    let sizes: BTreeSet<u64> = points.iter().map(|p| p.request_size).collect();
    let mut best: Option<(f64, u64)> = None;
    for s in sizes {
        let mut worst = f64::INFINITY;
        for r in recs {
            let at = points
                .iter()
                .filter(|p| {
                    p.direction == r.direction
                        && p.mode == r.mode
                        && p.order == r.order
                        && p.request_size == s
                        && usable(p)
                })
                .map(|p| p.mib_per_s)
                .fold(0.0, f64::max);
            worst = worst.min(at / r.best_mib_per_s);
        }
        if worst > 0.0 && best.is_none_or(|(w, _)| worst > w + 1e-9) {
            best = Some((worst, s));
        }
    }
    best.map(|(_, s)| s)
}

impl DiskPoint {
    /// Whether its runs spread by more than 30% of the reported (median) rate.
    pub fn noisy(&self) -> bool {
        let (lo, hi) = self
            .runs_mib_per_s
            .iter()
            .fold((f64::INFINITY, 0.0f64), |(lo, hi), &r| {
                (lo.min(r), hi.max(r))
            });
        self.runs_mib_per_s.len() > 1 && self.mib_per_s > 0.0 && (hi - lo) > 0.3 * self.mib_per_s
    }
}

impl DiskReport {
    /// `"writes: 2 threads, 16 MiB requests; reads: 4 threads, 4 MiB requests"`.
    pub fn summary(&self) -> String {
        self.recommendations
            .iter()
            .map(|r| {
                format!(
                    "{}: {} thread{}, {} requests",
                    if r.direction == Direction::Write {
                        "writes"
                    } else {
                        "reads"
                    },
                    r.threads,
                    if r.threads == 1 { "" } else { "s" },
                    bytes(r.request_size)
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// A plain-text report for a terminal (no colours).
    pub fn render_text(&self) -> String {
        let mut s = String::new();
        self.render_setup(&mut s);
        let mut marks = self.render_tables(&mut s);
        self.render_orders(&mut s, &mut marks.singles);
        self.render_singles_and_errors(&mut s, &marks);
        self.render_small_files_and_fsync(&mut s);
        self.render_recommendation(&mut s);
        self.render_footer(&mut s);
        s
    }

    /// What was probed and how: file system, device, free space, bounds, direct I/O, cache.
    fn render_setup(&self, s: &mut String) {
        let o = &self.options;
        let _ = writeln!(s, "disk probe of {}", self.path.display());
        if let Some(fs) = &self.filesystem {
            let _ = writeln!(
                s,
                "  filesystem   {} on {}, mounted at {} ({})",
                fs.fs_type, fs.source, fs.mount_point, fs.options
            );
        }
        if let Some(d) = &self.device {
            let mut parts = vec![d.name.clone()];
            if let Some(m) = &d.model {
                parts.push(m.clone());
            }
            if let Some(r) = d.rotational {
                parts.push(if r { "rotational" } else { "non-rotational" }.into());
            }
            if let Some(sch) = &d.scheduler {
                parts.push(format!("scheduler {sch}"));
            }
            if let Some(n) = d.nr_requests {
                parts.push(format!("nr_requests {n}"));
            }
            if let Some(b) = d.logical_block_size {
                parts.push(format!("logical block {b} B"));
            }
            if let Some(k) = d.max_sectors_kb {
                parts.push(format!("max request {}", bytes(k * 1024)));
            }
            let _ = writeln!(s, "  device       {}", parts.join(", "));
        }
        if let Some(f) = self.free_bytes {
            let _ = writeln!(s, "  free         {}", bytes(f));
        }
        let _ = writeln!(
            s,
            "  bounds       {} or {} s per point, {} run{} each (median shown); {} sweep",
            bytes(o.bytes_per_point),
            o.max_seconds_per_point,
            o.repeats,
            if o.repeats == 1 { "" } else { "s" },
            match o.sweep {
                Sweep::Staged => "staged",
                Sweep::Full => "full",
            }
        );
        let _ = writeln!(
            s,
            "  direct I/O   {}",
            match &self.direct_io_refused {
                None if o.modes.contains(&IoMode::Direct) =>
                    "O_DIRECT supported (4 KiB-aligned buffers)".to_string(),
                None => "not measured".to_string(),
                Some(e) => format!("refused ({e}): skipped"),
            }
        );
        let _ = writeln!(s, "  page cache   {}", self.cache.note);
    }

    /// Tables: one per (direction, mode, order) with at least two points. Returns the points
    /// left for a line of their own and the marks the tables used.
    fn render_tables<'a>(&'a self, s: &mut String) -> Marks<'a> {
        let mut groups: Vec<(Direction, IoMode, IssueOrder)> = self
            .points
            .iter()
            .map(|p| (p.direction, p.mode, p.order))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        groups.sort();
        let mut marks = Marks::default();
        for g in groups {
            let pts: Vec<&DiskPoint> = self
                .points
                .iter()
                .filter(|p| (p.direction, p.mode, p.order) == g)
                .collect();
            if pts.len() < 2 {
                marks.singles.extend(pts);
                continue;
            }
            render_table(s, g, &pts, &mut marks);
        }
        marks
    }

    /// Issue orders side by side at each direction's best setting; the points shown here
    /// leave `singles`.
    fn render_orders(&self, s: &mut String, singles: &mut Vec<&DiskPoint>) {
        let mut order_lines = Vec::new();
        for dir in [Direction::Write, Direction::Read] {
            let Some(r) = self.recommendations.iter().find(|r| r.direction == dir) else {
                continue;
            };
            let at: Vec<&DiskPoint> = self
                .points
                .iter()
                .filter(|p| {
                    p.direction == dir
                        && p.mode == r.mode
                        && p.threads == r.best_threads
                        && p.request_size == r.best_request_size
                })
                .collect();
            if at.len() < 2 {
                continue;
            }
            let parts: Vec<String> = at
                .iter()
                .map(|p| match &p.error {
                    Some(_) => format!("{} error", p.order),
                    None => format!("{} {}", p.order, num(p.mib_per_s)),
                })
                .collect();
            order_lines.push(format!(
                "  {}s at {} thread{}, {} ({}): {} MiB/s",
                dir.name(),
                r.best_threads,
                if r.best_threads == 1 { "" } else { "s" },
                bytes(r.best_request_size),
                r.mode.name(),
                parts.join(", ")
            ));
            singles.retain(|p| !at.iter().any(|a| std::ptr::eq(*a, *p)));
        }
        if !order_lines.is_empty() {
            s.push_str(
                "\nissue order (serial: one request at a time in offset order; loose: \
                        shared cursor, increasing offsets, all threads in flight; none: random \
                        offsets)\n",
            );
            for l in order_lines {
                let _ = writeln!(s, "{l}");
            }
        }
    }

    /// Points outside every table, the legend of the tables' marks, and the errors.
    fn render_singles_and_errors(&self, s: &mut String, marks: &Marks<'_>) {
        let singles = &marks.singles;
        if !singles.is_empty() {
            s.push_str("\nother points (MiB/s)\n");
            for p in singles.iter() {
                let _ = writeln!(
                    s,
                    "  {}s, {} threads, {}, {} order, {}: {}",
                    p.direction.name(),
                    p.threads,
                    bytes(p.request_size),
                    p.order,
                    p.mode.name(),
                    match &p.error {
                        Some(e) => format!("error: {e}"),
                        None => num(p.mib_per_s),
                    }
                );
            }
        }
        let errors: Vec<&DiskPoint> = self.points.iter().filter(|p| p.error.is_some()).collect();
        if marks.timed_out || marks.noisy {
            s.push('\n');
        }
        if marks.timed_out {
            s.push_str("  * stopped at the time limit before all its bytes\n");
        }
        if marks.noisy {
            s.push_str(
                "  ~ its runs differed by more than 30% of the median: other load on the machine?\n",
            );
        }
        if !errors.is_empty() {
            s.push_str("\nerrors\n");
            for p in errors.iter().take(8) {
                let _ = writeln!(
                    s,
                    "  {}s, {} threads, {}, {}, {}: {}",
                    p.direction.name(),
                    p.threads,
                    bytes(p.request_size),
                    p.order,
                    p.mode.name(),
                    p.error.as_deref().unwrap_or("")
                );
            }
        }
    }

    /// The small-file and fsync measurements, when they ran.
    fn render_small_files_and_fsync(&self, s: &mut String) {
        if !self.small_files.is_empty() {
            s.push_str("\nsmall files (create + write + close, no fsync per file)\n");
            for f in &self.small_files {
                let _ = writeln!(
                    s,
                    "  {:<10} {} files of {} in {}: {} files/s{}{}{}",
                    format!(
                        "{} thread{}:",
                        f.threads,
                        if f.threads == 1 { "" } else { "s" }
                    ),
                    f.files,
                    bytes(f.file_size as u64),
                    secs(f.seconds),
                    num(f.files_per_s),
                    if f.timed_out { " (time limit)" } else { "" },
                    f.syncfs_seconds
                        .map(|t| format!("; then one syncfs {}", secs(t)))
                        .unwrap_or_default(),
                    f.error
                        .as_deref()
                        .map(|e| format!("; error: {e}"))
                        .unwrap_or_default()
                );
            }
        }
        if let Some(f) = &self.fsync {
            let _ = writeln!(
                s,
                "\nfdatasync after a 4 KiB write ({} samples)\n  median {}, p99 {}, max {}, mean {}{}",
                f.samples,
                secs(f.median_s),
                secs(f.p99_s),
                secs(f.max_s),
                secs(f.mean_s),
                f.error
                    .as_deref()
                    .map(|e| format!("; error: {e}"))
                    .unwrap_or_default()
            );
        }
    }

    /// The recommendation per direction, and the block size for both.
    fn render_recommendation(&self, s: &mut String) {
        s.push_str("\nrecommendation\n");
        for dir in [Direction::Write, Direction::Read] {
            if !self.recommendations.iter().any(|r| r.direction == dir) {
                let measured = self.points.iter().any(|p| p.direction == dir);
                let why = if self.points.iter().any(|p| p.direction == dir && p.noisy()) {
                    "every point that succeeded was noisy (~); run it again on a quieter machine"
                } else {
                    "no successful point"
                };
                if measured {
                    let _ = writeln!(s, "  {}s: none: {why}", dir.name());
                }
            }
        }
        if self.points.is_empty() {
            s.push_str("  none: no read or write point\n");
        }
        for r in &self.recommendations {
            let _ = writeln!(s, "  {}", r.text);
        }
        if let Some(c) = self.common_request_size {
            let _ = writeln!(
                s,
                "  block size (one for both directions): --block-size {}",
                size_flag(u64::from(block_size_for(c)))
            );
        }
    }

    /// Notes, the totals, and the profile saved.
    fn render_footer(&self, s: &mut String) {
        if !self.notes.is_empty() || !self.skipped.is_empty() {
            s.push_str("\nnotes\n");
            for n in &self.notes {
                let _ = writeln!(s, "  - {n}");
            }
            if !self.skipped.is_empty() {
                let _ = writeln!(
                    s,
                    "  - {} combination(s) skipped (fewer requests per point than threads, or \
                     requests larger than a point), e.g. {}",
                    self.skipped.len(),
                    self.skipped[0]
                );
            }
        }
        let _ = writeln!(
            s,
            "\n{} points in {:.1} s; temporary directory {}",
            self.points.len(),
            self.seconds,
            if self.cleaned_up {
                "removed"
            } else {
                "NOT removed (see notes)"
            }
        );
        // Printed from the entry that was saved, so that the two cannot differ.
        if let (Some(p), Some(e)) = (&self.profile, self.profile_entry(String::new())) {
            let _ = writeln!(
                s,
                "profile saved in {}: transfers on this file system start with {} readers, {} \
                 writers{} unless given --readers, --writers or --block-size",
                p.display(),
                e.read_threads,
                e.write_threads,
                match e.request_size {
                    Some(c) =>
                        format!(" and blocks of {}", size_flag(u64::from(block_size_for(c)))),
                    None => String::new(),
                }
            );
        }
    }
}

/// What the tables leave for the rest of the report.
#[derive(Default)]
struct Marks<'a> {
    /// Points of a (direction, mode, order) with no other point: shown one per line.
    singles: Vec<&'a DiskPoint>,
    /// A cell stopped at the time limit (`*`).
    timed_out: bool,
    /// A cell's runs differed widely (`~`).
    noisy: bool,
}

/// One table: a row per request size, a column per thread count (MiB/s).
fn render_table(
    s: &mut String,
    g: (Direction, IoMode, IssueOrder),
    pts: &[&DiskPoint],
    marks: &mut Marks<'_>,
) {
    let threads: Vec<usize> = pts
        .iter()
        .map(|p| p.threads)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let sizes: Vec<u64> = pts
        .iter()
        .map(|p| p.request_size)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let _ = writeln!(
        s,
        "\n{}s, {}, {} order (MiB/s)",
        g.0.name(),
        g.1.name(),
        g.2
    );
    let mut head = format!("  {:<10}", "request");
    for t in &threads {
        let _ = write!(head, "{:>10}", format!("{t} thr"));
    }
    let _ = writeln!(s, "{}", head.trim_end());
    for sz in &sizes {
        let mut row = format!("  {:<10}", bytes(*sz));
        for t in &threads {
            let cell = match pts
                .iter()
                .find(|p| p.threads == *t && p.request_size == *sz)
            {
                None => "-".to_string(),
                Some(p) if p.error.is_some() => "error".to_string(),
                Some(p) => {
                    marks.timed_out |= p.timed_out;
                    let noisy = p.noisy();
                    marks.noisy |= noisy;
                    format!(
                        "{}{}{}",
                        num(p.mib_per_s),
                        if p.timed_out { "*" } else { "" },
                        if noisy { "~" } else { "" }
                    )
                }
            };
            let _ = write!(row, "{cell:>10}");
        }
        let _ = writeln!(s, "{}", row.trim_end());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pt(dir: Direction, threads: usize, req_mib: u64, mib_per_s: f64) -> DiskPoint {
        DiskPoint {
            mib_per_s,
            ..empty_point(Spec {
                direction: dir,
                threads,
                request_size: req_mib * MIB,
                order: IssueOrder::Loose,
                mode: IoMode::Buffered,
            })
        }
    }

    #[test]
    fn recommends_fewest_threads_within_ten_percent() {
        use Direction::*;
        let points = vec![
            pt(Write, 1, 1, 300.0),
            pt(Write, 2, 1, 500.0),
            pt(Write, 4, 1, 520.0),
            pt(Write, 1, 16, 600.0),
            pt(Write, 2, 16, 812.0),
            pt(Write, 4, 16, 830.0),
            pt(Write, 8, 16, 700.0),
            pt(Read, 1, 1, 900.0),
            pt(Read, 4, 1, 2000.0),
            pt(Read, 4, 16, 2100.0),
            pt(Read, 8, 16, 2150.0),
        ];
        let r = recommend(&points, false);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].threads, r[0].request_size), (2, 16 * MIB));
        assert_eq!((r[0].best_threads, r[0].best_mib_per_s), (4, 830.0));
        assert_eq!(
            r[0].text,
            "writes: 2 threads, 16 MiB requests (812 MiB/s; best 830 MiB/s with 4 threads, 16 \
             MiB): ferry --writers 2"
        );
        assert_eq!((r[1].threads, r[1].request_size), (4, MIB));
        assert!(r[1].text.starts_with("reads: 4 threads, 1 MiB requests"));
        // 16 MiB: writes 830/830, reads 2150/2150; 1 MiB: writes 520/830.
        assert_eq!(common_request_size(&points, &r), Some(16 * MIB));
    }

    /// A point whose runs spread over more than 30% of its median.
    fn noisy_pt(dir: Direction, threads: usize, req_mib: u64, mib_per_s: f64) -> DiskPoint {
        DiskPoint {
            runs_mib_per_s: vec![mib_per_s * 0.5, mib_per_s, mib_per_s * 1.5],
            ..pt(dir, threads, req_mib, mib_per_s)
        }
    }

    #[test]
    fn noisy_points_are_not_recommended() {
        use Direction::*;
        // The fastest write point (4 MiB) is noisy: the steady 1 MiB point is recommended.
        let points = vec![
            pt(Write, 1, 1, 500.0),
            noisy_pt(Write, 1, 4, 900.0),
            pt(Read, 1, 1, 1000.0),
            pt(Read, 1, 4, 1000.0),
        ];
        assert!(points[1].noisy() && !points[0].noisy());
        let r = recommend(&points, false);
        assert_eq!((r[0].direction, r[0].request_size), (Write, MIB));
        assert_eq!(r[0].best_mib_per_s, 500.0, "{:?}", r[0]);
        // Both directions agree on 1 MiB, and the noisy 4 MiB point cannot pull them apart.
        assert_eq!(common_request_size(&points, &r), Some(MIB));
        // A direction with only noisy points gets nothing.
        let only_noisy = vec![noisy_pt(Write, 1, 1, 500.0), pt(Read, 1, 1, 900.0)];
        let r = recommend(&only_noisy, false);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].direction, Read);
    }

    #[test]
    fn what_is_printed_is_what_is_saved() {
        use Direction::*;
        // Writes do best with 4 MiB requests and reads with 1 MiB: one block size serves both.
        let points = vec![
            pt(Write, 1, 1, 300.0),
            pt(Write, 1, 4, 600.0),
            pt(Read, 2, 1, 1000.0),
            pt(Read, 2, 4, 700.0),
        ];
        let recommendations = recommend(&points, false);
        let common_request_size = common_request_size(&points, &recommendations);
        let report = DiskReport {
            path: "/x".into(),
            filesystem: None,
            device: None,
            free_bytes: None,
            options: DiskOptions::quick(),
            direct_io_refused: None,
            cache: CacheDrop {
                method: String::new(),
                dropped: None,
                max_resident: None,
                note: String::new(),
            },
            points,
            skipped: Vec::new(),
            small_files: Vec::new(),
            fsync: None,
            recommendations,
            common_request_size,
            notes: Vec::new(),
            seconds: 1.0,
            cleaned_up: true,
            profile: Some("/state/disk.toml".into()),
        };
        let saved = report.profile_entry(String::new()).unwrap();
        let text = report.render_text();
        let size = size_flag(u64::from(block_size_for(saved.request_size.unwrap())));
        // Every --block-size printed is the one saved, and the saved line says so.
        let printed: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("--block-size "))
            .collect();
        assert_eq!(printed.len(), 1, "{text}");
        assert!(
            printed[0].ends_with(&format!("--block-size {size}")),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "start with {} readers, {} writers and blocks of {size}",
                saved.read_threads, saved.write_threads
            )),
            "{text}"
        );
        assert!(text.contains("ferry --writers 1\n"), "{text}");
        assert!(text.contains("ferry --readers 2\n"), "{text}");
    }

    #[test]
    fn latency_percentiles() {
        let mut v: Vec<f64> = (1..=100).map(|i| i as f64).collect();
        let l = latency_stats(&mut v);
        assert_eq!((l.median_s, l.p99_s, l.max_s), (50.0, 99.0, 100.0));
        let l = latency_stats(&mut []);
        assert_eq!(l.samples, 0);
    }
}

// ---------------------------------------------------------------------------------------------
// Profiles: `disk-profiles.json` in the state directory, keyed by the file system's device
// number, so that a transfer reading or writing anywhere on that file system finds it.

/// File name of the disk profiles in the state directory.
pub const DISK_PROFILE_FILE: &str = "disk-profiles.json";
/// Most file systems kept.
pub const MAX_DISK_PROFILES: usize = 64;

/// What `ferry probe disk` found best for one file system, in the terms ferry's transfers
/// use: reader and writer threads (buffered I/O, each thread working through its own file).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct DiskProfile {
    /// The path that was probed (for people; lookups go by device).
    pub path: PathBuf,
    pub read_threads: u32,
    pub write_threads: u32,
    pub read_mib_per_s: f64,
    pub write_mib_per_s: f64,
    /// The one request size for both directions (`common_request_size`): transfers that
    /// are not given `--block-size` start with blocks of this size (clamped to 1–16 MiB).
    #[serde(default)]
    pub request_size: Option<u64>,
    /// UTC, RFC 3339.
    pub measured_at: String,
}

impl crate::store::Stamped for DiskProfile {
    fn measured_at(&self) -> &str {
        &self.measured_at
    }
}

/// The key of the file system holding `path`: its device number, `MAJ:MIN`.
pub fn device_key(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let (major, minor) = fsio::dev_major_minor(std::fs::metadata(path).ok()?.dev());
    Some(format!("{major}:{minor}"))
}

impl DiskReport {
    /// The profile to save: the buffered recommendation of each direction (what transfers
    /// do), `None` when a direction was not measured.
    pub fn profile_entry(&self, measured_at: String) -> Option<DiskProfile> {
        let pick = |d: Direction| {
            self.recommendations
                .iter()
                .filter(|r| r.direction == d)
                .min_by_key(|r| r.mode != IoMode::Buffered)
        };
        let (r, w) = (pick(Direction::Read)?, pick(Direction::Write)?);
        Some(DiskProfile {
            path: self.path.clone(),
            read_threads: u32::try_from(r.threads).unwrap_or(u32::MAX).max(1),
            write_threads: u32::try_from(w.threads).unwrap_or(u32::MAX).max(1),
            read_mib_per_s: r.mib_per_s,
            write_mib_per_s: w.mib_per_s,
            request_size: self.common_request_size,
            measured_at,
        })
    }
}

/// The block size a transfer starts with on a file system whose best request size is
/// `request_size`. Clamped: below 1 MiB per-block costs (a frame, a digest, a journal record)
/// start to count, and above 16 MiB the memory a session holds (a few blocks per stream and
/// writer) grows past what the network needs.
pub fn block_size_for(request_size: u64) -> u32 {
    request_size.clamp(1 << 20, 16 << 20) as u32
}

/// Saves `profile` for the file system holding `probed`. Returns the file's path.
pub fn save_disk_profile(
    dir: &Path,
    probed: &Path,
    profile: DiskProfile,
) -> std::io::Result<PathBuf> {
    let key = device_key(probed)
        .ok_or_else(|| std::io::Error::other(format!("cannot stat {}", probed.display())))?;
    crate::store::save(dir, DISK_PROFILE_FILE, &key, profile, MAX_DISK_PROFILES)
}

/// The saved profile of the file system holding `path` (or, for a path that does not exist
/// yet, its nearest existing ancestor).
pub fn disk_profile_for(dir: &Path, path: &Path) -> Option<DiskProfile> {
    let existing = path.ancestors().find(|p| p.exists())?;
    let key = device_key(existing)?;
    crate::store::load::<DiskProfile>(dir, DISK_PROFILE_FILE).remove(&key)
}

#[cfg(test)]
mod profile_tests {
    use super::*;

    #[test]
    fn profiles_are_found_by_file_system_from_any_path_on_it() {
        let state = tempfile::tempdir().unwrap();
        let data = tempfile::tempdir().unwrap();
        let p = DiskProfile {
            path: data.path().to_owned(),
            read_threads: 2,
            write_threads: 1,
            read_mib_per_s: 900.0,
            write_mib_per_s: 300.0,
            request_size: Some(4 << 20),
            measured_at: "2026-11-22T04:00:00Z".into(),
        };
        let file = save_disk_profile(state.path(), data.path(), p.clone()).unwrap();
        assert!(file.ends_with(DISK_PROFILE_FILE));
        // Any path on the same file system, also one that does not exist yet.
        let inner = data.path().join("a/b/not-yet");
        assert_eq!(disk_profile_for(state.path(), &inner), Some(p));
        // Nothing saved: nothing found.
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(disk_profile_for(empty.path(), data.path()), None);
    }

    #[test]
    fn block_sizes_from_request_sizes_are_bounded() {
        assert_eq!(block_size_for(4 << 20), 4 << 20);
        assert_eq!(block_size_for(64 << 20), 16 << 20);
        assert_eq!(block_size_for(4096), 1 << 20);
    }
}
