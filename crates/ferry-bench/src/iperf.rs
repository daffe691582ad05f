//! iperf3's JSON: the receiver's per-interval goodput after the first seconds (slow start).
//!
//! `-O` is not used: iperf3 3.12's server mis-accounts the omitted second in `end.sum_received`
//! (ferry-netem's README). The client runs `-t (T + omit)` and the bench drops the receiver's
//! intervals that start before `omit` seconds itself. For a put (client sends) the receiver is
//! the server, whose intervals come back with `--get-server-output` (server started with `-J`);
//! for a get (`-R`) the receiver is the client.

use anyhow::{bail, Context, Result};
use serde_json::Value;

use ferry_units::stats::median_of;
use ferry_units::units::size_label;

#[derive(Clone, Debug, PartialEq)]
pub struct IperfResult {
    /// Bytes received in the counted intervals over their seconds.
    pub mean_mbps: f64,
    /// Median of the counted 1-s intervals.
    pub median_mbps: f64,
    pub bytes: u64,
    pub seconds: f64,
    pub intervals: usize,
    /// Payload bytes per full-sized segment (`start.tcp_mss_default`, TCP_MAXSEG: the TCP
    /// options are already taken off), when iperf3 reports it.
    pub mss: Option<u32>,
}

/// What a link can deliver to a TCP receiver, in Mbit/s: `rate_bps` of IP packets of `mtu`
/// bytes, each carrying `mss` bytes of payload. None when the numbers cannot describe a
/// full-sized segment.
///
/// Why: iperf3's receiver counts what its application read in each interval, and after a
/// loss the bytes that arrived behind the hole wait in TCP's out-of-order queue until the
/// retransmission fills it. Bytes that crossed the link before the first counted second can
/// so be read, and counted, inside it. Of the 324 steady-state iperf3 rows on the 1 Gbit/s bed
/// in `docs/bench/runs/` (MTU 9000: 994.2 Mbit/s of payload), 16 at 50 ms report more than the
/// link can carry, up to 1,008 (8 streams, losing some 15% of their packets at the queue),
/// and 25 at 0 ms by at most 0.05% (994.7). The best of several such figures is biased
/// upward the most. A ceiling above what the link carries is a measurement error, not a rate
/// anyone can reach.
pub fn payload_capacity_mbps(rate_bps: u64, mtu: u32, mss: u32) -> Option<f64> {
    (rate_bps > 0 && mss > 0 && mss < mtu)
        .then(|| rate_bps as f64 * f64::from(mss) / f64::from(mtu) / 1e6)
}

/// Data-set label of an `iperf3 -n BYTES` row: memory to memory, the same bytes as a file.
pub fn same_bytes_label(bytes: u64) -> String {
    format!("memory-{}", size_label(bytes))
}

/// `(sent, received)` bytes of an iperf3 run, from its `end` sums. With `-n`, the sender sends
/// exactly that many bytes, and iperf3 ends the test when the last one is written: the
/// receiver's count at that moment misses what was still in flight (0.1-1.6% of 1 GiB at
/// 1 Gbit/s and 0-100 ms on the bed).
pub fn sent_received_bytes(json: &str) -> Result<(u64, u64)> {
    let v: Value = serde_json::from_str(json).context("iperf3 output is not JSON")?;
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        bail!("iperf3: {e}");
    }
    let get = |p: &str| {
        v.pointer(p)
            .and_then(Value::as_u64)
            .with_context(|| format!("no {p} in iperf3's JSON"))
    };
    Ok((get("/end/sum_sent/bytes")?, get("/end/sum_received/bytes")?))
}

/// Parses the client's `-J --get-server-output` JSON.
pub fn parse(json: &str, reverse: bool, omit_s: f64) -> Result<IperfResult> {
    let v: Value = serde_json::from_str(json).context("iperf3 output is not JSON")?;
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        bail!("iperf3: {e}");
    }
    let intervals = if reverse {
        v.get("intervals")
    } else {
        v.get("server_output_json").and_then(|s| s.get("intervals"))
    }
    .and_then(Value::as_array)
    .context("no receiver intervals in iperf3's JSON (server not started with -J?)")?;
    let mut bytes = 0u64;
    let mut secs = 0.0;
    let mut rates = Vec::new();
    for i in intervals {
        let sum = i.get("sum").context("interval without sum")?;
        let start = sum.get("start").and_then(Value::as_f64).unwrap_or(0.0);
        let s = sum.get("seconds").and_then(Value::as_f64).unwrap_or(0.0);
        let b = sum.get("bytes").and_then(Value::as_u64).unwrap_or(0);
        // Skip slow start, and the stub interval iperf3 adds at the very end.
        if start + 0.05 < omit_s || s < 0.5 {
            continue;
        }
        bytes += b;
        secs += s;
        rates.push(b as f64 * 8.0 / s / 1e6);
    }
    if rates.is_empty() || secs <= 0.0 {
        bail!("iperf3 reported no intervals after the first {omit_s} s");
    }
    Ok(IperfResult {
        mean_mbps: bytes as f64 * 8.0 / secs / 1e6,
        median_mbps: median_of(&rates).unwrap_or(0.0),
        bytes,
        seconds: secs,
        intervals: rates.len(),
        mss: v
            .pointer("/start/tcp_mss_default")
            .and_then(Value::as_u64)
            .and_then(|m| u32::try_from(m).ok()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interval(start: f64, secs: f64, mbit: f64) -> Value {
        let bytes = (mbit * 1e6 / 8.0 * secs) as u64;
        serde_json::json!({"streams": [], "sum": {"start": start, "end": start + secs,
            "seconds": secs, "bytes": bytes, "bits_per_second": mbit * 1e6, "omitted": false}})
    }

    #[test]
    fn receiver_intervals_after_omit() {
        let server: Vec<Value> = vec![
            interval(0.0, 1.0, 100.0),
            interval(1.0, 1.0, 800.0),
            interval(2.0, 1.0, 990.0),
            interval(3.0, 1.0, 980.0),
            interval(4.0, 1.0, 960.0),
            interval(5.0, 0.002, 5000.0),
        ];
        let client: Vec<Value> = vec![interval(0.0, 1.0, 1.0)];
        let j = serde_json::json!({"start": {"tcp_mss_default": 8948}, "intervals": client,
            "end": {}, "server_output_json": {"intervals": server}});
        let r = parse(&j.to_string(), false, 2.0).unwrap();
        assert_eq!(r.intervals, 3);
        assert_eq!(r.mss, Some(8948));
        assert!((r.mean_mbps - 976.67).abs() < 0.1, "{}", r.mean_mbps);
        assert!((r.median_mbps - 980.0).abs() < 0.01);
        // reverse: the client's intervals
        let r = parse(&j.to_string(), true, 0.0).unwrap();
        assert_eq!(r.intervals, 1);
        assert!((r.mean_mbps - 1.0).abs() < 0.01);
        assert!(parse(&j.to_string(), true, 2.0).is_err());
    }

    #[test]
    fn payload_capacity_of_a_link() {
        // 1 Gbit/s at MTU 9000 with TCP timestamps: 8948 payload bytes per 9000-byte packet.
        let c = payload_capacity_mbps(1_000_000_000, 9000, 8948).unwrap();
        assert!((c - 994.222).abs() < 0.001, "{c}");
        assert_eq!(payload_capacity_mbps(0, 9000, 8948), None);
        assert_eq!(payload_capacity_mbps(1_000_000_000, 1500, 1500), None);
        assert_eq!(payload_capacity_mbps(1_000_000_000, 1500, 0), None);
    }

    #[test]
    fn sent_and_received_sums() {
        let j = r#"{"end": {"sum_sent": {"bytes": 1073741824}, "sum_received": {"bytes": 1068498944}}}"#;
        assert_eq!(sent_received_bytes(j).unwrap(), (1073741824, 1068498944));
        assert!(sent_received_bytes(r#"{"end": {}}"#).is_err());
        let e = sent_received_bytes(r#"{"error": "the server is busy"}"#).unwrap_err();
        assert!(e.to_string().contains("busy"), "{e}");
    }

    #[test]
    fn errors_are_reported() {
        let e = parse(r#"{"error": "unable to connect to server"}"#, false, 2.0).unwrap_err();
        assert!(e.to_string().contains("unable to connect"));
        assert!(parse("not json", false, 2.0).is_err());
        assert!(parse(r#"{"intervals": []}"#, false, 2.0).is_err());
    }
}
