//! The [`Catalog`]: one connection behind a mutex (the server's sessions share it; each call
//! is short), to a SQLite file in WAL mode or to PostgreSQL, every statement prepared once and
//! bound with parameters.

use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::Connection;

use crate::db::{args, transaction, Conn, Db, Row};
use crate::later::{Later, Tracker};
use crate::pg::Pg;
use crate::schema::{self, MAX_ADDRESS, MAX_ATTR, MAX_PATH, MAX_UNIT, MAX_VALUE};
use crate::{
    bounded, now_ns, under, Avu, CatalogError, Commit, Location, Object, Reconciled, Replica,
    ReplicaState, Stat,
};

/// A catalog, opened and migrated to the newest schema.
pub struct Catalog {
    pub(crate) shared: Arc<Shared>,
    pub(crate) later: Later,
    /// The file system its file is on (`st_dev`); `None` in memory.
    device: Option<u64>,
    /// Whether several servers may share it (each then registers its own replicas).
    shared_location: bool,
}

/// What the catalog's callers and its registering thread ([`Later`]) share.
pub(crate) struct Shared {
    pub(crate) conn: Mutex<Conn>,
    /// Where this server's intents are kept when not in `conn`: a SQLite file beside its data
    /// ([`Catalog::open_with_local_intents`]), so that a PostgreSQL catalog's intents cost the
    /// put no round trip to the database and no commit of their own.
    local: Option<Mutex<Conn>>,
    /// The local intents' file, for an error that names it.
    local_file: Option<std::path::PathBuf>,
    /// This server's name in `replicas`.
    server: String,
    pub(crate) tracker: Tracker,
    /// How many good replicas a path's policy wants ([`Catalog::set_wanted`]); none set: one.
    pub(crate) wanted: std::sync::RwLock<Option<crate::owed::Wanted>>,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog")
            .field("server", &self.shared.server)
            .finish_non_exhaustive()
    }
}

impl Catalog {
    /// Opens (creating if need be) the catalog at `location`; `server` names this server's
    /// replicas.
    pub fn open(location: &Location, server: &str) -> Result<Self, CatalogError> {
        Self::open_with(location, server, None)
    }

    /// As [`Self::open`], a PostgreSQL catalog keeping this server's intents in the SQLite
    /// file `intents` (created if missing; the server's state directory) instead of the
    /// database: an intent is one server's own business (only it reconciles them, at its
    /// start), and kept beside its data it is written without a round trip and made durable
    /// by the batch's own `syncfs` ([`Self::intend_unsynced`]). Intents an older build left
    /// in the database are reconciled too. A SQLite catalog keeps them in its own file, as
    /// [`Self::open`] does.
    pub fn open_with_local_intents(
        location: &Location,
        server: &str,
        intents: &std::path::Path,
    ) -> Result<Self, CatalogError> {
        let local = matches!(location, Location::Postgres(_)).then_some(intents);
        Self::open_with(location, server, local)
    }

    fn open_with(
        location: &Location,
        server: &str,
        intents: Option<&std::path::Path>,
    ) -> Result<Self, CatalogError> {
        bounded("server name", server, MAX_ATTR, false)?;
        let (mut conn, mut device) = match location {
            Location::Sqlite(path) => {
                let conn = sqlite(Connection::open(path)?)?;
                (conn, std::fs::metadata(path).ok().map(|m| m.dev()))
            }
            Location::Memory => (sqlite(Connection::open_in_memory()?)?, None),
            Location::Postgres(url) => (Conn::Postgres(Pg::connect(url)?), None),
        };
        schema::migrate(&mut conn)?;
        // The same schema as an embedded catalog's (its `pending` and `roots` are used).
        let local = match intents {
            Some(path) => {
                let mut local = sqlite(Connection::open(path)?)?;
                schema::migrate(&mut local)?;
                device = std::fs::metadata(path).ok().map(|m| m.dev());
                Some(Mutex::new(local))
            }
            None => None,
        };
        Ok(Self {
            shared: Arc::new(Shared {
                conn: Mutex::new(conn),
                local,
                local_file: intents.map(std::path::Path::to_path_buf),
                server: server.to_owned(),
                tracker: Tracker::default(),
                wanted: std::sync::RwLock::default(),
            }),
            later: Later::default(),
            device,
            shared_location: location.is_shared(),
        })
    }

    /// Whether this catalog is one that several servers may share (PostgreSQL).
    pub fn is_shared(&self) -> bool {
        self.shared_location
    }

    /// The file system (`st_dev`) the catalog's intents are on (its own file, or the local
    /// intents' file); `None` for one in memory or a PostgreSQL catalog keeping its intents.
    pub fn device(&self) -> Option<u64> {
        self.device
    }

    /// Records that this server's paths are relative to `root`, or checks that they were:
    /// a catalog kept for another root of the same server is refused.
    pub fn claim_root(&self, root: &str) -> Result<(), CatalogError> {
        bounded("root", root, MAX_PATH, false)?;
        claim(&mut self.lock(), &self.shared.server, root)?;
        // The local intents are this root's too: a state directory's intents file kept for
        // another root is refused, never reconciled against this one.
        if let Some(local) = &self.shared.local {
            match claim(&mut lock(local), &self.shared.server, root) {
                Err(CatalogError::OtherRoot { recorded, asked }) => {
                    return Err(CatalogError::IntentsElsewhere {
                        file: self
                            .shared
                            .local_file
                            .as_deref()
                            .map_or_else(String::new, |p| p.display().to_string()),
                        recorded,
                        asked,
                    })
                }
                r => r?,
            }
        }
        Ok(())
    }

    /// Records where this server is reachable (`host:port`, empty: unknown), shown with its
    /// replicas in `stat` so that a client can fetch them from here. After [`Self::claim_root`].
    pub fn advertise(&self, address: &str) -> Result<(), CatalogError> {
        bounded("address", address, MAX_ADDRESS, true)?;
        self.lock().run(
            "UPDATE roots SET address = ?2 WHERE server = ?1",
            args![&self.shared.server, address],
        )?;
        Ok(())
    }

    /// Records where `server`, a server of another catalog that a `repl` made a copy on, is
    /// reachable. A server that claimed a root in this catalog keeps the address it gave
    /// itself; this server's own name is skipped.
    pub fn note_address(&self, server: &str, address: &str) -> Result<(), CatalogError> {
        bounded("server name", server, MAX_ATTR, false)?;
        bounded("address", address, MAX_ADDRESS, false)?;
        if server == self.server() {
            return Ok(());
        }
        self.lock().run(
            "INSERT INTO roots (server, root, address) VALUES (?1, '', ?2)
             ON CONFLICT (server) DO UPDATE SET address = excluded.address
             WHERE roots.root = ''",
            args![server, address],
        )?;
        Ok(())
    }

    /// The schema version this catalog is at.
    pub fn schema_version(&self) -> Result<i64, CatalogError> {
        self.lock()
            .one("SELECT MAX(version) FROM catalog_migrations", &[])?
            .int(0)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Conn> {
        self.shared.lock()
    }

    /// This server's name in `replicas`.
    pub fn name(&self) -> &str {
        &self.shared.server
    }

    /// This server's name in `replicas`.
    pub(crate) fn server(&self) -> &str {
        &self.shared.server
    }

    /// Records that `files` are about to be renamed into place, in one durable transaction:
    /// a crash after the renames leaves these for [`Self::reconcile`].
    pub fn intend(&self, files: &[Commit]) -> Result<(), CatalogError> {
        for f in files {
            check_commit(f)?;
        }
        self.no_backlog()?;
        let mut conn = self.shared.intents();
        conn.durable(true)?;
        let done = write_intents(&mut conn, &self.shared.server, files);
        conn.durable(false)?;
        done
    }

    /// As [`Self::intend`], without a sync of its own: the intents are in the operating
    /// system's cache when it returns (a killed process loses none), and on disk once the
    /// caller has synced the file system [`Self::device`] names, which it must do before the
    /// renames the intents announce. A batch's `syncfs` then makes its data and its intents
    /// durable in one flush instead of two in series.
    pub fn intend_unsynced(&self, files: &[Commit]) -> Result<(), CatalogError> {
        for f in files {
            check_commit(f)?;
        }
        self.no_backlog()?;
        write_intents(&mut self.shared.intents(), &self.shared.server, files)
    }

    /// Registers `files` as stored here (a good replica on this server), replacing what was
    /// registered under their paths, and clears their intents: one transaction, after the
    /// registrations queued before it.
    pub fn register(&self, files: &[Commit]) -> Result<(), CatalogError> {
        self.settled();
        self.shared.register(files)
    }

    /// Registers `files` as new objects stored here, many rows to a statement: the rows
    /// [`Self::register`] writes for a path not registered yet (the object, and this server's
    /// replica, good), without intents, for loading a fresh catalog fast (an import, the
    /// catalog bench). One transaction; a path registered already is refused (its unique
    /// index) and nothing is written. Nor does it owe replicas to a policy ([`Self::set_wanted`]):
    /// a catalog loaded so has its policies applied by no one until its objects are registered.
    pub fn register_new(&self, files: &[Commit]) -> Result<(), CatalogError> {
        for f in files {
            check_commit(f)?;
        }
        self.settled();
        let at = now_ns();
        let server = self.server();
        transaction(&mut *self.lock(), |tx| {
            for chunk in files.chunks(BULK_ROWS) {
                let mut a = Vec::with_capacity(chunk.len() * 7);
                for f in chunk {
                    a.extend_from_slice(args![
                        &f.path,
                        size_i64(f.size),
                        f.mtime_ns,
                        &f.digest,
                        &f.algo,
                        &f.stored_by,
                        at
                    ]);
                }
                let sql = format!(
                    "INSERT INTO objects (path, size, mtime_ns, digest, algo, stored_by, stored_at)
                     VALUES {} RETURNING id, path",
                    values(7, chunk.len(), "")
                );
                let mut ids = std::collections::HashMap::with_capacity(chunk.len());
                for mut r in tx.rows(&sql, &a)? {
                    let id = r.int(0)?;
                    ids.insert(r.text(1)?, id);
                }
                let mut a = Vec::with_capacity(chunk.len() * 3);
                for f in chunk {
                    let id = *ids
                        .get(&f.path)
                        .ok_or_else(|| CatalogError::NotFound(f.path.clone()))?;
                    a.extend_from_slice(args![id, server, &f.physical]);
                }
                let sql = format!(
                    "INSERT INTO replicas (object, server, physical, state) VALUES {}",
                    values(3, chunk.len(), ", 'good'")
                );
                tx.run(&sql, &a)?;
            }
            Ok(())
        })
    }

    /// Registers one file (see [`Self::register`]).
    pub fn register_commit(&self, file: &Commit) -> Result<(), CatalogError> {
        self.register(std::slice::from_ref(file))
    }

    /// This server's intents left by a crash, in path order: those in the catalog (all of
    /// them, or those an older build left in a PostgreSQL one), then the local ones.
    pub fn pending(&self) -> Result<Vec<Commit>, CatalogError> {
        self.settled();
        let mut all = pending_in(&mut self.lock(), &self.shared.server)?;
        if let Some(local) = &self.shared.local {
            all.extend(pending_in(&mut lock(local), &self.shared.server)?);
        }
        Ok(all)
    }

    /// Settles this server's intents a crash left: each whose file `is_there` (under its final name,
    /// whole) is registered, every other dropped. Looks at the intents only, never the tree.
    /// The catalog's own intents are settled in the catalog's transaction; the local ones are
    /// cleared only once it has committed (a crash between leaves them to register again).
    pub fn reconcile(
        &self,
        is_there: impl Fn(&Commit) -> bool,
    ) -> Result<Reconciled, CatalogError> {
        self.settled();
        let server = &self.shared.server;
        let kept = pending_in(&mut self.lock(), server)?;
        let local = match &self.shared.local {
            Some(l) => pending_in(&mut lock(l), server)?,
            None => Vec::new(),
        };
        let at = now_ns();
        let wanted = self.shared.wanted_fn();
        let (kept_there, kept_gone): (Vec<Commit>, Vec<Commit>) =
            kept.into_iter().partition(&is_there);
        let (local_there, local_gone): (Vec<Commit>, Vec<Commit>) =
            local.into_iter().partition(&is_there);
        // A path in both: the local intent is the newer (written since the upgrade), so it
        // is registered last.
        let there: Vec<Commit> = kept_there.into_iter().chain(local_there.clone()).collect();
        let done = transaction(&mut *self.lock(), |tx| {
            let mut done = Reconciled::default();
            let ids = register_many(tx, server, &there, at, true)?;
            for (c, id) in there.iter().zip(ids) {
                crate::owed::owe_in(tx, server, wanted.as_ref(), id, &c.path, at)?;
                done.registered += 1;
            }
            for c in &kept_gone {
                drop_intent(tx, server, &c.path)?;
                done.dropped += 1;
            }
            Ok(done)
        })?;
        if let Some(l) = &self.shared.local {
            transaction(&mut *lock(l), |tx| {
                for run in unique_runs(&local_there) {
                    clear_intents(tx, server, run)?;
                }
                for c in &local_gone {
                    drop_intent(tx, server, &c.path)?;
                }
                Ok(())
            })?;
        }
        Ok(Reconciled {
            dropped: done.dropped + local_gone.len() as u64,
            ..done
        })
    }

    /// Everything known of `path`, or `None` when it is not registered.
    pub fn stat(&self, path: &str) -> Result<Option<Stat>, CatalogError> {
        self.settled();
        let mut conn = self.lock();
        let row = conn.row(
            "SELECT id, path, size, mtime_ns, digest, algo, stored_by, stored_at
             FROM objects WHERE path = ?1",
            args![path],
        )?;
        let Some(mut row) = row else {
            return Ok(None);
        };
        let id = row.int(0)?;
        let object = object_at(&mut row, 1)?;
        let replicas = conn
            .rows(
                "SELECT r.server, r.physical, r.state, COALESCE(s.address, ''),
                        COALESCE(r.path, '')
                 FROM replicas r LEFT JOIN roots s ON s.server = r.server
                 WHERE r.object = ?1 ORDER BY r.server",
                args![id],
            )?
            .into_iter()
            .map(|mut r| {
                Ok(Replica {
                    server: r.text(0)?,
                    physical: r.text(1)?,
                    state: ReplicaState::parse(&r.text(2)?),
                    address: r.text(3)?,
                    path: Some(r.text(4)?).filter(|p| !p.is_empty()),
                })
            })
            .collect::<Result<_, CatalogError>>()?;
        let metadata = avus(&mut conn, id)?;
        Ok(Some(Stat {
            object,
            replicas,
            metadata,
        }))
    }

    /// Forgets `path`; whether it was registered.
    pub fn remove(&self, path: &str) -> Result<bool, CatalogError> {
        self.settled();
        transaction(&mut *self.lock(), |tx| {
            Ok(forget(tx, "path = ?1", args![path])? > 0)
        })
    }

    /// Forgets every object under the directory `prefix` (and `prefix` itself, were it a
    /// file); how many. A few statements over the path index's range, whatever the count.
    pub fn remove_prefix(&self, prefix: &str) -> Result<u64, CatalogError> {
        self.settled();
        let (lo, hi) = under(prefix);
        transaction(&mut *self.lock(), |tx| {
            let n = forget(tx, "path >= ?1 AND path < ?2", args![&lo, &hi])?;
            Ok(n + forget(tx, "path = ?1", args![prefix.trim_end_matches('/')])?)
        })
    }

    /// Renames an object, or a directory's worth (everything under `from/`), to `to`; how
    /// many objects moved. Refuses when `to` is registered already. What this server owed
    /// for the old paths goes; the new paths owe what their policy wants of them.
    pub fn rename(&self, from: &str, to: &str) -> Result<u64, CatalogError> {
        bounded("path", to, MAX_PATH, false)?;
        let from = from.trim_end_matches('/');
        let to = to.trim_end_matches('/');
        self.settled();
        let wanted = self.shared.wanted_fn();
        let at = now_ns();
        transaction(&mut *self.lock(), |tx| {
            let (tlo, thi) = under(to);
            let taken = tx
                .row("SELECT 1 FROM objects WHERE path = ?1", args![to])?
                .is_some()
                || tx
                    .row(
                        "SELECT 1 FROM objects WHERE path >= ?1 AND path < ?2 LIMIT 1",
                        args![&tlo, &thi],
                    )?
                    .is_some();
            if taken {
                return Err(CatalogError::Exists(to.to_owned()));
            }
            let (lo, hi) = under(from);
            let from_chars = i64::try_from(from.chars().count() + 1).unwrap_or(i64::MAX);
            // Only this server's files move; another server's copy stays where it was. A
            // server of another catalog is a record here: its replica keeps the old path as
            // its own (a replica's own path, migration 7), where a get fetches it. A server of
            // this shared catalog keeps its replicas at the objects' paths (its verify, puts,
            // rm and policies know them there): its copy is no longer this object's, so it is
            // stale until replicated again.
            let other_copies = match self.is_shared() {
                true => {
                    "UPDATE replicas SET state = 'stale'
                         WHERE server <> ?1 AND state = 'good'
                           AND object IN (SELECT id FROM objects
                                          WHERE path = ?2 OR (path >= ?3 AND path < ?4))"
                }
                false => {
                    "UPDATE replicas
                          SET path = (SELECT o.path FROM objects o WHERE o.id = replicas.object)
                          WHERE server <> ?1 AND (path IS NULL OR path = '')
                            AND object IN (SELECT id FROM objects
                                           WHERE path = ?2 OR (path >= ?3 AND path < ?4))"
                }
            };
            tx.run(other_copies, args![self.server(), from, &lo, &hi])?;
            // This server's copies moved: their physical paths (its root, then the object's
            // path) end in the new path.
            tx.run(
                "UPDATE replicas
                 SET physical = (SELECT substr(replicas.physical, 1,
                                               length(replicas.physical) - length(o.path))
                                        || ?5 || substr(o.path, ?6)
                                 FROM objects o WHERE o.id = replicas.object)
                 WHERE server = ?1
                   AND object IN (SELECT id FROM objects
                                  WHERE path = ?2 OR (path >= ?3 AND path < ?4))
                   AND (SELECT substr(replicas.physical,
                                      length(replicas.physical) - length(o.path) + 1) = o.path
                        FROM objects o WHERE o.id = replicas.object)",
                args![self.server(), from, &lo, &hi, to, from_chars],
            )?;
            let mut n = tx.run(
                "UPDATE objects SET path = ?2 WHERE path = ?1",
                args![from, to],
            )?;
            // The part after `from` is kept: `substr` counts characters, so the cut is by the
            // character length of `from/`.
            n += tx.run(
                "UPDATE objects SET path = ?3 || substr(path, ?4)
                 WHERE path >= ?1 AND path < ?2",
                args![&lo, &hi, to, from_chars],
            )?;
            if n == 0 {
                return Err(CatalogError::NotFound(from.to_owned()));
            }
            // A copy pinned at the path an object now has again (moved back) is at the
            // object's path: its own path is dropped, as a repl to the same path records it.
            // Only records are pinned, and a shared catalog takes none.
            if !self.is_shared() {
                tx.run(
                    "UPDATE replicas SET path = NULL
                     WHERE path = (SELECT o.path FROM objects o WHERE o.id = replicas.object)
                       AND object IN (SELECT id FROM objects
                                      WHERE path = ?1 OR (path >= ?2 AND path < ?3))",
                    args![to, &tlo, &thi],
                )?;
            }
            // What was owed follows the policy of where the objects are now: the old paths'
            // debts go (another prefix may want fewer copies, or none), and each moved object
            // this server holds good owes what its new path's policy wants beyond the good
            // copies it has (counted wherever they are, as a registration counts them); one
            // it does not hold is another server's to copy.
            tx.run(
                "DELETE FROM owed WHERE server = ?1 AND (path = ?2 OR (path >= ?3 AND path < ?4))",
                args![self.server(), from, &lo, &hi],
            )?;
            if let Some(wanted) = &wanted {
                let moved = tx.rows(
                    "SELECT o.id, o.path FROM objects o
                     JOIN replicas r ON r.object = o.id AND r.server = ?4 AND r.state = 'good'
                     WHERE o.path = ?1 OR (o.path >= ?2 AND o.path < ?3)",
                    args![to, &tlo, &thi, self.server()],
                )?;
                for mut r in moved {
                    let (id, path) = (r.int(0)?, r.text(1)?);
                    crate::owed::owe_in(tx, self.server(), Some(wanted), id, &path, at)?;
                }
            }
            Ok(n)
        })
    }

    /// Sets a metadata entry on `path` (a second value of the same attribute is added beside
    /// the first, as in iRODS; the same value again replaces its unit).
    pub fn meta_set(&self, path: &str, avu: &Avu) -> Result<(), CatalogError> {
        self.settled();
        check_avu(avu)?;
        let mut conn = self.lock();
        let num = avu
            .value
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|n| n.is_finite());
        // The object is looked up in the insert itself, under a lock a delete waits for
        // (`forget`): an entry is never written for an object another server is removing.
        let sql = format!(
            "INSERT INTO metadata (object, attr, value, unit, num)
             SELECT id, ?2, ?3, ?4, CAST(?5 AS DOUBLE PRECISION) FROM objects
             WHERE path = ?1{}
             ON CONFLICT (object, attr, value) DO UPDATE SET unit = excluded.unit",
            key_share(&conn)
        );
        let n = conn.run(&sql, args![path, &avu.attr, &avu.value, &avu.unit, num])?;
        if n == 0 {
            return Err(CatalogError::NotFound(path.to_owned()));
        }
        Ok(())
    }

    /// Removes `attr` from `path` (only the entry with `value` when given); how many entries.
    pub fn meta_rm(
        &self,
        path: &str,
        attr: &str,
        value: Option<&str>,
    ) -> Result<u64, CatalogError> {
        self.settled();
        let mut conn = self.lock();
        let id = object_id(&mut conn, path)?;
        match value {
            Some(v) => conn.run(
                "DELETE FROM metadata WHERE object = ?1 AND attr = ?2 AND value = ?3",
                args![id, attr, v],
            ),
            None => conn.run(
                "DELETE FROM metadata WHERE object = ?1 AND attr = ?2",
                args![id, attr],
            ),
        }
    }

    /// The metadata of `path`, by attribute then value.
    pub fn meta_ls(&self, path: &str) -> Result<Vec<Avu>, CatalogError> {
        self.settled();
        let mut conn = self.lock();
        let id = object_id(&mut conn, path)?;
        avus(&mut conn, id)
    }

    /// The registered `algo` digest of `path`, if it was registered with exactly this size
    /// and mtime and this server's replica of it is good: what a comparison by content
    /// (`sync --checksum`, a re-run's proof) takes instead of reading the file. A file changed
    /// behind ferry's back with its size and mtime kept is for an audit (`verify`) to find.
    pub fn known_digest(
        &self,
        path: &str,
        size: u64,
        mtime_ns: i64,
        algo: &str,
    ) -> Result<Option<Vec<u8>>, CatalogError> {
        let Ok(size) = i64::try_from(size) else {
            return Ok(None);
        };
        let row = self.lock().row(
            "SELECT o.digest FROM objects o JOIN replicas r ON r.object = o.id
             WHERE o.path = ?1 AND o.size = ?2 AND o.mtime_ns = ?3 AND o.algo = ?4
               AND r.server = ?5 AND r.state = 'good'",
            args![path, size, mtime_ns, algo, &self.shared.server],
        )?;
        row.map(|mut r| r.blob(0)).transpose()
    }

    /// How many objects are registered.
    pub fn count(&self) -> Result<u64, CatalogError> {
        self.settled();
        let n = self
            .lock()
            .one("SELECT COUNT(*) FROM objects", &[])?
            .int(0)?;
        Ok(size_u64(n))
    }
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Conn> {
        lock(&self.conn)
    }

    /// See [`Catalog::register`].
    pub(crate) fn register(&self, files: &[Commit]) -> Result<(), CatalogError> {
        for f in files {
            check_commit(f)?;
        }
        let at = now_ns();
        let wanted = self.wanted_fn();
        transaction(&mut *self.lock(), |tx| {
            let ids = register_many(tx, &self.server, files, at, self.local.is_none())?;
            if wanted.is_some() {
                for (f, id) in files.iter().zip(ids) {
                    crate::owed::owe_in(tx, &self.server, wanted.as_ref(), id, &f.path, at)?;
                }
            }
            Ok(())
        })?;
        // Cleared once the registration has committed, without a sync: an intent that outlives
        // a crash is registered again at the next start, to the same rows.
        if let Some(local) = &self.local {
            transaction(&mut *lock(local), |tx| {
                for run in unique_runs(files) {
                    clear_intents(tx, &self.server, run)?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Where this server's intents are written: the local file, else the catalog.
    fn intents(&self) -> MutexGuard<'_, Conn> {
        match &self.local {
            Some(local) => lock(local),
            None => self.lock(),
        }
    }
}

/// Rows to one statement of [`Catalog::register_new`]: 3,500 parameters, under either
/// database's limit.
const BULK_ROWS: usize = 500;

/// `rows` groups of `width` numbered parameters, each followed by the fixed `tail`:
/// `(?1, ?2, 'good'), (?3, ?4, 'good')`. Only numbers and the caller's constant, never input.
fn values(width: usize, rows: usize, tail: &str) -> String {
    numbered(0, width, rows, tail)
}

/// Opens SQLite the catalog's way. WAL: readers never wait for the writer. NORMAL: a commit
/// is not synced on its own (a checkpoint is); `intend` alone asks for FULL unless the caller's
/// sync covers it (`intend_unsynced`), and that sync covers the registrations before it (one
/// lost with the power is redone from its intent). A page cache of up to 64 MiB (SQLite's
/// default is 2 MiB): a subtree's `rm -r` changes pages all over the mtime and size indexes,
/// and with 2 MiB they spilled to the WAL and were read back within the one transaction
/// (1.5 s of system time of a 100,000-object delete at 1M, 0.1 s with 64 MiB).
pub(crate) fn sqlite(conn: Connection) -> Result<Conn, CatalogError> {
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", true)?;
    conn.pragma_update(None, "cache_size", -65_536)?;
    // The registration's statements, one per size and kind, besides the catalog's others.
    conn.set_prepared_statement_cache_capacity(128);
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    Ok(Conn::Sqlite(conn))
}

/// The intents of `files`, in one transaction: a statement for up to 256 of them ([`RUN_SIZES`])
/// (a statement per file cost a PostgreSQL catalog a round trip per file on the finalizer's
/// path). A path twice in `files` keeps its last intent, as one statement each would.
fn write_intents(conn: &mut Conn, server: &str, files: &[Commit]) -> Result<(), CatalogError> {
    let since = now_ns();
    transaction(conn, |tx| {
        for chunk in unique_runs(files) {
            let mut a = Vec::with_capacity(2 + chunk.len() * 7);
            a.extend_from_slice(args![since, server]);
            for f in chunk {
                a.extend_from_slice(args![
                    &f.path,
                    size_i64(f.size),
                    f.mtime_ns,
                    &f.digest,
                    &f.algo,
                    &f.stored_by,
                    &f.physical
                ]);
            }
            tx.run(
                &format!(
                    "INSERT INTO pending
                         (path, size, mtime_ns, digest, algo, stored_by, physical, since, server)
                     VALUES {}
                     ON CONFLICT (server, path) DO UPDATE SET size = excluded.size,
                         mtime_ns = excluded.mtime_ns, digest = excluded.digest,
                         algo = excluded.algo, stored_by = excluded.stored_by,
                         physical = excluded.physical, since = excluded.since",
                    numbered(2, 7, chunk.len(), ", ?1, ?2")
                ),
                &a,
            )?;
        }
        Ok(())
    })
}

/// `files` in runs in which no path is twice, in order, each of one of [`RUN_SIZES`]: one
/// statement may not upsert a row twice (PostgreSQL refuses it), and a path's later commit
/// must land after its earlier one.
fn unique_runs(files: &[Commit]) -> Vec<&[Commit]> {
    let mut runs = Vec::new();
    let mut start = 0;
    let mut seen = std::collections::HashSet::new();
    for (i, f) in files.iter().enumerate() {
        if i - start == RUN_SIZES[0] || !seen.insert(f.path.as_str()) {
            runs.extend(sized(&files[start..i]));
            start = i;
            seen.clear();
            seen.insert(f.path.as_str());
        }
    }
    runs.extend(sized(&files[start..]));
    runs
}

/// The row counts of the statements that register a put's files: a run of any length goes
/// as a few statements of these sizes (255 rows as 12), so that each database keeps one
/// prepared statement per size and kind, instead of parsing (and PostgreSQL planning) a new
/// text for each count a batch happened to have (SQLite's `prepare` was 3.6 % of the server's
/// samples in a tiny-tree put's profile; notebook "Issue 39: the catalog's tiny-tree cost,
/// quiet, with fixed-size registration statements"). 256 rows of 7 parameters: under either
/// database's limit.
const RUN_SIZES: [usize; 5] = [256, 64, 16, 4, 1];

/// `items` cut into runs of [`RUN_SIZES`], largest first, in order.
fn sized<T>(mut items: &[T]) -> Vec<&[T]> {
    let mut runs = Vec::new();
    while !items.is_empty() {
        let n = RUN_SIZES
            .iter()
            .copied()
            .find(|&n| n <= items.len())
            .unwrap_or(1);
        let (run, rest) = items.split_at(n);
        runs.push(run);
        items = rest;
    }
    runs
}

/// As [`values`], the parameters numbered from `first + 1`: `numbered(2, 2, 2, "")` is
/// `(?3, ?4), (?5, ?6)`, leaving `?1` and `?2` for what every row shares.
fn numbered(first: usize, width: usize, rows: usize, tail: &str) -> String {
    let mut s = String::with_capacity(rows * (width * 7 + tail.len() + 4));
    for r in 0..rows {
        if r > 0 {
            s.push_str(", ");
        }
        s.push('(');
        for c in 0..width {
            if c > 0 {
                s.push_str(", ");
            }
            s.push_str(&format!("?{}", first + r * width + c + 1));
        }
        s.push_str(tail);
        s.push(')');
    }
    s
}

/// `?first+1, ?first+2, …` for an `IN` list of `n`.
fn listed(first: usize, n: usize) -> String {
    (first + 1..=first + n)
        .map(|i| format!("?{i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Registers `files` as stored here, each upserting its object and this server's replica and
/// clearing its intent, a few statements for up to 256 of them ([`RUN_SIZES`]) instead of five a
/// file (one PostgreSQL round trip each: 5.4 s of a 10,000-file put's 6.8, notebook "Issue
/// 39: the catalog's cost on the tiny tree, quiet, statements per batch"): the objects of
/// these paths are read (and, on PostgreSQL, locked against another server's change) at once;
/// those with the same contents keep their row, the others are upserted and the other
/// servers' replicas of them made stale (on SQLite only for an overwrite); this server's
/// replicas are upserted; the intents of exactly these contents are cleared: a statement of
/// each kind per run of [`RUN_SIZES`], prepared once per connection. Returns the objects' ids
/// in `files`' order.
fn register_many(
    tx: &mut Conn,
    server: &str,
    files: &[Commit],
    at: i64,
    clear: bool,
) -> Result<Vec<i64>, CatalogError> {
    use std::collections::HashMap;
    let mut ids = Vec::with_capacity(files.len());
    for chunk in unique_runs(files) {
        let paths: Vec<crate::db::Arg<'_>> = chunk.iter().map(|f| (&f.path).into()).collect();
        let mut same: HashMap<String, i64> = HashMap::with_capacity(chunk.len());
        let mut existing: std::collections::HashSet<&str> = std::collections::HashSet::new();
        let rows = tx.rows(
            &format!(
                "SELECT id, path, size, mtime_ns, digest, algo FROM objects WHERE path IN ({}){}",
                listed(0, chunk.len()),
                no_key_update(tx)
            ),
            &paths,
        )?;
        let by_path: HashMap<&str, &Commit> = chunk.iter().map(|f| (f.path.as_str(), f)).collect();
        for mut r in rows {
            let (id, path) = (r.int(0)?, r.text(1)?);
            let (size, mtime, digest, algo) = (r.int(2)?, r.int(3)?, r.blob(4)?, r.text(5)?);
            if let Some((&key, f)) = by_path.get_key_value(path.as_str()) {
                if size == size_i64(f.size)
                    && mtime == f.mtime_ns
                    && digest == f.digest
                    && algo == f.algo
                {
                    same.insert(path, id);
                } else {
                    existing.insert(key);
                }
            }
        }
        let changed: Vec<&Commit> = chunk
            .iter()
            .filter(|f| !same.contains_key(&f.path))
            .collect();
        let mut upserted: HashMap<String, i64> = HashMap::with_capacity(changed.len());
        for run in sized(&changed) {
            let mut a = Vec::with_capacity(1 + run.len() * 6);
            a.extend_from_slice(args![at]);
            for f in run {
                a.extend_from_slice(args![
                    &f.path,
                    size_i64(f.size),
                    f.mtime_ns,
                    &f.digest,
                    &f.algo,
                    &f.stored_by
                ]);
            }
            let sql = format!(
                "INSERT INTO objects (path, size, mtime_ns, digest, algo, stored_by, stored_at)
                 VALUES {}
                 ON CONFLICT (path) DO UPDATE SET size = excluded.size,
                     mtime_ns = excluded.mtime_ns, digest = excluded.digest, algo = excluded.algo,
                     stored_by = excluded.stored_by, stored_at = excluded.stored_at
                 RETURNING id, path",
                numbered(1, 6, run.len(), ", ?1")
            );
            for mut r in tx.rows(&sql, &a)? {
                let id = r.int(0)?;
                upserted.insert(r.text(1)?, id);
            }
        }
        // A new copy here makes the other servers' copies stale until they are replicated
        // again. On SQLite (one server, its one connection) an object the read above did not
        // find is new and has no other copies; on PostgreSQL another server of the zone may
        // have registered it and its copy since that read (its new row is not locked by it),
        // so every upserted object is looked at.
        let sole_writer = matches!(tx, Conn::Sqlite(_));
        let overwritten: Vec<i64> = changed
            .iter()
            .filter(|f| !sole_writer || existing.contains(f.path.as_str()))
            .filter_map(|f| upserted.get(&f.path).copied())
            .collect();
        for run in sized(&overwritten) {
            let mut a = Vec::with_capacity(1 + run.len());
            a.push(server.into());
            a.extend(run.iter().map(|&id| crate::db::Arg::Int(id)));
            tx.run(
                &format!(
                    "UPDATE replicas SET state = 'stale' WHERE server <> ?1 AND object IN ({})",
                    listed(1, run.len())
                ),
                &a,
            )?;
        }
        let mut chunk_ids = Vec::with_capacity(chunk.len());
        for f in chunk {
            let id = same
                .get(&f.path)
                .or_else(|| upserted.get(&f.path))
                .copied()
                .ok_or_else(|| CatalogError::NotFound(f.path.clone()))?;
            chunk_ids.push(id);
        }
        let mut a = Vec::with_capacity(1 + chunk.len() * 2);
        a.push(server.into());
        for (f, &id) in chunk.iter().zip(&chunk_ids) {
            a.extend_from_slice(args![id, &f.physical]);
        }
        tx.run(
            &format!(
                "INSERT INTO replicas (object, physical, server, state) VALUES {}
                 ON CONFLICT (object, server) DO UPDATE SET physical = excluded.physical,
                     state = 'good', path = NULL",
                numbered(1, 2, chunk.len(), ", ?1, 'good'")
            ),
            &a,
        )?;
        if clear {
            clear_intents(tx, server, chunk)?;
        }
        ids.extend(chunk_ids);
    }
    Ok(ids)
}

/// A connection's lock, taken over a panic's poison (each statement leaves it consistent).
fn lock(conn: &Mutex<Conn>) -> MutexGuard<'_, Conn> {
    conn.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records that `server`'s paths are relative to `root`, or checks that they were. A row with
/// an empty root is this name as another catalog's `repl` record knew it (its address only):
/// the server itself claims it.
fn claim(conn: &mut Conn, server: &str, root: &str) -> Result<(), CatalogError> {
    conn.run(
        "INSERT INTO roots (server, root) VALUES (?1, ?2)
         ON CONFLICT (server) DO UPDATE SET root = excluded.root WHERE roots.root = ''",
        args![server, root],
    )?;
    let recorded = conn
        .one("SELECT root FROM roots WHERE server = ?1", args![server])?
        .text(0)?;
    if recorded != root {
        return Err(CatalogError::OtherRoot {
            recorded,
            asked: root.to_owned(),
        });
    }
    Ok(())
}

/// `server`'s intents in `conn` (with those from before the server column), in path order.
fn pending_in(conn: &mut Conn, server: &str) -> Result<Vec<Commit>, CatalogError> {
    let rows = conn.rows(
        "SELECT path, size, mtime_ns, digest, algo, stored_by, physical
         FROM pending WHERE server IN (?1, '') ORDER BY path",
        args![server],
    )?;
    rows.into_iter()
        .map(|mut r| {
            Ok(Commit {
                path: r.text(0)?,
                size: size_u64(r.int(1)?),
                mtime_ns: r.int(2)?,
                digest: r.blob(3)?,
                algo: r.text(4)?,
                stored_by: r.text(5)?,
                physical: r.text(6)?,
            })
        })
        .collect()
}

/// Drops `server`'s intent of `path` (a file not there to register).
fn drop_intent(tx: &mut Conn, server: &str, path: &str) -> Result<(), CatalogError> {
    tx.run(
        "DELETE FROM pending WHERE server IN (?1, '') AND path = ?2",
        args![server, path],
    )?;
    Ok(())
}

/// Clears the intents of files of distinct paths, only those of exactly these contents (a
/// later put of the same path may have written its own meanwhile): they are read, and deleted
/// in a statement for this server's and one for those from before the server column (`''`).
fn clear_intents(tx: &mut Conn, server: &str, files: &[Commit]) -> Result<(), CatalogError> {
    let mut a = Vec::with_capacity(1 + files.len());
    a.push(server.into());
    a.extend(files.iter().map(|f| crate::db::Arg::from(&f.path)));
    let rows = tx.rows(
        &format!(
            "SELECT server, path, size, mtime_ns, digest FROM pending
             WHERE server IN (?1, '') AND path IN ({})",
            listed(1, files.len())
        ),
        &a,
    )?;
    let by_path: std::collections::HashMap<&str, &Commit> =
        files.iter().map(|f| (f.path.as_str(), f)).collect();
    let (mut here, mut before) = (Vec::new(), Vec::new());
    for mut r in rows {
        let (owner, path) = (r.text(0)?, r.text(1)?);
        let (size, mtime, digest) = (r.int(2)?, r.int(3)?, r.blob(4)?);
        if let Some(f) = by_path.get(path.as_str()) {
            if size == size_i64(f.size) && mtime == f.mtime_ns && digest == f.digest {
                if owner.is_empty() {
                    &mut before
                } else {
                    &mut here
                }
                .push(path);
            }
        }
    }
    for (owner, paths) in [(server, here), ("", before)] {
        for run in sized(&paths) {
            let mut a = Vec::with_capacity(1 + run.len());
            a.push(owner.into());
            a.extend(run.iter().map(crate::db::Arg::from));
            tx.run(
                &format!(
                    "DELETE FROM pending WHERE server = ?1 AND path IN ({})",
                    listed(1, run.len())
                ),
                &a,
            )?;
        }
    }
    Ok(())
}

/// ` FOR KEY SHARE` on PostgreSQL, for a read of the object a replica or metadata row is
/// about to name: the lock that [`forget`]'s delete of the object waits for. SQLite has one
/// writer at a time and no such clause.
fn key_share(conn: &Conn) -> &'static str {
    match conn {
        Conn::Postgres(_) => " FOR KEY SHARE",
        Conn::Sqlite(_) => "",
    }
}

/// ` FOR NO KEY UPDATE` on PostgreSQL, for the registration's read of the objects it may keep:
/// a row of the same contents is kept, so no other server's registration may change it
/// before this one's replica is written (under `FOR KEY SHARE` one could: this server's copy
/// would then be marked good beside the other's contents). Blocks [`forget`]'s delete too.
fn no_key_update(conn: &Conn) -> &'static str {
    match conn {
        Conn::Postgres(_) => " FOR NO KEY UPDATE",
        Conn::Sqlite(_) => "",
    }
}

/// Deletes the objects whose path matches `which` (a fixed condition on `path` with its
/// parameters), their replicas and their metadata, each table in one statement (the schema
/// has no cascade since version 6); how many objects. Within the caller's transaction, so
/// that no replica or metadata row outlives its object.
fn forget(tx: &mut Conn, which: &str, params: &[crate::db::Arg<'_>]) -> Result<u64, CatalogError> {
    if matches!(tx, Conn::Postgres(_)) {
        return forget_shared(tx, which, params);
    }
    tx.run(
        &format!("DELETE FROM replicas WHERE object IN (SELECT id FROM objects WHERE {which})"),
        params,
    )?;
    tx.run(
        &format!("DELETE FROM metadata WHERE object IN (SELECT id FROM objects WHERE {which})"),
        params,
    )?;
    tx.run(&format!("DELETE FROM objects WHERE {which}"), params)
}

/// [`forget`] on a catalog other servers write at the same time. The objects go first: the
/// delete locks each row, so a server adding a replica or metadata entry to one (its read
/// of the object holds [`key_share`]) either finished before, and the deletes below (each
/// a statement of its own, seeing what committed since) take its row too, or waits and then
/// finds no object. The children are deleted by the ids deleted, kept in a temporary table
/// of this connection, never by the path range again: an object put in the range meanwhile
/// keeps its rows.
fn forget_shared(
    tx: &mut Conn,
    which: &str,
    params: &[crate::db::Arg<'_>],
) -> Result<u64, CatalogError> {
    tx.batch(
        "CREATE TEMPORARY TABLE IF NOT EXISTS forgotten (id BIGINT NOT NULL);
         TRUNCATE forgotten",
    )?;
    let n = tx.run(
        &format!(
            "WITH gone AS (DELETE FROM objects WHERE {which} RETURNING id)
             INSERT INTO forgotten (id) SELECT id FROM gone"
        ),
        params,
    )?;
    // Every object has a replica or more: PostgreSQL's planner takes a subtree of a tenth of
    // the catalog for a hash join over all of `replicas` (2.9 s at 1M against 1.1 s for the
    // probes of its primary key, EXPLAIN ANALYZE), which grows with the catalog, not the tree.
    tx.batch("SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off")?;
    tx.run(
        "DELETE FROM replicas WHERE object IN (SELECT id FROM forgotten)",
        &[],
    )?;
    tx.run(
        "DELETE FROM metadata WHERE object IN (SELECT id FROM forgotten)",
        &[],
    )?;
    tx.batch("SET LOCAL enable_hashjoin TO DEFAULT; SET LOCAL enable_mergejoin TO DEFAULT")?;
    Ok(n)
}

/// `server`'s replica of object `id` at `physical`, good, at `path` on its server (`None`:
/// the object's path).
pub(crate) fn upsert_replica(
    tx: &mut Conn,
    id: i64,
    server: &str,
    physical: &str,
    path: Option<&str>,
) -> Result<(), CatalogError> {
    tx.run(
        "INSERT INTO replicas (object, server, physical, state, path)
         VALUES (?1, ?2, ?3, 'good', ?4)
         ON CONFLICT (object, server) DO UPDATE SET physical = excluded.physical,
             state = 'good', path = excluded.path",
        args![id, server, physical, path],
    )?;
    Ok(())
}

fn object_id(conn: &mut Conn, path: &str) -> Result<i64, CatalogError> {
    conn.row("SELECT id FROM objects WHERE path = ?1", args![path])?
        .ok_or_else(|| CatalogError::NotFound(path.to_owned()))?
        .int(0)
}

fn avus(conn: &mut Conn, id: i64) -> Result<Vec<Avu>, CatalogError> {
    conn.rows(
        "SELECT attr, value, unit FROM metadata WHERE object = ?1 ORDER BY attr, value",
        args![id],
    )?
    .into_iter()
    .map(|mut r| {
        Ok(Avu {
            attr: r.text(0)?,
            value: r.text(1)?,
            unit: r.text(2)?,
        })
    })
    .collect()
}

/// Reads an [`Object`] from its seven columns (path to stored_at) starting at `at`.
pub(crate) fn object_at(r: &mut Row, at: usize) -> Result<Object, CatalogError> {
    Ok(Object {
        path: r.text(at)?,
        size: size_u64(r.int(at + 1)?),
        mtime_ns: r.int(at + 2)?,
        digest: r.blob(at + 3)?,
        algo: r.text(at + 4)?,
        stored_by: r.text(at + 5)?,
        stored_at: r.int(at + 6)?,
    })
}

fn check_commit(c: &Commit) -> Result<(), CatalogError> {
    bounded("path", &c.path, MAX_PATH, false)?;
    bounded("algorithm", &c.algo, 16, false)?;
    bounded("token name", &c.stored_by, MAX_ATTR, true)?;
    bounded("physical path", &c.physical, 2 * MAX_PATH, false)?;
    if c.digest.len() > 64 {
        return Err(CatalogError::TooLong {
            what: "digest",
            len: c.digest.len(),
            max: 64,
        });
    }
    Ok(())
}

fn check_avu(a: &Avu) -> Result<(), CatalogError> {
    bounded("attribute", &a.attr, MAX_ATTR, false)?;
    bounded("value", &a.value, MAX_VALUE, true)?;
    bounded("unit", &a.unit, MAX_UNIT, true)
}

/// Sizes are stored as SQL's signed 64-bit integers; no file reaches 2^63 bytes.
pub(crate) fn size_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

pub(crate) fn size_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

#[cfg(test)]
mod runs {
    use super::*;
    use proptest::prelude::*;

    fn commit(path: &str) -> Commit {
        Commit {
            path: path.to_owned(),
            size: 1,
            mtime_ns: 0,
            digest: vec![0; 32],
            algo: "blake3".into(),
            stored_by: String::new(),
            physical: String::new(),
        }
    }

    proptest! {
        /// Every run is of a size a statement is prepared for, holds no path twice, and the
        /// runs together are the files in their order.
        #[test]
        fn runs_are_of_the_prepared_sizes_unique_and_in_order(
            paths in proptest::collection::vec("[a-e]{1,2}", 0..700),
        ) {
            let files: Vec<Commit> = paths.iter().map(|p| commit(p)).collect();
            let runs = unique_runs(&files);
            let mut again = Vec::new();
            for run in &runs {
                prop_assert!(RUN_SIZES.contains(&run.len()), "a run of {}", run.len());
                let distinct: std::collections::HashSet<&str> =
                    run.iter().map(|f| f.path.as_str()).collect();
                prop_assert_eq!(distinct.len(), run.len());
                again.extend(run.iter().map(|f| f.path.clone()));
            }
            prop_assert_eq!(again, paths);
        }
    }

    #[test]
    fn a_long_run_goes_as_few_statements() {
        let files: Vec<Commit> = (0..1024 + 255).map(|i| commit(&format!("f{i}"))).collect();
        let sizes: Vec<usize> = unique_runs(&files).iter().map(|r| r.len()).collect();
        let mut want = vec![256; 4];
        want.extend([64, 64, 64, 16, 16, 16, 4, 4, 4, 1, 1, 1]);
        assert_eq!(sizes, want);
    }
}
