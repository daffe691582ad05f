//! Every integration test of this crate in one binary: one link instead of one per file,
//! which is most of what the test build costs. Tests that need a process of their own
//! (a global allocator, re-running their own binary) stay separate targets in Cargo.toml.
//! `a_test_file_is_a_module_here` fails when a file in tests/ is in neither place.

mod autotune;
mod ending;
mod hostile_blocks;
mod multipath;
mod rerun;
mod resume_cut;
mod scopes;
mod security;
mod speedtest;
mod stripe;
mod sync;
mod third_party;
mod third_party_review;
mod tls;
mod transfer;
mod trees;
mod util;

/// Cargo builds only the targets Cargo.toml names (`autotests = false`), so a new file in
/// tests/ that is not declared here would never run.
#[test]
fn a_test_file_is_a_module_here() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let this = std::fs::read_to_string(dir.join("it.rs")).unwrap();
    let separate: &[&str] = &["hostile", "exhaustion", "catalog"];
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let Some(stem) = name.strip_suffix(".rs") else {
            continue;
        };
        if stem == "it" || separate.contains(&stem) {
            continue;
        }
        assert!(
            this.lines().any(|l| l == format!("mod {stem};")),
            "tests/{name} is not a module of tests/it.rs nor a target of its own"
        );
    }
}
