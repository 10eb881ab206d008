//! Why the head refused a command. A refused command changes nothing.

use escher_proto::types::{NodeId, ResourceName, TaskId, TaskState};
use thiserror::Error;

use crate::scheduler::CoreError;

/// A command the head refused; the state is exactly as before it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ApplyError {
    /// An application tried to set, delete or create a worker-reported resource.
    #[error(
        "{0} is a physical resource reported by workers; applications cannot set, create or \
         delete it (use a name of your own, e.g. my-{0})"
    )]
    Physical(ResourceName),
    /// No node has this id.
    #[error("unknown node {0}")]
    UnknownNode(NodeId),
    /// No task has this id.
    #[error("unknown task {0}")]
    UnknownTask(TaskId),
    /// `Local` was used outside a running task.
    #[error(
        "NodeSpec::Local is only valid inside a running task; from outside the cluster name a \
         node (--node ID) or a match (--match RESOURCES)"
    )]
    LocalOutsideTask,
    /// `Local` was used by a task that is not running.
    #[error("task {task} is {state}, not running, so NodeSpec::Local has no node")]
    CallerNotRunning {
        /// The calling task.
        task: TaskId,
        /// Its state.
        state: TaskState,
    },
    /// A task's hook targets `Local` in a way that cannot work.
    #[error("task {index} of the batch: {why}")]
    InvalidTask {
        /// Its position in the batch.
        index: usize,
        /// What was wrong.
        why: String,
    },
    /// The scheduler core refused a resource change (e.g. a capacity would go negative).
    #[error(transparent)]
    Core(#[from] CoreError),
    /// A task id was listed twice in one call.
    #[error("task {0} is listed twice")]
    DuplicateTask(TaskId),
}

impl ApplyError {
    /// Whether the error is about something that does not exist (gRPC `NOT_FOUND`).
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            ApplyError::UnknownNode(_) | ApplyError::UnknownTask(_)
        ) || matches!(
            self,
            ApplyError::Core(CoreError::UnknownNode(_) | CoreError::UnknownTask(_))
        )
    }
}
