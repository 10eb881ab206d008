//! The worker's event loop: one task that owns the link to the head and the table of running
//! tasks, so that nothing else needs a lock (docs/STYLE.md §7).
//!
//! ```text
//!                  ┌────────── Register + Attach (link.rs), with back-off ◄──────────┐
//!                  ▼                                                                 │
//!  head ──Assign/CancelTask/FetchLogs/Shutdown──► Runtime ──spawn──► runners (runner.rs)
//!   ▲                                              │  ▲                    │
//!   └──Hello/Heartbeat/TaskStarted/TaskFinished/Logs┘  └──Finished event───┘
//!                                      stream broke ───────────────────────────────────┘
//! ```
//!
//! Rules the head relies on (the worker side of the report protocol; the head side is in the
//! head's `runtime/workers.rs` and `state/nodes.rs`):
//! - `TaskStarted` is sent when an assignment is accepted (an actor's once its constructor
//!   returned, so that the head's start of an actor means it is ready to serve calls; one whose
//!   constructor failed never starts), `TaskFinished` when its runner ends, whether it ended by
//!   itself, timed out or was cancelled. A start is reported after
//!   [`START_REPORT_DELAY`], or with the task's end if that comes sooner: `TaskStarted` then
//!   `TaskFinished` in one batch, which the head commits as one entry (a short task costs the
//!   head one raft entry and the stream one frame, not two).
//! - Every `TaskFinished` is kept until the head acknowledges it (`ReportsAcked`, sent once
//!   the report is committed). When the stream breaks (a head failover, a restart), running
//!   tasks go on, and the worker registers again (with the leader of its head group) with its
//!   identity (node id, secret, cluster), its boot id, its `running` list and every
//!   unacknowledged report; the registration's reply acknowledges those reports. The same
//!   worker process keeps its node and its tasks; an assignment it never received is sent
//!   again with the same attempt.
//! - An attempt runs at most once per worker process: an assignment of a (task, attempt) this
//!   process is running, was given, or ran recently (`protocol::RECENT_ATTEMPTS`) is ignored. A head
//!   whose state was restored from a backup says so (`RegisterReply.incarnation` changes): the
//!   attempts that ended are forgotten, as the restored head never sends again one that ran
//!   after the backup (it counts those as failed and numbers the retry past them).
//! - A head group that does not know the identity (its state started over, or the identity is
//!   another cluster's) answers NOT_FOUND: the worker forgets the identity, cancels what it
//!   runs (no head knows those tasks), drops their reports, and registers as a new node. A
//!   wrong secret is refused (PERMISSION_DENIED) and stops the worker.
//! - A restarted worker process has a new boot id: the head counts its earlier tasks as lost
//!   (failed attempts, retried under `max_retries`) and keeps its node id.
//! - A task that holds GPU resources is given devices first (`gpu/`): `TaskDevices` then
//!   `TaskStarted`. If no device has room yet (fractions spread over GPUs, a pinned device
//!   taken), the task waits here, unstarted, until a release makes room; if it can never fit
//!   here, it ends at once with the reason.
//! - `ReconfigureMig`: the slices the new layout destroys take no new task; once their holders
//!   are gone the reconfiguration runs off the loop, and its end is reported with
//!   `GpusChanged { done }` (kept for the next stream if none is attached). Every registration
//!   carries the GPUs as they are (less slices being rebuilt).
//! - A worker whose fence supervisor is gone for good (`fence/`) has stopped its tasks: it
//!   answers each assignment with a `TaskFinished` error and never starts it, and its
//!   heartbeats say `draining = 1`, so that the head admits nothing new on its node; every
//!   heartbeat carries what happened to the fence (`Heartbeat.fence`).
//! - After each attach the worker reports the copies its object store holds
//!   (`ObjectsHeld`, `runtime/held.rs`): the head adopts those its table still wants (the
//!   node may have been declared lost while the stream was down, which dropped its copies from
//!   the table) and answers `DropCopies` for the rest, which the worker deletes.
//! - On shutdown (the caller's shutdown future, or the head's `Shutdown`) the worker stops
//!   taking assignments (each one that still arrives is answered at once with a `TaskFinished`
//!   error and never started), sends a heartbeat with `draining = 1`, lets running tasks finish
//!   for the drain period, cancels the rest, reports them, and only then closes its stream.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use escher_proto::types::{
    Assignment, HeadMessage, LogChunk, Metric, RegisterRequest, TaskFinished, WorkerMessage,
};
use escher_proto::wire::head_message::Body;
use escher_proto::{Labels, LogStream, NodeId, ResourceSet, TaskId, TaskKind, wire};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backoff::Backoff;
use crate::error::WorkerError;
use crate::exec::{self, Stream};
use crate::functions::BoxFuture;
use crate::gpu::{BindError, Gpus, Reconfigured};
use crate::identity::IdentityStore;
use crate::link::{ConnectError, Link, connect};
use crate::protocol::{self, Protocol};
use crate::runner::{RunEnv, run_task};

mod gpus;
mod held;

/// Log bytes sent for a `FetchLogs` that asks for 0.
const DEFAULT_LOG_FETCH: u32 = 64 * 1024;
/// The most log bytes sent in one answer, well under gRPC's default 4 MiB message limit.
const MAX_LOG_FETCH: u32 = 1024 * 1024;
/// How often the log retention rule is applied (and once at start).
const LOG_SWEEP_EVERY: Duration = Duration::from_secs(60);
/// How long to wait for the head to end its half of the stream after the worker ended its own.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a task's start waits to be reported, so that a task that ends sooner has its
/// start and its end reported together. The head's record of the start is the dispatch's
/// until then, so a start reported this much later changes no decision.
pub(crate) const START_REPORT_DELAY: Duration = Duration::from_millis(2);

/// What a worker says about itself when it registers; fixed for its life.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub(crate) name: String,
    pub(crate) address: String,
    pub(crate) resources: ResourceSet,
    pub(crate) labels: Labels,
}

/// A task being run.
#[derive(Debug)]
struct Running {
    /// Tells this runner's report apart from a late report of an earlier runner of the same
    /// (task, attempt).
    seq: u64,
    cancel: CancellationToken,
    /// Cancelled (before `cancel`) by a forced cancel: a command is killed without its grace.
    force: CancellationToken,
    /// Whether it runs inside this process: an actor's incarnation or a function's handler
    /// (ended when the lease runs out, see [`Runtime::lease_ran_out`]).
    in_process: bool,
    /// Whether it is an actor's incarnation.
    actor: bool,
}

/// A runner ended.
#[derive(Debug)]
struct Finished {
    seq: u64,
    report: TaskFinished,
}

/// What a runner is told about its devices: the `CUDA_VISIBLE_DEVICES` list (`None` on a node
/// without GPUs), or why it cannot run.
type DeviceGrant = Result<Option<Vec<String>>, String>;

/// A task waiting for GPU devices to free up.
#[derive(Debug)]
struct Waiting {
    seq: u64,
    key: (TaskId, u32),
    allocation: ResourceSet,
    grant: oneshot::Sender<DeviceGrant>,
}

/// When a runner gets its devices.
enum Grant {
    Now(Option<Vec<String>>),
    Later(oneshot::Receiver<DeviceGrant>),
}

/// The event loop's state.
pub(crate) struct Runtime {
    env: Arc<RunEnv>,
    me: Identity,
    drain: Duration,
    node_tx: watch::Sender<Option<NodeId>>,
    tracker: TaskTracker,
    finished_tx: mpsc::UnboundedSender<Finished>,
    finished_rx: mpsc::UnboundedReceiver<Finished>,
    /// Actor incarnations whose constructor returned (their runner says so).
    ready_tx: mpsc::UnboundedSender<(TaskId, u32)>,
    ready_rx: mpsc::UnboundedReceiver<(TaskId, u32)>,
    /// Actor incarnations whose constructor has not returned yet: their start is reported once
    /// it has, so that the head's `TaskStarted` of an actor means "ready to serve calls".
    unready: HashSet<(TaskId, u32)>,
    /// The protocol's rules (`protocol.rs`): what runs, which attempts were given, the
    /// reports the head has not acknowledged, the lease.
    protocol: Protocol<Running>,
    /// The origin of the times the protocol is given.
    origin: Instant,
    next_seq: u64,
    /// The node id of the latest registration, kept while disconnected.
    node_id: Option<NodeId>,
    /// Node id, secret and cluster of the first registration.
    identity: IdentityStore,
    /// Chosen when this worker process started.
    boot_id: u64,
    /// Attempts that started and whose start is not reported yet, and when it will be.
    starts: std::collections::VecDeque<((TaskId, u32), tokio::time::Instant)>,
    starts_due: Option<Pin<Box<Sleep>>>,
    /// The incarnation of the head's state this process last attached to
    /// (`RegisterReply.incarnation`): when it changes, the attempts given were the old
    /// incarnation's.
    incarnation: u64,
    link: Option<Link>,
    connecting: Option<BoxFuture<Result<Link, ConnectError>>>,
    failures: u32,
    backoff: Backoff,
    /// Reconfiguration ends reported while no stream was attached.
    unsent: Vec<WorkerMessage>,
    /// The node's GPUs and who holds which device.
    gpus: Gpus,
    /// Tasks waiting for devices, in arrival order.
    waiting: Vec<Waiting>,
    /// Ends of MIG reconfiguration jobs.
    mig_tx: mpsc::UnboundedSender<Reconfigured>,
    mig_rx: mpsc::UnboundedReceiver<Reconfigured>,
    stopping: bool,
    drain_timer: Option<Pin<Box<Sleep>>>,
    cancelled_all: bool,
    fatal: Option<WorkerError>,
    /// When to apply the log retention rule next.
    sweep: tokio::time::Interval,
    /// When the lease runs out unless renewed: then the actors this worker hosts are ended.
    lease_end: Option<Pin<Box<Sleep>>>,
}

impl Runtime {
    /// The head released these objects: this node's copies go (a copy a reader has mapped
    /// goes with its last reader, `objects/mod.rs`). A copy this store does not have is
    /// already gone.
    fn delete_objects(&mut self, ids: &[escher_proto::types::ObjectId]) {
        for id in ids {
            if !self.env.objects.store().contains(*id) {
                tracing::debug!(object = %id, "released, and not in this node's store");
                continue;
            }
            match self.env.objects.delete(*id) {
                Ok(()) => tracing::debug!(object = %id, "deleted a released object"),
                Err(err) => {
                    tracing::warn!(object = %id, %err, "could not delete a released object")
                }
            }
        }
    }

    pub(crate) fn new(
        env: Arc<RunEnv>,
        identity: Identity,
        store: IdentityStore,
        drain: Duration,
        backoff: Backoff,
        node_tx: watch::Sender<Option<NodeId>>,
        gpus: Gpus,
    ) -> Runtime {
        let (finished_tx, finished_rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = mpsc::unbounded_channel();
        let (mig_tx, mig_rx) = mpsc::unbounded_channel();
        Runtime {
            env,
            me: identity,
            drain,
            node_tx,
            tracker: TaskTracker::new(),
            finished_tx,
            finished_rx,
            ready_tx,
            ready_rx,
            unready: HashSet::new(),
            protocol: Protocol::new(),
            origin: Instant::now(),
            next_seq: 0,
            node_id: None,
            identity: store,
            boot_id: rand::random::<u64>().max(1),
            starts: std::collections::VecDeque::new(),
            starts_due: None,
            incarnation: 0,
            link: None,
            connecting: None,
            failures: 0,
            backoff,
            unsent: Vec::new(),
            gpus,
            waiting: Vec::new(),
            mig_tx,
            mig_rx,
            stopping: false,
            drain_timer: None,
            cancelled_all: false,
            fatal: None,
            sweep: {
                let mut every = tokio::time::interval(LOG_SWEEP_EVERY);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                every
            },
            lease_end: None,
        }
    }

    /// Runs until `shutdown` completes or the head says `Shutdown`, then drains and returns.
    pub(crate) async fn run(
        mut self,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), WorkerError> {
        tokio::pin!(shutdown);
        self.reconnect(Duration::ZERO);
        // Stopping ends once nothing runs and every report is acknowledged (or the drain
        // period is over).
        while !(self.stopping
            && self.protocol.running_count() == 0
            && (self.protocol.unacked_count() == 0 || self.cancelled_all))
        {
            tokio::select! {
                biased;
                () = &mut shutdown, if !self.stopping => {
                    tracing::info!("shutting down");
                    self.begin_stop();
                }
                () = until(&mut self.drain_timer), if !self.cancelled_all => self.cancel_all(),
                // Before ends: an actor that was ready and then ended reports both, in order.
                Some(key) = self.ready_rx.recv() => self.on_ready(key),
                Some(finished) = self.finished_rx.recv() => self.on_finished(finished),
                () = until(&mut self.starts_due) => self.report_starts(),
                () = until(&mut self.lease_end) => self.lease_ran_out(),
                Some(done) = self.mig_rx.recv() => self.on_reconfigured(done),
                _ = self.sweep.tick(), if !self.stopping => self.sweep_logs(),
                event = next_link_event(&mut self.link) => match event {
                    LinkEvent::Batch(batch) => {
                        self.backoff.reset();
                        for msg in batch.messages {
                            self.on_head_message(msg);
                        }
                    }
                    LinkEvent::Heartbeat => {
                        self.backoff.reset();
                        self.heartbeat();
                    }
                    LinkEvent::Ended => self.lost_link("the head ended the stream".into()),
                    LinkEvent::Failed(status) => self.lost_link(status.to_string()),
                },
                result = until(&mut self.connecting) => {
                    self.connecting = None;
                    match result {
                        Ok(link) => self.attached(link),
                        Err(e) => self.connect_failed(e),
                    }
                }
            }
        }
        self.tracker.close();
        self.tracker.wait().await;
        self.close_link().await;
        match self.fatal {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Starts an attempt to register and attach after `delay`, unless stopping.
    fn reconnect(&mut self, delay: Duration) {
        if self.stopping {
            return;
        }
        let rejoin = self.protocol.rejoin();
        let identity = self.identity.get().cloned();
        let secret = identity.as_ref().map(|i| i.secret.clone());
        let request = RegisterRequest {
            name: self.me.name.clone(),
            address: self.me.address.clone(),
            resources: self.me.resources.clone(),
            labels: self.me.labels.clone(),
            running: rejoin.running,
            gpus: self.gpus.registration_inventory(),
            finished: rejoin.finished,
            identity,
            boot_id: self.boot_id,
        };
        tracing::debug!(?delay, node = ?self.node_id, running = request.running.len(), unacked = request.finished.len(), "registering");
        let head = self.env.head.clone();
        self.connecting = Some(Box::pin(connect(head, request, secret, delay)));
    }

    /// Connects again at once (the head named where, or asked for a new registration), but
    /// not in a tight loop if replicas keep pointing at each other or keep asking: every
    /// eighth try in a row waits a back-off delay.
    fn reconnect_soon(&mut self) {
        self.failures += 1;
        let delay = if self.failures.is_multiple_of(8) {
            self.backoff.next_delay()
        } else {
            Duration::ZERO
        };
        self.reconnect(delay);
    }

    fn connect_failed(&mut self, error: ConnectError) {
        match error {
            ConnectError::Redirected(url) => {
                tracing::debug!(%url, "following the head group's leader");
                self.reconnect_soon();
            }
            ConnectError::RegisterAgain(why) => {
                tracing::info!(node = ?self.node_id, %why, "the head asks this worker to register again");
                self.reconnect_soon();
            }
            ConnectError::Unknown(status) => {
                tracing::warn!(node = ?self.node_id, running = self.protocol.running_count(), reason = %status.message(), "the head group does not know this worker; registering as a new node and cancelling the tasks no head knows");
                self.forget_identity();
                self.reconnect(Duration::ZERO);
            }
            ConnectError::Retry(why) => {
                self.failures += 1;
                if self.failures == 1 || self.failures.is_multiple_of(30) {
                    tracing::warn!(head = %self.env.head.url(), attempts = self.failures, %why, "cannot reach the head; retrying");
                } else {
                    tracing::debug!(attempts = self.failures, %why, "cannot reach the head");
                }
                let delay = self.backoff.next_delay();
                self.reconnect(delay);
            }
            ConnectError::Fatal(status) => {
                tracing::error!(%status, "the head refused this worker");
                self.fatal = Some(WorkerError::Rejected {
                    head: self.env.head.url(),
                    status,
                });
                self.begin_stop();
                self.cancel_all();
            }
        }
    }

    /// Forgets this worker's identity (the head group does not know it): what it runs and
    /// reports belongs to no head any more.
    fn forget_identity(&mut self) {
        if let Err(err) = self.identity.set(None) {
            tracing::error!(%err, "cannot forget the worker's identity");
        }
        self.node_id = None;
        // Task ids and attempts are the old cluster's: the new one numbers its own.
        for running in self.protocol.forget_all().into_values() {
            running.cancel.cancel();
        }
        self.unsent.clear();
        // So are the object ids: the store's copies are no one's now, and their ids may be
        // given out again (`runtime/held.rs` would otherwise report them to the new one).
        self.drop_all_copies();
    }

    fn attached(&mut self, link: Link) {
        let node_id = link.node_id;
        // The registration committed the reports it carried; those that ended while it was
        // under way are sent on the new stream, below.
        let late = self.protocol.registered();
        // The leader answered: the lease runs from when the registration was sent, but what
        // ran under a lease that ran out first ends before it does, whether or not its timer
        // has fired yet. A worker that resumes after a SIGSTOP may register again (or hear a
        // renewal) before that timer runs, and a renewal would otherwise re-arm it: the actor
        // incarnation the head has restarted elsewhere meanwhile would live on here and serve
        // the calls queued while it was stopped (found by `tests/e2e_actor_faults.rs` under
        // load: a call answered by incarnation 1 after incarnation 2 had started).
        let sent = link.registered_at.saturating_duration_since(self.origin);
        if let Some(silent) = self.protocol.attached(sent, link.lease, self.now()) {
            self.fence(silent);
        }
        crate::fence::renewed(link.registered_at);
        self.arm_lease_end();
        if let Some(secret) = &link.reply.secret {
            let identity = escher_proto::types::NodeIdentity {
                node_id,
                secret: secret.clone(),
                group: link.reply.group.clone(),
            };
            if let Err(err) = self.identity.set(Some(identity)) {
                // It still runs as this node; after a restart it would join as a new one.
                tracing::error!(%err, "cannot keep the worker's identity");
            }
        }
        if link.reply.incarnation != self.incarnation {
            // The head's state was restored from a backup: it numbers attempts from what the
            // backup knew, and never sends again one this process ran after the backup.
            tracing::warn!(
                incarnation = link.reply.incarnation,
                "the head's state was restored from a backup; forgetting which attempts ran"
            );
            self.incarnation = link.reply.incarnation;
            self.protocol.forget_ended();
        }
        tracing::info!(%node_id, head = %self.env.head.url(), "attached to the head");
        self.claim_logs(link.reply.group.clone());
        self.node_id = Some(node_id);
        self.env.actors.attached(node_id, &link.secret);
        self.node_tx.send_replace(Some(node_id));
        self.link = Some(link);
        // The back-off restarts once the stream has carried something (see `run`), so that a
        // head that accepts and at once drops the stream is not hammered.
        self.failures = 0;
        for msg in std::mem::take(&mut self.unsent) {
            self.send(msg);
        }
        // Tasks that ended while the registration was under way are not in it: their reports
        // go now, on the new stream, so that none waits for the next failover.
        for report in late {
            self.send(WorkerMessage::TaskFinished(report));
        }
        // What the store holds, so that the head adopts what it still wants and has the rest
        // dropped (a node declared lost comes back with copies its table no longer counts).
        self.report_held();
    }

    fn lost_link(&mut self, why: String) {
        tracing::warn!(%why, running = self.protocol.running_count(), "lost the stream to the head");
        self.link = None;
        let delay = self.backoff.next_delay();
        self.reconnect(delay);
    }

    /// Sends `msg` if attached. A task report that cannot be sent is kept for the next stream.
    fn send(&mut self, msg: WorkerMessage) {
        let unsent = match &self.link {
            Some(link) => match link.send(msg) {
                Ok(()) => return,
                Err(unsent) => {
                    tracing::warn!("the stream to the head is gone");
                    self.link = None;
                    let delay = self.backoff.next_delay();
                    self.reconnect(delay);
                    unsent
                }
            },
            None => Some(msg),
        };
        // Task reports wait in `unacked` and go with the next registration.
        if let Some(msg @ WorkerMessage::GpusChanged { done: Some(_), .. }) = unsent {
            self.unsent.push(msg);
        }
    }

    fn heartbeat(&mut self) {
        let metric = |name: &str, value: f64| Metric {
            name: name.to_string(),
            value,
        };
        // A worker whose fence is gone drains: the head admits nothing new there.
        let unfenced = crate::fence::down().is_some();
        let mut metrics = vec![
            metric("running_tasks", self.protocol.running_count() as f64),
            metric(
                "draining",
                if self.stopping || unfenced { 1.0 } else { 0.0 },
            ),
            metric("fence_down", if unfenced { 1.0 } else { 0.0 }),
            metric("fence_restarts", f64::from(crate::fence::restarts())),
        ];
        metrics.extend(self.gpus.metrics());
        metrics.extend(self.env.spawn_latency.metrics());
        metrics.extend(self.env.disk.metrics());
        let Some(link) = &self.link else {
            return;
        };
        // A replica that stopped renewing the lease (frozen, cut off, no longer leading without
        // saying so) is left before the lease runs out: another replica leads, or will.
        if let Some(lease) = link.lease
            && let Some(silent) = self.protocol.stale(self.now())
        {
            self.env.head.rotate();
            self.lost_link(format!(
                "the head has not renewed this worker's lease for {:.1}s (the lease is {:.1}s)",
                silent.as_secs_f64(),
                lease.as_secs_f64()
            ));
            return;
        }
        let seq = self.protocol.heartbeat(self.now());
        self.send(WorkerMessage::Heartbeat {
            metrics,
            seq,
            fence: crate::fence::report(),
            actors: self.env.actors.loads(),
        });
    }

    /// The time since this runtime's origin, as the protocol takes it.
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// The leader heard heartbeat `seq`: the lease runs from when it was sent.
    fn lease_renewed(&mut self, seq: u64) {
        let Some(renewal) = self.protocol.renewed(seq, self.now()) else {
            return;
        };
        // A renewal of a lease that had run out: what ran under it ends first, whether or not
        // its timer has fired yet (see `attached`).
        if let Some(silent) = renewal.lapsed {
            self.fence(silent);
        }
        crate::fence::renewed(self.origin + renewal.sent);
        self.arm_lease_end();
    }

    /// Sets the lease's end from the last renewal: when it comes without another renewal,
    /// [`Self::lease_ran_out`].
    fn arm_lease_end(&mut self) {
        let Some(end) = self.protocol.lease_end() else {
            self.lease_end = None;
            return;
        };
        let end = self.origin + end;
        self.env.actors.lease_until(end);
        let end = tokio::time::Instant::from_std(end);
        match &mut self.lease_end {
            Some(sleep) => sleep.as_mut().reset(end),
            None => self.lease_end = Some(Box::pin(tokio::time::sleep_until(end))),
        }
    }

    /// The lease's timer fired: unless renewed meanwhile, it has run out ([`Self::fence`]).
    fn lease_ran_out(&mut self) {
        self.lease_end = None;
        match self.protocol.lapsed(self.now()) {
            Some(silent) => self.fence(silent),
            // Renewed meanwhile.
            None => self.arm_lease_end(),
        }
    }

    /// The lease ran out without renewal (this worker was stopped, or cut off from the leading
    /// head): the head will count this node lost once its heartbeat timeout (twice the lease)
    /// passes, and retry its tasks and restart its actors elsewhere. So everything this worker
    /// runs inside its own process ends now, before its next attempt can start:
    /// - each actor incarnation: its instance is dropped (a Rust actor's) or its process
    ///   killed (a Python actor's; the fence supervisor kills it too), and the calls queued or
    ///   in flight fail with the reason;
    /// - each function task: its handler's future is dropped (a Rust function's; a Python
    ///   function's interpreter goes with it), and the attempt fails with the reason.
    ///
    /// The end is reported as the attempt's failure once the head is reached again; a head
    /// that already counted the node lost ignores it. Command tasks are the fence supervisor's
    /// (`fence/`); actors and functions run in this process (Rust ones) or are served through
    /// it (Python ones), so they are stopped here, which also holds in a worker embedded in
    /// another program (no supervisor). What a handler moved off its future (a thread it
    /// spawned, `spawn_blocking` work) is not stopped: docs/client.md says so.
    fn fence(&mut self, silent: Duration) {
        let Some(lease) = self.protocol.lease() else {
            return;
        };
        let ended: Vec<&Running> = self
            .protocol
            .running()
            .map(|(_, r)| r)
            .filter(|r| r.in_process)
            .collect();
        let actors = ended.iter().filter(|r| r.actor).count();
        let why = format!(
            "fenced: worker {}'s lease ran out ({:.1}s without renewal by the leading head, \
             the lease is {:.1}s): the worker was stopped or cut off from the head, which \
             restarts the actor elsewhere if it may",
            self.me.name,
            silent.as_secs_f64(),
            lease.as_secs_f64()
        );
        // The actor host is fenced whatever this bookkeeping lists: an incarnation whose attempt
        // it forgot already (the head did not know the node: `forget_identity` cancelled it, and
        // the cancel reaches the instance a moment later) must not take a call meanwhile.
        self.env.actors.fence(&why);
        if ended.is_empty() {
            return;
        }
        tracing::warn!(
            actors,
            functions = ended.len() - actors,
            %why,
            "ending the actors and function tasks this worker hosts"
        );
        // Actors still in their constructor end too, and every function's handler.
        for running in ended {
            running.cancel.cancel();
        }
    }

    fn on_head_message(&mut self, msg: wire::HeadMessage) {
        let assign_ids = match &msg.body {
            Some(Body::Assign(a)) => Some((TaskId(a.task_id), a.attempt)),
            _ => None,
        };
        // The stream's name table reads the numbered resource names of an assignment.
        let decoded = match &mut self.link {
            Some(link) => link.names.decode(msg),
            None => HeadMessage::try_from(msg),
        };
        match decoded {
            Ok(HeadMessage::Assign(a)) => self.assign(a),
            Ok(HeadMessage::CancelTask {
                task_id,
                attempt,
                reason,
                force,
            }) => match self.protocol.get(&(task_id, attempt)) {
                Some(running) => {
                    tracing::debug!(%task_id, attempt, %reason, force, "cancelling");
                    if force {
                        running.force.cancel();
                    }
                    running.cancel.cancel();
                }
                None => tracing::debug!(%task_id, attempt, "cancel for a task not running here"),
            },
            Ok(HeadMessage::FetchLogs {
                request_id,
                task_id,
                stream,
                offset,
                max_bytes,
                attempt,
            }) => self.fetch_logs(request_id, (task_id, attempt), stream, offset, max_bytes),
            Ok(HeadMessage::Shutdown { reason }) => {
                tracing::info!(%reason, "the head asked this worker to shut down");
                self.begin_stop();
            }
            Ok(HeadMessage::ReconfigureMig { gpu, layout }) => self.reconfigure(gpu, &layout),
            Ok(HeadMessage::ReportsAcked(reports)) => {
                self.protocol
                    .acked(reports.iter().map(|r| (r.task_id, r.attempt)));
            }
            Ok(HeadMessage::LeaseRenewed { seq }) => self.lease_renewed(seq),
            Ok(HeadMessage::DeleteObjects(ids)) => self.delete_objects(&ids),
            Ok(HeadMessage::DropCopies(copies)) => self.drop_copies(copies),
            Err(e) => match assign_ids {
                Some((task_id, attempt)) => {
                    tracing::warn!(%task_id, attempt, error = %e, "invalid assignment");
                    self.report(TaskFinished {
                        task_id,
                        attempt,
                        outcome: Err(format!("invalid assignment: {e}")),
                        timed_out: false,
                        output: None,
                    });
                }
                None => tracing::warn!(error = %e, "ignoring an invalid message from the head"),
            },
        }
    }

    fn assign(&mut self, a: Assignment) {
        let assigned = Instant::now();
        let key = (a.task_id, a.attempt);
        let Some(node_id) = self.node_id else {
            return;
        };
        let lapsed = match self.protocol.admit(key, self.now()) {
            protocol::Admit::Again => {
                // Running, or given to this process already: an attempt runs once.
                tracing::debug!(task_id = %a.task_id, attempt = a.attempt, "ignoring a second assignment of an attempt");
                return;
            }
            protocol::Admit::Lapsed { silent } => Some(silent),
            protocol::Admit::Start => None,
        };
        if self.stopping {
            self.report(TaskFinished {
                task_id: a.task_id,
                attempt: a.attempt,
                outcome: Err(format!(
                    "worker {} is shutting down; the task was not started",
                    self.me.name
                )),
                timed_out: false,
                output: None,
            });
            return;
        }
        if let Some(why) = crate::fence::down() {
            self.report(TaskFinished {
                task_id: a.task_id,
                attempt: a.attempt,
                outcome: Err(format!(
                    "worker {} cannot fence tasks, so the task was not started: {why}",
                    self.me.name
                )),
                timed_out: false,
                output: None,
            });
            return;
        }
        if let Some(silent) = lapsed {
            // The assignment was read after this worker's lease ran out (it was stopped or cut
            // off): the head may have given the attempt up and sent the next one elsewhere, so
            // starting it could run the task twice at once.
            self.report(TaskFinished {
                task_id: a.task_id,
                attempt: a.attempt,
                outcome: Err(format!(
                    "worker {} read this assignment after its lease had run out (no renewal \
                     for {:.1}s): the task was not started, since the head may already run \
                     it elsewhere",
                    self.me.name,
                    silent.as_secs_f64()
                )),
                timed_out: false,
                output: None,
            });
            return;
        }
        // An actor's start is reported once its constructor returned; a task that arrives while
        // the node's disk is under its reserve waits for space, and its start is reported once
        // it has room (the runner says so on `ready`).
        let waits_for_disk = matches!(
            a.spec.kind,
            TaskKind::Command { .. } | TaskKind::Function { .. }
        ) && self.env.disk.low().is_some();
        if matches!(a.spec.kind, TaskKind::Actor(_)) || waits_for_disk {
            self.unready.insert(key);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let grant = match self.gpus.bind(seq, &a.allocation) {
            Ok(holds) => Grant::Now(self.started(key, &holds)),
            Err(BindError::Never(why)) => {
                tracing::warn!(task_id = %a.task_id, attempt = a.attempt, %why, "the task's GPU devices cannot be given here");
                self.report(TaskFinished {
                    task_id: a.task_id,
                    attempt: a.attempt,
                    outcome: Err(format!(
                        "worker {} cannot give this task its GPU devices: {why}",
                        self.me.name
                    )),
                    timed_out: false,
                    output: None,
                });
                return;
            }
            Err(BindError::Wait(why)) => {
                tracing::info!(task_id = %a.task_id, attempt = a.attempt, %why, "waiting for GPU devices");
                let (tx, rx) = oneshot::channel();
                self.waiting.push(Waiting {
                    seq,
                    key,
                    allocation: a.allocation.clone(),
                    grant: tx,
                });
                Grant::Later(rx)
            }
        };
        let cancel = CancellationToken::new();
        let force = CancellationToken::new();
        self.protocol.run(
            key,
            Running {
                seq,
                cancel: cancel.clone(),
                force: force.clone(),
                in_process: matches!(a.spec.kind, TaskKind::Actor(_) | TaskKind::Function { .. }),
                actor: matches!(a.spec.kind, TaskKind::Actor(_)),
            },
        );
        let env = Arc::clone(&self.env);
        let done = self.finished_tx.clone();
        let ready = self.ready_tx.clone();
        self.tracker.spawn(async move {
            let devices = match grant {
                Grant::Now(devices) => Ok(devices),
                Grant::Later(rx) => tokio::select! {
                    biased;
                    () = cancel.cancelled() => Err("cancelled while waiting for a GPU device".to_string()),
                    granted = rx => granted.unwrap_or_else(|_| Err("the worker stopped while the task waited for a GPU device".to_string())),
                },
            };
            let report = match devices {
                Ok(devices) => {
                    run_task(env, node_id, a, assigned, cancel, force, devices, ready).await
                }
                Err(why) => TaskFinished {
                    task_id: a.task_id,
                    attempt: a.attempt,
                    outcome: Err(why),
                    timed_out: false,
                    output: None,
                },
            };
            // The receiver lives as long as the runtime, which waits for every runner.
            let _ = done.send(Finished { seq, report });
        });
    }

    /// An actor incarnation's constructor returned: its start is reported now.
    fn on_ready(&mut self, key: (TaskId, u32)) {
        if self.unready.remove(&key) && self.protocol.runs(&key) {
            self.report_start(key.0, key.1);
        }
    }

    fn on_finished(&mut self, Finished { seq, report }: Finished) {
        self.report_finished(seq, report);
        // Whatever the report's fate, the runner is gone: so are its devices, and what waited
        // for them may go on (after the head has heard of the end).
        self.waiting.retain(|w| w.seq != seq);
        if self.gpus.release(seq) {
            self.retry_waiting();
            self.start_reconfigurations();
        }
    }

    fn report_finished(&mut self, seq: u64, report: TaskFinished) {
        let key = (report.task_id, report.attempt);
        // An actor that ended before its constructor returned never started serving.
        self.unready.remove(&key);
        if self.protocol.get(&key).is_none_or(|r| r.seq != seq) {
            // A task of a node the head has forgotten: not reported.
            return;
        }
        self.protocol.ended(&key);
        tracing::debug!(task_id = %report.task_id, attempt = report.attempt, outcome = ?report.outcome, timed_out = report.timed_out, "task finished");
        self.report(report);
    }

    /// Reports that an attempt started, after [`START_REPORT_DELAY`] or with its end.
    pub(super) fn report_start(&mut self, task_id: TaskId, attempt: u32) {
        if self.unready.contains(&(task_id, attempt)) {
            // An actor's start waits for its constructor (`on_ready`).
            return;
        }
        let due = tokio::time::Instant::now() + START_REPORT_DELAY;
        self.starts.push_back(((task_id, attempt), due));
        if self.starts_due.is_none() {
            self.starts_due = Some(Box::pin(tokio::time::sleep_until(due)));
        }
    }

    /// Sends the starts that waited [`START_REPORT_DELAY`], and waits for the next one's turn.
    fn report_starts(&mut self) {
        let now = tokio::time::Instant::now();
        while let Some(&((task_id, attempt), due)) = self.starts.front()
            && due <= now
        {
            self.starts.pop_front();
            self.send(WorkerMessage::TaskStarted { task_id, attempt });
        }
        self.starts_due = self
            .starts
            .front()
            .map(|&(_, due)| Box::pin(tokio::time::sleep_until(due)));
    }

    /// Reports the end of an attempt, keeping the report until the head acknowledges it; its
    /// start first, if that is not reported yet.
    fn report(&mut self, report: TaskFinished) {
        let key = (report.task_id, report.attempt);
        if let Some(i) = self.starts.iter().position(|(s, _)| *s == key) {
            self.starts.remove(i);
            if self.starts.is_empty() {
                self.starts_due = None;
            }
            self.send(WorkerMessage::TaskStarted {
                task_id: key.0,
                attempt: key.1,
            });
        }
        self.protocol.finished(report.clone());
        self.send(WorkerMessage::TaskFinished(report));
    }

    fn fetch_logs(
        &mut self,
        request_id: u64,
        (task_id, attempt): (TaskId, u32),
        stream: LogStream,
        offset: u64,
        max_bytes: u32,
    ) {
        let Some(tx) = self.link.as_ref().map(|l| l.tx.clone()) else {
            return;
        };
        let log_dir = self.env.log_dir.clone();
        let stream = match stream {
            LogStream::Stdout => Stream::Stdout,
            LogStream::Stderr => Stream::Stderr,
        };
        let max_bytes = match max_bytes {
            0 => DEFAULT_LOG_FETCH,
            n => n.min(MAX_LOG_FETCH),
        };
        // The end of a running attempt's file is not the end of its stream: it may write more.
        let running = self.protocol.runs(&(task_id, attempt));
        self.tracker.spawn(async move {
            let read = exec::read_log(&log_dir, task_id.0, attempt, stream, offset, max_bytes);
            let result = read
                .await
                .map(|c| LogChunk {
                    data: c.data,
                    next_offset: c.next_offset,
                    eof: c.eof && !running,
                    ..LogChunk::default()
                })
                .map_err(|e| e.to_string());
            // A stream that broke meanwhile took the request with it.
            let _ = tx.send(WorkerMessage::Logs { request_id, result }.into());
        });
    }

    /// The attempts that run here now, as log file keys.
    fn running_keys(&self) -> HashSet<(u64, u32)> {
        self.protocol
            .running()
            .map(|((t, a), _)| (t.0, *a))
            .collect()
    }

    /// Applies the log retention rule, on a blocking thread.
    fn sweep_logs(&mut self) {
        let (dir, policy) = (self.env.log_dir.clone(), self.env.log_retention);
        let running = self.running_keys();
        self.tracker.spawn_blocking(move || {
            match exec::sweep_logs(&dir, policy, &running, SystemTime::now()) {
                Ok(s) if s.files > 0 => {
                    tracing::info!(files = s.files, bytes = s.bytes, "removed old task logs");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "cannot apply the log retention rule"),
            }
        });
    }

    /// Makes the log directory this cluster's: another cluster's logs go (on a blocking
    /// thread), so that they are never served as this cluster's tasks' output.
    fn claim_logs(&mut self, cluster: String) {
        let dir = self.env.log_dir.clone();
        let running = self.running_keys();
        self.tracker.spawn_blocking(move || {
            match exec::claim_log_dir(&dir, &cluster, &running) {
                Ok(0) => {}
                Ok(n) => tracing::info!(files = n, %cluster, "removed another cluster's task logs"),
                Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "cannot claim the log directory"),
            }
        });
    }

    fn begin_stop(&mut self) {
        if self.stopping {
            return;
        }
        self.stopping = true;
        self.connecting = None;
        self.drain_timer = Some(Box::pin(tokio::time::sleep(self.drain)));
        self.heartbeat();
    }

    fn cancel_all(&mut self) {
        self.cancelled_all = true;
        if self.protocol.running_count() > 0 {
            tracing::info!(
                running = self.protocol.running_count(),
                "cancelling the tasks still running"
            );
        }
        for (_, running) in self.protocol.running() {
            running.cancel.cancel();
        }
    }

    /// Ends the worker's half of the stream, then waits a little for the head to end its half,
    /// so that what was queued is delivered rather than reset.
    async fn close_link(&mut self) {
        let Some(Link {
            tx, mut inbound, ..
        }) = self.link.take()
        else {
            return;
        };
        drop(tx);
        let deadline = tokio::time::Instant::now() + CLOSE_TIMEOUT;
        while let Ok(Ok(Some(_))) = tokio::time::timeout_at(deadline, inbound.message()).await {}
    }
}

/// Awaits the future in `slot`, or forever if there is none.
async fn until<F: Future + Unpin>(slot: &mut Option<F>) -> F::Output {
    match slot {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

/// What happened on the attached stream.
enum LinkEvent {
    /// The head sent messages.
    Batch(wire::HeadBatch),
    /// It is time for a heartbeat.
    Heartbeat,
    /// The head ended the stream.
    Ended,
    /// The stream failed.
    Failed(tonic::Status),
}

/// The next thing that happens on the stream, or nothing ever if not attached.
async fn next_link_event(link: &mut Option<Link>) -> LinkEvent {
    let Some(link) = link else {
        return std::future::pending().await;
    };
    tokio::select! {
        biased;
        msg = link.inbound.message() => match msg {
            Ok(Some(batch)) => LinkEvent::Batch(batch),
            Ok(None) => LinkEvent::Ended,
            Err(status) => LinkEvent::Failed(status),
        },
        _ = link.heartbeat.tick() => LinkEvent::Heartbeat,
    }
}
