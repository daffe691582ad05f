//! The job store: jobs in SQLite (one connection in WAL mode behind a mutex; each call is
//! short), with versioned migrations in the style of ferry-catalog. The SQL keeps to what
//! PostgreSQL also takes (ids chosen in the transaction, BIGINT times, no SQLite-only
//! functions), so a shared backend can run the same schema later.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use rusqlite::{params, Connection, OptionalExtension, Row};

use crate::error::ServiceError;
use crate::history::{LinkSample, RateSample, Source, MAX_JOB_SAMPLES, MAX_LINK_SAMPLES};
use crate::job::{now_ms, Job, Kind, NewJob, Progress, State, SyncMode};
use crate::optimizer::LinkTuning;

/// Each migration's version and statements; a released version is never edited, only followed.
const MIGRATIONS: &[(i64, &str)] = &[(1, V1), (2, V2), (3, V3)];

const V1: &str = "
CREATE TABLE jobs (
    id            BIGINT PRIMARY KEY,
    kind          TEXT NOT NULL CHECK (kind IN ('put', 'get', 'cp')),
    dest          TEXT NOT NULL,
    sync_mode     TEXT NOT NULL CHECK (sync_mode IN ('off', 'size', 'mtime', 'checksum')),
    priority      BIGINT NOT NULL,
    deadline      BIGINT,
    label         TEXT NOT NULL,
    owner         TEXT NOT NULL,
    server        TEXT NOT NULL,
    state         TEXT NOT NULL
                  CHECK (state IN ('queued', 'running', 'done', 'failed', 'cancelled')),
    attempts      BIGINT NOT NULL,
    files_done    BIGINT NOT NULL,
    files_total   BIGINT NOT NULL,
    bytes_done    BIGINT NOT NULL,
    bytes_total   BIGINT NOT NULL,
    rate          DOUBLE PRECISION NOT NULL,
    last_error    TEXT,
    created_ms    BIGINT NOT NULL,
    started_ms    BIGINT,
    finished_ms   BIGINT,
    not_before_ms BIGINT NOT NULL
);
CREATE INDEX jobs_state ON jobs (state, priority, created_ms);
CREATE INDEX jobs_owner ON jobs (owner, id);

CREATE TABLE job_sources (
    job      BIGINT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    position BIGINT NOT NULL,
    path     TEXT NOT NULL,
    PRIMARY KEY (job, position)
);
";

/// Path history and job rate samples (issue 40). A transfer sample's job is kept as a plain
/// number, not a reference: a link's history outlives what it measured.
const V2: &str = "
CREATE TABLE job_rates (
    job        BIGINT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    t_ms       BIGINT NOT NULL,
    bytes_done BIGINT NOT NULL,
    rate       DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (job, t_ms)
);

CREATE TABLE link_samples (
    id     BIGINT PRIMARY KEY,
    link   TEXT NOT NULL,
    t_ms   BIGINT NOT NULL,
    rate   DOUBLE PRECISION NOT NULL,
    rtt_ms DOUBLE PRECISION,
    loss   DOUBLE PRECISION,
    source TEXT NOT NULL CHECK (source IN ('probe', 'transfer')),
    job    BIGINT
);
CREATE INDEX link_samples_link ON link_samples (link, id);
";

/// What the link optimizer learnt of each link, kept across restarts: its job limit, the
/// streams its transfers settled on, and its rate at each job count (JSON: a map).
const V3: &str = "
CREATE TABLE link_tuning (
    link       TEXT PRIMARY KEY,
    jobs       BIGINT NOT NULL,
    streams    BIGINT NOT NULL,
    rates      TEXT NOT NULL,
    updated_ms BIGINT NOT NULL
);
";

const JOB_COLUMNS: &str = "id, kind, dest, sync_mode, priority, deadline, label, owner, server, \
    state, attempts, files_done, files_total, bytes_done, bytes_total, rate, last_error, \
    created_ms, started_ms, finished_ms, not_before_ms";

/// How many link samples are added between two prunings of the links' oldest.
pub const PRUNE_EVERY: i64 = 64;

/// The most jobs one listing returns.
pub const MAX_LIST: usize = 1000;

/// What a restart did to the jobs a crash left running.
pub const INTERRUPTED: &str = "interrupted: the service stopped while the job ran";

/// The job store, opened and migrated to the newest schema.
pub struct Store {
    conn: Mutex<Connection>,
    /// Samples kept per link ([`MAX_LINK_SAMPLES`]; smaller in unit tests).
    link_bound: usize,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (creating if need be) the store at `path`, or in memory with `None`, and queues
    /// again every job a crash left running: the next run resumes from ferry's partial files.
    pub fn open(path: Option<&Path>) -> Result<Self, ServiceError> {
        let mut conn = match path {
            Some(p) => Connection::open(p)?,
            None => Connection::open_in_memory()?,
        };
        // WAL: the API reads while the scheduler writes. NORMAL: a crash may lose the last
        // progress write, never a job (a submit is a committed transaction).
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", true)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        migrate(&mut conn)?;
        conn.execute(
            "UPDATE jobs SET state = 'queued', last_error = ?1, rate = 0 WHERE state = 'running'",
            params![INTERRUPTED],
        )?;
        Ok(Self {
            conn: Mutex::new(conn),
            link_bound: MAX_LINK_SAMPLES,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a new queued job and returns it.
    pub fn submit(&self, job: &NewJob) -> Result<Job, ServiceError> {
        job.check()?;
        let mut conn = self.lock();
        let tx = conn.transaction()?;
        let id: i64 = tx.query_row("SELECT COALESCE(MAX(id), 0) + 1 FROM jobs", [], |r| {
            r.get(0)
        })?;
        let now = now_ms();
        tx.execute(
            "INSERT INTO jobs (id, kind, dest, sync_mode, priority, deadline, label, owner, \
             server, state, attempts, files_done, files_total, bytes_done, bytes_total, rate, \
             created_ms, not_before_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'queued', 0, 0, 0, 0, 0, 0, ?10, ?10)",
            params![
                id,
                job.kind.as_str(),
                job.dest,
                job.sync.as_str(),
                job.priority,
                job.deadline,
                job.label,
                job.owner,
                job.server,
                now
            ],
        )?;
        for (i, s) in job.sources.iter().enumerate() {
            tx.execute(
                "INSERT INTO job_sources (job, position, path) VALUES (?1, ?2, ?3)",
                params![id, i as i64, s],
            )?;
        }
        tx.commit()?;
        drop(conn);
        self.get(id)?.ok_or(ServiceError::NotFound(id))
    }

    pub fn get(&self, id: i64) -> Result<Option<Job>, ServiceError> {
        get_on(&self.lock(), id)
    }

    /// The newest jobs first, at most `limit` (and [`MAX_LIST`]); only `owner`'s if given.
    pub fn list(&self, owner: Option<&str>, limit: usize) -> Result<Vec<Job>, ServiceError> {
        let limit = limit.min(MAX_LIST) as i64;
        let ids: Vec<i64> = {
            let conn = self.lock();
            let mut st = conn.prepare_cached(
                "SELECT id FROM jobs WHERE (?1 IS NULL OR owner = ?1) ORDER BY id DESC LIMIT ?2",
            )?;
            let rows = st.query_map(params![owner, limit], |r| r.get(0))?;
            rows.collect::<Result<_, _>>()?
        };
        self.jobs(&ids)
    }

    /// Queued jobs whose backoff has passed, in the order they should start: higher priority
    /// first, then older first.
    pub fn runnable(&self, now: i64, limit: usize) -> Result<Vec<Job>, ServiceError> {
        let ids: Vec<i64> = {
            let conn = self.lock();
            let mut st = conn.prepare_cached(
                "SELECT id FROM jobs WHERE state = 'queued' AND not_before_ms <= ?1 \
                 ORDER BY priority DESC, created_ms, id LIMIT ?2",
            )?;
            let rows = st.query_map(params![now, limit as i64], |r| r.get(0))?;
            rows.collect::<Result<_, _>>()?
        };
        self.jobs(&ids)
    }

    /// The jobs `ids` names, under one hold of the lock: a listing taken row by row queued
    /// behind every write in between (docs/bench/NOTEBOOK.md, "Issue 40: the service's p99
    /// and memory").
    fn jobs(&self, ids: &[i64]) -> Result<Vec<Job>, ServiceError> {
        let conn = self.lock();
        let mut out = Vec::with_capacity(ids.len());
        for &id in ids {
            // A job cannot disappear (nothing deletes them); skip one if it ever does.
            if let Some(j) = get_on(&conn, id)? {
                out.push(j);
            }
        }
        Ok(out)
    }

    /// Marks a queued job running and counts the attempt; false if it was no longer queued
    /// (cancelled in between).
    pub fn start(&self, id: i64) -> Result<bool, ServiceError> {
        let n = self.lock().execute(
            "UPDATE jobs SET state = 'running', attempts = attempts + 1, started_ms = ?2, \
             files_done = 0, files_total = 0, bytes_done = 0, bytes_total = 0, rate = 0 \
             WHERE id = ?1 AND state = 'queued'",
            params![id, now_ms()],
        )?;
        Ok(n == 1)
    }

    /// Writes a running job's counters (the scheduler throttles how often).
    pub fn progress(&self, id: i64, p: &Progress) -> Result<(), ServiceError> {
        self.lock()
            .prepare_cached(
                "UPDATE jobs SET files_done = ?2, files_total = ?3, bytes_done = ?4, \
                 bytes_total = ?5, rate = ?6 WHERE id = ?1 AND state = 'running'",
            )?
            .execute(params![
                id,
                p.files_done as i64,
                p.files_total as i64,
                p.bytes_done as i64,
                p.bytes_total as i64,
                p.rate
            ])?;
        Ok(())
    }

    /// Ends a running job as `state` (done or failed); false if it was no longer running
    /// (cancelled while it ran).
    pub fn finish(&self, id: i64, state: State, error: Option<&str>) -> Result<bool, ServiceError> {
        let n = self.lock().execute(
            "UPDATE jobs SET state = ?2, last_error = COALESCE(?3, last_error), \
             finished_ms = ?4, rate = 0 WHERE id = ?1 AND state = 'running'",
            params![id, state.as_str(), error, now_ms()],
        )?;
        Ok(n == 1)
    }

    /// Puts a running job back in the queue after a failed attempt, not to start before
    /// `not_before_ms`; false if it was no longer running.
    pub fn retry_later(
        &self,
        id: i64,
        error: &str,
        not_before_ms: i64,
    ) -> Result<bool, ServiceError> {
        let n = self.lock().execute(
            "UPDATE jobs SET state = 'queued', last_error = ?2, not_before_ms = ?3, rate = 0 \
             WHERE id = ?1 AND state = 'running'",
            params![id, error, not_before_ms],
        )?;
        Ok(n == 1)
    }

    /// Fails a queued job without running it (its deadline passed).
    pub fn expire(&self, id: i64, why: &str) -> Result<bool, ServiceError> {
        let n = self.lock().execute(
            "UPDATE jobs SET state = 'failed', last_error = ?2, finished_ms = ?3 \
             WHERE id = ?1 AND state = 'queued'",
            params![id, why, now_ms()],
        )?;
        Ok(n == 1)
    }

    /// Cancels a queued or running job (the scheduler stops a running one); returns its state
    /// before, or why it cannot be cancelled.
    pub fn cancel(&self, id: i64) -> Result<State, ServiceError> {
        let mut conn = self.lock();
        let tx = conn.transaction()?;
        let state: Option<String> = tx
            .query_row("SELECT state FROM jobs WHERE id = ?1", params![id], |r| {
                r.get(0)
            })
            .optional()?;
        let state = state
            .and_then(|s| State::parse(&s))
            .ok_or(ServiceError::NotFound(id))?;
        if state.is_final() {
            return Err(ServiceError::Ended {
                id,
                state: state.as_str(),
            });
        }
        tx.execute(
            "UPDATE jobs SET state = 'cancelled', finished_ms = ?2, rate = 0 WHERE id = ?1",
            params![id, now_ms()],
        )?;
        tx.commit()?;
        Ok(state)
    }

    /// How many jobs are in each state, for `/metrics`.
    pub fn counts(&self) -> Result<Vec<(State, u64)>, ServiceError> {
        let conn = self.lock();
        let mut st = conn.prepare_cached("SELECT state, COUNT(*) FROM jobs GROUP BY state")?;
        let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
        let mut found = Vec::new();
        for row in rows {
            let (s, n) = row?;
            if let Some(s) = State::parse(&s) {
                found.push((s, n as u64));
            }
        }
        Ok(State::ALL
            .into_iter()
            .map(|s| (s, found.iter().find(|f| f.0 == s).map_or(0, |f| f.1)))
            .collect())
    }
}

impl Store {
    /// Adds a rate sample to job `id`; above [`MAX_JOB_SAMPLES`] every other one is dropped
    /// (the newest kept), so the older part of a long job thins out as it goes on.
    pub fn add_rate(&self, id: i64, s: &RateSample) -> Result<(), ServiceError> {
        let mut conn = self.lock();
        let tx = conn.transaction()?;
        tx.prepare_cached(
            "INSERT INTO job_rates (job, t_ms, bytes_done, rate) VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT DO NOTHING",
        )?
        .execute(params![id, s.t_ms, s.bytes_done as i64, s.rate])?;
        let n: i64 = tx
            .prepare_cached("SELECT COUNT(*) FROM job_rates WHERE job = ?1")?
            .query_row(params![id], |r| r.get(0))?;
        if n as usize > MAX_JOB_SAMPLES {
            let times: Vec<i64> = {
                let mut st =
                    tx.prepare_cached("SELECT t_ms FROM job_rates WHERE job = ?1 ORDER BY t_ms")?;
                let rows = st.query_map(params![id], |r| r.get(0))?;
                rows.collect::<Result<_, _>>()?
            };
            let mut del =
                tx.prepare_cached("DELETE FROM job_rates WHERE job = ?1 AND t_ms = ?2")?;
            // From the second oldest, every other one; the newest always stays.
            for t in times[..times.len() - 1].iter().skip(1).step_by(2) {
                del.execute(params![id, t])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Job `id`'s rate samples, oldest first.
    pub fn rates(&self, id: i64) -> Result<Vec<RateSample>, ServiceError> {
        let conn = self.lock();
        let mut st = conn.prepare_cached(
            "SELECT t_ms, bytes_done, rate FROM job_rates WHERE job = ?1 ORDER BY t_ms",
        )?;
        let rows = st.query_map(params![id], |r| {
            Ok(RateSample {
                t_ms: r.get(0)?,
                bytes_done: r.get::<_, i64>(1)?.max(0) as u64,
                rate: r.get(2)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Adds a sample to `link`'s history; the oldest beyond [`MAX_LINK_SAMPLES`] go (checked
    /// every [`PRUNE_EVERY`] samples).
    pub fn add_link_sample(&self, link: &str, s: &LinkSample) -> Result<(), ServiceError> {
        let mut conn = self.lock();
        let tx = conn.transaction()?;
        let id: i64 = tx.query_row(
            "SELECT COALESCE(MAX(id), 0) + 1 FROM link_samples",
            [],
            |r| r.get(0),
        )?;
        tx.prepare_cached(
            "INSERT INTO link_samples (id, link, t_ms, rate, rtt_ms, loss, source, job) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?
        .execute(params![
            id,
            link,
            s.t_ms,
            s.rate,
            s.rtt_ms,
            s.loss,
            s.source.as_str(),
            s.job
        ])?;
        // Finding a link's cut-off walks its bound of index entries, so it is done every
        // PRUNE_EVERY samples, for every link: a link holds at most that many more.
        if id % PRUNE_EVERY == 0 {
            let links: Vec<String> = {
                let mut st = tx.prepare_cached("SELECT DISTINCT link FROM link_samples")?;
                let rows = st.query_map([], |r| r.get(0))?;
                rows.collect::<Result<_, _>>()?
            };
            // The link's own oldest beyond the bound (none while it has fewer: NULL compares
            // false).
            let mut del = tx.prepare_cached(
                "DELETE FROM link_samples WHERE link = ?1 AND id <= (SELECT id FROM \
                 link_samples WHERE link = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)",
            )?;
            for l in &links {
                del.execute(params![l, self.link_bound as i64])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// `link`'s newest samples taken at or after `since_ms`, at most `limit`, oldest first.
    pub fn link_samples(
        &self,
        link: &str,
        since_ms: i64,
        limit: usize,
    ) -> Result<Vec<LinkSample>, ServiceError> {
        let conn = self.lock();
        let mut st = conn.prepare_cached(
            "SELECT t_ms, rate, rtt_ms, loss, source, job FROM link_samples \
             WHERE link = ?1 AND t_ms >= ?2 ORDER BY id DESC LIMIT ?3",
        )?;
        let rows = st.query_map(params![link, since_ms, limit as i64], |r| {
            let source: String = r.get(4)?;
            Ok((
                LinkSample {
                    t_ms: r.get(0)?,
                    rate: r.get(1)?,
                    rtt_ms: r.get(2)?,
                    loss: r.get(3)?,
                    source: Source::Probe,
                    job: r.get(5)?,
                },
                source,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (mut s, source) = row?;
            s.source = Source::parse(&source)
                .ok_or_else(|| ServiceError::Invalid(format!("stored sample source {source:?}")))?;
            out.push(s);
        }
        out.reverse();
        Ok(out)
    }
}

impl Store {
    /// Keeps what the optimizer learnt of `link`, replacing what was kept.
    pub fn save_link_tuning(&self, link: &str, t: &LinkTuning) -> Result<(), ServiceError> {
        let rates = serde_json::to_string(&t.rates)
            .map_err(|e| ServiceError::Invalid(format!("link tuning of {link}: {e}")))?;
        self.lock()
            .prepare_cached(
                "INSERT INTO link_tuning (link, jobs, streams, rates, updated_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (link) DO UPDATE SET \
                 jobs = excluded.jobs, streams = excluded.streams, rates = excluded.rates, \
                 updated_ms = excluded.updated_ms",
            )?
            .execute(params![
                link,
                t.jobs as i64,
                i64::from(t.streams),
                rates,
                now_ms()
            ])?;
        Ok(())
    }

    /// Every link's kept tuning. A row that does not read back (a hand-edited database) is
    /// left out with a warning: the optimizer then starts that link afresh.
    pub fn link_tunings(&self) -> Result<Vec<(String, LinkTuning)>, ServiceError> {
        let conn = self.lock();
        let mut st = conn.prepare_cached("SELECT link, jobs, streams, rates FROM link_tuning")?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, String>(3)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (link, jobs, streams, rates) = row?;
            match serde_json::from_str(&rates) {
                Ok(rates) => out.push((
                    link,
                    LinkTuning {
                        jobs: usize::try_from(jobs).unwrap_or(1),
                        rates,
                        streams: u32::try_from(streams).unwrap_or(0),
                    },
                )),
                Err(e) => tracing::warn!("link {link}: its kept tuning does not read: {e}"),
            }
        }
        Ok(out)
    }
}

/// Brings the store to the newest schema this build knows; a newer one is refused.
fn migrate(conn: &mut Connection) -> Result<(), ServiceError> {
    use ferry_catalog::CatalogError;
    ferry_catalog::run_migrations(conn, "service_migrations", MIGRATIONS, now_ms()).map_err(|e| {
        match e {
            CatalogError::TooNew { found, known } => ServiceError::TooNew { found, known },
            CatalogError::Db(e) => ServiceError::Db(e),
            other => ServiceError::Invalid(other.to_string()),
        }
    })
}

/// Job `id` with its sources, on a connection the caller holds.
fn get_on(conn: &Connection, id: i64) -> Result<Option<Job>, ServiceError> {
    let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1");
    let job = conn
        .prepare_cached(&sql)?
        .query_row(params![id], job_of)
        .optional()?;
    match job {
        Some(Ok(mut j)) => {
            j.sources = sources_of(conn, id)?;
            Ok(Some(j))
        }
        Some(Err(e)) => Err(e),
        None => Ok(None),
    }
}

fn sources_of(conn: &Connection, id: i64) -> Result<Vec<String>, ServiceError> {
    let mut st =
        conn.prepare_cached("SELECT path FROM job_sources WHERE job = ?1 ORDER BY position")?;
    let rows = st.query_map(params![id], |r| r.get(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// One row of `jobs` (sources filled in after); a value the schema's checks would refuse is
/// an error, never a panic.
fn job_of(r: &Row<'_>) -> rusqlite::Result<Result<Job, ServiceError>> {
    let kind: String = r.get(1)?;
    let sync: String = r.get(3)?;
    let state: String = r.get(9)?;
    let bad = |what: &str, v: &str| ServiceError::Invalid(format!("stored {what} {v:?}"));
    let u = |i: usize| -> rusqlite::Result<u64> { Ok(r.get::<_, i64>(i)?.max(0) as u64) };
    let job = Job {
        id: r.get(0)?,
        kind: match Kind::parse(&kind) {
            Some(k) => k,
            None => return Ok(Err(bad("kind", &kind))),
        },
        sources: Vec::new(),
        dest: r.get(2)?,
        sync: match SyncMode::parse(&sync) {
            Ok(s) => s,
            Err(_) => return Ok(Err(bad("sync mode", &sync))),
        },
        priority: r.get(4)?,
        deadline: r.get(5)?,
        label: r.get(6)?,
        owner: r.get(7)?,
        server: r.get(8)?,
        state: match State::parse(&state) {
            Some(s) => s,
            None => return Ok(Err(bad("state", &state))),
        },
        attempts: u(10)?.min(u64::from(u32::MAX)) as u32,
        files_done: u(11)?,
        files_total: u(12)?,
        bytes_done: u(13)?,
        bytes_total: u(14)?,
        rate: r.get(15)?,
        last_error: r.get(16)?,
        created_ms: r.get(17)?,
        started_ms: r.get(18)?,
        finished_ms: r.get(19)?,
        not_before_ms: r.get(20)?,
    };
    Ok(Ok(job))
}

#[cfg(test)]
mod tests;
