//! Small formatting and parsing helpers shared by the reports.

pub(crate) const KIB: u64 = 1 << 10;
pub(crate) const MIB: u64 = 1 << 20;
pub(crate) const GIB: u64 = 1 << 30;

/// `4194304` → `"4 MiB"`, `1610612736` → `"1.5 GiB"`, `512` → `"512 B"`.
pub(crate) fn bytes(n: u64) -> String {
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

/// A size as ferry's `--block-size` takes it: `16777216` → `"16M"`.
pub(crate) fn size_flag(n: u64) -> String {
    if n.is_multiple_of(MIB) {
        format!("{}M", n / MIB)
    } else if n.is_multiple_of(KIB) {
        format!("{}K", n / KIB)
    } else {
        n.to_string()
    }
}

/// An integer with thousands separators: `12213.4` → `"12,213"`. Values below 10 keep one
/// decimal so that slow rates do not read as 0.
pub(crate) fn num(v: f64) -> String {
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

/// A duration in seconds, in the unit that reads best: `0.000042` → `"42 µs"`.
pub(crate) fn secs(s: f64) -> String {
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

/// Parses a kernel CPU list such as `"0-3,8,10-11"`. `None` if malformed.
pub(crate) fn parse_cpulist(s: &str) -> Option<Vec<usize>> {
    let s = s.trim();
    let mut out = Vec::new();
    if s.is_empty() {
        return Some(out);
    }
    for part in s.split(',') {
        let part = part.trim();
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    out.sort_unstable();
    out.dedup();
    Some(out)
}

/// The inverse of [`parse_cpulist`]: `[0, 1, 2, 3, 8]` → `"0-3,8"`.
pub(crate) fn format_cpulist(cpus: &[usize]) -> String {
    let mut v = cpus.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let start = v[i];
        let mut end = start;
        while i + 1 < v.len() && v[i + 1] == end + 1 {
            i += 1;
            end = v[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(bytes(4 << 20), "4 MiB");
        assert_eq!(bytes(3 << 29), "1.5 GiB");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(size_flag(16 << 20), "16M");
        assert_eq!(num(12213.4), "12,213");
        assert_eq!(num(1234567.0), "1,234,567");
        assert_eq!(num(431.0), "431");
        assert_eq!(num(4.25), "4.2");
        assert_eq!(secs(0.000042), "42 µs");
        assert_eq!(secs(0.0000042), "4.2 µs");
        assert_eq!(secs(0.00000042), "420 ns");
    }

    #[test]
    fn cpulists() {
        assert_eq!(
            parse_cpulist("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpulist(""), Some(vec![]));
        assert_eq!(parse_cpulist("x"), None);
        assert_eq!(format_cpulist(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(format_cpulist(&[]), "none");
    }
}
