//! The one task that owns the head's state. gRPC handlers send it [`Msg`]s and await replies;
//! it applies commands, performs their effects, and keeps the soft state (worker links,
//! heartbeats, waiters, log requests).

use std::collections::BTreeSet;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use escher_proto::types::{
    HeadMessage, LogChunk, NodeId, RegisterReply, RegisterRequest, TaskFinished, TaskId,
    TaskLogsRequest, WaitReply, WorkerMessage,
};
use rustc_hash::FxHashMap;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::config::HeadConfig;
use super::waiters::Waiters;
use crate::scheduler::Millis;
use crate::state::{ApplyError, ClusterState, Command, Effect, Entry, Reply};

/// A request to the owner.
pub(crate) enum Msg {
    /// Apply a command.
    Apply {
        command: Command,
        reply: oneshot::Sender<Result<Reply, ApplyError>>,
    },
    /// Run a read-only query against the state.
    Read(Box<dyn FnOnce(&ClusterState) + Send>),
    /// Answer when `num_returns` of `ids` are terminal.
    Wait {
        ids: Vec<TaskId>,
        num_returns: usize,
        reply: oneshot::Sender<Result<WaitReply, ApplyError>>,
    },
    /// A worker registers.
    Register {
        request: RegisterRequest,
        reply: oneshot::Sender<RegisterReply>,
    },
    /// A worker's stream opened.
    Attach {
        node: NodeId,
        conn: u64,
        tx: mpsc::UnboundedSender<HeadMessage>,
        reply: oneshot::Sender<Result<(), String>>,
    },
    /// A worker's stream closed.
    Detach { node: NodeId, conn: u64 },
    /// A worker sent something.
    Worker { node: NodeId, msg: WorkerMessage },
    /// Fetch a piece of a task's log from its worker.
    Logs {
        request: TaskLogsRequest,
        reply: oneshot::Sender<Result<LogChunk, String>>,
    },
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Msg::Apply { .. } => "Apply",
            Msg::Read(_) => "Read",
            Msg::Wait { .. } => "Wait",
            Msg::Register { .. } => "Register",
            Msg::Attach { .. } => "Attach",
            Msg::Detach { .. } => "Detach",
            Msg::Worker { .. } => "Worker",
            Msg::Logs { .. } => "Logs",
        })
    }
}

#[derive(Debug)]
struct Link {
    conn: u64,
    tx: mpsc::UnboundedSender<HeadMessage>,
}

/// The owner of the state and the soft state around it.
#[derive(Debug)]
pub(crate) struct Owner {
    state: ClusterState,
    config: HeadConfig,
    links: FxHashMap<NodeId, Link>,
    /// Messages for workers that are registered but not attached (yet, or again).
    outbox: FxHashMap<NodeId, Vec<HeadMessage>>,
    last_seen: FxHashMap<NodeId, Instant>,
    waiters: Waiters,
    logs: FxHashMap<u64, oneshot::Sender<Result<LogChunk, String>>>,
    next_log: u64,
    last_prune: Instant,
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as Millis)
}

impl Owner {
    pub(crate) fn new(config: HeadConfig) -> Owner {
        Owner {
            state: ClusterState::new(config.state.clone()),
            config,
            links: FxHashMap::default(),
            outbox: FxHashMap::default(),
            last_seen: FxHashMap::default(),
            waiters: Waiters::default(),
            logs: FxHashMap::default(),
            next_log: 1,
            last_prune: Instant::now(),
        }
    }

    /// Serves messages until shutdown, then tells every worker the head is going away.
    pub(crate) async fn run(mut self, mut rx: mpsc::Receiver<Msg>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.config.tick_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                msg = rx.recv() => {
                    let Some(msg) = msg else { break };
                    self.handle(msg);
                    // Drain what queued meanwhile before waiting again (bounded for fairness).
                    for _ in 0..1024 {
                        match rx.try_recv() {
                            Ok(msg) => self.handle(msg),
                            Err(_) => break,
                        }
                    }
                }
                _ = tick.tick() => self.on_tick(),
            }
        }
        for (_, link) in self.links.drain() {
            let _ = link.tx.send(HeadMessage::Shutdown {
                reason: "the head is shutting down".into(),
            });
        }
        tracing::info!("head state owner stopped");
    }

    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Apply { command, reply } => {
                let _ = reply.send(self.apply(command));
            }
            Msg::Read(query) => query(&self.state),
            Msg::Wait {
                ids,
                num_returns,
                reply,
            } => {
                if let Some(err) = ids.iter().find_map(|id| self.state.check_known(*id).err()) {
                    let _ = reply.send(Err(err));
                    return;
                }
                self.waiters.add(&self.state, ids, num_returns, reply);
            }
            Msg::Register { request, reply } => {
                let _ = reply.send(self.register(request));
            }
            Msg::Attach {
                node,
                conn,
                tx,
                reply,
            } => {
                if !self.state.node_alive(node) {
                    let why = format!(
                        "node {node} is not registered or was declared lost; register again"
                    );
                    let _ = reply.send(Err(why));
                    return;
                }
                for msg in self.outbox.remove(&node).unwrap_or_default() {
                    let _ = tx.send(msg);
                }
                self.links.insert(node, Link { conn, tx });
                self.last_seen.insert(node, Instant::now());
                let _ = reply.send(Ok(()));
                tracing::info!(%node, "worker attached");
            }
            Msg::Detach { node, conn } => {
                if self.links.get(&node).is_some_and(|l| l.conn == conn) {
                    self.links.remove(&node);
                    tracing::info!(%node, "worker detached");
                    if self.state.node_draining(node) {
                        // A drained worker said goodbye: no need to wait for its heartbeats.
                        let reason = "worker shut down".to_string();
                        let _ = self.apply(Command::RemoveNode { node, reason });
                        self.outbox.remove(&node);
                        self.last_seen.remove(&node);
                    }
                }
            }
            Msg::Worker { node, msg } => self.on_worker_message(node, msg),
            Msg::Logs { request, reply } => self.fetch_logs(request, reply),
        }
    }

    fn apply(&mut self, command: Command) -> Result<Reply, ApplyError> {
        let result = self.state.apply(Entry {
            now: now_ms(),
            command,
        });
        self.perform_effects();
        result
    }

    fn perform_effects(&mut self) {
        for effect in self.state.take_effects() {
            match effect {
                Effect::Assign { node, assignment } => {
                    self.send(node, HeadMessage::Assign(*assignment));
                }
                Effect::Cancel {
                    node,
                    task,
                    attempt,
                    reason,
                } => {
                    self.send(
                        node,
                        HeadMessage::CancelTask {
                            task_id: task,
                            attempt,
                            reason,
                        },
                    );
                }
                Effect::Terminal { task } => self.waiters.on_terminal(&self.state, task),
                Effect::ReconfigureMig { node, gpu, layout } => {
                    tracing::info!(%node, gpu, %layout, "asking the worker to reconfigure MIG");
                    self.send(node, HeadMessage::ReconfigureMig { gpu, layout });
                }
            }
        }
    }

    /// Sends to a live node's worker now, or when it attaches.
    fn send(&mut self, node: NodeId, msg: HeadMessage) {
        if !self.state.node_alive(node) {
            return;
        }
        let msg = match self.links.get(&node) {
            Some(link) => match link.tx.send(msg) {
                Ok(()) => return,
                Err(mpsc::error::SendError(msg)) => msg,
            },
            None => msg,
        };
        self.outbox.entry(node).or_default().push(msg);
    }

    fn register(&mut self, request: RegisterRequest) -> RegisterReply {
        // Passed on even when not live: the state then gives the worker another id, which
        // tells it that its old node and tasks are gone.
        let previous = request.previous_node_id;
        let gpus = request.gpus;
        let command = Command::RegisterNode {
            name: request.name,
            address: request.address,
            resources: request.resources,
            labels: request.labels,
            previous,
        };
        let node_id = match self.apply(command) {
            Ok(Reply::Registered(id)) => id,
            other => {
                // RegisterNode cannot be refused; keep the worker out rather than panic.
                tracing::error!(?other, "unexpected reply to a registration");
                NodeId(0)
            }
        };
        let reconnect = previous == Some(node_id);
        if reconnect {
            self.reconcile(node_id, &request.running);
        }
        if !gpus.is_empty() || reconnect {
            // In the same turn as the registration, so that no client sees the node without
            // its GPUs; on a reconnect the GPUs may have changed while it was away.
            let command = Command::GpusChanged {
                node: node_id,
                gpus,
                done: None,
            };
            if let Err(err) = self.apply(command) {
                tracing::warn!(node = %node_id, %err, "could not record the worker's GPUs");
            }
        }
        self.last_seen.insert(node_id, Instant::now());
        tracing::info!(node = %node_id, reconnect, ?previous, "worker registered");
        RegisterReply {
            node_id,
            heartbeat_interval: self.config.heartbeat_interval,
        }
    }

    /// A reconnecting worker lists what it still runs. Tasks the head placed there that it no
    /// longer runs, and that are not waiting in its outbox, were lost while it was away.
    fn reconcile(&mut self, node: NodeId, running: &[escher_proto::types::RunningTask]) {
        let reported: BTreeSet<(TaskId, u32)> =
            running.iter().map(|r| (r.task_id, r.attempt)).collect();
        let queued: BTreeSet<TaskId> = self
            .outbox
            .get(&node)
            .into_iter()
            .flatten()
            .filter_map(|m| match m {
                HeadMessage::Assign(a) => Some(a.task_id),
                _ => None,
            })
            .collect();
        for (task, attempt) in self.state.running_on(node) {
            if !reported.contains(&(task, attempt)) && !queued.contains(&task) {
                let report = TaskFinished {
                    task_id: task,
                    attempt,
                    outcome: Err("the worker lost this task while it was disconnected".into()),
                    timed_out: false,
                };
                let _ = self.apply(Command::TaskFinished(report));
            }
        }
    }

    fn on_worker_message(&mut self, node: NodeId, msg: WorkerMessage) {
        if !self.state.node_alive(node) {
            return; // declared lost: its tasks were retried or failed already
        }
        self.last_seen.insert(node, Instant::now());
        match msg {
            WorkerMessage::Hello { .. } => {}
            WorkerMessage::Heartbeat { metrics } => {
                let draining = metrics
                    .iter()
                    .any(|m| m.name == "draining" && m.value > 0.0);
                if draining && !self.state.node_draining(node) {
                    tracing::info!(%node, "worker is draining; admitting nothing new there");
                    let _ = self.apply(Command::DrainNode { node });
                }
            }
            WorkerMessage::TaskStarted { task_id, attempt } => {
                let _ = self.apply(Command::TaskStarted {
                    task: task_id,
                    attempt,
                });
            }
            WorkerMessage::TaskFinished(report) => {
                let _ = self.apply(Command::TaskFinished(report));
            }
            WorkerMessage::Logs { request_id, result } => {
                if let Some(reply) = self.logs.remove(&request_id) {
                    let _ = reply.send(result);
                }
            }
            WorkerMessage::TaskDevices {
                task_id,
                attempt,
                devices,
            } => {
                let _ = self.apply(Command::TaskDevices {
                    task: task_id,
                    attempt,
                    devices,
                });
            }
            WorkerMessage::GpusChanged { gpus, done } => {
                if let Some(done) = &done {
                    match &done.error {
                        None => tracing::info!(%node, gpu = done.gpu, "MIG reconfiguration done"),
                        Some(why) => {
                            tracing::warn!(%node, gpu = done.gpu, %why, "MIG reconfiguration failed")
                        }
                    }
                }
                if let Err(err) = self.apply(Command::GpusChanged { node, gpus, done }) {
                    tracing::warn!(%node, %err, "could not record the worker's GPUs");
                }
            }
        }
    }

    fn fetch_logs(
        &mut self,
        request: TaskLogsRequest,
        reply: oneshot::Sender<Result<LogChunk, String>>,
    ) {
        let task = request.task_id;
        let Some(rec) = self.state.task(task) else {
            let _ = reply.send(Err(format!("unknown task {task}")));
            return;
        };
        let Some(node) = rec.node else {
            let _ = reply.send(Err(format!(
                "task {task} has not run yet, so it has no logs"
            )));
            return;
        };
        let Some(link) = self.links.get(&node) else {
            let why = format!("task {task} ran on node {node}, which is not connected now");
            let _ = reply.send(Err(why));
            return;
        };
        let request_id = self.next_log;
        self.next_log += 1;
        let msg = HeadMessage::FetchLogs {
            request_id,
            task_id: task,
            stream: request.stream,
            offset: request.offset,
            max_bytes: request.max_bytes,
        };
        if link.tx.send(msg).is_err() {
            let _ = reply.send(Err(format!("node {node} disconnected")));
            return;
        }
        self.logs.insert(request_id, reply);
    }

    fn on_tick(&mut self) {
        let timeout = self.config.heartbeat_timeout;
        let silent: Vec<NodeId> = self
            .last_seen
            .iter()
            .filter(|(n, seen)| seen.elapsed() > timeout && self.state.node_alive(**n))
            .map(|(n, _)| *n)
            .collect();
        for node in silent {
            tracing::warn!(%node, ?timeout, "worker missed its heartbeats; declaring the node lost");
            let reason = format!("no heartbeat for {timeout:?}");
            let _ = self.apply(Command::RemoveNode { node, reason });
            self.links.remove(&node);
            self.outbox.remove(&node);
            self.last_seen.remove(&node);
        }
        // Pending deadlines, and finished tasks and dead nodes at the end of their retention.
        if self.state.next_timer().is_some_and(|d| d <= now_ms()) {
            let _ = self.apply(Command::Tick);
        }
        if self.last_prune.elapsed() > std::time::Duration::from_secs(1) {
            self.waiters.prune();
            self.logs.retain(|_, r| !r.is_closed());
            self.last_prune = Instant::now();
            tracing::trace!(waiters = self.waiters.len(), "pruned");
        }
    }
}
