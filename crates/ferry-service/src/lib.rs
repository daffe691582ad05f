//! ferry's transfer service (issue 40): jobs submitted over an HTTP API, kept in SQLite, run
//! side by side by a scheduler through ferry-net's client library, retried with backoff and
//! resumed from ferry's own partial files after a failure or a crash.

pub mod error;
pub mod job;
pub mod store;

pub use error::ServiceError;
pub use job::{Job, Kind, NewJob, Progress, State, SyncMode};
pub use store::Store;
