//! The catalog's database seam for ferry's other stores (the service's job queue): one set of
//! statements, written in SQL that SQLite and PostgreSQL both take with numbered `?N`
//! parameters, run on an embedded SQLite file or a shared PostgreSQL database alike. Every
//! value is a bound [`Arg`]; what the dialects disagree on is translated in one place
//! (`pg.rs`), as for the catalog itself.

use rusqlite::Connection;

pub use crate::db::{Arg, Row, Val};
use crate::db::{Conn, Db};
use crate::error::CatalogError;
use crate::pg::Pg;
use crate::Location;

/// An open database: SQLite (WAL, foreign keys on, as the catalog opens it) or PostgreSQL
/// (its connection on a thread of its own).
pub struct Database(Conn);

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_shared() {
            "Database(PostgreSQL)"
        } else {
            "Database(SQLite)"
        })
    }
}

impl Database {
    /// Opens (creating a SQLite file if need be) the database at `location`; a PostgreSQL
    /// server that cannot be reached, or refuses the login, is an error here.
    pub fn open(location: &Location) -> Result<Self, CatalogError> {
        Ok(Self(match location {
            Location::Sqlite(path) => crate::store::sqlite(Connection::open(path)?)?,
            Location::Memory => crate::store::sqlite(Connection::open_in_memory()?)?,
            Location::Postgres(url) => Conn::Postgres(Pg::connect(url)?),
        }))
    }

    /// Whether this is PostgreSQL, which several processes may share.
    pub fn is_shared(&self) -> bool {
        matches!(self.0, Conn::Postgres(_))
    }

    /// Runs one statement; how many rows it changed.
    pub fn run(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, CatalogError> {
        self.0.run(sql, args)
    }

    /// Runs one query; its rows.
    pub fn rows(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>, CatalogError> {
        self.0.rows(sql, args)
    }

    /// The first row of a query, if any.
    pub fn row(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Option<Row>, CatalogError> {
        self.0.row(sql, args)
    }

    /// The first row of a query, which must have one.
    pub fn one(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Row, CatalogError> {
        self.0.one(sql, args)
    }

    /// Runs statements separated by `;`, without parameters: a migration's text, whose
    /// SQLite types PostgreSQL gets as its own (`BLOB` as `bytea`, text compared bytewise).
    pub fn batch(&mut self, sql: &str) -> Result<(), CatalogError> {
        self.0.batch(sql)
    }

    /// Runs `f` in a transaction: committed when it returns `Ok`, rolled back otherwise.
    pub fn transaction<T, E: From<CatalogError>>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, E>,
    ) -> Result<T, E> {
        self.0.batch("BEGIN")?;
        match f(self) {
            Ok(v) => {
                self.0.batch("COMMIT")?;
                Ok(v)
            }
            Err(e) => {
                // The error says what went wrong; a dropped connection rolls back anyway.
                let _ = self.0.batch("ROLLBACK");
                Err(e)
            }
        }
    }

    /// Applies each of `steps` (version, SQL) newer than what `table` records, each in its
    /// own transaction, stamped `now`; one process at a time on PostgreSQL (the catalog's
    /// advisory lock). A database newer than the last step is refused
    /// ([`CatalogError::TooNew`]). `table` is the caller's constant, never input.
    pub fn migrate(
        &mut self,
        table: &str,
        steps: &[(i64, &str)],
        now: i64,
    ) -> Result<(), CatalogError> {
        self.0
            .exclusively(|c| crate::schema::migrate_on(c, table, steps, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_migrations_and_transactions_on_sqlite() {
        let mut db = Database::open(&Location::Memory).unwrap();
        assert!(!db.is_shared());
        let steps = [(
            1,
            "CREATE TABLE t (id BIGINT PRIMARY KEY, s TEXT, r DOUBLE PRECISION)",
        )];
        db.migrate("t_migrations", &steps, 1).unwrap();
        db.migrate("t_migrations", &steps, 2).unwrap();
        let r: Result<(), CatalogError> = db.transaction(|db| {
            db.run(
                "INSERT INTO t (id, s, r) VALUES (?1, ?2, ?3)",
                &[Arg::Int(1), Arg::Text("a"), Arg::Null],
            )?;
            Err(CatalogError::Empty("on purpose"))
        });
        assert!(r.is_err());
        assert!(
            db.row("SELECT id FROM t", &[]).unwrap().is_none(),
            "rolled back"
        );
        db.transaction(|db| {
            db.run(
                "INSERT INTO t (id, s, r) VALUES (?1, ?2, ?3)",
                &[Arg::Int(2), Arg::from(None::<&str>), Arg::Real(0.5)],
            )
        })
        .unwrap();
        let mut row = db.one("SELECT id, s, r FROM t", &[]).unwrap();
        assert_eq!(row.int(0).unwrap(), 2);
        assert_eq!(row.opt_text(1).unwrap(), None);
        assert_eq!(row.real(2).unwrap(), 0.5);
        let newer = [(1, steps[0].1), (2, "SELECT 1")];
        db.migrate("t_migrations", &newer, 3).unwrap();
        assert!(matches!(
            db.migrate("t_migrations", &steps, 4),
            Err(CatalogError::TooNew { found: 2, known: 1 })
        ));
    }
}
