//! The dashboard in a real browser: headless Chromium, pinned to the service's key, is given a
//! token through the page's form (a wrong one first), submits a put of a small tree through
//! the job form, and the test watches that job's progress bar in the page reach 100 % and
//! reads the plots' data from the DOM (the job's rate samples, its link's transfer sample); a
//! second job is cancelled with its row's button. With FERRY_SCREENSHOT=PATH it saves the
//! page, the first job done, as a PNG.

use std::time::Duration;

use ferry_service::State;
use serde_json::Value;

use crate::util::chromium::{self, Browser};
use crate::util::*;

/// Four files of 1 MiB: at 64 KiB blocks and the pace below, the job runs for a few seconds,
/// long enough for the page to show it partway and for several rate samples.
fn make_batch(dir: &std::path::Path) -> std::path::PathBuf {
    let top = dir.join("batch");
    std::fs::create_dir_all(&top).unwrap();
    for i in 0..4 {
        make_file(&top.join(format!("part{i}.bin")), 1 << 20);
    }
    top
}

/// Markup in a label is shown as text, never made into elements.
const LABEL: &str = "nightly <run42>";

/// A JavaScript string literal of `s`.
fn js(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_dashboard_in_chromium_submits_a_put_and_shows_it_reach_100_percent() {
    let test = "the_dashboard_in_chromium_submits_a_put_and_shows_it_reach_100_percent";
    let Some(()) = ferry_netem::needs(test, chromium::present()) else {
        return;
    };
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    let top = make_batch(local.path());
    // 16 MiB: at the pace below it would run for half a minute; it is cancelled long before.
    make_file(&local.path().join("slow.bin"), 16 << 20);
    let svc = TestService::start_with(&server, local.path(), |c| {
        c.pace = Some(Duration::from_millis(150))
    })
    .await;
    let cert = std::fs::read_to_string(svc.state.path().join("tls/server-cert.pem")).unwrap();
    let der = rustls::pki_types::pem::PemObject::from_pem_slice(cert.as_bytes())
        .map(|c: rustls::pki_types::CertificateDer<'static>| c.to_vec())
        .unwrap();
    let page = Page {
        url: format!("https://{}/", svc.addr),
        pin: chromium::spki_pin(&der),
        token: svc.tokens["alice"].clone(),
        dest: format!("{}:/", server.addr),
        link: server.addr.to_string(),
    };
    let seen = tokio::task::spawn_blocking(move || page.drive())
        .await
        .unwrap();
    let job = svc.store.get(seen.job).unwrap().unwrap();
    assert_eq!(job.state, State::Done, "{job:?}");
    assert_eq!((job.owner.as_str(), job.label.as_str()), ("alice", LABEL));
    assert_eq!(tree_bytes(&server.root.join("batch")), tree_bytes(&top));
    let c = svc.store.get(seen.cancelled).unwrap().unwrap();
    assert_eq!(c.state, State::Cancelled, "{c:?}");
    assert!(c.bytes_done < c.bytes_total, "{c:?}");
    assert!(
        seen.percents.windows(2).all(|w| w[0] <= w[1])
            && seen.percents.iter().any(|p| (1..100).contains(p))
            && seen.percents.last() == Some(&100),
        "the bar is seen partway and only grows, to 100: {:?}",
        seen.percents
    );
    // The plots hold what the API says: the job's bytes up to its total, and the link's
    // transfer sample is this job's, at a rate above zero.
    let rates = seen.rates.as_array().unwrap();
    let last = rates.last().unwrap();
    assert!(
        last["bytes_done"].as_u64() <= Some(job.bytes_total),
        "{last}"
    );
    assert!(
        rates.iter().all(|s| s["rate"].as_f64() >= Some(0.0)),
        "{rates:?}"
    );
    let samples = seen.history.as_array().unwrap();
    let t = samples.iter().find(|s| s["job"] == seen.job).unwrap();
    assert_eq!(t["source"], "transfer");
    assert!(t["rate"].as_f64() > Some(0.0), "{t}");
    svc.stop().await;
    server.stop().await;
}

struct Page {
    url: String,
    pin: String,
    token: String,
    dest: String,
    /// The server's name as a link.
    link: String,
}

/// What the page showed.
struct Seen {
    job: i64,
    /// The job's progress bar, each time the test looked, until it read done.
    percents: Vec<u64>,
    /// The rate plot's samples and the link plot's.
    rates: Value,
    history: Value,
    /// A second job, cancelled with its row's button while it ran.
    cancelled: i64,
}

impl Page {
    fn drive(self) -> Seen {
        let mut b = Browser::start(&self.pin);
        let tab = b.open_tab();
        b.call(
            Some(&tab),
            "Page.navigate",
            serde_json::json!({"url": self.url}),
        );
        b.wait_for(
            &tab,
            "document.readyState === 'complete' && !!document.getElementById('token-form')",
            Duration::from_secs(20),
        );
        self.check_headers(&mut b, &tab);
        let wait = Duration::from_secs(20);
        // A wrong token is refused in words and forgotten; the right one is kept for the tab.
        let enter = |t: &str| {
            format!(
                "document.getElementById('token').value = {}; \
                 document.getElementById('token-form').requestSubmit(); true",
                js(t)
            )
        };
        b.eval(&tab, &enter("not-a-token"));
        b.wait_for(
            &tab,
            "!document.getElementById('token-form').hidden && \
             document.getElementById('status').textContent.includes('refused')",
            wait,
        );
        b.eval(&tab, &enter(&self.token));
        b.wait_for(
            &tab,
            "document.getElementById('status').textContent.startsWith('updated')",
            wait,
        );
        let kept = b.eval(
            &tab,
            "[sessionStorage.getItem('ferry-token'), location.href, localStorage.length]",
        );
        assert_eq!(kept[0], Value::from(self.token.as_str()));
        assert!(!kept[1].as_str().unwrap().contains(&self.token), "{kept}");
        assert_eq!(kept[2], 0, "nothing in localStorage");
        let job = self.submit(&mut b, &tab, "/batch", LABEL);
        let percents = watch(&mut b, &tab, job);
        let (rates, history) = read_plots(&mut b, &tab, job, &self.link);
        if let Some(path) = std::env::var_os("FERRY_SCREENSHOT") {
            std::fs::write(&path, b.screenshot(&tab)).unwrap();
        }
        let cancelled = self.submit(&mut b, &tab, "/slow.bin", "to cancel");
        cancel(&mut b, &tab, cancelled);
        Seen {
            job,
            percents,
            rates,
            history,
            cancelled,
        }
    }

    /// The page's headers, read by the page itself: the policy, no sniffing, no caching.
    fn check_headers(&self, b: &mut Browser, tab: &str) {
        let h = b.eval(
            tab,
            "fetch('/').then(r => [r.status, r.headers.get('content-security-policy'), \
             r.headers.get('x-content-type-options'), r.headers.get('cache-control')])",
        );
        assert_eq!(h[0], 200, "{h}");
        let csp = h[1].as_str().unwrap();
        assert!(csp.contains("default-src 'self'"), "{csp}");
        assert!(!csp.contains("unsafe"), "{csp}");
        assert_eq!(
            (h[2].as_str(), h[3].as_str()),
            (Some("nosniff"), Some("no-store"))
        );
    }

    /// Fills the job form and submits it; the id the page reports.
    fn submit(&self, b: &mut Browser, tab: &str, source: &str, label: &str) -> i64 {
        b.eval(
            tab,
            &format!(
                "document.getElementById('submit-msg').textContent = ''; \
                 document.getElementById('sources').value = {}; \
                 document.getElementById('dest').value = {}; \
                 document.getElementById('priority').value = '2'; \
                 document.getElementById('label').value = {}; \
                 document.getElementById('job-form').requestSubmit(); true",
                js(source),
                js(&self.dest),
                js(label)
            ),
        );
        let msg = b.wait_for(
            tab,
            "(m => m.startsWith('job ') && m)(document.getElementById('submit-msg').textContent)",
            Duration::from_secs(20),
        );
        let msg = msg.as_str().unwrap();
        msg.split(' ').nth(1).unwrap().parse().expect(msg)
    }
}

/// Waits for job `id`'s row to say running, clicks its Cancel button, and waits for the row
/// to say cancelled, without a button.
fn cancel(b: &mut Browser, tab: &str, id: i64) {
    let row = format!("document.querySelector('tr[data-job=\"{id}\"]')");
    let within = Duration::from_secs(20);
    b.wait_for(
        tab,
        &format!("(r => r && r.dataset.state === 'running')({row})"),
        within,
    );
    b.eval(
        tab,
        &format!("{row}.querySelector('button[data-cancel]').click(); true"),
    );
    b.wait_for(
        tab,
        &format!(
            "(r => r && r.dataset.state === 'cancelled' && !r.querySelector('button') \
             && r.innerText.includes('cancelled'))({row})"
        ),
        within,
    );
}

/// Reads job `id`'s row every 100 ms until it says done, at most 60 s: its bar's percents.
fn watch(b: &mut Browser, tab: &str, id: i64) -> Vec<u64> {
    let row = format!(
        "(r => r && [r.dataset.state, Number(r.dataset.percent), r.innerText, \
         r.cells[1].textContent, r.querySelectorAll('run42').length])\
         (document.querySelector('tr[data-job=\"{id}\"]'))"
    );
    let t0 = std::time::Instant::now();
    let mut percents = Vec::new();
    loop {
        let r = b.eval(tab, &row);
        if let Some(p) = r[1].as_u64() {
            percents.push(p);
        }
        if r[0] == "done" {
            assert!(r[2].as_str().unwrap().contains("100 %"), "{r}");
            assert!(
                r[3].as_str().unwrap().contains(LABEL),
                "the label as text: {r}"
            );
            assert_eq!(r[4], 0, "no element made from the label: {r}");
            return percents;
        }
        assert!(r[0] != "failed" && r[0] != "cancelled", "{r}");
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "job {id} in the page: {r}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The plots' data as the page keeps it in `data-points`: the job's rate samples (at least
/// one), and its link's history with the finished job's `transfer` sample, drawn as a dot.
fn read_plots(b: &mut Browser, tab: &str, job: i64, link: &str) -> (Value, Value) {
    let within = Duration::from_secs(15);
    let rates = b.wait_for(
        tab,
        "(p => p.length > 0 && p)(JSON.parse(document.getElementById('rate-plot').dataset.points))",
        within,
    );
    let history = b.wait_for(
        tab,
        &format!(
            "(d => d && (p => p.some(s => s.source === 'transfer' && s.job === {job}) && p)\
             (JSON.parse(d.querySelector('.plot').dataset.points)))\
             (document.querySelector('#links .link[data-link=' + JSON.stringify({}) + ']'))",
            js(link)
        ),
        within,
    );
    let drawn = b.eval(
        tab,
        "[document.querySelectorAll('#rate-plot svg polyline, #rate-plot svg circle').length, \
          document.querySelectorAll('#links svg circle.transfer').length]",
    );
    assert!(
        drawn[0].as_u64() >= Some(1) && drawn[1].as_u64() >= Some(1),
        "drawn: {drawn}"
    );
    (rates, history)
}

/// Without a browser: the page and its two files come without a token, the page names only
/// them, and the script neither evaluates strings nor writes HTML.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_dashboard_is_served_without_a_token_and_its_script_writes_no_html() {
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    let svc = TestService::start(&server, local.path()).await;
    let c = svc.client("alice");
    let get = |path: &'static str| {
        let c = c.clone();
        async move {
            let a = c
                .request(hyper::Method::GET, path, vec![], false)
                .await
                .unwrap();
            assert_eq!(a.status, 200, "{path}");
            String::from_utf8(a.body).unwrap()
        }
    };
    let page = get("/").await;
    assert!(
        page.contains(r#"<script src="/dashboard.js" defer></script>"#),
        "{page}"
    );
    assert!(page.contains(r#"href="/dashboard.css""#), "{page}");
    assert!(
        !page.contains("<script>") && !page.contains("style="),
        "nothing inline"
    );
    let script = get("/dashboard.js").await;
    for bad in [
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "eval(",
        "new Function",
        "localStorage",
    ] {
        assert!(!script.contains(bad), "the script uses {bad}");
    }
    assert!(script.contains("sessionStorage"));
    assert!(get("/dashboard.css").await.contains(".plot"));
    svc.stop().await;
    server.stop().await;
}
