//! What a fixity audit (`ferry verify`) needs of the catalog: this server's objects under a
//! path, page by page in path order (a catalog of millions is never held at once), and a way
//! to mark this server's replica of one good or bad.

use crate::db::{args, transaction, Db};
use crate::schema::{MAX_ATTR, MAX_PATH};
use crate::store::{object_at, size_i64, upsert_replica};
use crate::{bounded, under, Catalog, CatalogError, Object, ReplicaState};

/// Objects recorded at a time by [`Catalog::record_replicas`]: one transaction each.
const RECORD_PAGE: i64 = 1024;

impl Catalog {
    /// At most `limit` of the objects this server holds a replica of at `prefix` or under it
    /// (the whole catalog when empty), in path order, strictly after `after`.
    pub fn held_page(
        &self,
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<Object>, CatalogError> {
        self.settled();
        let prefix = prefix.trim_end_matches('/');
        let (lo, hi) = under(prefix);
        let rows = self.lock().rows(
            "SELECT o.path, o.size, o.mtime_ns, o.digest, o.algo, o.stored_by, o.stored_at
             FROM objects o JOIN replicas r ON r.object = o.id AND r.server = ?1
             WHERE ((o.path >= ?2 AND o.path < ?3) OR o.path = ?4) AND o.path > ?5
             ORDER BY o.path LIMIT ?6",
            args![
                self.server(),
                &lo,
                &hi,
                prefix,
                after,
                size_i64(limit as u64)
            ],
        )?;
        rows.into_iter().map(|mut r| object_at(&mut r, 0)).collect()
    }

    /// Marks this server's replica of `path` `state`; whether it had one.
    pub fn set_replica_state(&self, path: &str, state: ReplicaState) -> Result<bool, CatalogError> {
        self.settled();
        let n = self.lock().run(
            "UPDATE replicas SET state = ?1
             WHERE server = ?2 AND object = (SELECT id FROM objects WHERE path = ?3)",
            args![state.as_str(), self.server(), path],
        )?;
        Ok(n > 0)
    }

    /// Whether `path` is registered (with a replica anywhere).
    pub fn is_registered(&self, path: &str) -> Result<bool, CatalogError> {
        self.settled();
        let found = self
            .lock()
            .row("SELECT 1 FROM objects WHERE path = ?1", args![path])?;
        Ok(found.is_some())
    }

    /// Records that `server`, another server, holds a good copy of each object this server
    /// holds a good replica of at `path` (with `tree`, under it too), at `physical` followed
    /// by the rest of the object's path below `path`: what a `repl` to a server with a catalog
    /// of its own leaves here, so that `stat` here knows the copy there. `at` is where the copy
    /// is on that server (under its root), when not at `path`: each replica's own path is
    /// `at` followed by the same rest, fetched there by a client. Returns how many (none when
    /// `server` is this server's own name).
    pub fn record_replicas(
        &self,
        path: &str,
        tree: bool,
        server: &str,
        physical: &str,
        at: Option<&str>,
    ) -> Result<u64, CatalogError> {
        bounded("server name", server, MAX_ATTR, false)?;
        bounded("physical path", physical, 2 * MAX_PATH, false)?;
        let at = match at.map(|a| a.trim_matches('/')) {
            Some(a) => {
                bounded("replica path", a, MAX_PATH, false)?;
                if let Some(bad) = a.split('/').find(|c| matches!(*c, "" | "." | "..")) {
                    return Err(CatalogError::BadPath(a.to_owned(), component(bad)));
                }
                Some(a).filter(|a| *a != path.trim_matches('/'))
            }
            None => None,
        };
        // In a shared catalog every server registers its own: a record could otherwise mark
        // another server's bad copy good.
        if self.is_shared() {
            return Err(CatalogError::Shared);
        }
        // This server's own replicas come from what it stores and audits, never a client's
        // word: a record of its own name is skipped.
        if server == self.server() {
            return Ok(0);
        }
        self.settled();
        let path = path.trim_end_matches('/');
        let (lo, hi) = match tree {
            true => under(path),
            // An empty range: the object at `path` alone.
            false => (String::new(), String::new()),
        };
        let top = physical.trim_end_matches('/');
        let mut after = String::new();
        let mut recorded = 0;
        loop {
            let mut conn = self.lock();
            let rows = conn.rows(
                "SELECT o.id, o.path FROM objects o
                 JOIN replicas r ON r.object = o.id AND r.server = ?1 AND r.state = 'good'
                 WHERE ((o.path >= ?2 AND o.path < ?3) OR o.path = ?4) AND o.path > ?5
                 ORDER BY o.path LIMIT ?6",
                args![self.server(), &lo, &hi, path, &after, RECORD_PAGE],
            )?;
            let mut page = Vec::with_capacity(rows.len());
            for mut r in rows {
                page.push((r.int(0)?, r.text(1)?));
            }
            let Some((_, last)) = page.last() else {
                return Ok(recorded);
            };
            after = last.clone();
            transaction(&mut *conn, |tx| {
                for (id, p) in &page {
                    let rest = if p == path {
                        ""
                    } else if path.is_empty() {
                        p.as_str()
                    } else {
                        p.get(path.len() + 1..).unwrap_or_default()
                    };
                    let below = |top: &str| match rest {
                        "" => top.to_owned(),
                        rest => format!("{top}/{rest}"),
                    };
                    let own = at.map(below);
                    upsert_replica(tx, *id, server, &below(top), own.as_deref())?;
                }
                Ok(())
            })?;
            recorded += page.len() as u64;
        }
    }
}

/// Why a replica path's component is refused.
fn component(c: &str) -> &'static str {
    match c {
        "" => "an empty component (`//`)",
        _ => "a `.` or `..` component",
    }
}
