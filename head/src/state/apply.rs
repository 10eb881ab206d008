//! [`ClusterState`] and the single entry point that changes it.

use std::collections::BTreeMap;

use escher_proto::types::{Capacity, Labels, NodeId, ResourceSet, TaskId};
use serde::{Deserialize, Serialize};

use super::command::{Command, Effect, Entry, Reply};
use super::error::ApplyError;
use super::record::{NodeRecord, TaskRecord};
use super::retention::{Retention, RetentionPolicy};
use crate::scheduler::{Decision, Event, Millis, Scheduler};

/// Settings that change what `apply` decides, so every replica must share them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateConfig {
    /// The largest function result the head stores; larger results fail the task.
    pub max_result_bytes: usize,
    /// How long finished tasks and dead nodes are kept.
    pub retention: RetentionPolicy,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            max_result_bytes: 16 * 1024 * 1024,
            retention: RetentionPolicy::default(),
        }
    }
}

/// The head's whole durable state. See the [module documentation](super).
#[derive(Debug)]
pub struct ClusterState {
    pub(crate) config: StateConfig,
    pub(crate) core: Scheduler,
    pub(crate) nodes: BTreeMap<NodeId, NodeRecord>,
    pub(crate) tasks: BTreeMap<TaskId, TaskRecord>,
    pub(crate) next_node: u64,
    pub(crate) next_task: u64,
    /// What retention keeps of finished tasks and dead nodes, and in which order it evicts.
    pub(crate) retention: Retention,
    /// Effects produced by `apply`, drained by the runtime.
    pub(crate) effects: Vec<Effect>,
    /// Scratch buffer for the core's decisions.
    pub(crate) decisions: Vec<Decision>,
}

impl ClusterState {
    /// An empty cluster.
    pub fn new(config: StateConfig) -> ClusterState {
        ClusterState {
            config,
            core: Scheduler::new(),
            nodes: BTreeMap::new(),
            tasks: BTreeMap::new(),
            next_node: 1,
            next_task: 1,
            retention: Retention::default(),
            effects: Vec::new(),
            decisions: Vec::new(),
        }
    }

    /// Applies one entry. On error nothing changed and no effect was produced.
    ///
    /// After an accepted entry, retention evicts what its policy no longer keeps (tasks that
    /// finished in earlier entries, dead nodes past their grace period); see `retention.rs`.
    pub fn apply(&mut self, entry: Entry) -> Result<Reply, ApplyError> {
        let now = entry.now;
        let settled = self.retention.finished_len();
        let reply = match entry.command {
            Command::RegisterNode {
                name,
                address,
                resources,
                labels,
                previous,
            } => Reply::Registered(self.register(name, address, resources, labels, previous, now)),
            Command::RemoveNode { node, reason } => {
                self.remove_node(node, reason, now)?;
                Reply::Done
            }
            Command::DrainNode { node } => {
                self.drain_node(node, now)?;
                Reply::Done
            }
            Command::Submit { tasks, namespace } => {
                Reply::Submitted(self.submit(tasks, namespace.as_ref(), now)?)
            }
            Command::SetResources {
                updates,
                namespace,
                caller_task,
            } => {
                let updates = self.resolve_updates(updates, namespace.as_ref(), caller_task)?;
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
            Command::Cancel { tasks } => Reply::Cancelled(self.cancel(&tasks, now)?),
            Command::Tick => {
                self.core_event(Event::Tick, now);
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
                layout,
                drain,
            } => Reply::MigPlan(self.apply_mig_layout(node, gpu, &layout, drain, now)?),
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

    /// The settings this state applies.
    pub fn config(&self) -> &StateConfig {
        &self.config
    }

    fn register(
        &mut self,
        name: String,
        address: String,
        resources: ResourceSet,
        labels: Labels,
        previous: Option<NodeId>,
        now: Millis,
    ) -> NodeId {
        if let Some(id) = previous
            && self.nodes.get(&id).is_some_and(|n| n.alive)
        {
            // A reconnect within the heartbeat timeout: same node, same tasks.
            let record = self.nodes.get_mut(&id).expect("checked above");
            record.address = address;
            record.name = name;
            return id;
        }
        // Not a reconnect. A worker that claims an id this state does not know as live (its
        // node was declared lost, or it comes from an earlier head that kept no state) must
        // not be given that id back: it would take the new node for its old one and go on
        // running the old node's tasks, whose ids a restarted head hands out again.
        if previous == Some(NodeId(self.next_node)) {
            self.next_node += 1;
        }
        let id = NodeId(self.next_node);
        self.next_node += 1;
        let capacities = resources
            .iter()
            .map(|(n, a)| (n.clone(), Capacity::Finite(a)))
            .collect();
        let event = Event::NodeAdded {
            node: id,
            resources: capacities,
            labels: labels.clone(),
        };
        self.core_event(event, now);
        self.nodes.insert(
            id,
            NodeRecord {
                name,
                address,
                labels,
                resources,
                alive: true,
                draining: false,
                gone_because: None,
                left_at: None,
                gpus: Vec::new(),
                mig: BTreeMap::new(),
                mig_errors: BTreeMap::new(),
            },
        );
        id
    }

    fn remove_node(&mut self, id: NodeId, reason: String, now: Millis) -> Result<(), ApplyError> {
        let record = self.nodes.get_mut(&id).ok_or(ApplyError::UnknownNode(id))?;
        if !record.alive {
            return Ok(());
        }
        record.alive = false;
        record.gone_because = Some(reason);
        record.left_at = Some(now);
        self.retention.node_left(id);
        self.core_event(Event::NodeRemoved { node: id }, now);
        Ok(())
    }

    /// Sets every capacity of a draining node to zero. Running tasks keep what they hold (a
    /// capacity below use admits nothing new), so the node empties as they finish.
    fn drain_node(&mut self, id: NodeId, now: Millis) -> Result<(), ApplyError> {
        let record = self.nodes.get_mut(&id).ok_or(ApplyError::UnknownNode(id))?;
        if !record.alive || record.draining {
            return Ok(());
        }
        record.draining = true;
        let names: Vec<_> = self
            .core
            .node(id)
            .map(|view| view.resources.into_iter().map(|r| r.name).collect())
            .unwrap_or_default();
        for name in names {
            let op = escher_proto::types::CapacityOp::Delete;
            let target = escher_proto::types::NodeSpec::Node(id);
            self.core_event(Event::ResourceChanged { target, name, op }, now);
        }
        Ok(())
    }

    /// Feeds the core an event that cannot be refused (the caller checked it), keeping its
    /// decisions for [`settle`](Self::settle).
    pub(crate) fn core_event(&mut self, event: Event, now: Millis) {
        if let Err(err) = self.core.handle(event, now, &mut self.decisions) {
            // Only reachable through a bug in the head: every event is checked first.
            tracing::error!(%err, "scheduler core refused an event the head had checked");
        }
    }

    /// Acts on the core's decisions until there are none; acting may cause more.
    fn settle(&mut self, now: Millis) {
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
            Decision::Infeasible { task, reason } => {
                if let Some(rec) = self.tasks.get_mut(&task) {
                    rec.pending_reason = Some((*reason).clone());
                }
            }
            Decision::Feasible { task } => {
                if let Some(rec) = self.tasks.get_mut(&task) {
                    rec.pending_reason = None;
                }
            }
            Decision::DeadlinePassed { task } => {
                let why = match self.tasks.get(&task).and_then(|r| r.spec.pending_deadline) {
                    Some(d) => {
                        format!("pending deadline of {d:?} passed before any node could run it")
                    }
                    None => "pending deadline passed".to_string(),
                };
                self.terminate(
                    task,
                    escher_proto::types::TaskState::Cancelled,
                    Some(why),
                    None,
                    now,
                );
            }
            Decision::Lost { task, node } => {
                let why = format!("node {node} lost");
                self.failed_attempt(task, why, None, now);
            }
        }
    }
}
