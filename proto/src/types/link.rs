//! The messages between the head and its workers (the `WorkerLink` service), as domain values.
//!
//! A worker registers ([`RegisterRequest`] → [`RegisterReply`]), then holds one stream on which
//! it sends [`WorkerMessage`]s and receives [`HeadMessage`]s.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{
    DeviceHold, GpuInfo, Labels, LogChunk, LogStream, MigDone, NodeId, ResourceSet, TaskId,
    TaskResult, TaskSpec,
};

/// A task a worker is running (reported on registration, to rebuild a restarted head's soft
/// state).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RunningTask {
    /// The task.
    pub task_id: TaskId,
    /// The attempt it runs.
    pub attempt: u32,
}

/// A worker introduces itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterRequest {
    /// The worker's name (1 to 256 bytes).
    pub name: String,
    /// The worker's address, for people and tools.
    pub address: String,
    /// The physical resources it has.
    pub resources: ResourceSet,
    /// Its labels.
    pub labels: Labels,
    /// The node id it had before, when it reconnects.
    pub previous_node_id: Option<NodeId>,
    /// The tasks it is running now.
    pub running: Vec<RunningTask>,
    /// Its GPUs, by index (their resources are among `resources`).
    pub gpus: Vec<GpuInfo>,
}

/// The head accepts a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterReply {
    /// The worker's node id.
    pub node_id: NodeId,
    /// How often to send a heartbeat (whole milliseconds on the wire).
    pub heartbeat_interval: Duration,
}

/// A live figure of a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    /// What it measures (not empty).
    pub name: String,
    /// Its value.
    pub value: f64,
}

/// A task ended on a worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskFinished {
    /// The task.
    pub task_id: TaskId,
    /// The attempt from the assignment.
    pub attempt: u32,
    /// Its result, or why it could not run or failed (a spawn error, a function's error).
    pub outcome: Result<TaskResult, String>,
    /// Whether the worker stopped it because its timeout passed.
    pub timed_out: bool,
}

/// What a worker sends on its stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WorkerMessage {
    /// The first message: which node this stream belongs to.
    Hello {
        /// The node id from [`RegisterReply`].
        node_id: NodeId,
    },
    /// The worker is alive.
    Heartbeat {
        /// Live figures (may be empty).
        metrics: Vec<Metric>,
    },
    /// A task started.
    TaskStarted {
        /// The task.
        task_id: TaskId,
        /// The attempt from the assignment.
        attempt: u32,
    },
    /// A task ended.
    TaskFinished(TaskFinished),
    /// The answer to [`HeadMessage::FetchLogs`].
    Logs {
        /// The request it answers.
        request_id: u64,
        /// The bytes read, or why they could not be.
        result: Result<LogChunk, String>,
    },
    /// The devices (GPUs, MIG slices) a task was given; sent just before its `TaskStarted`.
    TaskDevices {
        /// The task.
        task_id: TaskId,
        /// The attempt from the assignment.
        attempt: u32,
        /// The devices, with how much of each.
        devices: Vec<DeviceHold>,
    },
    /// The node's GPUs as they are now: after `Hello` and after every MIG reconfiguration.
    GpusChanged {
        /// Every GPU of the node, by index.
        gpus: Vec<GpuInfo>,
        /// The reconfiguration this report ends, if any.
        done: Option<MigDone>,
    },
}

/// The head tells a worker to run a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Assignment {
    /// The task.
    pub task_id: TaskId,
    /// Which attempt, from 1.
    pub attempt: u32,
    /// What to run.
    pub spec: TaskSpec,
    /// The resources allocated to it on this node.
    pub allocation: ResourceSet,
}

/// What the head sends on a worker's stream.
///
/// `Assign` is much larger than the other variants, but it is also by far the most common
/// message; boxing it would add an allocation per dispatch and save nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum HeadMessage {
    /// Run a task.
    Assign(Assignment),
    /// Stop a task.
    CancelTask {
        /// The task.
        task_id: TaskId,
        /// The attempt to stop.
        attempt: u32,
        /// Why.
        reason: String,
    },
    /// Read a piece of a task's output; answered with [`WorkerMessage::Logs`].
    FetchLogs {
        /// Chosen by the head, echoed in the answer.
        request_id: u64,
        /// The task.
        task_id: TaskId,
        /// Which stream.
        stream: LogStream,
        /// The byte offset to read from.
        offset: u64,
        /// At most this many bytes.
        max_bytes: u32,
    },
    /// The worker should stop.
    Shutdown {
        /// Why.
        reason: String,
    },
    /// Change the MIG layout of one GPU (once the slices it destroys are free); answered with
    /// [`WorkerMessage::GpusChanged`] carrying `done`.
    ReconfigureMig {
        /// The GPU index.
        gpu: u32,
        /// The layout, explicit form (`2g.10gb@0,3g.20gb@4`).
        layout: String,
    },
}
