//! The checker: escher's invariants over a recorded [`History`], each rule a function that
//! returns the anomalies it finds, named and with the tasks and times involved.
//!
//! | rule | what must hold |
//! |---|---|
//! | [`Rule::AckedSubmitMissing`] | every acknowledged submit's task exists, under its key |
//! | [`Rule::FailedSubmitCommitted`] | a submit the client was told failed created no task |
//! | [`Rule::DuplicateTask`] | one key (one submit) created at most one task |
//! | [`Rule::IdReused`] | no id was given to two submits |
//! | [`Rule::TaskNotEnded`] | every task ended, or is pending with a stated reason |
//! | [`Rule::AttemptsOverlap`] | no two attempts of one task ran at the same time |
//! | [`Rule::AttemptRanTwice`] | each attempt ran in one process: never two, at once or one after the other |
//! | [`Rule::RanAfterSuccess`] | no execution of a task started after an attempt of it ran to its end, unless the head recorded that attempt as lost (its success never reached the head) |
//! | [`Rule::ExecutionNotAssigned`] | every execution is of a task the head has, of an attempt it sent to that node, started after the head sent it and before the head gave it up or recorded the task's end |
//! | [`Rule::ResultNotWinner`] | a succeeded task read is the attempt that ran to its end there, and every read of it agrees |
//! | [`Rule::OverCapacity`] | when an execution started, its node ran no more of any resource than the node had then |
//! | [`Rule::CounterNotLinearizable`] | every counter's history is linearizable (no acknowledged write lost, concurrent deltas exact) |
//!
//! An execution is one process's run of an attempt (its records carry the process's identity);
//! the rules on executions against each other and against the head's records are in
//! [`reruns`], the capacity rule in [`capacity`]. Each rule has a test on a hand-made history
//! that breaks it and one that keeps it (`fixtures` builds them): `cargo test --test
//! e2e_nemesis nemesis::checker` runs them all, with no cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::history::{CounterAction, ExecKind, History, Micros, Outcome, Process};
use super::linear::check_counter;

pub mod capacity;
#[cfg(test)]
mod fixtures;
pub mod reruns;

pub use capacity::capacity;
pub use reruns::{attempts_ran_twice, not_assigned, ran_after_success};

/// The rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rule {
    /// An acknowledged submit's task does not exist.
    AckedSubmitMissing,
    /// A submit reported as failed created a task.
    FailedSubmitCommitted,
    /// One submit created several tasks.
    DuplicateTask,
    /// One id answered two submits.
    IdReused,
    /// A task neither ended nor states why it waits.
    TaskNotEnded,
    /// Two attempts of one task ran at once.
    AttemptsOverlap,
    /// One attempt ran in two processes, at once or one after the other.
    AttemptRanTwice,
    /// A task ran again after an attempt of it ran to its end.
    RanAfterSuccess,
    /// An execution the head never assigned: of a task it does not have, of an attempt it did
    /// not send to that node, or started before it sent it, after it gave the attempt up, or
    /// after it recorded the task's end.
    ExecutionNotAssigned,
    /// A result read is not its winning attempt's, or reads disagree.
    ResultNotWinner,
    /// A node ran more than its capacity.
    OverCapacity,
    /// A counter's history is not linearizable.
    CounterNotLinearizable,
}

/// One violation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anomaly {
    /// Which rule.
    pub rule: Rule,
    /// When it happened (or was first seen), for attributing it to a nemesis.
    pub at: Micros,
    /// What, precisely.
    pub detail: String,
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} at {}: {}", self.rule, self.at, self.detail)
    }
}

/// Runs every rule.
pub fn check(h: &History) -> Vec<Anomaly> {
    let mut out = Vec::new();
    out.extend(submits(h));
    out.extend(ends(h));
    out.extend(overlaps(h));
    out.extend(attempts_ran_twice(h));
    out.extend(ran_after_success(h));
    out.extend(not_assigned(h));
    out.extend(results(h));
    out.extend(capacity(h));
    out.extend(counters(h, 0));
    out
}

/// The tasks by key (their name), in id order.
fn tasks_by_key(h: &History) -> BTreeMap<&str, Vec<u64>> {
    let mut by_key: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for t in h.tasks.values() {
        by_key.entry(t.key.as_str()).or_default().push(t.id);
    }
    by_key
}

/// Acknowledged submits exist, failed ones do not, keys and ids are one-to-one.
pub fn submits(h: &History) -> Vec<Anomaly> {
    let mut out = Vec::new();
    let by_key = tasks_by_key(h);
    let mut ids: BTreeMap<u64, &str> = BTreeMap::new();
    let submitted: BTreeSet<&str> = h.submits.iter().map(|s| s.key.as_str()).collect();
    for s in &h.submits {
        let found = by_key.get(s.key.as_str()).cloned().unwrap_or_default();
        match &s.outcome {
            Outcome::Ok(id) => {
                if let Some(other) = ids.insert(*id, &s.key) {
                    out.push(Anomaly {
                        rule: Rule::IdReused,
                        at: s.complete,
                        detail: format!("id {id} answered submits {other} and {}", s.key),
                    });
                }
                let exists = h.tasks.get(id).is_some_and(|t| t.key == s.key);
                if !exists {
                    let now = h.tasks.get(id).map(|t| t.key.as_str());
                    out.push(Anomaly {
                        rule: Rule::AckedSubmitMissing,
                        at: s.complete,
                        detail: format!(
                            "submit {} (client {}) was acknowledged with id {id} at {}, but \
                             the head has {} under that id (tasks with its key: {found:?})",
                            s.key,
                            s.client,
                            s.complete,
                            now.map_or("no task".to_string(), |k| format!("task {k}"))
                        ),
                    });
                }
            }
            Outcome::Fail(why) if !found.is_empty() => out.push(Anomaly {
                rule: Rule::FailedSubmitCommitted,
                at: s.complete,
                detail: format!(
                    "submit {} (client {}, called at {}) was reported failed ({why}) at {}, \
                     but created task(s) {found:?}",
                    s.key, s.client, s.invoke, s.complete
                ),
            }),
            _ => {}
        }
        if found.len() > 1 {
            out.push(Anomaly {
                rule: Rule::DuplicateTask,
                at: s.complete,
                detail: format!("submit {} created {} tasks: {found:?}", s.key, found.len()),
            });
        }
    }
    for (key, found) in &by_key {
        if key.starts_with("nem-") && !submitted.contains(key) {
            out.push(Anomaly {
                rule: Rule::DuplicateTask,
                at: 0,
                detail: format!("tasks {found:?} carry key {key}, which no client submitted"),
            });
        }
    }
    out
}

/// Every task the clients made ended, or is pending with a stated reason.
pub fn ends(h: &History) -> Vec<Anomaly> {
    let ours: BTreeSet<&str> = h.submits.iter().map(|s| s.key.as_str()).collect();
    let mut out = Vec::new();
    for t in h.tasks.values() {
        if !ours.contains(t.key.as_str()) || t.ended() {
            continue;
        }
        let pending_with_reason = t.state == "Pending" && t.reason.is_some();
        if !pending_with_reason {
            let last = h
                .execs
                .iter()
                .filter(|e| e.task == t.id)
                .max_by_key(|e| e.at)
                .map(|e| {
                    format!(
                        "{:?} of attempt {} on node {} by {} at {}",
                        e.kind, e.attempt, e.node, e.process, e.at
                    )
                });
            out.push(Anomaly {
                rule: Rule::TaskNotEnded,
                at: h
                    .execs
                    .iter()
                    .filter(|e| e.task == t.id)
                    .map(|e| e.at)
                    .max()
                    .unwrap_or(0),
                detail: format!(
                    "task {} ({}) is {} ({}) after the run healed; its last execution record: {}",
                    t.id,
                    t.key,
                    t.state,
                    t.reason.as_deref().unwrap_or("no reason given"),
                    last.unwrap_or_else(|| "none".into())
                ),
            });
        }
    }
    out
}

/// One execution: a process's run of an attempt, from its start to its last record, on its
/// node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// The task.
    pub task: u64,
    /// The attempt.
    pub attempt: u32,
    /// The node.
    pub node: u64,
    /// The process.
    pub process: Process,
    /// Its start.
    pub start: Micros,
    /// Its last record (beat or end).
    pub last: Micros,
    /// Whether it recorded its end.
    pub ended: bool,
}

impl Span {
    /// How long `self` and `other` ran at the same time, if they did: their runs share more
    /// than an end point, or one is a single record (killed before it beat) strictly inside
    /// the other's run (0). Back to back, one's last record at the other's start, is not at
    /// once.
    pub fn at_once(&self, other: &Span) -> Option<Micros> {
        let (from, to) = (self.start.max(other.start), self.last.min(other.last));
        let inside = |point: &Span, run: &Span| {
            point.start == point.last && run.start < point.start && point.start < run.last
        };
        if from < to {
            Some(to - from)
        } else if inside(self, other) || inside(other, self) {
            Some(0)
        } else {
            None
        }
    }

    /// The execution in words: which attempt, where, which process, when.
    pub fn describe(&self) -> String {
        let how = if self.ended {
            "to its end"
        } else {
            "with no end recorded"
        };
        format!(
            "attempt {} on node {} in {} ran {}..{} {how}",
            self.attempt, self.node, self.process, self.start, self.last
        )
    }
}

/// Every execution's span, in (task, attempt, node, process) order: one per process that
/// recorded an attempt.
pub fn spans(h: &History) -> Vec<Span> {
    let mut by: BTreeMap<(u64, u32, u64, Process), Span> = BTreeMap::new();
    for e in &h.execs {
        let key = (e.task, e.attempt, e.node, e.process);
        let s = by.entry(key).or_insert(Span {
            task: e.task,
            attempt: e.attempt,
            node: e.node,
            process: e.process,
            start: e.at,
            last: e.at,
            ended: false,
        });
        s.start = s.start.min(e.at);
        s.last = s.last.max(e.at);
        s.ended |= e.kind == ExecKind::End;
    }
    by.into_values().collect()
}

/// No two attempts of one task ran at the same time ([`Span::at_once`]; two runs of one
/// attempt are [`attempts_ran_twice`]'s).
pub fn overlaps(h: &History) -> Vec<Anomaly> {
    let mut by_task: BTreeMap<u64, Vec<Span>> = BTreeMap::new();
    for s in spans(h) {
        by_task.entry(s.task).or_default().push(s);
    }
    let mut out = Vec::new();
    for (task, spans) in by_task {
        for (i, a) in spans.iter().enumerate() {
            for b in spans[i + 1..].iter().filter(|b| b.attempt != a.attempt) {
                if let Some(overlap) = a.at_once(b) {
                    out.push(Anomaly {
                        rule: Rule::AttemptsOverlap,
                        at: a.start.max(b.start),
                        detail: format!(
                            "task {task}: {} and {}: {:.2} s at once",
                            a.describe(),
                            b.describe(),
                            overlap as f64 / 1e6
                        ),
                    });
                }
            }
        }
    }
    out
}

/// A succeeded task read is the attempt that ran to its end, on the node it names; every
/// read of one task agrees.
pub fn results(h: &History) -> Vec<Anomaly> {
    let ended: BTreeSet<(u64, u32, u64)> = h
        .execs
        .iter()
        .filter(|e| e.kind == ExecKind::End)
        .map(|e| (e.task, e.attempt, e.node))
        .collect();
    let mut first: BTreeMap<u64, &super::history::ResultRead> = BTreeMap::new();
    let mut out = Vec::new();
    for r in &h.reads {
        if let Some(f) = first.get(&r.task) {
            if (f.state.as_str(), f.attempt, f.node, &f.result)
                != (r.state.as_str(), r.attempt, r.node, &r.result)
            {
                out.push(Anomaly {
                    rule: Rule::ResultNotWinner,
                    at: r.at,
                    detail: format!(
                        "task {}: read {} of attempt {} on node {:?} ({:?}) at {}, later {} of \
                         attempt {} on node {:?} ({:?}) at {}",
                        r.task,
                        f.state,
                        f.attempt,
                        f.node,
                        f.result,
                        f.at,
                        r.state,
                        r.attempt,
                        r.node,
                        r.result,
                        r.at
                    ),
                });
            }
        } else {
            first.insert(r.task, r);
        }
        if r.state == "Succeeded" {
            let node = r.node.unwrap_or(0);
            if !ended.contains(&(r.task, r.attempt, node)) {
                let ran: Vec<String> = spans(h)
                    .iter()
                    .filter(|s| s.task == r.task)
                    .map(Span::describe)
                    .collect();
                out.push(Anomaly {
                    rule: Rule::ResultNotWinner,
                    at: r.at,
                    detail: format!(
                        "task {} read as succeeded by attempt {} on node {node} at {}, which \
                         never ran to its end there; what ran: {ran:?}",
                        r.task, r.attempt, r.at
                    ),
                });
            }
        }
    }
    out
}

/// How many anomalies one counter may report: after each, the reads that could not be placed
/// are set aside and the rest checked again, so that one bad read does not hide the next.
const MAX_COUNTER_ANOMALIES: usize = 10;

/// Every counter's history is linearizable from `initial`.
pub fn counters(h: &History, initial: i64) -> Vec<Anomaly> {
    let mut by: BTreeMap<&str, Vec<super::history::CounterOp>> = BTreeMap::new();
    for op in &h.counters {
        by.entry(op.counter.as_str()).or_default().push(op.clone());
    }
    let mut out = Vec::new();
    for (name, mut ops) in by {
        for _ in 0..MAX_COUNTER_ANOMALIES {
            let Err(e) = check_counter(&ops, initial) else {
                break;
            };
            let stuck: Vec<String> = e
                .stuck_at
                .iter()
                .map(|(i, v)| {
                    let op = &ops[*i];
                    let what = match (op.action, &op.outcome) {
                        (CounterAction::Read, Outcome::Ok(r)) => format!("read {r}"),
                        (a, _) => format!("{a:?}"),
                    };
                    format!(
                        "client {} {what} at {}..{} with the counter at {v}",
                        op.client, op.invoke, op.complete
                    )
                })
                .collect();
            let ok_adds: i64 = ops
                .iter()
                .filter(|o| o.outcome.is_ok())
                .filter_map(|o| match o.action {
                    CounterAction::Add(d) => Some(d),
                    _ => None,
                })
                .sum();
            out.push(Anomaly {
                rule: Rule::CounterNotLinearizable,
                at: e.stuck_at.first().map_or(0, |(i, _)| ops[*i].invoke),
                detail: format!(
                    "counter {name}: no order of its {} operations explains what was read \
                     (best order placed {} of {}; acknowledged adds sum to {ok_adds}); none of \
                     these could go next: {stuck:?}",
                    ops.len(),
                    e.placed,
                    e.required
                ),
            });
            // Set the unexplained reads aside and look for the next anomaly.
            let unexplained: BTreeSet<usize> = e.stuck_at.iter().map(|(i, _)| *i).collect();
            if unexplained.is_empty() {
                break;
            }
            ops = ops
                .into_iter()
                .enumerate()
                .filter(|(i, _)| !unexplained.contains(i))
                .map(|(_, op)| op)
                .collect();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::history::{CounterOp, ExecKind};
    use super::fixtures::{clean, exec, rules, submit, task};
    use super::*;

    #[test]
    fn a_clean_history_passes_every_rule() {
        assert_eq!(check(&clean()), vec![]);
    }

    #[test]
    fn an_acknowledged_submit_without_its_task_is_caught() {
        let mut h = clean();
        h.tasks.clear();
        h.reads.clear();
        h.execs.clear();
        assert_eq!(rules(&submits(&h)), vec![Rule::AckedSubmitMissing]);
        assert_eq!(submits(&clean()), vec![]);
    }

    #[test]
    fn a_failed_submit_that_created_a_task_is_caught_and_an_unknown_one_is_not() {
        let mut h = clean();
        h.submits.push(submit(
            "nem-1-2",
            Outcome::Fail("connection refused".into()),
        ));
        h.tasks.insert(2, task(2, "nem-1-2", "Succeeded"));
        assert_eq!(rules(&submits(&h)), vec![Rule::FailedSubmitCommitted]);
        h.submits[1].outcome = Outcome::Unknown("timed out".into());
        assert_eq!(submits(&h), vec![]);
    }

    #[test]
    fn a_submit_that_created_two_tasks_is_caught() {
        let mut h = clean();
        h.tasks.insert(2, task(2, "nem-1-1", "Succeeded"));
        assert!(rules(&submits(&h)).contains(&Rule::DuplicateTask));
        let mut h = clean();
        h.tasks.insert(3, task(3, "nem-9-9", "Succeeded"));
        assert_eq!(rules(&submits(&h)), vec![Rule::DuplicateTask]);
    }

    #[test]
    fn one_id_given_to_two_submits_is_caught() {
        let mut h = clean();
        h.submits.push(submit("nem-1-2", Outcome::Ok(1)));
        assert!(rules(&submits(&h)).contains(&Rule::IdReused));
    }

    #[test]
    fn a_task_still_running_after_healing_is_caught_and_a_stated_wait_is_not() {
        let mut h = clean();
        h.tasks.get_mut(&1).unwrap().state = "Running".into();
        let found = ends(&h);
        assert_eq!(rules(&found), vec![Rule::TaskNotEnded]);
        assert!(
            found[0]
                .detail
                .contains("End of attempt 1 on node 1 by process 111 (run 0000006f) at 500"),
            "{}",
            found[0].detail
        );
        let t = h.tasks.get_mut(&1).unwrap();
        t.state = "Pending".into();
        assert_eq!(rules(&ends(&h)), vec![Rule::TaskNotEnded]);
        h.tasks.get_mut(&1).unwrap().reason = Some("no node has gpu=1".into());
        assert_eq!(ends(&h), vec![]);
        assert_eq!(ends(&clean()), vec![]);
    }

    #[test]
    fn two_attempts_running_at_once_are_caught_and_back_to_back_ones_are_not() {
        let mut h = clean();
        // Attempt 2 starts on node 2 while attempt 1 still beats on node 1.
        h.execs.push(exec(ExecKind::Start, 1, 2, 2, 250));
        h.execs.push(exec(ExecKind::End, 1, 2, 2, 700));
        let found = overlaps(&h);
        assert_eq!(rules(&found), vec![Rule::AttemptsOverlap]);
        assert!(found[0].detail.contains("0.00 s") || found[0].detail.contains("task 1"));
        let mut h = clean();
        h.execs.push(exec(ExecKind::Start, 1, 2, 2, 501));
        h.execs.push(exec(ExecKind::End, 1, 2, 2, 900));
        assert_eq!(overlaps(&h), vec![]);
    }

    #[test]
    fn an_attempt_of_one_record_inside_another_attempts_run_is_caught() {
        // Seen in a real run (pause-worker): the stopped worker, continued, started the
        // attempt the head had given up while the next attempt ran elsewhere, and its fence
        // killed it before its first beat. Its span is one instant, inside attempt 2's run.
        let mut h = clean();
        h.execs.push(exec(ExecKind::Start, 1, 2, 2, 200));
        h.execs.push(exec(ExecKind::End, 1, 2, 2, 700));
        h.execs.retain(|e| e.attempt != 1);
        h.execs.push(exec(ExecKind::Start, 1, 1, 1, 400));
        let found = overlaps(&h);
        assert_eq!(rules(&found), vec![Rule::AttemptsOverlap]);
        assert!(
            found[0].detail.contains("0.00 s at once"),
            "{}",
            found[0].detail
        );
        // At either end of the other's run it is back to back, not at once.
        for at in [200, 700] {
            h.execs.retain(|e| e.attempt != 1);
            h.execs.push(exec(ExecKind::Start, 1, 1, 1, at));
            assert_eq!(overlaps(&h), vec![], "a single record at {at}");
        }
    }

    #[test]
    fn a_result_of_an_attempt_that_never_ended_or_reads_that_disagree_are_caught() {
        let mut h = clean();
        h.reads[0].attempt = 2; // attempt 2 never ran
        assert_eq!(rules(&results(&h)), vec![Rule::ResultNotWinner]);
        let mut h = clean();
        h.reads[0].node = Some(2); // attempt 1 ended on node 1, not 2
        let found = results(&h);
        assert_eq!(rules(&found), vec![Rule::ResultNotWinner]);
        let d = &found[0].detail;
        assert!(
            d.contains("attempt 1 on node 1 in process 111 (run 0000006f) ran 100..500 to its end"),
            "{d}"
        );
        let mut h = clean();
        let mut later = h.reads[0].clone();
        later.at = 900;
        later.state = "Failed".into();
        h.reads.push(later);
        assert_eq!(rules(&results(&h)), vec![Rule::ResultNotWinner]);
        assert_eq!(results(&clean()), vec![]);
    }

    fn counter(
        action: CounterAction,
        invoke: u64,
        complete: u64,
        outcome: Outcome<i64>,
    ) -> CounterOp {
        CounterOp {
            client: 1,
            counter: "c".into(),
            action,
            invoke,
            complete,
            outcome,
        }
    }

    #[test]
    fn a_lost_acknowledged_delta_is_caught_and_exact_concurrent_deltas_are_not() {
        let mut h = clean();
        h.counters = vec![
            counter(CounterAction::Set(1), 0, 10, Outcome::Ok(0)),
            counter(CounterAction::Add(2), 20, 40, Outcome::Ok(0)),
            counter(CounterAction::Add(3), 25, 35, Outcome::Ok(0)),
            counter(CounterAction::Read, 50, 60, Outcome::Ok(3)),
        ];
        assert_eq!(rules(&counters(&h, 0)), vec![Rule::CounterNotLinearizable]);
        h.counters[3].outcome = Outcome::Ok(6);
        assert_eq!(counters(&h, 0), vec![]);
        // One bad read does not hide a second one later.
        h.counters
            .push(counter(CounterAction::Read, 70, 80, Outcome::Ok(0)));
        h.counters
            .push(counter(CounterAction::Read, 90, 95, Outcome::Ok(6)));
        h.counters
            .push(counter(CounterAction::Read, 100, 110, Outcome::Ok(99)));
        let found = counters(&h, 0);
        assert_eq!(found.len(), 2, "{found:#?}");
        assert!(found[0].detail.contains("read 0"), "{found:#?}");
        assert!(found[1].detail.contains("read 99"), "{found:#?}");
    }
}
