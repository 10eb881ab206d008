//! [`Backoff`]: how long to wait before the next attempt to reach the head.
//!
//! Delays start at `initial` and double up to `max`; each is jittered to between half and all
//! of its nominal value, so that the workers of a cluster whose head restarted do not all
//! knock at the same instant. The jitter comes from a small seeded generator (xorshift64*),
//! so a test that fixes the seed gets fixed delays.

use std::time::Duration;

/// Exponential back-off with jitter.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
    rng: u64,
}

impl Backoff {
    /// Delays from `initial` doubling to `max`, jittered by a generator seeded with `seed`.
    pub(crate) fn new(initial: Duration, max: Duration, seed: u64) -> Backoff {
        let initial = initial.max(Duration::from_millis(1));
        Backoff {
            initial,
            max: max.max(initial),
            next: initial,
            // xorshift needs a non-zero state.
            rng: seed | 1,
        }
    }

    /// The delay before the next attempt.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let nominal = self.next;
        self.next = (self.next * 2).min(self.max);
        // Between half and all of the nominal delay.
        let half = nominal / 2;
        let spread = (nominal - half).as_nanos().max(1) as u64;
        half + Duration::from_nanos(self.random() % spread)
    }

    /// Starts again from `initial`, after a success.
    pub(crate) fn reset(&mut self) {
        self.next = self.initial;
    }

    fn random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// A seed that differs between processes and between calls.
pub(crate) fn time_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ (u64::from(std::process::id()) << 32)
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
