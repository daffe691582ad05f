//! Where a job reads or writes: a path on the service's own host, or `HOST[:PORT]:PATH` on a
//! ferry server (the CLI's syntax, `[V6]:PORT:PATH` for IPv6; no `USER@HOST`, the service
//! starts no ssh sessions).

use std::path::{Component, Path, PathBuf};

use crate::error::ServiceError;

/// ferry's port when a remote names none.
pub const DEFAULT_PORT: u16 = 7070;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// A path below the service's local root (`--local-root`), `/`-separated, no `..`.
    Local(String),
    /// `server` is `host:port` (`[v6]:port`), `path` as the server reads it.
    Remote { server: String, path: String },
}

impl Location {
    /// Reads what a user typed: a remote when it looks like `HOST:...` (as `ferry put` decides),
    /// else a local path.
    pub fn parse(s: &str) -> Result<Self, ServiceError> {
        let bad = |m: String| Err(ServiceError::Invalid(m));
        let looks_remote = !(s.starts_with('/') || s.starts_with("./") || s.starts_with("../"))
            && (s.starts_with('[')
                || s.split_once(':')
                    .is_some_and(|(h, _)| !h.is_empty() && !h.contains('/')));
        if !looks_remote {
            return Ok(Location::Local(local_rel(s)?));
        }
        let (host, rest) = if let Some(v6) = s.strip_prefix('[') {
            match v6.split_once("]:") {
                Some((h, rest)) => (format!("[{h}]"), rest),
                None => return bad(format!("`{s}`: expected [V6]:PORT:PATH")),
            }
        } else {
            let (h, rest) = s.split_once(':').unwrap_or((s, ""));
            (h.to_owned(), rest)
        };
        if host.contains('@') {
            return bad(format!(
                "`{s}`: the service starts no ssh sessions; name a `ferry serve` as HOST[:PORT]:PATH"
            ));
        }
        let is_port = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
        let (port, path) = match rest.split_once(':') {
            Some((p, path)) if is_port(p) => match p.parse::<u16>() {
                Ok(port) => (port, path),
                Err(_) => return bad(format!("`{s}`: port {p} is out of range")),
            },
            None if is_port(rest) => return bad(format!("`{s}` has no path (HOST:PORT:PATH)")),
            _ => (DEFAULT_PORT, rest),
        };
        Ok(Location::Remote {
            server: format!("{host}:{port}"),
            path: if path.is_empty() {
                "/".into()
            } else {
                path.into()
            },
        })
    }

    pub fn server(&self) -> Option<&str> {
        match self {
            Location::Remote { server, .. } => Some(server),
            Location::Local(_) => None,
        }
    }
}

/// A local path as a `/`-separated path below the local root: leading `/` and `.` dropped,
/// `..` refused (a job may not leave the root by naming it).
fn local_rel(s: &str) -> Result<String, ServiceError> {
    let mut parts = Vec::new();
    for c in Path::new(s).components() {
        match c {
            Component::Normal(p) => match p.to_str() {
                Some(p) => parts.push(p),
                None => return Err(ServiceError::Invalid(format!("`{s}`: not UTF-8"))),
            },
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(ServiceError::Invalid(format!(
                    "`{s}`: `..` is not allowed in a local path (paths are below the service's \
                     local root)"
                )))
            }
        }
    }
    Ok(parts.join("/"))
}

/// `rel` below `root`, on the file system.
pub fn under(root: &Path, rel: &str) -> PathBuf {
    if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(rel)
    }
}

/// The last component of a `/`-separated path: a source's name at its destination.
pub fn name_of(path: &str) -> &str {
    let p = path.trim_end_matches('/');
    p.rsplit('/').next().unwrap_or(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(server: &str, path: &str) -> Location {
        Location::Remote {
            server: server.into(),
            path: path.into(),
        }
    }

    #[test]
    fn remotes_and_local_paths_read_as_the_cli_reads_them() {
        let p = |s| Location::parse(s).unwrap();
        assert_eq!(p("dtn1:/data"), remote("dtn1:7070", "/data"));
        assert_eq!(p("dtn1:7071:/data"), remote("dtn1:7071", "/data"));
        assert_eq!(p("[::1]:7071:/x"), remote("[::1]:7071", "/x"));
        assert_eq!(p("dtn1:"), remote("dtn1:7070", "/"));
        assert_eq!(p("/srv/run42"), Location::Local("srv/run42".into()));
        assert_eq!(p("./a/./b"), Location::Local("a/b".into()));
        assert_eq!(p("/"), Location::Local(String::new()));
    }

    #[test]
    fn what_the_service_cannot_do_is_refused_with_why() {
        let e = |s| Location::parse(s).unwrap_err().to_string();
        assert!(e("/a/../../etc").contains("`..`"));
        assert!(e("me@dtn1:/x").contains("ssh"));
        assert!(e("dtn1:7070").contains("no path"));
        assert!(e("dtn1:99999:/x").contains("out of range"));
        assert!(e("[::1/x").contains("[V6]"));
    }

    #[test]
    fn names_are_the_last_component() {
        assert_eq!(name_of("/a/b/"), "b");
        assert_eq!(name_of("c"), "c");
    }
}
