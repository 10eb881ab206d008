//! The rules on executions (a process's run of an attempt, [`Span`]) against each other and
//! against what the head recorded:
//!
//! - [`attempts_ran_twice`]: each attempt ran in one process. Two processes of one attempt,
//!   at once or one after the other, on one node or two, are a double run that no comparison
//!   of attempts can see.
//! - [`ran_after_success`]: once an execution of a task ran to its end, no execution of it
//!   starts again. One exception, which is at-least-once and no bug: the head recorded that
//!   attempt as lost (its worker was cut off, stopped or killed between the task's end and
//!   its report, so the success never reached the head, which then ran the task again after
//!   the lease). Such reruns are listed by [`runs_after_an_end`] and counted in the run's
//!   table.
//! - [`not_assigned`]: every execution is of a task the head has, of an attempt the head sent
//!   to that node, started after the head sent it, before the head gave that attempt up (sent
//!   the next one) and before it recorded the task's end.
//!
//! The head's times are in milliseconds: an execution is held to have started after one of
//! them only when it did so by a whole millisecond.

use std::collections::BTreeMap;

use super::{Anomaly, Rule, Span, spans};
use crate::nemesis::history::{FinalTask, History, Micros};

/// A microsecond time of the head's, which it records in milliseconds: `t` is after it only
/// from this on.
fn surely_after(head: Micros) -> Micros {
    head + 1_000
}

/// The executions of each task, by start.
fn by_task(h: &History) -> BTreeMap<u64, Vec<Span>> {
    let mut out: BTreeMap<u64, Vec<Span>> = BTreeMap::new();
    for s in spans(h) {
        out.entry(s.task).or_default().push(s);
    }
    for runs in out.values_mut() {
        runs.sort_by_key(|s| (s.start, s.last));
    }
    out
}

/// How `b`, which started no earlier, stands to `a` in time.
fn relation(a: &Span, b: &Span) -> String {
    match a.at_once(b) {
        Some(overlap) => format!("{:.2} s at once", overlap as f64 / 1e6),
        None => format!(
            "one after the other, {:.2} s apart",
            b.start.saturating_sub(a.last) as f64 / 1e6
        ),
    }
}

/// Each attempt ran in one process: every further process of an attempt is an anomaly.
pub fn attempts_ran_twice(h: &History) -> Vec<Anomaly> {
    let mut out = Vec::new();
    for (task, runs) in by_task(h) {
        let mut by_attempt: BTreeMap<u32, Vec<&Span>> = BTreeMap::new();
        for s in &runs {
            by_attempt.entry(s.attempt).or_default().push(s);
        }
        for (attempt, runs) in by_attempt {
            for pair in runs.windows(2) {
                let (a, b) = (pair[0], pair[1]);
                out.push(Anomaly {
                    rule: Rule::AttemptRanTwice,
                    at: b.start,
                    detail: format!(
                        "task {task} attempt {attempt} ran in {} processes: {} and {}: {}",
                        runs.len(),
                        a.describe(),
                        b.describe(),
                        relation(a, b)
                    ),
                });
            }
        }
    }
    out
}

/// An execution of a task that started after another attempt of it ran to its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AfterEnd {
    /// The execution that ran to its end.
    pub ended: Span,
    /// The one that started after that end.
    pub again: Span,
    /// How the head recorded the ended attempt, when it recorded it as ended without success:
    /// its success never reached the head, and the rerun is at-least-once, no anomaly.
    pub lost_as: Option<String>,
}

/// How the head recorded `attempt` when it did not record it as the task's success.
fn lost_as(task: Option<&FinalTask>, attempt: u32) -> Option<String> {
    let t = task?;
    if t.winner() == Some(attempt) {
        return None;
    }
    t.head_attempt(attempt)?.ended.clone()
}

/// Every execution that started after another attempt of its task ran to its end, with the
/// first such end the head did not record as lost, or else the first end.
pub fn runs_after_an_end(h: &History) -> Vec<AfterEnd> {
    let mut out = Vec::new();
    for (task, runs) in by_task(h) {
        for again in &runs {
            let mut ends: Vec<AfterEnd> = runs
                .iter()
                .filter(|e| e.ended && e.attempt != again.attempt && e.last < again.start)
                .map(|e| AfterEnd {
                    ended: *e,
                    again: *again,
                    lost_as: lost_as(h.tasks.get(&task), e.attempt),
                })
                .collect();
            ends.sort_by_key(|r| (r.lost_as.is_some(), r.ended.last));
            out.extend(ends.into_iter().next());
        }
    }
    out
}

/// No execution of a task started after an attempt of it ran to its end, unless the head
/// recorded that attempt as lost.
pub fn ran_after_success(h: &History) -> Vec<Anomaly> {
    let mut out = Vec::new();
    for r in runs_after_an_end(h)
        .into_iter()
        .filter(|r| r.lost_as.is_none())
    {
        let (e, a) = (&r.ended, &r.again);
        let head = match h.tasks.get(&e.task) {
            None => format!("the head has no task {}", e.task),
            Some(t) if t.winner() == Some(e.attempt) => {
                format!(
                    "the head recorded attempt {} as the task's success",
                    e.attempt
                )
            }
            Some(t) => match t.head_attempt(e.attempt) {
                None => format!("the head keeps no record of attempt {}", e.attempt),
                Some(_) => format!(
                    "the head has attempt {} still running (task {})",
                    e.attempt, t.state
                ),
            },
        };
        out.push(Anomaly {
            rule: Rule::RanAfterSuccess,
            at: a.start,
            detail: format!(
                "task {} ran again after an attempt ran to its end: {}; then {}, {:.2} s after \
                 that end; {head}",
                e.task,
                e.describe(),
                a.describe(),
                (a.start - e.last) as f64 / 1e6
            ),
        });
    }
    out
}

/// Why the head never assigned execution `s` of task `t`, if it did not.
fn unassigned(s: &Span, t: &FinalTask) -> Vec<String> {
    let mut why = Vec::new();
    if s.attempt > t.attempt {
        why.push(if t.attempt == 0 {
            format!("the head never started task {} (it is {})", t.id, t.state)
        } else {
            format!(
                "the head's latest attempt of task {} is {} (it is {})",
                t.id, t.attempt, t.state
            )
        });
    }
    if let Some(attempts) = &t.attempts {
        match t.head_attempt(s.attempt) {
            Some(sent) => {
                if sent.node != s.node {
                    why.push(format!(
                        "the head sent attempt {} to node {}, not to node {}",
                        s.attempt, sent.node, s.node
                    ));
                }
                if s.start < sent.sent_at {
                    why.push(format!(
                        "it started before the head sent it at {}",
                        sent.sent_at
                    ));
                }
            }
            None if s.attempt <= t.attempt
                && attempts.first().is_some_and(|a| a.attempt <= s.attempt) =>
            {
                why.push(format!(
                    "the head keeps no record of sending attempt {}",
                    s.attempt
                ));
            }
            None => {}
        }
        if let Some(next) = t.head_attempt(s.attempt + 1)
            && s.start >= surely_after(next.sent_at)
        {
            why.push(format!(
                "it started after the head had given attempt {} up and sent attempt {} to \
                 node {} at {}",
                s.attempt, next.attempt, next.node, next.sent_at
            ));
        }
    }
    if let Some(f) = t.finished_at
        && s.start >= surely_after(f)
    {
        why.push(format!(
            "it started after the head recorded the task {} at {f}",
            t.state
        ));
    }
    why
}

/// Every execution is one the head assigned: of a task it has, of an attempt it sent to that
/// node, started after it sent it and before it gave it up or recorded the task's end.
pub fn not_assigned(h: &History) -> Vec<Anomaly> {
    let mut out = Vec::new();
    for s in spans(h) {
        let why = match h.tasks.get(&s.task) {
            None => vec![format!("the head has no task {}", s.task)],
            Some(t) => unassigned(&s, t),
        };
        if !why.is_empty() {
            out.push(Anomaly {
                rule: Rule::ExecutionNotAssigned,
                at: s.start,
                detail: format!("task {}: {}, but {}", s.task, s.describe(), why.join("; ")),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{clean, exec, exec_by, rules, sample, sent, task};
    use super::super::{check, overlaps};
    use super::*;
    use crate::nemesis::history::{ExecKind, Process};

    /// A second process of attempt 1 of task 1 on `node`, from `start` to `end`.
    fn second_run(h: &mut History, node: u64, start: u64, end: u64) -> Process {
        let p = Process {
            pid: 4242,
            run: 0x5eed << 96,
        };
        h.execs.push(exec_by(p, ExecKind::Start, 1, 1, node, start));
        h.execs.push(exec_by(p, ExecKind::End, 1, 1, node, end));
        p
    }

    #[test]
    fn one_attempt_run_twice_at_once_on_one_node_is_caught() {
        let mut h = clean();
        second_run(&mut h, 1, 200, 450);
        let found = attempts_ran_twice(&h);
        assert_eq!(rules(&found), vec![Rule::AttemptRanTwice]);
        let d = &found[0].detail;
        assert!(d.contains("task 1 attempt 1 ran in 2 processes"), "{d}");
        assert!(d.contains("process 111"), "{d}");
        assert!(
            d.contains("process 4242 (run 00005eed) ran 200..450"),
            "{d}"
        );
        assert!(d.contains("0.00 s at once"), "{d}");
        // Attempts are compared with each other by `overlaps`, runs of one attempt here.
        assert_eq!(overlaps(&h), vec![]);
        assert!(rules(&check(&h)).contains(&Rule::AttemptRanTwice));
        assert_eq!(attempts_ran_twice(&clean()), vec![]);
    }

    #[test]
    fn one_attempt_run_twice_one_after_the_other_is_caught_on_one_node_or_two() {
        let mut h = clean();
        second_run(&mut h, 1, 2_600, 2_900);
        let found = attempts_ran_twice(&h);
        assert_eq!(rules(&found), vec![Rule::AttemptRanTwice]);
        assert!(
            found[0]
                .detail
                .contains("one after the other, 0.00 s apart"),
            "{}",
            found[0].detail
        );
        let mut h = clean();
        second_run(&mut h, 2, 2_600, 2_900);
        assert_eq!(rules(&attempts_ran_twice(&h)), vec![Rule::AttemptRanTwice]);
        // The head sent attempt 1 to node 1 only.
        let found = not_assigned(&h);
        assert_eq!(rules(&found), vec![Rule::ExecutionNotAssigned]);
        assert!(
            found[0]
                .detail
                .contains("the head sent attempt 1 to node 1, not to node 2"),
            "{}",
            found[0].detail
        );
    }

    /// `clean`, then attempt 2 of task 1 run to its end on node 2 at 2,000..3,000.
    fn rerun() -> History {
        let mut h = clean();
        h.execs.push(exec(ExecKind::Start, 1, 2, 2, 2_000));
        h.execs.push(exec(ExecKind::End, 1, 2, 2, 3_000));
        h
    }

    #[test]
    fn a_task_run_again_after_its_success_is_caught() {
        let h = rerun();
        let found = ran_after_success(&h);
        assert_eq!(rules(&found), vec![Rule::RanAfterSuccess]);
        let d = &found[0].detail;
        assert!(d.contains("attempt 1 on node 1 in process 111"), "{d}");
        assert!(d.contains("attempt 2 on node 2 in process 122"), "{d}");
        assert!(d.contains("ran 2000..3000"), "{d}");
        assert!(
            d.contains("the head recorded attempt 1 as the task's success"),
            "{d}"
        );
        // The head has no such attempt either, and it recorded the task's end before it ran.
        let found = not_assigned(&h);
        assert_eq!(rules(&found), vec![Rule::ExecutionNotAssigned]);
        assert!(found[0].detail.contains("latest attempt of task 1 is 1"));
        assert!(
            found[0]
                .detail
                .contains("recorded the task Succeeded at 550")
        );
        // With no record of the task at all, the rerun is still one.
        let mut h = rerun();
        h.tasks.clear();
        assert_eq!(rules(&ran_after_success(&h)), vec![Rule::RanAfterSuccess]);
        assert_eq!(ran_after_success(&clean()), vec![]);
    }

    /// `rerun` as the head recorded it when attempt 1's success never reached it: attempt 1
    /// lost with its node, attempt 2 sent to node 2 at 1,900 and its success recorded at 3,100.
    fn rerun_after_a_lost_report() -> History {
        let mut h = rerun();
        let t = h.tasks.get_mut(&1).unwrap();
        t.attempt = 2;
        t.finished_at = Some(3_100);
        t.attempts = Some(vec![
            sent(1, 1, 50, Some("node 1 lost (its lease expired)")),
            sent(2, 2, 1_900, None),
        ]);
        h.reads[0].attempt = 2;
        h.reads[0].node = Some(2);
        h.reads[0].at = 3_200;
        h.capacity.push(sample(2, 0, 10, 1));
        h
    }

    #[test]
    fn a_rerun_after_an_end_the_head_recorded_as_lost_is_at_least_once_and_listed() {
        let h = rerun_after_a_lost_report();
        assert_eq!(check(&h), vec![]);
        let listed = runs_after_an_end(&h);
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].ended.attempt, 1);
        assert_eq!(listed[0].again.attempt, 2);
        assert_eq!(
            listed[0].lost_as.as_deref(),
            Some("node 1 lost (its lease expired)")
        );
        // The head's winner ran to its end, then the lost attempt's process started: no
        // exception for that one.
        let mut h = rerun_after_a_lost_report();
        let late = Process { pid: 9, run: 9 };
        h.execs.push(exec_by(late, ExecKind::Start, 1, 1, 1, 3_050));
        assert!(rules(&check(&h)).contains(&Rule::RanAfterSuccess));
    }

    #[test]
    fn a_lost_end_does_not_excuse_a_rerun_after_the_winners_end() {
        // Attempt 1 lost, attempt 2 the success, then an attempt 3 after both ends: the lost
        // end comes first, but the success is what the rerun is judged by.
        let mut h = rerun_after_a_lost_report();
        let late = Process { pid: 9, run: 9 };
        h.execs.push(exec_by(late, ExecKind::Start, 1, 3, 3, 3_500));
        let found = ran_after_success(&h);
        assert_eq!(rules(&found), vec![Rule::RanAfterSuccess]);
        assert!(
            found[0]
                .detail
                .contains("the head recorded attempt 2 as the task's success"),
            "{}",
            found[0].detail
        );
    }

    #[test]
    fn an_execution_of_a_task_the_head_does_not_have_is_caught() {
        let mut h = clean();
        h.submits.clear();
        h.reads.clear();
        h.tasks.clear();
        let found = not_assigned(&h);
        assert_eq!(rules(&found), vec![Rule::ExecutionNotAssigned]);
        assert!(
            found[0].detail.contains("the head has no task 1"),
            "{}",
            found[0].detail
        );
        assert_eq!(not_assigned(&clean()), vec![]);
    }

    #[test]
    fn an_execution_of_a_task_the_head_never_started_or_had_failed_is_caught() {
        // Pending with no attempt, yet it ran.
        let mut h = clean();
        h.reads.clear();
        let t = h.tasks.get_mut(&1).unwrap();
        *t = task(1, "nem-1-1", "Pending");
        t.attempt = 0;
        t.attempts = Some(Vec::new());
        let found = not_assigned(&h);
        assert_eq!(rules(&found), vec![Rule::ExecutionNotAssigned]);
        assert!(
            found[0]
                .detail
                .contains("the head never started task 1 (it is Pending)"),
            "{}",
            found[0].detail
        );
        // Failed at 550 (ms precision): an execution from 2,000 on is after it.
        let mut h = clean();
        h.reads.clear();
        h.tasks.get_mut(&1).unwrap().state = "Failed".into();
        let soon = Process { pid: 6, run: 6 };
        h.execs.push(exec_by(soon, ExecKind::Start, 1, 1, 1, 1_400));
        assert_eq!(
            not_assigned(&h),
            vec![],
            "within the millisecond of the head's record"
        );
        let late = Process { pid: 7, run: 7 };
        h.execs.push(exec_by(late, ExecKind::Start, 1, 1, 1, 2_000));
        let found = not_assigned(&h);
        assert_eq!(rules(&found), vec![Rule::ExecutionNotAssigned]);
        assert!(
            found[0]
                .detail
                .contains("it started after the head recorded the task Failed at 550"),
            "{}",
            found[0].detail
        );
    }

    #[test]
    fn an_execution_of_an_attempt_the_head_had_given_up_or_not_yet_sent_is_caught() {
        // Attempt 1's process starts at 3,000 on node 1, after the head gave it up and sent
        // attempt 2 at 1,900.
        let mut h = rerun_after_a_lost_report();
        h.execs.retain(|e| e.attempt != 1);
        h.execs.push(exec(ExecKind::Start, 1, 1, 1, 3_000));
        h.execs.push(exec(ExecKind::Beat, 1, 1, 1, 3_050));
        let found = not_assigned(&h);
        assert_eq!(rules(&found), vec![Rule::ExecutionNotAssigned]);
        assert!(
            found[0].detail.contains(
                "after the head had given attempt 1 up and sent attempt 2 to node 2 at 1900"
            ),
            "{}",
            found[0].detail
        );
        // Attempt 2 starting before the head sent it.
        let mut h = rerun_after_a_lost_report();
        h.tasks.get_mut(&1).unwrap().attempts = Some(vec![
            sent(1, 1, 50, Some("node 1 lost")),
            sent(2, 2, 2_500, None),
        ]);
        let found = not_assigned(&h);
        assert_eq!(rules(&found), vec![Rule::ExecutionNotAssigned]);
        assert!(
            found[0]
                .detail
                .contains("it started before the head sent it at 2500"),
            "{}",
            found[0].detail
        );
    }

    #[test]
    fn a_task_the_retention_dropped_is_checked_by_its_state_alone() {
        let mut h = rerun_after_a_lost_report();
        h.tasks.get_mut(&1).unwrap().attempts = None;
        assert_eq!(not_assigned(&h), vec![]);
        // Its end is still known: a run after it is caught.
        let late = Process { pid: 9, run: 9 };
        h.execs.push(exec_by(late, ExecKind::Start, 1, 2, 2, 4_200));
        assert_eq!(rules(&not_assigned(&h)), vec![Rule::ExecutionNotAssigned]);
    }
}
