//! Task telemetry as this replica received it (`ReportTelemetry`, `Telemetry`): what running
//! tasks say of their own progress, for the policies that act on it.
//!
//! Samples are measurements, not state: they are kept in memory by the replica that received
//! them (the leader, since a report is checked against the task's running attempt with a
//! linearizable read), never replicated, and lost when the head restarts or leadership moves.
//! Bounded: the latest [`PER_TASK`] samples of each task, and the [`TASKS`] most recent tasks
//! (by id) that reported. A new attempt's first report replaces the previous attempt's samples.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use escher_proto::types::{Sample, TaskId, TaskTelemetry};

/// Samples kept per task.
pub(crate) const PER_TASK: usize = 256;
/// Tasks kept; the oldest (lowest id) goes first.
pub(crate) const TASKS: usize = 16_384;

#[derive(Debug)]
struct Kept {
    attempt: u32,
    samples: VecDeque<Sample>,
}

/// The samples this replica keeps.
#[derive(Debug, Default)]
pub(crate) struct TelemetryStore {
    tasks: Mutex<BTreeMap<TaskId, Kept>>,
}

impl TelemetryStore {
    /// Keeps `samples` of `task`'s `attempt`, stamped `now_ms`; how many it keeps for the task.
    pub(crate) fn report(
        &self,
        task: TaskId,
        attempt: u32,
        samples: Vec<Sample>,
        now_ms: u64,
    ) -> usize {
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        let kept = tasks.entry(task).or_insert_with(|| Kept {
            attempt,
            samples: VecDeque::new(),
        });
        if attempt > kept.attempt {
            kept.attempt = attempt;
            kept.samples.clear();
        } else if attempt < kept.attempt {
            return kept.samples.len();
        }
        for mut s in samples {
            s.at_ms = now_ms;
            if kept.samples.len() == PER_TASK {
                kept.samples.pop_front();
            }
            kept.samples.push_back(s);
        }
        let n = kept.samples.len();
        while tasks.len() > TASKS {
            tasks.pop_first();
        }
        n
    }

    /// The samples of `tasks` received after `after_ms`, for the tasks that have any.
    pub(crate) fn read(&self, tasks: &[TaskId], after_ms: u64) -> Vec<TaskTelemetry> {
        let kept = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        tasks
            .iter()
            .filter_map(|t| {
                let k = kept.get(t)?;
                let samples: Vec<Sample> = k
                    .samples
                    .iter()
                    .filter(|s| s.at_ms > after_ms)
                    .cloned()
                    .collect();
                (!samples.is_empty()).then_some(TaskTelemetry {
                    task: *t,
                    attempt: k.attempt,
                    samples,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(key: &str, v: f64) -> Sample {
        Sample::new(key, v).unwrap()
    }

    #[test]
    fn keeps_the_latest_samples_of_the_latest_attempt() {
        let store = TelemetryStore::default();
        assert_eq!(
            store.report(TaskId(1), 1, vec![s("a", 1.0), s("a", 2.0)], 10),
            2
        );
        assert_eq!(store.report(TaskId(1), 1, vec![s("a", 3.0)], 20), 3);
        let got = store.read(&[TaskId(1), TaskId(2)], 0);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].series("a"), vec![1.0, 2.0, 3.0]);
        assert_eq!(got[0].latest("a"), Some(3.0));
        assert_eq!(store.read(&[TaskId(1)], 10)[0].series("a"), vec![3.0]);
        // A new attempt starts over; a late report of the old one is dropped.
        store.report(TaskId(1), 2, vec![s("a", 9.0)], 30);
        store.report(TaskId(1), 1, vec![s("a", 4.0)], 40);
        let got = store.read(&[TaskId(1)], 0);
        assert_eq!((got[0].attempt, got[0].series("a")), (2, vec![9.0]));
        // Bounded per task.
        let many: Vec<Sample> = (0..PER_TASK + 10).map(|i| s("b", i as f64)).collect();
        assert_eq!(store.report(TaskId(3), 1, many, 50), PER_TASK);
        assert_eq!(store.read(&[TaskId(3)], 0)[0].samples[0].value, 10.0);
    }
}
