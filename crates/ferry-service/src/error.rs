//! The service's errors: the store's database, what a caller asked that is refused, and what
//! the HTTP layer met. The API maps each to a status code.

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// What the job database said (SQLite or PostgreSQL, through ferry-catalog's seam).
    #[error("job database: {0}")]
    Db(#[from] ferry_catalog::CatalogError),
    #[error("the job database's schema is version {found}; this ferry knows up to {known}")]
    TooNew { found: i64, known: i64 },
    #[error("{0}")]
    Invalid(String),
    #[error("no job {0}")]
    NotFound(i64),
    #[error("job {id} has already ended ({state})")]
    Ended { id: i64, state: &'static str },
    #[error("{0}")]
    Forbidden(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The API answered with an error status.
    #[error("the service answered {status}: {message}")]
    Api { status: u16, message: String },
    #[error("TLS: {0}")]
    Tls(String),
}
