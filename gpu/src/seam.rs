//! The seam between the GPU policies and a GPU: what a policy sees ([`GpuView`]: the model,
//! the legal layout, and each instance's state and holder), what it asks for ([`Command`]:
//! create or destroy one instance, launch a task on an instance, stop a task, bind or drain
//! an inference replica), and what it hears back ([`Event`]).
//!
//! Policies are pure (`on_event` in, commands out; see [`GpuPolicy`](super::GpuPolicy)); a
//! GPU carries the commands out. Two do: the in-memory [`SimGpu`](super::SimGpu) (a
//! [`GpuSeam`]), a fake at this seam for unit tests and for the reproductions, and one GPU of
//! a real cluster, [`ClusterGpu`](super::ClusterGpu), through the cluster API (slice
//! geometry from `ClusterApi::gpus`, layouts through `change_mig`, tasks through `requeue`,
//! task telemetry, inference replicas as tasks on slices).
//!
//! A task keeps its [`TaskId`] across restarts: launching a task that ran before is a new
//! attempt of the same task (MIGM's OOM restart and early restart), never a new task.

use std::collections::BTreeMap;
use std::fmt;

use escher_proto::mig::{GpuModel, Layout, Placement};
use escher_proto::types::TaskId;
use thiserror::Error;

/// What an instance is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceState {
    /// Created and ready, running nothing.
    Idle,
    /// Running this task (a batch job, a retraining task or an inference replica).
    Busy(TaskId),
    /// Being created (GPU instance, compute instance, libraries, model), ready at `ready_at`
    /// (milliseconds of the seam's clock).
    Creating {
        /// When it becomes [`InstanceState::Idle`].
        ready_at: u64,
    },
    /// An inference replica that takes no new requests and finishes those it holds; it
    /// becomes [`InstanceState::Idle`] when they are done.
    Draining(TaskId),
}

/// One MIG instance and its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Instance {
    /// Where it is.
    pub placement: Placement,
    /// What it does.
    pub state: InstanceState,
}

/// A GPU as a policy sees it: a legal layout and the state of each of its instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuView {
    /// The instances, by start (the same placements as `layout`).
    pub instances: Vec<Instance>,
    /// The layout of every instance, ready or not.
    pub layout: Layout,
}

impl GpuView {
    /// The GPU model.
    pub fn model(&self) -> GpuModel {
        self.layout.model()
    }

    /// The instance starting at `start`.
    pub fn at(&self, start: u8) -> Option<&Instance> {
        self.instances.iter().find(|i| i.placement.start == start)
    }

    /// The idle instances, by start.
    pub fn idle(&self) -> impl Iterator<Item = Placement> + '_ {
        self.instances
            .iter()
            .filter(|i| i.state == InstanceState::Idle)
            .map(|i| i.placement)
    }

    /// The instances `task` holds (busy or draining), by start.
    pub fn held_by(&self, task: TaskId) -> Vec<Placement> {
        self.instances
            .iter()
            .filter(|i| {
                matches!(i.state, InstanceState::Busy(t) | InstanceState::Draining(t) if t == task)
            })
            .map(|i| i.placement)
            .collect()
    }

    /// Whether any instance is busy, draining or being created.
    pub fn is_active(&self) -> bool {
        self.instances
            .iter()
            .any(|i| i.state != InstanceState::Idle)
    }
}

/// What a policy asks of a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Create one instance at this placement (legal next to the current layout); it is
    /// [`InstanceState::Creating`] until ready.
    Create(Placement),
    /// Destroy one idle instance.
    Destroy(Placement),
    /// Run a task on an idle instance. A task that ran before starts a new attempt with the
    /// same id, from the beginning (no checkpoint, as MIGM's quick restarts).
    Launch {
        /// The task.
        task: TaskId,
        /// Its instance.
        on: Placement,
    },
    /// Kill a running task (its instances become idle); the policy launches it again later.
    Stop(TaskId),
    /// Add an idle instance to an inference task's replicas: it serves that task's requests.
    Bind {
        /// The inference task.
        task: TaskId,
        /// The instance.
        on: Placement,
    },
    /// Stop routing new requests to one of an inference task's replicas; it finishes those it
    /// holds, then becomes idle (drain-before-destroy).
    Drain {
        /// The inference task.
        task: TaskId,
        /// The instance.
        on: Placement,
    },
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Command::Create(p) => write!(f, "create {p}"),
            Command::Destroy(p) => write!(f, "destroy {p}"),
            Command::Launch { task, on } => write!(f, "launch {task} on {on}"),
            Command::Stop(task) => write!(f, "stop {task}"),
            Command::Bind { task, on } => write!(f, "bind {task} to {on}"),
            Command::Drain { task, on } => write!(f, "drain {task} from {on}"),
        }
    }
}

/// What a GPU tells a policy.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Time passed (a periodic tick; policies with timed plans act on it).
    Tick,
    /// An instance finished being created and is idle.
    Ready(Placement),
    /// A task finished successfully; its instance is idle.
    Finished(TaskId),
    /// A task exceeded its instance's memory and failed; its instance is idle.
    OutOfMemory {
        /// The task.
        task: TaskId,
        /// The memory it tried to use, GB.
        used_gb: f64,
        /// Its instance's memory, GB.
        limit_gb: f64,
    },
    /// A running task reported a sample (per iteration: `iteration`, `mem_requested_gb`,
    /// `reuse_ratio`, ...), as the task-telemetry contract's `TelemetrySample::values`.
    Telemetry {
        /// The task.
        task: TaskId,
        /// The values.
        values: BTreeMap<String, f64>,
    },
    /// An inference replica finished draining; its instance is idle.
    Drained(Placement),
}

/// Why a GPU refused a command. A refused command changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SeamError {
    /// The placement cannot join the layout (overlap, illegal start, no room).
    #[error("cannot create {placement}: {reason}")]
    Illegal {
        /// The placement.
        placement: Placement,
        /// The MIG model's reason.
        reason: String,
    },
    /// The instance is not in the layout.
    #[error("no instance {0} on the GPU")]
    NoInstance(Placement),
    /// The instance is busy, draining or being created.
    #[error("instance {placement} is not idle ({state:?}); drain or stop its task first")]
    Busy {
        /// The placement.
        placement: Placement,
        /// What it is doing.
        state: InstanceState,
    },
    /// The task is unknown to the GPU, or not in a state the command needs.
    #[error("task {task}: {reason}")]
    Task {
        /// The task.
        task: TaskId,
        /// What was wrong.
        reason: String,
    },
}

/// A GPU that carries out a policy's commands.
pub trait GpuSeam {
    /// The GPU now.
    fn view(&self) -> GpuView;

    /// Carries out one command; a refused command changes nothing.
    fn execute(&mut self, command: Command) -> Result<(), SeamError>;
}
