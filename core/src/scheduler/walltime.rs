//! Walltimes and time limits: a node that will end (a worker started with `--walltime`, or in a
//! Slurm allocation, carries [`ENDS_AT_LABEL`]) receives no task whose time limit (its spec's
//! `timeout`) would outlast it.
//!
//! - **Placement.** On a node without an end, a shape's oldest task goes first, as everywhere
//!   else. On a node with one, it is the oldest task of the shape that lasts no longer than the
//!   node: a task without a time limit, or one whose limit ends (counted from the placement) at
//!   or before the node's end. So a short task may pass a long one of the same shape there,
//!   and the long one waits for a node that lasts.
//! - **Why it waits.** A pending task with a limit that every live node able to hold it would
//!   end before is reported infeasible (the reason names [`WALLTIME_REASON`], its limit and the
//!   last of those nodes to end), and feasible again when a node that lasts joins or a node's
//!   end moves later. Time passing only ever shortens what a node has left, so it never makes a
//!   waiting task placeable; a node that outlives its end is drained by the head.
//! - **Cost.** Nothing changes for a cluster without a node that ends or without a task that
//!   has a limit. With both, a look at a node with an end walks its shape's queue until a task
//!   fits, and each look at a shape walks its waiting tasks once to say which are held back.
//! - **Snapshots.** Nothing here is written: the ends are the nodes' labels and the limits
//!   the tasks' specs, which snapshots hold already, so the state rebuilds this index when it
//!   is restored ([`Scheduler::restore_walltimes`]) and the data format does not change.
//!
//! Gangs (reservations) ignore time limits: their members hold their bundles until released.
//!
//! [`ENDS_AT_LABEL`]: escher_proto::types::ENDS_AT_LABEL

use std::collections::BTreeMap;
use std::sync::Arc;

use escher_proto::types::{Amount, ENDS_AT_LABEL, Labels, NodeId, ResourceName, TaskId};
use rustc_hash::FxHashMap;

use super::core::{Place, Scheduler};
use super::event::{Decision, InfeasibleReason, Millis};
use super::shape::{Req, ShapeId};

/// The resource a pending reason names when a task waits for a node that lasts its time limit
/// (its `requested` amount is the limit in seconds).
pub const WALLTIME_REASON: &str = "escher.walltime";

/// When a node with a walltime ends ([`ENDS_AT_LABEL`], milliseconds since the Unix epoch).
pub(crate) fn ends_at(labels: &Labels) -> Option<Millis> {
    labels.get(ENDS_AT_LABEL)?.parse().ok()
}

/// The ends of the live nodes that have one and the limits of the pending tasks that have one.
#[derive(Debug, Default, Clone)]
pub(crate) struct TimeIndex {
    /// When each live node with a walltime ends.
    ends: BTreeMap<NodeId, Millis>,
    /// Each pending task's time limit, in milliseconds.
    pub(crate) limits: FxHashMap<TaskId, Millis>,
    /// The pending tasks reported infeasible for want of a node that lasts their limit, and
    /// the reason each was given.
    blocked: BTreeMap<TaskId, Arc<InfeasibleReason>>,
}

impl TimeIndex {
    /// Records (or, with `None`, forgets) a live node's end.
    pub(crate) fn set_end(&mut self, node: NodeId, end: Option<Millis>) {
        match end {
            Some(end) => self.ends.insert(node, end),
            None => self.ends.remove(&node),
        };
    }

    /// Why `task` waits for a node that lasts its limit, if it does.
    pub(crate) fn held_back(&self, task: TaskId) -> Option<&InfeasibleReason> {
        self.blocked.get(&task).map(|r| &**r)
    }

    /// Whether some live node has an end.
    pub(crate) fn has_ends(&self) -> bool {
        !self.ends.is_empty()
    }

    /// The live nodes that have an end, in id order.
    pub(crate) fn ending_nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.ends.keys().copied()
    }

    /// A task left the queue (placed, cancelled, expired, forgotten).
    pub(crate) fn forget(&mut self, task: TaskId) {
        self.limits.remove(&task);
        self.blocked.remove(&task);
    }

    /// Whether `task`, placed at `now`, ends no later than a node that ends at `end`.
    fn lasts(&self, task: TaskId, end: Option<Millis>, now: Millis) -> bool {
        match (end, self.limits.get(&task)) {
            (Some(end), Some(limit)) => now.saturating_add(*limit) <= end,
            _ => true,
        }
    }
}

impl Scheduler {
    /// Whether `task`'s time limit, started now, ends before `node` does.
    pub(crate) fn lasts_on(&self, task: TaskId, node: NodeId, now: Millis) -> bool {
        self.time
            .lasts(task, self.time.ends.get(&node).copied(), now)
    }

    /// Rebuilds the walltime index of a core read from a snapshot: the nodes' ends from their
    /// labels, and from the state's records the time limits of pending tasks (`limits`) and
    /// the tasks whose pending reason names [`WALLTIME_REASON`], with that reason (`blocked`).
    /// Tasks the core does not hold as pending are ignored.
    pub fn restore_walltimes(
        &mut self,
        limits: impl IntoIterator<Item = (TaskId, Millis)>,
        blocked: impl IntoIterator<Item = (TaskId, InfeasibleReason)>,
    ) {
        let mut time = TimeIndex::default();
        for (id, node) in &self.nodes {
            time.set_end(*id, ends_at(&node.labels));
        }
        for (task, limit) in limits {
            if self.is_pending(task) {
                time.limits.insert(task, limit);
            }
        }
        time.blocked = blocked
            .into_iter()
            .filter(|(t, _)| self.is_pending(*t))
            .map(|(t, reason)| (t, Arc::new(reason)))
            .collect();
        self.time = time;
    }

    /// The task of shape `id` to place on `node` at `now`: its oldest, unless `node` has an
    /// end, where it is the oldest that lasts no longer than the node.
    pub(crate) fn pick(&mut self, id: ShapeId, node: NodeId, now: Millis) -> Option<TaskId> {
        let head = self.head(id)?;
        let Some(end) = self.time.ends.get(&node).copied() else {
            return Some(head);
        };
        if self.time.lasts(head, Some(end), now) {
            return Some(head);
        }
        let shape = self.shapes.shapes.get(&id)?;
        shape
            .queue
            .iter()
            .find(|(task, seq)| {
                self.tasks.get(task).is_some_and(|t| {
                    t.place
                        == Place::Pending {
                            shape: id,
                            seq: *seq,
                        }
                }) && self.time.lasts(*task, Some(end), now)
            })
            .map(|(task, _)| *task)
    }

    /// Says which waiting tasks of a feasible shape no live node lasts for: each newly held
    /// back is reported infeasible (why: its limit against the last of the nodes that could
    /// hold it to end), each no longer held back feasible again.
    pub(crate) fn settle_walltimes(
        &mut self,
        id: ShapeId,
        req: &Req,
        now: Millis,
        out: &mut Vec<Decision>,
    ) {
        if self.time.blocked.is_empty() && (self.time.limits.is_empty() || !self.time.has_ends()) {
            return;
        }
        // The node able to hold the shape that lasts longest (`None`: one that never ends).
        let mut best: Option<(Option<Millis>, NodeId)> = None;
        for n in self.candidates(req) {
            if !self.nodes.get(&n).is_some_and(|node| node.could_hold(req)) {
                continue;
            }
            let end = self.time.ends.get(&n).copied();
            let better = match (best, end) {
                (None, _) => true,
                (Some((Some(_), _)), None) => true,
                (Some((Some(b), _)), Some(e)) => e > b,
                (Some((None, _)), _) => false,
            };
            if better {
                best = Some((end, n));
            }
            if end.is_none() {
                break; // nothing lasts longer
            }
        }
        let tasks = self.pending_in(id);
        for task in tasks {
            let held_back = match best {
                // The shape is infeasible: its own reason says why.
                None => false,
                Some((end, _)) => !self.time.lasts(task, end, now),
            };
            if held_back == self.time.blocked.contains_key(&task) {
                continue;
            }
            if !held_back {
                self.time.blocked.remove(&task);
                if best.is_some() {
                    out.push(Decision::Feasible { task });
                }
                continue;
            }
            let (Some((Some(end), node)), Some(limit)) = (best, self.time.limits.get(&task)) else {
                continue; // live: held back means a limit and a best node with an end
            };
            let reason = Arc::new(walltime_reason(*limit, node, end));
            self.time.blocked.insert(task, reason.clone());
            out.push(Decision::Infeasible { task, reason });
        }
    }
}

/// Why a task with time limit `limit` waits when the last node able to hold it to end is
/// `node`, at `end`.
fn walltime_reason(limit: Millis, node: NodeId, end: Millis) -> InfeasibleReason {
    let seconds = limit.div_ceil(1000);
    InfeasibleReason {
        resource: ResourceName::new(WALLTIME_REASON).unwrap_or_else(|_| ResourceName::cpu()),
        requested: Amount::units(seconds).unwrap_or(Amount::MAX),
        best_total: None,
        closest_nodes: vec![node],
        message: format!(
            "its time limit ({seconds} s) outlasts every live node that could hold it: the \
             last of them to end, node {node}, ends at {end} ms since the Unix epoch \
             ({ENDS_AT_LABEL}); it waits for a node that lasts"
        ),
    }
}
