//! The medians of repeated runs, which a single slow run (a scheduler hiccup, a TCP loss) does
//! not move, and the few other summaries the reports print next to them.
//!
//! Ordering is [`f64::total_cmp`] everywhere: a NaN never panics a sort; a positive NaN counts as
//! larger than every number and a negative one as smaller. Empty input gives `None` (or the
//! documented zero of the `_or_zero` variants), never a panic.

/// Median of `values` (sorted in place), the mean of the middle two for an even count; `None`
/// when empty.
pub fn median(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let k = values.len();
    match k {
        0 => None,
        _ if k % 2 == 1 => Some(values[k / 2]),
        _ => Some((values[k / 2 - 1] + values[k / 2]) / 2.0),
    }
}

/// [`median`] of a copy, for callers that keep their runs in the order they were taken.
pub fn median_of(values: &[f64]) -> Option<f64> {
    median(&mut values.to_vec())
}

/// [`median`], with 0 for no values: what a report prints for a quantity it could not measure.
pub fn median_or_zero(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.into_iter().collect();
    median(&mut v).unwrap_or(0.0)
}

/// [`median_or_zero`] of the positive values only, for samples where 0 means "not measured".
pub fn median_of_positive(values: impl IntoIterator<Item = f64>) -> f64 {
    median_or_zero(values.into_iter().filter(|x| *x > 0.0))
}

/// Median of `samples` (sorted in place) and their half-range relative to it, a cheap noise
/// estimate from one measurement: `(0, 0)` when empty, spread 0 when the median is not positive.
pub fn median_and_spread(samples: &mut [f64]) -> (f64, f64) {
    let Some(median) = median(samples) else {
        return (0.0, 0.0);
    };
    let spread = if median > 0.0 {
        (samples[samples.len() - 1] - samples[0]) / (2.0 * median)
    } else {
        0.0
    };
    (median, spread)
}

/// The element at index `len / 2` once sorted (`values` is sorted in place): the median for an
/// odd count, the upper of the middle two for an even one, and always a value that was measured.
/// `None` when empty.
pub fn upper_median(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied()
}

/// The item whose `key` is the [`upper_median`] of all keys, for picking a representative run
/// rather than a number. The sort is stable: among equal keys, the order given decides.
pub fn upper_median_by<T>(mut items: Vec<T>, mut key: impl FnMut(&T) -> f64) -> Option<T> {
    items.sort_by(|a, b| key(a).total_cmp(&key(b)));
    let mid = items.len() / 2;
    (mid < items.len()).then(|| items.swap_remove(mid))
}

/// The nearest-rank `q`-quantile of `sorted` (ascending, as after `sort_by(f64::total_cmp)`):
/// the smallest sample with at least `q` of the samples at or below it, so that it is always a
/// measured value. `q` is clamped to the samples (`q <= 0` gives the first, `q >= 1` the last; a
/// NaN the first). `None` when empty.
///
/// For `q = 0.5` and an even count this is the lower of the middle two, not [`median`].
pub fn percentile_nearest_rank(sorted: &[f64], q: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    // `as usize` saturates: NaN and negatives give 0, huge values usize::MAX.
    let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
    Some(sorted[rank - 1])
}

/// Arithmetic mean; `None` when empty.
pub fn mean(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        None
    } else {
        Some(values.iter().sum::<f64>() / values.len() as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_even_empty() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0]), Some(3.0));
        assert_eq!(median(&mut [5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    /// The bench's report took its medians this way (moved from ferry-bench's report.rs).
    #[test]
    fn median_of_odd_even_empty() {
        assert_eq!(median_of(&[]), None);
        assert_eq!(median_of(&[3.0]), Some(3.0));
        assert_eq!(median_of(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median_of(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    #[test]
    fn median_sorts_in_place_and_median_of_does_not() {
        let mut v = [3.0, 1.0, 2.0];
        assert_eq!(median(&mut v), Some(2.0));
        assert_eq!(v, [1.0, 2.0, 3.0]);
        let v = [3.0, 1.0, 2.0];
        assert_eq!(median_of(&v), Some(2.0));
        assert_eq!(v, [3.0, 1.0, 2.0]);
        assert_eq!(median_of(&[]), None);
        assert_eq!(median_of(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    #[test]
    fn nan_sorts_last_and_never_panics() {
        assert_eq!(median(&mut [f64::NAN, 1.0, 2.0]), Some(2.0));
        assert!(median(&mut [f64::NAN, 1.0]).unwrap().is_nan());
        assert_eq!(median(&mut [-f64::NAN, 1.0, 2.0]), Some(1.0));
        assert_eq!(upper_median(&mut [f64::NAN, 1.0, 2.0]), Some(2.0));
    }

    #[test]
    fn or_zero_and_positive() {
        assert_eq!(median_or_zero([]), 0.0);
        assert_eq!(median_or_zero([4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median_or_zero(vec![7.0]), 7.0);
        assert_eq!(median_of_positive([0.0, -1.0]), 0.0);
        assert_eq!(median_of_positive([0.0, 5.0, 0.0, 1.0, 3.0]), 3.0);
        assert_eq!(median_of_positive([0.0, 2.0, 4.0]), 3.0);
    }

    #[test]
    fn spread_is_half_range_over_median() {
        assert_eq!(median_and_spread(&mut []), (0.0, 0.0));
        assert_eq!(median_and_spread(&mut [110.0, 90.0, 100.0]), (100.0, 0.1));
        assert_eq!(median_and_spread(&mut [0.0, 0.0, 0.0]), (0.0, 0.0));
        assert_eq!(median_and_spread(&mut [-1.0, 0.0, 5.0]), (0.0, 0.0));
        assert_eq!(median_and_spread(&mut [2.0, 4.0]), (3.0, 1.0 / 3.0));
    }

    #[test]
    fn upper_median_is_a_measured_value() {
        assert_eq!(upper_median(&mut []), None);
        assert_eq!(upper_median(&mut [3.0]), Some(3.0));
        assert_eq!(upper_median(&mut [5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(upper_median(&mut [4.0, 1.0, 3.0, 2.0]), Some(3.0));
    }

    #[test]
    fn upper_median_by_picks_the_item_and_keeps_ties_in_order() {
        let runs = vec![("a", 30.0), ("b", 10.0), ("c", 20.0)];
        assert_eq!(upper_median_by(runs, |r| r.1), Some(("c", 20.0)));
        let runs = vec![("a", 1.0), ("b", 1.0), ("c", 1.0), ("d", 1.0)];
        assert_eq!(upper_median_by(runs, |r| r.1), Some(("c", 1.0)));
        assert_eq!(upper_median_by(Vec::<f64>::new(), |x| *x), None);
    }

    #[test]
    fn nearest_rank() {
        let s: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile_nearest_rank(&s, 0.5), Some(50.0));
        assert_eq!(percentile_nearest_rank(&s, 0.99), Some(99.0));
        assert_eq!(percentile_nearest_rank(&s, 1.0), Some(100.0));
        assert_eq!(percentile_nearest_rank(&s, 0.0), Some(1.0));
        assert_eq!(percentile_nearest_rank(&s, -3.0), Some(1.0));
        assert_eq!(percentile_nearest_rank(&s, 7.0), Some(100.0));
        assert_eq!(percentile_nearest_rank(&s, f64::NAN), Some(1.0));
        assert_eq!(percentile_nearest_rank(&[1.0, 2.0], 0.5), Some(1.0));
        assert_eq!(percentile_nearest_rank(&[], 0.5), None);
    }

    #[test]
    fn means() {
        assert_eq!(mean(&[]), None);
        assert_eq!(mean(&[1.0, 2.0, 6.0]), Some(3.0));
    }
}
