//! What the table makes of the copies a worker's store holds, as the worker reports them after
//! its stream attaches (`ObjectsHeld`; docs/ARCHITECTURE.md "Objects", "Loss"): a node the head
//! declared lost and that came back, or a worker of a head restored from a backup, holds files
//! the table no longer counts, and no release will ever name them.
//!
//! [`ClusterState::held_copy`] judges one copy against the applied state and changes nothing:
//! the runtime adopts what it is told to with `ObjectsSealed` (one command per copy, so that one
//! copy refused at commit does not refuse the others), has the worker drop what it is told to,
//! and leaves the rest. A copy the table counts on that node is never dropped.

use escher_proto::types::{HeldCopy, NodeId, ObjectId, ObjectOwner, SealedCopy, TaskId, TaskState};

use super::apply::ClusterState;
use super::objects::FIRST_SESSION;

/// What to do with one copy a worker reported held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeldVerdict {
    /// The table counts it on this node already: nothing to do.
    Counted,
    /// Still wanted: record it (`ObjectsSealed` of this copy).
    Adopt(SealedCopy),
    /// Not the table's to judge yet (its task's attempt runs on this node, and its completion
    /// records or replaces it; or the node is not live): left as it is.
    Leave(String),
    /// Not wanted: the worker deletes it, for this reason.
    Drop(String),
}

/// Who owns object `id`, by its id: a session's `put` (ids from [`FIRST_SESSION`] up) or a
/// task's result.
pub fn owner_of(id: ObjectId) -> ObjectOwner {
    if id.owner() >= FIRST_SESSION {
        ObjectOwner::Session(id.owner())
    } else {
        ObjectOwner::Task(TaskId(id.owner()))
    }
}

impl ClusterState {
    /// What to do with copy `c` that node `node`'s store holds:
    /// - the table counts it on `node`: [`HeldVerdict::Counted`] (whatever it says);
    /// - `node` is not live: [`HeldVerdict::Leave`] (its next attach reports again);
    /// - another size, checksum or namespace than the table's: dropped;
    /// - a task's result while its task is not succeeded (lineage is making it again, or the
    ///   copy is an earlier attempt's): left while the task's attempt runs on `node`, whose
    ///   completion records or replaces it, else dropped (an adopted copy could disagree with
    ///   a rebuild of a task that is not deterministic);
    /// - in the table otherwise (lost, or held elsewhere): adopted, so that a lost object is
    ///   readable again and a rebuilt one gains a second copy of the same bytes;
    /// - released (and remembered as freed): dropped;
    /// - unknown, a session's `put`: adopted as its client's own report would record it (its
    ///   client may not have reported it yet; a head restored from a backup learns it), when
    ///   this table gave out that session (a session that ends or lapses releases it); dropped
    ///   when it did not (a head restored from a backup older than the session: the number may
    ///   be given to another client);
    /// - unknown, a task's result: left while its task runs on `node`, else dropped.
    pub fn held_copy(&self, node: NodeId, c: &HeldCopy) -> HeldVerdict {
        if !self.node_alive(node) || !self.core.has_node(node) {
            return HeldVerdict::Leave(format!("node {node} is not live"));
        }
        let owner = owner_of(c.id);
        let runs_here = |task: TaskId| {
            self.tasks
                .get(&task)
                .is_some_and(|t| t.state == TaskState::Running && t.node == Some(node))
        };
        let task_unfinished = |task: TaskId| {
            self.tasks
                .get(&task)
                .filter(|t| t.state != TaskState::Succeeded)
                .map(|t| t.state)
        };
        let adopt = |namespace| {
            HeldVerdict::Adopt(SealedCopy {
                id: c.id,
                size: c.size,
                checksum: c.checksum,
                owner,
                namespace,
                node,
            })
        };
        if let Some(rec) = self.objects.get(c.id) {
            if rec.holders.contains(&node) {
                return HeldVerdict::Counted;
            }
            let why = if rec.size != c.size {
                Some(format!(
                    "object {} has {} bytes, this copy {}",
                    c.id, rec.size, c.size
                ))
            } else if rec.checksum != c.checksum {
                Some(format!(
                    "object {}'s CRC-32C is {:08x}, this copy's {:08x}",
                    c.id, rec.checksum, c.checksum
                ))
            } else if rec.namespace != c.namespace {
                Some(format!(
                    "object {} belongs to another namespace than this copy",
                    c.id
                ))
            } else {
                None
            };
            if let Some(why) = why {
                return HeldVerdict::Drop(why);
            }
            if let ObjectOwner::Task(task) = rec.owner
                && let Some(state) = task_unfinished(task)
            {
                return if runs_here(task) {
                    HeldVerdict::Leave(format!("task {task} runs on node {node}"))
                } else {
                    HeldVerdict::Drop(format!(
                        "task {task} is {state}: it makes object {} again",
                        c.id
                    ))
                };
            }
            return adopt(rec.namespace.clone());
        }
        if self.objects.was_freed(c.id) {
            return HeldVerdict::Drop(format!("object {} was freed", c.id));
        }
        match owner {
            ObjectOwner::Session(session) if !self.objects.session_given(session) => {
                HeldVerdict::Drop(format!(
                    "object {} belongs to session {session}, which this head never gave out",
                    c.id
                ))
            }
            ObjectOwner::Session(_) => adopt(c.namespace.clone()),
            ObjectOwner::Task(task) if c.id != ObjectId::task_result(task) => {
                HeldVerdict::Drop(format!("object {} is no result of task {task}", c.id))
            }
            ObjectOwner::Task(task) if runs_here(task) => {
                HeldVerdict::Leave(format!("task {task} runs on node {node}"))
            }
            ObjectOwner::Task(task) => HeldVerdict::Drop(format!(
                "the table does not hold object {}, and task {task} does not run on node {node}",
                c.id
            )),
        }
    }
}
