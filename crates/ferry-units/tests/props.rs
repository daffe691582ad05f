//! Properties: parsers never panic, formatters are read back by the parser their doc names, and
//! the medians agree with a plain sort.

use std::time::Duration;

use ferry_units::stats::*;
use ferry_units::units::*;
use proptest::prelude::*;

/// Text shaped like what the parsers take (digits, separators, units, odd characters), which
/// reaches deeper into them than arbitrary strings do.
fn unitish() -> impl Strategy<Value = String> {
    "[ 0-9._e+-]{0,24}[ a-zA-Zµ%]{0,6}"
}

fn all_parsers(s: &str) {
    let _ = parse_size(s);
    let _ = parse_duration(s);
    let _ = parse_size_fractional(s);
    let _ = parse_bytes_tc(s);
    let _ = parse_duration_tc(s);
    let _ = parse_rate_tc(s);
}

/// `got` within `rel` of `want`, or within `abs` for values near zero.
fn near(got: f64, want: f64, rel: f64, abs: f64) -> bool {
    (got - want).abs() <= want.abs() * rel + abs
}

proptest! {
    #[test]
    fn parsers_never_panic_on_any_string(s in any::<String>()) {
        all_parsers(&s);
    }

    #[test]
    fn parsers_never_panic_on_unit_like_text(s in unitish()) {
        all_parsers(&s);
    }

    #[test]
    fn errors_say_what_was_typed(s in unitish()) {
        if let Err(e) = parse_size_fractional(&s) {
            let shown = format!("{s:?}");
            prop_assert!(e.to_string().contains(&shown));
        }
        if let Err(e) = parse_size(&s) {
            let shown = format!("`{s}`");
            prop_assert!(e.to_string().contains(&shown));
        }
    }

    #[test]
    fn size_flag_round_trips(n in any::<u64>()) {
        prop_assert_eq!(parse_size(&size_flag(n)).unwrap(), n);
    }

    #[test]
    fn size_flag_round_trips_through_the_bench_parser(n in 1u64..(1 << 53)) {
        prop_assert_eq!(parse_size_fractional(&size_flag(n)).unwrap(), n);
    }

    #[test]
    fn size_label_round_trips(n in 1u64..(1 << 53)) {
        prop_assert_eq!(parse_size_fractional(&size_label(n)).unwrap(), n);
    }

    #[test]
    fn size_label_of_whole_units_round_trips(k in 1u64..(1 << 20), unit in prop::sample::select(vec![1, KIB, MIB, GIB])) {
        prop_assert_eq!(parse_size_fractional(&size_label(k * unit)).unwrap(), k * unit);
    }

    #[test]
    fn rate_label_round_trips(r in 1u64..1_000_000_000_000_000) {
        prop_assert_eq!(parse_rate_tc(&rate_label(Some(r))).unwrap(), Some(r));
    }

    #[test]
    fn whole_format_bytes_round_trip(k in 1u64..1024, unit in prop::sample::select(vec![1, KIB, MIB, GIB])) {
        prop_assert_eq!(parse_bytes_tc(&format_bytes(k * unit)).unwrap(), k * unit);
    }

    #[test]
    fn format_bytes_reads_back_within_its_rounding(n in 0u64..(1 << 50)) {
        let back = parse_bytes_tc(&format_bytes(n)).unwrap();
        // One decimal of a unit ≥ 1: at most 5% off.
        prop_assert!(near(back as f64, n as f64, 0.05, 0.0), "{n} → {} → {back}", format_bytes(n));
    }

    #[test]
    fn format_bytes_2dp_reads_back_within_its_rounding(n in 0u64..TIB) {
        let back = parse_bytes_tc(&format_bytes_2dp(n)).unwrap();
        prop_assert!(near(back as f64, n as f64, 0.005, 0.0), "{n} → {} → {back}", format_bytes_2dp(n));
    }

    #[test]
    fn format_secs_reads_back_within_its_rounding(s in 1e-8f64..1e6) {
        let back = parse_duration_tc(&format_secs(s)).unwrap().as_secs_f64();
        prop_assert!(near(back, s, 0.05, 1e-9), "{s} → {} → {back}", format_secs(s));
    }

    #[test]
    fn format_ms_reads_back(v in 0f64..1e9) {
        let back = parse_duration_tc(&format_ms(v)).unwrap().as_secs_f64() * 1e3;
        prop_assert!(near(back, v, 1e-9, 1e-6), "{v} → {} → {back}", format_ms(v));
    }

    #[test]
    fn format_ms_brief_reads_back_within_its_rounding(v in 1e-2f64..1e9) {
        let back = parse_duration_tc(&format_ms_brief(v)).unwrap().as_secs_f64() * 1e3;
        prop_assert!(near(back, v, 0.05, 1e-6), "{v} → {} → {back}", format_ms_brief(v));
    }

    #[test]
    fn cli_durations_are_exact(n in 0u64..(u64::MAX / 86_400), unit in prop::sample::select(vec![("ms", 0), ("s", 1), ("m", 60), ("h", 3600), ("d", 86_400)])) {
        let d = parse_duration(&format!("{n}{}", unit.0)).unwrap();
        let want = if unit.1 == 0 { Duration::from_millis(n) } else { Duration::from_secs(n * unit.1) };
        prop_assert_eq!(d, want);
    }

    #[test]
    fn median_matches_a_plain_sort(mut v in prop::collection::vec(-1e12f64..1e12, 0..40)) {
        let mut sorted = v.clone();
        sorted.sort_by(f64::total_cmp);
        let want = match sorted.len() {
            0 => None,
            k if k % 2 == 1 => Some(sorted[k / 2]),
            k => Some((sorted[k / 2 - 1] + sorted[k / 2]) / 2.0),
        };
        prop_assert_eq!(median_of(&v), want);
        prop_assert_eq!(median(&mut v), want);
        prop_assert_eq!(&v, &sorted);
        if let Some(m) = want {
            prop_assert!(sorted[0] <= m && m <= sorted[sorted.len() - 1]);
        }
    }

    #[test]
    fn medians_never_panic(mut v in prop::collection::vec(any::<f64>(), 0..20), q in any::<f64>()) {
        let _ = median_of(&v);
        let _ = median_and_spread(&mut v.clone());
        let _ = upper_median(&mut v.clone());
        let _ = mean(&v);
        let _ = median_or_zero(v.iter().copied());
        let _ = median_of_positive(v.iter().copied());
        let _ = upper_median_by(v.clone(), |x| *x);
        v.sort_by(f64::total_cmp);
        let p = percentile_nearest_rank(&v, q);
        prop_assert_eq!(p.is_none(), v.is_empty());
    }

    #[test]
    fn percentiles_are_samples_in_order(mut v in prop::collection::vec(-1e6f64..1e6, 1..50), q1 in 0f64..1.0, q2 in 0f64..1.0) {
        v.sort_by(f64::total_cmp);
        let (lo, hi) = (q1.min(q2), q1.max(q2));
        let a = percentile_nearest_rank(&v, lo).unwrap();
        let b = percentile_nearest_rank(&v, hi).unwrap();
        prop_assert!(v.contains(&a) && v.contains(&b));
        prop_assert!(a <= b);
    }
}
