use super::*;

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

#[test]
fn a_submitted_job_reads_back_as_given_and_queued() {
    let s = Store::open(None).unwrap();
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

#[test]
fn listing_filters_by_owner_newest_first() {
    let s = Store::open(None).unwrap();
    let a1 = s.submit(&new_job("alice", 0)).unwrap();
    let b = s.submit(&new_job("bob", 0)).unwrap();
    let a2 = s.submit(&new_job("alice", 0)).unwrap();
    let ids = |v: Vec<Job>| v.into_iter().map(|j| j.id).collect::<Vec<_>>();
    assert_eq!(ids(s.list(Some("alice"), 10).unwrap()), vec![a2.id, a1.id]);
    assert_eq!(ids(s.list(None, 10).unwrap()), vec![a2.id, b.id, a1.id]);
    assert_eq!(ids(s.list(None, 1).unwrap()), vec![a2.id]);
}

#[test]
fn runnable_goes_by_priority_then_age_and_respects_backoff() {
    let s = Store::open(None).unwrap();
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

#[test]
fn progress_and_finish_are_recorded_and_only_while_running() {
    let s = Store::open(None).unwrap();
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

#[test]
fn cancel_ends_queued_and_running_jobs_but_not_ended_ones() {
    let s = Store::open(None).unwrap();
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

#[test]
fn a_job_running_at_a_crash_is_queued_again_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    let id = {
        let s = Store::open(Some(&path)).unwrap();
        let j = s.submit(&new_job("a", 0)).unwrap();
        assert!(s.start(j.id).unwrap());
        j.id
    };
    let s = Store::open(Some(&path)).unwrap();
    let j = s.get(id).unwrap().unwrap();
    assert_eq!((j.state, j.attempts), (State::Queued, 1));
    assert_eq!(j.last_error.as_deref(), Some(INTERRUPTED));
    assert_eq!(s.runnable(now_ms(), 10).unwrap().len(), 1);
}

#[test]
fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    drop(Store::open(Some(&path)).unwrap());
    let c = Connection::open(&path).unwrap();
    c.execute(
        "INSERT INTO service_migrations (version, applied_at) VALUES (99, 0)",
        [],
    )
    .unwrap();
    drop(c);
    assert!(matches!(
        Store::open(Some(&path)),
        Err(ServiceError::TooNew { found: 99, .. })
    ));
}

#[test]
fn bad_jobs_are_refused_with_why() {
    let s = Store::open(None).unwrap();
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

#[test]
fn counts_cover_every_state() {
    let s = Store::open(None).unwrap();
    let a = s.submit(&new_job("a", 0)).unwrap();
    s.submit(&new_job("a", 0)).unwrap();
    s.cancel(a.id).unwrap();
    let c = s.counts().unwrap();
    assert_eq!(c.len(), 5);
    assert!(c.contains(&(State::Queued, 1)));
    assert!(c.contains(&(State::Cancelled, 1)));
    assert!(c.contains(&(State::Done, 0)));
}

#[test]
fn a_version_1_store_is_migrated_to_the_history_tables() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    {
        let c = Connection::open(&path).unwrap();
        c.execute_batch(
            "CREATE TABLE service_migrations (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)",
        )
        .unwrap();
        c.execute_batch(V1).unwrap();
        c.execute(
            "INSERT INTO service_migrations (version, applied_at) VALUES (1, 0)",
            [],
        )
        .unwrap();
    }
    let s = Store::open(Some(&path)).unwrap();
    let j = s.submit(&new_job("a", 0)).unwrap();
    let r = RateSample {
        t_ms: 5,
        bytes_done: 7,
        rate: 1.5,
    };
    s.add_rate(j.id, &r).unwrap();
    assert_eq!(s.rates(j.id).unwrap(), vec![r]);
}

#[test]
fn a_long_job_keeps_a_bounded_thinned_history_with_its_newest_sample() {
    let s = Store::open(None).unwrap();
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

#[test]
fn link_samples_read_back_newest_bounded_and_since() {
    let s = Store::open(None).unwrap();
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

#[test]
fn a_link_keeps_at_most_its_bound_of_samples() {
    let mut s = Store::open(None).unwrap();
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

#[test]
fn link_tunings_are_kept_replaced_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    let mut rates = std::collections::BTreeMap::new();
    rates.insert(2, 1.5e8);
    rates.insert(3, 1.7e8);
    let t = LinkTuning {
        jobs: 3,
        rates,
        streams: 12,
    };
    {
        let s = Store::open(Some(&path)).unwrap();
        assert!(s.link_tunings().unwrap().is_empty());
        s.save_link_tuning("a:7070", &LinkTuning::default())
            .unwrap();
        s.save_link_tuning("a:7070", &t).unwrap();
        s.save_link_tuning("b:7070", &LinkTuning::default())
            .unwrap();
    }
    let s = Store::open(Some(&path)).unwrap();
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
        .execute(
            "UPDATE link_tuning SET rates = 'not json' WHERE link = 'b:7070'",
            [],
        )
        .unwrap();
    assert_eq!(s.link_tunings().unwrap().len(), 1);
}
