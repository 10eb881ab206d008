//! The commands that change the head's state, and the effects applying them asks for.

use escher_proto::types::{Assignment, ObjectId, RequestKey, SealedCopy, TaskFinished};
use escher_proto::types::{
    DeviceHold, GangStrategy, GpuInfo, Grant, Labels, MigChange, MigDone, MigPlan, Namespace,
    NodeId, ResourceName, ResourceSet, ResourceUpdate, TaskId, TaskSpec, TaskStatus, TokenInfo,
};
use serde::{Deserialize, Serialize};

use super::nodes::{Joining, Returning, SecretHash};
use super::tokens::TokenHash;
use crate::scheduler::Millis;

/// A command with the time the leader accepted it; replicas apply the same `now`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Milliseconds since the Unix epoch when the leader accepted the command.
    pub now: Millis,
    /// What to do.
    pub command: Command,
    /// The client's idempotency key: a write seen before is answered with its recorded reply
    /// instead of applied again (see `sessions.rs`).
    pub key: Option<RequestKey>,
}

impl Entry {
    /// An entry without an idempotency key.
    pub fn new(now: Millis, command: Command) -> Entry {
        Entry {
            now,
            command,
            key: None,
        }
    }
}

/// Every way the head's state can change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// A worker joins for the first time: it gets a new node id, never one used before.
    RegisterNode {
        /// What it has.
        worker: Joining,
        /// The hash of the secret the leader gave it.
        secret: SecretHash,
    },
    /// A worker comes back with the node id and secret of its first registration (see
    /// `nodes.rs`): refused if the secret does not match.
    RejoinNode {
        /// What it has now.
        worker: Joining,
        /// Who it says it is, what it runs and what it finished.
        back: Returning,
    },
    /// Names this cluster state, once: the first leader of a new group proposes it. Node
    /// identities are only valid in the cluster that issued them. Applied again, it changes
    /// nothing.
    Init {
        /// A random id, as text.
        cluster_id: String,
        /// A random key, as text: it signs task credentials (docs/DESIGN.md §10).
        task_key: String,
    },
    /// `escher token create`: a token, by its hash.
    CreateToken {
        /// The token's SHA-256 (the leader drew the token; only the hash is replicated).
        hash: TokenHash,
        /// What it allows.
        grant: Grant,
        /// Its creator's note.
        description: String,
    },
    /// `escher token revoke`.
    RevokeToken {
        /// The token's id.
        id: String,
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
        /// The running task (and its attempt) that called, which gives `Local` its node.
        caller_task: Option<(TaskId, u32)>,
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
    /// Change the MIG instances of one GPU of a node: a whole layout, one instance, or the
    /// steps toward a layout that leave busy instances alone (`gpus.rs`).
    ApplyMigLayout {
        /// The node.
        node: NodeId,
        /// The GPU's index.
        gpu: u32,
        /// What to change; its text is read for the GPU's model.
        change: MigChange,
        /// Wait for busy slices to drain instead of refusing.
        drain: bool,
    },
    /// Run a pending or running task again under its id with other resources (`requeue.rs`).
    Requeue {
        /// The task.
        task: TaskId,
        /// Its resources from now on, as the caller names them.
        resources: ResourceSet,
    },
    /// Never give out the next `count` task ids and node ids: a replica recovered a log whose
    /// last write was damaged after it was written whole (it may have been acknowledged, with
    /// ids that the lost records gave out), and it leads.
    SkipIds {
        /// How many ids of each kind to skip: at least as many as the lost records could hold.
        count: u64,
        /// Why, for the log.
        why: String,
    },
    /// [`RegisterNode`](Command::RegisterNode), the node taking no task until its worker's
    /// stream attaches ([`NodeAttached`](Command::NodeAttached)); see `nodes.rs`. Data format 3
    /// on (a group that writes an older one registers with `RegisterNode`).
    RegisterNodeUnattached {
        /// What it has.
        worker: Joining,
        /// The hash of the secret the leader gave it.
        secret: SecretHash,
    },
    /// [`RejoinNode`](Command::RejoinNode), a worker that lost its tasks taking none until its
    /// stream attaches. Data format 3 on.
    RejoinNodeUnattached {
        /// What it has now.
        worker: Joining,
        /// Who it says it is, what it runs and what it finished.
        back: Returning,
    },
    /// The leader holds the stream of a live node's worker: a node that waited for it takes
    /// tasks from now on. Data format 3 on.
    NodeAttached {
        /// The node.
        node: NodeId,
        /// The boot id of the registration the stream belongs to: a stream of an earlier
        /// process changes nothing.
        boot: u64,
    },
    /// Sets and removes labels of a live node, all or none (`escher node label`); with `drain`,
    /// drains it too (a walltime about to end: the owner proposes it with
    /// `escher.ending-soon=true`). Labels set here outlive the worker's reconnections (see
    /// `nodes.rs`). Data format 4 on.
    LabelNode {
        /// The node.
        node: NodeId,
        /// Labels to add or replace.
        set: Labels,
        /// Keys to remove.
        remove: Vec<String>,
        /// Whether to drain the node as well.
        drain: bool,
    },
    /// Nodes sealed these copies of objects in their stores (`objects.rs`). Data format 5 on.
    ObjectsSealed {
        /// The copies.
        copies: Vec<SealedCopy>,
    },
    /// The owner let go of these objects: they leave the table, their holders delete their
    /// copies. Data format 5 on.
    ObjectsReleased {
        /// The objects.
        ids: Vec<ObjectId>,
        /// The caller's namespace: another namespace's objects are not its to release.
        namespace: Option<Namespace>,
        /// Whether the caller is an admin, who may release any namespace's objects.
        sees_everything: bool,
    },
    /// A client's number for naming the objects it puts (`(session, sequence)`), never given
    /// out before. Data format 5 on.
    OpenObjectSession,
    /// A client that acts on the cluster (an autoscaler) decided something: recorded as a
    /// [`ClusterEvent::Decision`](escher_proto::types::ClusterEvent::Decision) for watchers,
    /// nothing else changes. Data format 6 on.
    RecordDecision {
        /// Who decided (`autoscaler/GROUP`).
        source: String,
        /// What, in one word.
        action: String,
        /// Why.
        reason: String,
    },
    /// Object session `session` ended: every object it owns that the caller may see leaves
    /// the table (as `ObjectsReleased` would release it), except those a pending or running
    /// task takes as an argument, which stay until that task ends. Sent by a client that
    /// closes, and by the leader for a session that lapsed (`objects.rs`). Data format 8 on.
    CloseObjectSession {
        /// The session.
        session: u64,
        /// The caller's namespace: another namespace's objects stay.
        namespace: Option<Namespace>,
        /// Whether the caller is an admin (or the leader), who releases every namespace's.
        sees_everything: bool,
    },
    /// [`RemoveNode`](Command::RemoveNode), judged on one registration of the node: the
    /// leader declared it lost (or its drained worker left) while `registration` was the
    /// node's registration (`registrations.rs`). Applied after the node registered again it
    /// changes nothing, so a late removal never fails the tasks of a registration it did not
    /// judge. Data format 9 on (a group that writes an older one removes with `RemoveNode`).
    RemoveJudgedNode {
        /// The node.
        node: NodeId,
        /// The number of the registration judged (none: a registration that had none).
        registration: Option<u64>,
        /// Why, for the tasks that were running there.
        reason: String,
    },
    /// [`Submit`](Command::Submit) from inside running task `parent` (the caller carried its
    /// credential): the tasks are recorded as its children (`lineage.rs`). Data format 11 on
    /// (a group that writes an older one submits with `Submit`, recording no parent).
    SubmitChildren {
        /// Their specs, as the client sent them.
        tasks: Vec<TaskSpec>,
        /// The application's namespace for unqualified resource names.
        namespace: Option<Namespace>,
        /// The running task that submitted them, from the caller's credential.
        parent: TaskId,
    },
    /// [`Cancel`](Command::Cancel), with its options: `recursive` cancels every recorded
    /// descendant of the tasks that has not ended as well (one entry: never half a tree);
    /// `force` kills a running command task at once, without its SIGTERM grace. Data format
    /// 11 on (a group that writes an older one cancels with `Cancel`, and refuses `force`).
    CancelTasks {
        /// The tasks.
        tasks: Vec<TaskId>,
        /// Whether their descendants are cancelled too.
        recursive: bool,
        /// Whether running commands are killed at once (SIGKILL) instead of asked to stop.
        force: bool,
    },
}

impl Command {
    /// What the command is called in metrics (`submit`, `task_finished` ...).
    pub fn name(&self) -> &'static str {
        match self {
            Command::RegisterNode { .. } => "register_node",
            Command::RejoinNode { .. } => "rejoin_node",
            Command::Init { .. } => "init",
            Command::CreateToken { .. } => "create_token",
            Command::RevokeToken { .. } => "revoke_token",
            Command::RemoveNode { .. } => "remove_node",
            Command::DrainNode { .. } => "drain_node",
            Command::Submit { .. } => "submit",
            Command::SetResources { .. } => "set_resources",
            Command::Reserve { .. } => "reserve",
            Command::TaskStarted { .. } => "task_started",
            Command::TaskFinished { .. } => "task_finished",
            Command::Cancel { .. } => "cancel",
            Command::Tick => "tick",
            Command::TaskDevices { .. } => "task_devices",
            Command::GpusChanged { .. } => "gpus_changed",
            Command::ApplyMigLayout { .. } => "apply_mig_layout",
            Command::Requeue { .. } => "requeue",
            Command::SkipIds { .. } => "skip_ids",
            Command::RegisterNodeUnattached { .. } => "register_node_unattached",
            Command::RejoinNodeUnattached { .. } => "rejoin_node_unattached",
            Command::NodeAttached { .. } => "node_attached",
            Command::LabelNode { .. } => "label_node",
            Command::ObjectsSealed { .. } => "objects_sealed",
            Command::ObjectsReleased { .. } => "objects_released",
            Command::OpenObjectSession => "open_object_session",
            Command::RecordDecision { .. } => "record_decision",
            Command::CloseObjectSession { .. } => "close_object_session",
            Command::RemoveJudgedNode { .. } => "remove_judged_node",
            Command::SubmitChildren { .. } => "submit_children",
            Command::CancelTasks { .. } => "cancel_tasks",
        }
    }
}

/// What applying a command returns to its caller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// The task's status after a requeue.
    Requeued(TaskStatus),
    /// What a MIG layout change does (it goes on in the background).
    MigPlan(MigPlan),
    /// A token created or revoked.
    Token(TokenInfo),
    /// Nothing to report.
    Done,
    // Replies are kept in snapshots (the idempotency window, `sessions.rs`): a new variant goes
    // last, so that the ones before keep their encoding.
    /// A node's labels after a change.
    Labels(Labels),
    /// The sealed copies that were not recorded, with why (their nodes should delete them).
    ObjectsSealed(Vec<(ObjectId, String)>),
    /// The released ids the caller could not see (never known, forgotten, or another
    /// namespace's).
    ObjectsReleased(Vec<ObjectId>),
    /// A new object session number.
    ObjectSession(u64),
    /// What closing an object session did.
    ObjectSessionClosed {
        /// The objects released.
        released: Vec<ObjectId>,
        /// The objects kept because a pending or running task takes them as an argument.
        pinned: Vec<ObjectId>,
    },
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
        /// Kill it at once (SIGKILL for a command), without the grace a stop gives.
        force: bool,
    },
    /// A worker came back (`RejoinNode`): what was queued for it before is superseded by the
    /// effects that follow (re-sent assignments and cancellations).
    Rejoined {
        /// The node.
        node: NodeId,
    },
    /// A task reached a terminal state: wake whoever waits for it. Retention keeps its record
    /// at least until the next entry is applied; a cycle may apply several, so the replication
    /// layer takes the task's status right after the command that finished it.
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
    /// Tell the node's worker to delete its copies of these objects (they were released).
    DeleteObjects {
        /// The node.
        node: NodeId,
        /// The objects.
        ids: Vec<ObjectId>,
    },
}
