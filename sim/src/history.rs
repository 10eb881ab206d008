//! [`History`]: what the simulated workers ran, what the head assigned, and the rules that
//! judge it at the end of a run (the same rules as the end-to-end nemesis checker's, over the
//! simulation's own records).
//!
//! Each [`Execution`] is one process a worker started for one attempt of a task: its node, the
//! worker process (worker and boot) that started it and a number of its own (its process
//! identity), and when it started and ended in simulated time. The rules:
//!
//! - **an attempt ran twice**: two executions of the same attempt of a task, at once or one
//!   after the other (a worker must run an attempt once, whatever the head sends again);
//! - **a task ran twice at once**: two executions of one task, of any attempts, on any nodes,
//!   overlapping in time (the fence and the lease exist to prevent it);
//! - **not assigned**: an execution of an attempt on a node that no applied entry assigned
//!   there;
//! - **ran after it succeeded**: an execution of a task that started after the head
//!   committed another attempt's success (a committed success is final);
//! - **over capacity**: more executions at once on a node than it has CPUs (each task takes
//!   one);
//! - **lost**: a task whose submission was acknowledged that did not end (succeeded, or failed
//!   with a reason) by the end of the quiet end and is not under way then (running its
//!   attempt, or ended it or was assigned it so recently that the report or the assignment may
//!   be on the way, or waiting while the nodes are busy), or that the head says succeeded with no
//!   execution of that attempt having ended well.

use std::collections::BTreeMap;

use escher_proto::types::{NodeId, TaskId, TaskState, TaskStatus};

/// An attempt that ended this little before the end of the history may still have its report
/// on the way: its task is not lost for being `Running` at the end.
pub const REPORT_GRACE_MS: u64 = 2_000;

/// One process a worker ran for one attempt. See the [module documentation](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execution {
    /// The node it ran on.
    pub node: NodeId,
    /// Its process identity: the worker, that worker's boot, and a number unique in the run.
    pub process: (usize, u64, u64),
    /// The task.
    pub task: TaskId,
    /// The attempt.
    pub attempt: u32,
    /// When it started (simulated milliseconds).
    pub start: u64,
    /// When it ended; `None` while it runs.
    pub end: Option<u64>,
    /// Whether it ended well (exited 0; not killed).
    pub succeeded: bool,
}

/// What workers ran and what the head assigned. See the [module documentation](self).
#[derive(Debug, Default)]
pub struct History {
    /// Every execution, in the order they started.
    pub executions: Vec<Execution>,
    /// Every (task, attempt, node) an applied entry assigned, on any replica, and when it was
    /// first applied.
    pub assigned: BTreeMap<(TaskId, u32, NodeId), u64>,
}

impl History {
    /// Records a new execution; returns its index.
    pub fn started(&mut self, execution: Execution) -> usize {
        self.executions.push(execution);
        self.executions.len() - 1
    }

    /// Execution `index` ended at `now` (a second end changes nothing).
    pub fn ended(&mut self, index: usize, now: u64, succeeded: bool) {
        if let Some(e) = self.executions.get_mut(index)
            && e.end.is_none()
        {
            e.end = Some(now);
            e.succeeded = succeeded;
        }
    }

    /// Judges the history. `end` is the run's last moment (an execution still running ends
    /// there); `cpus` what each node has; `statuses` the final state's status of every task
    /// whose submission a client was told of, with its name.
    pub fn check(
        &self,
        end: u64,
        cpus: usize,
        acknowledged: &[(String, TaskId, Option<TaskStatus>)],
    ) -> Vec<String> {
        let mut violations = Vec::new();
        let mut by_task: BTreeMap<TaskId, Vec<&Execution>> = BTreeMap::new();
        for e in &self.executions {
            by_task.entry(e.task).or_default().push(e);
        }
        for (task, runs) in &by_task {
            for (i, a) in runs.iter().enumerate() {
                for b in &runs[i + 1..] {
                    if a.attempt == b.attempt {
                        violations.push(format!(
                            "attempt {} of task {} ran twice: process {:?} on node {} at {} \
                             and process {:?} on node {} at {}",
                            a.attempt,
                            task.0,
                            a.process,
                            a.node.0,
                            a.start,
                            b.process,
                            b.node.0,
                            b.start
                        ));
                    }
                    let (a_end, b_end) = (a.end.unwrap_or(end), b.end.unwrap_or(end));
                    if a.start < b_end && b.start < a_end {
                        violations.push(format!(
                            "task {} ran twice at once: attempt {} on node {} ({}..{}) and \
                             attempt {} on node {} ({}..{})",
                            task.0,
                            a.attempt,
                            a.node.0,
                            a.start,
                            a_end,
                            b.attempt,
                            b.node.0,
                            b.start,
                            b_end
                        ));
                    }
                }
            }
        }
        for e in &self.executions {
            if !self.assigned.contains_key(&(e.task, e.attempt, e.node)) {
                violations.push(format!(
                    "node {} ran attempt {} of task {}, which no applied entry assigned there",
                    e.node.0, e.attempt, e.task.0
                ));
            }
        }
        violations.extend(self.capacity(end, cpus));
        for (name, id, status) in acknowledged {
            let runs = by_task.get(id).map(Vec::as_slice).unwrap_or_default();
            let Some(status) = status else {
                violations.push(format!(
                    "acknowledged task {name} (id {}) has no status at the end",
                    id.0
                ));
                continue;
            };
            // Still under way at the end is not lost: a task whose attempt runs, or a task
            // waiting while the nodes are busy (the quiet end may be too short for the backlog).
            let running = runs.iter().any(|e| {
                e.attempt == status.attempt && e.end.is_none_or(|at| at + REPORT_GRACE_MS >= end)
            });
            // Or assigned so recently that the assignment may be on its way.
            let sent = status.node.is_some_and(|node| {
                self.assigned
                    .get(&(*id, status.attempt, node))
                    .is_some_and(|at| at + REPORT_GRACE_MS >= end)
            });
            let busy = self.executions.iter().any(|e| e.end.is_none());
            let under_way = match status.state {
                TaskState::Running => running || sent,
                TaskState::Pending => busy,
                _ => false,
            };
            match status.state {
                TaskState::Pending | TaskState::Running if under_way => {}
                TaskState::Pending | TaskState::Running => violations.push(format!(
                    "acknowledged task {name} (id {}) never ended: {:?} at the end (attempt \
                     {}, node {:?}, {} executions)",
                    id.0,
                    status.state,
                    status.attempt,
                    status.node,
                    runs.len()
                )),
                TaskState::Succeeded => {
                    let ran = runs
                        .iter()
                        .any(|e| e.attempt == status.attempt && e.succeeded);
                    if !ran && !status.evicted {
                        violations.push(format!(
                            "task {name} (id {}) succeeded at attempt {} but no execution of \
                             it ended well",
                            id.0, status.attempt
                        ));
                    }
                    if let Some(at) = status.finished_at_ms {
                        for e in runs {
                            if e.attempt != status.attempt && e.start > at {
                                violations.push(format!(
                                    "task {name} (id {}) ran again (attempt {} on node {} at \
                                     {}) after attempt {} succeeded at {at}",
                                    id.0, e.attempt, e.node.0, e.start, status.attempt
                                ));
                            }
                        }
                    }
                }
                TaskState::Failed | TaskState::Cancelled => {}
            }
        }
        violations
    }

    /// More executions at once on one node than it has CPUs.
    fn capacity(&self, end: u64, cpus: usize) -> Vec<String> {
        // (time, +1 start / -1 end) per node; ends sort before starts at the same moment.
        let mut moments: BTreeMap<NodeId, Vec<(u64, i32)>> = BTreeMap::new();
        for e in &self.executions {
            let m = moments.entry(e.node).or_default();
            m.push((e.start, 1));
            m.push((e.end.unwrap_or(end), -1));
        }
        let mut violations = Vec::new();
        for (node, mut m) in moments {
            m.sort();
            let mut now = 0i32;
            for (at, step) in m {
                now += step;
                if now > cpus as i32 {
                    violations.push(format!(
                        "node {} ran {now} tasks at once at {at}, with {cpus} CPUs",
                        node.0
                    ));
                    break;
                }
            }
        }
        violations
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(task: u64, attempt: u32, node: u64, n: u64, start: u64, end: u64) -> Execution {
        Execution {
            node: NodeId(node),
            process: (node as usize, 1, n),
            task: TaskId(task),
            attempt,
            start,
            end: Some(end),
            succeeded: true,
        }
    }

    fn history(runs: Vec<Execution>) -> History {
        let assigned = runs
            .iter()
            .map(|e| ((e.task, e.attempt, e.node), e.start))
            .collect();
        History {
            executions: runs,
            assigned,
        }
    }

    fn done(id: u64, attempt: u32, at: u64) -> (String, TaskId, Option<TaskStatus>) {
        let status = TaskStatus {
            id: TaskId(id),
            state: TaskState::Succeeded,
            node: None,
            attempt,
            reason: None,
            result: None,
            evicted: false,
            finished_at_ms: Some(at),
            hook_errors: Vec::new(),
        };
        (format!("t{id}"), TaskId(id), Some(status))
    }

    #[test]
    fn a_clean_history_passes() {
        let h = history(vec![run(1, 1, 1, 1, 0, 10), run(1, 2, 2, 2, 20, 30)]);
        assert_eq!(h.check(100, 4, &[done(1, 2, 31)]), Vec::<String>::new());
    }

    #[test]
    fn an_attempt_run_twice_one_after_the_other_is_seen() {
        let h = history(vec![run(1, 1, 1, 1, 0, 10), run(1, 1, 1, 2, 20, 30)]);
        let v = h.check(100, 4, &[]);
        assert!(v.iter().any(|v| v.contains("ran twice:")), "{v:?}");
    }

    #[test]
    fn two_attempts_at_once_are_seen() {
        let h = history(vec![run(1, 1, 1, 1, 0, 10), run(1, 2, 2, 2, 5, 30)]);
        let v = h.check(100, 4, &[]);
        assert!(v.iter().any(|v| v.contains("ran twice at once")), "{v:?}");
    }

    #[test]
    fn an_execution_still_running_at_the_end_overlaps_what_starts_later() {
        let mut first = run(1, 1, 1, 1, 0, 0);
        first.end = None;
        let h = history(vec![first, run(1, 2, 2, 2, 50, 60)]);
        let v = h.check(100, 4, &[]);
        assert!(v.iter().any(|v| v.contains("ran twice at once")), "{v:?}");
    }

    #[test]
    fn an_execution_nothing_assigned_is_seen() {
        let mut h = history(vec![run(1, 1, 1, 1, 0, 10)]);
        h.assigned.clear();
        h.assigned.insert((TaskId(1), 1, NodeId(2)), 0);
        let v = h.check(100, 4, &[]);
        assert!(v.iter().any(|v| v.contains("no applied entry")), "{v:?}");
    }

    #[test]
    fn a_run_after_a_committed_success_is_seen() {
        let h = history(vec![run(1, 1, 1, 1, 0, 10), run(1, 2, 2, 2, 20, 30)]);
        let v = h.check(100, 4, &[done(1, 1, 11)]);
        assert!(v.iter().any(|v| v.contains("ran again")), "{v:?}");
    }

    #[test]
    fn more_tasks_at_once_than_cpus_is_seen() {
        let runs = (1..=3).map(|t| run(t, 1, 1, t, t, 50)).collect();
        let h = history(runs);
        assert!(h.check(100, 3, &[]).is_empty());
        let v = h.check(100, 2, &[]);
        assert!(v.iter().any(|v| v.contains("3 tasks at once")), "{v:?}");
    }

    #[test]
    fn an_acknowledged_task_that_never_ended_or_never_ran_is_lost() {
        let h = history(vec![]);
        let (name, id, status) = done(1, 1, 10);
        let mut running = status.clone().unwrap();
        running.state = TaskState::Running;
        let v = h.check(
            100,
            4,
            &[
                (name.clone(), id, status),
                (name.clone(), TaskId(2), Some(running)),
                (name, TaskId(3), None),
            ],
        );
        assert!(
            v.iter()
                .any(|v| v.contains("no execution of it ended well")),
            "{v:?}"
        );
        assert!(v.iter().any(|v| v.contains("never ended")), "{v:?}");
        assert!(v.iter().any(|v| v.contains("no status")), "{v:?}");
    }
}
