//! `ferry serve --metrics-listen`: the server's counters in Prometheus' text format, read over
//! plain HTTP on loopback after real transfers and a refused login.

use crate::util;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use util::*;

/// Sends one `GET path` and returns the status line and the body.
fn http_get(addr: &str, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).expect("connecting to the metrics listener");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("reading the answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    (
        head.lines().next().unwrap_or_default().to_owned(),
        body.to_owned(),
    )
}

/// The value of the sample named exactly `series` (name and labels), if the page has it.
fn sample(page: &str, series: &str) -> Option<u64> {
    page.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

#[test]
fn metrics_count_sessions_bytes_files_and_refused_logins() {
    let sb = Sandbox::new();
    let root = sb.mkdir("root");
    let src = sb.path("src");
    std::fs::create_dir_all(&src).unwrap();
    write_pattern(&src.join("a.bin"), 3 << 20, 1);
    write_pattern(&src.join("b.bin"), 1 << 20, 2);
    let s = Server::start(
        &sb,
        &root,
        Some(&sb.path("token")),
        &["--metrics-listen", "127.0.0.1:0"],
    );
    let addr = s
        .stderr()
        .lines()
        .find_map(|l| {
            l.strip_prefix("ferry: metrics at http://")?
                .strip_suffix("/metrics")
                .map(str::to_owned)
        })
        .expect("the server says where its metrics are");

    let (status, page) = http_get(&addr, "/metrics");
    assert!(status.contains(" 200 "), "{status}");
    assert_eq!(sample(&page, "ferry_server_received_bytes_total"), Some(0));
    assert!(page.contains("# TYPE ferry_server_sessions_total counter"));

    let out = run(
        sb.client(&s.token)
            .arg("put")
            .arg(src.join("a.bin"))
            .arg(src.join("b.bin"))
            .arg(s.remote("/")),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    let back = sb.mkdir("back");
    let out = run(
        sb.client(&s.token)
            .arg("get")
            .arg(s.remote("/a.bin"))
            .arg(&back),
        CMD_TIMEOUT,
    );
    assert_code(&out, 0);
    let out = run(
        sb.client("not-the-token").arg("ls").arg(s.remote("/")),
        CMD_TIMEOUT,
    );
    assert_ne!(out.code(), Some(0), "a wrong token is refused");

    // A session is counted when the server has closed it, which may follow the client's exit
    // by a moment.
    let mut page = String::new();
    wait_until(Duration::from_secs(10), || {
        page = http_get(&addr, "/metrics").1;
        sample(&page, "ferry_server_sessions_active") == Some(0)
            && sample(
                &page,
                r#"ferry_server_sessions_total{kind="get",result="ok"}"#,
            ) == Some(1)
    });
    assert_eq!(
        sample(&page, "ferry_server_received_bytes_total"),
        Some(4 << 20),
        "{page}"
    );
    assert_eq!(sample(&page, "ferry_server_received_files_total"), Some(2));
    assert_eq!(
        sample(&page, "ferry_server_sent_bytes_total"),
        Some(3 << 20)
    );
    assert_eq!(sample(&page, "ferry_server_sent_files_total"), Some(1));
    assert_eq!(
        sample(
            &page,
            r#"ferry_server_sessions_total{kind="put",result="ok"}"#
        ),
        Some(1)
    );
    assert_eq!(
        sample(
            &page,
            r#"ferry_server_sessions_total{kind="get",result="ok"}"#
        ),
        Some(1)
    );
    assert!(sample(&page, "ferry_server_auth_failures_total").unwrap_or(0) >= 1);
    assert!(sample(
        &page,
        r#"ferry_server_last_session_rate_bytes_per_second{kind="put"}"#
    )
    .is_some_and(|r| r > 0));
    assert_eq!(sample(&page, "ferry_server_sessions_active"), Some(0));

    let (status, _) = http_get(&addr, "/anything-else");
    assert!(status.contains(" 404 "), "{status}");
}
