//! Retention: what the head forgets, and when, so that its memory stays flat under an endless
//! stream of short tasks and a churn of workers (docs/DESIGN.md §7).
//!
//! - **Finished tasks** are kept whole (spec, result, reason, times) while they are among the
//!   last [`RetentionPolicy::finished`] to finish and finished less than
//!   [`RetentionPolicy::finished_for`] ago; whichever limit is reached first evicts. Finished
//!   ids wait in a queue in the order they finished, so each eviction is O(1) amortised: pop
//!   the front, drop its record, keep a [`Tombstone`] (its final state and finish time).
//! - **Tombstones** are bounded too ([`RetentionPolicy::tombstones`]): past the bound, the
//!   lowest task ids lose theirs first. Task ids are never reused, so any id below the next one
//!   that has neither a record nor a tombstone was evicted as well; either way the answer is
//!   [`Evicted`], never "unknown task".
//! - **Dead nodes** keep their whole record for [`RetentionPolicy::dead_nodes_for`] after they
//!   left (so `status` and `gpus` still show them), then shrink to a [`NodeTombstone`] (name,
//!   when and why it left), of which the [`RetentionPolicy::node_tombstones`] highest ids are
//!   kept. The scheduler core forgets a node's structures the moment it leaves.
//!
//! Only terminal tasks are ever evicted; pending and running tasks (a reservation's bundle
//! holders among them) are never touched. Eviction happens inside `apply`, driven only by the
//! entry's `now` and by counts, so every replica evicts the same tasks at the same entry. A
//! task is evicted at the earliest by the entry *after* the one that finished it, so the
//! runtime, which performs each entry's effects before applying the next, always finds the
//! record of a task whose `Terminal` effect it handles. A client's `wait` keeps a copy of the
//! statuses it will answer with (see the runtime's waiters): eviction never changes a `wait`
//! answer, and the state machine never depends on who is waiting, which only the leader knows.
//!
//! The defaults follow Ray's: 100,000 finished tasks (`RAY_task_events_max_num_task_in_gcs`)
//! and 1,000 dead nodes (`RAY_maximum_gcs_dead_node_cached_count`).

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use escher_proto::types::{Evicted, NodeId, TaskId, Tombstone};
use serde::{Deserialize, Serialize};

use super::apply::ClusterState;
use super::error::ApplyError;
use super::tasks::millis;
use crate::scheduler::Millis;

/// How much the head keeps of what it no longer needs. Part of the replicated state's
/// settings: every replica must apply the same policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetentionPolicy {
    /// How many finished tasks keep their whole record (the most recently finished).
    pub finished: usize,
    /// How long after it finished a task keeps its whole record.
    pub finished_for: Duration,
    /// How many evicted tasks keep a tombstone (the highest ids).
    pub tombstones: usize,
    /// How long after it left a dead node keeps its whole record.
    pub dead_nodes_for: Duration,
    /// How many reclaimed nodes keep a tombstone (the highest ids).
    pub node_tombstones: usize,
}

impl RetentionPolicy {
    /// Keeps every finished task and dead node forever (memory grows with every task).
    pub fn unbounded() -> RetentionPolicy {
        RetentionPolicy {
            finished: usize::MAX,
            finished_for: Duration::MAX,
            tombstones: usize::MAX,
            dead_nodes_for: Duration::MAX,
            node_tombstones: usize::MAX,
        }
    }

    /// The default number of tombstones for `finished` retained tasks: ten times as many.
    pub fn tombstones_for(finished: usize) -> usize {
        finished.saturating_mul(10)
    }
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        let finished = 100_000;
        RetentionPolicy {
            finished,
            finished_for: Duration::from_secs(24 * 3600),
            tombstones: RetentionPolicy::tombstones_for(finished),
            dead_nodes_for: Duration::from_secs(3600),
            node_tombstones: 1_000,
        }
    }
}

/// What is left of a node that left longer ago than the grace period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeTombstone {
    /// The worker's name.
    pub name: String,
    /// When it left.
    pub left_at: Millis,
    /// Why it left.
    pub because: Option<String>,
}

/// The retention bookkeeping inside [`ClusterState`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Retention {
    /// Terminal tasks that still have their record, in the order they finished.
    finished: VecDeque<TaskId>,
    /// Evicted tasks' tombstones, by id.
    tombstones: BTreeMap<TaskId, Tombstone>,
    /// Dead nodes that still have their whole record, in the order they left.
    dead: VecDeque<NodeId>,
    /// Reclaimed nodes' tombstones, by id.
    departed: BTreeMap<NodeId, NodeTombstone>,
}

impl Retention {
    /// How many finished tasks wait for eviction; taken at the start of an entry, it marks
    /// those that finished in earlier entries.
    pub(crate) fn finished_len(&self) -> usize {
        self.finished.len()
    }

    /// A task reached a terminal state (once per task).
    pub(crate) fn task_finished(&mut self, id: TaskId) {
        self.finished.push_back(id);
    }

    /// A finished task was reopened (a requeue of a failed task): it waits for eviction no
    /// more. Rare, so a scan of the queue.
    pub(crate) fn task_reopened(&mut self, id: TaskId) {
        self.finished.retain(|t| *t != id);
    }

    /// A node left (once per node).
    pub(crate) fn node_left(&mut self, id: NodeId) {
        self.dead.push_back(id);
    }

    /// The tombstone of an evicted task, while it is kept.
    pub(crate) fn tombstone(&self, id: TaskId) -> Option<Tombstone> {
        self.tombstones.get(&id).copied()
    }

    /// Reclaimed nodes with their tombstones, in id order.
    pub(crate) fn departed(&self) -> &BTreeMap<NodeId, NodeTombstone> {
        &self.departed
    }

    /// How many tombstones of tasks and of nodes are kept.
    pub(crate) fn tombstone_counts(&self) -> (usize, usize) {
        (self.tombstones.len(), self.departed.len())
    }
}

impl ClusterState {
    /// Evicts what the policy no longer keeps: finished tasks beyond the count or the age
    /// (only among the first `settled` in the queue, those that finished in earlier entries),
    /// and dead nodes past their grace period. Called at the end of every accepted entry.
    pub(crate) fn retain(&mut self, settled: usize, now: Millis) {
        let max_count = self.config.retention.finished;
        let max_age = millis(self.config.retention.finished_for);
        let mut evicted = 0;
        while evicted < settled {
            let Some(&id) = self.retention.finished.front() else {
                break;
            };
            let finished_at = self.tasks.get(&id).and_then(|r| r.finished_at);
            let too_many = self.retention.finished.len() > max_count;
            let too_old = finished_at.is_some_and(|at| now.saturating_sub(at) >= max_age);
            if !too_many && !too_old {
                break;
            }
            self.retention.finished.pop_front();
            evicted += 1;
            self.evict(id);
        }
        let grace = millis(self.config.retention.dead_nodes_for);
        while let Some(&id) = self.retention.dead.front() {
            if self.nodes.get(&id).is_some_and(|n| n.alive) {
                // It came back (a worker rejoins with its id and secret): nothing to reclaim.
                self.retention.dead.pop_front();
                continue;
            }
            let left_at = self.nodes.get(&id).and_then(|n| n.left_at);
            if left_at.is_some_and(|at| now.saturating_sub(at) < grace) {
                break;
            }
            self.retention.dead.pop_front();
            self.reclaim_node(id);
        }
    }

    /// Drops a terminal task's record and keeps its tombstone.
    fn evict(&mut self, id: TaskId) {
        // Only finished tasks are queued for eviction (a reopened one leaves the queue); an
        // unfinished one is kept rather than dropped, never a panic.
        if self.tasks.get(&id).is_some_and(|r| !r.state.is_terminal()) {
            return;
        }
        self.forget_session_result(id);
        let Some(record) = self.tasks.remove(&id) else {
            return;
        };
        self.lineage.forget(id);
        self.release_result_bytes(&record);
        self.count_spec_bytes(&record.spec, false);
        let limit = self.config.retention.tombstones;
        if limit == 0 {
            return;
        }
        let tombstone = Tombstone {
            state: record.state,
            finished_at_ms: record.finished_at.unwrap_or_default(),
        };
        self.retention.tombstones.insert(id, tombstone);
        while self.retention.tombstones.len() > limit {
            self.retention.tombstones.pop_first();
        }
    }

    /// Shrinks a dead node's record to its tombstone.
    fn reclaim_node(&mut self, id: NodeId) {
        // Only dead nodes are reclaimed (`retain` skips one that came back).
        if self.nodes.get(&id).is_some_and(|n| n.alive) {
            return;
        }
        let Some(record) = self.nodes.remove(&id) else {
            return;
        };
        self.registrations.forget(id);
        let limit = self.config.retention.node_tombstones;
        if limit == 0 {
            return;
        }
        let tombstone = NodeTombstone {
            name: record.name,
            left_at: record.left_at.unwrap_or_default(),
            because: record.gone_because,
        };
        self.retention.departed.insert(id, tombstone);
        while self.retention.departed.len() > limit {
            self.retention.departed.pop_first();
        }
    }

    /// Why there is no record of task `id`: it was evicted (with its tombstone if kept), or
    /// it never existed.
    pub fn missing_task(&self, id: TaskId) -> ApplyError {
        match self.evicted(id) {
            Some(evicted) => ApplyError::Evicted(evicted),
            None => ApplyError::UnknownTask(id),
        }
    }

    /// The eviction answer for `id`: `None` if it has a record, or was never handed out.
    pub fn evicted(&self, id: TaskId) -> Option<Evicted> {
        if self.tasks.contains_key(&id)
            || id.0 == 0
            || id.0 >= self.next_task
            || self.incarnation.skipped(id.0)
        {
            return None;
        }
        Some(Evicted {
            id,
            tombstone: self.retention.tombstone(id),
        })
    }

    /// Ok if the state can say how task `id` stands: it has a record or a tombstone. A `wait`
    /// may list only such tasks.
    pub fn check_known(&self, id: TaskId) -> Result<(), ApplyError> {
        if self.tasks.contains_key(&id) || self.retention.tombstone(id).is_some() {
            return Ok(());
        }
        Err(self.missing_task(id))
    }

    /// Whether task `id` has finished, as its record or its tombstone says.
    pub fn is_finished(&self, id: TaskId) -> bool {
        match self.tasks.get(&id) {
            Some(record) => record.state.is_terminal(),
            None => self.retention.tombstone(id).is_some(),
        }
    }

    /// The next time something is due (a pending deadline, a finished task or dead node
    /// reaching the end of its retention), so the runtime knows when to apply a `Tick`.
    pub fn next_timer(&self) -> Option<Millis> {
        let policy = &self.config.retention;
        let task = self
            .retention
            .finished
            .front()
            .and_then(|id| self.tasks.get(id)?.finished_at)
            .map(|at| at.saturating_add(millis(policy.finished_for)));
        let node = self
            .retention
            .dead
            .front()
            .and_then(|id| self.nodes.get(id)?.left_at)
            .map(|at| at.saturating_add(millis(policy.dead_nodes_for)));
        [self.core.next_deadline(), task, node]
            .into_iter()
            .flatten()
            .min()
    }

    /// The id the next submitted task gets; every id below it was handed out once.
    pub fn next_task_id(&self) -> TaskId {
        TaskId(self.next_task)
    }

    /// How many finished tasks keep their record, and how many tombstones of tasks and of
    /// nodes are kept.
    pub fn retained_counts(&self) -> (usize, usize, usize) {
        let (tasks, nodes) = self.retention.tombstone_counts();
        (self.retention.finished_len(), tasks, nodes)
    }
}
