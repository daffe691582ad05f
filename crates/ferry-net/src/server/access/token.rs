//! Tokens and what each may touch: parsing the stored entries, path scopes, and checking a
//! token against the list. No file I/O here (that is `store`).

use std::path::PathBuf;

use ferry_core::path;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("token `{0}` already exists (revoke it first, or pick another name)")]
    Exists(String),
    #[error("no token named `{0}`")]
    NoSuchToken(String),
    #[error("{0}")]
    Invalid(String),
}

/// One token as stored: its name, the hash of its secret, and its scope.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    pub name: String,
    /// Lower-case hex SHA-256 of the token.
    pub sha256: String,
    #[serde(default = "everything")]
    pub read: Vec<String>,
    #[serde(default = "everything")]
    pub write: Vec<String>,
    #[serde(default)]
    pub read_only: bool,
}

pub(super) fn everything() -> Vec<String> {
    vec!["/".into()]
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenFile {
    #[serde(default, rename = "token")]
    pub tokens: Vec<TokenEntry>,
}

/// What an authenticated client may touch: normalised prefixes, relative to the root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub name: String,
    read: Vec<String>,
    write: Vec<String>,
    /// A third-party grant's one destination: the only path a put may name.
    dest: Option<String>,
    /// A third-party grant's policy for existing files: what its client asked, never more.
    existing: Option<ferry_proto::ExistingPolicy>,
    /// A stripe grant: good for one stripe session into `dest` (a striped copy's stripe
    /// host), never for a put; with `reads`, one stripe read session of `dest`.
    stripe: bool,
    /// A read grant: `dest` is the one path a get (or, with `stripe`, a stripe read session)
    /// may read, for a pulled copy's destination.
    reads: bool,
}

impl Grant {
    /// A token that may read and write everything under the root.
    pub fn full(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            read: vec![String::new()],
            write: vec![String::new()],
            dest: None,
            existing: None,
            stripe: false,
            reads: false,
        }
    }

    /// What a third-party grant minted by this token for `dest` allows: a put into exactly
    /// `dest` (normalised, covered by one of this token's write prefixes) with `existing` as
    /// its policy for files already there; no reads, no listings, no probes, no further
    /// grants (`None` when this is itself a grant). It keeps the token's name.
    pub fn third_party(&self, dest: &str, existing: ferry_proto::ExistingPolicy) -> Option<Self> {
        if self.dest.is_some() {
            return None;
        }
        let prefix = self.write_scope(dest)?;
        Some(Self {
            name: self.name.clone(),
            read: Vec::new(),
            write: vec![prefix.to_owned()],
            dest: Some(dest.to_owned()),
            existing: Some(existing),
            stripe: false,
            reads: false,
        })
    }

    /// What a stripe grant minted by this token for `dest` allows: one stripe session at a
    /// time (`StripeRequest`) writing blocks into the partial copies beneath exactly `dest`
    /// (covered by one of this token's write scopes) that another server opened; no put, no
    /// reads, no further grants (`None` when this is itself a grant).
    pub fn stripe_grant(&self, dest: &str) -> Option<Self> {
        let mut g = self.third_party(dest, ferry_proto::ExistingPolicy::Fail)?;
        g.existing = None;
        g.stripe = true;
        Some(g)
    }

    /// What a read grant minted by this token for `src` allows: one get at a time of exactly
    /// `src` (normalised, covered by one of this token's read scopes), confined beneath that
    /// scope as the token's own get would be; no writes, no listings, no probes, no further
    /// grants (`None` when this is itself a grant). `stripe`: one stripe read session
    /// (`StripeRead`) of `src` instead, a pulled copy's source's other hosts.
    pub fn read_grant(&self, src: &str, stripe: bool) -> Option<Self> {
        if self.dest.is_some() {
            return None;
        }
        let prefix = self.read_scope(src)?;
        Some(Self {
            name: self.name.clone(),
            read: vec![prefix.to_owned()],
            write: Vec::new(),
            dest: Some(src.to_owned()),
            existing: None,
            stripe,
            reads: true,
        })
    }

    /// Whether this is a stripe grant, good for a stripe session only.
    pub fn stripe_only(&self) -> bool {
        self.stripe
    }

    /// Whether this is a read grant (see [`Grant::read_grant`]).
    pub fn reads_only(&self) -> bool {
        self.reads
    }

    /// Whether a grant minted by `owner` is still within what `owner` allows now (its token
    /// may have lost the scope since).
    pub fn still_covered_by(&self, owner: &Grant) -> bool {
        match (self.dest.as_deref(), self.reads) {
            (Some(path), true) => owner.may_read(path),
            (Some(path), false) => owner.may_write(path),
            (None, _) => false,
        }
    }

    /// The one destination of a third-party grant.
    pub fn pinned_dest(&self) -> Option<&str> {
        self.dest.as_deref()
    }

    /// A third-party grant's policy for existing files.
    pub fn pinned_existing(&self) -> Option<ferry_proto::ExistingPolicy> {
        self.existing
    }

    pub(super) fn from_entry(e: &TokenEntry) -> Result<Self, AccessError> {
        let norm = |v: &[String]| -> Result<Vec<String>, AccessError> {
            v.iter()
                .map(|p| {
                    path::normalize_remote(p).map_err(|err| {
                        AccessError::Invalid(format!("token `{}`: prefix `{p}`: {err}", e.name))
                    })
                })
                .collect()
        };
        Ok(Self {
            name: e.name.clone(),
            read: norm(&e.read)?,
            write: if e.read_only {
                Vec::new()
            } else {
                norm(&e.write)?
            },
            dest: None,
            existing: None,
            stripe: false,
            reads: false,
        })
    }

    /// `rel` is a normalised path (no leading `/`, no `..`).
    pub fn may_read(&self, rel: &str) -> bool {
        self.read_scope(rel).is_some()
    }

    /// Whether any read scope is granted (what a network probe needs: it touches no path).
    pub fn may_read_something(&self) -> bool {
        // A read grant reads its one path with one get, nothing else.
        self.dest.is_none() && !self.read.is_empty()
    }

    pub fn may_write(&self, rel: &str) -> bool {
        self.write_scope(rel).is_some()
    }

    /// The read prefix that covers `rel` (the widest, when several do): the directory its
    /// operation is confined beneath.
    pub fn read_scope(&self, rel: &str) -> Option<&str> {
        if self.dest.as_deref().is_some_and(|d| d != rel) {
            return None;
        }
        widest(&self.read, rel)
    }

    /// The write prefix that covers `rel` (the widest, when several do).
    pub fn write_scope(&self, rel: &str) -> Option<&str> {
        if self.dest.as_deref().is_some_and(|d| d != rel) {
            return None;
        }
        widest(&self.write, rel)
    }
}

fn widest<'a>(prefixes: &'a [String], rel: &str) -> Option<&'a str> {
    prefixes
        .iter()
        .filter(|p| under(rel, p))
        .min_by_key(|p| p.len())
        .map(String::as_str)
}

/// `rel` (covered by `prefix`) as a path inside `prefix`.
pub fn inside<'a>(rel: &'a str, prefix: &str) -> &'a str {
    if prefix.is_empty() {
        rel
    } else {
        rel[prefix.len()..].trim_start_matches('/')
    }
}

/// Whether `rel` is `prefix` or inside it, by whole path components (`/data2` is not in `/data`).
fn under(rel: &str, prefix: &str) -> bool {
    prefix.is_empty()
        || rel == prefix
        || (rel.len() > prefix.len()
            && rel.starts_with(prefix)
            && rel.as_bytes()[prefix.len()] == b'/')
}

pub fn hash_token(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A parsed token list, ready to check logins against.
#[derive(Clone, Debug, Default)]
pub struct AccessList {
    entries: Vec<([u8; 32], Grant)>,
}

impl AccessList {
    /// One full-access token, kept in memory (tests, `serve --oneshot`, `--token-file`).
    pub fn single(name: &str, token: &str) -> Self {
        Self {
            entries: vec![(hash_token(token), Grant::full(name))],
        }
    }

    pub fn from_file(file: &TokenFile) -> Result<Self, AccessError> {
        let mut entries = Vec::with_capacity(file.tokens.len());
        for e in &file.tokens {
            let hash = ferry_core::digest::unhex32(&e.sha256).ok_or_else(|| {
                AccessError::Invalid(format!("token `{}`: sha256 must be 64 hex digits", e.name))
            })?;
            entries.push((hash, Grant::from_entry(e)?));
        }
        Ok(Self { entries })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The grant of the token, comparing against every entry in constant time so the time
    /// taken says nothing about which entry (or how much of one) matched.
    /// The scopes of the token named `name`, if it is still in the list (a grant minted by
    /// a token revoked since is refused with it).
    pub fn named(&self, name: &str) -> Option<&Grant> {
        self.entries.iter().map(|(_, g)| g).find(|g| g.name == name)
    }

    pub fn authenticate(&self, token: &str) -> Option<Grant> {
        let h = hash_token(token);
        let mut found = None;
        for (hash, grant) in &self.entries {
            if bool::from(hash.ct_eq(&h)) && found.is_none() {
                found = Some(grant.clone());
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_whole_components() {
        assert!(under("data/x", "data"));
        assert!(under("data", "data"));
        assert!(!under("data2/x", "data"));
        assert!(!under("dat", "data"));
        assert!(under("anything", ""));
    }

    #[test]
    fn scopes_and_read_only() {
        let e = TokenEntry {
            name: "a".into(),
            sha256: "0".repeat(64),
            read: vec!["/pub".into(), "shared/".into()],
            write: vec!["/incoming".into()],
            read_only: false,
        };
        let g = Grant::from_entry(&e).unwrap();
        assert!(g.may_read("pub/x") && g.may_read("shared/y/z") && !g.may_read("incoming"));
        assert!(g.may_write("incoming/run1") && !g.may_write("pub/x"));
        let ro = Grant::from_entry(&TokenEntry {
            read_only: true,
            ..e.clone()
        })
        .unwrap();
        assert!(!ro.may_write("incoming/run1") && ro.may_read("pub/x"));
        let bad = TokenEntry {
            read: vec!["../etc".into()],
            ..e
        };
        assert!(Grant::from_entry(&bad).is_err());
    }
}
