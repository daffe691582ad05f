//! ferry-service's integration tests, one binary: a real ferry server (ferry-net's `Server`)
//! on loopback, the service's scheduler and HTTP API in front of it.

mod api;
mod browser;
mod crash;
mod history;
mod notify;
mod probes;
mod scheduler;
mod shared_queue;
mod util;
