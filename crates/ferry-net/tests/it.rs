//! Every integration test of this crate in one binary: one link instead of one per file,
//! which is most of what the test build costs. Tests that need a process of their own
//! (a global allocator, re-running their own binary) stay separate targets in Cargo.toml.
//! `every_test_file_is_built` (ferry-cli's tests/it.rs) fails when a file in tests/ is in
//! neither place.

mod autotune;
mod catalog_ops;
mod catalog_session;
mod ending;
mod hostile_blocks;
mod multipath;
mod rerun;
mod resume_cut;
mod scopes;
mod security;
mod speedtest;
mod stripe;
mod stripe_get;
mod sync;
mod sync_between;
mod third_party;
mod third_party_pull;
mod third_party_review;
mod third_party_stripe;
mod tls;
mod transfer;
mod trees;
mod util;
mod verify;
