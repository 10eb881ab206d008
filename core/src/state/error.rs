//! Why the head refused a command. A refused command changes nothing.

use escher_proto::mig::{GpuModel, MigError};
use escher_proto::types::{
    Evicted, MigRefusal, Namespace, NodeId, ObjectId, ResourceName, TaskId, TaskState,
};
use thiserror::Error;

use crate::scheduler::CoreError;

/// A command the head refused; the state is exactly as before it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ApplyError {
    /// No token has this id.
    #[error("unknown token {0}; `escher token list` shows the ids")]
    UnknownToken(String),
    /// A token with this id exists already.
    #[error("a token with id {0} exists already")]
    TokenExists(String),
    /// The token table is full.
    #[error("the cluster keeps at most {0} tokens; revoked ones count too")]
    TooManyTokens(usize),
    /// A batch would take a namespace past its unfinished-task quota; nothing was accepted.
    #[error(
        "namespace {namespace} has {unfinished} unfinished tasks and the batch adds {asked}, \
         past its quota of {limit}; wait for tasks to finish (or cancel some) and submit again, \
         or ask the operator to raise escher-head --namespace-unfinished-tasks"
    )]
    QuotaExceeded {
        /// The namespace.
        namespace: Namespace,
        /// Its unfinished tasks now.
        unfinished: u64,
        /// Tasks in the refused batch.
        asked: usize,
        /// The quota.
        limit: u64,
    },
    /// An actor of a batch asks for a name a live actor of its namespace has; nothing was
    /// accepted.
    #[error(
        "the actor name {name:?} is taken in this namespace by actor {holder} (live actors' names \
         are unique per namespace); find it with get_actor, kill it first, or choose another name"
    )]
    ActorNameTaken {
        /// The name.
        name: String,
        /// The live actor that has it.
        holder: TaskId,
    },
    /// One task of a batch is larger than a task may be; nothing was accepted.
    #[error(
        "task {index} of the batch takes {bytes} bytes (its command, arguments, environment and \
         labels), past the limit of {limit} per task; pass large data another way (a file, a \
         store), or ask the operator to raise escher-head --max-task-bytes"
    )]
    TaskTooLarge {
        /// Its index in the batch.
        index: usize,
        /// Its size, as [`TaskSpec::stored_bytes`](escher_proto::types::TaskSpec::stored_bytes)
        /// counts it.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// A batch would take a namespace past the bytes of task specs it may keep in the head.
    #[error(
        "namespace {namespace} keeps {stored} bytes of task specs and the batch adds {asked}, \
         past its quota of {limit}; wait for finished tasks to be released (retention), or ask \
         the operator to raise escher-head --namespace-spec-bytes"
    )]
    SpecBytesExceeded {
        /// The namespace.
        namespace: Namespace,
        /// Bytes of specs it keeps now.
        stored: u64,
        /// Bytes the batch adds.
        asked: u64,
        /// The quota.
        limit: u64,
    },
    /// Objects past a namespace's byte quota (`--namespace-object-bytes`).
    #[error(
        "namespace {namespace} holds {stored} bytes of objects and these add {asked}: its \
         quota is {limit} bytes (--namespace-object-bytes); release objects it no longer needs"
    )]
    ObjectBytesExceeded {
        /// The namespace.
        namespace: Namespace,
        /// Bytes of objects it holds now.
        stored: u64,
        /// Bytes the new objects add.
        asked: u64,
        /// The quota.
        limit: u64,
    },
    /// An application tried to set, delete or create a worker-reported resource.
    #[error(
        "{0} is a physical resource reported by workers; applications cannot set, create or \
         delete it (use a name of your own, e.g. my-{0})"
    )]
    Physical(ResourceName),
    /// An application tried to write (set, resize, delete, create through a hook, a ghost or a
    /// reservation) a name of another namespace, or of `shared`.
    #[error(
        "namespace {namespace} cannot change {name}: it belongs to another namespace (tasks may \
         require shared and other namespaces' resources, but write only their own)"
    )]
    OtherNamespace {
        /// The name.
        name: ResourceName,
        /// The writer's namespace.
        namespace: Namespace,
    },
    /// No node has this id.
    #[error("unknown node {0}")]
    UnknownNode(NodeId),
    /// No task has this id.
    #[error("unknown task {0}")]
    UnknownTask(TaskId),
    /// No live actor of the caller's namespace has this name.
    #[error(
        "no live actor is named {0:?} in this namespace (names are per namespace, and freed when \
         the actor ends)"
    )]
    UnknownActorName(String),
    /// No object of the caller's namespace has this id (it never existed, it is another
    /// namespace's, or it was freed so long ago that its id is forgotten).
    #[error("unknown object {0} (objects are per namespace)")]
    UnknownObject(ObjectId),
    /// No object session has this number: it was never given out.
    #[error(
        "unknown object session {0}: the head never gave it out (a session is the owner part \
         of the ids of the objects a client puts)"
    )]
    UnknownObjectSession(u64),
    /// The object was released by its owner: its copies are deleted.
    #[error("object {0} was freed: its owner released it, and its copies are deleted")]
    ObjectFreed(ObjectId),
    /// Every copy of the object was on nodes that are gone.
    #[error("object {id} is lost: its last copy was on node {node}, which was lost ({reason})")]
    ObjectLost {
        /// The object.
        id: ObjectId,
        /// The node of its last copy.
        node: NodeId,
        /// Why that node went.
        reason: String,
    },
    /// A reported copy contradicts what the head knows of its object.
    #[error("a copy of object {id} does not match it: {why}")]
    ObjectMismatch {
        /// The object.
        id: ObjectId,
        /// How.
        why: String,
    },
    /// The task is not an actor.
    #[error("task {0} is not an actor")]
    NotAnActor(TaskId),
    /// The task finished long enough ago that retention dropped its record.
    #[error(transparent)]
    Evicted(Evicted),
    /// `Local` was used outside a running task.
    #[error(
        "a local target (--local) is only valid inside a running task; from outside the cluster name a \
         node (--node ID) or a match (--match RESOURCES)"
    )]
    LocalOutsideTask,
    /// `Local` was used by a task that is not running.
    #[error(
        "task {task} is {state}, not running, so it has no node for a local target (--local) to mean"
    )]
    CallerNotRunning {
        /// The calling task.
        task: TaskId,
        /// Its state.
        state: TaskState,
    },
    /// A call would give a namespace more resource names than its quota; nothing changed.
    #[error(
        "namespace {namespace} has {held} resource names on live nodes and the call creates \
         {asked} more, past its quota of {limit}; delete some (escher resource delete) or ask \
         the operator to raise escher-head --namespace-resources"
    )]
    ResourceQuotaExceeded {
        /// The namespace.
        namespace: Namespace,
        /// Its names on live nodes now.
        held: u64,
        /// New names in the call.
        asked: usize,
        /// The quota.
        limit: u64,
    },
    /// A reservation of this name is in use.
    #[error(
        "a reservation named {0} is in use (not all of its holders have ended); release it \
         first (escher cancel with the holders' ids that escher reserve printed; their tasks \
         carry the label escher.reservation={0}) or choose another name"
    )]
    ReservationExists(ResourceName),
    /// A task credential of an attempt that has ended.
    #[error(
        "task {task}'s attempt {attempt} has ended (its latest attempt is {current}); the \
         credential that attempt was given no longer acts for it"
    )]
    AttemptEnded {
        /// The task.
        task: TaskId,
        /// The attempt the credential names.
        attempt: u32,
        /// The task's latest attempt.
        current: u32,
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
    /// A returning worker presented a secret that is not its node's.
    #[error(
        "node {0} presented a secret that does not match the one it was given at its first \
         registration; another worker may be using a copy of its state directory. Remove the \
         worker's state directory (escher-worker --state-dir) to join as a new node"
    )]
    WrongSecret(NodeId),
    /// A returning worker's identity was issued by another cluster (a head group that
    /// started from nothing since, or another cluster altogether).
    #[error(
        "node {node} was issued by cluster {theirs:?}, and this is cluster {ours:?}: register \
         as a new node"
    )]
    OtherCluster {
        /// The node id it presented.
        node: NodeId,
        /// The cluster it names.
        theirs: String,
        /// This cluster.
        ours: String,
    },
    /// A retried write whose reply the state has released (the client said it had it).
    #[error(
        "write {seq} of client {client:x} was answered before and its reply is no longer kept; \
         the client already had it"
    )]
    ReplyForgotten {
        /// The client.
        client: u64,
        /// The write.
        seq: u64,
    },
    /// A requeue named a task that cannot take one now.
    #[error("task {task} cannot be requeued: {why}")]
    CannotRequeue {
        /// The task.
        task: TaskId,
        /// Why not.
        why: String,
    },
    /// A task id was listed twice in one call.
    #[error("task {0} is listed twice")]
    DuplicateTask(TaskId),
    /// Labels can only change on a live node.
    #[error(
        "node {0} is not live: labels change only on a live node (a node that comes back keeps \
         the labels set on it)"
    )]
    NodeNotLive(NodeId),
    /// A label key that escher keeps for itself.
    #[error(
        "label {0:?} starts with \"escher.\", which escher keeps for the labels it sets itself; \
         choose another key"
    )]
    ReservedLabel(String),
    /// A node would carry more labels than allowed.
    #[error("node {node} would carry {count} labels; a node carries at most {max}")]
    TooManyLabels {
        /// The node.
        node: NodeId,
        /// How many it would carry.
        count: usize,
        /// The most allowed.
        max: usize,
    },
    /// A GPU operation named a node that cannot take it now.
    #[error(
        "node {node} is {state}; a MIG layout can only change on a live node that is not draining"
    )]
    NodeUnavailable {
        /// The node.
        node: NodeId,
        /// `not live` or `draining`.
        state: &'static str,
    },
    /// The node has no GPU with this index.
    #[error("node {node} has no GPU {gpu}; its GPU indices are: {have} (see `escher gpus`)")]
    NoSuchGpu {
        /// The node.
        node: NodeId,
        /// The index asked for.
        gpu: u32,
        /// The indices it has.
        have: String,
    },
    /// The GPU cannot be partitioned by escher.
    #[error("GPU {gpu} of node {node} ({product}) {why}")]
    NotPartitionable {
        /// The node.
        node: NodeId,
        /// The GPU index.
        gpu: u32,
        /// Its product name.
        product: String,
        /// Why not.
        why: &'static str,
    },
    /// The layout is not legal for the GPU's model.
    #[error("invalid MIG layout {layout:?} for GPU {gpu} of node {node} ({model}): {reason}")]
    InvalidLayout {
        /// The node.
        node: NodeId,
        /// The GPU index.
        gpu: u32,
        /// The GPU's model.
        model: GpuModel,
        /// The text given.
        layout: String,
        /// What the MIG model found wrong.
        reason: MigError,
    },
    /// A slice the change destroys may be in use.
    #[error(
        "GPU {gpu} of node {node} cannot be reconfigured now: {busy}; wait for those tasks, or \
         ask to drain (--drain) so that nothing new is placed on those slices and the change \
         happens once they are free"
    )]
    MigBusy {
        /// The node.
        node: NodeId,
        /// The GPU index.
        gpu: u32,
        /// Which slices, held by which tasks.
        busy: String,
    },
    /// One instance cannot be created on the GPU (or a layout toward which to prepare is not
    /// legal): the MIG model says why.
    #[error("cannot {change} on GPU {gpu} of node {node} ({model}, now {now:?}): {reason}")]
    MigRefused {
        /// The node.
        node: NodeId,
        /// The GPU index.
        gpu: u32,
        /// The GPU's model.
        model: GpuModel,
        /// The change asked for (`create 1g.5gb@6`).
        change: String,
        /// The GPU's layout now, explicit form.
        now: String,
        /// What the MIG model found wrong.
        reason: MigError,
    },
    /// The instance to destroy is not on the GPU.
    #[error(
        "GPU {gpu} of node {node} has no MIG instance {instance}; its instances are {now:?} \
         (see `escher gpus`)"
    )]
    NoSuchInstance {
        /// The node.
        node: NodeId,
        /// The GPU index.
        gpu: u32,
        /// The instance named (`profile@start` or a UUID).
        instance: String,
        /// The GPU's layout now, explicit form.
        now: String,
    },
    /// A reconfiguration of the GPU is under way.
    #[error(
        "GPU {gpu} of node {node} is already being reconfigured to {target:?}; wait until \
         `escher gpus` shows it done"
    )]
    MigInProgress {
        /// The node.
        node: NodeId,
        /// The GPU index.
        gpu: u32,
        /// The layout being applied.
        target: String,
    },
    /// A decision to record broke the rules of its fields (`RecordDecision`).
    #[error("{0}")]
    InvalidDecision(String),
}

impl ApplyError {
    /// Why a MIG change was refused, for a caller that acts on it; `None` for other errors.
    pub fn mig_refusal(&self) -> Option<MigRefusal> {
        Some(match self {
            ApplyError::NodeUnavailable { .. } => MigRefusal::NodeUnavailable,
            ApplyError::NoSuchGpu { .. } => MigRefusal::NoSuchGpu,
            ApplyError::NotPartitionable { .. } => MigRefusal::NotPartitionable,
            ApplyError::MigRefused {
                reason: MigError::Overlap { .. },
                ..
            } => MigRefusal::Overlap,
            ApplyError::InvalidLayout { .. } | ApplyError::MigRefused { .. } => MigRefusal::Illegal,
            ApplyError::NoSuchInstance { .. } => MigRefusal::NoSuchInstance,
            ApplyError::MigBusy { .. } => MigRefusal::Busy,
            ApplyError::MigInProgress { .. } => MigRefusal::InProgress,
            _ => return None,
        })
    }

    /// Whether the error is about something that does not exist (gRPC `NOT_FOUND`).
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            ApplyError::UnknownNode(_)
                | ApplyError::UnknownTask(_)
                | ApplyError::UnknownActorName(_)
                | ApplyError::UnknownObject(_)
                | ApplyError::ObjectFreed(_)
                | ApplyError::UnknownObjectSession(_)
                | ApplyError::NotAnActor(_)
                | ApplyError::UnknownToken(_)
                | ApplyError::NoSuchGpu { .. }
                | ApplyError::NoSuchInstance { .. }
                | ApplyError::OtherCluster { .. }
                | ApplyError::Evicted(_)
        ) || matches!(
            self,
            ApplyError::Core(CoreError::UnknownNode(_) | CoreError::UnknownTask(_))
        )
    }

    /// Whether the command was valid but the cluster is not in a state to take it now (gRPC
    /// `FAILED_PRECONDITION`): a busy GPU, a reconfiguration under way, a node going away.
    pub fn is_precondition(&self) -> bool {
        matches!(self, ApplyError::ReplyForgotten { .. })
            || matches!(
                self,
                ApplyError::CallerNotRunning { .. }
                    | ApplyError::ObjectLost { .. }
                    | ApplyError::MigBusy { .. }
                    | ApplyError::MigInProgress { .. }
                    | ApplyError::CannotRequeue { .. }
                    | ApplyError::NodeUnavailable { .. }
                    | ApplyError::NodeNotLive(_)
                    | ApplyError::TokenExists(_)
                    | ApplyError::TooManyTokens(_)
            )
    }
}
