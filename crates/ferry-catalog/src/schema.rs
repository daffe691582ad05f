//! The schema and its versioned migrations: one list, applied in order, each in its own
//! transaction and recorded in `catalog_migrations`, so an older catalog is brought up to date
//! at open and a newer one is refused.
//!
//! The statements are written for SQLite; PostgreSQL runs the same list with its few type
//! names changed in one place ([`crate::pg::schema`]).

use rusqlite::Connection;

use crate::db::{args, transaction, Conn, Db};
use crate::error::CatalogError;

/// Each migration's version and statements; a version is never edited once released, only
/// followed by another.
pub(crate) const MIGRATIONS: &[(i64, &str)] = &[
    (1, V1),
    (2, V2),
    (3, V3),
    (4, V4),
    (5, V5),
    (6, V6),
    (7, V7),
];

/// Longest attribute name, value and unit of a metadata entry, in bytes (SECURITY.md).
pub const MAX_ATTR: usize = 256;
pub const MAX_VALUE: usize = 2048;
pub const MAX_UNIT: usize = 64;
/// Longest server address (`host:port`, a DNS name being at most 253 bytes).
pub const MAX_ADDRESS: usize = 256;
/// Longest logical path (Linux's PATH_MAX).
pub const MAX_PATH: usize = 4096;

const V1: &str = "
CREATE TABLE objects (
    id        INTEGER PRIMARY KEY,
    path      TEXT NOT NULL UNIQUE,
    size      INTEGER NOT NULL,
    mtime_ns  INTEGER NOT NULL,
    digest    BLOB NOT NULL,
    algo      TEXT NOT NULL,
    stored_by TEXT NOT NULL,
    stored_at INTEGER NOT NULL
);
CREATE INDEX objects_mtime ON objects (mtime_ns);
CREATE INDEX objects_size ON objects (size);

CREATE TABLE replicas (
    object   INTEGER NOT NULL REFERENCES objects (id) ON DELETE CASCADE,
    server   TEXT NOT NULL,
    physical TEXT NOT NULL,
    state    TEXT NOT NULL CHECK (state IN ('good', 'stale', 'bad')),
    PRIMARY KEY (object, server)
);

CREATE TABLE metadata (
    object INTEGER NOT NULL REFERENCES objects (id) ON DELETE CASCADE,
    attr   TEXT NOT NULL CHECK (length(attr) BETWEEN 1 AND 256),
    value  TEXT NOT NULL CHECK (length(value) <= 2048),
    unit   TEXT NOT NULL CHECK (length(unit) <= 64),
    num    DOUBLE PRECISION,
    PRIMARY KEY (object, attr, value)
);
CREATE INDEX metadata_value ON metadata (attr, value);
CREATE INDEX metadata_num ON metadata (attr, num);

CREATE TABLE pending (
    path      TEXT PRIMARY KEY,
    size      INTEGER NOT NULL,
    mtime_ns  INTEGER NOT NULL,
    digest    BLOB NOT NULL,
    algo      TEXT NOT NULL,
    stored_by TEXT NOT NULL,
    physical  TEXT NOT NULL,
    since     INTEGER NOT NULL
);
";

/// Which root each server's paths are relative to, so that a second server on another root
/// is not handed the first one's catalog (the state directory's is the default).
const V2: &str = "
CREATE TABLE roots (
    server TEXT PRIMARY KEY,
    root   TEXT NOT NULL
);
";

/// Each server's intents apart, so that one server's start settles its own only when several
/// share the catalog. Intents from before (server `''`) were written when a catalog had one
/// server, and stay that server's.
const V3: &str = "
CREATE TABLE pending_v3 (
    server    TEXT NOT NULL,
    path      TEXT NOT NULL,
    size      INTEGER NOT NULL,
    mtime_ns  INTEGER NOT NULL,
    digest    BLOB NOT NULL,
    algo      TEXT NOT NULL,
    stored_by TEXT NOT NULL,
    physical  TEXT NOT NULL,
    since     INTEGER NOT NULL,
    PRIMARY KEY (server, path)
);
INSERT INTO pending_v3 (server, path, size, mtime_ns, digest, algo, stored_by, physical, since)
    SELECT '', path, size, mtime_ns, digest, algo, stored_by, physical, since FROM pending;
DROP TABLE pending;
ALTER TABLE pending_v3 RENAME TO pending;
";

/// Where each server is reachable (`serve --advertise`, `host:port`; empty when unknown), so
/// that a client's `get` can fetch a replica from the server that holds it. A row with an
/// empty root is a server of another catalog, known only by a `repl`'s record of its address.
const V4: &str = "
ALTER TABLE roots ADD COLUMN address TEXT NOT NULL DEFAULT '';
";

/// Replicas a server's policy still owes (`[[policy]]` in `ferry serve --config`): one row per
/// object and server that owes it, written in the registration's own transaction, so that a
/// restart resumes from the table and never walks the tree. `next_at` (ns) is when the next
/// try is due, `note` why the last one failed; the index answers "what is due" by range.
const V5: &str = "
CREATE TABLE owed (
    server  TEXT NOT NULL,
    path    TEXT NOT NULL,
    wanted  INTEGER NOT NULL,
    tries   INTEGER NOT NULL,
    next_at INTEGER NOT NULL,
    note    TEXT NOT NULL,
    PRIMARY KEY (server, path)
);
CREATE INDEX owed_due ON owed (server, next_at);
";

/// Replicas and metadata without their foreign keys to `objects`: the catalog deletes an
/// object's rows itself, set by set, in the object's own transaction (`store::forget`).
/// PostgreSQL ran the cascade as a trigger per object and per table (3.7 s of a 4.2 s
/// `rm -r` of 100,000 objects); SQLite as a program per row. Same tables, same indexes,
/// the same rows.
const V6: &str = "
CREATE TABLE replicas_v6 (
    object   INTEGER NOT NULL,
    server   TEXT NOT NULL,
    physical TEXT NOT NULL,
    state    TEXT NOT NULL CHECK (state IN ('good', 'stale', 'bad')),
    PRIMARY KEY (object, server)
);
INSERT INTO replicas_v6 (object, server, physical, state)
    SELECT object, server, physical, state FROM replicas;
DROP TABLE replicas;
ALTER TABLE replicas_v6 RENAME TO replicas;

CREATE TABLE metadata_v6 (
    object INTEGER NOT NULL,
    attr   TEXT NOT NULL CHECK (length(attr) BETWEEN 1 AND 256),
    value  TEXT NOT NULL CHECK (length(value) <= 2048),
    unit   TEXT NOT NULL CHECK (length(unit) <= 64),
    num    DOUBLE PRECISION,
    PRIMARY KEY (object, attr, value)
);
INSERT INTO metadata_v6 (object, attr, value, unit, num)
    SELECT object, attr, value, unit, num FROM metadata;
DROP TABLE metadata;
ALTER TABLE metadata_v6 RENAME TO metadata;
CREATE INDEX metadata_value ON metadata (attr, value);
CREATE INDEX metadata_num ON metadata (attr, num);
";

/// A replica's own path on its server (under its root, `/`-separated), for a copy that a
/// `repl` made at another path than the object's: a client fetches it there. NULL is the
/// object's path, so every row from before stays right.
const V7: &str = "
ALTER TABLE replicas ADD COLUMN path TEXT;
";

/// Brings the catalog to the newest schema this build knows, one server at a time.
pub(crate) fn migrate(conn: &mut Conn) -> Result<(), CatalogError> {
    conn.exclusively(|c| migrate_on(c, "catalog_migrations", MIGRATIONS, crate::now_ns()))
}

/// Applies each of `steps` (version, SQL) newer than what `table` records, each in its own
/// transaction with its record, stamped `now`; a database newer than the last step is
/// refused. Shared by every SQLite schema of ferry (the catalog's, the service's job store);
/// `table` is the caller's constant, never input.
pub fn run_migrations(
    conn: &mut Connection,
    table: &str,
    steps: &[(i64, &str)],
    now: i64,
) -> Result<(), CatalogError> {
    migrate_on(conn, table, steps, now)
}

/// [`run_migrations`] on either backend.
pub(crate) fn migrate_on<D: Db + ?Sized>(
    db: &mut D,
    table: &str,
    steps: &[(i64, &str)],
    now: i64,
) -> Result<(), CatalogError> {
    db.batch(&format!(
        "CREATE TABLE IF NOT EXISTS {table} (
             version    BIGINT PRIMARY KEY,
             applied_at BIGINT NOT NULL
         )"
    ))?;
    let current = db
        .one(
            &format!("SELECT COALESCE(MAX(version), 0) FROM {table}"),
            &[],
        )?
        .int(0)?;
    let newest = steps.last().map_or(0, |m| m.0);
    if current > newest {
        return Err(CatalogError::TooNew {
            found: current,
            known: newest,
        });
    }
    let record = format!("INSERT INTO {table} (version, applied_at) VALUES (?1, ?2)");
    for (version, sql) in steps.iter().filter(|m| m.0 > current) {
        transaction(db, |db| {
            db.batch(sql)?;
            db.run(&record, args![*version, now])?;
            Ok(())
        })?;
    }
    Ok(())
}
