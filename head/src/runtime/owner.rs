//! The one task that owns the head's replica (and through it the state). gRPC handlers send
//! it [`Msg`]s and await replies; peers' raft traffic arrives on a channel of its own.
//!
//! Each turn of the loop takes everything that is waiting (client writes become proposals,
//! reads join one ReadIndex batch, raft messages are stepped), then runs one ready cycle of
//! the replica and acts on what it produced: proposals are answered once their entries are
//! applied, effects are performed (on the leader only), reads run, waits resume. See
//! `replication` for the cycle itself, `proposals.rs`, `reads.rs` and `workers.rs` for the
//! soft state kept here.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use escher_proto::types::{
    HeadChange, HeadMessage, HeadReplica, MAX_ATTEMPTS_KEPT, NAMESPACE_LABEL, NodeId,
    RegisterReply, RegisterRequest, RunningTask, TaskId, TaskLogsRequest, WaitReply, WorkerMessage,
};
use rustc_hash::FxHashMap;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::config::HeadConfig;
use super::handle::{Query, not_accepted, to_status};
use super::logs::{LogReply, PendingFetch, TailRead};
use super::metrics::Metrics;
use super::proposals::{Batch, Pending, Proposals};
use super::reads::{ReadJob, Reads};
use super::waiters::Waiters;
use super::watch::{Filter, Hub, Subscription};
use super::workers::Workers;
use crate::auth::Keys;
use crate::replication::{
    Applied, Inbound, LogStore, NotAccepted, Output, Replica, ReplicationError, TransportEvent,
};
use crate::scheduler::Millis;
use crate::state::{ApplyError, Command, Effect, Joining, Reply, Returning, SecretHash};
use escher_proto::types::{ReplicaRole, RequestKey};

/// The most messages of one channel taken in one turn, so that the others are not starved.
const TURN: usize = 1024;

/// A request to the owner.
pub(crate) enum Msg {
    /// Apply a command through the log.
    Apply {
        command: Command,
        key: Option<RequestKey>,
        reply: oneshot::Sender<Result<Reply, Status>>,
    },
    /// Run a read-only query.
    Read { job: Query, stale: bool },
    /// Answer when `num_returns` of `ids` are terminal.
    Wait {
        ids: Vec<TaskId>,
        num_returns: usize,
        reply: oneshot::Sender<Result<WaitReply, Status>>,
    },
    /// A worker registers.
    Register {
        request: RegisterRequest,
        reply: oneshot::Sender<Result<RegisterReply, Status>>,
    },
    /// A worker's stream opened.
    Attach {
        node: NodeId,
        secret: String,
        conn: u64,
        tx: super::workers::LinkSender,
        reply: oneshot::Sender<Result<(), Status>>,
    },
    /// A worker's stream closed.
    Detach { node: NodeId, conn: u64 },
    /// A worker sent a batch of messages (in order).
    Worker {
        node: NodeId,
        msgs: Vec<WorkerMessage>,
    },
    /// Fetch a piece of a task's log from its worker.
    Logs {
        request: TaskLogsRequest,
        reply: LogReply,
    },
    /// This replica's own status, the group's id and every member's address.
    Heads { reply: oneshot::Sender<HeadsView> },
    /// How many messages wait for each worker (on its stream, or until it attaches).
    Outboxes {
        reply: oneshot::Sender<Vec<(NodeId, usize)>>,
    },
    /// Change the group's membership.
    ChangeHeads {
        change: HeadChange,
        reply: oneshot::Sender<Result<(), Status>>,
    },
    /// Subscribe to events after a revision (or from now).
    Watch {
        filter: Filter,
        after: Option<u64>,
        reply: oneshot::Sender<Result<Subscription, Status>>,
    },
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Msg::Apply { .. } => "Apply",
            Msg::Read { .. } => "Read",
            Msg::Wait { .. } => "Wait",
            Msg::Register { .. } => "Register",
            Msg::Attach { .. } => "Attach",
            Msg::Detach { .. } => "Detach",
            Msg::Worker { .. } => "Worker",
            Msg::Logs { .. } => "Logs",
            Msg::Heads { .. } => "Heads",
            Msg::Outboxes { .. } => "Outboxes",
            Msg::ChangeHeads { .. } => "ChangeHeads",
            Msg::Watch { .. } => "Watch",
        })
    }
}

/// What one replica knows of its group, for `escher heads`.
#[derive(Debug, Clone)]
pub(crate) struct HeadsView {
    pub(crate) group: String,
    pub(crate) me: HeadReplica,
    pub(crate) members: std::collections::BTreeMap<u64, String>,
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as Millis)
}

/// The channels the owner serves.
#[derive(Debug)]
pub(crate) struct Inboxes {
    pub(crate) requests: mpsc::Receiver<Msg>,
    pub(crate) raft: mpsc::Receiver<Inbound>,
    pub(crate) transport: mpsc::UnboundedReceiver<TransportEvent>,
}

/// The owner of the replica and the soft state around it.
#[derive(Debug)]
pub(crate) struct Owner<S: LogStore> {
    /// Who may call: the owner publishes replicated tokens into it and signs task credentials.
    keys: Arc<Keys>,
    /// What the metrics endpoint reports between scrapes.
    metrics: Arc<Metrics>,
    replica: Replica<S>,
    config: HeadConfig,
    /// The commands of this turn, proposed together before the cycle.
    batch: Batch,
    proposals: Proposals,
    workers: Workers,
    waiters: Waiters,
    reads: Reads,
    logs: FxHashMap<u64, PendingFetch>,
    next_log: u64,
    /// The recent events and their watchers.
    watch: Hub,
    /// The events of this turn's applied commands, published together after the cycle.
    events: Vec<crate::state::Recorded>,
    last_prune: Instant,
    leading: bool,
}

impl<S: LogStore> Owner<S> {
    pub(crate) fn new(
        replica: Replica<S>,
        config: HeadConfig,
        keys: Arc<Keys>,
        metrics: Arc<Metrics>,
    ) -> Owner<S> {
        keys.publish(replica.state());
        let watch = Hub::new(
            config.watch_history,
            config.watch_buffer,
            replica.state().revision(),
        );
        Owner {
            watch,
            events: Vec::new(),
            keys,
            metrics,
            replica,
            config,
            batch: Batch::default(),
            proposals: Proposals::default(),
            workers: Workers::default(),
            waiters: Waiters::default(),
            reads: Reads::default(),
            logs: FxHashMap::default(),
            next_log: 1,
            last_prune: Instant::now(),
            leading: false,
        }
    }

    /// Serves until shutdown (or until the replica fails, which stops the head). Workers are
    /// not told to stop: their streams end, and they wait for a head to come back.
    pub(crate) async fn run(
        mut self,
        mut inboxes: Inboxes,
        shutdown: CancellationToken,
    ) -> Result<(), ReplicationError> {
        let mut tick = tokio::time::interval(self.config.tick_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut raft_tick = tokio::time::interval(self.config.replica.tick);
        raft_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let result = loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break Ok(()),
                Some(inbound) = inboxes.raft.recv() => self.on_inbound(inbound),
                Some(event) = inboxes.transport.recv() => self.replica.on_transport(event),
                msg = inboxes.requests.recv() => match msg {
                    Some(msg) => self.handle(msg),
                    None => break Ok(()),
                },
                _ = raft_tick.tick() => self.replica.tick(),
                _ = tick.tick() => self.on_tick(),
            }
            self.drain(&mut inboxes);
            self.flush();
            if let Some(token) = self.reads.batch() {
                self.replica.read_index(token);
            }
            if let Err(err) = self.cycle().await {
                break Err(err);
            }
        };
        if let Err(err) = &result {
            tracing::error!(%err, "the replica failed; the head stops");
        }
        self.stop_leading(|| Status::unavailable("the head is shutting down"));
        tracing::info!("head state owner stopped");
        result
    }

    /// Takes what else is waiting, a bounded number per channel.
    fn drain(&mut self, inboxes: &mut Inboxes) {
        for _ in 0..TURN {
            match inboxes.raft.try_recv() {
                Ok(inbound) => self.on_inbound(inbound),
                Err(_) => break,
            }
        }
        while let Ok(event) = inboxes.transport.try_recv() {
            self.replica.on_transport(event);
        }
        for _ in 0..TURN {
            match inboxes.requests.try_recv() {
                Ok(msg) => self.handle(msg),
                Err(_) => break,
            }
        }
    }

    async fn cycle(&mut self) -> Result<(), ReplicationError> {
        let mut out = Vec::new();
        self.replica.cycle(&mut out).await?;
        if !out.is_empty() {
            // Tokens created or revoked, or a snapshot restored: callers are checked against
            // the new table from now on.
            self.keys.publish(self.replica.state());
        }
        for output in out {
            self.on_output(output);
        }
        self.publish_events();
        Ok(())
    }

    /// Hands this turn's events to the watch hub, in one batch.
    fn publish_events(&mut self) {
        if !self.events.is_empty() {
            self.watch.publish(std::mem::take(&mut self.events));
        }
    }

    fn on_inbound(&mut self, inbound: Inbound) {
        match inbound {
            Inbound::Messages {
                from,
                from_address,
                messages,
            } => self.replica.step(from, &from_address, messages),
            Inbound::Status { reply } => {
                let _ = reply.send(self.replica.status());
            }
        }
    }

    fn not_leader(&self) -> Status {
        not_accepted(self.replica.not_leader())
    }

    /// Adds `command` to this turn's batch; `pending` is settled when its entry is applied.
    fn propose(&mut self, command: Command, key: Option<RequestKey>, pending: Pending) {
        if !self.leading {
            pending.fail(self.not_leader());
            return;
        }
        if self.batch.push(command, key, pending) {
            self.flush();
        }
    }

    /// Proposes this turn's batch as one raft entry.
    fn flush(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let Batch { commands, pending } = self.batch.take();
        match self.replica.propose(commands, now_ms()) {
            Ok((index, term)) => self.proposals.insert(index, term, pending),
            Err(why) => {
                let status = not_accepted(why);
                for p in pending {
                    p.fail(status.clone());
                }
            }
        }
    }

    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Apply {
                command,
                key,
                reply,
            } => self.propose(command, key, Pending::Reply(reply)),
            Msg::Read { job, stale: true } => job(Ok(self.replica.state())),
            Msg::Read { job, stale: false } => {
                if self.leading {
                    self.reads.push(ReadJob::Query(job));
                } else {
                    job(Err(self.not_leader()));
                }
            }
            Msg::Wait {
                ids,
                num_returns,
                reply,
            } => {
                if self.leading {
                    self.reads.push(ReadJob::Wait {
                        ids,
                        num_returns,
                        reply,
                    });
                } else {
                    let _ = reply.send(Err(self.not_leader()));
                }
            }
            Msg::Register { request, reply } => self.register(request, reply),
            Msg::Attach {
                node,
                secret,
                conn,
                tx,
                reply,
            } => {
                let _ = reply.send(self.attach(node, &secret, conn, tx));
            }
            Msg::Detach { node, conn } => {
                if self.workers.detach(node, conn) {
                    tracing::info!(%node, "worker detached");
                    if self.leading && self.replica.state().node_draining(node) {
                        // A drained worker said goodbye: no need to wait for its heartbeats.
                        let reason = "worker shut down".to_string();
                        self.propose(Command::RemoveNode { node, reason }, None, Pending::Quiet);
                        self.workers.forget(node);
                    }
                }
            }
            Msg::Worker { node, msgs } => {
                for msg in msgs {
                    self.on_worker_message(node, msg);
                }
            }
            Msg::Logs { request, reply } => self.fetch_logs(request, reply),
            Msg::Heads { reply } => {
                let _ = reply.send(HeadsView {
                    group: self.replica.group().to_string(),
                    me: self.replica.status(),
                    members: self.replica.members().clone(),
                });
            }
            Msg::Outboxes { reply } => {
                let _ = reply.send(self.workers.depths());
            }
            Msg::Watch {
                filter,
                after,
                reply,
            } => {
                let answer = if self.leading {
                    self.watch.subscribe(filter, after)
                } else {
                    Err(self.not_leader())
                };
                let _ = reply.send(answer);
            }
            Msg::ChangeHeads { change, reply } => {
                // What came before it in this turn goes first.
                self.flush();
                match self.replica.propose_change(&change) {
                    Ok((index, term)) => {
                        self.proposals
                            .insert(index, term, vec![Pending::Change(reply)]);
                    }
                    Err(why) => {
                        let _ = reply.send(Err(not_accepted(why)));
                    }
                }
            }
        }
    }

    fn on_output(&mut self, output: Output) {
        match output {
            Output::Applied {
                index,
                term,
                results,
            } => {
                let overwritten = || not_accepted(NotAccepted::NotLeader(None));
                let mut pending = self
                    .proposals
                    .take(index, term, overwritten)
                    .unwrap_or_default()
                    .into_iter();
                for Applied {
                    result,
                    effects,
                    finished,
                    events,
                    timing: (command, took),
                } in results
                {
                    self.metrics.applied(command, took);
                    self.events.extend(events);
                    if self.leading {
                        self.perform(effects);
                        for status in finished {
                            self.waiters.on_terminal(status);
                        }
                    }
                    match pending.next() {
                        Some(p) => self.settle(p, result),
                        None => {
                            if let Err(err) = result {
                                tracing::debug!(index, %err, "a command was refused");
                            }
                        }
                    }
                }
            }
            Output::ConfChanged {
                index,
                term,
                result,
            } => {
                let overwritten = || not_accepted(NotAccepted::NotLeader(None));
                for p in self
                    .proposals
                    .take(index, term, overwritten)
                    .unwrap_or_default()
                {
                    match p {
                        Pending::Change(reply) => {
                            let _ = reply.send(result.clone().map_err(Status::failed_precondition));
                        }
                        other => other.fail(Status::internal("a proposal met a membership change")),
                    }
                }
            }
            Output::Empty { index, term } => {
                let overwritten = || not_accepted(NotAccepted::NotLeader(None));
                for p in self
                    .proposals
                    .take(index, term, overwritten)
                    .unwrap_or_default()
                {
                    p.fail(Status::aborted(
                        "raft dropped the change: another membership change is still in \
                         progress; try again once it is done (escher heads)",
                    ));
                }
            }
            Output::Role { role, leader } => self.on_role(role, leader),
            Output::ReadReady { token } => {
                for job in self.reads.ready(token) {
                    if let Some(ReadJob::Wait {
                        ids,
                        num_returns,
                        reply,
                    }) = job.run(self.replica.state())
                    {
                        let state = self.replica.state();
                        if let Some(err) = ids.iter().find_map(|id| state.check_known(*id).err()) {
                            let _ = reply.send(Err(to_status(err)));
                            continue;
                        }
                        self.waiters.add(state, ids, num_returns, reply);
                    }
                }
            }
            Output::Restored => {
                self.proposals
                    .fail_all(|| not_accepted(NotAccepted::NotLeader(None)));
                // What came before the snapshot goes first; the history starts again after it.
                self.publish_events();
                self.watch.restart(self.replica.state().revision());
            }
        }
    }

    /// Answers a proposal with what applying its entry returned.
    fn settle(&mut self, pending: Pending, result: Result<Reply, ApplyError>) {
        match pending {
            Pending::Reply(reply) => {
                let _ = reply.send(result.map_err(to_status));
            }
            Pending::Register { reply, secret } => {
                let answer = match result {
                    Ok(Reply::Registered(node_id)) => {
                        self.workers.seen(node_id);
                        tracing::info!(node = %node_id, new = secret.is_some(), "worker registered");
                        let cluster = self.replica.state().cluster_id().unwrap_or_default();
                        Ok(RegisterReply {
                            node_id,
                            heartbeat_interval: self.config.heartbeat_interval,
                            heartbeat_timeout: Some(self.config.heartbeat_timeout),
                            secret,
                            group: cluster.to_string(),
                        })
                    }
                    Ok(other) => Err(Status::internal(format!(
                        "unexpected reply to a registration: {other:?}"
                    ))),
                    Err(ApplyError::UnknownNode(node)) => Err(unknown_node(node)),
                    Err(err) => Err(to_status(err)),
                };
                let _ = reply.send(answer);
            }
            Pending::Report { node, report } => self.workers.ack(node, report),
            Pending::Change(reply) => {
                let _ = reply.send(Err(Status::internal("a membership change met an entry")));
            }
            Pending::Quiet => {
                if let Err(err) = result {
                    tracing::debug!(%err, "a runtime command was refused");
                }
            }
        }
    }

    fn perform(&mut self, effects: Vec<Effect>) {
        let state = self.replica.state();
        for effect in effects {
            match effect {
                Effect::Assign {
                    node,
                    mut assignment,
                } => {
                    if let Some(rec) = state.task(assignment.task_id)
                        && let Some(started) = rec.started_at
                    {
                        self.metrics
                            .started(started.saturating_sub(rec.submitted_at));
                    }
                    let ns = assignment.spec.labels.get(NAMESPACE_LABEL);
                    assignment.task_token = self
                        .keys
                        .sign_task(assignment.task_id, assignment.attempt, ns)
                        .unwrap_or_default();
                    self.workers
                        .send(state, node, HeadMessage::Assign(*assignment));
                }
                Effect::Cancel {
                    node,
                    task,
                    attempt,
                    reason,
                } => {
                    let msg = HeadMessage::CancelTask {
                        task_id: task,
                        attempt,
                        reason,
                    };
                    self.workers.send(state, node, msg);
                }
                // Waiters learn from `Applied::finished`, taken when the command applied.
                Effect::Terminal { .. } => {}
                Effect::ReconfigureMig { node, gpu, layout } => {
                    tracing::info!(%node, gpu, %layout, "asking the worker to reconfigure MIG");
                    self.workers
                        .send(state, node, HeadMessage::ReconfigureMig { gpu, layout });
                }
                Effect::Rejoined { node } => self.workers.forget_task_messages(node),
            }
        }
    }

    fn on_role(&mut self, role: ReplicaRole, leader: Option<u64>) {
        let leads = role == ReplicaRole::Leader;
        tracing::info!(replica = self.replica.id(), %role, ?leader, "raft role changed");
        self.metrics.leader_changed();
        if leads && !self.leading {
            self.workers.lead(self.replica.state());
            if self.replica.state().cluster_id().is_none() {
                let cluster_id = new_secret()[..32].to_string();
                tracing::info!(%cluster_id, "naming this new cluster");
                self.leading = true;
                let task_key = new_secret();
                let command = Command::Init {
                    cluster_id,
                    task_key,
                };
                self.propose(command, None, Pending::Quiet);
            }
            tracing::info!(
                replica = self.replica.id(),
                nodes = self.replica.state().live_nodes().len(),
                "this replica leads the head group now; waiting for workers to attach"
            );
        }
        if !leads && self.leading {
            let status = not_accepted(self.replica.not_leader());
            self.stop_leading(move || status.clone());
        }
        self.leading = leads;
    }

    /// Answers everything that only a leader could answer, and drops every worker stream.
    fn stop_leading(&mut self, status: impl Fn() -> Status) {
        for p in self.batch.take().pending {
            p.fail(status());
        }
        self.proposals.fail_all(&status);
        self.reads.fail_all(&status);
        let _ = self.replica.drop_reads();
        self.waiters.fail_all(&status);
        self.watch.end_all(&status);
        self.workers.drop_all();
        for (_, pending) in self.logs.drain() {
            let _ = pending.reply.send(Err(status().message().to_string()));
        }
    }

    fn register(
        &mut self,
        request: RegisterRequest,
        reply: oneshot::Sender<Result<RegisterReply, Status>>,
    ) {
        if !self.leading {
            let _ = reply.send(Err(self.not_leader()));
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
        match request.identity {
            Some(identity) => {
                let back = Returning {
                    cluster: identity.group,
                    node: identity.node_id,
                    secret: SecretHash::of(&identity.secret),
                    running: request.running,
                    finished: request.finished,
                };
                let command = Command::RejoinNode { worker, back };
                let pending = Pending::Register {
                    reply,
                    secret: None,
                };
                self.propose(command, None, pending);
            }
            None => {
                let secret = new_secret();
                let command = Command::RegisterNode {
                    worker,
                    secret: SecretHash::of(&secret),
                };
                let pending = Pending::Register {
                    reply,
                    secret: Some(secret),
                };
                self.propose(command, None, pending);
            }
        }
    }

    fn attach(
        &mut self,
        node: NodeId,
        secret: &str,
        conn: u64,
        tx: super::workers::LinkSender,
    ) -> Result<(), Status> {
        if !self.leading {
            return Err(self.not_leader());
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
        self.workers.attach(node, conn, tx);
        tracing::info!(%node, "worker attached");
        Ok(())
    }

    fn on_worker_message(&mut self, node: NodeId, msg: WorkerMessage) {
        if !self.leading || !self.replica.state().node_alive(node) {
            return; // not ours to handle, or declared lost: its tasks were retried already
        }
        self.workers.seen(node);
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
            WorkerMessage::Heartbeat { metrics } => {
                let draining = metrics
                    .iter()
                    .any(|m| m.name == "draining" && m.value > 0.0);
                self.metrics.worker_reported(node, metrics);
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
            WorkerMessage::TaskFinished(report) => {
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

    fn fetch_logs(&mut self, request: TaskLogsRequest, reply: LogReply) {
        if !self.leading {
            let _ = reply.send(Err(self.not_leader().message().to_string()));
            return;
        }
        let task = request.task_id;
        let Some(rec) = self.replica.state().task(task) else {
            let _ = reply.send(Err(format!("unknown task {task}")));
            return;
        };
        let attempt = request.attempt.unwrap_or(rec.attempt);
        let found = match (attempt, rec.attempt_record(attempt)) {
            (0, _) => Err(format!("task {task} has not run yet, so it has no logs")),
            (n, _) if n > rec.attempt => Err(format!(
                "task {task} has had {} attempt(s); there is no attempt {n} yet",
                rec.attempt
            )),
            (n, None) => Err(format!(
                "the head no longer remembers attempt {n} of task {task} (it keeps the last \
                 {MAX_ATTEMPTS_KEPT})"
            )),
            (_, Some(a)) => Ok(TailRead {
                task,
                attempt,
                node: a.node,
                stream: request.stream,
                offset: request.offset,
                max_bytes: request.max_bytes,
                tail: a.output.as_deref().cloned(),
            }),
        };
        let read = match found {
            Ok(read) => read,
            Err(why) => {
                let _ = reply.send(Err(why));
                return;
            }
        };
        let request_id = self.next_log;
        let msg = HeadMessage::FetchLogs {
            request_id,
            task_id: task,
            stream: request.stream,
            offset: request.offset,
            max_bytes: request.max_bytes,
            attempt,
        };
        if !self.workers.send_now(read.node, msg) {
            let why = format!(
                "attempt {attempt} ran on node {}, which is not connected now",
                read.node
            );
            let _ = reply.send(read.read_kept(&why));
            return;
        }
        self.next_log += 1;
        self.logs.insert(request_id, PendingFetch { reply, read });
    }

    fn on_tick(&mut self) {
        if self.leading {
            self.workers.flush_acks();
            self.workers.adopt(self.replica.state());
            let timeout = self.config.heartbeat_timeout;
            for node in self.workers.silent(self.replica.state(), timeout) {
                tracing::warn!(%node, ?timeout, "worker missed its heartbeats; declaring the node lost");
                let reason = format!("no heartbeat for {timeout:?}");
                self.propose(Command::RemoveNode { node, reason }, None, Pending::Quiet);
            }
            // Pending deadlines, and finished tasks and dead nodes at the end of their
            // retention.
            if self
                .replica
                .state()
                .next_timer()
                .is_some_and(|d| d <= now_ms())
            {
                self.propose(Command::Tick, None, Pending::Quiet);
            }
        }
        if self.last_prune.elapsed() > std::time::Duration::from_secs(1) {
            self.waiters.prune();
            self.watch.prune();
            self.logs.retain(|_, p| !p.reply.is_closed());
            self.last_prune = Instant::now();
            tracing::trace!(
                waiters = self.waiters.len(),
                proposals = self.proposals.len(),
                reads = self.reads.len(),
                workers = self.workers.len(),
                "pruned"
            );
        }
    }
}

/// A new node's secret: 32 random bytes, as hex.
fn new_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    hex::encode(bytes)
}

/// The answer to a worker that presents a node id this group does not know.
fn unknown_node(node: NodeId) -> Status {
    Status::not_found(format!(
        "node {node} is not known to this head group (its state was lost, or the worker's \
         state directory comes from another cluster): register as a new node (the worker does \
         so by itself)"
    ))
}
