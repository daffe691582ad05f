//! The job store: jobs in an embedded SQLite file (the default) or a PostgreSQL database that
//! several services share, through ferry-catalog's database seam ([`ferry_catalog::sql`]): one
//! connection behind a mutex (each call is short), one schema and one list of migrations on
//! both, and SQL that both take (ids chosen in the transaction, BIGINT times, no functions of
//! one dialect only).
//!
//! Sharing: a service claims a queued job with one conditional `UPDATE` (only one of several
//! sees its row change), records itself as the job's runner and beats on its running jobs'
//! rows; every write of a running job's progress or end is conditional on the runner still
//! being this service. A job whose runner stopped beating for longer than a bound is queued
//! again by any service ([`Store::requeue_stale`]).

use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use ferry_catalog::sql::{Arg, Database, Row};
use ferry_catalog::{CatalogError, Location};

use crate::error::ServiceError;
use crate::history::{LinkSample, RateSample, Source, MAX_JOB_SAMPLES, MAX_LINK_SAMPLES};
use crate::job::{now_ms, Job, Kind, NewJob, Progress, State, SyncMode};
use crate::optimizer::LinkTuning;
use crate::timing::Histogram;

/// Each migration's version and statements; a released version is never edited, only followed.
pub(crate) const MIGRATIONS: &[(i64, &str)] = &[(1, V1), (2, V2), (3, V3), (4, V4)];

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

/// The shared queue (issue 40): which service runs a job, and when it last said it still
/// did, so that another service can take over the jobs of one that died.
const V4: &str = "
ALTER TABLE jobs ADD COLUMN runner TEXT;
ALTER TABLE jobs ADD COLUMN beat_ms BIGINT;
CREATE INDEX jobs_runner ON jobs (state, runner);
";

const JOB_COLUMNS: &str = "id, kind, dest, sync_mode, priority, deadline, label, owner, server, \
    state, attempts, files_done, files_total, bytes_done, bytes_total, rate, last_error, \
    created_ms, started_ms, finished_ms, not_before_ms, runner";

/// How many link samples are added between two prunings of the links' oldest.
pub const PRUNE_EVERY: i64 = 64;

/// The most jobs one listing returns.
pub const MAX_LIST: usize = 1000;

/// What a restart did to the jobs a crash left running.
pub const INTERRUPTED: &str = "interrupted: the service stopped while the job ran";

/// What another service did to a job whose runner stopped beating.
pub const ABANDONED: &str = "interrupted: the service running it stopped answering";

/// The longest service name.
pub const MAX_NAME: usize = 256;

/// A statement's parameters, each converted with `Arg::from`.
macro_rules! args {
    ($($a:expr),* $(,)?) => { &[$(Arg::from($a)),*][..] };
}

/// The job store, opened and migrated to the newest schema.
pub struct Store {
    db: Mutex<Database>,
    /// This service's name in `jobs.runner`.
    name: String,
    /// Samples kept per link ([`MAX_LINK_SAMPLES`]; smaller in unit tests).
    link_bound: usize,
    /// How long each call waited for the lock, and held it (`/metrics`): an API call's
    /// wait is the holds of the scheduler's writes before it.
    lock_wait: Histogram,
    lock_hold: Histogram,
}

/// The store's connection while held: the hold's length goes to [`Store::lock_hold`].
struct Held<'a> {
    db: MutexGuard<'a, Database>,
    since: Instant,
    hold: &'a Histogram,
}

impl Deref for Held<'_> {
    type Target = Database;
    fn deref(&self) -> &Database {
        &self.db
    }
}

impl DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Database {
        &mut self.db
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.hold.observe(self.since.elapsed());
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (creating if need be) a SQLite store at `path`, or in memory with `None`, and
    /// queues again every job a crash left running: the next run resumes from ferry's
    /// partial files.
    pub fn open(path: Option<&Path>) -> Result<Self, ServiceError> {
        let location = match path {
            Some(p) => Location::Sqlite(p.to_path_buf()),
            None => Location::Memory,
        };
        Self::open_at(&location, "local")
    }

    /// Opens the store at `location` as the service `name`. A SQLite file is one service's:
    /// every job it left running is queued again. A PostgreSQL queue is shared: only the jobs
    /// `name` left running are (and any left by a service from before runners were kept);
    /// those of a service that died are left to [`Store::requeue_stale`].
    pub fn open_at(location: &Location, name: &str) -> Result<Self, ServiceError> {
        if name.is_empty() || name.len() > MAX_NAME || name.chars().any(char::is_control) {
            return Err(ServiceError::Invalid(format!(
                "service name {name:?}: 1 to {MAX_NAME} bytes, no control characters"
            )));
        }
        let mut db = Database::open(location)?;
        db.migrate("service_migrations", MIGRATIONS, now_ms())
            .map_err(|e| match e {
                CatalogError::TooNew { found, known } => ServiceError::TooNew { found, known },
                other => ServiceError::Db(other),
            })?;
        if db.is_shared() {
            db.run(
                "UPDATE jobs SET state = 'queued', last_error = ?1, rate = 0 \
                 WHERE state = 'running' AND (runner = ?2 OR runner IS NULL)",
                args![INTERRUPTED, name],
            )?;
        } else {
            db.run(
                "UPDATE jobs SET state = 'queued', last_error = ?1, rate = 0 \
                 WHERE state = 'running'",
                args![INTERRUPTED],
            )?;
        }
        Ok(Self {
            db: Mutex::new(db),
            name: name.to_owned(),
            link_bound: MAX_LINK_SAMPLES,
            lock_wait: Histogram::default(),
            lock_hold: Histogram::default(),
        })
    }

    /// This service's name as the runner of the jobs it starts.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether other services may share this queue (PostgreSQL).
    pub fn is_shared(&self) -> bool {
        self.lock().is_shared()
    }

    fn lock(&self) -> Held<'_> {
        let asked = Instant::now();
        let db = self.db.lock().unwrap_or_else(|e| e.into_inner());
        let since = Instant::now();
        self.lock_wait.observe(since - asked);
        Held {
            db,
            since,
            hold: &self.lock_hold,
        }
    }

    /// How long the store's calls waited for its lock, and held it.
    pub fn lock_times(&self) -> (&Histogram, &Histogram) {
        (&self.lock_wait, &self.lock_hold)
    }

    /// Records a new queued job and returns it.
    pub fn submit(&self, job: &NewJob) -> Result<Job, ServiceError> {
        job.check()?;
        let now = now_ms();
        let id = self.lock().transaction(|tx| -> Result<i64, ServiceError> {
            // Another service may take the same next id at once: the insert that loses adds
            // nothing (its row count says so) and takes the one after.
            let id = loop {
                let id = tx
                    .one("SELECT COALESCE(MAX(id), 0) + 1 FROM jobs", &[])?
                    .int(0)?;
                let n = tx.run(
                    "INSERT INTO jobs (id, kind, dest, sync_mode, priority, deadline, label, \
                     owner, server, state, attempts, files_done, files_total, bytes_done, \
                     bytes_total, rate, created_ms, not_before_ms) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'queued', 0, 0, 0, 0, 0, 0, \
                     ?10, ?10) ON CONFLICT DO NOTHING",
                    args![
                        id,
                        job.kind.as_str(),
                        &job.dest,
                        job.sync.as_str(),
                        job.priority,
                        job.deadline,
                        &job.label,
                        &job.owner,
                        &job.server,
                        now
                    ],
                )?;
                if n == 1 {
                    break id;
                }
            };
            for (i, s) in job.sources.iter().enumerate() {
                tx.run(
                    "INSERT INTO job_sources (job, position, path) VALUES (?1, ?2, ?3)",
                    args![id, i as i64, s],
                )?;
            }
            Ok(id)
        })?;
        // The row as inserted, not read back: a second hold of the lock, behind whatever
        // the scheduler writes meanwhile, was part of the submit's tail.
        Ok(Job {
            id,
            kind: job.kind,
            sources: job.sources.clone(),
            dest: job.dest.clone(),
            sync: job.sync,
            priority: job.priority,
            deadline: job.deadline,
            label: job.label.clone(),
            owner: job.owner.clone(),
            server: job.server.clone(),
            state: State::Queued,
            attempts: 0,
            files_done: 0,
            files_total: 0,
            bytes_done: 0,
            bytes_total: 0,
            rate: 0.0,
            last_error: None,
            created_ms: now,
            started_ms: None,
            finished_ms: None,
            not_before_ms: now,
            runner: None,
        })
    }

    pub fn get(&self, id: i64) -> Result<Option<Job>, ServiceError> {
        get_on(&mut self.lock(), id)
    }

    /// The newest jobs first, at most `limit` (and [`MAX_LIST`]); only `owner`'s if given.
    pub fn list(&self, owner: Option<&str>, limit: usize) -> Result<Vec<Job>, ServiceError> {
        let limit = limit.min(MAX_LIST) as i64;
        // Two statements each: PostgreSQL cannot type a parameter that is only tested for NULL.
        match owner {
            Some(owner) => {
                self.jobs_where("owner = ?1 ORDER BY id DESC LIMIT ?2", args![owner, limit])
            }
            None => self.jobs_where("1 = 1 ORDER BY id DESC LIMIT ?1", args![limit]),
        }
    }

    /// Queued jobs whose backoff has passed, in the order they should start: higher priority
    /// first, then older first.
    pub fn runnable(&self, now: i64, limit: usize) -> Result<Vec<Job>, ServiceError> {
        self.jobs_where(
            "state = 'queued' AND not_before_ms <= ?1 \
             ORDER BY priority DESC, created_ms, id LIMIT ?2",
            args![now, limit as i64],
        )
    }

    /// The jobs `selection` (a `WHERE` clause's conditions, order and limit: the caller's
    /// constant, never input) picks, in its order, with their sources: two statements under
    /// one hold of the lock, whatever their number. A job at a time (two statements each)
    /// held the lock for tens of milliseconds at a scheduler pass of 256 jobs on a loaded
    /// host, and every API call queued behind it (docs/bench/NOTEBOOK.md, "Issue 40: the
    /// API's tail").
    fn jobs_where(&self, selection: &str, args: &[Arg<'_>]) -> Result<Vec<Job>, ServiceError> {
        let mut db = self.lock();
        let rows = db.rows(
            &format!("SELECT {JOB_COLUMNS} FROM jobs WHERE {selection}"),
            args,
        )?;
        let mut out: Vec<Job> = rows.into_iter().map(job_of).collect::<Result<_, _>>()?;
        if out.is_empty() {
            return Ok(out);
        }
        let sources = db.rows(
            &format!(
                "SELECT job, path FROM job_sources WHERE job IN \
                 (SELECT id FROM jobs WHERE {selection}) ORDER BY job, position"
            ),
            args,
        )?;
        let at: std::collections::HashMap<i64, usize> =
            out.iter().enumerate().map(|(i, j)| (j.id, i)).collect();
        for mut r in sources {
            // A job inserted between the two statements may match the second only: skip it.
            if let Some(&i) = at.get(&r.int(0)?) {
                out[i].sources.push(r.text(1)?);
            }
        }
        Ok(out)
    }

    /// Claims a queued job for this service: marks it running here and counts the attempt.
    /// False if it was no longer queued (cancelled in between, or another service sharing
    /// the queue claimed it first: of several, only one sees the row change).
    pub fn start(&self, id: i64) -> Result<bool, ServiceError> {
        let n = self.lock().run(
            "UPDATE jobs SET state = 'running', attempts = attempts + 1, started_ms = ?2, \
             files_done = 0, files_total = 0, bytes_done = 0, bytes_total = 0, rate = 0, \
             runner = ?3, beat_ms = ?2 WHERE id = ?1 AND state = 'queued'",
            args![id, now_ms(), &self.name],
        )?;
        Ok(n == 1)
    }

    /// Writes a running job's counters, if it still runs here (a test's and a store's single
    /// write; the scheduler writes all its running jobs at once, [`Store::progress_many`]).
    pub fn progress(&self, id: i64, p: &Progress) -> Result<(), ServiceError> {
        progress_on(&mut self.lock(), &self.name, id, p)?;
        Ok(())
    }

    /// One scheduler tick's writes for every job it runs, under one hold of the lock and in one
    /// transaction: a take and a statement per job and per sample were most of the lock's takes
    /// under a thousand jobs, and an API call queued behind each (docs/bench/NOTEBOOK.md,
    /// "Issue 40: the API's tail, placed"). As every write of a running job's progress, each is
    /// conditional on the job still running here; a job no longer this service's (cancelled,
    /// taken over) is skipped, its sample with it. Returns the ids skipped.
    pub fn progress_many(&self, writes: &[TickWrite]) -> Result<Vec<i64>, ServiceError> {
        if writes.is_empty() {
            return Ok(Vec::new());
        }
        let name = self.name.as_str();
        self.lock().transaction(|tx| -> Result<_, ServiceError> {
            let mut skipped = Vec::new();
            for w in writes {
                if progress_on(tx, name, w.id, &w.progress)? == 0 {
                    skipped.push(w.id);
                    continue;
                }
                if let Some(s) = &w.sample {
                    add_rate_on(tx, w.id, s)?;
                }
            }
            Ok(skipped)
        })
    }

    /// Ends a running job as `state` (done or failed); false if it was no longer running
    /// here (cancelled while it ran, or taken over).
    pub fn finish(&self, id: i64, state: State, error: Option<&str>) -> Result<bool, ServiceError> {
        Ok(finish_on(&mut self.lock(), &self.name, id, state, error)? == 1)
    }

    /// Puts a job running here back in the queue after a failed attempt, not to start before
    /// `not_before_ms`; false if it was no longer running here.
    pub fn retry_later(
        &self,
        id: i64,
        error: &str,
        not_before_ms: i64,
    ) -> Result<bool, ServiceError> {
        Ok(retry_on(&mut self.lock(), &self.name, id, error, not_before_ms)? == 1)
    }

    /// The end of one attempt of a job running here, all under one take of the lock and in
    /// one transaction: its last counters and rate sample, its end (`ending`), and, when it
    /// ended done, `transfer` (its link and achieved rate) into the link's history; read back
    /// when `read_back` and it ended for good (a notification's body). Four takes of the lock
    /// and four transactions a job were each a wait for the API's calls queued behind them
    /// under a thousand jobs (docs/bench/NOTEBOOK.md, "Issue 40: one take a job's end").
    /// Every write is conditional on the job still running here, as each one alone was: a job
    /// cancelled or taken over meanwhile gets none of them, and `recorded` says so.
    pub fn conclude(
        &self,
        last: &TickWrite,
        ending: Ending<'_>,
        transfer: Option<(&str, &LinkSample)>,
        read_back: bool,
    ) -> Result<Concluded, ServiceError> {
        let (name, bound, id) = (self.name.as_str(), self.link_bound as i64, last.id);
        self.lock().transaction(|tx| -> Result<_, ServiceError> {
            if progress_on(tx, name, id, &last.progress)? == 1 {
                if let Some(s) = &last.sample {
                    add_rate_on(tx, id, s)?;
                }
            }
            let n = match ending {
                Ending::Final { state, error } => finish_on(tx, name, id, state, error)?,
                Ending::Retry {
                    error,
                    not_before_ms,
                } => retry_on(tx, name, id, error, not_before_ms)?,
            };
            let recorded = n == 1;
            let ended = recorded && matches!(ending, Ending::Final { .. });
            if ended
                && matches!(
                    ending,
                    Ending::Final {
                        state: State::Done,
                        ..
                    }
                )
            {
                if let Some((link, s)) = transfer {
                    add_link_sample_on(tx, bound, link, s)?;
                }
            }
            let job = if ended && read_back {
                get_on(tx, id)?
            } else {
                None
            };
            Ok(Concluded { recorded, job })
        })
    }

    /// Says that this service still runs its running jobs, as of `now_ms`.
    pub fn beat(&self, now_ms: i64) -> Result<(), ServiceError> {
        self.lock().run(
            "UPDATE jobs SET beat_ms = ?2 WHERE state = 'running' AND runner = ?1",
            args![&self.name, now_ms],
        )?;
        Ok(())
    }

    /// Queues again every job another service runs whose last beat is older than
    /// `before_ms`: that service has died or lost the database. How many.
    pub fn requeue_stale(&self, before_ms: i64) -> Result<u64, ServiceError> {
        Ok(self.lock().run(
            "UPDATE jobs SET state = 'queued', last_error = ?1, rate = 0, runner = NULL \
             WHERE state = 'running' AND runner <> ?2 AND beat_ms < ?3",
            args![ABANDONED, &self.name, before_ms],
        )?)
    }

    /// Of `ids` (the jobs this service runs), those it no longer should: cancelled, or taken
    /// over by another service after this one failed to beat in time.
    pub fn lost(&self, ids: &[i64]) -> Result<Vec<i64>, ServiceError> {
        let mut db = self.lock();
        let mut out = Vec::new();
        for &id in ids {
            let Some(mut r) = db.row("SELECT state, runner FROM jobs WHERE id = ?1", args![id])?
            else {
                continue;
            };
            let (state, runner) = (r.text(0)?, r.opt_text(1)?);
            if state == "cancelled" || runner.as_deref() != Some(self.name.as_str()) {
                out.push(id);
            }
        }
        Ok(out)
    }

    /// Fails a queued job without running it (its deadline passed).
    pub fn expire(&self, id: i64, why: &str) -> Result<bool, ServiceError> {
        let n = self.lock().run(
            "UPDATE jobs SET state = 'failed', last_error = ?2, finished_ms = ?3 \
             WHERE id = ?1 AND state = 'queued'",
            args![id, why, now_ms()],
        )?;
        Ok(n == 1)
    }

    /// Cancels a queued or running job (the scheduler running it stops it); returns its
    /// state before, or why it cannot be cancelled.
    pub fn cancel(&self, id: i64) -> Result<State, ServiceError> {
        loop {
            let cancelled = self.lock().transaction(|tx| -> Result<_, ServiceError> {
                let state = tx
                    .row("SELECT state FROM jobs WHERE id = ?1", args![id])?
                    .map(|mut r| r.text(0))
                    .transpose()?;
                let state = state
                    .and_then(|s| State::parse(&s))
                    .ok_or(ServiceError::NotFound(id))?;
                if state.is_final() {
                    return Err(ServiceError::Ended {
                        id,
                        state: state.as_str(),
                    });
                }
                // Conditional: a service sharing the queue may have claimed or ended it since
                // it was read; then it is read again.
                let n = tx.run(
                    "UPDATE jobs SET state = 'cancelled', finished_ms = ?2, rate = 0 \
                     WHERE id = ?1 AND state = ?3",
                    args![id, now_ms(), state.as_str()],
                )?;
                Ok((n == 1).then_some(state))
            })?;
            if let Some(state) = cancelled {
                return Ok(state);
            }
        }
    }

    /// How many jobs are in each state, for `/metrics`.
    pub fn counts(&self) -> Result<Vec<(State, u64)>, ServiceError> {
        counts_on(&mut self.lock())
    }

    /// What `/metrics` reads of the store: the jobs by state and each of `links`' newest
    /// `limit` samples, under one take of the lock (one take for the counts and one a link
    /// were four waits behind the scheduler's writes for one scrape).
    pub fn overview(&self, links: &[&str], limit: usize) -> Result<Overview, ServiceError> {
        let mut db = self.lock();
        Ok(Overview {
            counts: counts_on(&mut db)?,
            links: links
                .iter()
                .map(|l| link_samples_on(&mut db, l, i64::MIN, limit))
                .collect::<Result<_, _>>()?,
        })
    }

    /// Each of `links`' newest `limit` samples, oldest first, under one take of the lock.
    pub fn links_samples(
        &self,
        links: &[&str],
        limit: usize,
    ) -> Result<Vec<Vec<LinkSample>>, ServiceError> {
        let mut db = self.lock();
        links
            .iter()
            .map(|l| link_samples_on(&mut db, l, i64::MIN, limit))
            .collect()
    }
}

/// How an attempt ended, as [`Store::conclude`] records it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Ending<'a> {
    /// Done or failed for good; `error`, when given, becomes its last error.
    Final {
        state: State,
        error: Option<&'a str>,
    },
    /// Queued again after a failed attempt, not to start before `not_before_ms`.
    Retry { error: &'a str, not_before_ms: i64 },
}

/// What [`Store::conclude`] did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Concluded {
    /// The job still ran here: it now stands as the ending said.
    pub recorded: bool,
    /// The job as it ended for good, when read back.
    pub job: Option<Job>,
}

/// [`Store::overview`]'s reading.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Overview {
    /// Every state with its count of jobs.
    pub counts: Vec<(State, u64)>,
    /// Per link asked for, in that order, its newest samples, oldest first.
    pub links: Vec<Vec<LinkSample>>,
}

impl Store {
    /// Adds a rate sample to job `id`; above [`MAX_JOB_SAMPLES`] every other one is dropped
    /// (the newest kept), so the older part of a long job thins out as it goes on.
    pub fn add_rate(&self, id: i64, s: &RateSample) -> Result<(), ServiceError> {
        self.lock().transaction(|tx| add_rate_on(tx, id, s))
    }

    /// Job `id`'s rate samples, oldest first.
    pub fn rates(&self, id: i64) -> Result<Vec<RateSample>, ServiceError> {
        let rows = self.lock().rows(
            "SELECT t_ms, bytes_done, rate FROM job_rates WHERE job = ?1 ORDER BY t_ms",
            args![id],
        )?;
        rows.into_iter()
            .map(|mut r| -> Result<RateSample, ServiceError> {
                Ok(RateSample {
                    t_ms: r.int(0)?,
                    bytes_done: r.int(1)?.max(0) as u64,
                    rate: r.real(2)?,
                })
            })
            .collect()
    }

    /// Adds a sample to `link`'s history; the oldest beyond [`MAX_LINK_SAMPLES`] go (checked
    /// every [`PRUNE_EVERY`] samples).
    pub fn add_link_sample(&self, link: &str, s: &LinkSample) -> Result<(), ServiceError> {
        let bound = self.link_bound as i64;
        self.lock()
            .transaction(|tx| add_link_sample_on(tx, bound, link, s))
    }

    /// `link`'s newest samples taken at or after `since_ms`, at most `limit`, oldest first.
    pub fn link_samples(
        &self,
        link: &str,
        since_ms: i64,
        limit: usize,
    ) -> Result<Vec<LinkSample>, ServiceError> {
        link_samples_on(&mut self.lock(), link, since_ms, limit)
    }
}

impl Store {
    /// Keeps what the optimizer learnt of `link`, replacing what was kept.
    pub fn save_link_tuning(&self, link: &str, t: &LinkTuning) -> Result<(), ServiceError> {
        let rates = serde_json::to_string(&t.rates)
            .map_err(|e| ServiceError::Invalid(format!("link tuning of {link}: {e}")))?;
        self.lock().run(
            "INSERT INTO link_tuning (link, jobs, streams, rates, updated_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (link) DO UPDATE SET \
             jobs = excluded.jobs, streams = excluded.streams, rates = excluded.rates, \
             updated_ms = excluded.updated_ms",
            args![link, t.jobs as i64, i64::from(t.streams), &rates, now_ms()],
        )?;
        Ok(())
    }

    /// Every link's kept tuning. A row that does not read back (a hand-edited database) is
    /// left out with a warning: the optimizer then starts that link afresh.
    pub fn link_tunings(&self) -> Result<Vec<(String, LinkTuning)>, ServiceError> {
        let rows = self
            .lock()
            .rows("SELECT link, jobs, streams, rates FROM link_tuning", &[])?;
        let mut out = Vec::new();
        for mut r in rows {
            let (link, jobs, streams, rates) = (r.text(0)?, r.int(1)?, r.int(2)?, r.text(3)?);
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

/// One running job's writes of a scheduler tick ([`Store::progress_many`]): its counters, and
/// a rate sample when one is due.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TickWrite {
    pub id: i64,
    pub progress: Progress,
    pub sample: Option<RateSample>,
}

/// Writes job `id`'s counters if it runs as `runner`; how many rows changed (0 or 1).
fn progress_on(
    db: &mut Database,
    runner: &str,
    id: i64,
    p: &Progress,
) -> Result<u64, ServiceError> {
    Ok(db.run(
        "UPDATE jobs SET files_done = ?2, files_total = ?3, bytes_done = ?4, \
         bytes_total = ?5, rate = ?6 WHERE id = ?1 AND state = 'running' AND runner = ?7",
        args![
            id,
            p.files_done as i64,
            p.files_total as i64,
            p.bytes_done as i64,
            p.bytes_total as i64,
            p.rate,
            runner
        ],
    )?)
}

/// [`Store::add_link_sample`] on a connection the caller holds (in its transaction), the
/// link's oldest beyond `bound` pruned.
fn add_link_sample_on(
    tx: &mut Database,
    bound: i64,
    link: &str,
    s: &LinkSample,
) -> Result<(), ServiceError> {
    // As for a job's id: of two services adding at once, the loser takes the next.
    let id = loop {
        let id = tx
            .one("SELECT COALESCE(MAX(id), 0) + 1 FROM link_samples", &[])?
            .int(0)?;
        let n = tx.run(
            "INSERT INTO link_samples (id, link, t_ms, rate, rtt_ms, loss, source, job) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT DO NOTHING",
            args![
                id,
                link,
                s.t_ms,
                s.rate,
                s.rtt_ms,
                s.loss,
                s.source.as_str(),
                s.job
            ],
        )?;
        if n == 1 {
            break id;
        }
    };
    // Finding a link's cut-off walks its bound of index entries, so it is done every
    // PRUNE_EVERY samples, for every link: a link holds at most that many more.
    if id % PRUNE_EVERY == 0 {
        let links: Vec<String> = tx
            .rows("SELECT DISTINCT link FROM link_samples", &[])?
            .into_iter()
            .map(|mut r| r.text(0))
            .collect::<Result<_, _>>()?;
        // The link's own oldest beyond the bound (none while it has fewer: NULL
        // compares false).
        for l in &links {
            tx.run(
                "DELETE FROM link_samples WHERE link = ?1 AND id <= (SELECT id FROM \
                 link_samples WHERE link = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)",
                args![l, bound],
            )?;
        }
    }
    Ok(())
}
/// [`Store::link_samples`] on a connection the caller holds.
fn link_samples_on(
    db: &mut Database,
    link: &str,
    since_ms: i64,
    limit: usize,
) -> Result<Vec<LinkSample>, ServiceError> {
    let rows = db.rows(
        "SELECT t_ms, rate, rtt_ms, loss, source, job FROM link_samples \
         WHERE link = ?1 AND t_ms >= ?2 ORDER BY id DESC LIMIT ?3",
        args![link, since_ms, i64::try_from(limit).unwrap_or(i64::MAX)],
    )?;
    let mut out = Vec::with_capacity(rows.len());
    for mut r in rows {
        let source = r.text(4)?;
        out.push(LinkSample {
            t_ms: r.int(0)?,
            rate: r.real(1)?,
            rtt_ms: r.opt_real(2)?,
            loss: r.opt_real(3)?,
            source: Source::parse(&source)
                .ok_or_else(|| ServiceError::Invalid(format!("stored sample source {source:?}")))?,
            job: r.opt_int(5)?,
        });
    }
    out.reverse();
    Ok(out)
}

/// How many jobs are in each state, on a connection the caller holds.
fn counts_on(db: &mut Database) -> Result<Vec<(State, u64)>, ServiceError> {
    let rows = db.rows("SELECT state, COUNT(*) FROM jobs GROUP BY state", &[])?;
    let mut found = Vec::new();
    for mut row in rows {
        let (s, n) = (row.text(0)?, row.int(1)?);
        if let Some(s) = State::parse(&s) {
            found.push((s, n as u64));
        }
    }
    Ok(State::ALL
        .into_iter()
        .map(|s| (s, found.iter().find(|f| f.0 == s).map_or(0, |f| f.1)))
        .collect())
}

/// Ends job `id` as `state` if it runs as `runner`; how many rows changed (0 or 1).
fn finish_on(
    db: &mut Database,
    runner: &str,
    id: i64,
    state: State,
    error: Option<&str>,
) -> Result<u64, ServiceError> {
    Ok(db.run(
        "UPDATE jobs SET state = ?2, last_error = COALESCE(?3, last_error), \
         finished_ms = ?4, rate = 0 WHERE id = ?1 AND state = 'running' AND runner = ?5",
        args![id, state.as_str(), error, now_ms(), runner],
    )?)
}

/// Queues job `id` again if it runs as `runner`; how many rows changed (0 or 1).
fn retry_on(
    db: &mut Database,
    runner: &str,
    id: i64,
    error: &str,
    not_before_ms: i64,
) -> Result<u64, ServiceError> {
    Ok(db.run(
        "UPDATE jobs SET state = 'queued', last_error = ?2, not_before_ms = ?3, rate = 0 \
         WHERE id = ?1 AND state = 'running' AND runner = ?4",
        args![id, error, not_before_ms, runner],
    )?)
}

/// [`Store::add_rate`] on a connection the caller holds (in its transaction).
fn add_rate_on(tx: &mut Database, id: i64, s: &RateSample) -> Result<(), ServiceError> {
    tx.run(
        "INSERT INTO job_rates (job, t_ms, bytes_done, rate) VALUES (?1, ?2, ?3, ?4) \
         ON CONFLICT DO NOTHING",
        args![id, s.t_ms, s.bytes_done as i64, s.rate],
    )?;
    let n = tx
        .one("SELECT COUNT(*) FROM job_rates WHERE job = ?1", args![id])?
        .int(0)?;
    if n as usize > MAX_JOB_SAMPLES {
        let times: Vec<i64> = tx
            .rows(
                "SELECT t_ms FROM job_rates WHERE job = ?1 ORDER BY t_ms",
                args![id],
            )?
            .into_iter()
            .map(|mut r| r.int(0))
            .collect::<Result<_, _>>()?;
        // From the second oldest, every other one; the newest always stays.
        for &t in times[..times.len() - 1].iter().skip(1).step_by(2) {
            tx.run(
                "DELETE FROM job_rates WHERE job = ?1 AND t_ms = ?2",
                args![id, t],
            )?;
        }
    }
    Ok(())
}

/// Job `id` with its sources, on a connection the caller holds.
fn get_on(db: &mut Database, id: i64) -> Result<Option<Job>, ServiceError> {
    let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1");
    let Some(row) = db.row(&sql, args![id])? else {
        return Ok(None);
    };
    let mut job = job_of(row)?;
    job.sources = db
        .rows(
            "SELECT path FROM job_sources WHERE job = ?1 ORDER BY position",
            args![id],
        )?
        .into_iter()
        .map(|mut r| r.text(0))
        .collect::<Result<_, _>>()?;
    Ok(Some(job))
}

/// One row of `jobs` (sources filled in after); a value the schema's checks would refuse is
/// an error, never a panic.
fn job_of(mut r: Row) -> Result<Job, ServiceError> {
    let bad = |what: &str, v: &str| ServiceError::Invalid(format!("stored {what} {v:?}"));
    let kind = r.text(1)?;
    let sync = r.text(3)?;
    let state = r.text(9)?;
    let mut u = |i: usize| -> Result<u64, CatalogError> { Ok(r.int(i)?.max(0) as u64) };
    let (files_done, files_total, bytes_done, bytes_total) = (u(11)?, u(12)?, u(13)?, u(14)?);
    let attempts = u(10)?.min(u64::from(u32::MAX)) as u32;
    Ok(Job {
        id: r.int(0)?,
        kind: Kind::parse(&kind).ok_or_else(|| bad("kind", &kind))?,
        sources: Vec::new(),
        dest: r.text(2)?,
        sync: SyncMode::parse(&sync).map_err(|_| bad("sync mode", &sync))?,
        priority: r.int(4)?,
        deadline: r.opt_int(5)?,
        label: r.text(6)?,
        owner: r.text(7)?,
        server: r.text(8)?,
        state: State::parse(&state).ok_or_else(|| bad("state", &state))?,
        attempts,
        files_done,
        files_total,
        bytes_done,
        bytes_total,
        rate: r.real(15)?,
        last_error: r.opt_text(16)?,
        created_ms: r.int(17)?,
        started_ms: r.opt_int(18)?,
        finished_ms: r.opt_int(19)?,
        not_before_ms: r.int(20)?,
        runner: r.opt_text(21)?,
    })
}

#[cfg(test)]
mod tests;
