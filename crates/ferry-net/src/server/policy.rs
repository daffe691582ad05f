//! Declarative policies per path prefix (`[[policy]]` in `ferry serve --config`): how many
//! good replicas an object under the prefix should have and on which peers, how long it is
//! kept before it may be removed, renamed away or overwritten (retention), and which digest
//! algorithm registers it. Data, not a scripting engine: the longest matching prefix wins,
//! and an inconsistent set is refused when the server starts. The replication they ask for
//! is in `replicate`; docs/DESIGN.md, "Policies".

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_proto::ChecksumAlgo;

use crate::tls::Fingerprint;

/// Another server this one copies to when a policy wants replicas there (`[peers.NAME]`):
/// dialled as a client dials it, its key pinned, with a token that may write there.
#[derive(Clone)]
pub struct Peer {
    pub name: String,
    /// `host:port`.
    pub addr: String,
    pub fingerprint: Fingerprint,
    /// A token the peer takes, scoped for writing where the policies' prefixes are.
    pub token: String,
}

/// The token stays out of logs and debug output.
impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("name", &self.name)
            .field("addr", &self.addr)
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

/// One `[[policy]]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// A directory under the root, without a leading or trailing `/` (empty: the whole root).
    pub prefix: String,
    /// Good replicas wanted in all, this server's own included (1: no copy elsewhere).
    pub replicas: u32,
    /// The peers copies go to, by name, in the order they are tried.
    pub to: Vec<String>,
    /// How long an object is kept before it may be removed, renamed away or overwritten.
    pub retain: Option<Duration>,
    /// The digest algorithm files under the prefix are registered with.
    pub checksum: Option<ChecksumAlgo>,
}

/// Why a set of policies is refused at start.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("policy `{prefix}`: {why}")]
    BadPrefix { prefix: String, why: String },
    #[error("two policies for the prefix `{0}`: one prefix has one policy")]
    Duplicate(String),
    #[error("policy `{prefix}`: peer `{peer}` is not a [peers.{peer}] table")]
    UnknownPeer { prefix: String, peer: String },
    #[error(
        "policy `{prefix}`: replicas = {replicas}, but this server and its {peers} peer(s) in \
         `to` can hold at most {most}"
    )]
    TooMany {
        prefix: String,
        replicas: u32,
        peers: usize,
        most: usize,
    },
    #[error("policy `{0}`: replicas must be at least 1 (this server's own copy)")]
    NoReplicas(String),
    #[error("peer `{name}`: {why}")]
    BadPeer { name: String, why: String },
}

/// A server's policies and the peers they name; empty by default.
#[derive(Clone, Debug, Default)]
pub struct Policies {
    /// Longest prefix first, so the first match is the one that applies.
    list: Vec<Policy>,
    peers: BTreeMap<String, Peer>,
}

impl Policies {
    /// Checks `list` against `peers` and itself: every prefix a clean relative path (a
    /// trailing `/` allowed) and given once, every peer named in `to` defined, `replicas` at
    /// least 1 and at most this server plus its peers in `to`.
    pub fn new(peers: Vec<Peer>, list: Vec<Policy>) -> Result<Self, PolicyError> {
        let mut by_name = BTreeMap::new();
        for p in peers {
            if p.addr.is_empty() || !p.addr.contains(':') {
                return Err(PolicyError::BadPeer {
                    name: p.name,
                    why: format!("addr `{}` is not host:port", p.addr),
                });
            }
            if p.token.is_empty() {
                return Err(PolicyError::BadPeer {
                    name: p.name,
                    why: "its token file is empty".into(),
                });
            }
            by_name.insert(p.name.clone(), p);
        }
        let mut checked: Vec<Policy> = Vec::with_capacity(list.len());
        for mut p in list {
            let raw = p.prefix.clone();
            let bad = |why: &str| PolicyError::BadPrefix {
                prefix: raw.clone(),
                why: why.to_owned(),
            };
            let trimmed = raw.trim_start_matches('/').trim_end_matches('/');
            let clean = ferry_core::path::normalize_remote(trimmed)
                .map_err(|e| bad(&format!("not a path below the root: {e}")))?;
            if clean != trimmed {
                return Err(bad(
                    "not a clean path below the root (no `.`, `..` or `//`)",
                ));
            }
            p.prefix = clean;
            if checked.iter().any(|c| c.prefix == p.prefix) {
                return Err(PolicyError::Duplicate(raw));
            }
            if p.replicas == 0 {
                return Err(PolicyError::NoReplicas(raw));
            }
            for peer in &p.to {
                if !by_name.contains_key(peer) {
                    return Err(PolicyError::UnknownPeer {
                        prefix: raw,
                        peer: peer.clone(),
                    });
                }
            }
            let most = 1 + p.to.len();
            if p.replicas as usize > most {
                return Err(PolicyError::TooMany {
                    prefix: raw,
                    replicas: p.replicas,
                    peers: p.to.len(),
                    most,
                });
            }
            checked.push(p);
        }
        checked.sort_by_key(|p| std::cmp::Reverse(p.prefix.len()));
        Ok(Self {
            list: checked,
            peers: by_name,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The policy that applies to `path` (relative to the root): the longest prefix that is
    /// the path itself or a directory above it.
    pub fn for_path(&self, path: &str) -> Option<&Policy> {
        self.list.iter().find(|p| covers(&p.prefix, path))
    }

    /// Good replicas wanted for `path` in all (1 where no policy wants more).
    pub fn wanted(&self, path: &str) -> u32 {
        self.for_path(path).map_or(1, |p| p.replicas)
    }

    pub fn peer(&self, name: &str) -> Option<&Peer> {
        self.peers.get(name)
    }

    /// Whether any policy wants copies elsewhere (then the server runs its replicator).
    pub fn replicates(&self) -> bool {
        self.list.iter().any(|p| p.replicas > 1)
    }
}

/// Why a removal, rename or overwrite of `rel` (with `tree`, of everything under it too) is
/// refused by a retention policy, or `None`: an object the policy covers was registered less
/// than its `retain` ago. The policy of `rel` itself is measured on `rel` (or its tree); with
/// `tree`, a retaining policy further down is measured on its own prefix. Asks the catalog
/// only where a policy retains (a path index range each), never the file system.
pub(super) fn retention_refusal(
    policies: &Policies,
    catalog: &ferry_catalog::Catalog,
    rel: &str,
    tree: bool,
    now_ns: i64,
) -> Result<Option<String>, ferry_catalog::CatalogError> {
    let rel = rel.trim_matches('/');
    let own = policies.for_path(rel);
    let below = policies
        .list
        .iter()
        .filter(|p| tree && p.prefix != rel && covers(rel, &p.prefix));
    for (p, at, whole) in own
        .map(|p| (p, rel, tree))
        .into_iter()
        .chain(below.map(|p| (p, p.prefix.as_str(), true)))
    {
        let Some(retain) = p.retain else {
            continue;
        };
        let Some(newest) = catalog.newest_stored(at, whole)? else {
            continue;
        };
        let age = Duration::from_nanos(u64::try_from(now_ns.saturating_sub(newest)).unwrap_or(0));
        if age < retain {
            return Ok(Some(format!(
                "retained: the policy for /{} keeps what is stored there for {} (retain), and \
                 /{at} holds an object stored {} ago: it may be removed, renamed away or \
                 overwritten in {}",
                p.prefix,
                words(retain),
                words(age),
                words(retain - age),
            )));
        }
    }
    Ok(None)
}

/// A duration in its largest unit (`30d`, `2h`, `45s`).
fn words(d: Duration) -> String {
    // Rounded down to its largest unit: a retention's remainder need not be whole.
    match d.as_secs() {
        s if s >= 86_400 => format!("{}d", s / 86_400),
        s if s >= 3_600 => format!("{}h", s / 3_600),
        s if s >= 60 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// Whether the directory `prefix` is `path` or above it (the empty prefix is above all).
fn covers(prefix: &str, path: &str) -> bool {
    prefix.is_empty()
        || path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(name: &str) -> Peer {
        Peer {
            name: name.into(),
            addr: "127.0.0.1:7070".into(),
            fingerprint: Fingerprint([1; 32]),
            token: "t".into(),
        }
    }

    fn policy(prefix: &str, replicas: u32, to: &[&str]) -> Policy {
        Policy {
            prefix: prefix.into(),
            replicas,
            to: to.iter().map(|s| (*s).to_owned()).collect(),
            retain: None,
            checksum: None,
        }
    }

    #[test]
    fn the_longest_matching_prefix_wins() {
        let p = Policies::new(
            vec![peer("b"), peer("c")],
            vec![
                policy("raw/", 2, &["b"]),
                policy("raw/big", 3, &["b", "c"]),
                policy("", 1, &[]),
            ],
        )
        .unwrap();
        assert_eq!(p.wanted("raw/x"), 2);
        assert_eq!(p.wanted("raw/big/y"), 3);
        assert_eq!(p.wanted("raw/big"), 3);
        assert_eq!(
            p.wanted("raw/bigger"),
            2,
            "a prefix is a directory, not a string"
        );
        assert_eq!(p.wanted("rawx"), 1);
        assert_eq!(p.for_path("other").unwrap().prefix, "");
        assert!(p.replicates());
    }

    #[test]
    fn inconsistent_policies_are_refused() {
        let peers = || vec![peer("b")];
        let refused = |list| Policies::new(peers(), list).unwrap_err();
        assert!(matches!(
            refused(vec![policy("raw", 2, &["x"])]),
            PolicyError::UnknownPeer { peer, .. } if peer == "x"
        ));
        assert!(matches!(
            refused(vec![policy("raw", 3, &["b"])]),
            PolicyError::TooMany { most: 2, .. }
        ));
        assert!(matches!(
            refused(vec![policy("a/../b", 1, &[])]),
            PolicyError::BadPrefix { .. }
        ));
        assert!(matches!(
            refused(vec![policy("raw", 1, &[]), policy("/raw/", 2, &["b"])]),
            PolicyError::Duplicate(_)
        ));
        assert!(matches!(
            refused(vec![policy("raw", 0, &[])]),
            PolicyError::NoReplicas(_)
        ));
        let e = refused(vec![policy("raw", 3, &["b"])]).to_string();
        assert!(e.contains("replicas = 3") && e.contains("at most 2"), "{e}");
    }
}
