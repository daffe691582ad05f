//! Relative paths as they travel on the wire.
//!
//! Every path a peer sends is checked here before it reaches the file system: it must be
//! relative, `/`-separated, free of `.`/`..`/empty components and NUL bytes. This is the first
//! line of defence; the second is that every open resolves beneath a directory fd
//! (`RESOLVE_BENEATH`), so even a path that passed here cannot climb out through a symlink.

use crate::error::PathError;

/// Longest path accepted, matching the wire limit.
pub const MAX_PATH: usize = ferry_proto::MAX_PATH;

/// Longest single component, in bytes (Linux `NAME_MAX`). Checked here rather than left to
/// `ENAMETOOLONG` so that the refusal names the path and the limit, and comes before any
/// directory on the way has been created.
pub const MAX_NAME: usize = 255;

/// Checks a peer-supplied relative path. The empty string means "the base itself".
pub fn validate_rel(path: &str) -> Result<(), PathError> {
    if path.len() > MAX_PATH {
        return Err(PathError::TooLong(path.len()));
    }
    if path.is_empty() {
        return Ok(());
    }
    if path.contains('\0') {
        return Err(PathError::Nul);
    }
    if path.starts_with('/') {
        return Err(PathError::Absolute(path.to_owned()));
    }
    for comp in path.split('/') {
        match comp {
            "" => return Err(PathError::EmptyComponent(path.to_owned())),
            "." | ".." => return Err(PathError::DotComponent(path.to_owned())),
            c if c.len() > MAX_NAME => {
                return Err(PathError::NameTooLong {
                    path: path.to_owned(),
                    len: c.len(),
                    max: MAX_NAME,
                })
            }
            _ => {}
        }
    }
    Ok(())
}

/// Normalises a user-supplied path on a server (`/incoming/run42/`, `incoming`, `/`) into a
/// relative path under the server root, refusing `..` rather than resolving it.
pub fn normalize_remote(path: &str) -> Result<String, PathError> {
    let joined: Vec<&str> = path
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    let rel = joined.join("/");
    validate_rel(&rel)?;
    Ok(rel)
}

/// Joins two relative paths, either of which may be empty.
pub fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_owned(),
        (_, true) => a.to_owned(),
        _ => format!("{a}/{b}"),
    }
}

/// Splits `a/b/c` into (`a/b`, `c`); a single component has an empty parent.
pub fn split_parent(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => ("", path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_escapes() {
        for bad in [
            "/etc/passwd",
            "..",
            "../x",
            "a/../../x",
            "a//b",
            "a/./b",
            "a/",
            "a\0b",
            "./a",
            &"n".repeat(MAX_NAME + 1),
            &format!("a/{}/b", "n".repeat(MAX_NAME + 1)),
        ] {
            assert!(validate_rel(bad).is_err(), "{bad:?} accepted");
        }
        for good in [
            "",
            "a",
            "a/b",
            "with space/ünïcode",
            "a/..b",
            "...",
            "new\nline",
            "q'\"uote",
            &"n".repeat(MAX_NAME),
        ] {
            assert!(validate_rel(good).is_ok(), "{good:?} refused");
        }
    }

    #[test]
    fn normalizes_user_paths() {
        assert_eq!(
            normalize_remote("/incoming/run42/").unwrap(),
            "incoming/run42"
        );
        assert_eq!(normalize_remote("/").unwrap(), "");
        assert_eq!(normalize_remote("./a//b").unwrap(), "a/b");
        assert!(normalize_remote("/a/../../etc").is_err());
    }

    #[test]
    fn splits() {
        assert_eq!(split_parent("a/b/c"), ("a/b", "c"));
        assert_eq!(split_parent("c"), ("", "c"));
        assert_eq!(join("", "x"), "x");
        assert_eq!(join("a", "x"), "a/x");
    }
}
