//! [`SpawnLatency`]: how long this worker takes from an assignment's arrival to the task's
//! start (a command's process spawned, a function's handler called), counted into fixed
//! buckets and sent with every heartbeat, from which the head exports the Prometheus histogram
//! `escher_worker_spawn_seconds{node}`.
//!
//! The counts are cumulative since the worker started (what a Prometheus histogram is), so a
//! heartbeat lost or a head replaced loses nothing: the next one carries every count.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use escher_proto::types::Metric;

/// The buckets' upper bounds in seconds: 100 µs to about 3.3 s, doubling.
const BOUNDS: [f64; 16] = [
    0.0001, 0.0002, 0.0004, 0.0008, 0.0016, 0.0032, 0.0064, 0.0128, 0.0256, 0.0512, 0.1024, 0.2048,
    0.4096, 0.8192, 1.6384, 3.2768,
];

/// The name prefix of the heartbeat figures.
pub(crate) const PREFIX: &str = "spawn_seconds";

/// Spawn latencies counted so far. See the [module documentation](self).
#[derive(Debug, Default)]
pub(crate) struct SpawnLatency {
    /// Per bucket (not cumulative); the last one is +Inf.
    counts: [AtomicU64; BOUNDS.len() + 1],
    /// The sum of every latency, in nanoseconds.
    sum_nanos: AtomicU64,
}

impl SpawnLatency {
    /// One task started `latency` after its assignment arrived.
    pub(crate) fn observe(&self, latency: Duration) {
        let seconds = latency.as_secs_f64();
        let bucket = BOUNDS
            .iter()
            .position(|le| seconds <= *le)
            .unwrap_or(BOUNDS.len());
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The figures for a heartbeat: `spawn_seconds.sum`, and `spawn_seconds.bucket.LE` for each
    /// bucket (its own count, not cumulative; `LE` is `+Inf` for the last).
    pub(crate) fn metrics(&self) -> Vec<Metric> {
        let mut out = Vec::with_capacity(BOUNDS.len() + 2);
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        out.push(Metric {
            name: format!("{PREFIX}.sum"),
            value: sum,
        });
        let bounds = BOUNDS.iter().map(|le| le.to_string());
        for (le, count) in bounds
            .chain(std::iter::once("+Inf".to_string()))
            .zip(&self.counts)
        {
            out.push(Metric {
                name: format!("{PREFIX}.bucket.{le}"),
                value: count.load(Ordering::Relaxed) as f64,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_fall_into_their_buckets_and_the_sum_adds_up() {
        let s = SpawnLatency::default();
        s.observe(Duration::from_micros(50));
        s.observe(Duration::from_micros(150));
        s.observe(Duration::from_millis(2));
        s.observe(Duration::from_secs(10));
        let m = s.metrics();
        let value = |name: &str| m.iter().find(|m| m.name == name).unwrap().value;
        assert_eq!(value("spawn_seconds.bucket.0.0001"), 1.0);
        assert_eq!(value("spawn_seconds.bucket.0.0002"), 1.0);
        assert_eq!(value("spawn_seconds.bucket.0.0032"), 1.0);
        assert_eq!(value("spawn_seconds.bucket.+Inf"), 1.0);
        assert_eq!(value("spawn_seconds.bucket.0.0004"), 0.0);
        assert!((value("spawn_seconds.sum") - 10.0022).abs() < 1e-9);
        assert_eq!(m.len(), BOUNDS.len() + 2);
    }
}
