//! [`Backoff`]: how long to wait before the next attempt to reach the head.
//!
//! Delays start at `initial` and double up to `max`; each is jittered to between half and all
//! of its nominal value, so that the workers of a cluster whose head restarted do not all
//! knock at the same instant. The delays are [`backon`]'s; its jitter is seeded, so a test that
//! fixes the seed gets fixed delays.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// Exponential back-off with jitter.
#[derive(Debug)]
pub(crate) struct Backoff {
    builder: ExponentialBuilder,
    delays: ExponentialBackoff,
    max: Duration,
    /// Seeds the jitter of each run of delays (a new one after every reset).
    seeds: fastrand::Rng,
}

impl Backoff {
    /// Delays from `initial` doubling to `max`, jittered by a generator seeded with `seed`.
    pub(crate) fn new(initial: Duration, max: Duration, seed: u64) -> Backoff {
        let initial = initial.max(Duration::from_millis(1));
        let max = max.max(initial);
        // backon's jitter adds up to the delay again: half of each nominal delay, doubling to
        // half of `max`, plus up to as much again is between half and all of the nominal one.
        let builder = ExponentialBuilder::default()
            .with_min_delay(initial / 2)
            .with_max_delay(max / 2)
            .without_max_times()
            .with_jitter();
        let mut seeds = fastrand::Rng::with_seed(seed);
        Backoff {
            builder,
            delays: builder.with_jitter_seed(seeds.u64(..)).build(),
            max,
            seeds,
        }
    }

    /// The delay before the next attempt.
    pub(crate) fn next_delay(&mut self) -> Duration {
        self.delays.next().unwrap_or(self.max)
    }

    /// Starts again from `initial`, after a success.
    pub(crate) fn reset(&mut self) {
        self.delays = self.builder.with_jitter_seed(self.seeds.u64(..)).build();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_with_jitter() {
        let ms = Duration::from_millis;
        for seed in 0..100 {
            let mut b = Backoff::new(ms(50), ms(2000), seed);
            let mut nominal = ms(50);
            for _ in 0..10 {
                let d = b.next_delay();
                assert!(d >= nominal / 2 && d <= nominal, "{d:?} vs {nominal:?}");
                nominal = (nominal * 2).min(ms(2000));
            }
            b.reset();
            let d = b.next_delay();
            assert!(d >= ms(25) && d <= ms(50), "{d:?} after a reset");
        }
    }

    #[test]
    fn same_seed_same_delays() {
        let ms = Duration::from_millis;
        let mut a = Backoff::new(ms(50), ms(2000), 42);
        let mut b = Backoff::new(ms(50), ms(2000), 42);
        for _ in 0..5 {
            assert_eq!(a.next_delay(), b.next_delay());
        }
    }
}
