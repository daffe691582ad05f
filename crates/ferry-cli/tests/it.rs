//! Every integration test of this crate in one binary: one link instead of one per file,
//! which is most of what the test build costs. Tests that need a process of their own
//! (a global allocator, re-running their own binary) stay separate targets in Cargo.toml.
//! `every_test_file_is_built` (ferry-cli's tests/it.rs) fails when a file in tests/ is in
//! neither place.

mod access;
mod best_replica;
mod bundles;
mod catalog_cmds;
mod cli;
mod endpoints;
mod filters;
mod metrics;
mod multipath;
mod policies;
mod replicas;
mod rerun;
mod serve_config;
mod service;
mod shared_catalog;
mod ssh;
mod striping;
mod sync;
mod third_party;
mod util;
mod ux;

/// Cargo builds only the test targets a crate's Cargo.toml names where `autotests = false`,
/// so a new file in such a crate's tests/ that is neither a `[[test]]` of its own nor a module
/// of its tests/it.rs would never run. Checked here once for the whole workspace.
#[test]
fn every_test_file_is_built() {
    let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    for krate in std::fs::read_dir(&crates).unwrap() {
        let krate = krate.unwrap().path();
        let manifest = std::fs::read_to_string(krate.join("Cargo.toml")).unwrap_or_default();
        if !manifest.lines().any(|l| l.trim() == "autotests = false") {
            continue;
        }
        let tests = krate.join("tests");
        let it = std::fs::read_to_string(tests.join("it.rs")).unwrap();
        for entry in std::fs::read_dir(&tests).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            let Some(stem) = name.strip_suffix(".rs") else {
                continue;
            };
            let target = format!("path = \"tests/{name}\"");
            assert!(
                manifest.lines().any(|l| l.trim() == target)
                    || it.lines().any(|l| l == format!("mod {stem};")),
                "{}: tests/{name} is neither a test target nor a module of tests/it.rs",
                krate.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 4, "found the crates' test files ({checked})");
}
