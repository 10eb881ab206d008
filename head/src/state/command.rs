//! The commands that change the head's state, and the effects applying them asks for.

use escher_proto::types::{Assignment, TaskFinished};
use escher_proto::types::{
    DeviceHold, GangStrategy, GpuInfo, Labels, MigDone, MigPlan, Namespace, NodeId, ResourceName,
    ResourceSet, ResourceUpdate, TaskId, TaskSpec, TaskStatus,
};
use serde::{Deserialize, Serialize};

use crate::scheduler::Millis;

/// A command with the time the leader accepted it; replicas apply the same `now`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Milliseconds since the Unix epoch when the leader accepted the command.
    pub now: Millis,
    /// What to do.
    pub command: Command,
}

/// Every way the head's state can change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// A worker joins. With `previous` still live, it keeps that id (a reconnect); otherwise
    /// it gets a new id, never `previous` itself.
    RegisterNode {
        /// Its name.
        name: String,
        /// Its address, for people.
        address: String,
        /// Its physical and static resources.
        resources: ResourceSet,
        /// Its labels.
        labels: Labels,
        /// The id it had before, if it is reconnecting (as the worker says: live or not).
        previous: Option<NodeId>,
    },
    /// A worker left or stopped sending heartbeats.
    RemoveNode {
        /// The node.
        node: NodeId,
        /// Why, for the tasks that were running there.
        reason: String,
    },
    /// A worker is shutting down: admit nothing new there; running tasks finish.
    DrainNode {
        /// The node.
        node: NodeId,
    },
    /// Tasks to run.
    Submit {
        /// Their specs, as the client sent them.
        tasks: Vec<TaskSpec>,
        /// The application's namespace for unqualified resource names.
        namespace: Option<Namespace>,
    },
    /// `set_resource` calls, applied all or none.
    SetResources {
        /// The changes, in order.
        updates: Vec<ResourceUpdate>,
        /// The application's namespace.
        namespace: Option<Namespace>,
        /// The running task that called, which gives `Local` its node.
        caller_task: Option<TaskId>,
    },
    /// An all-or-nothing reservation of bundles (head-native gang scheduling). Each bundle is
    /// held by a native ghost: no worker runs anything, the head creates the gang's resources.
    Reserve {
        /// The reservation's name; its resources are `NAME.RES` and `NAME-I.RES`.
        name: ResourceName,
        /// What each bundle holds.
        bundles: Vec<ResourceSet>,
        /// How bundles may share nodes.
        strategy: GangStrategy,
        /// Give up if not placed within this long.
        timeout: Option<std::time::Duration>,
        /// The application's namespace.
        namespace: Option<Namespace>,
    },
    /// A worker started a task.
    TaskStarted {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: u32,
    },
    /// A worker finished a task.
    TaskFinished(TaskFinished),
    /// Withdraw tasks.
    Cancel {
        /// The tasks.
        tasks: Vec<TaskId>,
    },
    /// Time passed (expires pending deadlines).
    Tick,
    /// A worker gave a task's attempt these devices (GPUs, MIG slices).
    TaskDevices {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: u32,
        /// The devices, with how much of each.
        devices: Vec<DeviceHold>,
    },
    /// A worker reports its GPUs as they are now (after attaching, after a reconfiguration).
    GpusChanged {
        /// The node.
        node: NodeId,
        /// Every GPU of the node.
        gpus: Vec<GpuInfo>,
        /// The reconfiguration this report ends, if any.
        done: Option<MigDone>,
    },
    /// Change the MIG layout of one GPU of a node.
    ApplyMigLayout {
        /// The node.
        node: NodeId,
        /// The GPU's index.
        gpu: u32,
        /// The layout text, read for the GPU's model.
        layout: String,
        /// Wait for busy slices to drain instead of refusing.
        drain: bool,
    },
}

/// What applying a command returns to its caller.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// The node id of a registered worker.
    Registered(NodeId),
    /// The ids of submitted tasks, in order.
    Submitted(Vec<TaskId>),
    /// A reservation's bundle holders, in bundle order, and whether it is placed already.
    Reserved {
        /// One native ghost per bundle.
        tasks: Vec<TaskId>,
        /// Whether every bundle was placed by this very command.
        placed: bool,
    },
    /// For each update, the nodes it changed.
    ResourcesSet(Vec<Vec<NodeId>>),
    /// The tasks' statuses after a cancel.
    Cancelled(Vec<TaskStatus>),
    /// What a MIG layout change does (it goes on in the background).
    MigPlan(MigPlan),
    /// Nothing to report.
    Done,
}

/// Work for the runtime that applying a command asked for. Only the leader performs them.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Send this assignment to the node's worker.
    Assign {
        /// The node.
        node: NodeId,
        /// What to run.
        assignment: Box<Assignment>,
    },
    /// Tell the node's worker to stop a task.
    Cancel {
        /// The node.
        node: NodeId,
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: u32,
        /// Why.
        reason: String,
    },
    /// A task reached a terminal state: wake whoever waits for it. Retention keeps its record
    /// at least until the next entry is applied, so the runtime still finds it here.
    Terminal {
        /// The task.
        task: TaskId,
    },
    /// Tell the node's worker to change a GPU's MIG layout.
    ReconfigureMig {
        /// The node.
        node: NodeId,
        /// The GPU index.
        gpu: u32,
        /// The layout, explicit form.
        layout: String,
    },
}
