//! Every integration test of this crate in one binary: one link instead of one per file,
//! which is most of what the test build costs. Tests that need a process of their own
//! (a global allocator, re-running their own binary) stay separate targets in Cargo.toml.
//! `every_test_file_is_built` (ferry-cli's tests/it.rs) fails when a file in tests/ is in
//! neither place.

mod common;
mod host;
mod multipath;
mod service;
mod smoke;
mod thirdparty;
