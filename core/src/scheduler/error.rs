//! Errors the core returns for events that make no sense; the core is unchanged after any.

use escher_proto::types::{Amount, Capacity, Delta, NodeId, ResourceName, TaskId};
use thiserror::Error;

/// An event the core refused. The state is exactly as before the event.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CoreError {
    /// No live node has this id.
    #[error("unknown node {0}")]
    UnknownNode(NodeId),
    /// A node with this id is already live.
    #[error("node {0} is already registered")]
    DuplicateNode(NodeId),
    /// The core does not know this task (never submitted, or already finished).
    #[error("unknown task {0}")]
    UnknownTask(TaskId),
    /// A task with this id is already pending or running.
    #[error("task {0} is already pending or running")]
    DuplicateTask(TaskId),
    /// A gang with no members.
    #[error("a gang needs at least one bundle")]
    EmptyGang,
    /// `TaskFinished` for a task that is still pending.
    #[error("task {0} is pending, not running; cancel it instead")]
    NotRunning(TaskId),
    /// `NodeSpec::Local` reached the core; the caller must resolve it to a node.
    #[error("a Local node spec must be resolved to the caller's node before it reaches the core")]
    UnresolvedLocal,
    /// `num_nodes` of zero selects nothing.
    #[error("num_nodes must be at least 1 (omit it to select every matching node)")]
    ZeroNumNodes,
    /// An adjustment would take a capacity below zero.
    #[error(
        "changing {resource} on node {node} by {delta} would make its capacity negative \
         (it is {capacity})"
    )]
    NegativeCapacity {
        /// The node.
        node: NodeId,
        /// The resource.
        resource: ResourceName,
        /// Its capacity before the change.
        capacity: Capacity,
        /// The change.
        delta: Delta,
    },
    /// An adjustment would take a capacity above the maximum amount.
    #[error("changing {resource} on node {node} by {delta} exceeds the maximum of {max}")]
    CapacityOverflow {
        /// The node.
        node: NodeId,
        /// The resource.
        resource: ResourceName,
        /// The change.
        delta: Delta,
        /// The largest capacity there can be.
        max: Amount,
    },
}
