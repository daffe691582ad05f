//! What a server's policies need of the catalog (`[[policy]]` in `ferry serve --config`): the
//! replicas still owed, persisted in the registration's own transaction (so a crash between a
//! rename and the server's copy to its peers loses no debt, and a restart resumes from the
//! table, never from a walk of the tree), and the newest registration under a path, which a
//! retention period is measured from.

use std::sync::Arc;

use crate::db::{args, Conn, Db, Row};
use crate::schema::MAX_ATTR;
use crate::store::size_i64;
use crate::{bounded, under, Catalog, CatalogError};

/// How many good replicas the policy of a path wants, this server's own included (0 or 1:
/// nothing is owed). The server's policies, as [`Catalog::set_wanted`] is given them.
pub type Wanted = Arc<dyn Fn(&str) -> u32 + Send + Sync>;

/// A path whose policy wants more good replicas than the catalog knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owed {
    pub path: String,
    /// Good replicas wanted in all.
    pub wanted: u32,
    /// Tries that failed so far.
    pub tries: u32,
    /// When the next try is due, in nanoseconds since the Unix epoch.
    pub next_at: i64,
    /// Why the last try failed (empty before the first).
    pub note: String,
}

impl Catalog {
    /// From now on every registration of a path whose `wanted` is above the good replicas it
    /// has records what is owed, in the same transaction.
    pub fn set_wanted(&self, wanted: Wanted) {
        *self
            .shared
            .wanted
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(wanted);
    }

    /// At most `limit` of this server's owed paths whose next try is due at `now`, the most
    /// overdue first (the index on (server, next_at) answers without a scan).
    pub fn owed_due(&self, now: i64, limit: usize) -> Result<Vec<Owed>, CatalogError> {
        self.settled();
        let rows = self.lock().rows(
            "SELECT path, wanted, tries, next_at, note FROM owed
             WHERE server = ?1 AND next_at <= ?2 ORDER BY next_at LIMIT ?3",
            args![self.server(), now, size_i64(limit as u64)],
        )?;
        rows.into_iter().map(owed_of).collect()
    }

    /// What this server owes for `path`, if anything.
    pub fn owed(&self, path: &str) -> Result<Option<Owed>, CatalogError> {
        self.settled();
        let row = self.lock().row(
            "SELECT path, wanted, tries, next_at, note FROM owed
             WHERE server = ?1 AND path = ?2",
            args![self.server(), path],
        )?;
        row.map(owed_of).transpose()
    }

    /// How many paths this server owes replicas of.
    pub fn owed_count(&self) -> Result<u64, CatalogError> {
        self.settled();
        let n = self
            .lock()
            .one(
                "SELECT COUNT(*) FROM owed WHERE server = ?1",
                args![self.server()],
            )?
            .int(0)?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// A try for `path` failed (`note` says why): the next is due at `next_at`.
    pub fn owed_later(
        &self,
        path: &str,
        tries: u32,
        next_at: i64,
        note: &str,
    ) -> Result<(), CatalogError> {
        // A note is a one-line error message; a long one is cut, not refused.
        let note = cut(note, MAX_ATTR * 4);
        self.lock().run(
            "UPDATE owed SET tries = ?3, next_at = ?4, note = ?5 WHERE server = ?1 AND path = ?2",
            args![self.server(), path, i64::from(tries), next_at, note],
        )?;
        Ok(())
    }

    /// `path` owes nothing more (its replicas are there, or it is gone).
    pub fn owed_met(&self, path: &str) -> Result<(), CatalogError> {
        self.lock().run(
            "DELETE FROM owed WHERE server = ?1 AND path = ?2",
            args![self.server(), path],
        )?;
        Ok(())
    }

    /// When the newest object at `path` (with `tree`, under it too) was registered, in
    /// nanoseconds since the Unix epoch; `None` when none is. What a retention period is
    /// measured from: a tree may not go while any object in it is younger.
    pub fn newest_stored(&self, path: &str, tree: bool) -> Result<Option<i64>, CatalogError> {
        bounded("path", path, crate::MAX_PATH, true)?;
        self.settled();
        let path = path.trim_end_matches('/');
        let (lo, hi) = match tree {
            true => under(path),
            false => (String::new(), String::new()),
        };
        self.lock()
            .one(
                "SELECT MAX(stored_at) FROM objects
                 WHERE (path >= ?1 AND path < ?2) OR path = ?3",
                args![&lo, &hi, path],
            )?
            .opt_int(0)
    }
}

/// Records what `path` (object `id`, just registered at `at`) is owed under `wanted`: nothing
/// when its good replicas are enough, else a row due now (a new registration starts over).
pub(crate) fn owe_in(
    tx: &mut Conn,
    server: &str,
    wanted: Option<&Wanted>,
    id: i64,
    path: &str,
    at: i64,
) -> Result<(), CatalogError> {
    let Some(wanted) = wanted else {
        return Ok(());
    };
    let n = wanted(path);
    if n <= 1 {
        return Ok(());
    }
    let good = tx
        .one(
            "SELECT COUNT(*) FROM replicas WHERE object = ?1 AND state = 'good'",
            args![id],
        )?
        .int(0)?;
    if good >= i64::from(n) {
        return Ok(());
    }
    tx.run(
        "INSERT INTO owed (server, path, wanted, tries, next_at, note)
         VALUES (?1, ?2, ?3, 0, ?4, '')
         ON CONFLICT (server, path) DO UPDATE SET wanted = excluded.wanted, tries = 0,
             next_at = excluded.next_at, note = ''",
        args![server, path, i64::from(n), at],
    )?;
    Ok(())
}

impl crate::store::Shared {
    /// The policies' function, if the server set one.
    pub(crate) fn wanted_fn(&self) -> Option<Wanted> {
        self.wanted
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

fn owed_of(mut r: Row) -> Result<Owed, CatalogError> {
    Ok(Owed {
        path: r.text(0)?,
        wanted: u32::try_from(r.int(1)?).unwrap_or(u32::MAX),
        tries: u32::try_from(r.int(2)?).unwrap_or(u32::MAX),
        next_at: r.int(3)?,
        note: r.text(4)?,
    })
}

/// `s` cut to at most `max` bytes, on a character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
