//! What a test does when this machine lacks something it needs: root, network namespaces, TUN,
//! a tmpfs mount, sshd, a tool. Outside CI it says why on stderr and the test returns early;
//! under CI (`CI` set, as CI services do) it fails, so that a CI run cannot pass on tests that
//! never ran. Every such test in the workspace decides through [`needs`], so the rule lives here.
//!
//! Test support, not part of the emulator: the one place in this crate that prints on purpose,
//! because saying why a test did not run is its whole job.

use std::fmt::Display;
use std::path::Path;

/// A directory where each test that calls [`needs`] leaves a marker (`ran/NAME` or
/// `unmet/NAME`), so that a test runner (scripts/test.sh) can say how many tests needed what
/// and how many could not run.
pub const MARKER_DIR_ENV: &str = "FERRY_TEST_NEEDS_DIR";

/// Whether the `CI` environment variable asks for strictness: set, and not empty, `0` or
/// `false`.
pub fn in_ci() -> bool {
    ci_is_on(std::env::var("CI").ok().as_deref())
}

fn ci_is_on(value: Option<&str>) -> bool {
    value.is_some_and(|v| {
        let v = v.trim();
        !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false")
    })
}

/// `Some(value)` when what `test` needs is here. Otherwise `None` after saying why (the test
/// then returns early), or, under CI, a panic that fails the test with the same reason.
///
/// ```no_run
/// let Some(()) = ferry_netem::needs("my_test", ferry_netem::can_run()) else {
///     return;
/// };
/// ```
pub fn needs<T, E: Display>(test: &str, what: Result<T, E>) -> Option<T> {
    let marks = std::env::var_os(MARKER_DIR_ENV);
    decide(test, what, in_ci(), marks.as_deref().map(Path::new))
}

fn decide<T, E: Display>(
    test: &str,
    what: Result<T, E>,
    ci: bool,
    marks: Option<&Path>,
) -> Option<T> {
    match what {
        Ok(v) => {
            mark(marks, test, "ran");
            Some(v)
        }
        Err(why) => {
            mark(marks, test, "unmet");
            if ci {
                panic!("{test} cannot run here, and CI is set so it may not pass unrun: {why}");
            }
            eprintln!("SKIPPED {test}: {why} (with CI set this fails)");
            None
        }
    }
}

/// Leaves `DIR/kind/test` when there is a marker directory; best effort, as a marker that
/// cannot be written must not fail the test it describes.
fn mark(marks: Option<&Path>, test: &str, kind: &str) {
    let Some(dir) = marks else {
        return;
    };
    let dir = dir.join(kind);
    let name: String = test
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join(name), b"");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_values() {
        for on in ["true", "1", "yes", "TRUE"] {
            assert!(ci_is_on(Some(on)), "{on}");
        }
        for off in [
            None,
            Some(""),
            Some(" "),
            Some("0"),
            Some("false"),
            Some("False"),
        ] {
            assert!(!ci_is_on(off), "{off:?}");
        }
    }

    #[test]
    fn unmet_needs_skip_outside_ci_and_fail_under_it() {
        let marks = tempfile_dir();
        let m = Some(marks.as_path());
        assert_eq!(decide::<_, String>("a::met", Ok(7), false, m), Some(7));
        assert_eq!(decide::<u8, _>("a::unmet", Err("no tun"), false, m), None);
        assert_eq!(decide::<_, String>("b", Ok(()), true, m), Some(()));
        let failed =
            std::panic::catch_unwind(|| decide::<u8, _>("b_unmet", Err("needs root"), true, m))
                .expect_err("an unmet need fails under CI");
        let msg = failed.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(
            msg.contains("b_unmet") && msg.contains("needs root"),
            "{msg}"
        );
        // Without a marker directory nothing is written anywhere.
        assert_eq!(decide::<u8, _>("c", Err("x"), false, None), None);
        let list = |kind: &str| {
            let mut v: Vec<String> = std::fs::read_dir(marks.join(kind))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            v.sort();
            v
        };
        let (ran, unmet) = (list("ran"), list("unmet"));
        std::fs::remove_dir_all(&marks).unwrap();
        assert_eq!(ran, ["a__met", "b"]);
        assert_eq!(unmet, ["a__unmet", "b_unmet"]);
    }

    /// A fresh directory under the temp dir (this crate has no tempfile dependency).
    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("ferry-netem-needs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        d
    }
}
