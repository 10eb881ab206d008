//! The capacity rule: when an execution started, the executions running on its node (it
//! included) held no more of any resource than the node had at that time.
//!
//! What a node had is known from the status reads of the run ([`CapacitySample`]): each says
//! what the head saw at some instant between its call and its return. At an instant `t` the
//! node may have had what the last read returned before `t` said, what a read under way at
//! `t` said, or what the first read called after `t` said; the rule allows the largest of
//! these, so that a change of capacity between two reads never makes an anomaly of its own,
//! and a node no read ever showed had nothing. Only starts are checked: a capacity that shrinks
//! below what running tasks hold lets them run on and admits nothing new until use falls under
//! it (docs/DESIGN.md §3), so a shrink while tasks run is no anomaly, but a start over the
//! smaller capacity is.

use std::collections::{BTreeMap, BTreeSet};

use super::{Anomaly, Rule, Span, spans};
use crate::nemesis::history::{CapacitySample, History, Micros, Outcome};

/// A node's capacity over time, from the status reads that showed it.
struct Timeline<'a> {
    /// The reads, by their return.
    samples: Vec<&'a CapacitySample>,
}

impl<'a> Timeline<'a> {
    fn new(h: &'a History, node: u64) -> Timeline<'a> {
        let mut samples: Vec<&CapacitySample> =
            h.capacity.iter().filter(|s| s.node == node).collect();
        samples.sort_by_key(|s| (s.complete, s.invoke));
        Timeline { samples }
    }

    /// The reads that may tell what the node had at `t`: the last to return before it, those
    /// under way at it, and the first called after it.
    fn around(&self, t: Micros) -> Vec<&'a CapacitySample> {
        let before = self.samples.iter().rev().find(|s| s.complete <= t);
        let during = self
            .samples
            .iter()
            .filter(|s| s.invoke < t && t < s.complete);
        let after = self
            .samples
            .iter()
            .filter(|s| s.invoke >= t)
            .min_by_key(|s| s.invoke);
        before
            .into_iter()
            .chain(during)
            .chain(after)
            .copied()
            .collect()
    }

    /// The most of `resource` the node may have had at `t`, and the reads that say so.
    fn allowance(&self, resource: &str, t: Micros) -> (u64, String) {
        let around = self.around(t);
        let most = around
            .iter()
            .map(|s| s.totals.get(resource).copied().unwrap_or(0))
            .max()
            .unwrap_or(0);
        let seen: Vec<String> = around
            .iter()
            .map(|s| {
                let v = s.totals.get(resource).copied().unwrap_or(0);
                format!("{v} read {}..{}", s.invoke, s.complete)
            })
            .collect();
        let seen = if seen.is_empty() {
            "no status read showed the node".to_string()
        } else {
            seen.join(", ")
        };
        (most, seen)
    }
}

/// What each task requires, by task id: its submit's, found by id or, for a submit whose outcome
/// is not known, by its key.
fn requirements(h: &History) -> BTreeMap<u64, &BTreeMap<String, u64>> {
    h.submits
        .iter()
        .filter_map(|s| {
            let id = match &s.outcome {
                Outcome::Ok(id) => Some(*id),
                _ => h.tasks.values().find(|t| t.key == s.key).map(|t| t.id),
            };
            id.map(|id| (id, &s.requires))
        })
        .collect()
}

/// At each start of an execution, the executions running on its node hold no more of any
/// resource than the node had then: a sweep over the executions' spans.
pub fn capacity(h: &History) -> Vec<Anomaly> {
    let requires = requirements(h);
    let needs = |s: &Span, resource: &str| {
        requires
            .get(&s.task)
            .and_then(|r| r.get(resource))
            .copied()
            .unwrap_or(0)
    };
    let mut by_node: BTreeMap<u64, Vec<Span>> = BTreeMap::new();
    for s in spans(h) {
        by_node.entry(s.node).or_default().push(s);
    }
    let mut out = Vec::new();
    for (node, spans) in by_node {
        let timeline = Timeline::new(h, node);
        // At one instant, spans that end there leave before spans that start there arrive,
        // so back-to-back attempts do not count as running together. A span of one record
        // (an attempt killed before it beat) starts and ends at one instant: it is counted
        // at that instant and then leaves, which needs its end sorted after its start.
        const END: u8 = 0;
        const START: u8 = 1;
        const END_OF_INSTANT: u8 = 2;
        let mut events: Vec<(Micros, u8, usize)> = Vec::new();
        for (i, s) in spans.iter().enumerate() {
            events.push((s.start, START, i));
            let end = if s.last > s.start {
                END
            } else {
                END_OF_INSTANT
            };
            events.push((s.last, end, i));
        }
        events.sort();
        let mut running: BTreeSet<usize> = BTreeSet::new();
        let mut reported: BTreeSet<String> = BTreeSet::new();
        for (at, kind, i) in events {
            if kind != START {
                running.remove(&i);
                continue;
            }
            running.insert(i);
            let resources: BTreeSet<&String> = running
                .iter()
                .filter_map(|j| requires.get(&spans[*j].task))
                .flat_map(|r| r.keys())
                .collect();
            for resource in resources {
                let used: u64 = running.iter().map(|j| needs(&spans[*j], resource)).sum();
                let (had, seen) = timeline.allowance(resource, at);
                if used > had && reported.insert(resource.clone()) {
                    let who: Vec<String> = running
                        .iter()
                        .map(|j| {
                            let s = &spans[*j];
                            format!(
                                "task {} {} holding {}",
                                s.task,
                                s.describe(),
                                needs(s, resource)
                            )
                        })
                        .collect();
                    out.push(Anomaly {
                        rule: Rule::OverCapacity,
                        at,
                        detail: format!(
                            "node {node} ran {used} {resource} at {at}, when task {} {} started, \
                             but had at most {had} then (status reads around it: {seen}); \
                             running: {who:?}",
                            spans[i].task,
                            spans[i].describe()
                        ),
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{clean, exec, rules, sample, submit, task};
    use super::super::overlaps;
    use super::*;
    use crate::nemesis::history::ExecKind;

    /// `clean` and a second task on node 1, one cpu each.
    fn two_tasks() -> History {
        let mut h = clean();
        h.submits.push(submit("nem-1-2", Outcome::Ok(2)));
        h.tasks.insert(2, task(2, "nem-1-2", "Succeeded"));
        h
    }

    #[test]
    fn a_node_running_more_than_its_capacity_is_caught() {
        let mut h = two_tasks();
        h.execs.push(exec(ExecKind::Start, 2, 1, 1, 400));
        h.execs.push(exec(ExecKind::End, 2, 1, 1, 800));
        let found = capacity(&h);
        assert_eq!(rules(&found), vec![Rule::OverCapacity]);
        let d = &found[0].detail;
        assert!(d.contains("node 1 ran 2 cpu at 400"), "{d}");
        assert!(d.contains("had at most 1"), "{d}");
        assert!(
            d.contains("task 2 attempt 1 on node 1 in process 211"),
            "{d}"
        );
        // One after the other on the node is within its capacity.
        h.execs.retain(|e| e.task != 2);
        h.execs.push(exec(ExecKind::Start, 2, 1, 1, 500));
        h.execs.push(exec(ExecKind::End, 2, 1, 1, 800));
        assert_eq!(capacity(&h), vec![]);
    }

    #[test]
    fn an_attempt_of_one_record_counts_at_its_instant_and_then_leaves_the_node() {
        // Attempt 1 of task 2 was killed after its start record and before any beat; its
        // retry runs on the same node later. The node ran one task at a time.
        let mut h = two_tasks();
        h.execs.push(exec(ExecKind::Start, 2, 1, 1, 600));
        h.execs.push(exec(ExecKind::Start, 2, 2, 1, 700));
        h.execs.push(exec(ExecKind::End, 2, 2, 1, 900));
        assert_eq!(capacity(&h), vec![]);
        assert_eq!(overlaps(&h), vec![]);
        // The same one-record attempt while task 1 runs is one task too many.
        h.execs.retain(|e| (e.task, e.attempt) != (2, 1));
        h.execs.push(exec(ExecKind::Start, 2, 1, 1, 300));
        assert_eq!(rules(&capacity(&h)), vec![Rule::OverCapacity]);
    }

    #[test]
    fn capacity_is_what_the_node_had_when_the_execution_started_not_at_the_end() {
        // Node 1 had two cpus until about 1,000, then one (the final status says one).
        let mut h = two_tasks();
        h.capacity = vec![
            sample(1, 0, 10, 2),
            sample(1, 990, 1_010, 1),
            sample(1, 2_000, 2_010, 1),
        ];
        h.execs.push(exec(ExecKind::Start, 2, 1, 1, 200));
        h.execs.push(exec(ExecKind::End, 2, 1, 1, 800));
        // Two at once while the node had two: clean, though it has one at the end.
        assert_eq!(capacity(&h), vec![]);
        // Two at once after it shrank to one: one too many, though it once had two.
        let mut late = two_tasks();
        late.capacity = h.capacity.clone();
        late.execs = vec![
            exec(ExecKind::Start, 1, 1, 1, 1_200),
            exec(ExecKind::End, 1, 1, 1, 1_800),
            exec(ExecKind::Start, 2, 1, 1, 1_300),
            exec(ExecKind::End, 2, 1, 1, 1_700),
        ];
        let found = capacity(&late);
        assert_eq!(rules(&found), vec![Rule::OverCapacity]);
        assert!(found[0].detail.contains("at 1300"), "{}", found[0].detail);
        // The other way: one cpu until about 1,000, two after; the final status says two.
        let mut grew = late.clone();
        grew.capacity = vec![
            sample(1, 0, 10, 1),
            sample(1, 600, 610, 1),
            sample(1, 990, 1_010, 2),
            sample(1, 2_000, 2_010, 2),
        ];
        assert_eq!(capacity(&grew), vec![]);
        let mut early = grew.clone();
        early.execs = h.execs.clone();
        assert_eq!(rules(&capacity(&early)), vec![Rule::OverCapacity]);
    }

    #[test]
    fn a_change_between_two_reads_gives_the_benefit_of_the_doubt_and_a_shrink_under_load_is_allowed()
     {
        // Between the reads at 400..410 (one cpu) and 600..610 (two), the node grew: a second
        // task starting at 500 may have found two.
        let mut h = two_tasks();
        h.capacity = vec![
            sample(1, 0, 10, 1),
            sample(1, 400, 410, 1),
            sample(1, 600, 610, 2),
        ];
        h.execs.push(exec(ExecKind::Start, 2, 1, 1, 450));
        h.execs.push(exec(ExecKind::End, 2, 1, 1, 900));
        assert_eq!(capacity(&h), vec![]);
        // Shrinking to one while both run admits nothing new, but what runs may go on.
        h.capacity = vec![sample(1, 0, 10, 2), sample(1, 460, 470, 1)];
        assert_eq!(capacity(&h), vec![]);
    }

    #[test]
    fn a_node_no_status_read_showed_had_nothing() {
        let mut h = clean();
        h.execs = vec![
            exec(ExecKind::Start, 1, 1, 9, 100),
            exec(ExecKind::End, 1, 1, 9, 500),
        ];
        let found = capacity(&h);
        assert_eq!(rules(&found), vec![Rule::OverCapacity]);
        assert!(
            found[0].detail.contains("no status read showed the node"),
            "{}",
            found[0].detail
        );
    }
}
