//! The store's tests, each run once on SQLite (a test each) and once on PostgreSQL (all in
//! `on_postgresql`, on one cluster for this binary, each in a schema of its own), as
//! ferry-catalog's are; the tests of a queue several services share run on PostgreSQL only.

use std::sync::atomic::{AtomicU32, Ordering};

use ferry_catalog::TestCluster;

use super::*;

/// Where a test's stores are.
enum Backend {
    Sqlite(tempfile::TempDir, AtomicU32),
    Postgres(TestCluster),
}

impl Backend {
    fn sqlite() -> Self {
        Self::Sqlite(tempfile::tempdir().unwrap(), AtomicU32::new(0))
    }

    /// A new, empty database's location.
    fn fresh(&self) -> Location {
        match self {
            Self::Sqlite(dir, n) => Location::Sqlite(
                dir.path()
                    .join(format!("jobs{}.db", n.fetch_add(1, Ordering::Relaxed))),
            ),
            Self::Postgres(cluster) => cluster.database(),
        }
    }

    /// A new, empty store (SQLite's in memory).
    fn store(&self) -> Store {
        let location = match self {
            Self::Sqlite(..) => Location::Memory,
            Self::Postgres(cluster) => cluster.database(),
        };
        Store::open_at(&location, "here").unwrap()
    }
}

/// Each test of the first list as a test on SQLite, and all of both lists on PostgreSQL in
/// one.
macro_rules! on_both {
    ([$($name:ident),* $(,)?], [$($shared:ident),* $(,)?]) => {
        mod sqlite {
            $(#[test]
            fn $name() {
                super::$name(&super::Backend::sqlite())
            })*
        }

        /// Every test on PostgreSQL. One cluster for them all: initdb and a start take
        /// seconds, a schema a few milliseconds.
        #[test]
        fn on_postgresql() {
            let Some(cluster) = ferry_netem::needs(
                "ferry_service::store::tests::on_postgresql",
                TestCluster::start(),
            ) else {
                return;
            };
            let b = Backend::Postgres(cluster);
            let mut failed = Vec::new();
            $(if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| $name(&b))).is_err() {
                failed.push(stringify!($name));
            })*
            $(if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| $shared(&b))).is_err() {
                failed.push(stringify!($shared));
            })*
            assert!(failed.is_empty(), "failed on PostgreSQL: {failed:?}");
        }
    };
}

on_both!(
    [
        a_submitted_job_reads_back_as_given_and_queued,
        listing_filters_by_owner_newest_first,
        runnable_goes_by_priority_then_age_and_respects_backoff,
        progress_and_finish_are_recorded_and_only_while_running,
        cancel_ends_queued_and_running_jobs_but_not_ended_ones,
        a_job_running_at_a_crash_is_queued_again_at_open,
        a_newer_schema_is_refused,
        bad_jobs_are_refused_with_why,
        counts_cover_every_state,
        a_version_1_store_is_migrated_to_the_history_tables,
        a_long_job_keeps_a_bounded_thinned_history_with_its_newest_sample,
        link_samples_read_back_newest_bounded_and_since,
        a_link_keeps_at_most_its_bound_of_samples,
        link_tunings_are_kept_replaced_and_survive_a_reopen,
        a_job_records_its_runner_and_only_a_stale_one_is_taken_over,
        a_tick_writes_its_running_jobs_at_one_take_and_skips_the_others,
        a_jobs_end_is_one_take_and_writes_nothing_of_a_job_not_its_own,
        what_metrics_reads_is_one_take,
    ],
    [
        of_services_sharing_a_queue_one_claims_a_job,
        a_restart_requeues_only_its_own_running_jobs,
    ]
);

fn new_job(owner: &str, priority: i64) -> NewJob {
    NewJob {
        kind: Kind::Put,
        sources: vec!["/data/a".into(), "/data/b".into()],
        dest: "host:7070:/in/".into(),
        sync: SyncMode::Mtime,
        priority,
        deadline: Some(2_000_000_000),
        label: "run 42".into(),
        owner: owner.into(),
        server: "host:7070".into(),
    }
}

fn a_submitted_job_reads_back_as_given_and_queued(b: &Backend) {
    let s = b.store();
    let j = s.submit(&new_job("alice", 3)).unwrap();
    assert_eq!(j.state, State::Queued);
    assert_eq!(j.sources, vec!["/data/a", "/data/b"]);
    assert_eq!(
        (j.kind, j.sync, j.priority, j.deadline),
        (Kind::Put, SyncMode::Mtime, 3, Some(2_000_000_000))
    );
    assert_eq!((j.label.as_str(), j.owner.as_str()), ("run 42", "alice"));
    assert_eq!(j.attempts, 0);
    assert_eq!(s.get(j.id).unwrap(), Some(j.clone()));
    assert_eq!(s.get(j.id + 100).unwrap(), None);
}

fn listing_filters_by_owner_newest_first(b: &Backend) {
    let s = b.store();
    let a1 = s.submit(&new_job("alice", 0)).unwrap();
    let b = s.submit(&new_job("bob", 0)).unwrap();
    let a2 = s.submit(&new_job("alice", 0)).unwrap();
    let ids = |v: Vec<Job>| v.into_iter().map(|j| j.id).collect::<Vec<_>>();
    assert_eq!(ids(s.list(Some("alice"), 10).unwrap()), vec![a2.id, a1.id]);
    assert_eq!(ids(s.list(None, 10).unwrap()), vec![a2.id, b.id, a1.id]);
    assert_eq!(ids(s.list(None, 1).unwrap()), vec![a2.id]);
}

fn runnable_goes_by_priority_then_age_and_respects_backoff(b: &Backend) {
    let s = b.store();
    let low = s.submit(&new_job("a", 0)).unwrap();
    let high = s.submit(&new_job("a", 5)).unwrap();
    let low2 = s.submit(&new_job("a", 0)).unwrap();
    let ids: Vec<i64> = s
        .runnable(now_ms(), 10)
        .unwrap()
        .iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(ids, vec![high.id, low.id, low2.id]);
    assert!(s.start(high.id).unwrap());
    assert!(s.retry_later(high.id, "lost", now_ms() + 60_000).unwrap());
    let ids: Vec<i64> = s
        .runnable(now_ms(), 10)
        .unwrap()
        .iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(ids, vec![low.id, low2.id], "a job in backoff waits");
    let j = s.get(high.id).unwrap().unwrap();
    assert_eq!((j.state, j.attempts), (State::Queued, 1));
    assert_eq!(j.last_error.as_deref(), Some("lost"));
}

fn progress_and_finish_are_recorded_and_only_while_running(b: &Backend) {
    let s = b.store();
    let j = s.submit(&new_job("a", 0)).unwrap();
    let p = Progress {
        files_done: 1,
        files_total: 2,
        bytes_done: 10,
        bytes_total: 20,
        rate: 5.0,
    };
    s.progress(j.id, &p).unwrap();
    assert_eq!(
        s.get(j.id).unwrap().unwrap().bytes_done,
        0,
        "not running yet"
    );
    assert!(s.start(j.id).unwrap());
    assert!(!s.start(j.id).unwrap(), "started once");
    s.progress(j.id, &p).unwrap();
    let got = s.get(j.id).unwrap().unwrap();
    assert_eq!((got.files_done, got.bytes_total, got.rate), (1, 20, 5.0));
    assert!(s.finish(j.id, State::Done, None).unwrap());
    let got = s.get(j.id).unwrap().unwrap();
    assert_eq!(got.state, State::Done);
    assert!(got.finished_ms.is_some());
    assert!(!s.finish(j.id, State::Failed, Some("late")).unwrap());
}

/// A scheduler tick's writes: every job still running here gets its counters and sample, one
/// that is not (cancelled, ended, never started) is skipped with its sample, at one take of
/// the lock for them all.
fn a_tick_writes_its_running_jobs_at_one_take_and_skips_the_others(b: &Backend) {
    let s = b.store();
    let id = || s.submit(&new_job("a", 0)).unwrap().id;
    let (run, also, cancelled, done, queued) = (id(), id(), id(), id(), id());
    for j in [run, also, cancelled, done] {
        assert!(s.start(j).unwrap());
    }
    s.cancel(cancelled).unwrap();
    assert!(s.finish(done, State::Done, None).unwrap());
    let p = |n: u64| Progress {
        files_done: n,
        files_total: 9,
        bytes_done: n * 10,
        bytes_total: 90,
        rate: n as f64,
    };
    let sample = |t_ms: i64| RateSample {
        t_ms,
        bytes_done: 30,
        rate: 2.5,
    };
    let tick = |n: u64, with_sample: bool| -> Vec<TickWrite> {
        [run, also, cancelled, done, queued]
            .into_iter()
            .map(|id| TickWrite {
                id,
                progress: p(n),
                sample: with_sample.then(|| sample(n as i64)),
            })
            .collect()
    };
    let takes = || s.lock_times().1.count();
    let before = takes();
    let skipped = s.progress_many(&tick(3, true)).unwrap();
    assert_eq!(takes(), before + 1, "one take of the lock for the tick");
    assert_eq!(skipped, vec![cancelled, done, queued]);
    for j in [run, also] {
        let got = s.get(j).unwrap().unwrap();
        assert_eq!(
            (got.files_done, got.bytes_done, got.bytes_total, got.rate),
            (3, 30, 90, 3.0)
        );
        assert_eq!(s.rates(j).unwrap(), vec![sample(3)]);
    }
    for j in [cancelled, done, queued] {
        let got = s.get(j).unwrap().unwrap();
        assert_eq!((got.files_done, got.bytes_done), (0, 0), "job {j}");
        assert!(s.rates(j).unwrap().is_empty(), "job {j}");
    }
    // A tick without samples writes the counters only.
    assert_eq!(
        s.progress_many(&tick(5, false)).unwrap(),
        vec![cancelled, done, queued]
    );
    assert_eq!(s.get(run).unwrap().unwrap().files_done, 5);
    assert_eq!(s.rates(run).unwrap().len(), 1);
    // Nothing to write takes nothing.
    let before = takes();
    assert!(s.progress_many(&[]).unwrap().is_empty());
    assert_eq!(takes(), before);
}

fn cancel_ends_queued_and_running_jobs_but_not_ended_ones(b: &Backend) {
    let s = b.store();
    let q = s.submit(&new_job("a", 0)).unwrap();
    let r = s.submit(&new_job("a", 0)).unwrap();
    assert!(s.start(r.id).unwrap());
    assert_eq!(s.cancel(q.id).unwrap(), State::Queued);
    assert_eq!(s.cancel(r.id).unwrap(), State::Running);
    assert_eq!(s.get(r.id).unwrap().unwrap().state, State::Cancelled);
    assert!(
        !s.finish(r.id, State::Done, None).unwrap(),
        "a cancelled job stays so"
    );
    assert!(matches!(s.cancel(q.id), Err(ServiceError::Ended { .. })));
    assert!(matches!(s.cancel(999), Err(ServiceError::NotFound(999))));
}

fn a_job_running_at_a_crash_is_queued_again_at_open(b: &Backend) {
    let at = b.fresh();
    let id = {
        let s = Store::open_at(&at, "here").unwrap();
        let j = s.submit(&new_job("a", 0)).unwrap();
        assert!(s.start(j.id).unwrap());
        j.id
    };
    let s = Store::open_at(&at, "here").unwrap();
    let j = s.get(id).unwrap().unwrap();
    assert_eq!((j.state, j.attempts), (State::Queued, 1));
    assert_eq!(j.last_error.as_deref(), Some(INTERRUPTED));
    assert_eq!(s.runnable(now_ms(), 10).unwrap().len(), 1);
}

fn a_newer_schema_is_refused(b: &Backend) {
    let at = b.fresh();
    drop(Store::open_at(&at, "here").unwrap());
    Database::open(&at)
        .unwrap()
        .run(
            "INSERT INTO service_migrations (version, applied_at) VALUES (99, 0)",
            &[],
        )
        .unwrap();
    assert!(matches!(
        Store::open_at(&at, "here"),
        Err(ServiceError::TooNew { found: 99, .. })
    ));
}

fn bad_jobs_are_refused_with_why(b: &Backend) {
    let s = b.store();
    let mut j = new_job("a", 0);
    j.sources.clear();
    assert!(s
        .submit(&j)
        .unwrap_err()
        .to_string()
        .contains("at least one source"));
    let mut j = new_job("a", 0);
    j.label = "x".repeat(1000);
    assert!(s.submit(&j).unwrap_err().to_string().contains("label"));
    let mut j = new_job("a", 0);
    j.dest = "a\0b".into();
    assert!(matches!(s.submit(&j), Err(ServiceError::Invalid(_))));
}

fn counts_cover_every_state(b: &Backend) {
    let s = b.store();
    let a = s.submit(&new_job("a", 0)).unwrap();
    s.submit(&new_job("a", 0)).unwrap();
    s.cancel(a.id).unwrap();
    let c = s.counts().unwrap();
    assert_eq!(c.len(), 5);
    assert!(c.contains(&(State::Queued, 1)));
    assert!(c.contains(&(State::Cancelled, 1)));
    assert!(c.contains(&(State::Done, 0)));
}

fn a_version_1_store_is_migrated_to_the_history_tables(b: &Backend) {
    let at = b.fresh();
    {
        let mut db = Database::open(&at).unwrap();
        db.migrate("service_migrations", &MIGRATIONS[..1], 0)
            .unwrap();
        // A job a service from then left running: it has no runner to say whose it is.
        db.run(
            "INSERT INTO jobs (id, kind, dest, sync_mode, priority, label, owner, server, state, \
             attempts, files_done, files_total, bytes_done, bytes_total, rate, created_ms, \
             not_before_ms) VALUES (1, 'put', 'h:1:/', 'off', 0, '', 'a', 'h:1', 'running', \
             1, 0, 0, 0, 0, 0, 0, 0)",
            &[],
        )
        .unwrap();
    }
    let s = Store::open_at(&at, "here").unwrap();
    let old = s.get(1).unwrap().unwrap();
    assert_eq!((old.state, old.runner), (State::Queued, None));
    let j = s.submit(&new_job("a", 0)).unwrap();
    assert_eq!(j.id, 2);
    let r = RateSample {
        t_ms: 5,
        bytes_done: 7,
        rate: 1.5,
    };
    s.add_rate(j.id, &r).unwrap();
    assert_eq!(s.rates(j.id).unwrap(), vec![r]);
}

fn a_long_job_keeps_a_bounded_thinned_history_with_its_newest_sample(b: &Backend) {
    let s = b.store();
    let j = s.submit(&new_job("a", 0)).unwrap();
    let n = MAX_JOB_SAMPLES as i64 * 2 + 10;
    for t in 0..n {
        let r = RateSample {
            t_ms: t * 1000,
            bytes_done: t as u64,
            rate: 1.0,
        };
        s.add_rate(j.id, &r).unwrap();
    }
    let got = s.rates(j.id).unwrap();
    assert!(got.len() <= MAX_JOB_SAMPLES, "{}", got.len());
    assert!(got.len() >= MAX_JOB_SAMPLES / 2, "{}", got.len());
    assert_eq!(got.last().unwrap().t_ms, (n - 1) * 1000);
    assert_eq!(got.first().unwrap().t_ms, 0);
    assert!(got.windows(2).all(|w| w[0].t_ms < w[1].t_ms));
    // Another job's samples are its own.
    let k = s.submit(&new_job("a", 0)).unwrap();
    assert!(s.rates(k.id).unwrap().is_empty());
}

fn link_sample(t_ms: i64, rate: f64, source: Source) -> LinkSample {
    LinkSample {
        t_ms,
        rate,
        rtt_ms: Some(0.5),
        loss: None,
        source,
        job: (source == Source::Transfer).then_some(t_ms),
    }
}

fn link_samples_read_back_newest_bounded_and_since(b: &Backend) {
    let s = b.store();
    for t in 0..10 {
        let src = if t % 2 == 0 {
            Source::Probe
        } else {
            Source::Transfer
        };
        s.add_link_sample("h:1", &link_sample(t, t as f64, src))
            .unwrap();
    }
    s.add_link_sample("h:2", &link_sample(100, 1.0, Source::Probe))
        .unwrap();
    let all = s.link_samples("h:1", i64::MIN, 100).unwrap();
    assert_eq!(all.len(), 10);
    assert_eq!(all[3], link_sample(3, 3.0, Source::Transfer));
    let newest = s.link_samples("h:1", i64::MIN, 3).unwrap();
    assert_eq!(
        newest.iter().map(|x| x.t_ms).collect::<Vec<_>>(),
        vec![7, 8, 9]
    );
    let since = s.link_samples("h:1", 8, 100).unwrap();
    assert_eq!(since.len(), 2);
    assert!(s.link_samples("nowhere", i64::MIN, 100).unwrap().is_empty());
}

fn a_link_keeps_at_most_its_bound_of_samples(b: &Backend) {
    let mut s = b.store();
    s.link_bound = 500;
    // A quiet link's few samples stay however busy another link is.
    s.add_link_sample("quiet:1", &link_sample(-1, 1.0, Source::Probe))
        .unwrap();
    let n = 1000;
    for t in 0..n {
        s.add_link_sample("h:1", &link_sample(t, 1.0, Source::Probe))
            .unwrap();
        let held = s.link_samples("h:1", i64::MIN, 10_000).unwrap().len() as i64;
        assert!(held <= 500 + PRUNE_EVERY, "{held} after {t}");
    }
    let all = s.link_samples("h:1", i64::MIN, usize::MAX >> 1).unwrap();
    assert!(all.len() >= 500, "{}", all.len());
    assert_eq!(all.last().unwrap().t_ms, n - 1);
    assert!(all.windows(2).all(|w| w[1].t_ms == w[0].t_ms + 1));
    assert_eq!(s.link_samples("quiet:1", i64::MIN, 10).unwrap().len(), 1);
}

fn link_tunings_are_kept_replaced_and_survive_a_reopen(b: &Backend) {
    let at = b.fresh();
    let mut rates = std::collections::BTreeMap::new();
    rates.insert(2, 1.5e8);
    rates.insert(3, 1.7e8);
    let t = LinkTuning {
        jobs: 3,
        rates,
        streams: 12,
    };
    {
        let s = Store::open_at(&at, "here").unwrap();
        assert!(s.link_tunings().unwrap().is_empty());
        s.save_link_tuning("a:7070", &LinkTuning::default())
            .unwrap();
        s.save_link_tuning("a:7070", &t).unwrap();
        s.save_link_tuning("b:7070", &LinkTuning::default())
            .unwrap();
    }
    let s = Store::open_at(&at, "here").unwrap();
    let mut kept = s.link_tunings().unwrap();
    kept.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        kept,
        vec![
            ("a:7070".to_owned(), t),
            ("b:7070".to_owned(), LinkTuning::default())
        ]
    );
    // A row that does not read back is left out, not an error.
    s.lock()
        .run(
            "UPDATE link_tuning SET rates = 'not json' WHERE link = 'b:7070'",
            &[],
        )
        .unwrap();
    assert_eq!(s.link_tunings().unwrap().len(), 1);
}

fn a_job_records_its_runner_and_only_a_stale_one_is_taken_over(b: &Backend) {
    let s = b.store();
    let j = s.submit(&new_job("a", 0)).unwrap();
    assert_eq!(j.runner, None);
    assert!(s.start(j.id).unwrap());
    let t0 = now_ms();
    assert_eq!(
        s.get(j.id).unwrap().unwrap().runner.as_deref(),
        Some("here")
    );
    s.beat(t0).unwrap();
    // Its own jobs are never another's stale ones, however old their beat.
    assert_eq!(s.requeue_stale(t0 + 1_000_000).unwrap(), 0);
    assert_eq!(s.lost(&[j.id]).unwrap(), Vec::<i64>::new());
    s.cancel(j.id).unwrap();
    assert_eq!(s.lost(&[j.id]).unwrap(), vec![j.id], "cancelled: stop it");
}

/// Two services on one PostgreSQL queue: each claim is one service's alone, and neither
/// writes the progress or the end of a job the other runs.
fn of_services_sharing_a_queue_one_claims_a_job(b: &Backend) {
    let at = b.fresh();
    let one = Store::open_at(&at, "one").unwrap();
    let two = Store::open_at(&at, "two").unwrap();
    assert!(one.is_shared() && two.is_shared());
    let ids: Vec<i64> = (0..20)
        .map(|i| {
            let by = if i % 2 == 0 { &one } else { &two };
            by.submit(&new_job("a", 0)).unwrap().id
        })
        .collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), 20, "every submit its own id");
    // Both race for every job, from two threads.
    let claims = std::thread::scope(|sc| {
        let a = sc.spawn(|| {
            ids.iter()
                .map(|&id| one.start(id).unwrap())
                .collect::<Vec<_>>()
        });
        let b = sc.spawn(|| {
            ids.iter()
                .map(|&id| two.start(id).unwrap())
                .collect::<Vec<_>>()
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    for (i, &id) in ids.iter().enumerate() {
        assert!(claims.0[i] ^ claims.1[i], "job {id}: exactly one claim");
        let j = one.get(id).unwrap().unwrap();
        let (runs, other) = if claims.0[i] {
            (&one, &two)
        } else {
            (&two, &one)
        };
        assert_eq!((j.attempts, j.runner.as_deref()), (1, Some(runs.name())));
        assert!(!other.finish(id, State::Done, None).unwrap());
        assert!(!other.retry_later(id, "no", 0).unwrap());
        assert!(runs.finish(id, State::Done, None).unwrap());
    }
}

/// A restart requeues its own running jobs only; another's are taken over when its beat
/// is older than the bound, and it then learns it lost them.
fn a_restart_requeues_only_its_own_running_jobs(b: &Backend) {
    let at = b.fresh();
    let one = Store::open_at(&at, "one").unwrap();
    let two = Store::open_at(&at, "two").unwrap();
    let j1 = one.submit(&new_job("a", 0)).unwrap().id;
    let j2 = one.submit(&new_job("a", 0)).unwrap().id;
    assert!(one.start(j1).unwrap());
    assert!(two.start(j2).unwrap());
    drop(one);
    let one = Store::open_at(&at, "one").unwrap();
    let (a, b2) = (one.get(j1).unwrap().unwrap(), one.get(j2).unwrap().unwrap());
    assert_eq!(
        (a.state, a.last_error.as_deref()),
        (State::Queued, Some(INTERRUPTED))
    );
    assert_eq!(
        (b2.state, b2.runner.as_deref()),
        (State::Running, Some("two"))
    );
    // "two" beat at its start; a bound that start is within leaves its job alone.
    let started = b2.started_ms.unwrap();
    assert_eq!(one.requeue_stale(started).unwrap(), 0);
    assert_eq!(one.requeue_stale(started + 1).unwrap(), 1);
    let b2 = one.get(j2).unwrap().unwrap();
    assert_eq!(
        (b2.state, b2.runner, b2.last_error.as_deref()),
        (State::Queued, None, Some(ABANDONED))
    );
    assert_eq!(two.lost(&[j2]).unwrap(), vec![j2]);
    assert!(one.start(j2).unwrap());
    two.progress(
        j2,
        &Progress {
            files_done: 9,
            ..Progress::default()
        },
    )
    .unwrap();
    assert_eq!(
        one.get(j2).unwrap().unwrap().files_done,
        0,
        "a lost job's old runner writes nothing"
    );
    let tick = TickWrite {
        id: j2,
        progress: Progress {
            files_done: 9,
            ..Progress::default()
        },
        sample: Some(RateSample {
            t_ms: 1,
            bytes_done: 1,
            rate: 1.0,
        }),
    };
    assert_eq!(
        two.progress_many(&[tick]).unwrap(),
        vec![j2],
        "nor in a tick"
    );
    assert_eq!(one.get(j2).unwrap().unwrap().files_done, 0);
    assert!(one.rates(j2).unwrap().is_empty());
    assert!(
        one.progress_many(&[tick]).unwrap().is_empty(),
        "its new runner's"
    );
    assert_eq!(one.get(j2).unwrap().unwrap().files_done, 9);
}

/// A job's end (last counters and sample, state, link history, the row read back) is one take
/// of the lock and one transaction, and, as each write alone was, lands only on a job that
/// still runs here: not on one cancelled, never started, or run by another service.
fn a_jobs_end_is_one_take_and_writes_nothing_of_a_job_not_its_own(b: &Backend) {
    let at = b.fresh();
    let s = Store::open_at(&at, "here").unwrap();
    let other = Store::open_at(&at, "there").unwrap();
    let id = || s.submit(&new_job("a", 0)).unwrap().id;
    let (done, failed, retried, cancelled, queued, theirs) = (id(), id(), id(), id(), id(), id());
    for j in [done, failed, retried, cancelled] {
        assert!(s.start(j).unwrap());
    }
    assert!(other.start(theirs).unwrap());
    s.cancel(cancelled).unwrap();
    let last = |id: i64| TickWrite {
        id,
        progress: Progress {
            files_done: 2,
            files_total: 2,
            bytes_done: 40,
            bytes_total: 40,
            rate: 8.0,
        },
        sample: Some(RateSample {
            t_ms: 7,
            bytes_done: 40,
            rate: 8.0,
        }),
    };
    let rate = link_sample(50, 8.0, Source::Transfer);
    let transfer = Some(("h:1", &rate));
    let takes = || s.lock_times().1.count();
    let history = || s.link_samples("h:1", i64::MIN, 100).unwrap();

    let before = takes();
    let done_ending = Ending::Final {
        state: State::Done,
        error: None,
    };
    let c = s
        .conclude(&last(done), done_ending, transfer, true)
        .unwrap();
    assert_eq!(takes(), before + 1, "one take for a job's end");
    assert!(c.recorded);
    let job = c.job.expect("read back");
    assert_eq!(
        (job.id, job.state, job.files_done, job.bytes_done),
        (done, State::Done, 2, 40)
    );
    assert!(job.finished_ms.is_some());
    assert_eq!(s.get(done).unwrap().unwrap(), job);
    assert_eq!(s.rates(done).unwrap(), vec![last(done).sample.unwrap()]);
    assert_eq!(history(), vec![rate]);

    let failing = Ending::Final {
        state: State::Failed,
        error: Some("1 file(s) failed: x"),
    };
    let c = s.conclude(&last(failed), failing, transfer, false).unwrap();
    assert!(c.recorded && c.job.is_none(), "not read back unless asked");
    let got = s.get(failed).unwrap().unwrap();
    assert_eq!(got.state, State::Failed);
    assert_eq!(got.last_error.as_deref(), Some("1 file(s) failed: x"));
    assert_eq!(history().len(), 1, "a failed job's rate is not the link's");

    let retry = Ending::Retry {
        error: "lost",
        not_before_ms: 1234,
    };
    let c = s.conclude(&last(retried), retry, transfer, true).unwrap();
    assert_eq!(
        c,
        Concluded {
            recorded: true,
            job: None
        }
    );
    let got = s.get(retried).unwrap().unwrap();
    assert_eq!(
        (got.state, got.not_before_ms, got.bytes_done),
        (State::Queued, 1234, 40)
    );
    assert_eq!(got.last_error.as_deref(), Some("lost"));
    assert_eq!(history().len(), 1);

    for (j, state) in [
        (cancelled, State::Cancelled),
        (queued, State::Queued),
        (theirs, State::Running),
    ] {
        let before = takes();
        let c = s.conclude(&last(j), done_ending, transfer, true).unwrap();
        assert_eq!(takes(), before + 1);
        assert_eq!(c, Concluded::default(), "job {j}");
        let got = s.get(j).unwrap().unwrap();
        assert_eq!((got.state, got.bytes_done), (state, 0), "job {j}");
        assert!(s.rates(j).unwrap().is_empty(), "job {j}");
        let c = s.conclude(&last(j), retry, None, false).unwrap();
        assert!(!c.recorded, "job {j}");
        assert_eq!(s.get(j).unwrap().unwrap().state, state, "job {j}");
    }
    assert_eq!(history().len(), 1, "no sample for a job not ended here");
    // The other service ends its own.
    assert!(
        other
            .conclude(&last(theirs), done_ending, None, false)
            .unwrap()
            .recorded
    );
    assert_eq!(s.get(theirs).unwrap().unwrap().state, State::Done);
}

/// `/metrics`' reading of the store (job counts, each link's newest samples) and the links'
/// are one take of the lock each, and read what the single calls read.
fn what_metrics_reads_is_one_take(b: &Backend) {
    let s = b.store();
    for p in [0, 0, 1] {
        s.submit(&new_job("a", p)).unwrap();
    }
    let started = s.submit(&new_job("a", 0)).unwrap().id;
    assert!(s.start(started).unwrap());
    for t in 0..5 {
        s.add_link_sample("h:1", &link_sample(t, 1.0, Source::Probe))
            .unwrap();
    }
    s.add_link_sample("h:2", &link_sample(9, 2.0, Source::Transfer))
        .unwrap();
    let links = ["h:1", "h:2", "h:3"];
    let takes = || s.lock_times().1.count();
    let before = takes();
    let seen = s.overview(&links, 3).unwrap();
    assert_eq!(takes(), before + 1, "one take for /metrics' reading");
    assert_eq!(seen.counts, s.counts().unwrap());
    assert_eq!(
        seen.counts
            .iter()
            .map(|(st, n)| (st.as_str(), *n))
            .filter(|c| c.1 > 0)
            .collect::<Vec<_>>(),
        vec![("queued", 3), ("running", 1)]
    );
    let single: Vec<Vec<LinkSample>> = links
        .iter()
        .map(|l| s.link_samples(l, i64::MIN, 3).unwrap())
        .collect();
    assert_eq!(seen.links, single);
    assert_eq!(
        seen.links.iter().map(Vec::len).collect::<Vec<_>>(),
        [3, 1, 0]
    );
    let before = takes();
    assert_eq!(s.links_samples(&links, 3).unwrap(), single);
    assert_eq!(takes(), before + 1);
}
