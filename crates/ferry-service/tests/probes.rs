//! Scheduled probes of the service's links against a real ferry server on loopback: they
//! record rate, RTT and loss, show in `/metrics`, and never run while a job runs on the link
//! (nor does a job start while its link is probed).

use std::time::{Duration, Instant};

use ferry_service::history::{LinkSample, Source};
use ferry_service::prober::ProbeSchedule;
use ferry_service::State;
use hyper::Method;

use crate::util::*;

fn schedule(ms: u64) -> Option<ProbeSchedule> {
    Some(ProbeSchedule {
        every: Duration::from_millis(ms),
        duration: Duration::from_millis(300),
    })
}

fn probes(svc: &TestService, link: &str) -> Vec<LinkSample> {
    svc.store
        .link_samples(link, i64::MIN, 10_000)
        .unwrap()
        .into_iter()
        .filter(|s| s.source == Source::Probe)
        .collect()
}

/// Waits until `link` has at least `n` probe samples, at most `within`.
async fn wait_probes(svc: &TestService, link: &str, n: usize, within: Duration) -> Vec<LinkSample> {
    let t0 = Instant::now();
    loop {
        let p = probes(svc, link);
        if p.len() >= n {
            return p;
        }
        assert!(
            t0.elapsed() < within,
            "{} probe samples after {within:?}",
            p.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scheduled_probes_record_rate_rtt_and_loss_and_show_in_metrics() {
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    let svc = TestService::start_with(&server, local.path(), |c| c.probe = schedule(200)).await;
    let link = server.addr.to_string();
    let p = wait_probes(&svc, &link, 2, Duration::from_secs(30)).await;
    for s in &p {
        assert!(s.rate > 0.0, "{s:?}");
        assert!(s.rtt_ms.is_some_and(|r| r > 0.0), "{s:?}");
        assert!(s.loss.is_some_and(|l| (0.0..=1.0).contains(&l)), "{s:?}");
        assert_eq!(s.job, None);
    }
    assert!(p[1].t_ms > p[0].t_ms);
    let alice = svc.client("alice");
    let l = alice.links().await.unwrap().links.remove(0);
    assert_eq!(l.last.unwrap().source, Source::Probe);
    let a = alice
        .request(Method::GET, "/metrics", vec![], false)
        .await
        .unwrap();
    let text = String::from_utf8(a.body).unwrap();
    for want in [
        "# TYPE ferry_service_link_rate_bytes_per_second gauge".to_owned(),
        "# TYPE ferry_service_link_flagged gauge".to_owned(),
        format!("ferry_service_link_flagged{{link=\"{link}\"}} 0"),
    ] {
        assert!(text.lines().any(|l| l == want), "{want:?} in\n{text}");
    }
    let prefix = format!("ferry_service_link_rate_bytes_per_second{{link=\"{link}\"}} ");
    let rate: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap()
        .parse()
        .unwrap();
    assert!(rate > 0.0, "{text}");
    assert!(text.contains(&format!(
        "ferry_service_link_rtt_seconds{{link=\"{link}\"}} "
    )));
    svc.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_probe_runs_while_a_job_runs_on_its_link() {
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    make_file(&local.path().join("f"), 4 << 20);
    // Paced: the job runs for seconds, while probes are due every 100 ms.
    let svc = TestService::start_with(&server, local.path(), |c| {
        c.probe = schedule(100);
        c.pace = Some(Duration::from_millis(200));
    })
    .await;
    let link = server.addr.to_string();
    wait_probes(&svc, &link, 1, Duration::from_secs(30)).await;
    let alice = svc.client("alice");
    let j = alice
        .submit(&request(&["/f"], &format!("{link}:/")))
        .await
        .unwrap();
    let j = wait_api(&alice, j.id, Duration::from_secs(30), |j| {
        j.state == State::Running
    })
    .await;
    let before = probes(&svc, &link).len();
    let mut looked = 0;
    loop {
        // The count first, then the state: a count read while the job still runs.
        let n = probes(&svc, &link).len();
        let state = svc.store.get(j.id).unwrap().unwrap().state;
        if state != State::Running {
            break;
        }
        assert_eq!(n, before, "a probe ran while job {} ran on {link}", j.id);
        looked += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        looked >= 10,
        "the job ran long enough to tell ({looked} looks)"
    );
    let end = svc.store.get(j.id).unwrap().unwrap();
    assert_eq!(end.state, State::Done, "{end:?}");
    // Free again, the link is probed again.
    wait_probes(&svc, &link, before + 1, Duration::from_secs(30)).await;
    // And none of the probes ended within the job's run.
    let (from, to) = (end.started_ms.unwrap(), end.finished_ms.unwrap());
    for s in probes(&svc, &link) {
        assert!(
            !(from..to).contains(&s.t_ms),
            "a probe ended at {} in {from}..{to}",
            s.t_ms
        );
    }
    svc.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_waits_while_its_link_is_probed() {
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    make_file(&local.path().join("f"), 1000);
    let svc = TestService::start(&server, local.path()).await;
    let link = server.addr.to_string();
    let claim = svc
        .scheduler
        .claim_link(&link)
        .expect("an idle link is free");
    assert!(
        svc.scheduler.claim_link(&link).is_none(),
        "one probe at a time"
    );
    let alice = svc.client("alice");
    let j = alice
        .submit(&request(&["/f"], &format!("{link}:/")))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(alice.job(j.id).await.unwrap().state, State::Queued);
    drop(claim);
    let j = wait_api(&alice, j.id, Duration::from_secs(30), |j| {
        j.state.is_final()
    })
    .await;
    assert_eq!(j.state, State::Done, "{j:?}");
    svc.stop().await;
    server.stop().await;
}
