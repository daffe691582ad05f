//! The terminal side of progress: an indicatif bar on a TTY, nothing otherwise.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ferry_core::Reporter;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Whole-job progress: bytes, files, throughput and ETA.
pub struct Progress {
    bar: ProgressBar,
    quiet: bool,
    files_done: AtomicU64,
    files_total: AtomicU64,
}

impl Progress {
    /// A bar only when stderr is a terminal and the user did not ask for quiet; warnings are
    /// still printed (to stderr) unless quiet.
    pub fn new(quiet: bool) -> Self {
        let draw = !quiet
            && std::io::stderr().is_terminal()
            && std::env::var_os("FERRY_NO_PROGRESS").is_none();
        let bar = if draw {
            ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr_with_hz(8))
        } else {
            ProgressBar::hidden()
        };
        // No colour codes in the template, so NO_COLOR and dumb terminals need nothing special.
        let style = ProgressStyle::with_template(
            "{elapsed_precise} [{wide_bar}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        bar.enable_steady_tick(Duration::from_millis(250));
        Self {
            bar,
            quiet,
            files_done: AtomicU64::new(0),
            files_total: AtomicU64::new(0),
        }
    }

    fn update_msg(&self) {
        let (d, t) = (
            self.files_done.load(Ordering::Relaxed),
            self.files_total.load(Ordering::Relaxed),
        );
        self.bar.set_message(format!("files {d}/{t}"));
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Reporter for Progress {
    fn on_discovered(&self, files: u64, bytes: u64) {
        self.files_total.fetch_add(files, Ordering::Relaxed);
        self.bar.inc_length(bytes);
        self.update_msg();
    }

    fn on_bytes(&self, n: u64) {
        self.bar.inc(n);
    }

    fn on_file_done(&self) {
        self.files_done.fetch_add(1, Ordering::Relaxed);
        self.update_msg();
    }

    fn on_retry(&self, attempt: u32, wait: Duration, error: &str) {
        if !self.quiet {
            self.bar.suspend(|| {
                eprintln!(
                    "warning: attempt {attempt} failed: {error}; retrying in {} s",
                    wait.as_secs()
                )
            });
        }
        self.bar.set_message(format!(
            "retrying in {} s (attempt {})",
            wait.as_secs(),
            attempt + 1
        ));
    }

    fn on_warning(&self, msg: &str) {
        if !self.quiet {
            self.bar.suspend(|| eprintln!("warning: {msg}"));
        }
    }
}

/// `1.23 GiB` style.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}
