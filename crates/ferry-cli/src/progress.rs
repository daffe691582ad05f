//! The terminal side of progress: an indicatif bar on a TTY, nothing otherwise.

use std::collections::HashSet;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use ferry_core::Reporter;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Whole-job progress: bytes, files, throughput and ETA.
pub struct Progress {
    bar: ProgressBar,
    /// Whether the bar is drawn: a hidden bar's message is never seen, so it is not built
    /// (a `format!` and the bar's lock twice per file, ~2.5% of a tiny tree's client CPU).
    draw: bool,
    quiet: bool,
    files_done: AtomicU64,
    files_total: AtomicU64,
    /// Failures already printed as they happened, not to be printed again at the end.
    shown: Mutex<HashSet<String>>,
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
            draw,
            quiet,
            files_done: AtomicU64::new(0),
            files_total: AtomicU64::new(0),
            shown: Mutex::default(),
        }
    }

    fn update_msg(&self) {
        if !self.draw {
            return;
        }
        let (d, t) = (
            self.files_done.load(Ordering::Relaxed),
            self.files_total.load(Ordering::Relaxed),
        );
        self.bar.set_message(format!("files {d}/{t}"));
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }

    /// Whether this failure was printed while the transfer ran.
    pub fn was_shown(&self, msg: &str) -> bool {
        self.shown
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(msg)
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
                    "warning: attempt {attempt} failed: {}; retrying in {} s",
                    crate::output::clean(error),
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
            self.bar
                .suspend(|| eprintln!("warning: {}", crate::output::clean(msg)));
        }
    }

    /// Printed at once, as an error, and only once: the end of the run leaves it out.
    fn on_file_failed(&self, msg: &str) {
        if self.quiet {
            return;
        }
        let mut shown = self.shown.lock().unwrap_or_else(|e| e.into_inner());
        if shown.insert(msg.to_owned()) {
            self.bar
                .suspend(|| eprintln!("error: {}", crate::output::clean(msg)));
        }
    }
}
