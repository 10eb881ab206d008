//! Summaries of samples: percentiles, mean, min and max, from [`statrs`] (its quantile
//! estimator, R-8; a median of an even count is the mean of the middle two).

use std::time::Duration;

use serde::Serialize;
use statrs::statistics::{Data, Max, Median, Min, OrderStatistics, Statistics};

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
        let mut data = Data::new(samples.to_vec());
        Summary {
            count: samples.len(),
            min: data.min(),
            p50: data.median(),
            p95: data.quantile(0.95),
            p99: data.quantile(0.99),
            max: data.max(),
            mean: samples.mean(),
        }
    }

    /// Summarises durations in milliseconds.
    pub fn of_ms(samples: &[Duration]) -> Summary {
        let ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        Summary::of(&ms)
    }
}

/// The median of samples (any order); 0 when there are none.
pub fn median(samples: &[f64]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    Data::new(samples.to_vec()).median()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let samples: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let s = Summary::of(&samples);
        assert_eq!((s.count, s.min, s.max), (100, 1.0, 100.0));
        assert_eq!(s.p50, 50.5);
        assert!((s.p95 - 95.65).abs() < 1e-9, "{}", s.p95);
        assert!((s.p99 - 99.663_333).abs() < 1e-6, "{}", s.p99);
        assert_eq!(s.mean, 50.5);
        assert_eq!(Summary::of(&[7.0]).p99, 7.0);
        assert_eq!(Summary::of(&[]).count, 0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[]), 0.0);
    }
}
