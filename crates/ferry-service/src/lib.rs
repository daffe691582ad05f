//! ferry's transfer service (issue 40): jobs submitted over an HTTP API, kept in SQLite (or a
//! PostgreSQL queue several services share), run
//! side by side by a scheduler through ferry-net's client library, retried with backoff and
//! resumed from ferry's own partial files after a failure or a crash.

pub mod api;
pub mod client;
pub mod dashboard;
pub mod endpoints;
pub mod error;
pub mod history;
pub mod http;
pub mod job;
pub mod location;
pub mod notify;
pub mod optimizer;
pub mod prober;
pub mod runner;
pub mod scheduler;
pub mod service;
mod sizesync;
pub mod store;
pub mod timing;
pub mod tls;

pub use endpoints::{Endpoint, Endpoints};
pub use error::ServiceError;
pub use job::{Job, Kind, NewJob, Progress, State, SyncMode};
pub use runner::{classify, Runner};
pub use scheduler::{Limits, Scheduler};
pub use service::{Service, ServiceConfig};
pub use store::Store;
