//! [`ClusterState`] and the single entry point that changes it.

use std::collections::{BTreeMap, BTreeSet};

use escher_proto::types::{Namespace, NodeId, PendingReason, ResourceName, TaskId, TaskState};
use serde::{Deserialize, Serialize};

use super::command::{Command, Effect, Entry, Reply};
use super::error::ApplyError;
use super::nodes::Admit;
use super::record::{NodeRecord, TaskRecord};
use super::retention::{Retention, RetentionPolicy};
use super::sessions::{Seen, Sessions};
use crate::scheduler::{Decision, Event, Millis, Scheduler};

/// Settings that change what `apply` decides, so every replica must share them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateConfig {
    /// The largest function result the head stores; larger results fail the task.
    pub max_result_bytes: usize,
    /// How long finished tasks and dead nodes are kept.
    pub retention: RetentionPolicy,
    /// The most unfinished tasks (pending or running, reservation holders included) one
    /// namespace may have; a batch that would pass it is refused whole. Admin callers, whose
    /// tasks have no namespace, are not counted.
    pub namespace_unfinished: u64,
    /// The most bytes of function results one application namespace may have stored in the
    /// head at once; a result past it fails its task with the reason. Results are released
    /// when retention evicts their tasks.
    pub namespace_result_bytes: u64,
    /// The most resource names one application namespace may have on live nodes; a call that
    /// would create more is refused whole.
    pub namespace_resources: u64,
    /// The largest task spec the head takes, in bytes (see
    /// [`TaskSpec::stored_bytes`](escher_proto::types::TaskSpec::stored_bytes)), from any
    /// caller; a batch holding a larger one is refused whole.
    pub max_task_bytes: u64,
    /// The most bytes of task specs one application namespace may have the head keep (its
    /// unfinished tasks and the finished ones retention keeps); a batch past it is refused
    /// whole.
    pub namespace_spec_bytes: u64,
    /// The most bytes of objects one application namespace may have (each object counted
    /// once, whatever its copies; lost ones until released); a `put` or a batch of sealed
    /// copies past it is refused whole. Admin objects are not counted.
    pub namespace_object_bytes: u64,
    /// The least time a node with a walltime (`escher.ends-at`) must have left to take a
    /// task without a time limit or a reservation (`Duration::ZERO`: until the head drains
    /// it); see [`Scheduler::set_min_time_left`].
    pub min_time_left: std::time::Duration,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            max_result_bytes: 16 * 1024 * 1024,
            retention: RetentionPolicy::default(),
            namespace_unfinished: 1_000_000,
            namespace_result_bytes: 1024 * 1024 * 1024,
            namespace_resources: 100_000,
            max_task_bytes: 16 * 1024 * 1024,
            namespace_spec_bytes: 512 * 1024 * 1024,
            namespace_object_bytes: 1 << 40,
            min_time_left: std::time::Duration::ZERO,
        }
    }
}

/// The head's whole durable state. See the [module documentation](super).
///
/// It serializes (serde) to a snapshot of everything `apply` depends on, the scheduler core
/// included; a state restored from a snapshot makes exactly the decisions the original would
/// (see the scheduler's *Determinism* section). The settings ([`StateConfig`]) are not part
/// of it: they come from the head's flags, [`restore`](Self::restore) puts them back.
#[derive(Debug, Serialize, Deserialize)]
pub struct ClusterState {
    #[serde(skip)]
    pub(crate) config: StateConfig,
    pub(crate) core: Scheduler,
    pub(crate) nodes: BTreeMap<NodeId, NodeRecord>,
    /// Boxed: a record is several hundred bytes, and a B-tree node moves its entries when one
    /// is inserted or removed (and its leaves are about half full), so the tree holds pointers.
    pub(crate) tasks: BTreeMap<TaskId, Box<TaskRecord>>,
    pub(crate) next_node: u64,
    pub(crate) next_task: u64,
    /// This cluster's id, set once by [`Command::Init`].
    pub(crate) cluster_id: Option<String>,
    /// The key that signs task credentials, set once by [`Command::Init`].
    pub(crate) task_key: Option<String>,
    /// Tokens created through the API (hashes only).
    pub(crate) tokens: super::tokens::Tokens,
    /// Recent replies by client, for idempotent retries.
    pub(crate) sessions: Sessions,
    /// What retention keeps of finished tasks and dead nodes, and in which order it evicts.
    pub(crate) retention: Retention,
    /// Unfinished tasks per namespace, for the quota; derived from `tasks` (rebuilt by
    /// [`restore`](Self::restore)), so not part of a snapshot.
    #[serde(skip)]
    pub(crate) unfinished: BTreeMap<Namespace, u64>,
    /// Bytes of function results stored per namespace, for the quota; derived from `tasks`
    /// like `unfinished`.
    #[serde(skip)]
    pub(crate) result_bytes: BTreeMap<Namespace, u64>,
    /// Bytes of task specs kept per namespace, for the quota; derived from `tasks` like
    /// `unfinished`.
    #[serde(skip)]
    pub(crate) spec_bytes: BTreeMap<Namespace, u64>,
    /// Reservations in use, with their unfinished holders; a name is free again when the last
    /// ends. Derived from `tasks` like `unfinished`.
    #[serde(skip)]
    pub(crate) reservations: BTreeMap<ResourceName, usize>,
    /// The unfinished tasks whose hooks or ghost create each resource name, so that a task
    /// waiting for a name no node has yet can say which task will create it. Derived from
    /// `tasks` like `unfinished`.
    #[serde(skip)]
    pub(crate) creators: BTreeMap<ResourceName, BTreeSet<TaskId>>,
    /// The live (unfinished) named actors, by namespace and name: a name is free again when its
    /// actor's task ends. Derived from `tasks` like `unfinished`.
    #[serde(skip)]
    pub(crate) actor_names: BTreeMap<(Option<Namespace>, String), TaskId>,
    /// Effects produced by `apply`, drained by the runtime.
    #[serde(skip)]
    pub(crate) effects: Vec<Effect>,
    /// The revision of the last event recorded (`events.rs`).
    pub(crate) revision: u64,
    /// Events recorded by `apply`, drained by the runtime like the effects.
    #[serde(skip)]
    pub(crate) events: Vec<super::events::Recorded>,
    /// Scratch buffer for the core's decisions (empty between entries).
    #[serde(skip)]
    pub(crate) decisions: Vec<Decision>,
    /// Which life of the cluster this is (`incarnation.rs`). Part of a snapshot, but written
    /// after the state's other fields by the head's codec (so images from before it still
    /// read), hence skipped here.
    #[serde(skip)]
    pub(crate) incarnation: super::incarnation::Incarnation,
    /// The object table (`objects.rs`). Part of a snapshot from data format 5 on, written after
    /// the image and the incarnation by the head's codec (so older images still read), hence
    /// skipped here.
    #[serde(skip)]
    pub(crate) objects: super::objects::ObjectTable,
    /// The number of each node's current registration (`registrations.rs`). Part of a snapshot
    /// from data format 9 on, written after the object table by the head's codec, hence
    /// skipped here.
    #[serde(skip)]
    pub(crate) registrations: super::registrations::Registrations,
    /// Which task submitted which (`lineage.rs`). Part of a snapshot from data format 11 on,
    /// written after the registration numbers by the head's codec, hence skipped here.
    #[serde(skip)]
    pub(crate) lineage: super::lineage::Lineage,
    /// Whether the entry being applied numbers the registrations it makes (see
    /// [`apply_entry`](Self::apply_entry)); set for each entry.
    #[serde(skip)]
    pub(crate) numbering: bool,
}

impl ClusterState {
    /// An empty cluster.
    pub fn new(config: StateConfig) -> ClusterState {
        let mut core = Scheduler::new();
        core.set_min_time_left(super::tasks::millis(config.min_time_left));
        ClusterState {
            config,
            core,
            nodes: BTreeMap::new(),
            tasks: BTreeMap::new(),
            next_node: 1,
            next_task: 1,
            cluster_id: None,
            task_key: None,
            tokens: super::tokens::Tokens::default(),
            sessions: Sessions::default(),
            retention: Retention::default(),
            unfinished: BTreeMap::new(),
            result_bytes: BTreeMap::new(),
            spec_bytes: BTreeMap::new(),
            reservations: BTreeMap::new(),
            creators: BTreeMap::new(),
            actor_names: BTreeMap::new(),
            effects: Vec::new(),
            revision: 0,
            events: Vec::new(),
            decisions: Vec::new(),
            incarnation: super::incarnation::Incarnation::default(),
            objects: super::objects::ObjectTable::default(),
            registrations: super::registrations::Registrations::default(),
            lineage: super::lineage::Lineage::default(),
            numbering: true,
        }
    }

    /// A deserialized snapshot, with the settings it is to apply.
    pub fn restore(mut self, config: StateConfig) -> ClusterState {
        self.config = config;
        self.unfinished.clear();
        self.result_bytes.clear();
        self.spec_bytes.clear();
        self.reservations.clear();
        self.creators.clear();
        self.actor_names.clear();
        for (id, rec) in &self.tasks {
            // Soft locality is not part of the core's snapshot: set again from the spec.
            if rec.state == TaskState::Pending && self.core.is_pending(*id) {
                self.core.prefer(*id, rec.preferred_locations());
            }
            if !rec.state.is_terminal()
                && let Some(key) = rec.actor_name()
            {
                self.actor_names.insert(key, *id);
            }
            if !rec.state.is_terminal() {
                for name in rec.created_names() {
                    self.creators.entry(name).or_default().insert(*id);
                }
            }
            if !rec.state.is_terminal()
                && let Some(name) = rec.reservation()
            {
                *self.reservations.entry(name).or_default() += 1;
            }
            let Some(ns) = rec.namespace() else {
                continue;
            };
            if !rec.state.is_terminal() {
                *self.unfinished.entry(ns.clone()).or_default() += 1;
            }
            *self.spec_bytes.entry(ns.clone()).or_default() += rec.spec.stored_bytes();
            if let Some(bytes) = rec.result_bytes() {
                *self.result_bytes.entry(ns).or_default() += bytes;
            }
        }
        // The core's walltime index is not in the snapshot: its ends are the nodes' labels
        // (which the core holds) and its limits the pending tasks' specs.
        let pending = || {
            self.tasks
                .iter()
                .filter(|(_, rec)| rec.state == TaskState::Pending)
        };
        let limits: Vec<(TaskId, Millis)> = pending()
            .filter_map(|(id, rec)| Some((*id, super::tasks::millis(rec.spec.timeout?))))
            .collect();
        let blocked: Vec<(TaskId, PendingReason)> = pending()
            .filter_map(|(id, rec)| {
                let reason = rec.pending_reason.as_deref()?;
                let walltime = reason.resource.as_str() == crate::scheduler::WALLTIME_REASON;
                walltime.then(|| (*id, reason.clone()))
            })
            .collect();
        self.core
            .set_min_time_left(super::tasks::millis(self.config.min_time_left));
        self.core.restore_walltimes(limits, blocked);
        self
    }

    /// Applies one entry. On error nothing changed and no effect was produced.
    ///
    /// An entry with an idempotency key that was applied before is answered with the reply it
    /// got then, and changes nothing (see `sessions.rs`).
    ///
    /// The first entry a state restored from a backup applies begins its new incarnation
    /// first (`incarnation.rs`), whatever becomes of the entry.
    ///
    /// The entry numbers the registrations it makes (`registrations.rs`): what an entry of this
    /// release's newest data format does. See [`apply_entry`](Self::apply_entry).
    pub fn apply(&mut self, entry: Entry) -> Result<Reply, ApplyError> {
        self.apply_entry(entry, true)
    }

    /// [`apply`](Self::apply), for an entry that numbers the registrations it makes or not
    /// (`numbering`): the head's codec says which by the data format it was written in (9 on),
    /// so that every replica, whether it replayed the entry or loaded a snapshot, holds the
    /// same numbers (see `registrations.rs`).
    pub fn apply_entry(&mut self, entry: Entry, numbering: bool) -> Result<Reply, ApplyError> {
        self.numbering = numbering;
        self.begin_incarnation(entry.now);
        let revision = self.revision;
        let Some(key) = entry.key else {
            return self
                .apply_command(entry.command, entry.now)
                .inspect_err(|_| self.unrecord(revision));
        };
        if let Seen::Replied(reply) = self.sessions.seen(&key)? {
            return Ok(reply);
        }
        let reply = self
            .apply_command(entry.command, entry.now)
            .inspect_err(|_| self.unrecord(revision))?;
        self.sessions.record(&key, reply.clone(), entry.now);
        Ok(reply)
    }

    /// After an accepted command, retention evicts what its policy no longer keeps (tasks that
    /// finished in earlier entries, dead nodes past their grace period); see `retention.rs`.
    fn apply_command(&mut self, command: Command, now: Millis) -> Result<Reply, ApplyError> {
        let settled = self.retention.finished_len();
        let reply = match command {
            Command::RegisterNode { worker, secret } => {
                Reply::Registered(self.register(worker, secret, Admit::Now, now)?)
            }
            Command::RejoinNode { worker, back } => {
                Reply::Registered(self.rejoin(worker, back, Admit::Now, now)?)
            }
            Command::RegisterNodeUnattached { worker, secret } => {
                Reply::Registered(self.register(worker, secret, Admit::OnAttach, now)?)
            }
            Command::RejoinNodeUnattached { worker, back } => {
                Reply::Registered(self.rejoin(worker, back, Admit::OnAttach, now)?)
            }
            Command::NodeAttached { node, boot } => {
                self.attached(node, boot, now)?;
                Reply::Done
            }
            Command::LabelNode {
                node,
                set,
                remove,
                drain,
            } => Reply::Labels(self.label_node(node, set, &remove, drain, now)?),
            Command::Init {
                cluster_id,
                task_key,
            } => {
                self.cluster_id.get_or_insert(cluster_id);
                self.task_key.get_or_insert(task_key);
                Reply::Done
            }
            Command::CreateToken {
                hash,
                grant,
                description,
            } => Reply::Token(self.create_token(hash, grant, description, now)?),
            Command::RevokeToken { id } => Reply::Token(self.revoke_token(&id, now)?),
            Command::RemoveNode { node, reason } => {
                self.remove_node(node, reason, now)?;
                Reply::Done
            }
            Command::RemoveJudgedNode {
                node,
                registration,
                reason,
            } => {
                self.remove_judged_node(node, registration, reason, now)?;
                Reply::Done
            }
            Command::DrainNode { node } => {
                self.drain_node(node, now)?;
                Reply::Done
            }
            Command::Submit { tasks, namespace } => {
                Reply::Submitted(self.submit(tasks, namespace.as_ref(), None, now)?)
            }
            Command::SubmitChildren {
                tasks,
                namespace,
                parent,
            } => Reply::Submitted(self.submit(tasks, namespace.as_ref(), Some(parent), now)?),
            Command::SetResources {
                updates,
                namespace,
                caller_task,
            } => {
                let updates = self.resolve_updates(updates, namespace.as_ref(), caller_task)?;
                self.check_resource_quota(namespace.as_ref(), &updates)?;
                Reply::ResourcesSet(self.set_resources(&updates, now)?)
            }
            Command::Reserve {
                name,
                bundles,
                strategy,
                timeout,
                namespace,
            } => {
                let tasks =
                    self.reserve(name, bundles, strategy, timeout, namespace.as_ref(), now)?;
                self.settle(now);
                let placed = tasks.iter().all(|t| {
                    self.tasks
                        .get(t)
                        .is_some_and(|r| r.state == escher_proto::types::TaskState::Running)
                });
                Reply::Reserved { tasks, placed }
            }
            Command::TaskStarted { task, attempt } => {
                self.started(task, attempt, now);
                Reply::Done
            }
            Command::TaskFinished(finished) => {
                self.finished(finished, now);
                Reply::Done
            }
            Command::Cancel { tasks } => Reply::Cancelled(self.cancel(&tasks, false, now)?),
            Command::CancelTasks {
                tasks,
                recursive,
                force,
            } => Reply::Cancelled(self.cancel_tasks(&tasks, recursive, force, now)?),
            Command::Requeue { task, resources } => {
                Reply::Requeued(self.requeue(task, resources, now)?)
            }
            Command::Tick => {
                self.core_event(Event::Tick, now);
                Reply::Done
            }
            Command::SkipIds { count, why } => {
                self.skip_task_ids(count);
                self.next_node = self.next_node.saturating_add(count);
                tracing::warn!(
                    count,
                    %why,
                    next_task = self.next_task,
                    next_node = self.next_node,
                    "skipped task and node ids that lost log records may have given out"
                );
                Reply::Done
            }
            Command::TaskDevices {
                task,
                attempt,
                devices,
            } => {
                self.task_devices(task, attempt, devices);
                Reply::Done
            }
            Command::GpusChanged { node, gpus, done } => {
                self.gpus_changed(node, gpus, done, now)?;
                Reply::Done
            }
            Command::ApplyMigLayout {
                node,
                gpu,
                change,
                drain,
            } => Reply::MigPlan(self.change_mig(node, gpu, &change, drain, now)?),
            Command::ObjectsSealed { copies } => {
                Reply::ObjectsSealed(self.objects_sealed(copies, now)?)
            }
            Command::ObjectsReleased {
                ids,
                namespace,
                sees_everything,
            } => Reply::ObjectsReleased(self.objects_released(
                &ids,
                namespace.as_ref(),
                sees_everything,
                now,
            )),
            Command::OpenObjectSession => Reply::ObjectSession(self.open_object_session()),
            Command::CloseObjectSession {
                session,
                namespace,
                sees_everything,
            } => {
                let (released, pinned) =
                    self.close_object_session(session, namespace.as_ref(), sees_everything, now)?;
                Reply::ObjectSessionClosed { released, pinned }
            }
            Command::RecordDecision {
                source,
                action,
                reason,
            } => {
                escher_proto::types::check_decision(&source, &action, &reason)
                    .map_err(ApplyError::InvalidDecision)?;
                let event = escher_proto::types::ClusterEvent::Decision {
                    source,
                    action,
                    reason,
                };
                self.record(event, escher_proto::types::Labels::new(), now);
                Reply::Done
            }
        };
        self.settle(now);
        self.retain(settled, now);
        Ok(reply)
    }

    /// Takes the effects produced since the last call.
    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    /// The scheduler core, for read-only queries.
    pub fn core(&self) -> &Scheduler {
        &self.core
    }

    /// This cluster's id, once its first leader named it.
    pub fn cluster_id(&self) -> Option<&str> {
        self.cluster_id.as_deref()
    }

    /// The settings this state applies.
    pub fn config(&self) -> &StateConfig {
        &self.config
    }

    /// Feeds the core an event that cannot be refused (the caller checked it), keeping its
    /// decisions for [`settle`](Self::settle).
    pub(crate) fn core_event(&mut self, event: Event, now: Millis) {
        self.core_events([event], now);
    }

    /// [`core_event`](Self::core_event) for events that make one change: the core places
    /// tasks once, after the last ([`Scheduler::handle_all`]).
    ///
    /// [`Scheduler::handle_all`]: crate::scheduler::Scheduler::handle_all
    pub(crate) fn core_events(&mut self, events: impl IntoIterator<Item = Event>, now: Millis) {
        let events: Vec<Event> = events.into_iter().collect();
        let resized: Vec<(NodeId, ResourceName)> = events
            .iter()
            .filter_map(|event| match event {
                Event::ResourceChanged {
                    target: escher_proto::types::NodeSpec::Node(node),
                    name,
                    ..
                } => Some((*node, name.clone())),
                _ => None,
            })
            .collect();
        if let Err(err) = self.core.handle_all(events, now, &mut self.decisions) {
            // Only reachable through a bug in the head: every event is checked first.
            tracing::error!(%err, "scheduler core refused an event the head had checked");
        }
        for (node, name) in resized {
            self.record_resource(node, name, now);
        }
    }

    /// Acts on the core's decisions until there are none; acting may cause more.
    pub(crate) fn settle(&mut self, now: Millis) {
        while !self.decisions.is_empty() {
            let batch = std::mem::take(&mut self.decisions);
            for decision in batch {
                self.decide(decision, now);
            }
        }
    }

    fn decide(&mut self, decision: Decision, now: Millis) {
        match decision {
            Decision::Dispatch { task, node } => self.dispatched(task, node, now),
            // Decisions are acted on after the whole command: one about a task that a later
            // step of the same command ended (a cancel of several gang members) is stale.
            Decision::Infeasible { task, reason } => {
                if let Some(rec) = self.tasks.get_mut(&task)
                    && rec.state == TaskState::Pending
                    && rec.pending_reason.as_deref() != Some(&*reason)
                {
                    let text = reason.to_string();
                    rec.pending_reason = Some(Box::new((*reason).clone()));
                    self.record_pending(task, Some(text), now);
                }
            }
            Decision::Feasible { task } => {
                if let Some(rec) = self.tasks.get_mut(&task)
                    && rec.state == TaskState::Pending
                    && rec.pending_reason.take().is_some()
                {
                    self.record_pending(task, None, now);
                }
            }
            Decision::DeadlinePassed { task } => {
                let Some(rec) = self.tasks.get(&task) else {
                    return;
                };
                if rec.state != TaskState::Pending {
                    return; // stale: a later step of the same command ended it
                }
                let why = match rec.spec.pending_deadline {
                    Some(d) => {
                        format!("pending deadline of {d:?} passed before any node could run it")
                    }
                    None => "pending deadline passed".to_string(),
                };
                self.terminate(task, TaskState::Cancelled, Some(why), None, now);
            }
            Decision::Lost { task, node } => {
                let why = match self.nodes.get(&node).and_then(|n| n.gone_because.as_ref()) {
                    Some(reason) => format!("node {node} lost: {reason}"),
                    None => format!("node {node} lost"),
                };
                match self.tasks.get(&task).map(|r| (r.native, r.state)) {
                    // A second holder on the same node (its reservation is placed again
                    // already, itself included), or a task a later step of the same command
                    // ended: stale.
                    None => {}
                    Some((_, state)) if state != TaskState::Running => {}
                    Some((true, _)) => self.replace_reservation(task, &why, now),
                    Some((false, _)) => self.failed_attempt(task, why, None, now),
                }
            }
        }
    }
}
