//! Walltimes and time limits: a node that will end (a worker started with `--walltime`, or in a
//! Slurm allocation, carries [`ENDS_AT_LABEL`]) receives no task whose time limit (its spec's
//! `timeout`) would outlast it.
//!
//! - **Placement.** On a node without an end, a shape's oldest task goes first, as everywhere
//!   else. On a node with one, it is the oldest task of the shape that lasts no longer than the
//!   node: one whose limit ends (counted from the placement) at or before the node's end. So a
//!   short task may pass a long one of the same shape there, and the long one waits for a
//!   node that lasts.
//! - **Tasks without a time limit** could run for ever, so no node with an end is sure to
//!   outlast them; they are placed as follows.
//!   - *Where they go first*: among the nodes where one fits when it is submitted, a node that
//!     never ends, else the one that ends last (so they are the last to be cut off). The
//!     round-robin choice stands where it is such a node already. This costs one look over
//!     the shape's candidate nodes when the round-robin lands on a node with an end.
//!   - *The least time left* ([`Scheduler::set_min_time_left`], the head's
//!     `--min-time-left`, 0 by default): a node with an end takes them only while it has at
//!     least this long left. With none, they wait with reason [`WALLTIME_REASON`] like a task
//!     whose limit outlasts every node. At 0 (the default) a node takes them until the head
//!     drains it (`escher.drain-at`).
//! - **Reservations** (gangs) hold their bundles until they are released: they have no time
//!   limit, and are placed like tasks without one (`gang.rs`): on nodes that have at least
//!   the least time left, those that never end first, then the latest to end.
//! - **Why it waits.** A pending task that every live node able to hold it would end before
//!   is reported infeasible (the reason names [`WALLTIME_REASON`], its limit or the least
//!   time left, and the last of those nodes to end), and feasible again when a node that
//!   lasts joins or a node's end moves later. Time passing only ever shortens what a node has
//!   left, so it never makes a waiting task placeable; a node that outlives its end is drained
//!   by the head.
//! - **Cost.** Nothing changes for a cluster without a node that ends. With one, a look at a
//!   node with an end walks its shape's queue until a task fits, each look at a shape walks
//!   its waiting tasks once to say which are held back, and a task without a limit that
//!   round-robin places on a node with an end looks over the shape's candidates once.
//! - **Snapshots.** Nothing here is written: the ends are the nodes' labels, the limits the
//!   tasks' specs and the least time left a setting of every replica, so the state rebuilds
//!   this index when it is restored ([`Scheduler::restore_walltimes`]) and the data format does
//!   not change.
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
    /// The least time a node with an end must have left to take a task without a time limit
    /// or a reservation (0: until it drains).
    pub(crate) min_left: Millis,
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

    /// Whether `task`, placed at `now`, ends no later than a node that ends at `end` (one
    /// without a limit: whether the node has the least time left).
    fn lasts(&self, task: TaskId, end: Option<Millis>, now: Millis) -> bool {
        match (end, self.limits.get(&task)) {
            (Some(end), Some(limit)) => now.saturating_add(*limit) <= end,
            (Some(end), None) => self.untimed_fits(end, now),
            (None, _) => true,
        }
    }

    /// Whether a node that ends at `end` may take, at `now`, something without a time limit (a
    /// task without one, a reservation).
    pub(crate) fn untimed_fits(&self, end: Millis, now: Millis) -> bool {
        self.min_left == 0 || now.saturating_add(self.min_left) <= end
    }

    /// When a live node ends, if it does.
    pub(crate) fn end_of(&self, node: NodeId) -> Option<Millis> {
        self.ends.get(&node).copied()
    }

    /// Whether every pending task counts as timed here: either no node ends or nothing
    /// without a limit is held to the least time left.
    fn nothing_to_settle(&self) -> bool {
        self.blocked.is_empty()
            && (!self.has_ends() || (self.limits.is_empty() && self.min_left == 0))
    }
}

impl Scheduler {
    /// Sets the least time a node with an end must have left to take a task without a time
    /// limit or a reservation (milliseconds; 0, the default, until the node drains). It is a
    /// setting, not state: every replica must set the same, and set it again after a restore
    /// (it changes what later placements decide, never a placement made).
    pub fn set_min_time_left(&mut self, min_left: Millis) {
        self.time.min_left = min_left;
    }

    /// The least time left set with [`set_min_time_left`](Self::set_min_time_left).
    pub fn min_time_left(&self) -> Millis {
        self.time.min_left
    }

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
        let mut time = TimeIndex {
            min_left: self.time.min_left,
            ..TimeIndex::default()
        };
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

    /// Where a task without a time limit that round-robin would place on `node` goes instead:
    /// a node where `req` fits now that never ends, else the one that ends last if it ends
    /// after `node` does; `None` keeps `node` (it never ends, or nothing lasts longer).
    pub(crate) fn longer_lasting(&self, task: TaskId, req: &Req, node: NodeId) -> Option<NodeId> {
        let end = self.time.end_of(node)?;
        if self.time.limits.contains_key(&task) {
            return None;
        }
        let mut best: Option<(Millis, NodeId)> = None;
        for n in self.candidates(req) {
            if n == node || !self.fits_beside_hold(n, req) {
                continue;
            }
            match self.time.end_of(n) {
                None => return Some(n),
                Some(e) if e > end && best.is_none_or(|(b, _)| e > b) => best = Some((e, n)),
                Some(_) => {}
            }
        }
        best.map(|(_, n)| n)
    }

    /// The nodes a reservation's bundle `req` may use at `now`, in the order to try them:
    /// without a node that ends, the candidates in id order; with one, those that never end
    /// (in id order), then those that have the least time left, latest end first.
    pub(crate) fn lasting_candidates(
        &self,
        req: &Req,
        now: Millis,
    ) -> Box<dyn Iterator<Item = NodeId> + '_> {
        if !self.time.has_ends() {
            return self.candidates(req);
        }
        let mut nodes: Vec<(std::cmp::Reverse<Millis>, NodeId)> = self
            .candidates(req)
            .filter_map(|n| match self.time.end_of(n) {
                None => Some((std::cmp::Reverse(Millis::MAX), n)),
                Some(end) => self
                    .time
                    .untimed_fits(end, now)
                    .then_some((std::cmp::Reverse(end), n)),
            })
            .collect();
        nodes.sort_unstable();
        Box::new(nodes.into_iter().map(|(_, n)| n))
    }

    /// For a reservation whose every bundle some live node could hold: why none lasts the
    /// least time left, if that is so (the first bundle none of whose capable nodes does).
    pub(crate) fn gang_walltime(&self, reqs: &[&Req], now: Millis) -> Option<InfeasibleReason> {
        if self.time.min_left == 0 || !self.time.has_ends() {
            return None;
        }
        for req in reqs {
            let capable = |n: &NodeId| self.nodes.get(n).is_some_and(|x| x.could_hold(req));
            if self.lasting_candidates(req, now).any(|n| capable(&n)) {
                continue;
            }
            let last = self
                .candidates(req)
                .filter(capable)
                .filter_map(|n| Some((self.time.end_of(n)?, n)))
                .max();
            if let Some((end, node)) = last {
                return Some(walltime_reason(None, self.time.min_left, node, end));
            }
        }
        None
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
        if self.time.nothing_to_settle() {
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
            let Some((Some(end), node)) = best else {
                continue; // live: held back means a best node with an end
            };
            let limit = self.time.limits.get(&task).copied();
            let reason = Arc::new(walltime_reason(limit, self.time.min_left, node, end));
            self.time.blocked.insert(task, reason.clone());
            out.push(Decision::Infeasible { task, reason });
        }
    }
}

/// Why a task with time limit `limit` (`None`: without one, held to the least time left
/// `min_left`) waits when the last node able to hold it to end is `node`, at `end`.
pub(crate) fn walltime_reason(
    limit: Option<Millis>,
    min_left: Millis,
    node: NodeId,
    end: Millis,
) -> InfeasibleReason {
    let seconds = limit.unwrap_or(min_left).div_ceil(1000);
    let what = match limit {
        Some(_) => format!("its time limit ({seconds} s) outlasts"),
        None => format!(
            "it has no time limit, and the head's --min-time-left ({seconds} s) is more than \
             the time left on"
        ),
    };
    InfeasibleReason {
        resource: ResourceName::new(WALLTIME_REASON).unwrap_or_else(|_| ResourceName::cpu()),
        requested: Amount::units(seconds).unwrap_or(Amount::MAX),
        best_total: None,
        closest_nodes: vec![node],
        message: format!(
            "{what} every live node that could hold it: the last of them to end, node {node}, \
             ends at {end} ms since the Unix epoch ({ENDS_AT_LABEL}); it waits for a node that \
             lasts"
        ),
    }
}
