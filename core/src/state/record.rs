//! What the head remembers about each node and each task.

use std::collections::{BTreeMap, BTreeSet};

use escher_proto::types::{
    AttemptInfo, CapacityOp, DeviceHold, GpuInfo, Labels, MAX_ATTEMPTS_KEPT, MigReport,
    NAMESPACE_LABEL, Namespace, NodeId, OBJECT_SESSION_LABEL, OBJECTS_LABEL, ObjectId, OutputTail,
    PendingReason, RESERVATION_LABEL, RESULT_ARGS_LABEL, ResourceName, ResourceSet, TaskId,
    TaskKind, TaskResult, TaskSpec, TaskState, TaskStatus, parse_object_args, parse_object_session,
    parse_result_args,
};
use serde::{Deserialize, Serialize};

use super::gpus::PendingMig;
use super::nodes::SecretHash;
use crate::scheduler::Millis;

/// A node the head has seen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The worker's name.
    pub name: String,
    /// The worker's address.
    pub address: String,
    /// Its labels.
    pub labels: Labels,
    /// The resources it registered with.
    pub resources: ResourceSet,
    /// Whether it is live.
    pub alive: bool,
    /// Whether it is draining: live, but admitting nothing new.
    pub draining: bool,
    /// Why it is no longer live.
    pub gone_because: Option<String>,
    /// When it stopped being live.
    pub left_at: Option<Millis>,
    /// Its GPUs, as its worker reported them last (`GpusChanged`).
    pub gpus: Vec<GpuInfo>,
    /// MIG reconfigurations under way, by GPU index.
    pub mig: BTreeMap<u32, PendingMig>,
    /// Why the last reconfiguration of a GPU failed, by GPU index.
    pub mig_errors: BTreeMap<u32, String>,
    /// The last reconfiguration of a GPU that ended, by GPU index.
    pub mig_reports: BTreeMap<u32, MigReport>,
    /// The hash of the secret its worker got at its first registration.
    pub secret: SecretHash,
    /// The boot id of the worker process that registered it last.
    pub boot: u64,
}

/// A task the head has accepted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// Its spec, resource names qualified with its namespace.
    pub spec: TaskSpec,
    /// Where it is in its life.
    pub state: TaskState,
    /// The node of its latest attempt.
    pub node: Option<NodeId>,
    /// Attempts dispatched so far.
    pub attempt: u32,
    /// Why it is pending, failed or cancelled.
    pub reason: Option<String>,
    /// Why no node can run it now, while that is so (boxed: rare, and large beside the rest
    /// of a queued task's record).
    pub pending_reason: Option<Box<PendingReason>>,
    /// Its result once it has one (boxed: a queued task has none, and the record stays in
    /// jemalloc's 448-byte class).
    pub result: Option<Box<TaskResult>>,
    /// When it was accepted.
    pub submitted_at: Millis,
    /// When its latest attempt started.
    pub started_at: Option<Millis>,
    /// When it reached a terminal state.
    pub finished_at: Option<Millis>,
    /// A cancel was requested while it ran; it ends Cancelled when the worker confirms.
    pub cancel_requested: bool,
    /// A reservation's bundle holder: the head holds it, no worker runs it.
    pub native: bool,
    /// The devices (GPUs, MIG slices) its running attempt was given, once its worker said;
    /// `None` before that (and for tasks that hold none).
    pub devices: Option<Vec<DeviceHold>>,
    /// Its hooks that could not be applied, oldest first (the last
    /// [`MAX_HOOK_ERRORS`](escher_proto::types::MAX_HOOK_ERRORS)).
    pub hook_errors: Vec<String>,
    /// Its attempts, oldest first (the last [`MAX_ATTEMPTS_KEPT`]).
    pub attempts: Vec<AttemptRecord>,
    /// A requeue asked for while it ran: the resources it waits with once the worker confirms
    /// its attempt stopped (`requeue.rs`).
    pub requeue: Option<ResourceSet>,
}

/// One attempt of a task: where it went, how it ended, the tail of its output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// Its number, from 1.
    pub attempt: u32,
    /// The node it was sent to.
    pub node: NodeId,
    /// When it was sent.
    pub started_at: Millis,
    /// How it ended, when it did not end its task successfully; `None` while it runs, and for
    /// the attempt that succeeded (the task's result says how: see [`TaskRecord::ended`]).
    pub ended: Option<Box<str>>,
    /// The end of its output, as its worker reported it (commands only; kept for the last
    /// [`MAX_TAILS_KEPT`] attempts).
    pub output: Option<Box<OutputTail>>,
}

/// How many of a task's attempts keep their output tail in the head: with at most
/// [`OUTPUT_TAIL_BYTES`](escher_proto::types::OUTPUT_TAIL_BYTES) per stream, a task's
/// record holds at most 32 KiB of output.
pub const MAX_TAILS_KEPT: usize = 4;

impl TaskRecord {
    pub(crate) fn new(spec: TaskSpec, now: Millis) -> TaskRecord {
        TaskRecord {
            spec,
            state: TaskState::Pending,
            node: None,
            attempt: 0,
            reason: None,
            pending_reason: None,
            result: None,
            submitted_at: now,
            started_at: None,
            finished_at: None,
            cancel_requested: false,
            native: false,
            devices: None,
            requeue: None,
            hook_errors: Vec::new(),
            attempts: Vec::new(),
        }
    }

    /// A new attempt went to `node`: remembered, the oldest forgotten past
    /// [`MAX_ATTEMPTS_KEPT`], the oldest tails past [`MAX_TAILS_KEPT`].
    pub(crate) fn begin_attempt(&mut self, node: NodeId, now: Millis) {
        if self.attempts.len() >= MAX_ATTEMPTS_KEPT {
            self.attempts.remove(0);
        }
        // Most tasks run once: no room for attempts that never come (a record per task).
        self.attempts.reserve_exact(1);
        self.attempts.push(AttemptRecord {
            attempt: self.attempt,
            node,
            started_at: now,
            ended: None,
            output: None,
        });
        let keep_from = self.attempts.len().saturating_sub(MAX_TAILS_KEPT);
        for old in &mut self.attempts[..keep_from] {
            old.output = None;
        }
    }

    /// The latest attempt ended as `how` says, unless its end is known already.
    pub(crate) fn end_attempt(&mut self, how: impl FnOnce() -> String) {
        if let Some(last) = self.attempts.last_mut()
            && last.attempt == self.attempt
            && last.ended.is_none()
        {
            last.ended = Some(how().into_boxed_str());
        }
    }

    /// How attempt `a` (one of its own) ended, in words; `None` while it runs.
    pub fn ended(&self, a: &AttemptRecord) -> Option<String> {
        if let Some(how) = &a.ended {
            return Some(how.to_string());
        }
        let last = a.attempt == self.attempt;
        if !last || !self.state.is_terminal() {
            return None;
        }
        Some(match self.result.as_deref() {
            Some(TaskResult::Exited { code }) => format!("exited with code {code}"),
            Some(TaskResult::Returned(bytes)) => format!("returned {} bytes", bytes.len()),
            Some(TaskResult::Released) => "released".to_string(),
            Some(r @ (TaskResult::OutOfMemory { .. } | TaskResult::Object { .. })) => r.to_string(),
            None => self.state.to_string(),
        })
    }

    /// Attempt `attempt`, while the record keeps it.
    pub fn attempt_record(&self, attempt: u32) -> Option<&AttemptRecord> {
        self.attempts.iter().rev().find(|a| a.attempt == attempt)
    }

    /// The resource names its hooks (on start, on success) or its ghost (a reservation's
    /// holder is one) create.
    pub fn created_names(&self) -> BTreeSet<ResourceName> {
        let hooks = self.spec.on_start.iter().chain(&self.spec.on_success);
        let mut names: BTreeSet<ResourceName> = hooks
            .filter(|u| match u.op {
                CapacityOp::Set(capacity) => !capacity.is_zero(),
                CapacityOp::Adjust(delta) => delta.raw() > 0,
                CapacityOp::Delete => false,
            })
            .map(|u| u.name.clone())
            .collect();
        if let TaskKind::Ghost { creates, .. } = &self.spec.kind {
            names.extend(creates.iter().map(|(name, _)| name.clone()));
        }
        names
    }

    /// What the API reports of its attempts.
    pub(crate) fn attempt_infos(&self) -> Vec<AttemptInfo> {
        self.attempts
            .iter()
            .map(|a| AttemptInfo {
                attempt: a.attempt,
                node: a.node,
                started_at_ms: a.started_at,
                ended: self.ended(a),
                output_kept: a.output.is_some(),
            })
            .collect()
    }

    /// The namespace the task belongs to (its `escher.namespace` label); `None` for an
    /// admin's task that named none.
    pub(crate) fn namespace(&self) -> Option<Namespace> {
        namespace_of(&self.spec)
    }

    /// The namespace and name of a named actor, the key of the live actors' names.
    pub(crate) fn actor_name(&self) -> Option<(Option<Namespace>, String)> {
        actor_name_of(&self.spec)
    }

    /// The objects the task takes as arguments ([`OBJECTS_LABEL`]), largest first once the
    /// head accepted it; none if the label is absent (or unreadable, which the head refuses
    /// at submission).
    pub fn object_args(&self) -> Vec<ObjectId> {
        self.spec
            .labels
            .get(OBJECTS_LABEL)
            .and_then(|v| parse_object_args(v).ok())
            .unwrap_or_default()
    }

    /// The object session of the client that submitted the task ([`OBJECT_SESSION_LABEL`]),
    /// which its result object belongs to; none if the label is absent.
    pub fn object_session(&self) -> Option<u64> {
        parse_object_session(self.spec.labels.get(OBJECT_SESSION_LABEL)?)
    }

    /// The tasks whose results the task reads ([`RESULT_ARGS_LABEL`], checked at submission).
    pub fn result_args(&self) -> Vec<TaskId> {
        self.spec
            .labels
            .get(RESULT_ARGS_LABEL)
            .and_then(|v| parse_result_args(v).ok())
            .unwrap_or_default()
    }

    /// Soft locality: the location resources of the task's argument objects, largest object
    /// first (each object is of the task's namespace, which the head checked), then of the
    /// results it reads, in their order: those objects may not exist yet (their tasks still
    /// run); a name no node holds when the task is placed gives no preference.
    pub(crate) fn preferred_locations(&self) -> Vec<ResourceName> {
        let ns = self.namespace();
        let results = self.result_args().into_iter().map(ObjectId::task_result);
        self.object_args()
            .into_iter()
            .chain(results)
            .map(|id| super::objects::location_resource(id, ns.as_ref()))
            .collect()
    }

    /// The reservation a head-native bundle holder belongs to.
    pub(crate) fn reservation(&self) -> Option<ResourceName> {
        if !self.native {
            return None;
        }
        ResourceName::new(self.spec.labels.get(RESERVATION_LABEL)?).ok()
    }

    /// The bytes of its function result, if it keeps one.
    pub(crate) fn result_bytes(&self) -> Option<u64> {
        match self.result.as_deref() {
            Some(TaskResult::Returned(bytes)) => Some(bytes.len() as u64),
            _ => None,
        }
    }

    /// The status the API reports.
    pub fn status(&self, id: TaskId) -> TaskStatus {
        // The one pending reason `tasks`, `info`, `status` and JSON show.
        let reason = match (&self.pending_reason, self.state) {
            (Some(p), TaskState::Pending) => Some(format!("infeasible: {p}")),
            (None, TaskState::Pending) if self.reason.is_none() => {
                Some(WAITING_FOR_CAPACITY.to_string())
            }
            _ => self.reason.clone(),
        };
        TaskStatus {
            id,
            state: self.state,
            node: self.node,
            attempt: self.attempt,
            reason,
            result: self.result.as_deref().cloned(),
            evicted: false,
            finished_at_ms: self.finished_at,
            hook_errors: self.hook_errors.clone(),
        }
    }
}

/// The reason of a pending task some live node could run once resources free up.
pub const WAITING_FOR_CAPACITY: &str =
    "waiting for capacity: some live node could run it, none has its resources free now";

/// The namespace a (qualified) task spec belongs to.
/// The namespace and name of a named actor's task, the key of the live actors' names.
pub(crate) fn actor_name_of(spec: &TaskSpec) -> Option<(Option<Namespace>, String)> {
    match &spec.kind {
        escher_proto::types::TaskKind::Actor(actor) => actor
            .name
            .as_ref()
            .map(|name| (namespace_of(spec), name.clone())),
        _ => None,
    }
}

pub(crate) fn namespace_of(spec: &TaskSpec) -> Option<Namespace> {
    let label = spec.labels.get(NAMESPACE_LABEL)?;
    Namespace::new(label).ok()
}
