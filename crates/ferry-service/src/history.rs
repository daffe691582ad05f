//! Path history (IEPM-BW style) and job rate samples: the values the store keeps and the API
//! returns, and the pure rule that flags a link whose rate fell well below its recent median.
//! A link is a server of the endpoints file: the path from the service's host to it.

use serde::{Deserialize, Serialize};

/// Job rate samples kept per job; above this the store drops every other one, so a long
/// job's history keeps its shape in bounded rows.
pub const MAX_JOB_SAMPLES: usize = 2000;
/// Link samples kept per link (older ones are deleted as new ones come).
pub const MAX_LINK_SAMPLES: usize = 20_000;
/// The most link samples one history answer holds (the newest).
pub const MAX_HISTORY: usize = 5000;
/// How many earlier samples of the same kind the latest is compared with.
pub const RECENT: usize = 20;
/// Fewer earlier samples than this: too little to call anything slow.
pub const MIN_RECENT: usize = 3;
/// The latest is flagged below this fraction of the recent median.
pub const SLOW_FRACTION: f64 = 0.5;

/// One point of a running job's rate over time.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RateSample {
    /// Unix milliseconds.
    pub t_ms: i64,
    /// The attempt's bytes so far.
    pub bytes_done: u64,
    /// Bytes per second since the previous sample.
    pub rate: f64,
}

/// What measured a link sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The service's scheduled network probe (memory to memory).
    Probe,
    /// A finished job's achieved rate.
    Transfer,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Probe => "probe",
            Source::Transfer => "transfer",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Source::Probe, Source::Transfer]
            .into_iter()
            .find(|x| x.as_str() == s)
    }
}

/// One measurement of a link.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkSample {
    /// Unix milliseconds.
    pub t_ms: i64,
    /// Bytes per second.
    pub rate: f64,
    pub rtt_ms: Option<f64>,
    /// Fraction of segments retransmitted, 0 to 1.
    pub loss: Option<f64>,
    pub source: Source,
    /// The job a transfer sample came from.
    pub job: Option<i64>,
}

/// A link as `GET /api/links` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkStatus {
    pub name: String,
    /// Median rate of the samples the latest is judged against (bytes/s).
    pub median_rate: Option<f64>,
    pub last: Option<LinkSample>,
    pub flagged: bool,
    /// Why it is flagged, in words.
    pub reason: Option<String>,
    /// What the link optimizer chose for it (jobs at once, streams) and measured; `None`
    /// before a job ran on it.
    #[serde(default)]
    pub tuning: Option<crate::optimizer::LinkTuning>,
}

/// `GET /api/jobs/{id}/rates`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRates {
    pub job: i64,
    pub samples: Vec<RateSample>,
}

/// `GET /api/links`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Links {
    pub links: Vec<LinkStatus>,
}

/// `GET /api/links/{name}/history`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkHistory {
    pub name: String,
    pub samples: Vec<LinkSample>,
}

/// The median of `v` (the mean of the middle two for an even count); `None` when empty.
pub fn median(v: &[f64]) -> Option<f64> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(f64::total_cmp);
    let n = s.len();
    Some(if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
}

/// Why `latest` counts as slow against the `earlier` rates (bytes/s), or `None`: flagged when
/// it is below `fraction` of their median and there are at least [`MIN_RECENT`] of them.
pub fn slow(latest: f64, earlier: &[f64], fraction: f64) -> Option<String> {
    if earlier.len() < MIN_RECENT {
        return None;
    }
    let m = median(earlier)?;
    if m <= 0.0 || latest >= fraction * m {
        return None;
    }
    Some(format!(
        "the latest rate, {}, is below {:.0}% of the median of the {} samples before it, {}",
        human_rate(latest),
        fraction * 100.0,
        earlier.len(),
        human_rate(m)
    ))
}

/// A link's status from its samples, oldest first: the latest is judged against the
/// [`RECENT`] samples of the same source before it (a small transfer's rate says little about
/// what a probe should see, and the other way round).
pub fn status(name: &str, samples: &[LinkSample], fraction: f64) -> LinkStatus {
    let Some((last, before)) = samples.split_last() else {
        return LinkStatus {
            name: name.to_owned(),
            median_rate: None,
            last: None,
            flagged: false,
            reason: None,
            tuning: None,
        };
    };
    let mut earlier: Vec<f64> = before
        .iter()
        .rev()
        .filter(|s| s.source == last.source)
        .take(RECENT)
        .map(|s| s.rate)
        .collect();
    earlier.reverse();
    let reason =
        slow(last.rate, &earlier, fraction).map(|r| format!("{} ({})", r, last.source.as_str()));
    LinkStatus {
        name: name.to_owned(),
        median_rate: median(&earlier),
        last: Some(*last),
        flagged: reason.is_some(),
        reason,
        tuning: None,
    }
}

/// A rate for people: bytes/s in decimal units.
fn human_rate(r: f64) -> String {
    const UNITS: [&str; 5] = ["B/s", "kB/s", "MB/s", "GB/s", "TB/s"];
    let mut v = r;
    let mut i = 0;
    while v >= 1000.0 && i + 1 < UNITS.len() {
        v /= 1000.0;
        i += 1;
    }
    format!("{v:.1} {}", UNITS[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn a_rate_below_half_the_median_is_flagged_with_why() {
        let earlier = [100e6, 90e6, 110e6, 105e6];
        assert_eq!(slow(60e6, &earlier, 0.5), None);
        assert_eq!(slow(52e6, &earlier, 0.5), None);
        let why = slow(40e6, &earlier, 0.5).unwrap();
        assert!(why.contains("40.0 MB/s"), "{why}");
        assert!(why.contains("50%"), "{why}");
        assert!(why.contains("102.5 MB/s"), "{why}");
        // Too few earlier samples: nothing to judge by.
        assert_eq!(slow(1.0, &earlier[..2], 0.5), None);
    }

    fn sample(rate: f64, source: Source) -> LinkSample {
        LinkSample {
            t_ms: 0,
            rate,
            rtt_ms: None,
            loss: None,
            source,
            job: None,
        }
    }

    #[test]
    fn the_latest_is_judged_against_samples_of_its_own_source() {
        let mut v: Vec<LinkSample> = (0..5).map(|_| sample(100e6, Source::Probe)).collect();
        // Small transfers are slow; they do not make the next probe look fast or slow.
        v.extend((0..5).map(|_| sample(1e6, Source::Transfer)));
        v.push(sample(90e6, Source::Probe));
        let s = status("h:1", &v, 0.5);
        assert!(!s.flagged, "{s:?}");
        assert_eq!(s.median_rate, Some(100e6));
        v.push(sample(10e6, Source::Probe));
        let s = status("h:1", &v, 0.5);
        assert!(s.flagged, "{s:?}");
        assert!(s.reason.unwrap().contains("probe"));
        let empty = status("h:1", &[], 0.5);
        assert_eq!(
            (empty.flagged, empty.last, empty.median_rate),
            (false, None, None)
        );
    }

    #[test]
    fn only_the_last_twenty_count() {
        // Long ago the link was fast; the last 20 are slow, so a slow latest is normal.
        let mut v: Vec<LinkSample> = (0..50).map(|_| sample(1e9, Source::Probe)).collect();
        v.extend((0..RECENT).map(|_| sample(1e6, Source::Probe)));
        v.push(sample(0.9e6, Source::Probe));
        assert!(!status("x", &v, SLOW_FRACTION).flagged);
    }
}
