//! Sizes, durations and rates: parsed from what a person types, formatted for what a person
//! reads.
//!
//! Two syntaxes exist and both stay, since each is someone's documented interface:
//! - the `ferry` command line's (`parse_size`, `parse_duration`): whole numbers, binary units,
//!   seconds by default, errors with advice;
//! - the tc-like one of the test bed and the bench (`*_tc`, [`parse_size_fractional`]):
//!   fractions, `_` separators, milliseconds by default, bits for rates, terse errors.
//!
//! The formatters differ in the same way, one per report style; each says which parser reads
//! its output back. Parsers never panic: every input gives a value or a [`ParseError`].

use std::fmt;
use std::num::ParseIntError;
use std::time::Duration;

/// 2^10 bytes.
pub const KIB: u64 = 1 << 10;
/// 2^20 bytes.
pub const MIB: u64 = 1 << 20;
/// 2^30 bytes.
pub const GIB: u64 = 1 << 30;
/// 2^40 bytes.
pub const TIB: u64 = 1 << 40;

/// What was wrong with the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseErrorKind {
    /// The number part is missing or is not a number.
    Number,
    /// The unit is not one this syntax knows.
    Unit,
    /// The value does not fit (too large, too small, negative).
    Range,
}

/// A size, duration or rate that did not parse. Its message is the one each tool has always
/// printed, so switching a caller to this crate changes no output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    kind: ParseErrorKind,
    message: String,
    source: Option<ParseIntError>,
}

impl ParseError {
    fn new(kind: ParseErrorKind, message: String) -> Self {
        ParseError {
            kind,
            message,
            source: None,
        }
    }

    /// What was wrong.
    pub fn kind(&self) -> ParseErrorKind {
        self.kind
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ParseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// For the tools whose parsers return `Result<_, String>`.
impl From<ParseError> for String {
    fn from(e: ParseError) -> String {
        e.message
    }
}

use ParseErrorKind::{Number, Range, Unit};

// ---- the command line's syntax ----

/// Parses `8M`, `16MiB`, `4096`, `1G` (whole numbers; binary units K, M, G, T, any case; a
/// trailing `B`/`iB` is optional). The syntax of every `ferry` option that takes a size.
pub fn parse_size(s: &str) -> Result<u64, ParseError> {
    let lower = s.trim().to_ascii_lowercase();
    let digits_end = lower
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(lower.len());
    let (num, unit) = lower.split_at(digits_end);
    let n: u64 = num.parse().map_err(|e| ParseError {
        kind: Number,
        message: format!("`{s}` is not a size (try 8M, 16MiB or 4096)"),
        source: Some(e),
    })?;
    let mult: u64 = match unit.trim_end_matches("ib").trim_end_matches('b') {
        "" => 1,
        "k" => KIB,
        "m" => MIB,
        "g" => GIB,
        "t" => TIB,
        _ => {
            return Err(ParseError::new(
                Unit,
                format!("`{s}`: unknown size unit (use K, M, G or T)"),
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| ParseError::new(Range, format!("`{s}` is too large")))
}

/// Parses `90s`, `3m`, `1h`, `7d`, `250ms` or a plain number of seconds (whole numbers, any
/// case): the one duration syntax of every `ferry` option that takes a time.
pub fn parse_duration(s: &str) -> Result<Duration, ParseError> {
    let t = s.trim().to_ascii_lowercase();
    let end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(end);
    let n: u64 = num.parse().map_err(|e| ParseError {
        kind: Number,
        message: format!("`{s}` is not a duration (try 90s, 3m or 1h)"),
        source: Some(e),
    })?;
    let per = match unit.trim() {
        "ms" => return Ok(Duration::from_millis(n)),
        "" | "s" => 1,
        "m" | "min" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => {
            return Err(ParseError::new(
                Unit,
                format!("`{s}`: unknown duration unit (use ms, s, m, h or d)"),
            ))
        }
    };
    n.checked_mul(per)
        .map(Duration::from_secs)
        .ok_or_else(|| ParseError::new(Range, format!("`{s}` is too long")))
}

// ---- the test bed's and the bench's syntax ----

/// Splits "12.5ms" into ("12.5", "ms"): the number may hold digits, `.`, `e` and `_`.
fn split_num(s: &str) -> (&str, &str) {
    let i = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == '_'))
        .unwrap_or(s.len());
    (&s[..i], s[i..].trim())
}

/// Parses the number part of the tc-like syntax, `_` ignored; `what` names it in the error.
fn number(num: &str, what: &str, shown: &str) -> Result<f64, ParseError> {
    num.replace('_', "")
        .parse()
        .map_err(|_| ParseError::new(Number, format!("bad {what} {shown:?}")))
}

/// Parses a size for the bench: "35M", "1G", "10K", "64MiB", "1.5G" (binary units: K/M/G/T
/// mean KiB/MiB/GiB/TiB, any case) or a plain byte count; at least one byte.
pub fn parse_size_fractional(s: &str) -> Result<u64, ParseError> {
    let t = s.trim();
    let i = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (num, unit) = (&t[..i], t[i..].trim());
    let v = number(num, "size", s)?;
    let unit = unit.to_ascii_lowercase();
    let unit = unit.trim_end_matches('b').trim_end_matches('i');
    let mult = match unit {
        "" => 1,
        "k" => KIB,
        "m" => MIB,
        "g" => GIB,
        "t" => TIB,
        _ => {
            return Err(ParseError::new(
                Unit,
                format!("bad size unit in {s:?} (K, M, G: binary)"),
            ))
        }
    };
    let b = (v * mult as f64).round();
    if !(1.0..1e16).contains(&b) {
        return Err(ParseError::new(Range, format!("bad size {s:?}")));
    }
    Ok(b as u64)
}

/// Parses a byte count like tc: "12500000", "64k", "12.5M", "4MiB", "1GiB". k/M/G are decimal,
/// Ki/Mi/Gi binary; a trailing "B" is optional.
pub fn parse_bytes_tc(s: &str) -> Result<u64, ParseError> {
    let t = s.trim();
    let (num, unit) = split_num(t);
    let v = number(num, "size", s)?;
    let unit = unit.strip_suffix('B').unwrap_or(unit);
    let mult = match unit.to_ascii_lowercase().as_str() {
        "" => 1.0,
        "k" => 1e3,
        "m" => 1e6,
        "g" => 1e9,
        "ki" => KIB as f64,
        "mi" => MIB as f64,
        "gi" => GIB as f64,
        _ => return Err(ParseError::new(Unit, format!("bad size unit in {s:?}"))),
    };
    let b = (v * mult).round();
    if !(0.0..1e18).contains(&b) {
        return Err(ParseError::new(Range, format!("bad size {s:?}")));
    }
    Ok(b as u64)
}

/// Parses "50ms", "0.1s", "250us", "1500ns" like tc; a bare number means milliseconds.
pub fn parse_duration_tc(s: &str) -> Result<Duration, ParseError> {
    let s = s.trim();
    let (num, unit) = split_num(s);
    let v = number(num, "duration", s)?;
    let secs = match unit {
        "" | "ms" => v / 1e3,
        "s" => v,
        "us" | "µs" => v / 1e6,
        "ns" => v / 1e9,
        _ => {
            return Err(ParseError::new(
                Unit,
                format!("bad duration unit in {s:?} (use s, ms, us, ns)"),
            ))
        }
    };
    // try_: a finite but huge value ("1e300s") is an error, not a panic.
    Duration::try_from_secs_f64(secs)
        .map_err(|_| ParseError::new(Range, format!("bad duration {s:?}")))
}

/// Parses a rate in bit/s like tc: "1gbit", "200mbit", "500kbit", "1000000" (bit/s),
/// "1gbps"/"10mbps" (bytes/s), any case. "0", "none", "unlimited", "inf" mean no limit: `None`.
pub fn parse_rate_tc(s: &str) -> Result<Option<u64>, ParseError> {
    let s = s.trim().to_ascii_lowercase();
    if matches!(s.as_str(), "0" | "none" | "unlimited" | "inf") {
        return Ok(None);
    }
    let (num, unit) = split_num(&s);
    let v = number(num, "rate", &s)?;
    let mult = match unit {
        "" | "bit" | "bps" => 1.0,
        "kbit" | "k" => 1e3,
        "mbit" | "m" => 1e6,
        "gbit" | "g" => 1e9,
        "kibit" => KIB as f64,
        "mibit" => MIB as f64,
        "gibit" => GIB as f64,
        "kbps" => 8e3,
        "mbps" => 8e6,
        "gbps" => 8e9,
        _ => {
            return Err(ParseError::new(
                Unit,
                format!("bad rate unit in {s:?} (use bit, kbit, mbit, gbit)"),
            ))
        }
    };
    let bps = (v * mult).round();
    if !(1.0..1e15).contains(&bps) {
        return Err(ParseError::new(Range, format!("bad rate {s:?}")));
    }
    Ok(Some(bps as u64))
}

// ---- formatting ----

/// "1GiB", "16MiB", "10KiB", "100000KiB" or "123B": exact, in the largest binary unit that
/// divides it; the bench's data set labels. [`parse_size_fractional`] reads it back.
pub fn size_label(bytes: u64) -> String {
    for (unit, name) in [(GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")] {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{name}", bytes / unit);
        }
    }
    format!("{bytes}B")
}

/// A size as ferry's `--block-size` takes it: `16777216` → `"16M"`, exact. [`parse_size`]
/// reads it back.
pub fn size_flag(n: u64) -> String {
    if n.is_multiple_of(MIB) {
        format!("{}M", n / MIB)
    } else if n.is_multiple_of(KIB) {
        format!("{}K", n / KIB)
    } else {
        n.to_string()
    }
}

/// `4194304` → `"4 MiB"`, `1610612736` → `"1.5 GiB"`, `512` → `"512 B"`: exact when whole,
/// else one decimal (none from 100 up); the probe's reports. [`parse_bytes_tc`] reads it back.
pub fn format_bytes(n: u64) -> String {
    let (unit, name) = if n >= GIB {
        (GIB, "GiB")
    } else if n >= MIB {
        (MIB, "MiB")
    } else if n >= KIB {
        (KIB, "KiB")
    } else {
        return format!("{n} B");
    };
    if n.is_multiple_of(unit) {
        format!("{} {name}", n / unit)
    } else {
        let v = n as f64 / unit as f64;
        if v >= 100.0 {
            format!("{v:.0} {name}")
        } else {
            format!("{v:.1} {name}")
        }
    }
}

/// `"1.23 GiB"`: always two decimals from 1 KiB up, up to TiB; the CLI's progress and summary
/// lines. [`parse_bytes_tc`] reads it back below 1 TiB.
pub fn format_bytes_2dp(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// A link rate in bit/s as tc writes it: "1gbit", "200mbit", "1500bit", or "uncapped" for
/// `None`; the bench's link labels. [`parse_rate_tc`] reads it back.
pub fn rate_label(rate_bps: Option<u64>) -> String {
    match rate_bps {
        None => "uncapped".into(),
        Some(r) if r % 1_000_000_000 == 0 => format!("{}gbit", r / 1_000_000_000),
        Some(r) if r % 1_000_000 == 0 => format!("{}mbit", r / 1_000_000),
        Some(r) => format!("{r}bit"),
    }
}

/// `10000.0` → `"10 Gbit/s"`, `335.5` → `"335 Mbit/s"` (Mbit/s rounded down), from Mbit/s; the
/// probe's advice.
pub fn format_mbps(mbps: f64) -> String {
    if mbps >= 1000.0 && (mbps / 1000.0).fract() == 0.0 {
        format!("{} Gbit/s", mbps / 1000.0)
    } else if mbps >= 10_000.0 {
        format!("{:.0} Gbit/s", mbps / 1000.0)
    } else if mbps >= 1000.0 {
        format!("{:.1} Gbit/s", mbps / 1000.0)
    } else {
        format!("{} Mbit/s", mbps.floor())
    }
}

/// A duration in seconds, in the unit that reads best: `0.000042` → `"42 µs"`, three
/// significant digits at most. [`parse_duration_tc`] reads it back.
pub fn format_secs(s: f64) -> String {
    if s < 1e-6 {
        format!("{:.0} ns", s * 1e9)
    } else if s < 1e-5 {
        format!("{:.1} µs", s * 1e6)
    } else if s < 1e-3 {
        format!("{:.0} µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

/// Milliseconds as given, without a needless ".0": `50.0` → `"50 ms"`, `12.5` → `"12.5 ms"`.
/// [`parse_duration_tc`] reads it back.
pub fn format_ms(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0} ms")
    } else {
        format!("{v} ms")
    }
}

/// Milliseconds to two or three significant digits: `12.34` → `"12 ms"`, `1.25` → `"1.2 ms"`,
/// `0.25` → `"250 µs"`. [`parse_duration_tc`] reads it back.
pub fn format_ms_brief(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0} ms")
    } else if v < 1.0 {
        format!("{:.0} µs", v * 1000.0)
    } else {
        format!("{v:.1} ms")
    }
}

/// An integer with thousands separators: `12213.4` → `"12,213"`. Values below 10 keep one
/// decimal so that slow rates do not read as 0; not finite → `"-"`.
pub fn format_thousands(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    if v.abs() < 10.0 {
        return format!("{v:.1}");
    }
    let n = v.round() as i64;
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        out.insert(0, '-');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    #[test]
    fn cli_sizes() {
        assert_eq!(parse_size("8M").unwrap(), 8 << 20);
        assert_eq!(parse_size("16MiB").unwrap(), 16 << 20);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size(" 2T ").unwrap(), 2 << 40);
        assert_eq!(parse_size("0").unwrap(), 0);
        let e = parse_size("x").unwrap_err();
        assert_eq!(e.kind(), Number);
        assert_eq!(e.to_string(), "`x` is not a size (try 8M, 16MiB or 4096)");
        assert!(
            e.source().is_some(),
            "the CLI prints the cause after the advice"
        );
        let e = parse_size("3Q").unwrap_err();
        assert_eq!(e.kind(), Unit);
        assert_eq!(e.to_string(), "`3Q`: unknown size unit (use K, M, G or T)");
        assert!(e.source().is_none());
        let e = parse_size("99999999999T").unwrap_err();
        assert_eq!(
            (e.kind(), e.to_string()),
            (Range, "`99999999999T` is too large".into())
        );
        assert!(parse_size("1.5G").is_err());
    }

    #[test]
    fn cli_durations() {
        assert_eq!(parse_duration("3m").unwrap(), Duration::from_secs(180));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("2 min").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1H").unwrap(), Duration::from_secs(3600));
        assert_eq!(
            parse_duration("7d").unwrap(),
            Duration::from_secs(7 * 86_400)
        );
        let e = parse_duration("3 weeks").unwrap_err();
        assert_eq!(
            (e.kind(), e.to_string()),
            (
                Unit,
                "`3 weeks`: unknown duration unit (use ms, s, m, h or d)".into()
            )
        );
        let e = parse_duration("soon").unwrap_err();
        assert_eq!(
            e.to_string(),
            "`soon` is not a duration (try 90s, 3m or 1h)"
        );
        assert!(e.source().is_some());
        assert_eq!(
            parse_duration("99999999999999999999h").unwrap_err().kind(),
            Number
        );
        let e = parse_duration(&format!("{}h", u64::MAX)).unwrap_err();
        assert_eq!(e.kind(), Range);
        assert_eq!(e.to_string(), format!("`{}h` is too long", u64::MAX));
    }

    #[test]
    fn bench_sizes() {
        assert_eq!(parse_size_fractional("35M").unwrap(), 35 * MIB);
        assert_eq!(parse_size_fractional("1G").unwrap(), GIB);
        assert_eq!(parse_size_fractional("10KiB").unwrap(), 10 * KIB);
        assert_eq!(parse_size_fractional("1.5g").unwrap(), 3 * GIB / 2);
        assert_eq!(parse_size_fractional("4096").unwrap(), 4096);
        assert_eq!(parse_size_fractional("1_000").unwrap(), 1000);
        assert_eq!(parse_size_fractional("1 t").unwrap(), TIB);
        let e = parse_size_fractional("12 parsecs").unwrap_err();
        assert_eq!(
            (e.kind(), e.to_string()),
            (
                Unit,
                "bad size unit in \"12 parsecs\" (K, M, G: binary)".into()
            )
        );
        let e = parse_size_fractional("0").unwrap_err();
        assert_eq!((e.kind(), e.to_string()), (Range, "bad size \"0\"".into()));
        let e = parse_size_fractional("big").unwrap_err();
        assert_eq!(
            (e.kind(), e.to_string()),
            (Number, "bad size \"big\"".into())
        );
        assert_eq!(String::from(e), "bad size \"big\"");
    }

    #[test]
    fn tc_syntax() {
        assert_eq!(
            parse_duration_tc("50ms").unwrap(),
            Duration::from_millis(50)
        );
        assert_eq!(parse_duration_tc("50").unwrap(), Duration::from_millis(50));
        assert_eq!(
            parse_duration_tc("0.1s").unwrap(),
            Duration::from_millis(100)
        );
        assert_eq!(
            parse_duration_tc("250us").unwrap(),
            Duration::from_micros(250)
        );
        assert_eq!(
            parse_duration_tc("250 µs").unwrap(),
            Duration::from_micros(250)
        );
        assert_eq!(
            parse_duration_tc("1500ns").unwrap(),
            Duration::from_nanos(1500)
        );
        let e = parse_duration_tc("5 parsecs").unwrap_err();
        assert_eq!(
            e.to_string(),
            "bad duration unit in \"5 parsecs\" (use s, ms, us, ns)"
        );
        assert_eq!(parse_duration_tc("1e300s").unwrap_err().kind(), Range);
        assert_eq!(parse_duration_tc("-5ms").unwrap_err().kind(), Number);
        assert_eq!(parse_rate_tc("1gbit").unwrap(), Some(1_000_000_000));
        assert_eq!(parse_rate_tc("200Mbit").unwrap(), Some(200_000_000));
        assert_eq!(parse_rate_tc("1.5mbit").unwrap(), Some(1_500_000));
        assert_eq!(parse_rate_tc("10mbps").unwrap(), Some(80_000_000));
        assert_eq!(parse_rate_tc("1kibit").unwrap(), Some(1024));
        assert_eq!(parse_rate_tc("unlimited").unwrap(), None);
        assert_eq!(parse_rate_tc("0").unwrap(), None);
        let e = parse_rate_tc("Fast").unwrap_err();
        assert_eq!(e.to_string(), "bad rate \"fast\"");
        let e = parse_rate_tc("5 furlongs").unwrap_err();
        assert_eq!(
            e.to_string(),
            "bad rate unit in \"5 furlongs\" (use bit, kbit, mbit, gbit)"
        );
        assert_eq!(parse_rate_tc("0.1bit").unwrap_err().kind(), Range);
        assert_eq!(parse_bytes_tc("12500000").unwrap(), 12_500_000);
        assert_eq!(parse_bytes_tc("12.5M").unwrap(), 12_500_000);
        assert_eq!(parse_bytes_tc("4MiB").unwrap(), 4 << 20);
        assert_eq!(parse_bytes_tc("64k").unwrap(), 64_000);
        assert_eq!(parse_bytes_tc("1e3").unwrap(), 1000);
        assert_eq!(parse_bytes_tc("0").unwrap(), 0);
        assert_eq!(
            parse_bytes_tc("4 parsecs").unwrap_err().to_string(),
            "bad size unit in \"4 parsecs\""
        );
        assert_eq!(parse_bytes_tc("1e30").unwrap_err().kind(), Range);
    }

    #[test]
    fn formats() {
        assert_eq!(size_label(GIB), "1GiB");
        assert_eq!(size_label(100 * MIB), "100MiB");
        assert_eq!(size_label(102_400_000), "100000KiB");
        assert_eq!(size_label(1000), "1000B");
        assert_eq!(size_label(0), "0B");
        assert_eq!(size_flag(16 << 20), "16M");
        assert_eq!(size_flag(12 << 10), "12K");
        assert_eq!(size_flag(1000), "1000");
        assert_eq!(size_flag(0), "0M");
        assert_eq!(format_bytes(4 << 20), "4 MiB");
        assert_eq!(format_bytes(3 << 29), "1.5 GiB");
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(150 * MIB + 1), "150 MiB");
        assert_eq!(format_bytes_2dp(512), "512 B");
        assert_eq!(format_bytes_2dp(1024), "1.00 KiB");
        assert_eq!(format_bytes_2dp(1_320_702_444), "1.23 GiB");
        assert_eq!(format_bytes_2dp(5 * 1024 * TIB), "5120.00 TiB");
        assert_eq!(rate_label(Some(1_000_000_000)), "1gbit");
        assert_eq!(rate_label(Some(200_000_000)), "200mbit");
        assert_eq!(rate_label(Some(1500)), "1500bit");
        assert_eq!(rate_label(None), "uncapped");
        assert_eq!(format_mbps(10_000.0), "10 Gbit/s");
        assert_eq!(format_mbps(335.5), "335 Mbit/s");
        assert_eq!(format_mbps(12_345.0), "12 Gbit/s");
        assert_eq!(format_mbps(1234.0), "1.2 Gbit/s");
        assert_eq!(format_secs(0.000042), "42 µs");
        assert_eq!(format_secs(0.0000042), "4.2 µs");
        assert_eq!(format_secs(0.00000042), "420 ns");
        assert_eq!(format_secs(0.0123), "12.30 ms");
        assert_eq!(format_secs(2.5), "2.50 s");
        assert_eq!(format_ms(50.0), "50 ms");
        assert_eq!(format_ms(12.5), "12.5 ms");
        assert_eq!(format_ms_brief(12.34), "12 ms");
        assert_eq!(format_ms_brief(1.25), "1.2 ms");
        assert_eq!(format_ms_brief(0.25), "250 µs");
        assert_eq!(format_thousands(12213.4), "12,213");
        assert_eq!(format_thousands(1234567.0), "1,234,567");
        assert_eq!(format_thousands(-1234567.0), "-1,234,567");
        assert_eq!(format_thousands(431.0), "431");
        assert_eq!(format_thousands(4.25), "4.2");
        assert_eq!(format_thousands(f64::NAN), "-");
    }
}
