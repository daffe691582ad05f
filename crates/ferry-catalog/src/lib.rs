//! ferry's catalog: every object a server stores, registered with its size, mtime, digest and
//! replicas, plus user metadata that can be queried (issue 39).
//!
//! One schema with versioned migrations ([`schema`]), on an embedded SQLite file or a
//! PostgreSQL database that several servers share, behind the same [`Catalog`] API ([`Location`]
//! says which; `db` is the seam, `pg` the one place the dialects differ). Every value reaches
//! the database as a bound parameter: the only SQL text is fixed fragments in this crate.
//!
//! Crash safety: a server writes an intent ([`Catalog::intend`], or
//! [`Catalog::intend_unsynced`] when the batch's own `syncfs` makes it durable) before it
//! renames a batch of files into place and registers them after ([`Catalog::register`], or
//! [`Catalog::register_later`] off its path); at its next start [`Catalog::reconcile`]
//! settles whatever intents a crash left, looking only at those files. A server on a PostgreSQL
//! catalog keeps its intents in a SQLite file of its own state directory
//! ([`Catalog::open_with_local_intents`]): only it reconciles them, and there they cost its
//! put neither a round trip to the database nor a commit of their own.

mod audit;
mod db;
mod error;
mod find;
mod later;
mod owed;
mod pg;
mod schema;
pub mod sql;
mod store;

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

pub use error::CatalogError;
pub use find::{glob_match, Condition, Query};
pub use later::OnError;
pub use owed::{Owed, Wanted};
pub use pg::PgUrl;
pub use schema::{run_migrations, MAX_ADDRESS, MAX_ATTR, MAX_PATH, MAX_UNIT, MAX_VALUE};
pub use store::Catalog;

/// Where a catalog lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// An embedded SQLite file (the default: `<state dir>/catalog.sqlite`).
    Sqlite(PathBuf),
    /// A private in-memory SQLite database, for tests.
    Memory,
    /// A PostgreSQL database that several servers share.
    Postgres(PgUrl),
}

impl Location {
    /// Reads a `--catalog` argument: a PostgreSQL location (`postgres://…`, `postgresql://…`
    /// or `host=… dbname=…` words) or a SQLite file path; another URL scheme is refused.
    pub fn parse(s: &str) -> Result<Self, CatalogError> {
        if s.is_empty() {
            return Err(CatalogError::Empty("catalog location"));
        }
        if PgUrl::is_one(s) {
            return Ok(Self::Postgres(PgUrl::parse(s)?));
        }
        if s.contains("://") {
            return Err(CatalogError::Unsupported(pg::redact(s)));
        }
        Ok(Self::Sqlite(PathBuf::from(s)))
    }

    /// Whether `s` names a database (PostgreSQL's URL or `key=value` words, or a URL of another
    /// scheme) rather than a file: a config file's relative paths are resolved against its
    /// directory, a database location never is, whether or not [`Self::parse`] takes it.
    pub fn names_a_database(s: &str) -> bool {
        PgUrl::is_one(s) || s.contains("://")
    }

    /// Whether several servers may share this catalog (each names its own replicas).
    pub fn is_shared(&self) -> bool {
        matches!(self, Self::Postgres(_))
    }
}

/// Shown as given, a PostgreSQL password hidden.
impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Sqlite(p) => write!(f, "{}", p.display()),
            Self::Memory => f.write_str("(in memory)"),
            Self::Postgres(url) => write!(f, "{url}"),
        }
    }
}

/// A file stored (or about to be): what [`Catalog::intend`] and [`Catalog::register`] record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Commit {
    /// The logical path: relative to the server's root, `/`-separated, no `.` or `..`.
    pub path: String,
    pub size: u64,
    pub mtime_ns: i64,
    pub digest: Vec<u8>,
    /// The digest's algorithm, as the protocol names it (`blake3`, `xxh3`, `sha256`, `md5`).
    pub algo: String,
    /// The name of the token that stored it.
    pub stored_by: String,
    /// Where this server keeps it.
    pub physical: String,
}

/// A replica's health.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReplicaState {
    Good,
    Stale,
    Bad,
}

impl ReplicaState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Good => "good",
            Self::Stale => "stale",
            Self::Bad => "bad",
        }
    }

    fn parse(s: &str) -> Self {
        match s {
            "good" => Self::Good,
            "stale" => Self::Stale,
            _ => Self::Bad,
        }
    }
}

/// One copy of an object on one server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    pub server: String,
    pub physical: String,
    pub state: ReplicaState,
    /// Its path on its server (under that server's root), when a `repl` put it elsewhere than
    /// the object's path; `None`: at the object's path.
    pub path: Option<String>,
    /// Where its server is reachable (`host:port`), as the server advertised it or a `repl`
    /// recorded it; empty when unknown.
    pub address: String,
}

/// One metadata entry: attribute, value and unit (empty when none), as iRODS's AVUs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Avu {
    pub attr: String,
    pub value: String,
    pub unit: String,
}

/// What the catalog knows of an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    pub path: String,
    pub size: u64,
    pub mtime_ns: i64,
    pub digest: Vec<u8>,
    pub algo: String,
    pub stored_by: String,
    /// When it was registered, in nanoseconds since the Unix epoch.
    pub stored_at: i64,
}

/// An object with its replicas and metadata: what `ferry stat` shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    pub object: Object,
    pub replicas: Vec<Replica>,
    pub metadata: Vec<Avu>,
}

/// What [`Catalog::reconcile`] did with the intents a crash left.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Files found under their final names: registered.
    pub registered: u64,
    /// Files not there (or not whole): their intents dropped.
    pub dropped: u64,
}

pub(crate) fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Refuses a string longer than `max` bytes, or an empty one where `empty` says so.
pub(crate) fn bounded(
    what: &'static str,
    s: &str,
    max: usize,
    may_be_empty: bool,
) -> Result<(), CatalogError> {
    if s.is_empty() && !may_be_empty {
        return Err(CatalogError::Empty(what));
    }
    if s.len() > max {
        return Err(CatalogError::TooLong {
            what,
            len: s.len(),
            max,
        });
    }
    Ok(())
}

/// The lowest and the first-past-the-end keys of every path strictly under `prefix` (a
/// directory): paths sort between `prefix/` and `prefix0` (`0` follows `/`), so the path index
/// answers the range without a scan. The empty prefix is the whole tree.
pub(crate) fn under(prefix: &str) -> (String, String) {
    let p = prefix.trim_end_matches('/');
    if p.is_empty() {
        return (String::new(), "\u{10FFFF}".to_owned());
    }
    (format!("{p}/"), format!("{p}0"))
}

#[cfg(any(test, feature = "test-cluster"))]
mod cluster;
#[cfg(any(test, feature = "test-cluster"))]
pub use cluster::TestCluster;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;
