//! What a fixity audit (`ferry verify`) needs of the catalog: this server's objects under a
//! path, page by page in path order (a catalog of millions is never held at once), and a way
//! to mark this server's replica of one good or bad.

use crate::db::{args, Db};
use crate::store::{object_at, size_i64};
use crate::{under, Catalog, CatalogError, Object, ReplicaState};

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
}
