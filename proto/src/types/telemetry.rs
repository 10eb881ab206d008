//! Task telemetry: what a running task reports of its own progress (memory used, iterations,
//! throughput, requests served on time) for the policies that act on it (MIGM's memory
//! predictor, Cilantro's learners). Samples are measurements, not state: the head that receives
//! them keeps them in memory and nothing replicates them.

use serde::{Deserialize, Serialize};

use super::TaskId;
use super::error::TypeError;

/// The most samples one report may carry.
pub const MAX_SAMPLES_PER_REPORT: usize = 64;
/// The longest key, in bytes.
pub const MAX_TELEMETRY_KEY: usize = 64;
/// The most tasks one telemetry query may name.
pub const MAX_TELEMETRY_TASKS: usize = 1_000;

/// One measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// What was measured (`mem_used_gb`, `iteration`, `served_on_time`).
    pub key: String,
    /// Its value.
    pub value: f64,
    /// When the head received it, ms since the Unix epoch (0 until then).
    pub at_ms: u64,
}

impl Sample {
    /// A sample of `key`, checked: a key of letters, digits, `.`, `_` and `-` (at most 64
    /// bytes), a finite value.
    pub fn new(key: &str, value: f64) -> Result<Sample, TypeError> {
        check_key(key)?;
        if !value.is_finite() {
            return Err(TypeError::Invalid {
                what: "telemetry value",
                value: format!("{key}={value}"),
                why: "a sample's value must be a finite number",
            });
        }
        Ok(Sample {
            key: key.to_string(),
            value,
            at_ms: 0,
        })
    }
}

fn check_key(key: &str) -> Result<(), TypeError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if key.is_empty() || key.len() > MAX_TELEMETRY_KEY || !key.chars().all(ok_char) {
        return Err(TypeError::Invalid {
            what: "telemetry key",
            value: key.chars().take(80).collect(),
            why: "use 1 to 64 letters, digits, '.', '_' or '-'",
        });
    }
    Ok(())
}

/// The samples one task reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskTelemetry {
    /// The task.
    pub task: TaskId,
    /// The attempt that reported them.
    pub attempt: u32,
    /// Oldest first.
    pub samples: Vec<Sample>,
}

impl TaskTelemetry {
    /// The latest value of `key`, if reported.
    pub fn latest(&self, key: &str) -> Option<f64> {
        self.samples
            .iter()
            .rev()
            .find(|s| s.key == key)
            .map(|s| s.value)
    }

    /// Every value of `key`, oldest first.
    pub fn series(&self, key: &str) -> Vec<f64> {
        self.samples
            .iter()
            .filter(|s| s.key == key)
            .map(|s| s.value)
            .collect()
    }
}
