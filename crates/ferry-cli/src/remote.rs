//! A remote location as the user types it: `HOST[:PORT]:PATH`, `[V6]:PORT:PATH`, or
//! `USER@HOST:PATH` for a session started over ssh; and a bare server, `HOST[:PORT]`.

use anyhow::{bail, Context, Result};

pub const DEFAULT_PORT: u16 = 7070;

/// A usage error with advice (`Hinted`): `main` prints the hint on its own line.
fn hinted(error: String, hint: String) -> anyhow::Error {
    anyhow::Error::new(crate::error::Hinted {
        error: anyhow::anyhow!(error),
        hint,
    })
}

/// A remote location `HOST[:PORT]:PATH`; IPv6 hosts in brackets: `[::1]:7070:/data`.
/// `USER@HOST:PATH` means a session started over ssh (no port: ssh's own config decides).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    pub host: String,
    pub port: u16,
    pub path: String,
    /// Set for `USER@HOST:PATH`.
    pub ssh_user: Option<String>,
}

impl Remote {
    pub fn parse(s: &str) -> Result<Self> {
        let (host, rest) = if let Some(stripped) = s.strip_prefix('[') {
            let (h, rest) = stripped
                .split_once(']')
                .with_context(|| format!("`{s}`: missing `]` after IPv6 host"))?;
            (
                h.to_owned(),
                rest.strip_prefix(':')
                    .with_context(|| format!("`{s}`: expected `:PATH` after the host"))?,
            )
        } else {
            let (h, rest) = s
                .split_once(':')
                .with_context(|| format!("`{s}` is not a remote (expected HOST[:PORT]:PATH)"))?;
            (h.to_owned(), rest)
        };
        if host.is_empty() {
            bail!("`{s}`: empty host (expected HOST[:PORT]:PATH)");
        }
        if let Some((user, h)) = host.rsplit_once('@') {
            if user.is_empty() || h.is_empty() {
                bail!("`{s}`: expected USER@HOST:PATH");
            }
            return Ok(Self {
                host: h.to_owned(),
                port: DEFAULT_PORT,
                path: rest.to_owned(),
                ssh_user: Some(user.to_owned()),
            });
        }
        let shown = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.clone()
        };
        let is_port = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
        let (port, path) = match rest.split_once(':') {
            Some((p, path)) if is_port(p) => (
                p.parse()
                    .with_context(|| format!("`{s}`: port {p} is out of range"))?,
                path,
            ),
            // `HOST:WORD:/PATH`: WORD stands where a port goes, and a path rarely begins
            // with `WORD:/`; taking it as one would send to port 7070 what was meant elsewhere.
            Some((p, path)) if path.starts_with('/') && !p.contains('/') => {
                return Err(hinted(
                    format!("`{s}`: `{p}` is not a port"),
                    format!("did you mean {shown}:{path} (port {DEFAULT_PORT}) or {shown}:PORT:{path} ?"),
                ));
            }
            // `HOST:PORT` with no path: read as the path `PORT` on port 7070, it would send to
            // the wrong place (or retry a closed port).
            None if is_port(rest) => {
                return Err(hinted(
                    format!("`{s}` has no path"),
                    format!("did you mean {shown}:{rest}:/ ?"),
                ));
            }
            _ => (DEFAULT_PORT, rest),
        };
        Ok(Self {
            host,
            port,
            path: if path.is_empty() {
                "/".into()
            } else {
                path.to_owned()
            },
            ssh_user: None,
        })
    }

    /// `user@host` for ssh.
    pub fn ssh_target(&self) -> Option<String> {
        self.ssh_user.as_ref().map(|u| format!("{u}@{}", self.host))
    }

    /// Whether a command-line word names a remote rather than a local path.
    pub fn looks_remote(s: &str) -> bool {
        if s.starts_with('/') || s.starts_with("./") || s.starts_with("../") {
            return false;
        }
        s.starts_with('[')
            || s.split_once(':')
                .is_some_and(|(h, _)| !h.is_empty() && !h.contains('/'))
    }

    /// A server without a path: `HOST`, `HOST:PORT`, `[V6]` or `[V6]:PORT`.
    pub fn parse_endpoint(s: &str) -> Result<Self> {
        let (host, port) = if let Some(stripped) = s.strip_prefix('[') {
            let (h, rest) = stripped
                .split_once(']')
                .with_context(|| format!("`{s}`: missing `]` after IPv6 host"))?;
            match rest {
                "" => (h, None),
                r => (
                    h,
                    Some(
                        r.strip_prefix(':')
                            .with_context(|| format!("`{s}`: expected `:PORT` after the host"))?,
                    ),
                ),
            }
        } else {
            match s.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (s, None),
            }
        };
        if host.is_empty() || host.contains('@') || host.contains('/') {
            bail!("`{s}` is not a server (expected HOST[:PORT])");
        }
        let port = match port {
            None => DEFAULT_PORT,
            Some(p) => p
                .parse()
                .with_context(|| format!("`{s}`: `{p}` is not a port (expected HOST[:PORT])"))?,
        };
        Ok(Self {
            host: host.to_owned(),
            port,
            path: "/".into(),
            ssh_user: None,
        })
    }

    pub fn server(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remotes() {
        let r = Remote::parse("dtn2:/incoming/").unwrap();
        assert_eq!(
            (r.host.as_str(), r.port, r.path.as_str()),
            ("dtn2", 7070, "/incoming/")
        );
        let r = Remote::parse("dtn2:7071:/x").unwrap();
        assert_eq!((r.port, r.path.as_str()), (7071, "/x"));
        let r = Remote::parse("[::1]:9000:/d").unwrap();
        assert_eq!(
            (r.host.as_str(), r.port, r.server()),
            ("::1", 9000, "[::1]:9000".to_string())
        );
        assert!(Remote::parse("nocolon").is_err());
        // A port with no path, or a word where the port goes: refused, with the likely meaning.
        let hint = |s: &str| {
            let e = Remote::parse(s).unwrap_err();
            e.downcast_ref::<crate::error::Hinted>()
                .map(|h| h.hint.clone())
                .unwrap_or_else(|| panic!("{s}: no hint in {e:#}"))
        };
        assert_eq!(hint("127.0.0.1:7171"), "did you mean 127.0.0.1:7171:/ ?");
        assert_eq!(hint("[::1]:7171"), "did you mean [::1]:7171:/ ?");
        assert!(hint("dtn2:notaport:/x").starts_with("did you mean dtn2:/x "));
        assert!(hint("dtn2::/x").starts_with("did you mean dtn2:/x "));
        // Still paths: a name with a colon, a relative path, ssh's USER@HOST:PATH.
        assert_eq!(Remote::parse("dtn2:a:b").unwrap().path, "a:b");
        assert_eq!(Remote::parse("dtn2:7171:").unwrap().path, "/");
        assert_eq!(Remote::parse("dtn2:run42").unwrap().path, "run42");
        assert_eq!(Remote::parse("al@dtn2:7171").unwrap().path, "7171");
        let r = Remote::parse("alice@dtn2:data/run1").unwrap();
        assert_eq!(
            (r.ssh_target().unwrap().as_str(), r.path.as_str()),
            ("alice@dtn2", "data/run1")
        );
        let r = Remote::parse("alice@dtn2:/abs").unwrap();
        assert_eq!(r.path, "/abs");
        assert!(Remote::parse("@dtn2:/x").is_err());
        assert!(Remote::looks_remote("alice@dtn2:/x"));
        assert!(Remote::looks_remote("host:/p"));
        assert!(!Remote::looks_remote("./a:b"));
        assert!(!Remote::looks_remote("/abs/path"));
        assert!(!Remote::looks_remote("plain"));
    }

    #[test]
    fn endpoints() {
        let e = |s: &str| Remote::parse_endpoint(s).map(|r| r.server());
        assert_eq!(e("dtn2").unwrap(), "dtn2:7070");
        assert_eq!(e("dtn2:7071").unwrap(), "dtn2:7071");
        assert_eq!(e("[::1]:9000").unwrap(), "[::1]:9000");
        assert_eq!(e("[::1]").unwrap(), "[::1]:7070");
        assert!(e("dtn2:/data").is_err());
        assert!(e("alice@dtn2").is_err());
        assert!(e(":7070").is_err());
        assert!(e("dtn2:99999").is_err());
    }
}
