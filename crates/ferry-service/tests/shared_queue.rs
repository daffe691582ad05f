//! Several services on one PostgreSQL queue (a throwaway cluster, ferry-catalog's
//! `TestCluster`): every job runs once, on one of them; a service that dies mid-job has that
//! job taken over by another once its heartbeat is older than the bound.

use std::sync::Arc;
use std::time::Duration;

use ferry_catalog::TestCluster;
use ferry_service::{classify, Limits, NewJob, Scheduler, State, Store, SyncMode};

use crate::util::*;

fn cluster(test: &str) -> Option<TestCluster> {
    ferry_netem::needs(test, TestCluster::start())
}

fn put(source: &str, server: &TestServer, dir: &str) -> NewJob {
    let sources = vec![source.to_owned()];
    let dest = format!("{}:/{dir}", server.addr);
    let (kind, server) = classify(&sources, &dest).unwrap();
    NewJob {
        kind,
        sources,
        dest,
        sync: SyncMode::Off,
        priority: 0,
        deadline: None,
        label: "shared".into(),
        owner: "alice".into(),
        server,
    }
}

/// Limits with a short heartbeat bound: a dead service's job is taken over in seconds.
fn shared_limits() -> Limits {
    Limits {
        stale_after: Duration::from_secs(2),
        ..limits()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_services_on_one_queue_run_every_job_exactly_once() {
    let Some(cluster) =
        cluster("shared_queue::two_services_on_one_queue_run_every_job_exactly_once")
    else {
        return;
    };
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    let queue = cluster.database();
    let one = Arc::new(Store::open_at(&queue, "one").unwrap());
    let two = Arc::new(Store::open_at(&queue, "two").unwrap());
    const N: usize = 16;
    let mut ids = Vec::new();
    for i in 0..N {
        make_file(&local.path().join(format!("f{i}")), 50_000 + i * 1000);
        std::fs::create_dir(server.root.join(format!("in{i}"))).unwrap();
        let by = if i % 2 == 0 { &one } else { &two };
        ids.push(
            by.submit(&put(&format!("/f{i}"), &server, &format!("in{i}")))
                .unwrap()
                .id,
        );
    }
    // Both look at the queue at once, each allowed several jobs.
    let lim = Limits {
        total: 4,
        ..shared_limits()
    };
    let run = |store: &Arc<Store>, known: &str| {
        start_scheduler_on(
            store.clone(),
            runner(
                local.path(),
                vec![server.endpoint()],
                local.path().join(known),
            ),
            lim.clone(),
        )
    };
    let (s1, stop1) = run(&one, "known1");
    let (s2, stop2) = run(&two, "known2");
    for &id in &ids {
        let j = wait_end(&one, id).await;
        assert_eq!(j.state, State::Done, "{j:?}");
        assert_eq!(j.attempts, 1, "run once: {j:?}");
        assert!(matches!(j.runner.as_deref(), Some("one" | "two")), "{j:?}");
    }
    for i in 0..N {
        let sent = std::fs::read(server.root.join(format!("in{i}/f{i}"))).unwrap();
        assert_eq!(
            sent,
            std::fs::read(local.path().join(format!("f{i}"))).unwrap()
        );
    }
    let ran = |s: &Scheduler| s.store().counts().unwrap();
    assert_eq!(ran(&s1), ran(&s2), "one queue, seen alike from both");
    let _ = (stop1.send(()), stop2.send(()));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_service_s_job_is_taken_over_after_the_heartbeat_bound() {
    let Some(cluster) =
        cluster("shared_queue::a_dead_service_s_job_is_taken_over_after_the_heartbeat_bound")
    else {
        return;
    };
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    // 2 MiB at 64 KiB blocks, 200 ms each: half a minute unless taken over.
    make_file(&local.path().join("big"), 2 << 20);
    std::fs::create_dir(server.root.join("in")).unwrap();
    let queue = cluster.database();
    let one = Arc::new(Store::open_at(&queue, "one").unwrap());
    let mut slow = runner(
        local.path(),
        vec![server.endpoint()],
        local.path().join("known1"),
    );
    slow.pace = Some(Duration::from_millis(200));
    let dying = Scheduler::new(one.clone(), slow, shared_limits());
    let task = tokio::spawn(dying.clone().run(std::future::pending::<()>()));
    let id = one.submit(&put("/big", &server, "in")).unwrap().id;
    dying.wake();
    let j = wait_job(&one, id, Duration::from_secs(30), |j| {
        j.state == State::Running && j.bytes_done > 0
    })
    .await;
    assert_eq!(j.runner.as_deref(), Some("one"));
    // Killed: no more beats, its transfer gone, its job left running in the queue.
    task.abort();
    let _ = task.await;
    dying.stop(id);
    assert_eq!(one.get(id).unwrap().unwrap().state, State::Running);

    let two = Arc::new(Store::open_at(&queue, "two").unwrap());
    let (_s2, stop2) = start_scheduler_on(
        two.clone(),
        runner(
            local.path(),
            vec![server.endpoint()],
            local.path().join("known2"),
        ),
        shared_limits(),
    );
    let j = wait_job(&two, id, Duration::from_secs(60), |j| j.state.is_final()).await;
    assert_eq!(j.state, State::Done, "{j:?}");
    assert_eq!(
        (j.attempts, j.runner.as_deref()),
        (2, Some("two")),
        "taken over once, by the live service: {j:?}"
    );
    assert_eq!(
        std::fs::read(server.root.join("in/big")).unwrap(),
        std::fs::read(local.path().join("big")).unwrap()
    );
    let _ = stop2.send(());
    server.stop().await;
}
