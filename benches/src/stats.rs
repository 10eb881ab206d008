//! Summaries of samples: percentiles (nearest rank), mean, min and max.

use std::time::Duration;

use serde::Serialize;

/// The distribution of a set of samples, in the unit they were given in.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    /// How many samples.
    pub count: usize,
    /// The smallest.
    pub min: f64,
    /// The median.
    pub p50: f64,
    /// The 95th percentile.
    pub p95: f64,
    /// The 99th percentile.
    pub p99: f64,
    /// The largest.
    pub max: f64,
    /// The arithmetic mean.
    pub mean: f64,
}

impl Summary {
    /// Summarises `samples` (any order); all zero when there are none.
    pub fn of(samples: &[f64]) -> Summary {
        if samples.is_empty() {
            return Summary {
                count: 0,
                min: 0.0,
                p50: 0.0,
                p95: 0.0,
                p99: 0.0,
                max: 0.0,
                mean: 0.0,
            };
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        Summary {
            count: sorted.len(),
            min: sorted[0],
            p50: percentile(&sorted, 0.50),
            p95: percentile(&sorted, 0.95),
            p99: percentile(&sorted, 0.99),
            max: sorted[sorted.len() - 1],
            mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
        }
    }

    /// Summarises durations in milliseconds.
    pub fn of_ms(samples: &[Duration]) -> Summary {
        let ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        Summary::of(&ms)
    }
}

/// The nearest-rank percentile `p` (0..=1) of sorted, non-empty samples.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The median of samples (any order); 0 when there are none.
pub fn median(samples: &[f64]) -> f64 {
    Summary::of(samples).p50
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let s = Summary::of(&samples);
        assert_eq!((s.count, s.min, s.max), (100, 1.0, 100.0));
        assert_eq!((s.p50, s.p95, s.p99), (50.0, 95.0, 99.0));
        assert_eq!(s.mean, 50.5);
        assert_eq!(Summary::of(&[7.0]).p99, 7.0);
        assert_eq!(Summary::of(&[]).count, 0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
    }
}
