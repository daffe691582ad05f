//! `ferry probe net`: the sweep over stream counts and socket buffers, what limits the path,
//! and the profile transfers start from.
//!
//! No sockets here (this crate has no async runtime): the caller measures each point through a
//! closure; `ferry-cli` runs `ferry_net::speedtest::run` against a `ferry serve`. The analysis
//! ([`explain`]) is a pure function of the measurements and the local TCP settings.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use ferry_units::stats::median_or_zero;
use ferry_units::units::{
    format_bytes as bytes, format_mbps as rate, format_ms_brief as ms, size_flag,
};
use serde::{Deserialize, Serialize};

use crate::tcp::{bdp_bytes, stream_cap_mbps, TcpSettings, TCP_FILES};
use crate::ProbeProgress;

/// What to sweep.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NetOptions {
    /// Sending period of each point, in seconds.
    pub seconds: f64,
    /// Seconds at the start of each point left out of its rate (slow start).
    pub skip: f64,
    /// Runs per point; the point's rate is their median.
    pub runs: usize,
    /// Stream counts, in the order they are tried (ramping up).
    pub streams: Vec<u16>,
    /// Socket buffers: 0 = the kernel's autotuning; any other value fixes SO_SNDBUF/SO_RCVBUF
    /// and so disables autotuning for those connections.
    pub windows: Vec<u32>,
    /// Try every stream count even when adding streams stopped helping.
    pub full: bool,
    /// Adding streams "helps" when the rate grows by at least this fraction.
    pub min_gain: f64,
}

impl Default for NetOptions {
    fn default() -> Self {
        Self {
            seconds: 4.0,
            skip: 1.0,
            runs: 3,
            streams: vec![1, 2, 4, 8, 16],
            windows: vec![0, 4 << 20, 16 << 20],
            full: false,
            min_gain: 0.05,
        }
    }
}

impl NetOptions {
    /// For CI: streams 1 and 4, autotuning only, 2 s points, one run.
    pub fn quick() -> Self {
        Self {
            seconds: 2.0,
            skip: 0.5,
            runs: 1,
            streams: vec![1, 4],
            windows: vec![0],
            ..Self::default()
        }
    }
}

/// One measurement to take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NetPoint {
    pub streams: u16,
    pub window: u32,
    pub seconds: f64,
    pub skip: f64,
}

/// What one run of a point measured (the caller fills it from its probe's result).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NetSample {
    /// Data connections the server granted.
    pub streams: u16,
    /// The receiver's rate after the skipped start, Mbit/s.
    pub rate_mbps: f64,
    pub sent_bytes: u64,
    pub received_bytes: u64,
    /// Minimum RTT of the idle control connection, ms.
    pub rtt_idle_ms: f64,
    /// Median smoothed RTT of the data connections under load, ms (0 if unknown).
    pub rtt_load_ms: f64,
    /// Mean congestion window per data connection, bytes.
    pub cwnd_bytes: f64,
    pub retransmits: u64,
    /// Segment size, to turn bytes into segments (0 if unknown).
    pub mss: u32,
}

impl NetSample {
    /// Retransmitted segments as a percentage of the segments sent.
    pub fn retrans_pct(&self) -> f64 {
        if self.mss == 0 || self.sent_bytes == 0 {
            return 0.0;
        }
        let segments = self.sent_bytes as f64 / f64::from(self.mss);
        100.0 * self.retransmits as f64 / segments
    }
}

/// One point of the sweep: the median over its runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PointReport {
    pub streams: u16,
    /// 0 = autotuning; else the fixed SO_SNDBUF/SO_RCVBUF (autotuning off).
    pub window: u32,
    pub rate_mbps: f64,
    pub per_stream_mbps: f64,
    /// Every run's rate, in order.
    pub runs_mbps: Vec<f64>,
    pub rtt_load_ms: f64,
    pub cwnd_bytes: f64,
    pub retransmits: u64,
    pub retrans_pct: f64,
    /// Runs that failed, and why.
    pub errors: Vec<String>,
}

impl PointReport {
    fn from_samples(streams: u16, window: u32, samples: &[NetSample], errors: Vec<String>) -> Self {
        let med = |f: fn(&NetSample) -> f64| median_or_zero(samples.iter().map(f));
        let rate_mbps = med(|s| s.rate_mbps);
        let granted = samples.first().map_or(streams, |s| s.streams.max(1));
        Self {
            streams: granted,
            window,
            rate_mbps,
            per_stream_mbps: rate_mbps / f64::from(granted.max(1)),
            runs_mbps: samples.iter().map(|s| s.rate_mbps).collect(),
            rtt_load_ms: med(|s| s.rtt_load_ms),
            cwnd_bytes: med(|s| s.cwnd_bytes),
            retransmits: med(|s| s.retransmits as f64) as u64,
            retrans_pct: med(NetSample::retrans_pct),
            errors,
        }
    }

    fn ok(&self) -> bool {
        !self.runs_mbps.is_empty()
    }
}

/// What limits a setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    /// Each stream has at most one window in flight per round trip: more streams (or a larger
    /// window) would go faster.
    Window,
    /// Retransmits keep the congestion windows small.
    Loss,
    /// The path itself: adding streams no longer helps.
    Link,
    /// None of the above fits the numbers.
    Unknown,
}

/// The setting to use.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Best {
    pub streams: u16,
    pub window: u32,
    pub rate_mbps: f64,
    /// Bandwidth-delay product: the best rate times the idle RTT, bytes.
    pub bdp_bytes: u64,
}

/// The whole report of `ferry probe net`.
#[derive(Debug, Clone, Serialize)]
pub struct NetReport {
    /// `host:port` probed.
    pub endpoint: String,
    /// `client_to_server` (this host sends) or `server_to_client`.
    pub direction: String,
    pub options: NetOptions,
    /// Minimum RTT of the idle control connections (median over all runs), ms.
    pub rtt_idle_ms: f64,
    /// The best point's RTT under load, ms.
    pub rtt_load_ms: f64,
    pub points: Vec<PointReport>,
    pub best: Option<Best>,
    /// What limits the best setting.
    pub limit: LimitKind,
    /// What limits a single stream, when more than one was tried.
    pub one_stream_limit: Option<LimitKind>,
    /// The reasoning, one sentence each, most important first.
    pub explanation: Vec<String>,
    /// This host's TCP settings (the sending side's for `client_to_server`).
    pub tcp: TcpSettings,
    /// Where the profile was saved (set by the caller).
    pub profile: Option<PathBuf>,
    pub notes: Vec<String>,
}

/// Reads this host's TCP settings from `/proc/sys` (fields it cannot read stay `None`).
pub fn local_tcp_settings() -> TcpSettings {
    let mut t = TcpSettings::default();
    for &(field, path) in TCP_FILES {
        if let Ok(text) = std::fs::read_to_string(path) {
            t.set(field, &text);
        }
    }
    t
}

/// Runs the sweep. `measure` takes one run of one point (and may fail: the failure is recorded
/// and the point counts as unmeasured). Stream counts ramp up per window; unless `full`, the
/// ramp stops once a step gains less than `min_gain`.
pub fn probe_net(
    endpoint: &str,
    upload: bool,
    opts: &NetOptions,
    tcp: TcpSettings,
    progress: &dyn ProbeProgress,
    mut measure: impl FnMut(NetPoint) -> Result<NetSample, String>,
) -> NetReport {
    let mut points = Vec::new();
    let mut idle = Vec::new();
    let mut notes = Vec::new();
    let runs = opts.runs.max(1);
    for &window in &opts.windows {
        let mut best_here = 0.0f64;
        let mut last_granted = 0u16;
        for &streams in &opts.streams {
            let mut samples = Vec::new();
            let mut errors = Vec::new();
            for run in 1..=runs {
                progress.on_step(&format!(
                    "{streams} stream(s), {}, run {run}/{runs}",
                    window_name(window)
                ));
                let point = NetPoint {
                    streams,
                    window,
                    seconds: opts.seconds,
                    skip: opts.skip,
                };
                match measure(point) {
                    Ok(s) => {
                        if s.rtt_idle_ms > 0.0 {
                            idle.push(s.rtt_idle_ms);
                        }
                        samples.push(s);
                    }
                    Err(e) => errors.push(e),
                }
            }
            let p = PointReport::from_samples(streams, window, &samples, errors);
            let (ok, rate, granted) = (p.ok(), p.rate_mbps, p.streams);
            points.push(p);
            if !ok {
                notes.push(format!(
                    "{streams} stream(s) with {} could not be measured; the ramp stopped there",
                    window_name(window)
                ));
                break;
            }
            if granted == last_granted {
                notes.push(format!(
                    "the server granted only {granted} streams (its --max-streams); the ramp \
                     stopped there"
                ));
                break;
            }
            last_granted = granted;
            let helped = rate >= best_here * (1.0 + opts.min_gain);
            best_here = best_here.max(rate);
            if !helped && !opts.full {
                break;
            }
        }
    }
    analyse(
        endpoint,
        upload,
        opts.clone(),
        tcp,
        points,
        median_or_zero(idle),
        notes,
    )
}

/// Chooses the best point and explains it. Separate from the sweep so that it can be tested on
/// synthetic points.
pub fn analyse(
    endpoint: &str,
    upload: bool,
    options: NetOptions,
    tcp: TcpSettings,
    points: Vec<PointReport>,
    rtt_idle_ms: f64,
    mut notes: Vec<String>,
) -> NetReport {
    let measured: Vec<&PointReport> = points.iter().filter(|p| p.ok()).collect();
    let (core_name, core) = if upload {
        ("wmem_max", tcp.core_wmem_max)
    } else {
        ("rmem_max", tcp.core_rmem_max)
    };
    if let Some(c) = core {
        for &w in options.windows.iter().filter(|&&w| u64::from(w) > c) {
            notes.push(format!(
                "a fixed {} socket buffer is cut to {} by net.core.{core_name} on this host, so \
                 it measures the same as {} fixed",
                bytes(u64::from(w)),
                bytes(c),
                bytes(c)
            ));
        }
    }
    let top = measured.iter().map(|p| p.rate_mbps).fold(0.0, f64::max);
    // Within 3% of the fastest counts as as fast: then fewer streams and autotuning win.
    let best_point = measured
        .iter()
        .filter(|p| p.rate_mbps >= 0.97 * top && top > 0.0)
        .min_by_key(|p| (p.streams, p.window != 0, p.window))
        .copied();
    let rtt = if rtt_idle_ms > 0.0 {
        rtt_idle_ms
    } else {
        best_point.map_or(0.0, |p| p.rtt_load_ms)
    };
    let (limit, one_stream_limit, explanation, best) = match best_point {
        None => {
            notes.push("no point could be measured".into());
            (LimitKind::Unknown, None, Vec::new(), None)
        }
        Some(b) => {
            let one = measured
                .iter()
                .find(|p| p.streams == 1 && p.window == b.window)
                .copied();
            // Saturated: a larger stream count with the same window was tried and did not
            // gain (beyond noise) over the best.
            let saturated = measured
                .iter()
                .any(|p| p.window == b.window && p.streams > b.streams && p.rate_mbps < top * 1.05);
            let mut e = explain(&LimitInputs {
                rtt_ms: rtt,
                upload,
                tcp: tcp.clone(),
                one: one.map(Summary::of),
                best: Summary::of(b),
                saturated,
            });
            // A fixed buffer won: say what held autotuning back, since that is the default.
            let auto_best = measured
                .iter()
                .filter(|p| p.window == 0)
                .max_by(|x, y| x.rate_mbps.total_cmp(&y.rate_mbps));
            if let (true, Some(ab)) = (b.window != 0, auto_best) {
                let auto_one = measured.iter().find(|p| p.streams == 1 && p.window == 0);
                let auto = explain(&LimitInputs {
                    rtt_ms: rtt,
                    upload,
                    tcp: tcp.clone(),
                    one: auto_one.map(|p| Summary::of(p)),
                    best: Summary::of(ab),
                    saturated: measured
                        .iter()
                        .any(|p| p.window == 0 && p.streams > ab.streams),
                });
                if let Some(first) = auto.sentences.first() {
                    e.sentences
                        .insert(1, format!("with autotuning (the default): {first}"));
                }
            }
            let best = Best {
                streams: b.streams,
                window: b.window,
                rate_mbps: b.rate_mbps,
                bdp_bytes: bdp_bytes(b.rate_mbps, rtt),
            };
            (e.limit, e.one_stream, e.sentences, Some(best))
        }
    };
    NetReport {
        endpoint: endpoint.to_owned(),
        direction: if upload {
            "client_to_server"
        } else {
            "server_to_client"
        }
        .into(),
        options,
        rtt_idle_ms,
        rtt_load_ms: best_point.map_or(0.0, |p| p.rtt_load_ms),
        points,
        best,
        limit,
        one_stream_limit,
        explanation,
        tcp,
        profile: None,
        notes,
    }
}

/// One point, as the explanation sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub streams: u16,
    pub window: u32,
    pub rate_mbps: f64,
    pub rtt_load_ms: f64,
    pub cwnd_bytes: f64,
    pub retrans_pct: f64,
}

impl Summary {
    fn of(p: &PointReport) -> Self {
        Self {
            streams: p.streams,
            window: p.window,
            rate_mbps: p.rate_mbps,
            rtt_load_ms: p.rtt_load_ms,
            cwnd_bytes: p.cwnd_bytes,
            retrans_pct: p.retrans_pct,
        }
    }
}

/// What [`explain`] reasons from.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitInputs {
    /// Idle RTT, ms.
    pub rtt_ms: f64,
    /// Whether this host sends (its send buffer matters) or receives (its receive buffer).
    pub upload: bool,
    pub tcp: TcpSettings,
    /// The one-stream point with the best point's window, if measured.
    pub one: Option<Summary>,
    pub best: Summary,
    /// More streams than the best's were tried (same window) and gained nothing.
    pub saturated: bool,
}

/// [`explain`]'s verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct Explanation {
    pub limit: LimitKind,
    pub one_stream: Option<LimitKind>,
    pub sentences: Vec<String>,
}

/// Retransmitting at least this share of segments (%) counts as loss-limited.
const LOSSY_PCT: f64 = 1.0;
/// A stream with at least this share of its window in flight (rate × RTT) is window-limited.
/// The kernel wakes a writer blocked on a full send buffer only when a third of it is free, so
/// a window-limited stream averages about 3/4 of its buffer in flight.
const WINDOW_BOUND: f64 = 0.6;

/// The send (upload) or receive buffer one stream gets with socket buffer setting `window` on
/// this host, and where that bound comes from. Autotuning grows a buffer up to `tcp_wmem` /
/// `tcp_rmem` max; a fixed SO_SNDBUF/SO_RCVBUF is first capped at `net.core.wmem_max` /
/// `rmem_max` and then doubled by the kernel (for its bookkeeping), so a fixed 4 MiB buffer
/// holds up to 8 MiB: more than autotuning's 4 MiB `tcp_wmem` max.
pub fn window_cap(tcp: &TcpSettings, window: u32, upload: bool) -> Option<(u64, String)> {
    if window == 0 {
        let (name, triple) = if upload {
            ("tcp_wmem", tcp.tcp_wmem)
        } else {
            ("tcp_rmem", tcp.tcp_rmem)
        };
        let max = triple?[2];
        let what = if upload {
            "send buffer"
        } else {
            "receive buffer"
        };
        return Some((
            max,
            format!("{what} cap {} (net.ipv4.{name} max)", bytes(max)),
        ));
    }
    let (core_name, core) = if upload {
        ("wmem_max", tcp.core_wmem_max)
    } else {
        ("rmem_max", tcp.core_rmem_max)
    };
    let w = u64::from(window);
    match core {
        Some(c) if c < w => Some((
            2 * c,
            format!(
                "fixed socket buffer {} (cut to {} by net.core.{core_name}, {} as the kernel \
                 doubles it; autotuning off)",
                bytes(w),
                bytes(c),
                bytes(2 * c)
            ),
        )),
        _ => Some((
            2 * w,
            format!(
                "fixed socket buffer {} ({} as the kernel doubles it; autotuning off)",
                bytes(w),
                bytes(2 * w)
            ),
        )),
    }
}

/// Says what limits the best setting and a single stream, in words. Pure.
pub fn explain(inp: &LimitInputs) -> Explanation {
    let rtt = inp.rtt_ms;
    let b = &inp.best;
    let mut sentences = Vec::new();
    let per_stream = b.rate_mbps / f64::from(b.streams.max(1));
    let rtt_of = |s: &Summary| if rtt > 0.0 { rtt } else { s.rtt_load_ms };
    let in_flight =
        |s: &Summary| s.rate_mbps / f64::from(s.streams.max(1)) * 1e6 / 8.0 * rtt_of(s) / 1000.0;
    let cap = window_cap(&inp.tcp, b.window, inp.upload);
    let bound_by_window = |s: &Summary| {
        cap.as_ref()
            .is_some_and(|(w, _)| in_flight(s) >= WINDOW_BOUND * *w as f64)
    };

    // One stream first: the usual surprise on a long fat network.
    let one_stream = match (&inp.one, b.streams > 1) {
        (Some(one), true) => {
            let reach = format!("{} streams reach {}", b.streams, rate(b.rate_mbps));
            let (kind, s) = if bound_by_window(one) {
                let (w, what) = cap.as_ref().expect("bound_by_window needs a cap");
                (
                    LimitKind::Window,
                    format!(
                        "{what} limits one stream to {} at {} RTT (measured {}); {reach}",
                        rate(stream_cap_mbps(*w, rtt_of(one))),
                        ms(rtt_of(one)),
                        rate(one.rate_mbps)
                    ),
                )
            } else if one.retrans_pct >= LOSSY_PCT {
                (
                    LimitKind::Loss,
                    format!(
                        "one stream retransmits {:.1}% of its segments, which keeps its \
                         congestion window near {} and its rate at {}; {reach}",
                        one.retrans_pct,
                        bytes(one.cwnd_bytes as u64),
                        rate(one.rate_mbps)
                    ),
                )
            } else {
                // Receiving, this host knows only its own receive buffer; the server's send
                // buffer (its tcp_wmem) is the usual cap and cannot be read from here.
                let suspect = if inp.upload {
                    "the receiver, CPU or pacing may"
                } else {
                    "the server's send buffer, its net.ipv4.tcp_wmem max, which cannot be read \
                     from here, is the usual cap"
                };
                (
                    LimitKind::Unknown,
                    format!(
                        "one stream reaches {} with about {} in flight (neither this host's \
                         window nor loss explains it: {suspect}); {reach}",
                        rate(one.rate_mbps),
                        bytes(in_flight(one) as u64)
                    ),
                )
            };
            sentences.push(s);
            Some(kind)
        }
        _ => None,
    };

    let setting = format!(
        "{} stream{}, {}",
        b.streams,
        if b.streams == 1 { "" } else { "s" },
        window_name(b.window)
    );
    let reach = if b.streams == 1 { "reaches" } else { "reach" };
    let limit = if inp.saturated {
        if b.retrans_pct >= LOSSY_PCT {
            sentences.push(format!(
                "the path is the limit, and it is lossy: {setting}, {reach} {} while {:.1}% of \
                 segments are retransmitted; more streams add less than 5%",
                rate(b.rate_mbps),
                b.retrans_pct
            ));
            LimitKind::Loss
        } else {
            sentences.push(format!(
                "the path is the limit: {setting}, {reach} {}, and more streams add less than 5%",
                rate(b.rate_mbps)
            ));
            LimitKind::Link
        }
    } else if bound_by_window(b) {
        let (w, what) = cap.as_ref().expect("bound_by_window needs a cap");
        sentences.push(format!(
            "{what} still bounds each of the {} streams ({} each, at most {} at {} RTT): more \
             streams, or a larger buffer, should go faster (try --full)",
            b.streams,
            rate(per_stream),
            rate(stream_cap_mbps(*w, rtt_of(b))),
            ms(rtt_of(b))
        ));
        LimitKind::Window
    } else if b.retrans_pct >= LOSSY_PCT {
        sentences.push(format!(
            "loss: {:.1}% of segments are retransmitted with {setting} ({})",
            b.retrans_pct,
            rate(b.rate_mbps)
        ));
        LimitKind::Loss
    } else {
        sentences.push(format!(
            "{setting}, {reach} {}; neither the window nor loss explains the limit (the receiver \
             or the CPU may)",
            rate(b.rate_mbps)
        ));
        LimitKind::Unknown
    };

    if rtt > 0.0 {
        let bdp = bdp_bytes(b.rate_mbps, rtt);
        let mut s = format!(
            "bandwidth-delay product: {} × {} = {}",
            rate(b.rate_mbps),
            ms(rtt),
            bytes(bdp)
        );
        if let Some((w, _)) = &cap {
            if (*w) < bdp {
                let _ = write!(
                    s,
                    ": one stream alone would need that much in flight, its buffer holds {}",
                    bytes(*w)
                );
            }
        }
        sentences.push(s);
    }
    Explanation {
        limit,
        one_stream,
        sentences,
    }
}

/// `"autotuning"` or `"4 MiB fixed (no autotuning)"`.
pub fn window_name(window: u32) -> String {
    if window == 0 {
        "autotuning".into()
    } else {
        format!("{} fixed (no autotuning)", bytes(u64::from(window)))
    }
}

impl NetReport {
    /// The report for a terminal.
    pub fn render_text(&self) -> String {
        let mut s = String::new();
        let o = &self.options;
        let _ = writeln!(
            s,
            "network probe of {} ({}; {} s per point, first {} s skipped, median of {} run{})",
            self.endpoint,
            if self.direction == "client_to_server" {
                "this host sends"
            } else {
                "the server sends"
            },
            o.seconds,
            o.skip,
            o.runs,
            if o.runs == 1 { "" } else { "s" }
        );
        let _ = writeln!(
            s,
            "RTT: {} idle (control connection), {} under load (best point)\n",
            ms(self.rtt_idle_ms),
            ms(self.rtt_load_ms)
        );
        let _ = writeln!(
            s,
            "  {:>7}  {:<28} {:>10} {:>11} {:>9} {:>12} {:>8}",
            "streams",
            "socket buffer",
            "Mbit/s",
            "per stream",
            "RTT load",
            "cwnd/stream",
            "retrans"
        );
        for p in &self.points {
            if !p.ok() {
                let _ = writeln!(
                    s,
                    "  {:>7}  {:<28} failed: {}",
                    p.streams,
                    window_name(p.window),
                    p.errors.first().map_or("", String::as_str)
                );
                continue;
            }
            let mark = match &self.best {
                Some(b) if b.streams == p.streams && b.window == p.window => "  <- best",
                _ => "",
            };
            let _ = writeln!(
                s,
                "  {:>7}  {:<28} {:>10.0} {:>11.0} {:>9} {:>12} {:>8}{mark}",
                p.streams,
                window_name(p.window),
                p.rate_mbps,
                p.per_stream_mbps,
                ms(p.rtt_load_ms),
                bytes(p.cwnd_bytes as u64),
                p.retransmits
            );
        }
        s.push('\n');
        match &self.best {
            Some(b) => {
                let _ = writeln!(
                    s,
                    "best: {} stream{}, {}: {} (--streams {}{})",
                    b.streams,
                    if b.streams == 1 { "" } else { "s" },
                    window_name(b.window),
                    rate(b.rate_mbps),
                    b.streams,
                    if b.window == 0 {
                        String::new()
                    } else {
                        format!(" --tcp-window {}", size_flag(u64::from(b.window)))
                    }
                );
                let _ = writeln!(
                    s,
                    "limit: {}",
                    match self.limit {
                        LimitKind::Window => "window (socket buffers)",
                        LimitKind::Loss => "loss",
                        LimitKind::Link => "the path",
                        LimitKind::Unknown => "unclear",
                    }
                );
            }
            None => s.push_str("best: nothing could be measured\n"),
        }
        for e in &self.explanation {
            let _ = writeln!(s, "  - {e}");
        }
        for n in &self.notes {
            let _ = writeln!(s, "note: {n}");
        }
        if let Some(p) = &self.profile {
            let _ = writeln!(s, "profile saved for {} in {}", self.endpoint, p.display());
        }
        s
    }

    /// The profile entry this report recommends, if anything was measured.
    pub fn profile_entry(&self, measured_at: String) -> Option<NetProfile> {
        self.best.as_ref().map(|b| NetProfile {
            streams: b.streams,
            window: b.window,
            rate_mbps: (b.rate_mbps * 10.0).round() / 10.0,
            rtt_ms: (self.rtt_idle_ms * 100.0).round() / 100.0,
            measured_at,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Profiles: `net-profiles.json` in the client's state directory, keyed by `host:port`.

/// File name of the profiles in the client state directory.
pub const PROFILE_FILE: &str = "net-profiles.json";
/// Most endpoints kept; the oldest measurements are dropped beyond this.
pub const MAX_PROFILES: usize = 256;

/// What `ferry probe net` found best for one endpoint; transfers may start from it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetProfile {
    pub streams: u16,
    /// 0 = autotuning; else the fixed socket buffer in bytes.
    pub window: u32,
    pub rate_mbps: f64,
    pub rtt_ms: f64,
    /// UTC, RFC 3339 (`2025-06-01T12:00:00Z`).
    pub measured_at: String,
}

impl crate::store::Stamped for NetProfile {
    fn measured_at(&self) -> &str {
        &self.measured_at
    }
}

/// Every saved profile (empty when the file is missing or unreadable).
pub fn load_profiles(dir: &Path) -> BTreeMap<String, NetProfile> {
    crate::store::load(dir, PROFILE_FILE)
}

/// Stores `profile` under `key` (`host:port`), keeping at most [`MAX_PROFILES`] entries (the
/// oldest go), atomically: a temporary file, fsync, rename. Returns the file's path.
pub fn save_profile(dir: &Path, key: &str, profile: NetProfile) -> std::io::Result<PathBuf> {
    crate::store::save(dir, PROFILE_FILE, key, profile, MAX_PROFILES)
}

/// `SystemTime` as RFC 3339 UTC, seconds precision.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    format!("{}Z", utc_text(secs, 'T'))
}

/// Seconds since the Unix epoch (negative before it) as `YYYY-MM-DD{sep}HH:MM:SS` in UTC.
pub fn utc_text(secs: i64, sep: char) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}{sep}{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp_default_regime() -> TcpSettings {
        TcpSettings {
            tcp_wmem: Some([4096, 16384, 4 << 20]),
            tcp_rmem: Some([4096, 131072, 6 << 20]),
            core_wmem_max: Some(212_992),
            core_rmem_max: Some(212_992),
            ..TcpSettings::default()
        }
    }

    fn summary(streams: u16, rate_mbps: f64, retrans_pct: f64) -> Summary {
        Summary {
            streams,
            window: 0,
            rate_mbps,
            rtt_load_ms: 105.0,
            cwnd_bytes: 3e6,
            retrans_pct,
        }
    }

    #[test]
    fn a_4_mib_send_buffer_caps_one_stream_at_335_mbit_at_100_ms() {
        assert!((stream_cap_mbps(4 << 20, 100.0) - 335.5).abs() < 0.1);
        let e = explain(&LimitInputs {
            rtt_ms: 100.0,
            upload: true,
            tcp: tcp_default_regime(),
            one: Some(summary(1, 280.0, 0.0)),
            best: summary(4, 940.0, 0.01),
            saturated: true,
        });
        assert_eq!(e.one_stream, Some(LimitKind::Window));
        assert_eq!(e.limit, LimitKind::Link);
        let first = &e.sentences[0];
        assert_eq!(
            first,
            "send buffer cap 4 MiB (net.ipv4.tcp_wmem max) limits one stream to 335 Mbit/s at \
             100 ms RTT (measured 280 Mbit/s); 4 streams reach 940 Mbit/s"
        );
        assert!(e.sentences[1].starts_with("the path is the limit"), "{e:?}");
        assert!(e.sentences[2].contains("11.2 MiB"), "{e:?}");
    }

    #[test]
    fn the_receive_buffer_counts_when_this_host_receives() {
        let e = explain(&LimitInputs {
            rtt_ms: 100.0,
            upload: false,
            tcp: tcp_default_regime(),
            one: Some(summary(1, 450.0, 0.0)),
            best: summary(4, 940.0, 0.0),
            saturated: true,
        });
        assert_eq!(e.one_stream, Some(LimitKind::Window));
        assert!(e.sentences[0].starts_with("receive buffer cap 6 MiB (net.ipv4.tcp_rmem max)"));
    }

    #[test]
    fn receiving_points_at_the_servers_send_buffer() {
        // The bed's download: 32 MiB tcp_rmem here, 4 MiB tcp_wmem on the server.
        let tcp = TcpSettings {
            tcp_rmem: Some([4096, 131072, 32 << 20]),
            ..tcp_default_regime()
        };
        let e = explain(&LimitInputs {
            rtt_ms: 100.0,
            upload: false,
            tcp,
            one: Some(summary(1, 239.0, 0.0)),
            best: summary(4, 925.0, 0.0),
            saturated: false,
        });
        assert_eq!(e.one_stream, Some(LimitKind::Unknown));
        assert!(e.sentences[0].contains("the server's send buffer"), "{e:?}");
    }

    #[test]
    fn loss_and_unsaturated_windows_are_told_apart() {
        // One stream far below its window with heavy retransmits: loss.
        let e = explain(&LimitInputs {
            rtt_ms: 100.0,
            upload: true,
            tcp: tcp_default_regime(),
            one: Some(summary(1, 40.0, 3.0)),
            best: summary(16, 300.0, 2.5),
            saturated: true,
        });
        assert_eq!(e.one_stream, Some(LimitKind::Loss));
        assert_eq!(e.limit, LimitKind::Loss);

        // Still gaining at the last stream count, each stream window-bound: window.
        let e = explain(&LimitInputs {
            rtt_ms: 100.0,
            upload: true,
            tcp: tcp_default_regime(),
            one: Some(summary(1, 280.0, 0.0)),
            best: summary(2, 560.0, 0.0),
            saturated: false,
        });
        assert_eq!(e.limit, LimitKind::Window);
        assert!(e.sentences[1].contains("try --full"), "{e:?}");
    }

    #[test]
    fn fixed_windows_name_the_core_cap() {
        let t = tcp_default_regime();
        let (w, what) = window_cap(&t, 4 << 20, true).unwrap();
        assert_eq!(w, 2 * 212_992);
        assert!(what.contains("net.core.wmem_max"), "{what}");
        let t = TcpSettings {
            core_wmem_max: Some(1 << 30),
            ..t
        };
        let (w, what) = window_cap(&t, 16 << 20, true).unwrap();
        assert_eq!(w, 32 << 20);
        assert_eq!(
            what,
            "fixed socket buffer 16 MiB (32 MiB as the kernel doubles it; autotuning off)"
        );
    }

    /// The medians `ferry probe net` measured on the emulated bed (100 ms, 1 Gbit/s, default
    /// regime: tcp_wmem max 4 MiB, core wmem_max 4 MiB).
    #[test]
    fn the_emulated_bed_explained() {
        let tcp = TcpSettings {
            core_wmem_max: Some(4 << 20),
            core_rmem_max: Some(4 << 20),
            ..tcp_default_regime()
        };
        let pt = |streams: u16, window: u32, rate_mbps: f64, retrans_pct: f64| PointReport {
            streams,
            window,
            rate_mbps,
            per_stream_mbps: rate_mbps / f64::from(streams),
            runs_mbps: vec![rate_mbps],
            rtt_load_ms: 101.0,
            cwnd_bytes: 1e7,
            retransmits: 0,
            retrans_pct,
            errors: Vec::new(),
        };
        let m = 4 << 20;
        let points = vec![
            pt(1, 0, 283.0, 0.0),
            pt(2, 0, 474.0, 0.0),
            pt(4, 0, 925.0, 0.0),
            pt(8, 0, 887.0, 0.5),
            pt(1, m, 465.0, 0.0),
            pt(2, m, 913.0, 0.0),
            pt(4, m, 993.0, 0.0),
            pt(8, m, 1013.0, 0.4),
        ];
        let r = analyse(
            "10.77.0.2:7070",
            true,
            NetOptions::default(),
            tcp,
            points,
            100.07,
            Vec::new(),
        );
        let b = r.best.clone().unwrap();
        assert_eq!((b.streams, b.window), (4, m));
        assert_eq!(r.limit, LimitKind::Link);
        assert_eq!(r.one_stream_limit, Some(LimitKind::Window));
        let e = &r.explanation;
        assert!(
            e[0].starts_with(
                "fixed socket buffer 4 MiB (8 MiB as the kernel doubles it; autotuning off) \
                 limits one stream to 670 Mbit/s at 100 ms RTT (measured 465 Mbit/s)"
            ),
            "{e:?}"
        );
        assert!(
            e[1].starts_with(
                "with autotuning (the default): send buffer cap 4 MiB (net.ipv4.tcp_wmem max) \
                 limits one stream to 335 Mbit/s at 100 ms RTT (measured 283 Mbit/s); 4 streams \
                 reach 925 Mbit/s"
            ),
            "{e:?}"
        );
        assert!(e[2].starts_with("the path is the limit"), "{e:?}");
    }

    fn sample(streams: u16, rate_mbps: f64) -> NetSample {
        NetSample {
            streams,
            rate_mbps,
            sent_bytes: 1 << 30,
            received_bytes: 1 << 30,
            rtt_idle_ms: 100.0,
            rtt_load_ms: 104.0,
            cwnd_bytes: 3e6,
            retransmits: 0,
            mss: 8948,
        }
    }

    #[test]
    fn the_ramp_stops_when_streams_stop_helping_and_picks_the_fewest() {
        // A 1 Gbit/s link with a 335 Mbit/s per-stream cap.
        let rate = |n: u16| (f64::from(n) * 300.0).min(950.0);
        let mut seen = Vec::new();
        let r = probe_net(
            "dtn2:7070",
            true,
            &NetOptions {
                windows: vec![0],
                ..NetOptions::default()
            },
            tcp_default_regime(),
            &crate::NoProgress,
            |p| {
                seen.push(p.streams);
                Ok(sample(p.streams, rate(p.streams)))
            },
        );
        // 1, 2, 4 gain; 8 does not, so 16 is never tried.
        assert_eq!(seen, vec![1, 1, 1, 2, 2, 2, 4, 4, 4, 8, 8, 8]);
        let b = r.best.clone().unwrap();
        assert_eq!((b.streams, b.window), (4, 0));
        assert_eq!(r.limit, LimitKind::Link);
        assert_eq!(r.one_stream_limit, Some(LimitKind::Window));
        let text = r.render_text();
        assert!(text.contains("<- best"), "{text}");
        let p = r.profile_entry("2025-01-01T00:00:00Z".into()).unwrap();
        assert_eq!((p.streams, p.window, p.rtt_ms), (4, 0, 100.0));
    }

    #[test]
    fn failures_are_recorded_not_fatal() {
        let r = probe_net(
            "dtn2:7070",
            true,
            &NetOptions::quick(),
            TcpSettings::default(),
            &crate::NoProgress,
            |_| Err("connection refused".into()),
        );
        assert!(r.best.is_none());
        assert_eq!(r.points.len(), 1);
        assert_eq!(r.points[0].errors, vec!["connection refused".to_string()]);
        assert!(r.render_text().contains("failed: connection refused"));
    }

    #[test]
    fn profiles_are_saved_atomically_and_bounded() {
        let d = tempfile::tempdir().unwrap();
        let p = |i: usize| NetProfile {
            streams: 4,
            window: 0,
            rate_mbps: 940.0,
            rtt_ms: 100.0,
            measured_at: format!("2025-01-01T00:{:02}:{:02}Z", i / 60, i % 60),
        };
        for i in 0..MAX_PROFILES + 5 {
            save_profile(d.path(), &format!("h{i}:7070"), p(i)).unwrap();
        }
        let all = load_profiles(d.path());
        assert_eq!(all.len(), MAX_PROFILES);
        assert!(!all.contains_key("h0:7070") && all.contains_key("h260:7070"));
        // Only the file itself is left, no temporary.
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.path().join(PROFILE_FILE)).unwrap()).unwrap();
        assert_eq!(v["h260:7070"]["streams"], 4);
        assert_eq!(v["h260:7070"]["window"], 0);
    }

    #[test]
    fn rfc3339_formats_utc() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        assert_eq!(rfc3339(t), "2023-11-14T22:13:20Z");
    }
}
