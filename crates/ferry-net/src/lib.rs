//! ferry's network driver over tokio: the server daemon, the client, and the engine that runs a
//! transfer between a `ferry_core` sender and receiver across one control and N data
//! connections, all on one server port.

mod autotune;
pub mod catalog;
pub mod client;
pub mod copy;
mod engine;
pub mod error;
pub mod repl;
pub mod server;
pub mod speedtest;
pub mod sync;
mod transport;

pub use server::access;
pub use transport::{tcp, tls};
// Short paths for the driver's own modules (`crate::conn`, `crate::stream`).
pub(crate) use transport::{conn, stream};

// The session's timeline, under the name the driver's modules use.
use ferry_session::timeline;

pub use autotune::{
    bottleneck, ramp_helpers, ThreadReport, ThreadStep, AUTO_MAX_STORAGE_THREADS, AUTO_MAX_STREAMS,
    DEFAULT_STORAGE_THREADS, DEFAULT_STREAMS, MAX_RAMP_HELPERS,
};
pub use client::{ClientConfig, Pool, Security, StartFrom, StripeHost, TransferReport, Tuning};
pub use copy::{CopyConfig, CopyReport};
pub use engine::{StreamReport, StripeReport};
pub use error::SessionError;
pub use ferry_session::Timeline;
pub use server::{Peer, Policies, Policy, PolicyError, Server, ServerConfig};
pub use tls::{Fingerprint, Identity, KnownHosts, ServerTrust};
