//! What the bench's end-to-end tests share: the bench binary and the `ferry` it drives.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ferry-bench"))
}

/// The `ferry` binary: $FERRY_BIN, else the workspace's target/{debug,release}/ferry (debug
/// first: `cargo test --workspace` has just built it for ferry-cli's own tests).
pub fn ferry_bin() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("FERRY_BIN") {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    ["debug", "release"]
        .iter()
        .map(|p| target.join(p).join("ferry"))
        .find(|p| p.is_file())
}
