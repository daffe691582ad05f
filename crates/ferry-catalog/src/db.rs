//! The backend seam: the catalog's statements are written once, in SQL that SQLite and
//! PostgreSQL both take (numbered `?N` parameters), and run through [`Db`] on either. What the
//! two dialects disagree on is translated in one place, [`crate::pg::statement`] and
//! [`crate::pg::schema`]; every value is a bound parameter ([`Arg`]), never SQL text.

use rusqlite::types::{ToSqlOutput, ValueRef};

use crate::error::CatalogError;
use crate::pg::Pg;

/// A parameter, borrowed from the caller.
#[derive(Clone, Copy, Debug)]
pub enum Arg<'a> {
    Null,
    Int(i64),
    Real(f64),
    Text(&'a str),
    Blob(&'a [u8]),
}

impl From<i64> for Arg<'_> {
    fn from(n: i64) -> Self {
        Self::Int(n)
    }
}

impl From<f64> for Arg<'_> {
    fn from(n: f64) -> Self {
        Self::Real(n)
    }
}

impl From<Option<f64>> for Arg<'_> {
    fn from(n: Option<f64>) -> Self {
        n.map_or(Self::Null, Self::Real)
    }
}

impl From<Option<i64>> for Arg<'_> {
    fn from(n: Option<i64>) -> Self {
        n.map_or(Self::Null, Self::Int)
    }
}

impl<'a> From<Option<&'a str>> for Arg<'a> {
    fn from(s: Option<&'a str>) -> Self {
        s.map_or(Self::Null, Self::Text)
    }
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(s: &'a str) -> Self {
        Self::Text(s)
    }
}

impl<'a> From<&'a String> for Arg<'a> {
    fn from(s: &'a String) -> Self {
        Self::Text(s)
    }
}

impl<'a> From<&'a [u8]> for Arg<'a> {
    fn from(b: &'a [u8]) -> Self {
        Self::Blob(b)
    }
}

impl<'a> From<&'a Vec<u8>> for Arg<'a> {
    fn from(b: &'a Vec<u8>) -> Self {
        Self::Blob(b)
    }
}

/// The parameters of one statement, each converted with `Arg::from`.
macro_rules! args {
    ($($a:expr),* $(,)?) => { &[$($crate::db::Arg::from($a)),*][..] };
}
pub(crate) use args;

/// A value read back.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Val {
    #[default]
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

impl Val {
    /// This value as a parameter.
    pub(crate) fn as_arg(&self) -> Arg<'_> {
        match self {
            Self::Null => Arg::Null,
            Self::Int(n) => Arg::Int(*n),
            Self::Real(n) => Arg::Real(*n),
            Self::Text(s) => Arg::Text(s),
            Self::Blob(b) => Arg::Blob(b),
        }
    }
}

impl From<Arg<'_>> for Val {
    fn from(a: Arg<'_>) -> Self {
        match a {
            Arg::Null => Self::Null,
            Arg::Int(n) => Self::Int(n),
            Arg::Real(n) => Self::Real(n),
            Arg::Text(s) => Self::Text(s.to_owned()),
            Arg::Blob(b) => Self::Blob(b.to_vec()),
        }
    }
}

/// One row read back; each column is taken out once, by type.
#[derive(Debug)]
pub struct Row(pub(crate) Vec<Val>);

impl Row {
    fn take(&mut self, i: usize) -> Val {
        self.0.get_mut(i).map(std::mem::take).unwrap_or(Val::Null)
    }

    pub fn int(&mut self, i: usize) -> Result<i64, CatalogError> {
        match self.take(i) {
            Val::Int(n) => Ok(n),
            other => Err(CatalogError::Column(i, "an integer", format!("{other:?}"))),
        }
    }

    pub fn text(&mut self, i: usize) -> Result<String, CatalogError> {
        match self.take(i) {
            Val::Text(s) => Ok(s),
            other => Err(CatalogError::Column(i, "text", format!("{other:?}"))),
        }
    }

    pub fn blob(&mut self, i: usize) -> Result<Vec<u8>, CatalogError> {
        match self.take(i) {
            Val::Blob(b) => Ok(b),
            other => Err(CatalogError::Column(i, "bytes", format!("{other:?}"))),
        }
    }

    /// A real number; an integer is taken as one (SQLite may keep a whole real as one).
    #[allow(clippy::cast_precision_loss)]
    pub fn real(&mut self, i: usize) -> Result<f64, CatalogError> {
        match self.take(i) {
            Val::Real(n) => Ok(n),
            Val::Int(n) => Ok(n as f64),
            other => Err(CatalogError::Column(i, "a number", format!("{other:?}"))),
        }
    }

    /// An integer or NULL.
    pub fn opt_int(&mut self, i: usize) -> Result<Option<i64>, CatalogError> {
        match self.take(i) {
            Val::Null => Ok(None),
            Val::Int(n) => Ok(Some(n)),
            other => Err(CatalogError::Column(
                i,
                "an integer or null",
                format!("{other:?}"),
            )),
        }
    }

    /// A real number or NULL.
    #[allow(clippy::cast_precision_loss)]
    pub fn opt_real(&mut self, i: usize) -> Result<Option<f64>, CatalogError> {
        match self.take(i) {
            Val::Null => Ok(None),
            Val::Real(n) => Ok(Some(n)),
            Val::Int(n) => Ok(Some(n as f64)),
            other => Err(CatalogError::Column(
                i,
                "a number or null",
                format!("{other:?}"),
            )),
        }
    }

    /// Text or NULL.
    pub fn opt_text(&mut self, i: usize) -> Result<Option<String>, CatalogError> {
        match self.take(i) {
            Val::Null => Ok(None),
            Val::Text(s) => Ok(Some(s)),
            other => Err(CatalogError::Column(
                i,
                "text or null",
                format!("{other:?}"),
            )),
        }
    }
}

/// What the catalog asks of a database: statements with parameters, and a batch of
/// statements without (a migration).
pub(crate) trait Db {
    /// Runs one statement; how many rows it changed.
    fn run(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, CatalogError>;
    /// Runs one query; its rows.
    fn rows(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>, CatalogError>;
    /// Runs one query planned for these very values, never from a cached generic plan: for a
    /// `find`, whose best plan depends on them. PostgreSQL's generic plan guesses a path range
    /// at 0.5 % of the table and walked all of it (1.3 s at a million objects, not 1 ms).
    fn rows_planned(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>, CatalogError> {
        self.rows(sql, args)
    }
    /// Runs statements separated by `;`, without parameters (a migration's text).
    fn batch(&mut self, sql: &str) -> Result<(), CatalogError>;

    /// The first row of a query, if any.
    fn row(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Option<Row>, CatalogError> {
        Ok(self.rows(sql, args)?.into_iter().next())
    }

    /// The first row of a query, which must have one.
    fn one(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Row, CatalogError> {
        self.row(sql, args)?
            .ok_or_else(|| CatalogError::NotFound("the row of a query that has one".into()))
    }
}

/// Runs `f` in a transaction: committed when it returns `Ok`, rolled back otherwise.
pub(crate) fn transaction<D: Db + ?Sized, T>(
    db: &mut D,
    f: impl FnOnce(&mut D) -> Result<T, CatalogError>,
) -> Result<T, CatalogError> {
    db.batch("BEGIN")?;
    match f(db) {
        Ok(v) => {
            db.batch("COMMIT")?;
            Ok(v)
        }
        Err(e) => {
            // The error says what went wrong; a failed rollback leaves nothing more to say
            // (a dropped connection rolls back anyway).
            let _ = db.batch("ROLLBACK");
            Err(e)
        }
    }
}

impl rusqlite::ToSql for Arg<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match *self {
            Arg::Null => ValueRef::Null,
            Arg::Int(n) => ValueRef::Integer(n),
            Arg::Real(n) => ValueRef::Real(n),
            Arg::Text(s) => ValueRef::Text(s.as_bytes()),
            Arg::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

impl Db for rusqlite::Connection {
    fn run(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, CatalogError> {
        let n = self
            .prepare_cached(sql)?
            .execute(rusqlite::params_from_iter(args))?;
        Ok(n as u64)
    }

    fn rows(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>, CatalogError> {
        let mut st = self.prepare_cached(sql)?;
        let width = st.column_count();
        let mut rows = st.query(rusqlite::params_from_iter(args))?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            let mut row = Vec::with_capacity(width);
            for i in 0..width {
                row.push(match r.get_ref(i)? {
                    ValueRef::Null => Val::Null,
                    ValueRef::Integer(n) => Val::Int(n),
                    ValueRef::Real(n) => Val::Real(n),
                    ValueRef::Text(t) => Val::Text(String::from_utf8_lossy(t).into_owned()),
                    ValueRef::Blob(b) => Val::Blob(b.to_vec()),
                });
            }
            out.push(Row(row));
        }
        Ok(out)
    }

    fn batch(&mut self, sql: &str) -> Result<(), CatalogError> {
        Ok(self.execute_batch(sql)?)
    }
}

/// An open catalog database.
pub(crate) enum Conn {
    Sqlite(rusqlite::Connection),
    Postgres(Pg),
}

impl Conn {
    /// Asks that the next commits be durable on their own (SQLite's `synchronous = FULL`), or
    /// no longer. A PostgreSQL commit is durable by the server's own settings.
    pub(crate) fn durable(&mut self, on: bool) -> Result<(), CatalogError> {
        if let Self::Sqlite(c) = self {
            c.pragma_update(None, "synchronous", if on { "FULL" } else { "NORMAL" })?;
        }
        Ok(())
    }

    /// Runs `f` with no other server migrating the same database at once (PostgreSQL's
    /// advisory lock; one SQLite file has one writer anyway).
    pub(crate) fn exclusively<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, CatalogError>,
    ) -> Result<T, CatalogError> {
        if !matches!(self, Self::Postgres(_)) {
            return f(self);
        }
        self.rows("SELECT pg_advisory_lock(?1)", args![MIGRATION_LOCK])?;
        let r = f(self);
        let unlocked = self.rows("SELECT pg_advisory_unlock(?1)", args![MIGRATION_LOCK]);
        let v = r?;
        unlocked?;
        Ok(v)
    }
}

/// The advisory lock's key while a catalog migrates ("ferrycat" in ASCII).
const MIGRATION_LOCK: i64 = 0x6665_7272_7963_6174;

impl Db for Conn {
    fn run(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, CatalogError> {
        match self {
            Self::Sqlite(c) => c.run(sql, args),
            Self::Postgres(c) => c.run(sql, args),
        }
    }

    fn rows(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>, CatalogError> {
        match self {
            Self::Sqlite(c) => c.rows(sql, args),
            Self::Postgres(c) => c.rows(sql, args),
        }
    }

    fn rows_planned(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>, CatalogError> {
        match self {
            Self::Sqlite(c) => c.rows(sql, args),
            Self::Postgres(c) => c.rows_planned(sql, args),
        }
    }

    fn batch(&mut self, sql: &str) -> Result<(), CatalogError> {
        match self {
            Self::Sqlite(c) => c.batch(sql),
            Self::Postgres(c) => c.batch(sql),
        }
    }
}
