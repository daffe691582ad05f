//! Progress reporting. Libraries never print: they tell a [`Reporter`], and the binary decides
//! whether that becomes a progress bar, a final line, JSON or nothing.

/// Receives progress events from any thread. Every method has an empty default.
pub trait Reporter: Send + Sync {
    /// The walk found more work (files and bytes), before it is sent.
    fn on_discovered(&self, _files: u64, _bytes: u64) {}
    /// The walk is over: totals are final, so an ETA is meaningful.
    fn on_walk_done(&self) {}
    /// Payload bytes sent (sender) or written (receiver).
    fn on_bytes(&self, _n: u64) {}
    /// A file finished (read completely on the sender, durable under its name on the receiver).
    fn on_file_done(&self) {}
    /// A block failed its digest and will be sent again.
    fn on_bad_block(&self) {}
    /// A stripe host's block landed in a partial copy (a striped put's coordinator):
    /// `merged` when its BLAKE3 chaining values went into the file's tree, else it was read
    /// back.
    fn on_landed(&self, _merged: bool) {}
    /// The attempt failed in a way a retry may fix; the next starts after `wait`.
    fn on_retry(&self, _attempt: u32, _wait: std::time::Duration, _error: &str) {}
    /// Something worth telling the user that does not stop the transfer.
    fn on_warning(&self, _msg: &str) {}
    /// A file (or other entry) failed; the transfer goes on with the others. The message is
    /// also in the final report's errors: a reporter that shows it now can leave it out then.
    fn on_file_failed(&self, msg: &str) {
        self.on_warning(msg);
    }
}

/// A reporter that ignores everything.
pub struct NoReporter;

impl Reporter for NoReporter {}
