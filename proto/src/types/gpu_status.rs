//! What the `Gpus` and `ApplyMigLayout` calls carry: each node's GPUs with who holds which
//! device, reconfigurations in progress, and the plan of a MIG layout change.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Amount, GpuInfo, NodeId, TaskId};

/// Who holds one device (a whole GPU or a MIG device).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceHolder {
    /// The device's UUID.
    pub uuid: String,
    /// The task that holds it.
    pub task: TaskId,
    /// How much of it (the whole device is one unit).
    pub amount: Amount,
}

/// A MIG reconfiguration of one GPU that has started and not finished.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigProgress {
    /// The layout being applied, explicit form.
    pub target: String,
    /// The UUIDs of the slices being destroyed; nothing new is placed on them.
    pub retiring: Vec<String>,
    /// Running tasks that still hold a retiring slice.
    pub waiting_for: Vec<TaskId>,
    /// When it was asked for, milliseconds since the Unix epoch.
    pub since_ms: u64,
}

/// One GPU, with what holds its devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuStatus {
    /// The GPU as its worker reported it last.
    pub info: GpuInfo,
    /// Who holds its devices, by device then task.
    pub holders: Vec<DeviceHolder>,
    /// The reconfiguration in progress, if any.
    pub reconfiguring: Option<MigProgress>,
    /// Why the last reconfiguration failed, if it did.
    pub last_error: Option<String>,
}

/// The GPUs of one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeGpus {
    /// The node.
    pub node: NodeId,
    /// The worker's name.
    pub name: String,
    /// Whether it is live.
    pub alive: bool,
    /// Its GPUs, by index.
    pub gpus: Vec<GpuStatus>,
}

/// The reply of `Gpus`: every node with GPUs, in ascending id order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpusReply {
    /// The nodes.
    pub nodes: Vec<NodeGpus>,
}

/// `ApplyMigLayout`: change the MIG layout of one GPU of one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyMigLayoutRequest {
    /// The node.
    pub node: NodeId,
    /// The GPU's index on the node.
    pub gpu: u32,
    /// The layout text (`3g.20gb,2g.10gb,1g.5gb@6`), read by
    /// [`Layout::parse`](crate::mig::Layout::parse) for the GPU's model.
    pub layout: String,
    /// Wait for busy slices to drain instead of refusing.
    pub drain: bool,
}

/// What a MIG layout change does; the reply of `ApplyMigLayout`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigPlan {
    /// The node.
    pub node: NodeId,
    /// The GPU index.
    pub gpu: u32,
    /// The layout before, explicit form.
    pub from: String,
    /// The layout after, explicit form.
    pub to: String,
    /// The instances destroyed (`profile@start`).
    pub destroy: Vec<String>,
    /// The instances created (`profile@start`).
    pub create: Vec<String>,
    /// Running tasks it waits for (with `drain`).
    pub waiting_for: Vec<TaskId>,
    /// How long the change takes on hardware by MIGRator's latency model (not counting the
    /// wait for `waiting_for`).
    pub estimated: Duration,
}

impl MigPlan {
    /// Whether the GPU already had the layout, so nothing happens.
    pub fn is_unchanged(&self) -> bool {
        self.destroy.is_empty() && self.create.is_empty()
    }
}

/// Which GPU a finished MIG reconfiguration was for, and whether it failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigDone {
    /// The GPU index.
    pub gpu: u32,
    /// Why it failed; `None` on success.
    pub error: Option<String>,
}
