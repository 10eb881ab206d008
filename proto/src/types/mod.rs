//! Domain types: what a resource is called, how much of it there is, where it lives.
//!
//! These types are the contract between applications, the head and the workers. Each one
//! validates on construction, so a value of the type is always well-formed.
//!
//! Besides the resource and task vocabulary, `status` holds what the API reports (cluster and
//! task status), `api` the requests and replies of the `Cluster` service, `link` the
//! messages between the head and its workers, `gpu` the GPUs and MIG slices workers report
//! (and the resource names they become), and `gpu_status` what the GPU calls report, `heads` the replicas of a head group; [`crate::convert`] maps each to and from its
//! wire message.

mod actor;
mod amount;
mod api;
mod auth;
mod delta;
mod error;
mod gang;
mod gpu;
mod gpu_status;
mod heads;
mod ids;
mod keys;
mod labels;
mod link;
mod name;
mod node_spec;
mod object;
mod object_ticket;
mod outcome;
mod policy;
mod resource_set;
mod retention;
mod status;
mod task;
mod telemetry;
mod watch;

pub use actor::{
    ACTOR_LABEL, ActorLoad, ActorSpec, ActorView, DATA_ADDRESS_LABEL, DataTicket, Lifetime,
    MAX_ACTOR_NAME_BYTES, MAX_CONCURRENCY, PROFILER_CLASS, ReplicaInfo, SERVING_REPLICA_CLASS,
    TICKET_MILLIS, TRAINER_CLASS, ticket_key,
};
pub use amount::{Amount, Capacity};
pub use api::{
    CancelReply, CancelRequest, ListTasksReply, ListTasksRequest, LogChunk, MAX_LABEL_SELECTORS,
    MORE_COUNTED, RequestKey, ReserveReply, ReserveRequest, SetResourceOutcome, SetResourcesReply,
    SetResourcesRequest, SubmitReply, SubmitRequest, TaskLogsRequest, WaitReply, WaitRequest,
};
pub use auth::{CreateTokenRequest, CreatedToken, Grant, Role, SHARED_NAMESPACE, TokenInfo};
pub use delta::{CapacityOp, Delta};
pub use error::TypeError;
pub use gang::GangStrategy;
pub use gpu::{
    DeviceHold, GpuInfo, MAX_DEVICE_SEGMENT, MigDevice, device_segment, gpu_identity, gpu_labels,
    gpu_resources, is_gpu_resource, mig_class, mig_identity,
};
pub use gpu_status::{
    ApplyMigLayoutRequest, DeviceHolder, GpuStatus, GpusReply, MIG_REFUSAL_METADATA, MigChange,
    MigDone, MigPlan, MigProgress, MigRefusal, MigReport, NodeGpus,
};
pub use heads::{HeadChange, HeadReplica, HeadsReply, ReplicaRole};
pub use ids::{NodeId, TaskId};
pub use keys::{KeyIssuer, Ticket, key_text};
pub use labels::{
    DISK_UNDER_RESERVE_LABEL, DRAIN_AT_LABEL, ENDING_SOON_LABEL, ENDS_AT_LABEL, ISOLATION_LABEL,
    LIMITS_LABEL, LIMITS_MISSING_LABEL, LIMITS_PIDS_LABEL, Labels, MAX_LABELS, NAMESPACE_LABEL,
    RESERVATION_LABEL, RESERVED_PREFIX, STRATEGY_LABEL, TMP_LABEL, is_reserved_label,
    under_disk_reserve,
};
pub use link::{
    Assignment, HeadMessage, MAX_HELD_BATCH, Metric, NodeIdentity, OUTPUT_TAIL_BYTES, OutputTail,
    RegisterReply, RegisterRequest, RunningTask, TaskFinished, WorkerMessage,
};
pub use name::{Namespace, ResourceKind, ResourceName};
pub use node_spec::NodeSpec;
pub use object::{
    DroppedHeld, HeldCopy, INLINE_RESULT_BYTES, LOCATION_PREFIX, OBJECT_LOST_METADATA,
    OBJECT_SESSION_LABEL, OBJECTS_LABEL, ObjectHolder, ObjectId, ObjectLoss, ObjectOwner,
    ObjectView, ParseObjectIdError, RESULT_ARGS_LABEL, SealedCopy, format_object_args,
    format_object_lost, format_result_args, parse_object_args, parse_object_lost,
    parse_object_session, parse_result_args,
};
pub use object_ticket::{MAX_TICKET_OBJECTS, ObjectAccess, ObjectTicket, TicketRefusal};
pub use outcome::{MAX_OUTCOME_BYTES, OUTCOME_FILE_ENV, out_of_memory_line, parse_outcome};
pub use policy::{
    MAX_POLICY_MEASURES, MAX_POLICY_NAME, MAX_POLICY_ROWS, PolicyReport, PolicyRow,
    check_policy_name, check_policy_rows,
};
pub use resource_set::ResourceSet;
pub use retention::{Evicted, Tombstone, utc_millis, utc_seconds};
pub use status::{
    AttemptInfo, ClusterStatus, LogStream, MAX_ATTEMPTS_KEPT, NodeStatus, PendingReason,
    ResourceStatus, TaskCounts, TaskInfo, TaskSummary,
};
pub use task::{
    MAX_ARGV, MAX_ENV, MAX_HOOK_ERRORS, MAX_HOOK_UPDATES, MAX_NAME_BYTES, MAX_RESOURCES,
    MAX_TASK_NAME_BYTES, ResourceUpdate, TaskKind, TaskResult, TaskSpec, TaskState, TaskStatus,
};
pub use telemetry::{
    MAX_SAMPLES_PER_REPORT, MAX_TELEMETRY_KEY, MAX_TELEMETRY_TASKS, Sample, TaskTelemetry,
};
pub use watch::{
    ActorChange, ClusterEvent, MAX_DECISION_REASON, MAX_WATCH_TASKS, NodeChange, WatchBatch,
    WatchEvent, WatchKind, WatchRequest, check_decision,
};
