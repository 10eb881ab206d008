//! Nodes at the head: a worker's first registration, its return (the same process
//! reconnecting, or a restarted one), its departure and its drain.
//!
//! # Identities
//!
//! A worker's first registration makes a node: the id comes from this state (never reused)
//! and the command carries the SHA-256 of a secret that the leader generated and gives only to
//! that worker. A returning worker presents its id and secret: the runtime hashes the secret
//! and the state compares, so two workers can never hold one id. The command also carries the
//! worker process's boot id:
//!
//! - the **same boot** on a live node is the same process reconnecting (a broken stream, a new
//!   leader): its unacknowledged reports are applied, and its tasks are reconciled with what
//!   this state believes runs there (see [`ClusterState::reconcile`]);
//! - **another boot**, or a node that was declared lost, is a worker that lost its tasks: the
//!   node is removed (its running tasks become failed attempts, retried under `max_retries`)
//!   and added again under the same id with what the worker has now;
//! - the **first return after a restore** from a backup (`incarnation.rs`) of a node that was
//!   live in the backup is reconciled strictly: what the backup believes runs there and the
//!   worker neither runs nor reported is a failed attempt, never sent again.
//!
//! # A node takes tasks once its stream is attached
//!
//! Registering is one call and attaching the stream that carries assignments is the next; a
//! worker that registers and never attaches (it crashed in between, or it is hostile and holds
//! the join token) must not be given tasks that then wait for a heartbeat timeout and fail.
//! So a node registered with [`Admit::OnAttach`] (`RegisterNodeUnattached`,
//! `RejoinNodeUnattached`) is live but not in the scheduler core: nothing is placed there. When
//! the leader holds its stream it proposes `NodeAttached`, whose entry adds the node to the
//! core with what its record says (resources, GPUs). It is a command, not the leader's soft
//! state, because placement must be the same on every replica: a new leader, or a replica
//! replaying its log, agrees on which nodes take tasks. Failover keeps this: a worker that
//! re-registers with a new leader as the same process keeps what it had (a node that took
//! tasks still does, its tasks run on; one that waited still waits for its stream to the new
//! leader), and a restarted worker (another boot) waits again. A node that never attaches is
//! declared lost a heartbeat timeout after it registered, having run nothing. The waiting is
//! derived (a live node the core does not hold), so the snapshot layout is unchanged; the two
//! commands are data format 3, and a group that writes an older format registers nodes with
//! [`Admit::Now`], as before.

use std::collections::{BTreeMap, BTreeSet};

use escher_proto::types::{
    Assignment, Capacity, ClusterEvent, DRAIN_AT_LABEL, GpuInfo, Labels, MAX_LABELS, NodeChange,
    NodeId, ResourceSet, RunningTask, TaskFinished, TaskId, TaskState, is_reserved_label,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::apply::ClusterState;
use super::command::Effect;
use super::error::ApplyError;
use super::record::NodeRecord;
use crate::scheduler::{Event, Millis};

/// The SHA-256 of a node's secret: all the state keeps of it.
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretHash(pub [u8; 32]);

impl SecretHash {
    /// The hash of `secret`.
    pub fn of(secret: &str) -> SecretHash {
        SecretHash(Sha256::digest(secret.as_bytes()).into())
    }
}

impl std::fmt::Debug for SecretHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretHash({:02x}{:02x}..)", self.0[0], self.0[1])
    }
}

/// When a registered node takes tasks (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// At once (`RegisterNode`, `RejoinNode`: data formats before 3).
    Now,
    /// Once its worker's stream is attached (`NodeAttached`).
    OnAttach,
}

/// What a worker says about itself when it registers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Joining {
    /// Its name.
    pub name: String,
    /// Its address, for people.
    pub address: String,
    /// Its physical and static resources.
    pub resources: ResourceSet,
    /// Its labels.
    pub labels: Labels,
    /// Its GPUs as they are now.
    pub gpus: Vec<GpuInfo>,
    /// Its process's boot id.
    pub boot: u64,
}

/// A returning worker: who it says it is, and what it runs and has finished.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Returning {
    /// The cluster that issued its identity.
    pub cluster: String,
    /// The node id it got at its first registration.
    pub node: NodeId,
    /// The hash of the secret it presented.
    pub secret: SecretHash,
    /// The tasks it runs now.
    pub running: Vec<RunningTask>,
    /// Reports no head has acknowledged.
    pub finished: Vec<TaskFinished>,
}

impl ClusterState {
    /// A worker joins for the first time: a new node, never an id used before.
    pub(crate) fn register(
        &mut self,
        worker: Joining,
        secret: SecretHash,
        admit: Admit,
        now: Millis,
    ) -> Result<NodeId, ApplyError> {
        let id = NodeId(self.next_node);
        self.next_node += 1;
        self.nodes.insert(
            id,
            NodeRecord {
                name: String::new(),
                address: String::new(),
                labels: Labels::new(),
                resources: ResourceSet::new(),
                alive: false,
                draining: false,
                gone_because: None,
                left_at: None,
                gpus: Vec::new(),
                mig: BTreeMap::new(),
                mig_errors: BTreeMap::new(),
                mig_reports: BTreeMap::new(),
                secret,
                boot: worker.boot,
            },
        );
        self.add_live(id, worker, admit, now)?;
        self.record_node(id, NodeChange::Joined, None, now);
        self.number_registration(id);
        Ok(id)
    }

    /// A worker comes back with the id and secret of its first registration.
    pub(crate) fn rejoin(
        &mut self,
        worker: Joining,
        back: Returning,
        admit: Admit,
        now: Millis,
    ) -> Result<NodeId, ApplyError> {
        let node = back.node;
        if self.cluster_id.as_deref() != Some(back.cluster.as_str()) {
            return Err(ApplyError::OtherCluster {
                node,
                theirs: back.cluster,
                ours: self.cluster_id.clone().unwrap_or_default(),
            });
        }
        let Some(record) = self.nodes.get_mut(&node) else {
            return Err(ApplyError::UnknownNode(node));
        };
        if record.secret != back.secret {
            return Err(ApplyError::WrongSecret(node));
        }
        let alive = record.alive;
        // Its first return since a restore: the state's picture of the node is the backup's.
        let restored = self.incarnation.unreconciled.remove(&node);
        if alive && record.boot == worker.boot {
            record.name = worker.name;
            record.address = worker.address;
            // What the state runs there before the reports: only these may need sending again
            // (what the reports free is dispatched, and sent, as usual).
            let placed = self.running_on(node);
            let mut reported: BTreeSet<(TaskId, u32)> = back
                .running
                .iter()
                .map(|r| (r.task_id, r.attempt))
                .collect();
            self.effects.push(Effect::Rejoined { node });
            for report in back.finished {
                reported.insert((report.task_id, report.attempt));
                self.finished(report, now);
            }
            self.reconcile(node, &placed, &reported, &back.running, restored, now);
            if let Err(err) = self.gpus_changed(node, worker.gpus, None, now) {
                tracing::warn!(%node, %err, "could not record the worker's GPUs");
            }
            self.record_node(node, NodeChange::Rejoined, None, now);
            self.number_registration(node);
            return Ok(node);
        }
        // A restarted worker, or one the head declared lost: what it ran is gone.
        self.effects.push(Effect::Rejoined { node });
        if alive {
            let why = "its worker restarted and lost its tasks".to_string();
            self.remove_node(node, why, now)?;
            // Its tasks become failed attempts before the node is back.
            self.settle(now);
        }
        for r in back.running {
            // Still running after the node was declared lost: the head retried or failed it.
            self.effects.push(Effect::Cancel {
                node,
                task: r.task_id,
                attempt: r.attempt,
                reason: format!("node {node} was declared lost; this attempt no longer counts"),
                force: false,
            });
        }
        // Nothing above drops the record (only retention does, after the command), so this
        // cannot fail; were it to, the refusal is the same on every replica.
        self.add_live(node, worker, admit, now)?;
        self.record_node(node, NodeChange::Rejoined, None, now);
        self.number_registration(node);
        Ok(node)
    }

    /// Gives `node`'s registration, whose event was just recorded, its number: that event's
    /// revision, or none when the entry numbers no registration (`registrations.rs`).
    fn number_registration(&mut self, node: NodeId) {
        let number = self.numbering.then_some(self.revision);
        self.registrations.registered(node, number);
    }

    /// The number of `node`'s current registration, if it has one (`registrations.rs`): what
    /// a leader that declares the node lost names in its removal.
    pub fn registration(&self, node: NodeId) -> Option<u64> {
        self.registrations.get(node)
    }

    /// The number of every node's current registration that has one.
    pub fn registrations(&self) -> &super::registrations::Registrations {
        &self.registrations
    }

    /// Sets the registration numbers (a snapshot that carries them was read).
    pub fn set_registrations(&mut self, registrations: super::registrations::Registrations) {
        self.registrations = registrations;
    }

    /// `RemoveJudgedNode`: removes `id` as [`remove_node`](Self::remove_node) does if its
    /// registration is still `judged`; after the node registered again it changes nothing
    /// (the new registration was not judged), and the head's log says so.
    pub(crate) fn remove_judged_node(
        &mut self,
        id: NodeId,
        judged: Option<u64>,
        reason: String,
        now: Millis,
    ) -> Result<(), ApplyError> {
        if !self.nodes.contains_key(&id) {
            return Err(ApplyError::UnknownNode(id));
        }
        let current = self.registrations.get(id);
        if current != judged {
            tracing::info!(
                node = %id,
                ?judged,
                ?current,
                %reason,
                "a removal judged on an earlier registration of the node changes nothing: \
                 its worker registered again since"
            );
            return Ok(());
        }
        self.remove_node(id, reason, now)
    }

    /// Makes `id`, whose record the caller made or found, a live node with what `worker`
    /// has (its boot included), in the scheduler core now or once its stream attaches.
    fn add_live(
        &mut self,
        id: NodeId,
        worker: Joining,
        admit: Admit,
        now: Millis,
    ) -> Result<(), ApplyError> {
        let Some(record) = self.nodes.get_mut(&id) else {
            return Err(ApplyError::UnknownNode(id));
        };
        record.name = worker.name;
        record.address = worker.address;
        record.labels = rejoined_labels(&record.labels, worker.labels);
        record.resources = worker.resources;
        record.boot = worker.boot;
        record.alive = true;
        record.draining = false;
        record.gone_because = None;
        record.left_at = None;
        record.gpus = Vec::new();
        record.mig.clear();
        record.mig_errors.clear();
        if admit == Admit::Now {
            self.admit(id, now);
        }
        // A node that waits for its stream keeps its GPUs in its record; they become
        // resources when it is admitted.
        if let Err(err) = self.gpus_changed(id, worker.gpus, None, now) {
            tracing::warn!(node = %id, %err, "could not record the worker's GPUs");
        }
        Ok(())
    }

    /// `NodeAttached`: the leader holds the stream of `node`'s worker of boot `boot`. A live
    /// node that waited for it is admitted; anything else (a node already admitted, a stream
    /// of a process that registered before the current one, a node no longer live) is left as
    /// it is.
    pub(crate) fn attached(
        &mut self,
        node: NodeId,
        boot: u64,
        now: Millis,
    ) -> Result<(), ApplyError> {
        let record = self.nodes.get(&node).ok_or(ApplyError::UnknownNode(node))?;
        if record.boot == boot && self.waits_for_stream(node) {
            self.admit(node, now);
            self.sync_gpu_resources(node, now);
        }
        Ok(())
    }

    /// Whether `node` is live but takes no task until its worker's stream attaches.
    pub fn waits_for_stream(&self, node: NodeId) -> bool {
        self.node_alive(node) && self.core.node(node).is_none()
    }

    /// Adds live node `id` to the scheduler core with what its record says: from now on it
    /// takes tasks. A node that began draining while it waited comes with no capacity, as
    /// [`drain_node`](Self::drain_node) leaves one.
    fn admit(&mut self, id: NodeId, now: Millis) {
        let Some(record) = self.nodes.get(&id) else {
            return;
        };
        let resources = if record.draining {
            Vec::new()
        } else {
            record
                .resources
                .iter()
                .map(|(n, a)| (n.clone(), Capacity::Finite(a)))
                .collect()
        };
        let labels = record.labels.clone();
        // The core's decisions wait for `settle`, after the record is up to date.
        self.core_event(
            Event::NodeAdded {
                node: id,
                resources,
                labels,
            },
            now,
        );
    }

    /// Settles what a reconnecting worker runs against what this state believes runs on its
    /// node. A task the state runs there that the worker neither runs nor reported was never
    /// delivered (the `Assign` was lost with a stream or a leader): it is sent again, same
    /// attempt (the worker runs an attempt at most once). A task whose cancel was asked for is
    /// cancelled again, or ends now if the worker never got it. What the worker runs that the
    /// state does not run there is cancelled.
    ///
    /// `restored`: the node's first return since this state was restored from a backup
    /// (`incarnation.rs`). Then an attempt the worker neither runs nor reported may have run
    /// and ended after the backup: it is a failed attempt, with the reason, retried under
    /// `max_retries`. A task that waits while the worker runs a later attempt of it numbers
    /// its next attempt past that one.
    fn reconcile(
        &mut self,
        node: NodeId,
        placed: &[(TaskId, u32)],
        reported: &BTreeSet<(TaskId, u32)>,
        running: &[RunningTask],
        restored: bool,
        now: Millis,
    ) {
        // What is sent again goes after the cancels: a node must stop an attempt the head gave
        // up before it is told to run the next attempt of the same task.
        let mut again = Vec::new();
        for &(task, attempt) in placed {
            let Some(rec) = self.tasks.get(&task) else {
                continue;
            };
            let still = rec.state == TaskState::Running && rec.attempt == attempt;
            if rec.native || !still {
                continue;
            }
            let requeue = rec.requeue.is_some();
            let cancel = rec.cancel_requested || requeue;
            match (reported.contains(&(task, attempt)), cancel) {
                (true, false) => {}
                (true, true) => self.effects.push(Effect::Cancel {
                    node,
                    task,
                    attempt,
                    reason: if requeue {
                        "requeued"
                    } else {
                        "cancelled by request"
                    }
                    .into(),
                    force: false,
                }),
                (false, true) => {
                    self.ghost_resources(task, node, false, now);
                    self.core_event(Event::TaskFinished { task }, now);
                    if requeue {
                        self.requeued_attempt_ended(task, now);
                        continue;
                    }
                    let why = Some("cancelled by request before it started".to_string());
                    self.terminate(task, TaskState::Cancelled, why, None, now);
                }
                (false, false) if restored => {
                    let why = self.restored_attempt_lost(node);
                    self.ghost_resources(task, node, false, now);
                    self.core_event(Event::TaskFinished { task }, now);
                    self.failed_attempt(task, why, None, now);
                }
                (false, false) => {
                    let assignment = Box::new(Assignment {
                        task_id: task,
                        attempt,
                        spec: rec.spec.clone(),
                        allocation: rec.spec.resources.clone(),
                        task_token: String::new(),
                        objects: Vec::new(),
                    });
                    again.push(Effect::Assign { node, assignment });
                }
            }
        }
        for r in running {
            let current = self.tasks.get(&r.task_id).is_some_and(|rec| {
                rec.state == TaskState::Running
                    && rec.node == Some(node)
                    && rec.attempt == r.attempt
            });
            if restored
                && let Some(rec) = self.tasks.get_mut(&r.task_id)
                && rec.state == TaskState::Pending
            {
                // That attempt was dispatched after the backup: the next one goes past it.
                rec.attempt = rec.attempt.max(r.attempt);
            }
            if !current {
                self.effects.push(Effect::Cancel {
                    node,
                    task: r.task_id,
                    attempt: r.attempt,
                    reason: if restored {
                        "the head was restored from a backup that does not run this attempt here"
                    } else {
                        "the head no longer runs this attempt here"
                    }
                    .into(),
                    force: false,
                });
            }
        }
        self.effects.extend(again);
    }

    /// A worker left or went silent: its node is no longer live and its running tasks are
    /// failed attempts.
    pub(crate) fn remove_node(
        &mut self,
        id: NodeId,
        reason: String,
        now: Millis,
    ) -> Result<(), ApplyError> {
        let record = self.nodes.get_mut(&id).ok_or(ApplyError::UnknownNode(id))?;
        if !record.alive {
            return Ok(());
        }
        // Its tasks become failed attempts now: nothing is left to reconcile when it returns.
        self.incarnation.unreconciled.remove(&id);
        record.alive = false;
        record.gone_because = Some(reason.clone());
        record.left_at = Some(now);
        self.retention.node_left(id);
        let rebuild = self.objects_node_lost(id, &reason);
        self.record_node(id, NodeChange::Lost, Some(reason.clone()), now);
        if self.core.node(id).is_some() {
            // (A node that waited for its stream never was in the core.)
            self.core_event(Event::NodeRemoved { node: id }, now);
        }
        // Lineage: after the node left the core, so that no rebuild is placed on it.
        self.rebuild_results(&rebuild, id, &reason, now);
        Ok(())
    }

    /// Sets every capacity of a draining node to zero. Running tasks keep what they hold (a
    /// capacity below use admits nothing new), so the node empties as they finish.
    pub(crate) fn drain_node(&mut self, id: NodeId, now: Millis) -> Result<(), ApplyError> {
        let record = self.nodes.get_mut(&id).ok_or(ApplyError::UnknownNode(id))?;
        if !record.alive || record.draining {
            return Ok(());
        }
        record.draining = true;
        self.record_node(id, NodeChange::Draining, None, now);
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

    /// Sets and removes labels of live node `id`, all or none, and drains it when `drain` (see
    /// [`Command::LabelNode`](super::Command::LabelNode)); answers its labels after.
    pub(crate) fn label_node(
        &mut self,
        id: NodeId,
        set: Labels,
        remove: &[String],
        drain: bool,
        now: Millis,
    ) -> Result<Labels, ApplyError> {
        let record = self.nodes.get(&id).ok_or(ApplyError::UnknownNode(id))?;
        if !record.alive {
            return Err(ApplyError::NodeNotLive(id));
        }
        let mut labels = record.labels.clone();
        for key in remove {
            labels.remove(key);
        }
        for (key, value) in set.iter() {
            // Both are valid already: `set` is a `Labels`.
            let _ = labels.insert(key, value);
        }
        if labels.len() > MAX_LABELS {
            return Err(ApplyError::TooManyLabels {
                node: id,
                count: labels.len(),
                max: MAX_LABELS,
            });
        }
        if labels != record.labels {
            if self.core.has_node(id) {
                self.core.set_node_labels(id, labels.clone())?;
                // A walltime's end that moved later may let a waiting task in at once.
                self.core_event(Event::Tick, now);
            }
            if let Some(record) = self.nodes.get_mut(&id) {
                record.labels = labels.clone();
            }
            self.record_node(id, NodeChange::Labelled, None, now);
        }
        if drain {
            self.drain_node(id, now)?;
        }
        Ok(labels)
    }

    /// The live nodes, not yet draining, whose walltime's drain time ([`DRAIN_AT_LABEL`]) is
    /// `now` or past: the owner drains each and labels it [`ENDING_SOON_LABEL`].
    ///
    /// [`ENDING_SOON_LABEL`]: escher_proto::types::ENDING_SOON_LABEL
    pub fn nodes_ending(&self, now: Millis) -> Vec<NodeId> {
        self.nodes
            .iter()
            .filter(|(_, r)| r.alive && !r.draining)
            .filter(|(_, r)| drain_at(&r.labels).is_some_and(|at| at <= now))
            .map(|(id, _)| *id)
            .collect()
    }

    /// The earliest drain time of a live node's walltime that is still to come, for the
    /// owner's timer.
    pub fn next_walltime_drain(&self) -> Option<Millis> {
        self.nodes
            .values()
            .filter(|r| r.alive && !r.draining)
            .filter_map(|r| drain_at(&r.labels))
            .min()
    }

    /// Records a change of node `id`.
    fn record_node(&mut self, id: NodeId, change: NodeChange, reason: Option<String>, now: Millis) {
        let name = self
            .nodes
            .get(&id)
            .map(|r| r.name.clone())
            .unwrap_or_default();
        let event = ClusterEvent::Node {
            node: id,
            name,
            change,
            reason,
        };
        self.record(event, Labels::new(), now);
    }
}

/// When a node's walltime has the head drain it ([`DRAIN_AT_LABEL`]), if it has one.
fn drain_at(labels: &Labels) -> Option<Millis> {
    labels.get(DRAIN_AT_LABEL)?.parse().ok()
}

/// A returning worker's labels: the labels it registers with now, over the ones its node had.
/// escher's own labels (`escher.`) are the worker's to say, so they come from the worker alone;
/// other labels set while the node ran (`escher node label`) stay unless the worker names the
/// same key, as Kubernetes keeps a node's labels across kubelet restarts. A label dropped from
/// `--labels` therefore stays until it is removed with `escher node label NODE KEY-`.
fn rejoined_labels(before: &Labels, now: Labels) -> Labels {
    let mut labels = now;
    for (key, value) in before.iter() {
        if !is_reserved_label(key) && labels.get(key).is_none() && labels.len() < MAX_LABELS {
            let _ = labels.insert(key, value);
        }
    }
    labels
}
