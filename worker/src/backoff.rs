//! [`Backoff`]: how long to wait before the next attempt to reach the head.
//!
//! Delays start at `initial` and double up to `max`; each is jittered to between half and all
//! of its nominal value, so that the workers of a cluster whose head restarted do not all
//! knock at the same instant. The jitter comes from a seeded [`fastrand::Rng`], so a test that
//! fixes the seed gets fixed delays.

use std::time::Duration;

/// Exponential back-off with jitter.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
    rng: fastrand::Rng,
}

impl Backoff {
    /// Delays from `initial` doubling to `max`, jittered by a generator seeded with `seed`.
    pub(crate) fn new(initial: Duration, max: Duration, seed: u64) -> Backoff {
        let initial = initial.max(Duration::from_millis(1));
        Backoff {
            initial,
            max: max.max(initial),
            next: initial,
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    /// The delay before the next attempt.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let nominal = self.next;
        self.next = (self.next * 2).min(self.max);
        // Between half and all of the nominal delay.
        let half = nominal / 2;
        let spread = (nominal - half).as_nanos().max(1) as u64;
        half + Duration::from_nanos(self.rng.u64(..spread))
    }

    /// Starts again from `initial`, after a success.
    pub(crate) fn reset(&mut self) {
        self.next = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_with_jitter() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(50), ms(2000), 7);
        let mut nominal = ms(50);
        for _ in 0..10 {
            let d = b.next_delay();
            assert!(d >= nominal / 2 && d <= nominal, "{d:?} vs {nominal:?}");
            nominal = (nominal * 2).min(ms(2000));
        }
        b.reset();
        assert!(b.next_delay() <= ms(50));
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
