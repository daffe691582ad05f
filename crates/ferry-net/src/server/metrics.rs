//! What the server has done since it started, as counters a scraper reads
//! (`Server::metrics`, rendered in Prometheus' text format by [`MetricsView::render`]).
//! Bytes and files are counted as they are written or sent, not when a session ends, so a
//! day-long put shows its progress in every scrape.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ferry_core::Reporter;

use super::state::ServerState;

/// The kinds of session the server logs (`Served::what`), in the order they are rendered.
const KINDS: [&str; 9] = [
    "put", "get", "list", "probe", "grant", "copy", "stripe", "remove", "catalog",
];

/// The kind a session is counted under: a user's catalog requests (`stat`, `rm`, `mv`,
/// `mkdir`, `meta ...`, `find`) as one.
fn kind_of(what: &str) -> &str {
    match what {
        "stat" | "rm" | "mv" | "mkdir" | "find" => "catalog",
        w if w.starts_with("meta") => "catalog",
        w => w,
    }
}

/// The server's counters; every field only grows.
#[derive(Default)]
pub(super) struct Metrics {
    sessions_ok: [AtomicU64; KINDS.len()],
    /// Sessions of a kind not in [`KINDS`] (a newer request the list has not learnt).
    sessions_other: AtomicU64,
    session_errors: AtomicU64,
    bytes_received: AtomicU64,
    bytes_sent: AtomicU64,
    files_received: AtomicU64,
    files_sent: AtomicU64,
    bad_blocks: AtomicU64,
    /// A striped put's blocks that stripe hosts wrote: merged by their chaining values, and
    /// read back.
    landed_merged: AtomicU64,
    landed_read_back: AtomicU64,
    auth_failures: AtomicU64,
    refused_busy: AtomicU64,
    /// The rate of the last session of each kind that moved bytes (bytes/s).
    last_rate: Mutex<[Option<u64>; KINDS.len()]>,
}

impl Metrics {
    /// A session ended well: `what` it was and its rate, if it moved bytes.
    pub(super) fn session_ok(&self, what: &str, rate: Option<u64>) {
        let what = kind_of(what);
        match KINDS.iter().position(|k| *k == what) {
            Some(i) => {
                self.sessions_ok[i].fetch_add(1, Ordering::Relaxed);
                if let Some(r) = rate {
                    self.last_rate.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
                }
            }
            None => {
                self.sessions_other.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub(super) fn session_failed(&self) {
        self.session_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn auth_failed(&self) {
        self.auth_failures.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn refused_busy(&self) {
        self.refused_busy.fetch_add(1, Ordering::Relaxed);
    }

    /// A reporter that counts what a put's receiver writes.
    pub(super) fn receiving(self: &Arc<Self>) -> Arc<dyn Reporter> {
        Arc::new(Counting {
            metrics: self.clone(),
            sending: false,
        })
    }

    /// A reporter that counts what a get's sender sends.
    pub(super) fn sending(self: &Arc<Self>) -> Arc<dyn Reporter> {
        Arc::new(Counting {
            metrics: self.clone(),
            sending: true,
        })
    }
}

/// Feeds the byte and file counters from a transfer's reporter calls.
struct Counting {
    metrics: Arc<Metrics>,
    sending: bool,
}

impl Reporter for Counting {
    fn on_bytes(&self, n: u64) {
        let m = &self.metrics;
        let c = if self.sending {
            &m.bytes_sent
        } else {
            &m.bytes_received
        };
        c.fetch_add(n, Ordering::Relaxed);
    }

    fn on_file_done(&self) {
        let m = &self.metrics;
        let c = if self.sending {
            &m.files_sent
        } else {
            &m.files_received
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    fn on_bad_block(&self) {
        self.metrics.bad_blocks.fetch_add(1, Ordering::Relaxed);
    }

    fn on_landed(&self, merged: bool) {
        let m = &self.metrics;
        let c = if merged {
            &m.landed_merged
        } else {
            &m.landed_read_back
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// A running server's counters and gauges, for a metrics endpoint.
#[derive(Clone)]
pub struct MetricsView(pub(super) Arc<ServerState>);

impl MetricsView {
    /// The counters in Prometheus' text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        let s = &self.0;
        let m = &s.metrics;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, samples: &[(String, u64)]| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        };
        let one = |v: u64| vec![(String::new(), v)];
        family(
            "ferry_server_sessions_active",
            "gauge",
            "Sessions running now.",
            &one(s.active_sessions() as u64),
        );
        let mut sessions: Vec<(String, u64)> = KINDS
            .iter()
            .zip(&m.sessions_ok)
            .map(|(k, c)| (format!("{{kind=\"{k}\",result=\"ok\"}}"), load(c)))
            .collect();
        sessions.push((
            "{kind=\"other\",result=\"ok\"}".into(),
            load(&m.sessions_other),
        ));
        sessions.push((
            "{kind=\"any\",result=\"error\"}".into(),
            load(&m.session_errors),
        ));
        family(
            "ferry_server_sessions_total",
            "counter",
            "Sessions ended, by kind and result (a failed session's kind is not known to the count).",
            &sessions,
        );
        family(
            "ferry_server_received_bytes_total",
            "counter",
            "Payload bytes written for puts, counted as they are written.",
            &one(load(&m.bytes_received)),
        );
        family(
            "ferry_server_sent_bytes_total",
            "counter",
            "Payload bytes sent for gets, counted as they are sent.",
            &one(load(&m.bytes_sent)),
        );
        family(
            "ferry_server_received_files_total",
            "counter",
            "Files a put resolved: stored durable under their names, or found already there.",
            &one(load(&m.files_received)),
        );
        family(
            "ferry_server_sent_files_total",
            "counter",
            "Files a get read completely.",
            &one(load(&m.files_sent)),
        );
        family(
            "ferry_server_bad_blocks_total",
            "counter",
            "Blocks that failed their digest and were sent again.",
            &one(load(&m.bad_blocks)),
        );
        family(
            "ferry_server_landed_blocks_total",
            "counter",
            "Blocks stripe hosts wrote for puts this server coordinated, by how they were checked: \
             merged by their BLAKE3 chaining values, or read back.",
            &[
                ("{check=\"merged\"}".into(), load(&m.landed_merged)),
                ("{check=\"read_back\"}".into(), load(&m.landed_read_back)),
            ],
        );
        family(
            "ferry_server_auth_failures_total",
            "counter",
            "Logins refused for a wrong token or grant.",
            &one(load(&m.auth_failures)),
        );
        family(
            "ferry_server_refused_busy_total",
            "counter",
            "Connections or sessions refused because a limit was reached.",
            &one(load(&m.refused_busy)),
        );
        let open = s.config.max_connections - s.connections.available_permits();
        family(
            "ferry_server_connections_open",
            "gauge",
            "Connections open now, control and data.",
            &one(open as u64),
        );
        family(
            "ferry_server_connections_max",
            "gauge",
            "The most connections the server holds at once.",
            &one(s.config.max_connections as u64),
        );
        let rates: Vec<(String, u64)> = {
            let last = m.last_rate.lock().unwrap_or_else(|e| e.into_inner());
            KINDS
                .iter()
                .zip(last.iter())
                .filter_map(|(k, r)| r.map(|r| (format!("{{kind=\"{k}\"}}"), r)))
                .collect()
        };
        family(
            "ferry_server_last_session_rate_bytes_per_second",
            "gauge",
            "The rate of the last session of each kind that moved bytes.",
            &rates,
        );
        out
    }
}
