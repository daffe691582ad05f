//! The statistics and units every ferry crate reports in, written once so that a bench table,
//! a probe report and the CLI agree on what a median is and how "16M" reads.
//!
//! std only: every crate (the sans-I/O ones included) can depend on it.

pub mod stats;
pub mod units;

pub use units::{ParseError, ParseErrorKind};
