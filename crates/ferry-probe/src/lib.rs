//! ferry's probes: what a host and a disk can do, measured, with advice.
//!
//! - [`host::probe_host`]: CPUs, sockets and NUMA nodes; NICs with speed, NUMA node and IRQs, and
//!   IRQ-affinity conflicts; TCP settings with concrete advice; per-core speed of the digests
//!   ferry computes and of AES-256-GCM; the routes' initial windows (`ip -j route`). It never
//!   fails: whatever it cannot read is listed in [`host::HostReport::unreadable`] (routes it
//!   cannot read, in its notes).
//! - [`disk::probe_disk`]: read and write throughput of a file system against threads, request
//!   size, issue order and buffered or direct I/O; small-file create rate; fdatasync latency; and
//!   the thread count and request size to use for reading and for writing. Bounded in bytes and
//!   time per point, and it removes everything it created, also on error or panic.
//! - [`net::probe_net`]: throughput to a `ferry serve` against stream count and socket buffer,
//!   what limits it (window, loss or the path) in words, and a per-endpoint profile. The
//!   measurement itself is the caller's (a closure), so this crate needs no async runtime.
//!
//! The reports are `serde::Serialize` and have `render_text()` for a terminal. Libraries never
//! print: progress goes through [`ProbeProgress`].

pub mod disk;
pub mod host;
pub mod interrupts;
pub mod net;
pub mod order;
pub mod placement;
pub mod routes;
pub mod speed;
pub mod store;
pub mod tcp;

mod cpulist;
mod fsio;
mod sys;

pub use disk::{probe_disk, DiskOptions, DiskReport};
pub use host::{probe_host, HostOptions, HostReport};
pub use order::IssueOrder;

/// Told what a probe is doing, step by step (for a progress line). Every method has a default
/// that does nothing.
pub trait ProbeProgress {
    /// A new step starts, e.g. `"write: 4 threads, 16 MiB requests, loose order, buffered"`.
    fn on_step(&self, what: &str) {
        let _ = what;
    }
}

/// A [`ProbeProgress`] that ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

impl ProbeProgress for NoProgress {}

/// Why a disk probe could not run at all. Failures of single measurements are recorded in the
/// report instead.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{}: not a directory", path.display())]
    NotADirectory { path: std::path::PathBuf },
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{}: {free} bytes free, the probe needs {needed} (lower the bytes per point)",
        path.display()
    )]
    NoSpace {
        path: std::path::PathBuf,
        needed: u64,
        free: u64,
    },
    #[error("invalid probe options: {0}")]
    InvalidOptions(String),
}
