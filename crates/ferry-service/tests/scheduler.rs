//! The scheduler over real servers: a put of a tree ends done and byte-identical, a get comes
//! back, syncs leave what is the same, a copy goes between two servers, cancel stops a running
//! job, failures are retried with backoff and counted, priority and the per-server limit hold.

use std::time::Duration;

use ferry_service::{classify, Kind, NewJob, State, SyncMode};

use crate::util::*;

fn job(sources: Vec<String>, dest: String) -> NewJob {
    let (kind, server) = classify(&sources, &dest).unwrap();
    NewJob {
        kind,
        sources,
        dest,
        sync: SyncMode::Off,
        priority: 0,
        deadline: None,
        label: "test".into(),
        owner: "alice".into(),
        server,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_put_of_a_tree_reaches_done_with_the_files_identical() {
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    let top = make_tree(local.path(), "run42");
    let known = local.path().join("known_hosts");
    let (s, _stop) = start_scheduler(
        runner(local.path(), vec![server.endpoint()], known),
        limits(),
    );
    let dest = format!("{}:/in", server.addr);
    std::fs::create_dir(server.root.join("in")).unwrap();
    let j = s.store().submit(&job(vec!["/run42".into()], dest)).unwrap();
    assert_eq!(j.kind, Kind::Put);
    s.wake();
    let j = wait_end(s.store(), j.id).await;
    assert_eq!(j.state, State::Done, "{j:?}");
    assert_eq!(j.attempts, 1);
    assert_eq!((j.files_done, j.files_total), (5, 5), "{j:?}");
    assert_eq!(j.bytes_total, 100_000 + 300_001 + 65_536 + 1);
    assert_eq!(tree_bytes(&server.root.join("in/run42")), tree_bytes(&top));
    assert!(s.moved() >= j.bytes_total);
    server.stop().await;
}

/// A put whose block went out again as the endgame's copy (one of its connections stuck at
/// its first block, as when a link goes dark) ends done with its progress whole: the block
/// counts once, though the only copy written was the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_done_job_whose_block_was_sent_again_reads_whole() {
    const SIZE: usize = 40 * BLOCK as usize + 3;
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    make_file(&local.path().join("stuck.bin"), SIZE);
    let known = local.path().join("known_hosts");
    let mut r = runner(local.path(), vec![server.endpoint()], known);
    r.fixed_streams = Some(2);
    r.stall_stream = Some(1);
    let (s, _stop) = start_scheduler(r, limits());
    let dest = format!("{}:/", server.addr);
    let j = s
        .store()
        .submit(&job(vec!["/stuck.bin".into()], dest))
        .unwrap();
    s.wake();
    let j = wait_end(s.store(), j.id).await;
    assert_eq!(j.state, State::Done, "{j:?}");
    assert_eq!((j.files_done, j.files_total), (1, 1), "{j:?}");
    assert_eq!(
        (j.bytes_done, j.bytes_total),
        (SIZE as u64, SIZE as u64),
        "{j:?}"
    );
    assert_eq!(
        std::fs::read(server.root.join("stuck.bin")).unwrap(),
        std::fs::read(local.path().join("stuck.bin")).unwrap()
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_get_and_a_sync_put_come_out_identical() {
    let server = TestServer::start().await;
    let top = make_tree(&server.root, "remote");
    let local = tempfile::tempdir().unwrap();
    let known = local.path().join("known_hosts");
    let (s, _stop) = start_scheduler(
        runner(local.path(), vec![server.endpoint()], known),
        limits(),
    );
    let get = job(vec![format!("{}:/remote", server.addr)], "/back".into());
    assert_eq!(get.kind, Kind::Get);
    let g = s.store().submit(&get).unwrap();
    s.wake();
    let g = wait_end(s.store(), g.id).await;
    assert_eq!(g.state, State::Done, "{g:?}");
    assert_eq!(
        tree_bytes(&local.path().join("back/remote")),
        tree_bytes(&top)
    );
    // A sync put of what came back, into the same place: nothing differs, and it is done.
    let mut sync = job(vec!["/back/remote".into()], format!("{}:/", server.addr));
    sync.sync = SyncMode::Mtime;
    let p = s.store().submit(&sync).unwrap();
    s.wake();
    let p = wait_end(s.store(), p.id).await;
    assert_eq!(p.state, State::Done, "{p:?}");
    assert_eq!(tree_bytes(&server.root.join("remote")), tree_bytes(&top));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sync_by_size_leaves_same_size_files_and_replaces_the_others() {
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    let top = make_tree(local.path(), "run42");
    let known = local.path().join("known_hosts");
    let (s, _stop) = start_scheduler(
        runner(local.path(), vec![server.endpoint()], known),
        limits(),
    );
    let dest = format!("{}:/", server.addr);
    let first = s
        .store()
        .submit(&job(vec!["/run42".into()], dest.clone()))
        .unwrap();
    s.wake();
    assert_eq!(wait_end(s.store(), first.id).await.state, State::Done);
    // At the destination: one file changed but the same size (left alone by size), one of
    // another size (replaced), one gone (sent again).
    let there = server.root.join("run42");
    std::fs::write(there.join("b.bin"), b"X").unwrap();
    std::fs::write(there.join("e.bin"), b"shorter").unwrap();
    std::fs::remove_file(there.join("sub/c.bin")).unwrap();
    let mut sync = job(vec!["/run42".into()], dest);
    sync.sync = SyncMode::Size;
    let j = s.store().submit(&sync).unwrap();
    s.wake();
    let j = wait_end(s.store(), j.id).await;
    assert_eq!(j.state, State::Done, "{j:?}");
    assert_eq!(
        std::fs::read(there.join("b.bin")).unwrap(),
        b"X",
        "same size: not sent"
    );
    assert_eq!(
        j.bytes_done,
        65_536 + 100_000,
        "only what differs in size was sent: {j:?}"
    );
    let mut want = tree_bytes(&top);
    for (rel, data) in &mut want {
        if rel == "b.bin" {
            *data = b"X".to_vec();
        }
    }
    assert_eq!(tree_bytes(&there), want);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_between_two_servers_goes_from_one_to_the_other() {
    let a = TestServer::start_with(|c| c.third_party = true).await;
    let b = TestServer::start_with(|c| c.third_party = true).await;
    let top = make_tree(&a.root, "run42");
    let local = tempfile::tempdir().unwrap();
    let r = runner(
        local.path(),
        vec![a.endpoint(), b.endpoint()],
        local.path().join("kh"),
    );
    let (s, _stop) = start_scheduler(r, limits());
    let cp = job(vec![format!("{}:/run42", a.addr)], format!("{}:/", b.addr));
    assert_eq!((cp.kind, cp.server.clone()), (Kind::Cp, b.addr.to_string()));
    let j = s.store().submit(&cp).unwrap();
    s.wake();
    let j = wait_end(s.store(), j.id).await;
    assert_eq!(j.state, State::Done, "{j:?}");
    assert_eq!(tree_bytes(&b.root.join("run42")), tree_bytes(&top));
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_stops_a_running_job_for_good() {
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    make_file(&local.path().join("big"), 4 << 20);
    let mut r = runner(
        local.path(),
        vec![server.endpoint()],
        local.path().join("kh"),
    );
    // 64 blocks at 50 ms each: running for seconds.
    r.pace = Some(Duration::from_millis(50));
    let (s, _stop) = start_scheduler(r, limits());
    let j = s
        .store()
        .submit(&job(vec!["/big".into()], format!("{}:/", server.addr)))
        .unwrap();
    s.wake();
    wait_job(s.store(), j.id, Duration::from_secs(30), |j| {
        j.state == State::Running && j.bytes_done > 0
    })
    .await;
    assert_eq!(s.store().cancel(j.id).unwrap(), State::Running);
    s.stop(j.id);
    assert_eq!(s.running(), 0);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = s.store().get(j.id).unwrap().unwrap();
    assert_eq!(after.state, State::Cancelled, "{after:?}");
    assert!(
        !server.root.join("big").exists(),
        "the cancelled file never completed"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_that_is_down_is_retried_with_backoff_then_the_job_fails() {
    let local = tempfile::tempdir().unwrap();
    make_file(&local.path().join("f"), 1000);
    // A port nothing listens on: every attempt is refused, which a retry may fix.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let endpoint = ferry_service::Endpoint {
        server: addr.to_string(),
        token: TOKEN.into(),
        fingerprint: None,
        plaintext: true,
    };
    let lim = ferry_service::Limits {
        max_attempts: 3,
        ..limits()
    };
    let (s, _stop) = start_scheduler(
        runner(local.path(), vec![endpoint], local.path().join("kh")),
        lim,
    );
    let j = s
        .store()
        .submit(&job(vec!["/f".into()], format!("{addr}:/")))
        .unwrap();
    s.wake();
    let j = wait_end(s.store(), j.id).await;
    assert_eq!((j.state, j.attempts), (State::Failed, 3), "{j:?}");
    assert!(j.last_error.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn higher_priority_runs_first_and_one_server_gets_at_most_its_limit() {
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    for i in 0..4 {
        make_file(&local.path().join(format!("f{i}")), 256 << 10);
    }
    let mut r = runner(
        local.path(),
        vec![server.endpoint()],
        local.path().join("kh"),
    );
    r.pace = Some(Duration::from_millis(20));
    let lim = ferry_service::Limits {
        per_server: 1,
        ..limits()
    };
    // All queued before the scheduler first looks.
    let store = std::sync::Arc::new(ferry_service::Store::open(None).unwrap());
    let mut ids = Vec::new();
    for i in 0..4 {
        let mut n = job(vec![format!("/f{i}")], format!("{}:/", server.addr));
        n.priority = if i == 3 { 10 } else { 0 };
        ids.push(store.submit(&n).unwrap().id);
    }
    let (s, _stop) = start_scheduler_on(store, r, lim);
    let mut most = 0;
    let t0 = std::time::Instant::now();
    while ids
        .iter()
        .any(|id| !s.store().get(*id).unwrap().unwrap().state.is_final())
    {
        assert!(t0.elapsed() < Duration::from_secs(60), "the jobs end");
        most = most.max(s.running());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(most, 1, "one job at a time against one server");
    let started: Vec<i64> = ids
        .iter()
        .map(|id| s.store().get(*id).unwrap().unwrap().started_ms.unwrap())
        .collect();
    assert!(
        started[3] <= started[0],
        "the high-priority job started first: {started:?}"
    );
    server.stop().await;
}

/// A job's local path may not pass through a symlink inside the local root: a get into it, a
/// sync get into it and a sync put from it all fail with why, and nothing is read or written
/// where the link points.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_local_path_through_a_symlink_is_refused_both_ways() {
    let server = TestServer::start().await;
    make_tree(&server.root, "remote");
    let local = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    make_tree(outside.path(), "secret");
    std::os::unix::fs::symlink(outside.path(), local.path().join("out")).unwrap();
    let known = local.path().join("known_hosts");
    let (s, _stop) = start_scheduler(
        runner(local.path(), vec![server.endpoint()], known),
        limits(),
    );
    let run = |j: NewJob| {
        let s = s.clone();
        async move {
            let j = s.store().submit(&j).unwrap();
            s.wake();
            wait_end(s.store(), j.id).await
        }
    };
    let remote = format!("{}:/remote", server.addr);
    for (dest, sync) in [
        ("/out", SyncMode::Off),
        ("/out/deeper", SyncMode::Off),
        ("/out", SyncMode::Mtime),
        ("/out", SyncMode::Size),
    ] {
        let mut get = job(vec![remote.clone()], dest.into());
        get.sync = sync;
        let g = run(get).await;
        assert_eq!(g.state, State::Failed, "{dest} {sync:?}: {g:?}");
        let why = g.last_error.unwrap_or_default();
        assert!(why.contains("symlink"), "{dest} {sync:?}: {why}");
    }
    assert!(!outside.path().join("remote").exists());
    assert!(!outside.path().join("deeper").exists());
    for sync in [SyncMode::Mtime, SyncMode::Size] {
        let mut put = job(vec!["/out/secret".into()], format!("{}:/", server.addr));
        put.sync = sync;
        let p = run(put).await;
        assert_eq!(p.state, State::Failed, "{sync:?}: {p:?}");
        assert!(p.last_error.unwrap_or_default().contains("symlink"));
    }
    assert!(!server.root.join("secret").exists());
    // The same get into a real directory works.
    let g = run(job(vec![remote], "/in".into())).await;
    assert_eq!(g.state, State::Done, "{g:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_optimizer_adds_jobs_on_a_link_while_they_move_more_and_keeps_what_it_learnt() {
    use ferry_service::optimizer::OptimizerConfig;
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    let n = 9;
    for i in 0..n {
        make_file(&local.path().join(format!("f{i}")), 2 << 20);
    }
    let mut r = runner(
        local.path(),
        vec![server.endpoint()],
        local.path().join("kh"),
    );
    // Each job is held to a few MB/s by the pace hook, so the link moves more with each job
    // that shares it: the optimizer should climb from 1 to the cap of 3.
    r.pace = Some(Duration::from_millis(20));
    let lim = ferry_service::Limits {
        per_server: 3,
        optimizer: OptimizerConfig {
            first_jobs: 1,
            window: Duration::from_millis(300),
            reprobe_after: 1000,
            ..OptimizerConfig::default()
        },
        ..limits()
    };
    let db = local.path().join("jobs.db");
    let store = std::sync::Arc::new(ferry_service::Store::open(Some(&db)).unwrap());
    let mut ids = Vec::new();
    for i in 0..n {
        let j = job(vec![format!("/f{i}")], format!("{}:/", server.addr));
        ids.push(store.submit(&j).unwrap().id);
    }
    let (s, stop) = start_scheduler_on(store, r, lim);
    let (mut first, mut most) = (None, 0);
    let t0 = std::time::Instant::now();
    while ids
        .iter()
        .any(|id| !s.store().get(*id).unwrap().unwrap().state.is_final())
    {
        assert!(t0.elapsed() < Duration::from_secs(90), "the jobs end");
        let running = s.running();
        if running > 0 && first.is_none() {
            first = Some(running);
        }
        most = most.max(running);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for id in &ids {
        assert_eq!(s.store().get(*id).unwrap().unwrap().state, State::Done);
    }
    assert_eq!(first, Some(1), "a link with no history starts with one job");
    assert!(
        most >= 2,
        "the optimizer let more jobs share the link: {most}"
    );
    assert!(most <= 3, "never past --per-server: {most}");
    let link = server.addr.to_string();
    let tuning = s.link_tuning(&link).expect("the link has a tuning");
    assert!(
        tuning.rates.contains_key(&1),
        "one job was measured: {tuning:?}"
    );
    assert!((1..=3).contains(&tuning.jobs), "{tuning:?}");
    drop(stop);
    // What it learnt is in the store, and a new scheduler starts from it.
    let again = ferry_service::Store::open(Some(&db)).unwrap();
    let kept = again.link_tunings().unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].0, link);
    assert!(kept[0].1.rates.contains_key(&1), "{kept:?}");
    let (s2, _stop2) = start_scheduler_on(
        std::sync::Arc::new(again),
        runner(
            local.path(),
            vec![server.endpoint()],
            local.path().join("kh"),
        ),
        limits(),
    );
    assert_eq!(
        s2.link_tuning(&link).map(|t| t.rates),
        Some(kept[0].1.rates.clone())
    );
    server.stop().await;
}
