//! [`Countdown`]: the fence supervisor's decision of when to kill, with the time passed in.
//!
//! The supervisor (`supervisor.rs`, a process of its own) kills every task it holds when the
//! worker has said nothing for as long as the worker's last word allowed: `l{ms}` sets the
//! lease (and allows a lease of silence), `h{ms}` is a beat that allows what is left of the
//! lease (never more than a lease), `h` alone a beat before any lease (a lease of silence);
//! any other line restarts the same wait. After a kill it waits a lease again before the next.
//!
//! It reads no clock and does no I/O: the supervisor passes the time since an origin of its own,
//! and the deterministic simulation (`escher-sim`) its simulated time, feeding it the lines the
//! worker's beat writes, so both run this rule.

use std::time::Duration;

/// When the supervisor kills. See the [module documentation](self).
#[derive(Debug, Clone, Default)]
pub struct Countdown {
    /// The lease (`l` line), once the worker has one.
    lease: Option<Duration>,
    /// How long the supervisor waits after the last line before it kills; none: for ever.
    wait: Option<Duration>,
    /// When the last line came (or the last kill was).
    since: Duration,
}

impl Countdown {
    /// A line of the worker's came at `now`.
    pub fn heard(&mut self, line: &str, now: Duration) {
        self.since = now;
        match line.split_at_checked(1) {
            Some(("l", ms)) => {
                self.lease = ms.parse().ok().map(Duration::from_millis);
                self.wait = self.lease;
            }
            Some(("h", "")) => self.wait = self.lease,
            Some(("h", ms)) => {
                // What is left of the worker's lease, never more than a lease of silence.
                let left = ms.parse().ok().map(Duration::from_millis);
                self.wait = match (left, self.lease) {
                    (Some(left), Some(lease)) => Some(left.min(lease)),
                    (left, lease) => left.or(lease),
                };
            }
            _ => {}
        }
    }

    /// How long to wait for the next line from the last one; none: for ever.
    pub fn wait(&self) -> Option<Duration> {
        self.wait
    }

    /// Whether the wait ran out at `now` with no line since: time to kill.
    pub fn due(&self, now: Duration) -> bool {
        self.wait
            .is_some_and(|wait| now.saturating_sub(self.since) >= wait)
    }

    /// The supervisor killed at `now`: the next kill waits a lease of silence (a process group
    /// that starts meanwhile is held, not killed at once).
    pub fn killed(&mut self, now: Duration) {
        self.since = now;
        self.wait = self.lease;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn no_lease_waits_for_ever_and_a_lease_allows_a_lease_of_silence() {
        let mut c = Countdown::default();
        c.heard("+42", ms(0));
        c.heard("h", ms(10));
        assert!(!c.due(ms(1_000_000)));
        c.heard("l1000", ms(100));
        assert!(!c.due(ms(1_099)));
        assert!(c.due(ms(1_100)));
    }

    #[test]
    fn a_beat_allows_what_is_left_of_the_lease_never_more_than_a_lease() {
        let mut c = Countdown::default();
        c.heard("l1000", ms(0));
        c.heard("h300", ms(500));
        assert!(!c.due(ms(799)));
        assert!(c.due(ms(800)));
        c.heard("h5000", ms(800));
        assert!(!c.due(ms(1_799)));
        assert!(c.due(ms(1_800)));
        // Any line restarts the wait the last beat allowed.
        c.heard("h0", ms(2_000));
        assert!(c.due(ms(2_000)));
        c.heard("-42", ms(2_000));
        assert!(c.due(ms(2_000)));
    }

    #[test]
    fn after_a_kill_the_next_waits_a_lease() {
        let mut c = Countdown::default();
        c.heard("l1000", ms(0));
        c.heard("h100", ms(0));
        assert!(c.due(ms(100)));
        c.killed(ms(100));
        assert!(!c.due(ms(1_099)));
        assert!(c.due(ms(1_100)));
    }
}
