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

/// Who a worker is: what its first registration with a head group gave it. The worker keeps it
/// (in its state directory) and presents it at every later registration.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeIdentity {
    /// Its node id.
    pub node_id: NodeId,
    /// The secret that came with the id; the head keeps only its hash.
    pub secret: String,
    /// The id of the head group that issued them.
    pub group: String,
}

impl std::fmt::Debug for NodeIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret stays out of logs.
        f.debug_struct("NodeIdentity")
            .field("node_id", &self.node_id)
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
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
    /// The tasks it is running now.
    pub running: Vec<RunningTask>,
    /// Its GPUs, by index (their resources are among `resources`).
    pub gpus: Vec<GpuInfo>,
    /// Reports of ended tasks that no head has acknowledged yet.
    pub finished: Vec<TaskFinished>,
    /// The identity of its first registration; `None` when it joins for the first time.
    pub identity: Option<NodeIdentity>,
    /// Chosen at random when the worker process started: another value means a restarted
    /// worker, whose earlier tasks were lost.
    pub boot_id: u64,
}

/// The head accepts a worker.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterReply {
    /// The worker's node id.
    pub node_id: NodeId,
    /// How often to send a heartbeat (whole milliseconds on the wire).
    pub heartbeat_interval: Duration,
    /// After how long without a heartbeat the head declares the node lost; `None` if the head
    /// did not say.
    pub heartbeat_timeout: Option<Duration>,
    /// The node's secret, only when this registration made a new node.
    pub secret: Option<String>,
    /// The head group's id.
    pub group: String,
    /// Which life of the cluster the head's state is in (`RegisterReply.incarnation`): 0 until
    /// it is first restored from a backup.
    pub incarnation: u64,
}

impl std::fmt::Debug for RegisterReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisterReply")
            .field("node_id", &self.node_id)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("new_secret", &self.secret.is_some())
            .field("group", &self.group)
            .field("incarnation", &self.incarnation)
            .finish()
    }
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
    /// The end of a command's output (the head keeps it, so it outlives the worker); `None`
    /// for functions, ghosts and commands that never started.
    pub output: Option<OutputTail>,
}

/// The most bytes of each output stream an [`OutputTail`] carries: the last 4 KiB.
pub const OUTPUT_TAIL_BYTES: usize = 4096;

/// The last bytes (at most [`OUTPUT_TAIL_BYTES`]) of a command attempt's stdout and stderr,
/// and how long each stream was in all, so that a reader knows at which offset the tail
/// starts and how much of the stream it lacks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputTail {
    /// The last bytes of stdout.
    pub stdout: Vec<u8>,
    /// The last bytes of stderr.
    pub stderr: Vec<u8>,
    /// How many bytes the attempt wrote to stdout.
    pub stdout_len: u64,
    /// How many bytes the attempt wrote to stderr.
    pub stderr_len: u64,
}

impl OutputTail {
    /// One stream's kept bytes and its whole length.
    pub fn stream(&self, stream: LogStream) -> (&[u8], u64) {
        match stream {
            LogStream::Stdout => (&self.stdout, self.stdout_len),
            LogStream::Stderr => (&self.stderr, self.stderr_len),
        }
    }
}

/// What a worker sends on its stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WorkerMessage {
    /// The first message: which node this stream belongs to.
    Hello {
        /// The node id from [`RegisterReply`].
        node_id: NodeId,
        /// The node's secret.
        secret: String,
        /// The worker reads resource names by number, sent once per stream
        /// ([`LinkDecoder`](crate::convert::LinkDecoder)).
        interned_names: bool,
    },
    /// The worker is alive.
    Heartbeat {
        /// Live figures (may be empty).
        metrics: Vec<Metric>,
        /// Numbers the heartbeat for [`HeadMessage::LeaseRenewed`] (from 1 on each stream; 0
        /// asks for no lease).
        seq: u64,
        /// What happened to the worker's fence supervisor, if anything (`Heartbeat.fence`).
        fence: Option<String>,
        /// The actor incarnations the worker hosts and the calls waiting at each.
        actors: Vec<crate::types::ActorLoad>,
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
    /// Copies the node's object store holds: sent after each attach, in batches of at most
    /// [`MAX_HELD_BATCH`], so that the head adopts those its table still wants and answers
    /// [`HeadMessage::DropCopies`] for the rest.
    ObjectsHeld(Vec<super::HeldCopy>),
}

/// The most copies one [`WorkerMessage::ObjectsHeld`] carries (about 40 KiB on the wire).
pub const MAX_HELD_BATCH: usize = 1024;

impl WorkerMessage {
    /// The task attempt a report is about (`TaskStarted`, `TaskFinished`, `TaskDevices`).
    pub fn task_attempt(&self) -> Option<(TaskId, u32)> {
        match self {
            WorkerMessage::TaskStarted { task_id, attempt }
            | WorkerMessage::TaskDevices {
                task_id, attempt, ..
            } => Some((*task_id, *attempt)),
            WorkerMessage::TaskFinished(report) => Some((report.task_id, report.attempt)),
            _ => None,
        }
    }
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
    /// The task's credential for this attempt (`ESCHER_TASK_TOKEN`); the leader signs it when
    /// it sends the assignment, so the replicated state never holds it (empty there).
    pub task_token: String,
    /// The task's object arguments (its [`OBJECTS_LABEL`](super::OBJECTS_LABEL)) as
    /// `LocateObject` answers them for the task's credential, each holder with its data
    /// address and a read ticket: filled by the leader when it sends the assignment (empty in
    /// the replicated state, as the credential is). An argument missing here the worker
    /// locates itself.
    pub objects: Vec<super::ObjectView>,
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
        /// Kill it at once (SIGKILL to a command), without the grace a stop gives.
        #[serde(default)]
        force: bool,
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
        /// The attempt whose output to read.
        attempt: u32,
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
    /// The head committed these task reports: the worker may forget them.
    ReportsAcked(Vec<RunningTask>),
    /// The leading replica heard heartbeat `seq` on this stream: the worker's lease runs for a
    /// lease period from when it sent that heartbeat (DESIGN §13).
    LeaseRenewed {
        /// The heartbeat's number.
        seq: u64,
    },
    /// Delete this node's copies of these objects: their owner released them.
    DeleteObjects(Vec<super::ObjectId>),
    /// Delete these copies the worker reported held ([`WorkerMessage::ObjectsHeld`]), each
    /// only if the store still holds that very copy: the head's table does not count them.
    DropCopies(Vec<super::DroppedHeld>),
}

impl HeadMessage {
    /// About how many bytes this message takes while it waits to be sent: an assignment its
    /// spec's [`TaskSpec::stored_bytes`](super::TaskSpec::stored_bytes) and its objects'
    /// holders, anything else a small fixed amount. What bounds a worker's outbox in bytes.
    pub fn queued_bytes(&self) -> u64 {
        match self {
            HeadMessage::Assign(a) => {
                let holders = a.objects.iter().flat_map(|o| &o.holders);
                let objects = a.objects.len() as u64 * 64
                    + holders
                        .map(|h| {
                            let address = h.address.as_ref().map_or(0, String::len);
                            let ticket = h.ticket.as_ref().map_or(0, String::len);
                            (16 + address + ticket) as u64
                        })
                        .sum::<u64>();
                a.spec.stored_bytes() + 64 + objects
            }
            _ => 128,
        }
    }
}
