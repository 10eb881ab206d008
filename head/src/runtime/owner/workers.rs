//! The owner's side of the worker link: registration (new or returning), a worker's stream
//! attaching, and the messages it reports (heartbeats, task starts and ends, devices, GPU
//! changes, log chunks), each checked against what the node holds before it becomes a command.

use escher_proto::types::{
    NodeId, RegisterReply, RegisterRequest, RunningTask, TaskId, WorkerMessage,
};
use tokio::sync::oneshot;
use tonic::Status;

use super::{Owner, new_secret};
use crate::replication::LogStore;
use crate::runtime::liveness::Heard;
use crate::runtime::proposals::Pending;
use crate::runtime::statuses::to_status;
use crate::state::{ApplyError, Command, Joining, Returning, SecretHash};

impl<S: LogStore> Owner<S> {
    pub(super) fn register(
        &mut self,
        request: RegisterRequest,
        reply: oneshot::Sender<Result<RegisterReply, Status>>,
    ) {
        if !self.leading {
            let _ = reply.send(Err(self.not_leader()));
            return;
        }
        if self.cannot_lead_now() {
            let _ = reply.send(Err(self.stalled_status()));
            return;
        }
        let worker = Joining {
            name: request.name,
            address: request.address,
            resources: request.resources,
            labels: request.labels,
            gpus: request.gpus,
            boot: request.boot_id,
        };
        // A node takes tasks once its stream is attached (`NodeAttached`), where every replica
        // of the group can read the commands that say so (`state/nodes.rs`).
        let on_attach = self.replica.writes_format() >= crate::replication::ATTACH_FORMAT;
        match request.identity {
            Some(identity) => {
                let back = Returning {
                    cluster: identity.group,
                    node: identity.node_id,
                    secret: SecretHash::of(&identity.secret),
                    running: request.running,
                    finished: request.finished,
                };
                let command = if on_attach {
                    Command::RejoinNodeUnattached { worker, back }
                } else {
                    Command::RejoinNode { worker, back }
                };
                let pending = Pending::Register {
                    reply,
                    secret: None,
                };
                self.propose(command, None, pending);
            }
            None => {
                let secret = new_secret();
                let secret_hash = SecretHash::of(&secret);
                let command = if on_attach {
                    Command::RegisterNodeUnattached {
                        worker,
                        secret: secret_hash,
                    }
                } else {
                    Command::RegisterNode {
                        worker,
                        secret: secret_hash,
                    }
                };
                let pending = Pending::Register {
                    reply,
                    secret: Some(secret),
                };
                self.propose(command, None, pending);
            }
        }
    }

    /// A worker's stream opened: `reply` is answered once its node takes tasks, at once for a
    /// node that does; for one that waited for its stream (`state/nodes.rs`), once the
    /// `NodeAttached` this proposes is applied (proposed again by the next leader if this one
    /// is lost before: the worker attaches there too).
    pub(super) fn attach(
        &mut self,
        node: NodeId,
        secret: &str,
        conn: u64,
        tx: crate::runtime::workers::LinkSender,
        reply: oneshot::Sender<Result<(), Status>>,
    ) {
        match self.link_stream(node, secret, conn, tx) {
            Ok(Some(boot)) => {
                let command = Command::NodeAttached { node, boot };
                self.propose(command, None, Pending::Attached(reply));
            }
            Ok(None) => {
                let _ = reply.send(Ok(()));
            }
            Err(status) => {
                let _ = reply.send(Err(status));
            }
        }
    }

    /// Checks a stream's node and secret and links it; the boot of a node that waited for its
    /// stream, to admit.
    pub(super) fn link_stream(
        &mut self,
        node: NodeId,
        secret: &str,
        conn: u64,
        tx: crate::runtime::workers::LinkSender,
    ) -> Result<Option<u64>, Status> {
        if !self.leading {
            return Err(self.not_leader());
        }
        if self.cannot_lead_now() {
            return Err(self.stalled_status());
        }
        let Some(record) = self.replica.state().node(node) else {
            return Err(unknown_node(node));
        };
        if record.secret != SecretHash::of(secret) {
            return Err(to_status(ApplyError::WrongSecret(node)));
        }
        if !record.alive {
            return Err(Status::failed_precondition(format!(
                "node {node} was declared lost; register again"
            )));
        }
        if !self.workers.registered_here(node) {
            // What its registration queued went with an earlier leadership (runtime/workers.rs,
            // "One leadership from registration to stream").
            return Err(Status::failed_precondition(format!(
                "node {node} registered with an earlier leader of the group, or with this \
                 replica before it led again; register again"
            )));
        }
        let boot = record.boot;
        self.workers.attach(node, conn, tx);
        tracing::info!(%node, "worker attached");
        Ok(self.replica.state().waits_for_stream(node).then_some(boot))
    }

    pub(super) fn on_worker_message(&mut self, node: NodeId, msg: WorkerMessage) {
        if !self.leading {
            return; // not ours to handle
        }
        let cannot_lead = self.cannot_lead_now();
        let renew = match self.workers.heard(self.replica.state(), node, cannot_lead) {
            // Declared lost: its tasks were retried already.
            Heard::Ignored => return,
            Heard::Noted { renew } => renew,
        };
        if let Some((task, attempt)) = msg.task_attempt()
            && !self.holds(node, task, attempt)
        {
            // A worker reports only what it runs: anything else is refused (and a worker that
            // keeps doing it is broken or hostile).
            tracing::warn!(
                %node,
                %task,
                attempt,
                "refusing a report for a task attempt this node does not hold"
            );
            if matches!(msg, WorkerMessage::TaskFinished(_)) {
                // Acknowledged so the worker forgets it; nothing is applied.
                self.workers.ack(
                    node,
                    RunningTask {
                        task_id: task,
                        attempt,
                    },
                );
            }
            return;
        }
        let command = match msg {
            WorkerMessage::Hello { .. } => return,
            WorkerMessage::Heartbeat {
                metrics,
                seq,
                fence,
                actors,
            } => {
                // The leader heard the worker: its lease runs on from when it sent this
                // heartbeat (DESIGN §13). Only a leader gets here, and a leader that loses its
                // quorum steps down (check-quorum) and drops every stream. A leader whose disk
                // is full does not: it takes no raft tick while stalled, so it would go on
                // believing it leads while the others elect another, which would then declare
                // this worker's node lost and retry its tasks while this lease kept them
                // running. So a stalled replica of a group renews no lease.
                if seq > 0 && renew {
                    self.workers
                        .send_now(node, escher_proto::types::HeadMessage::LeaseRenewed { seq });
                }
                let draining = metrics
                    .iter()
                    .any(|m| m.name == "draining" && m.value > 0.0);
                let under_reserve = metrics
                    .iter()
                    .find(|m| m.name == "disk_under_reserve")
                    .map(|m| m.value > 0.0);
                self.metrics.worker_reported(node, metrics);
                self.metrics.fences.reported(node, fence);
                self.metrics.actor_calls.reported(node, actors);
                if let Some(under) = under_reserve {
                    self.disk_reported(node, under);
                }
                if !draining || self.replica.state().node_draining(node) {
                    return;
                }
                tracing::info!(%node, "worker is draining; admitting nothing new there");
                Command::DrainNode { node }
            }
            WorkerMessage::TaskStarted { task_id, attempt } => Command::TaskStarted {
                task: task_id,
                attempt,
            },
            WorkerMessage::TaskFinished(mut report) => {
                use crate::replication::RESULT_OBJECTS_FORMAT;
                let writes = self.replica.writes_format();
                if let Ok(escher_proto::types::TaskResult::Object { size, .. }) = report.outcome
                    && writes < RESULT_OBJECTS_FORMAT
                {
                    // An older replica could not read the result: the attempt fails, saying
                    // why (refusing the report would leave the worker sending it forever).
                    report.outcome = Err(format!(
                        "its result of {size} bytes is an object, which the head group records                          from data format {RESULT_OBJECTS_FORMAT}, and it writes format                          {writes}: upgrade every replica, or return at most 100 KiB"
                    ));
                }
                let pending = Pending::Report {
                    node,
                    report: RunningTask {
                        task_id: report.task_id,
                        attempt: report.attempt,
                    },
                };
                self.propose(Command::TaskFinished(report), None, pending);
                return;
            }
            WorkerMessage::Logs { request_id, result } => {
                if let Some(pending) = self.logs.remove(&request_id) {
                    pending.answer(result);
                }
                return;
            }
            WorkerMessage::TaskDevices {
                task_id,
                attempt,
                devices,
            } => Command::TaskDevices {
                task: task_id,
                attempt,
                devices,
            },
            WorkerMessage::GpusChanged { gpus, done } => {
                if let Some(done) = &done {
                    match &done.error {
                        None => tracing::info!(%node, gpu = done.gpu, "MIG reconfiguration done"),
                        Some(why) => {
                            tracing::warn!(%node, gpu = done.gpu, %why, "MIG reconfiguration failed")
                        }
                    }
                }
                Command::GpusChanged { node, gpus, done }
            }
            WorkerMessage::ObjectsHeld(copies) => {
                self.objects_held(node, copies);
                return;
            }
        };
        self.propose(command, None, Pending::Quiet);
    }

    /// A heartbeat of `node` said whether its disk is under its reserve: where that is not
    /// what its labels say, the leader proposes the change
    /// ([`DISK_UNDER_RESERVE_LABEL`](escher_proto::types::DISK_UNDER_RESERVE_LABEL)), so that
    /// every replica's scheduler places nothing new there while it is (an assignment would
    /// only wait there, unstarted) and places there again once space is back. Only while the
    /// group writes [`DISK_RESERVE_FORMAT`](crate::replication::DISK_RESERVE_FORMAT): an older
    /// replica would place there regardless, and replicas must agree.
    fn disk_reported(&mut self, node: NodeId, under: bool) {
        use escher_proto::types::{DISK_UNDER_RESERVE_LABEL, Labels, under_disk_reserve};
        if self.replica.writes_format() < crate::replication::DISK_RESERVE_FORMAT {
            return;
        }
        let Some(record) = self.replica.state().node(node) else {
            return;
        };
        if !record.alive || under_disk_reserve(&record.labels) == under {
            return;
        }
        let mut set = Labels::new();
        let mut remove = Vec::new();
        if under {
            tracing::warn!(%node, "the node's disk is under its reserve: placing nothing new there");
            // A valid label: a reserved key the head sets, a plain value.
            let _ = set.insert(DISK_UNDER_RESERVE_LABEL, "true");
        } else {
            tracing::info!(%node, "the node's disk has room again: placing tasks there");
            remove.push(DISK_UNDER_RESERVE_LABEL.to_string());
        }
        let command = Command::LabelNode {
            node,
            set,
            remove,
            drain: false,
        };
        self.propose(command, None, Pending::Quiet);
    }

    /// Whether `node` runs (or just ran) attempt `attempt` of `task`: the task's latest
    /// attempt was dispatched there.
    fn holds(&self, node: NodeId, task: TaskId, attempt: u32) -> bool {
        self.replica
            .state()
            .task(task)
            .is_some_and(|rec| rec.node == Some(node) && rec.attempt == attempt)
    }
}

/// The answer to a worker that presents a node id this group does not know.
pub(super) fn unknown_node(node: NodeId) -> Status {
    Status::not_found(format!(
        "node {node} is not known to this head group (its state was lost, or the worker's \
         state directory comes from another cluster): register as a new node (the worker does \
         so by itself)"
    ))
}

#[cfg(test)]
mod tests {
    use super::super::test_owner;
    use super::*;
    use escher_proto::types::ReplicaRole;

    #[test]
    fn only_a_leader_registers_and_attaches_known_nodes() {
        let mut owner = test_owner();
        let request = RegisterRequest {
            name: "w".into(),
            address: String::new(),
            resources: Default::default(),
            labels: Default::default(),
            running: Vec::new(),
            gpus: Vec::new(),
            finished: Vec::new(),
            identity: None,
            boot_id: 1,
        };
        let (reply, mut rx) = oneshot::channel();
        owner.register(request, reply);
        assert_eq!(
            rx.try_recv().unwrap().unwrap_err().code(),
            tonic::Code::Unavailable
        );
        let (tx, _rx) = crate::runtime::workers::link_channel(1024);
        let refused = owner
            .link_stream(NodeId(9), "s", 1, tx.clone())
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unavailable);
        owner.on_role(ReplicaRole::Leader, Some(1));
        let unknown = owner.link_stream(NodeId(9), "s", 1, tx).unwrap_err();
        assert_eq!(unknown.code(), tonic::Code::NotFound);
        assert!(
            unknown.message().contains("register as a new node"),
            "{unknown:?}"
        );
    }

    #[test]
    fn a_leader_registers_a_node_that_waits_for_its_stream() {
        let mut owner = test_owner();
        owner.on_role(ReplicaRole::Leader, Some(1));
        let _init = owner.batch.take();
        let request = RegisterRequest {
            name: "w".into(),
            address: String::new(),
            resources: Default::default(),
            labels: Default::default(),
            running: Vec::new(),
            gpus: Vec::new(),
            finished: Vec::new(),
            identity: None,
            boot_id: 1,
        };
        let (reply, _rx) = oneshot::channel();
        owner.register(request, reply);
        let proposed = owner.batch.take().commands;
        assert!(
            matches!(
                proposed[..],
                [(Command::RegisterNodeUnattached { .. }, None)]
            ),
            "{proposed:?}"
        );
    }

    #[test]
    fn a_stream_is_taken_only_in_the_leadership_that_answered_its_registration() {
        let (mut owner, worker) = super::super::leading_test_owner();
        let register = Command::RegisterNodeUnattached {
            worker,
            secret: SecretHash::of("s"),
        };
        let entry = escher_core::state::Entry::new(1, register);
        let node = match owner.replica.apply_for_test(entry) {
            Ok(crate::state::Reply::Registered(node)) => node,
            other => panic!("{other:?}"),
        };
        // The registration was answered by no leadership of this replica's (another replica
        // led, or this one before it lost the lead): what it queued is not here.
        let (tx, _rx) = crate::runtime::workers::link_channel(1024);
        let refused = owner.link_stream(node, "s", 1, tx.clone()).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
        assert!(refused.message().contains("register again"), "{refused:?}");
        // Answered here: the stream is taken.
        owner.workers.registered(node);
        assert!(owner.link_stream(node, "s", 2, tx.clone()).is_ok());
        // Leadership lost and won again before the worker's next stream: refused again.
        owner.on_role(ReplicaRole::Follower, Some(2));
        owner.on_role(ReplicaRole::Leader, Some(1));
        let refused = owner.link_stream(node, "s", 3, tx).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    }

    #[test]
    fn a_node_the_state_does_not_hold_reports_nothing() {
        let mut owner = test_owner();
        owner.on_role(ReplicaRole::Leader, Some(1));
        let _init = owner.batch.take();
        let started = WorkerMessage::TaskStarted {
            task_id: TaskId(1),
            attempt: 1,
        };
        owner.on_worker_message(NodeId(9), started);
        assert!(owner.batch.is_empty());
        assert!(!owner.holds(NodeId(9), TaskId(1), 1));
    }
}
