//! The catalog's errors: what the database said, and what a caller asked that the catalog
//! refuses.

/// Why a catalog operation failed.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("catalog database: {0}")]
    Db(#[from] rusqlite::Error),
    /// What PostgreSQL said; its text never holds the location's password.
    #[error("catalog database (PostgreSQL): {}", said(.0))]
    Pg(#[from] postgres::Error),
    #[error("cannot connect to the catalog {location}: {}", said(.source))]
    Connect {
        /// The location, its password hidden.
        location: String,
        source: postgres::Error,
    },
    #[error("catalog location {location}: {why}")]
    Location { location: String, why: String },
    #[error("the catalog's connection thread has stopped")]
    Gone,
    #[error("the connection to the catalog's database was lost in a transaction, which did not happen; the next one connects again")]
    Lost,
    #[error("the connection to the catalog's database was lost and cannot be made again: {}", said(.0))]
    Reconnect(postgres::Error),
    #[error("catalog: {0}")]
    Io(#[from] std::io::Error),
    #[error("catalog column {0}: expected {1}, found {2}")]
    Column(usize, &'static str, String),
    #[error("the catalog's schema is version {found}; this ferry knows up to {known}")]
    TooNew { found: i64, known: i64 },
    #[error("catalog location {0:?}: a SQLite file path or a PostgreSQL location (postgres://, postgresql:// or host=…) is expected")]
    Unsupported(String),
    #[error("{what} is {len} bytes; at most {max}")]
    TooLong {
        what: &'static str,
        len: usize,
        max: usize,
    },
    #[error("{0} is empty")]
    Empty(&'static str),
    #[error("{0}: not in the catalog")]
    NotFound(String),
    #[error("{0}: already in the catalog")]
    Exists(String),
    #[error("the catalog is {recorded}'s (this server's paths are relative to it), not {asked}'s")]
    OtherRoot { recorded: String, asked: String },
    /// The local intents file of a PostgreSQL catalog, kept by a server of another root on
    /// the same state directory: reconciled against this root, its intents would be wrong.
    #[error("the intents file {file} is for the root {recorded}, not {asked}: give this server a state directory of its own (FERRY_STATE_DIR)")]
    IntentsElsewhere {
        file: String,
        recorded: String,
        asked: String,
    },
    /// A record of a copy elsewhere, asked of a catalog that servers share: there each server
    /// registers its own replicas.
    #[error("{files} stored files wait for their registration, which failed ({why}) and is being tried again; no new files until it succeeds")]
    Unregistered { files: usize, why: String },
    #[error("this catalog is shared by the servers of a zone: each registers its own replicas, none is recorded by another's word")]
    Shared,
    #[error("replica path {0:?}: {1}")]
    BadPath(String, &'static str),
    #[error("bad find condition {0:?}: {1}")]
    BadCondition(String, &'static str),
}

/// What PostgreSQL said in words: the server's own message (and its code) where there is one,
/// where the client's error alone reads "db error".
/// What PostgreSQL said, or what failed on the way to it with each cause after it (a TLS
/// handshake's own reason: another CA's certificate, another name's).
fn said(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => {
            let mut text = e.to_string();
            let mut cause = std::error::Error::source(e);
            while let Some(c) = cause {
                text = format!("{text}: {c}");
                cause = c.source();
            }
            text
        }
    }
}
