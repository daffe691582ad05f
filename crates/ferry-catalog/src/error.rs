//! The catalog's errors: what the database said, and what a caller asked that the catalog
//! refuses.

/// Why a catalog operation failed.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("catalog database: {0}")]
    Db(#[from] rusqlite::Error),
    #[error("the catalog's schema is version {found}; this ferry knows up to {known}")]
    TooNew { found: i64, known: i64 },
    #[error("catalog location {0:?}: only a SQLite file path is supported so far")]
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
    #[error("bad find condition {0:?}: {1}")]
    BadCondition(String, &'static str),
}
