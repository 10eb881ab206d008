//! The requests and replies of the `Cluster` service, as domain values.
//!
//! Each mirrors one message of `escher.proto`; [`crate::convert`] turns the wire messages into
//! these after validating every field, so a head handler receives only well-formed requests.
//! Replies that are already domain types elsewhere ([`super::TaskInfo`],
//! [`super::ClusterStatus`]) are not repeated here.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{GangStrategy, LogStream, ResourceName, ResourceSet, TaskSummary};
use super::{Namespace, NodeId, ResourceUpdate, TaskId, TaskSpec, TaskState, TaskStatus};

/// The idempotency key of one write: which client, which of its writes, and below which
/// sequence number every write of the client has been answered.
///
/// Conversion from the wire guarantees `client != 0` and `1 <= first_incomplete <= seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RequestKey {
    /// The client: random, chosen when it was created.
    pub client: u64,
    /// The write: counts the client's writes from 1.
    pub seq: u64,
    /// Every write of this client numbered below this has been answered.
    pub first_incomplete: u64,
}

/// `Submit`: a batch of tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubmitRequest {
    /// The tasks, in order.
    pub tasks: Vec<TaskSpec>,
    /// The namespace that qualifies unqualified application resource names.
    pub namespace: Option<Namespace>,
}

/// The ids of submitted tasks, in request order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitReply {
    /// One id per submitted task.
    pub task_ids: Vec<TaskId>,
}

/// `Wait`: Ray's `wait` (and `get`, a wait on one id).
///
/// Conversion from the wire guarantees ids are distinct and `1 <= num_returns <= task_ids.len()`
/// (or both are zero).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitRequest {
    /// The tasks to wait for.
    pub task_ids: Vec<TaskId>,
    /// Return once this many have finished.
    pub num_returns: u32,
    /// Return after this long even if fewer have finished; `None` waits without limit.
    pub timeout: Option<Duration>,
}

/// The result of a wait.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitReply {
    /// The finished tasks, with their results.
    pub ready: Vec<TaskStatus>,
    /// The ids that had not finished, in request order.
    pub not_ready: Vec<TaskId>,
}

/// `Cancel`: tasks to cancel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelRequest {
    /// The tasks.
    pub task_ids: Vec<TaskId>,
    /// Whether every descendant of theirs that has not ended is cancelled too (the tasks they
    /// submitted from inside themselves, and theirs).
    #[serde(default)]
    pub recursive: bool,
    /// Whether a running command task is killed at once (SIGKILL), without its grace.
    #[serde(default)]
    pub force: bool,
}

/// What cancelling did: each task's status afterwards, in request order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelReply {
    /// The statuses.
    pub tasks: Vec<TaskStatus>,
}

/// `ListTasks`: a page of tasks in ascending id order (descending with `newest_first`), the
/// filters all applied.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListTasksRequest {
    /// Only tasks in this state; `None` for all.
    pub state: Option<TaskState>,
    /// At most this many; 0 for the server's default page size.
    pub limit: u32,
    /// Where the previous page ended: only tasks with ids greater than this (smaller with
    /// `newest_first`); `None` to start from the first (or the newest) task.
    pub after: Option<TaskId>,
    /// Only tasks whose name contains this.
    pub name: Option<String>,
    /// Only tasks carrying every one of these labels: a key and a value, or a key alone for
    /// any value.
    pub labels: Vec<(String, Option<String>)>,
    /// Only tasks whose latest attempt went to this node.
    pub node: Option<NodeId>,
    /// Only tasks of this namespace (an application caller sees its own only, whatever it
    /// asks).
    pub namespace: Option<Namespace>,
    /// Newest (highest id) first.
    pub newest_first: bool,
}

/// The most label selectors one `ListTasks` may carry.
pub const MAX_LABEL_SELECTORS: usize = 16;

/// A page of tasks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListTasksReply {
    /// The tasks, in ascending id order (descending with `newest_first`).
    pub tasks: Vec<TaskSummary>,
    /// How many more tasks match beyond this page, counted up to [`MORE_COUNTED`].
    pub more: u64,
}

/// Past this many, `ListTasksReply::more` stops counting: it means "at least this many".
pub const MORE_COUNTED: u64 = 10_000;

/// `SetResources`: a batch of `set_resource` calls (docs/DESIGN.md §3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetResourcesRequest {
    /// The changes, applied in order.
    pub updates: Vec<ResourceUpdate>,
    /// The namespace that qualifies unqualified application names.
    pub namespace: Option<Namespace>,
    /// The running task that makes the call; `NodeSpec::Local` resolves to its node. The head
    /// fills it in from the caller's task credential; it never travels on the wire.
    pub caller_task: Option<TaskId>,
}

/// What one resource update changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetResourceOutcome {
    /// The nodes it changed, in ascending id order.
    pub nodes: Vec<NodeId>,
}

/// What a batch of resource updates changed: one outcome per update, in request order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetResourcesReply {
    /// The outcomes.
    pub outcomes: Vec<SetResourceOutcome>,
}

/// `TaskLogs`: read a piece of a command task's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskLogsRequest {
    /// The task.
    pub task_id: TaskId,
    /// Which stream.
    pub stream: LogStream,
    /// The byte offset to read from.
    pub offset: u64,
    /// At most this many bytes; 0 for the server's default.
    pub max_bytes: u32,
    /// Which attempt (numbered from 1); `None` for the latest.
    pub attempt: Option<u32>,
}

/// A piece of a task's output (the `TaskLogs` reply, and a worker's answer to `FetchLogs`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogChunk {
    /// The bytes read.
    pub data: Vec<u8>,
    /// The offset to ask for next.
    pub next_offset: u64,
    /// Whether the stream is complete and everything has been read.
    pub eof: bool,
    /// The attempt the bytes belong to (0 in a worker's answer: the head asked for one).
    pub attempt: u32,
    /// Set when the bytes came from the head's copy of the output's tail: what was kept and
    /// what was lost.
    pub notice: Option<String>,
}

/// `Reserve`: bundles of resources placed all or nothing (head-native gang scheduling).
///
/// Conversion from the wire guarantees at least one bundle and no empty bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReserveRequest {
    /// The reservation's name; its resources are `NAME.RES` and `NAME-I.RES`.
    pub name: ResourceName,
    /// What each bundle holds, in order.
    pub bundles: Vec<ResourceSet>,
    /// How bundles may share nodes.
    pub strategy: GangStrategy,
    /// Give up if not placed within this long; `None` waits.
    pub timeout: Option<Duration>,
    /// The namespace that qualifies unqualified names.
    pub namespace: Option<Namespace>,
}

/// The holders of a reservation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReserveReply {
    /// One holder task per bundle, in bundle order.
    pub task_ids: Vec<TaskId>,
    /// Whether every bundle was placed when the head answered.
    pub placed: bool,
}
