//! What a receiver keeps of what a peer sends: which symlinks it makes and which permission
//! bits it stores.

use crate::path::split_parent;

/// Which symlinks a receiver makes. A link is stored as its target string and never followed
/// by ferry out of its root, but a program that later reads the tree follows it: a `get` from
/// an untrusted server can plant `x -> /etc/passwd`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Links {
    /// Every link is made as sent (the default, like `cp -r` and `rsync -l`).
    #[default]
    Any,
    /// A link whose target is absolute or climbs out of the transfer's top entry is refused
    /// (`--safe-links`).
    InTree,
    /// A link whose target is absolute or climbs out of the directory the entries land in
    /// is refused: a third-party grant's put inside the granted directory, whose top entries
    /// are all below it.
    Below,
}

impl Links {
    /// Whether a link at wire path `path` pointing at `target` is made.
    pub fn allows(self, path: &str, target: &str) -> bool {
        match self {
            Links::Any => true,
            Links::InTree => stays_in_tree(path, target),
            // The same walk with the directory itself as the top entry.
            Links::Below => stays_in_tree(&format!("dir/{path}"), target),
        }
    }
}

/// Whether `target`, read from the directory of the link at `path` (a wire path whose first
/// component is the transfer's top entry), stays inside that top entry.
pub fn stays_in_tree(path: &str, target: &str) -> bool {
    if target.starts_with('/') {
        return false;
    }
    let parent = split_parent(path).0;
    let mut depth = parent.split('/').filter(|c| !c.is_empty()).count() as i64 - 1;
    if depth < 0 {
        // A link at the top is the whole transfer: any relative target is beside it.
        return false;
    }
    for c in target.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            _ => depth += 1,
        }
    }
    true
}

/// Which of a sender's permission bits a receiver stores. A peer chooses the modes of what it
/// sends; the receiving host's owner chooses whether setuid, setgid and world-writable bits
/// survive, as `cp` keeps them only with `--preserve`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Modes {
    /// Setuid, setgid and the world-writable bit are cleared (the default).
    #[default]
    Safe,
    /// Every permission bit is kept as sent.
    Keep,
}

impl Modes {
    pub fn apply(self, mode: u32) -> u32 {
        match self {
            Modes::Safe => mode & 0o7777 & !0o6002,
            Modes::Keep => mode & 0o7777,
        }
    }
}
