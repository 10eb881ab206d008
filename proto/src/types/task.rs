//! What a task is: its kind, its requirements, its hooks and its life cycle.

use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{
    ActorSpec, Capacity, CapacityOp, Labels, NodeId, NodeSpec, ResourceName, ResourceSet, TaskId,
};

/// The longest task name, in bytes.
pub const MAX_TASK_NAME_BYTES: usize = 256;
/// The most argv entries of a command task.
pub const MAX_ARGV: usize = 4096;
/// The most environment variables of a command task.
pub const MAX_ENV: usize = 4096;
/// The longest function name (and worker name), in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// The most entries of one resource set (requirements, ghost creations, allocations).
pub const MAX_RESOURCES: usize = 4096;
/// The most resource updates in one task hook (`on_start`, `on_success`).
pub const MAX_HOOK_UPDATES: usize = 4096;

/// Everything the head needs to run a task. Built with the client's builders.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskSpec {
    /// A human-readable name (not unique), at most 256 bytes.
    pub name: String,
    /// What runs.
    pub kind: TaskKind,
    /// What the task holds while it runs.
    pub resources: ResourceSet,
    /// Free-form labels shown by `tasks` and `status`.
    pub labels: Labels,
    /// How many more times to run it after a failure or a lost node.
    pub max_retries: u32,
    /// Running-time limit; the worker stops the task when it passes.
    pub timeout: Option<Duration>,
    /// How long the task may stay pending before it is failed with `pending deadline passed`.
    pub pending_deadline: Option<Duration>,
    /// Resource changes applied when the task starts (task signalling, P2).
    pub on_start: Vec<ResourceUpdate>,
    /// Resource changes applied when the task succeeds (task signalling, P2).
    pub on_success: Vec<ResourceUpdate>,
}

/// The four kinds of task (docs/DESIGN.md §4 and §17).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum TaskKind {
    /// A child process.
    Command {
        /// Program and arguments; `argv[0]` is looked up on `PATH`.
        argv: Vec<String>,
        /// Extra environment variables.
        env: Vec<(String, String)>,
        /// Working directory; the worker's own if absent.
        cwd: Option<String>,
    },
    /// A handler registered by name in a worker built with the worker library.
    Function {
        /// The registered name.
        name: String,
        /// Argument bytes (bincode for Rust types), shared by every copy of the spec.
        args: Bytes,
    },
    /// No process: holds its resources and, while it lives, the resources it creates on its
    /// node (the thesis' resource-locking primitive, P4).
    Ghost {
        /// Resources created on the ghost's node when it starts and removed when it ends.
        creates: Vec<(ResourceName, Capacity)>,
        /// End by itself after this long; `None` lives until cancelled or released.
        ttl: Option<Duration>,
    },
    /// An actor: an instance of a class a worker registered, that holds the task's resources
    /// from start to exit and answers method calls (see [`ActorSpec`]). Its incarnations are
    /// the task's attempts. Last of the variants: a data format written before actors existed
    /// reads the same.
    Actor(Box<ActorSpec>),
}

/// One change to one resource: the body of `set_resource`, and of task hooks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceUpdate {
    /// The resource.
    pub name: ResourceName,
    /// What to do to it.
    pub op: CapacityOp,
    /// Where. `Local` in a hook means the task's own node.
    pub target: NodeSpec,
}

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TaskState {
    /// Waiting for a node with its resources.
    Pending,
    /// Dispatched to a node.
    Running,
    /// Finished successfully.
    Succeeded,
    /// Finished unsuccessfully, and out of retries.
    Failed,
    /// Cancelled by a user, or its pending deadline passed.
    Cancelled,
}

impl TaskSpec {
    /// About how many bytes the head keeps for this spec: its strings, arguments, labels and
    /// hooks, plus a fixed allowance for the rest (its resources, which a requeue may change,
    /// are in the allowance: a spec's size never changes once submitted). What the per-task and per-namespace byte
    /// limits count (`--max-task-bytes`, `--namespace-spec-bytes`).
    pub fn stored_bytes(&self) -> u64 {
        const FIXED: usize = 256;
        let kind = match &self.kind {
            TaskKind::Command { argv, env, cwd } => {
                argv.iter().map(String::len).sum::<usize>()
                    + env.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
                    + cwd.as_ref().map_or(0, String::len)
            }
            TaskKind::Function { name, args } => name.len() + args.len(),
            TaskKind::Ghost { creates, .. } => {
                creates.iter().map(|(n, _)| n.as_str().len() + 16).sum()
            }
            TaskKind::Actor(actor) => {
                actor.class.len() + actor.args.len() + actor.name.as_ref().map_or(0, String::len)
            }
        };
        let labels: usize = self.labels.iter().map(|(k, v)| k.len() + v.len()).sum();
        let hooks: usize = self
            .on_start
            .iter()
            .chain(&self.on_success)
            .map(|h| h.name.as_str().len() + 32)
            .sum();
        (FIXED + self.name.len() + kind + labels + hooks) as u64
    }
}

impl TaskState {
    /// Whether the task will never change state again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Succeeded | TaskState::Failed | TaskState::Cancelled
        )
    }

    /// The lower-case name used by the CLI (`pending`, `running`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => "pending",
            TaskState::Running => "running",
            TaskState::Succeeded => "succeeded",
            TaskState::Failed => "failed",
            TaskState::Cancelled => "cancelled",
        }
    }
}

impl std::str::FromStr for TaskState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "pending" => TaskState::Pending,
            "running" => TaskState::Running,
            "succeeded" => TaskState::Succeeded,
            "failed" => TaskState::Failed,
            "cancelled" | "canceled" => TaskState::Cancelled,
            other => {
                return Err(format!(
                    "unknown task state {other:?}: expected pending, running, succeeded, \
                     failed or cancelled"
                ));
            }
        })
    }
}

impl std::fmt::Display for TaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A task's outcome once it has one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskResult {
    /// A command task exited; 0 is success.
    Exited {
        /// Process exit code, or `128 + signal` if it was killed by a signal.
        code: i32,
    },
    /// A function task returned these bytes (shared by every copy of the result).
    Returned(Bytes),
    /// A ghost task ended (released, TTL, or cancelled).
    Released,
    /// The task ran out of its GPU's or MIG slice's memory: a failure, reported by the
    /// simulated GPU (`escher sim-work`) or by a real task through its outcome file
    /// (`ESCHER_OUTCOME_FILE`). A policy that sees it can run the task again with a larger
    /// slice under the same id (`Client::requeue` reopens a failed task).
    OutOfMemory {
        /// MiB it was using or asking for when it ran out.
        used_mib: u64,
        /// MiB its device has.
        limit_mib: u64,
    },
    /// A function returned more than [`INLINE_RESULT_BYTES`](super::INLINE_RESULT_BYTES): the
    /// bytes stay in the store of the worker that made them as the object
    /// [`ObjectId::task_result`](super::ObjectId::task_result)`(task)`, and the head keeps this
    /// reference (and the copy in its object table). From data format 7.
    Object {
        /// Its length in bytes.
        size: u64,
        /// The CRC-32C (Castagnoli) of its bytes.
        checksum: u32,
    },
}

impl TaskResult {
    /// Whether this outcome is a success: exit code 0, a function's return, a ghost's end.
    pub fn is_success(&self) -> bool {
        match self {
            TaskResult::Exited { code } => *code == 0,
            TaskResult::Returned(_) | TaskResult::Released | TaskResult::Object { .. } => true,
            TaskResult::OutOfMemory { .. } => false,
        }
    }
}

impl std::fmt::Display for TaskResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TaskResult::Exited { code } => write!(f, "exit code {code}"),
            TaskResult::Returned(bytes) => write!(f, "returned {} bytes", bytes.len()),
            TaskResult::Released => f.write_str("released"),
            TaskResult::Object { size, checksum } => {
                write!(
                    f,
                    "returned an object of {size} bytes (CRC-32C {checksum:08x})"
                )
            }
            TaskResult::OutOfMemory {
                used_mib,
                limit_mib,
            } => write!(
                f,
                "out of GPU memory ({used_mib} MiB needed, {limit_mib} MiB on its device)"
            ),
        }
    }
}

/// Where a task is and why, as the API reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskStatus {
    /// The task.
    pub id: TaskId,
    /// Its state.
    pub state: TaskState,
    /// The node it runs or ran on (its latest attempt).
    pub node: Option<NodeId>,
    /// Which attempt this is, from 1.
    pub attempt: u32,
    /// Why it is pending (infeasible now), or why it failed or was cancelled.
    pub reason: Option<String>,
    /// Its result once it finished.
    pub result: Option<TaskResult>,
    /// Retention dropped its record and this status comes from its tombstone: `state` is its
    /// final state; node, attempt, reason and result are no longer known (docs/DESIGN.md §7).
    pub evicted: bool,
    /// When it reached its final state, in milliseconds since the Unix epoch, once it has.
    pub finished_at_ms: Option<u64>,
    /// Its hooks (on start, on success) that could not be applied, oldest first, the last
    /// [`MAX_HOOK_ERRORS`] kept: a hook is a signal, so its failure does not fail the task,
    /// but the task's status says so.
    pub hook_errors: Vec<String>,
}

/// How many hook failures a task's status keeps.
pub const MAX_HOOK_ERRORS: usize = 4;
