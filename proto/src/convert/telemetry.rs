//! Conversions of task telemetry: samples, one task's samples, and the two calls' lists.

use super::{ConvertError, check_count};
use crate::types::{MAX_SAMPLES_PER_REPORT, MAX_TELEMETRY_TASKS, Sample, TaskId, TaskTelemetry};
use crate::wire;

impl From<Sample> for wire::TelemetrySample {
    fn from(s: Sample) -> Self {
        wire::TelemetrySample {
            key: s.key,
            value: s.value,
            at_ms: s.at_ms,
        }
    }
}

impl TryFrom<wire::TelemetrySample> for Sample {
    type Error = ConvertError;
    fn try_from(w: wire::TelemetrySample) -> Result<Self, ConvertError> {
        let mut s = Sample::new(&w.key, w.value)?;
        s.at_ms = w.at_ms;
        Ok(s)
    }
}

fn samples(field: &str, w: Vec<wire::TelemetrySample>) -> Result<Vec<Sample>, ConvertError> {
    w.into_iter()
        .enumerate()
        .map(|(i, s)| Sample::try_from(s).map_err(|e| e.within(&format!("{field}[{i}]"))))
        .collect()
}

/// The samples of a `ReportTelemetry` call, checked (at most [`MAX_SAMPLES_PER_REPORT`]).
pub fn report_samples(w: wire::ReportTelemetryRequest) -> Result<Vec<Sample>, ConvertError> {
    check_count("samples", w.samples.len(), MAX_SAMPLES_PER_REPORT)?;
    samples("samples", w.samples)
}

/// The tasks of a `Telemetry` call, checked (at most [`MAX_TELEMETRY_TASKS`]).
pub fn telemetry_tasks(w: &wire::TelemetryRequest) -> Result<Vec<TaskId>, ConvertError> {
    check_count("tasks", w.tasks.len(), MAX_TELEMETRY_TASKS)?;
    Ok(w.tasks.iter().map(|t| TaskId(*t)).collect())
}

impl From<TaskTelemetry> for wire::TaskTelemetry {
    fn from(t: TaskTelemetry) -> Self {
        wire::TaskTelemetry {
            task: t.task.0,
            attempt: t.attempt,
            samples: t.samples.into_iter().map(Into::into).collect(),
        }
    }
}

impl TryFrom<wire::TaskTelemetry> for TaskTelemetry {
    type Error = ConvertError;
    fn try_from(w: wire::TaskTelemetry) -> Result<Self, ConvertError> {
        Ok(TaskTelemetry {
            task: TaskId(w.task),
            attempt: w.attempt,
            samples: samples("samples", w.samples)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_checked_with_their_path() {
        let ok = wire::TelemetrySample {
            key: "mem_used_gb".into(),
            value: 3.5,
            at_ms: 7,
        };
        let s = Sample::try_from(ok.clone()).unwrap();
        assert_eq!((s.key.as_str(), s.value, s.at_ms), ("mem_used_gb", 3.5, 7));
        let bad_key = wire::TelemetrySample {
            key: "mem used".into(),
            ..ok.clone()
        };
        let nan = wire::TelemetrySample {
            value: f64::NAN,
            ..ok.clone()
        };
        let request = wire::ReportTelemetryRequest {
            samples: vec![ok.clone(), bad_key],
        };
        let err = report_samples(request).unwrap_err().to_string();
        assert!(
            err.starts_with("samples[1]") && err.contains("telemetry key"),
            "{err}"
        );
        let err = report_samples(wire::ReportTelemetryRequest { samples: vec![nan] })
            .unwrap_err()
            .to_string();
        assert!(err.contains("finite"), "{err}");
        let many = wire::ReportTelemetryRequest {
            samples: vec![ok; MAX_SAMPLES_PER_REPORT + 1],
        };
        assert!(
            report_samples(many)
                .unwrap_err()
                .to_string()
                .contains("samples")
        );
    }
}
