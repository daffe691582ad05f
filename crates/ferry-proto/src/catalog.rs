//! The catalog's frames (`CatalogRequest` 0x1E, `CatalogAnswer` 0x3D): what a user asks of a
//! server's catalog (`ferry stat`, `rm`, `mv`, `mkdir`, `meta`, `find`) and its answers. Their
//! own types, not the catalog crate's: the wire knows nothing of a database.

/// Longest metadata attribute, value and unit, in bytes (the catalog's own bounds).
pub const MAX_META_ATTR: usize = 256;
pub const MAX_META_VALUE: usize = 2048;
pub const MAX_META_UNIT: usize = 64;
/// Most metadata entries one object may carry (a server refuses one more), so that a `stat`
/// answer always fits a control frame.
pub const MAX_META_ENTRIES: usize = 128;
/// Most replicas a `stat` answer lists.
pub const MAX_REPLICAS: usize = 32;
/// Longest server name and physical path of a replica.
pub const MAX_SERVER_NAME: usize = 256;
pub const MAX_PHYSICAL: usize = 2 * crate::MAX_PATH;
/// Longest server address a replica carries (`host:port`).
pub const MAX_ADDRESS: usize = 256;
/// Longest reason a `stat` gives for a replication a policy still owes.
pub const MAX_POLICY_NOTE: usize = 1024;
/// Longest digest algorithm name (`blake3`, `sha256`, ...).
pub const MAX_ALGO: usize = 16;
/// Most conditions one find may combine.
pub const MAX_FIND_CONDITIONS: usize = 16;
/// Most objects one find answers with in all; past it the answer says `more`.
pub const MAX_FIND_LIMIT: u32 = 100_000;
/// Most objects one `CatalogAnswer::Found` frame carries: at the longest paths, 128 still fit
/// a control frame.
pub const MAX_FOUND_ENTRIES: usize = 128;
/// Most problem paths one `CatalogAnswer::Verified` frame carries (they fit a control frame
/// at the longest paths, as found objects do).
pub const MAX_VERIFY_PROBLEMS: usize = 128;
/// Most problem paths a whole verify answer lists; past it the counts still count them and
/// the last frame says `more`.
pub const MAX_VERIFY_LISTED: usize = 10_000;

/// One metadata entry: attribute, value and unit (empty when none), as iRODS's AVUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaEntry {
    pub attr: String,
    pub value: String,
    pub unit: String,
}

/// How a find condition compares an attribute's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Compare {
    /// The value equals the text given.
    Eq = 0,
    /// The value, as a number, is greater than the number given.
    Gt = 1,
    /// The value, as a number, is less than the number given.
    Lt = 2,
}

/// One metadata condition of a find. For `Gt` and `Lt` the value is a number as text; the
/// server refuses one that is not (`bad_request`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FindCondition {
    pub compare: Compare,
    pub attr: String,
    pub value: String,
}

/// What a find looks for; every part given must hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FindRequest {
    /// The server path to look under (its scope is checked like a listing's).
    pub under: String,
    pub conditions: Vec<FindCondition>,
    /// A glob over the object's name: `*` any run, `?` one character.
    pub name: Option<String>,
    /// Only objects whose mtime is later (ns since the epoch).
    pub newer_ns: Option<i64>,
    /// Only objects larger than this many bytes.
    pub larger: Option<u64>,
    /// At most this many objects, 1..=[`MAX_FIND_LIMIT`].
    pub limit: u32,
}

/// A request to a server's catalog (`Frame::CatalogRequest`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CatalogRequest {
    /// Everything the catalog knows of one object.
    Stat { path: String },
    /// As `Stat`, with each replica's server address (op 12): what `get` asks to choose a
    /// replica. A separate op, so that an older client's `Stat` is answered as before.
    Locate { path: String },
    /// Remove a file, a symlink or (with `recursive`) a tree, and forget it.
    Remove { path: String, recursive: bool },
    /// Rename a file or a tree, and its catalog entries with it.
    Rename { from: String, to: String },
    /// Make a directory (with `parents`, its missing parents too).
    Mkdir { path: String, parents: bool },
    /// Add a metadata entry to an object.
    MetaSet { path: String, entry: MetaEntry },
    /// Remove an attribute of an object (only the entry of `value` when given).
    MetaRm {
        path: String,
        attr: String,
        value: Option<String>,
    },
    /// List an object's metadata.
    MetaLs { path: String },
    /// Objects by metadata, name, age and size, answered from the catalog.
    Find(Box<FindRequest>),
    /// A fixity audit done by the server in place: every object registered at or under
    /// `path` re-read and re-hashed, this server's replica marked good or bad; with
    /// `recursive`, files on disk there that are not registered reported too.
    Verify { path: String, recursive: bool },
    /// `get --tar`: the tree at `path` (only `paths` below it, when given) streamed as a tar
    /// in `TarData` frames, each member's bytes checked against its registered digest.
    Tar { path: String, paths: Vec<String> },
    /// `ferry repl` between servers with catalogs of their own: record that `server` (another
    /// server's catalog name) holds a good copy of each object this server holds a good
    /// replica of at `path` (with `recursive`, under it too), at `physical` followed by the
    /// rest of the object's path.
    Replicated {
        path: String,
        recursive: bool,
        server: String,
        physical: String,
        /// Where `server` is reachable (`host:port`); empty when unknown. Sent as op 13 when
        /// given, so that an older server is asked op 11 as before.
        address: String,
        /// Where the copy is on `server` (under its root), when not at `path`: each object's
        /// replica there is at `at` followed by the rest of its path. Empty: at `path`. Sent
        /// as op 14 when given, only to a server with `Capabilities::REPLICA_PATH`.
        at: String,
    },
}

/// Most `paths` one `CatalogRequest::Tar` names (at the longest paths, they fit a control
/// frame).
pub const MAX_TAR_PATHS: usize = 128;

impl CatalogRequest {
    /// The operation's name, for logs and messages.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Stat { .. } | Self::Locate { .. } => "stat",
            Self::Remove { .. } => "rm",
            Self::Rename { .. } => "mv",
            Self::Mkdir { .. } => "mkdir",
            Self::MetaSet { .. } => "meta set",
            Self::MetaRm { .. } => "meta rm",
            Self::MetaLs { .. } => "meta ls",
            Self::Find(_) => "find",
            Self::Verify { .. } => "verify",
            Self::Tar { .. } => "get --tar",
            Self::Replicated { .. } => "repl",
        }
    }
}

/// A registered object, as `stat` and `find` show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatalogObject {
    /// Relative to the server's root.
    pub path: String,
    pub size: u64,
    pub mtime_ns: i64,
    pub digest: Vec<u8>,
    pub algo: String,
    /// The name of the token that stored it.
    pub stored_by: String,
    /// When it was registered, ns since the epoch.
    pub stored_at: i64,
}

/// A replica's health.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReplicaHealth {
    Good = 0,
    Stale = 1,
    Bad = 2,
}

impl ReplicaHealth {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Good => "good",
            Self::Stale => "stale",
            Self::Bad => "bad",
        }
    }
}

/// One copy of an object on one server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatalogReplica {
    pub server: String,
    pub physical: String,
    pub state: ReplicaHealth,
    /// Where its server is reachable (`host:port`); empty when unknown, and always in the
    /// answer to a `Stat` (only `Locate` asks for addresses).
    pub address: String,
    /// Its path on its server (under that root), when a `repl` put it elsewhere than the
    /// object's path; empty: at the object's path (and always so for a client without
    /// `Capabilities::REPLICA_PATH`).
    pub path: String,
}

impl CatalogReplica {
    /// Where a client asks its server for it: its own path, else `object_path`.
    pub fn path_or<'a>(&'a self, object_path: &'a str) -> &'a str {
        match self.path.is_empty() {
            true => object_path,
            false => &self.path,
        }
    }
}

/// An object with its replicas and metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatalogStat {
    pub object: CatalogObject,
    pub replicas: Vec<CatalogReplica>,
    pub metadata: Vec<MetaEntry>,
    /// The server's policy for the object's path, sent only to a client that offered
    /// `Capabilities::CATALOG_POLICY` (an older one would refuse the trailing bytes).
    pub policy: Option<CatalogPolicy>,
}

/// The `[[policy]]` of a server's config that applies to an object: what it wants, and what
/// it still owes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatalogPolicy {
    /// The policy's prefix, a directory under the root (empty: the whole root).
    pub prefix: String,
    /// Good replicas wanted in all, the server's own included.
    pub replicas: u32,
    /// Seconds an object is kept before it may be removed, renamed away or overwritten; 0:
    /// no retention.
    pub retain_s: u64,
    /// The digest algorithm the policy registers files with; empty: the client's choice.
    pub checksum: String,
    /// A replication still owed, if any.
    pub owed: Option<PolicyOwed>,
}

/// A replication a policy still owes for an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyOwed {
    /// Tries that failed so far.
    pub tries: u32,
    /// Milliseconds until the next try (0: due now).
    pub next_in_ms: u64,
    /// Why the last try failed (empty before the first), at most [`MAX_POLICY_NOTE`] bytes.
    pub note: String,
}

/// What is wrong with a path a verify found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Problem {
    /// Registered, and its size or digest is not the registered one.
    Bad = 0,
    /// Registered, and no regular file is there.
    Missing = 1,
    /// A regular file on disk that the catalog does not know (only with `recursive`).
    Unregistered = 2,
}

impl Problem {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bad => "bad",
            Self::Missing => "missing",
            Self::Unregistered => "unregistered",
        }
    }
}

/// A verify's counts so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VerifyCounts {
    /// Registered objects looked at.
    pub checked: u64,
    pub good: u64,
    pub bad: u64,
    pub missing: u64,
    pub unregistered: u64,
    /// File bytes read and hashed.
    pub bytes: u64,
}

/// Part of a verify's answer: the counts so far, and the problem paths found since the frame
/// before (relative to the server's root, in the order found). `last`: no `Verified` follows,
/// its counts are the verify's; `more` (only with `last`): past [`MAX_VERIFY_LISTED`] paths,
/// some problems were counted and not listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyReport {
    pub counts: VerifyCounts,
    pub problems: Vec<(Problem, String)>,
    pub last: bool,
    pub more: bool,
}

/// A server's answer to a `CatalogRequest` (`Frame::CatalogAnswer`); a refusal is an `Error`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CatalogAnswer {
    /// A change was made: file-system entries removed, moved or made, and catalog entries
    /// (objects or metadata entries) changed.
    Done {
        entries: u64,
        objects: u64,
    },
    Stat(Box<CatalogStat>),
    /// An object's metadata, by attribute then value.
    Meta {
        entries: Vec<MetaEntry>,
    },
    /// Part of a find's answer, in path order. `last`: no `Found` follows; `more` (only with
    /// `last`): the limit was reached and more objects match.
    Found {
        objects: Vec<CatalogObject>,
        last: bool,
        more: bool,
    },
    /// Part of a verify's answer; a long verify sends one at least every few seconds, so the
    /// control connection is never idle.
    Verified(Box<VerifyReport>),
}
