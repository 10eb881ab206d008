//! The performance learner: a binning estimator of a job's performance as a function of its
//! allocation, with confidence bounds (thesis §3.3, §3.6: "tree-based binning estimator",
//! Lipschitz constant, 90% bounds).
//!
//! Observations `(allocation, performance)` fall into bins of `bin_width` units. A bin with
//! `n` observations of mean `m` bounds the performance at its centre (the mean of their
//! allocations) by `m ± z·σ/√n`, where σ
//! is the noise scale (the observations' own spread once a bin has several, never below the
//! prior `noise`). Two facts carry a bin's bound to any allocation `a`: performance does not
//! fall when the allocation grows (every objective the thesis considers is monotone), and it
//! moves by at most `lipschitz` per unit. So a bin centred at `c ≥ a` caps the performance at
//! `a` by its upper bound, one at `c < a` by its upper bound plus `lipschitz·(a − c)`; the
//! upper confidence bound (UCB) is the tightest cap, and the lower one (LCB) the mirror image.
//! With no observation at all the bounds are the performance range itself.

use std::collections::BTreeMap;

/// A job's performance learner.
#[derive(Debug, Clone)]
pub struct Learner {
    bins: BTreeMap<u64, Bin>,
    config: LearnerConfig,
}

/// How a [`Learner`] bins and bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LearnerConfig {
    /// Units of allocation per bin.
    pub bin_width: f64,
    /// The most performance can change per unit of allocation.
    pub lipschitz: f64,
    /// The noise scale assumed before a bin has its own estimate.
    pub noise: f64,
    /// The confidence multiplier (1.645: 90% two-sided for a normal noise).
    pub z: f64,
    /// The range performance lies in.
    pub range: (f64, f64),
}

impl Default for LearnerConfig {
    fn default() -> LearnerConfig {
        LearnerConfig {
            bin_width: 1.0,
            lipschitz: 0.2,
            noise: 0.05,
            z: 1.645,
            range: (0.0, 1.0),
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Bin {
    n: u64,
    /// The sum of the observations' allocations: the bin's centre is their mean.
    at: f64,
    sum: f64,
    sum_sq: f64,
}

impl Bin {
    fn mean(&self) -> f64 {
        self.sum / self.n as f64
    }

    /// Half the confidence interval of the mean.
    fn width(&self, config: &LearnerConfig) -> f64 {
        let n = self.n as f64;
        let var = if self.n > 1 {
            ((self.sum_sq - self.sum * self.sum / n) / (n - 1.0)).max(0.0)
        } else {
            0.0
        };
        config.z * var.sqrt().max(config.noise) / n.sqrt()
    }
}

impl Learner {
    /// A learner with no observation.
    pub fn new(config: LearnerConfig) -> Learner {
        Learner {
            bins: BTreeMap::new(),
            config,
        }
    }

    /// Its configuration.
    pub fn config(&self) -> &LearnerConfig {
        &self.config
    }

    /// Records that the job performed `performance` with `allocation` units.
    pub fn observe(&mut self, allocation: f64, performance: f64) {
        if !allocation.is_finite() || !performance.is_finite() || allocation < 0.0 {
            return;
        }
        let bin = (allocation / self.config.bin_width).floor() as u64;
        let b = self.bins.entry(bin).or_default();
        b.n += 1;
        b.at += allocation;
        b.sum += performance;
        b.sum_sq += performance * performance;
    }

    /// Observations so far.
    pub fn observations(&self) -> u64 {
        self.bins.values().map(|b| b.n).sum()
    }

    /// The upper confidence bound of the performance at `allocation`.
    pub fn ucb(&self, allocation: f64) -> f64 {
        let (lo, hi) = self.config.range;
        let cap = self
            .bins
            .values()
            .map(|b| {
                let c = b.at / b.n as f64;
                let upper = b.mean() + b.width(&self.config);
                if c >= allocation {
                    upper
                } else {
                    upper + self.config.lipschitz * (allocation - c)
                }
            })
            .fold(hi, f64::min);
        cap.clamp(lo, hi)
    }

    /// The lower confidence bound of the performance at `allocation`.
    pub fn lcb(&self, allocation: f64) -> f64 {
        let (lo, hi) = self.config.range;
        let floor = self
            .bins
            .values()
            .map(|b| {
                let c = b.at / b.n as f64;
                let lower = b.mean() - b.width(&self.config);
                if c <= allocation {
                    lower
                } else {
                    lower - self.config.lipschitz * (c - allocation)
                }
            })
            .fold(lo, f64::max);
        floor.clamp(lo, hi)
    }

    /// The mean of the observations in `allocation`'s bin, if any.
    pub fn mean(&self, allocation: f64) -> Option<f64> {
        let bin = (allocation / self.config.bin_width).floor() as u64;
        self.bins.get(&bin).map(Bin::mean)
    }
}
