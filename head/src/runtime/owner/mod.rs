//! The one task that owns the head's replica (and through it the state). gRPC handlers send
//! it [`Msg`]s and await replies; peers' raft traffic arrives on a channel of its own.
//!
//! Each turn of the loop takes everything that is waiting (client writes become proposals,
//! reads join one ReadIndex batch, raft messages are stepped), then runs one ready cycle of
//! the replica and acts on what it produced: proposals are answered once their entries are
//! applied, effects are performed (on the leader only), reads run, waits resume. See
//! `replication` for the cycle itself, the runtime's `proposals.rs`, `reads.rs` and
//! `workers.rs` for the soft state kept here.
//!
//! # Layout
//!
//! - `mod.rs`: [`Owner`], its loop and the turn (drain, propose, cycle);
//! - `msg.rs`: [`Msg`], what handlers ask, and where each is taken;
//! - `outputs.rs`: what a ready cycle produced (applied entries, roles, reads, snapshots);
//! - `effects.rs`: the effects of applied commands, performed by the leader;
//! - `leadership.rs`: taking and losing the lead, and the periodic tick;
//! - `workers.rs`: registration, attaching, and the messages workers report;
//! - `held.rs`: the copies a worker's store holds, reconciled with the object table;
//! - `logs.rs`: fetching a task's output from its worker or the kept tail.

mod effects;
mod held;
mod leadership;
mod logs;
mod msg;
mod outputs;
mod workers;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use escher_proto::types::{NodeId, RequestKey};
use rustc_hash::FxHashMap;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::config::HeadConfig;
use super::logs::PendingFetch;
use super::metrics::Metrics;
use super::object_sessions::ObjectSessions;
use super::proposals::{Batch, Pending, Proposals};
use super::reads::Reads;
use super::statuses::not_accepted;
use super::waiters::Waiters;
use super::watch::Hub;
use super::workers::Workers;
use crate::auth::Keys;
use crate::replication::{Inbound, LogStore, Replica, ReplicationError, TransportEvent};
use crate::scheduler::Millis;
use crate::state::Command;
pub(crate) use msg::{HeadsView, Msg};

/// The most messages of one channel taken in one turn, so that the others are not starved.
const TURN: usize = 1024;

/// The data format a group must write before it may record `command`, and what the command
/// does, for the refusal: actors from [`ACTORS_FORMAT`](crate::replication::ACTORS_FORMAT),
/// node labels set at run time from [`LABELS_FORMAT`](crate::replication::LABELS_FORMAT),
/// the object table's commands from [`OBJECTS_FORMAT`](crate::replication::OBJECTS_FORMAT),
/// decisions for watchers from [`DECISIONS_FORMAT`](crate::replication::DECISIONS_FORMAT);
/// `None` for a command every format holds.
fn format_needed(command: &Command) -> Option<(u16, &'static str)> {
    use crate::replication::{
        ACTORS_FORMAT, DECISIONS_FORMAT, LABELS_FORMAT, OBJECTS_FORMAT, SESSIONS_FORMAT,
    };
    match command {
        Command::Submit { tasks, .. }
            if tasks
                .iter()
                .any(|t| matches!(t.kind, escher_proto::TaskKind::Actor(_))) =>
        {
            Some((ACTORS_FORMAT, "record actors"))
        }
        Command::LabelNode { .. } => Some((LABELS_FORMAT, "change a node's labels")),
        Command::ObjectsSealed { .. }
        | Command::ObjectsReleased { .. }
        | Command::OpenObjectSession => Some((OBJECTS_FORMAT, "record objects")),
        Command::RecordDecision { .. } => Some((DECISIONS_FORMAT, "record decisions")),
        Command::CloseObjectSession { .. } => Some((SESSIONS_FORMAT, "close object sessions")),
        Command::RemoveJudgedNode { .. } => Some((
            crate::replication::JUDGED_REMOVAL_FORMAT,
            "remove a node by its registration",
        )),
        Command::CancelTasks { force: true, .. } => Some((
            crate::replication::PARENT_TASK_FORMAT,
            "kill a cancelled task at once (force)",
        )),
        Command::SubmitChildren { .. } | Command::CancelTasks { .. } => Some((
            crate::replication::PARENT_TASK_FORMAT,
            "record which task submitted which",
        )),
        _ => None,
    }
}

/// `command` as a group writing data format `writes` can record it: before
/// [`PARENT_TASK_FORMAT`](crate::replication::PARENT_TASK_FORMAT), a submission from inside a
/// task records no parent (`Submit`), and a cancel that is not forced is a plain `Cancel` (such
/// a group has recorded no parent, so a recursive cancel has no descendant to reach). A forced
/// cancel stays, and [`format_needed`] refuses it.
fn downgrade(command: Command, writes: u16) -> Command {
    if writes >= crate::replication::PARENT_TASK_FORMAT {
        return command;
    }
    match command {
        Command::SubmitChildren {
            tasks, namespace, ..
        } => Command::Submit { tasks, namespace },
        Command::CancelTasks {
            tasks,
            force: false,
            ..
        } => Command::Cancel { tasks },
        other => other,
    }
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

/// A planned stop's hand-over of leadership: the server, told to stop, cancels `asked`; the
/// owner hands leadership to another replica (if it leads a group) and cancels `done` once
/// another leads or the transfer's time is up; only then does the server stop serving.
#[derive(Debug, Clone, Default)]
pub(crate) struct Handover {
    pub(crate) asked: CancellationToken,
    pub(crate) done: CancellationToken,
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
    /// The log lost a write that may have been acknowledged (see [`LogStore::lost_tail`]): the
    /// ids it may have given out are skipped when this replica first leads.
    lost_tail: Option<crate::replication::LostTail>,
    /// Why the log cannot be written now (its disk is full): writes are refused meanwhile.
    disk_full: Option<String>,
    /// When this leader last proposed the drain of each node whose walltime ends soon, so a
    /// proposal in flight is not made again on every tick.
    ending: BTreeMap<NodeId, Instant>,
    /// When each object session was last renewed, for releasing lapsed ones (leader only).
    sessions: ObjectSessions,
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
            config,
            batch: Batch::default(),
            proposals: Proposals::default(),
            workers: Workers::default(),
            waiters: Waiters::default(),
            reads: Reads::default(),
            logs: FxHashMap::default(),
            next_log: 1,
            last_prune: Instant::now(),
            ending: BTreeMap::new(),
            sessions: ObjectSessions::default(),
            leading: false,
            lost_tail: replica.lost_tail(),
            disk_full: None,
            replica,
        }
    }

    /// Serves until shutdown (or until the replica fails, which stops the head). Workers are
    /// not told to stop: their streams end, and they wait for a head to come back.
    pub(crate) async fn run(
        mut self,
        mut inboxes: Inboxes,
        shutdown: CancellationToken,
        handover: Handover,
    ) -> Result<(), ReplicationError> {
        let mut tick = tokio::time::interval(self.config.tick_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut raft_tick = tokio::time::interval(self.config.replica.tick);
        raft_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Until when a hand-over of leadership may take (raft-rs gives up a transfer after an
        // election timeout too).
        let mut handing: Option<Instant> = None;
        let result = loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break Ok(()),
                () = handover.asked.cancelled(), if handing.is_none() => {
                    let election = self.config.replica.tick
                        * u32::try_from(self.config.replica.election_ticks).unwrap_or(u32::MAX);
                    handing = Some(Instant::now() + election);
                    match self.replica.hand_over() {
                        Some(to) => tracing::info!(to, "stopping: leadership handed over"),
                        None => handover.done.cancel(),
                    }
                }
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
            if let Some(until) = handing
                && !handover.done.is_cancelled()
                && (!self.replica.is_leader() || Instant::now() >= until)
            {
                handover.done.cancel();
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
                data_format,
                messages,
            } => self
                .replica
                .step(from, &from_address, data_format, messages),
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
        if self.cannot_lead_now() {
            // In a group, another replica will lead: the caller goes there (a lone head has no
            // other, and says why it refuses, next).
            pending.fail(self.stalled_status());
            return;
        }
        if let Some(why) = &self.disk_full {
            let replica = self.replica.id();
            pending.fail(Status::resource_exhausted(format!(
                "head replica {replica} refuses writes: {why}"
            )));
            return;
        }
        let command = downgrade(command, self.replica.writes_format());
        if let Some((format, what)) = format_needed(&command) {
            let writes = self.replica.writes_format();
            if writes < format {
                pending.fail(Status::failed_precondition(format!(
                    "the head group cannot {what} yet: it writes data format {writes}, and that \
                     needs format {format} (a replica runs an older release, or has not been \
                     heard from since this one started); upgrade every replica, or try again in \
                     a moment"
                )));
                return;
            }
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
}

/// A new node's secret: 32 random bytes, as hex.
fn new_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    hex::encode(bytes)
}

/// [`test_owner`] made leader, its cluster named (the `Init` it proposed taken out of its
/// batch), and a worker `w` with `cpu=1` (boot 1) for it to register.
#[cfg(test)]
pub(super) fn leading_test_owner() -> (
    Owner<crate::replication::MemLog>,
    escher_core::state::Joining,
) {
    let mut owner = test_owner();
    owner.on_role(escher_proto::types::ReplicaRole::Leader, Some(1));
    let _init = owner.batch.take();
    let worker = escher_core::state::Joining {
        name: "w".into(),
        address: String::new(),
        resources: "cpu=1".parse().expect("a resource set"),
        labels: Default::default(),
        gpus: Vec::new(),
        boot: 1,
    };
    (owner, worker)
}

/// An owner of a fresh group of one, in memory, that no cycle has run for (so raft has not
/// made it leader): what the owner does with each message, tested without the runtime.
#[cfg(test)]
pub(super) fn test_owner() -> Owner<crate::replication::MemLog> {
    use crate::replication::{PeerAccess, Persistence, Transport};
    let config = HeadConfig {
        replica: crate::replication::ReplicaConfig::single("127.0.0.1:1"),
        ..HeadConfig::default()
    };
    let keys = Keys::new(&config.access);
    let (events, _) = mpsc::unbounded_channel();
    let transport = Transport::new(
        config.replica.id,
        &config.replica.group,
        &config.replica.address,
        events,
        CancellationToken::new(),
        tokio_util::task::TaskTracker::new(),
        PeerAccess {
            bearer: escher_proto::access::Bearer::new(keys.peer_token()),
            tls: None,
        },
    );
    let replica = Replica::open(
        config.replica.clone(),
        crate::replication::MemLog::new(),
        config.state.clone(),
        transport,
        Persistence::Inline,
        true,
        None,
    )
    .expect("a group of one opens in memory");
    Owner::new(replica, config, keys, Arc::new(Metrics::default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_64_hex_digits_and_never_the_same() {
        let (a, b) = (new_secret(), new_secret());
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn parents_and_cancel_options_wait_for_format_11_and_only_force_is_refused_before() {
        use crate::replication::{DISK_RESERVE_FORMAT, PARENT_TASK_FORMAT};
        use escher_proto::types::TaskId;
        let children = || Command::SubmitChildren {
            tasks: Vec::new(),
            namespace: None,
            parent: TaskId(1),
        };
        let cancel = |force| Command::CancelTasks {
            tasks: vec![TaskId(1)],
            recursive: true,
            force,
        };
        // A group at format 11 records them as they are.
        for command in [children(), cancel(false), cancel(true)] {
            assert_eq!(downgrade(command.clone(), PARENT_TASK_FORMAT), command);
        }
        // Before it: a plain submission and a plain cancel, which every format holds.
        let old = downgrade(children(), DISK_RESERVE_FORMAT);
        assert_eq!(
            old,
            Command::Submit {
                tasks: Vec::new(),
                namespace: None
            }
        );
        assert_eq!(format_needed(&old), None);
        let old = downgrade(cancel(false), DISK_RESERVE_FORMAT);
        assert_eq!(
            old,
            Command::Cancel {
                tasks: vec![TaskId(1)]
            }
        );
        assert_eq!(format_needed(&old), None);
        // A forced cancel is refused, naming what it asked for.
        let forced = downgrade(cancel(true), DISK_RESERVE_FORMAT);
        let (format, what) = format_needed(&forced).unwrap();
        assert_eq!(format, PARENT_TASK_FORMAT);
        assert!(what.contains("force"), "{what}");
    }

    #[test]
    fn a_replica_that_does_not_lead_proposes_nothing() {
        let mut owner = test_owner();
        assert!(!owner.leading);
        let (reply, mut rx) = tokio::sync::oneshot::channel();
        owner.propose(Command::Tick, None, Pending::Reply(reply));
        assert!(owner.batch.is_empty());
        let status = rx.try_recv().unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(status.message().contains("not the leader"), "{status:?}");
    }
}
