//! Job rate samples and link history over the API: the JSON shapes the dashboard reads, who
//! may read them, and that a finished put leaves rate samples on its job and a transfer sample
//! on its link.

use std::time::Duration;

use ferry_service::history::Source;
use ferry_service::{ServiceError, State};
use hyper::Method;
use serde_json::Value;

use crate::util::*;

/// `path`'s JSON answer with `who`'s token, and its status.
async fn get_json(svc: &TestService, who: &str, path: &str) -> (u16, Value) {
    let a = svc
        .client(who)
        .request(Method::GET, path, vec![], true)
        .await
        .unwrap();
    (a.status, serde_json::from_slice(&a.body).unwrap())
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v.as_object().unwrap().keys().map(|s| s.as_str()).collect();
    k.sort();
    k
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_finished_put_leaves_rate_samples_on_its_job_and_a_transfer_sample_on_its_link() {
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    make_file(&local.path().join("f"), 4 << 20);
    // Paced so that the job runs for more than a second: several samples, a second apart.
    let svc = TestService::start_with(&server, local.path(), |c| {
        c.pace = Some(Duration::from_millis(200))
    })
    .await;
    let alice = svc.client("alice");
    let link = server.addr.to_string();
    let j = alice
        .submit(&request(&["/f"], &format!("{link}:/")))
        .await
        .unwrap();
    let j = wait_api(&alice, j.id, Duration::from_secs(60), |j| {
        j.state.is_final()
    })
    .await;
    assert_eq!(j.state, State::Done, "{j:?}");

    let rates = alice.rates(j.id).await.unwrap();
    assert_eq!(rates.job, j.id);
    assert!(rates.samples.len() >= 2, "{rates:?}");
    let last = rates.samples.last().unwrap();
    assert_eq!(last.bytes_done, 4 << 20);
    assert!(rates.samples.iter().all(|s| s.rate >= 0.0));
    // At most one a second while it runs (the last, at its end, may come sooner).
    let n = rates.samples.len();
    for w in rates.samples[..n - 1].windows(2) {
        assert!(w[1].t_ms - w[0].t_ms >= 900, "{rates:?}");
    }
    assert!(rates.samples.iter().any(|s| s.rate > 0.0), "{rates:?}");

    let h = alice.link_history(&link, None).await.unwrap();
    assert_eq!(h.name, link);
    assert_eq!(h.samples.len(), 1, "{h:?}");
    let s = h.samples[0];
    assert_eq!((s.source, s.job), (Source::Transfer, Some(j.id)));
    assert!(
        s.rate > 0.0 && s.rtt_ms.is_none() && s.loss.is_none(),
        "{s:?}"
    );
    let links = alice.links().await.unwrap();
    assert_eq!(links.links.len(), 1);
    let l = &links.links[0];
    assert_eq!(
        (l.name.as_str(), l.last, l.flagged),
        (link.as_str(), Some(s), false)
    );
    assert!(l.reason.is_none());
    // since_ms after the sample: nothing.
    let later = alice.link_history(&link, Some(s.t_ms + 1)).await.unwrap();
    assert!(later.samples.is_empty());
    svc.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_endpoints_answer_in_the_dashboards_shapes_and_keep_jobs_to_their_owners() {
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    make_file(&local.path().join("f"), 100_000);
    let svc = TestService::start(&server, local.path()).await;
    let alice = svc.client("alice");
    let link = server.addr.to_string();
    let j = alice
        .submit(&request(&["/f"], &format!("{link}:/")))
        .await
        .unwrap();
    wait_api(&alice, j.id, Duration::from_secs(60), |j| {
        j.state == State::Done
    })
    .await;

    let (st, v) = get_json(&svc, "alice", &format!("/api/jobs/{}/rates", j.id)).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(keys(&v), ["job", "samples"]);
    assert_eq!(v["job"], j.id);
    let sample = &v["samples"][0];
    assert_eq!(keys(sample), ["bytes_done", "rate", "t_ms"]);
    assert!(sample["t_ms"].is_i64() && sample["bytes_done"].is_u64() && sample["rate"].is_f64());

    // Another's job is no job; an admin sees it.
    let (st, v) = get_json(&svc, "bob", &format!("/api/jobs/{}/rates", j.id)).await;
    assert_eq!(st, 404, "{v}");
    assert!(v["error"].as_str().unwrap().contains("no job"), "{v}");
    let (st, _) = get_json(&svc, "ops", &format!("/api/jobs/{}/rates", j.id)).await;
    assert_eq!(st, 200);
    let (st, _) = get_json(&svc, "alice", "/api/jobs/999/rates").await;
    assert_eq!(st, 404);

    // Any valid token reads the links.
    let (st, v) = get_json(&svc, "bob", "/api/links").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(keys(&v), ["links"]);
    let l = &v["links"][0];
    assert_eq!(
        keys(l),
        ["flagged", "last", "median_rate", "name", "reason", "tuning"]
    );
    // A job ran on it: the optimizer's choice for the link is there too.
    assert_eq!(keys(&l["tuning"]), ["jobs", "rates", "streams"], "{l}");
    assert_eq!(l["tuning"]["jobs"], 2, "a link's first limit: {l}");
    assert_eq!(l["name"], link.as_str());
    assert_eq!(
        (l["flagged"].as_bool(), l["reason"].is_null()),
        (Some(false), true)
    );
    // One sample: nothing before it to take a median of.
    assert!(l["median_rate"].is_null(), "{l}");
    let last = &l["last"];
    assert_eq!(
        keys(last),
        ["job", "loss", "rate", "rtt_ms", "source", "t_ms"]
    );
    assert_eq!(
        (&last["source"], &last["job"]),
        (&Value::from("transfer"), &Value::from(j.id))
    );
    assert!(last["rtt_ms"].is_null() && last["loss"].is_null());

    let (st, v) = get_json(&svc, "bob", &format!("/api/links/{link}/history")).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(keys(&v), ["name", "samples"]);
    assert_eq!(&v["samples"][0], last);
    let (st, v) = get_json(
        &svc,
        "bob",
        &format!("/api/links/{link}/history?since_ms=0"),
    )
    .await;
    assert_eq!((st, v["samples"].as_array().unwrap().len()), (200, 1));
    let (st, v) = get_json(&svc, "bob", "/api/links/nowhere:1/history").await;
    assert_eq!(st, 404, "{v}");
    assert!(v["error"].as_str().unwrap().contains("no link"), "{v}");
    let (st, _) = get_json(
        &svc,
        "bob",
        &format!("/api/links/{link}/history?since_ms=x"),
    )
    .await;
    assert_eq!(st, 400);

    // No token, no links.
    let a = alice
        .request(Method::GET, "/api/links", vec![], false)
        .await
        .unwrap();
    assert_eq!(a.status, 401);
    match svc.client("bob").rates(j.id).await {
        Err(ServiceError::Api { status: 404, .. }) => {}
        other => panic!("bob may not read alice's job's rates: {other:?}"),
    }
    svc.stop().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_link_whose_rate_fell_below_half_its_median_is_flagged_in_the_api_and_metrics() {
    use ferry_service::history::LinkSample;

    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    let svc = TestService::start(&server, local.path()).await;
    let link = server.addr.to_string();
    let probe = |t_ms, rate| LinkSample {
        t_ms,
        rate,
        rtt_ms: Some(1.0),
        loss: Some(0.0),
        source: Source::Probe,
        job: None,
    };
    for (t, r) in [(1, 100e6), (2, 110e6), (3, 90e6), (4, 20e6)] {
        svc.store.add_link_sample(&link, &probe(t, r)).unwrap();
    }
    let l = svc.client("bob").links().await.unwrap().links.remove(0);
    assert!(l.flagged, "{l:?}");
    assert_eq!(l.median_rate, Some(100e6));
    let why = l.reason.unwrap();
    assert!(
        why.contains("20.0 MB/s") && why.contains("100.0 MB/s"),
        "{why}"
    );
    let a = svc
        .client("bob")
        .request(Method::GET, "/metrics", vec![], false)
        .await
        .unwrap();
    let text = String::from_utf8(a.body).unwrap();
    for want in [
        format!("ferry_service_link_flagged{{link=\"{link}\"}} 1"),
        format!("ferry_service_link_rate_bytes_per_second{{link=\"{link}\"}} 20000000"),
        format!("ferry_service_link_median_rate_bytes_per_second{{link=\"{link}\"}} 100000000"),
        format!("ferry_service_link_rtt_seconds{{link=\"{link}\"}} 0.001"),
    ] {
        assert!(text.lines().any(|l| l == want), "{want:?} in\n{text}");
    }
    // A name sent %-escaped (as a browser's encodeURIComponent does) is the same link.
    let (st, v) = get_json(
        &svc,
        "bob",
        &format!("/api/links/{}/history", link.replace(':', "%3A")),
    )
    .await;
    assert_eq!(
        (st, v["samples"].as_array().unwrap().len()),
        (200, 4),
        "{v}"
    );
    svc.stop().await;
    server.stop().await;
}
