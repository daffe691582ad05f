//! The one statistic every measurement in ferry reports: the median of repeated runs, which a
//! single slow run (a scheduler hiccup, a TCP loss) does not move.

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
}
