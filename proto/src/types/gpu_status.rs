//! What the `Gpus` and `ApplyMigLayout` calls carry: each node's GPUs with who holds which
//! device, reconfigurations in progress, and the plan of a MIG layout change.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Amount, GpuInfo, NodeId, TaskId};
use crate::mig::ReconfigurationCost;

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
    /// The last reconfiguration that ended, with what each phase took.
    pub last_reconfiguration: Option<MigReport>,
}

/// A MIG reconfiguration of one GPU that ended: what it applied, when, and what each phase
/// took as its worker reported it (modelled for a simulated GPU, the driver calls timed for a
/// real one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigReport {
    /// The layout it applied, explicit form.
    pub target: String,
    /// When it was asked for, milliseconds since the Unix epoch.
    pub asked_ms: u64,
    /// When its worker reported it done, milliseconds since the Unix epoch (the wait for busy
    /// slices to drain is between the two, beside the phases).
    pub done_ms: u64,
    /// Destroy, create, library load and model load.
    pub phases: ReconfigurationCost,
    /// Why it failed, if it did.
    pub error: Option<String>,
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
    /// What to change.
    pub change: MigChange,
    /// Wait for busy slices to drain instead of refusing.
    pub drain: bool,
}

/// One change of a GPU's MIG instances. Texts are read for the GPU's model
/// ([`Layout::parse`](crate::mig::Layout::parse)); every change becomes one reconfiguration
/// to a whole layout, checked and carried out like [`MigChange::Layout`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MigChange {
    /// The whole layout (`3g.20gb,2g.10gb,1g.5gb@6`), atomically: what only the current
    /// layout has is destroyed, what only this one has is created, the rest is left alone.
    Layout(String),
    /// One more instance, `profile@start` (`1g.5gb@6`), or `profile` alone for the start that
    /// keeps the most full layouts reachable (MIGM's rule); the others are left alone.
    Create(String),
    /// One instance fewer: `profile@start`, or its UUID (`MIG-...`).
    Destroy(String),
    /// Pre-initialization: every step toward the layout that leaves busy instances alone.
    /// Idle instances the layout does not keep are destroyed and the layout's new instances
    /// that fit then are created (and initialized) while the busy ones go on; applying the
    /// layout later does only what is left.
    Prepare(String),
}

impl MigChange {
    /// The text it carries (a layout, or one instance).
    pub fn text(&self) -> &str {
        match self {
            MigChange::Layout(t)
            | MigChange::Create(t)
            | MigChange::Destroy(t)
            | MigChange::Prepare(t) => t,
        }
    }
}

impl fmt::Display for MigChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MigChange::Layout(t) => write!(f, "apply layout {t}"),
            MigChange::Create(t) => write!(f, "create {t}"),
            MigChange::Destroy(t) => write!(f, "destroy {t}"),
            MigChange::Prepare(t) => write!(f, "prepare layout {t}"),
        }
    }
}

/// Why the head refused a MIG change, for a caller that acts on it (the message says the rest).
/// Sent beside the error's text (the `escher-mig-refusal` metadata entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MigRefusal {
    /// The node is not live, or is draining.
    NodeUnavailable,
    /// The node has no GPU with that index.
    NoSuchGpu,
    /// The GPU cannot be partitioned (no MIG table, or not in MIG mode).
    NotPartitionable,
    /// The layout or instance is not legal for the GPU's model (unknown profile, start not
    /// allowed, too many instances, not enough compute or memory).
    Illegal,
    /// The instance to create overlaps one the GPU has.
    Overlap,
    /// The instance to destroy is not on the GPU.
    NoSuchInstance,
    /// An instance the change destroys may be in use (ask to drain, or wait).
    Busy,
    /// Another reconfiguration of the GPU is under way (wait for it).
    InProgress,
}

impl MigRefusal {
    /// The name sent on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            MigRefusal::NodeUnavailable => "node-unavailable",
            MigRefusal::NoSuchGpu => "no-such-gpu",
            MigRefusal::NotPartitionable => "not-partitionable",
            MigRefusal::Illegal => "illegal",
            MigRefusal::Overlap => "overlap",
            MigRefusal::NoSuchInstance => "no-such-instance",
            MigRefusal::Busy => "busy",
            MigRefusal::InProgress => "in-progress",
        }
    }

    /// Reads a name sent on the wire; `None` for one this version does not know.
    pub fn parse(text: &str) -> Option<MigRefusal> {
        [
            MigRefusal::NodeUnavailable,
            MigRefusal::NoSuchGpu,
            MigRefusal::NotPartitionable,
            MigRefusal::Illegal,
            MigRefusal::Overlap,
            MigRefusal::NoSuchInstance,
            MigRefusal::Busy,
            MigRefusal::InProgress,
        ]
        .into_iter()
        .find(|r| r.as_str() == text)
    }

    /// Whether the same change may be taken later without anything else changing first (a
    /// slice still held, another reconfiguration under way).
    pub fn passes(self) -> bool {
        matches!(self, MigRefusal::Busy | MigRefusal::InProgress)
    }
}

/// The metadata entry of an error status that carries a [`MigRefusal`].
pub const MIG_REFUSAL_METADATA: &str = "escher-mig-refusal";

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

/// Which GPU a finished MIG reconfiguration was for, whether it failed, and what each phase
/// took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigDone {
    /// The GPU index.
    pub gpu: u32,
    /// Why it failed; `None` on success.
    pub error: Option<String>,
    /// What each phase took (what was done before a failure); boxed to keep the worker's
    /// messages small.
    pub phases: Box<ReconfigurationCost>,
}
