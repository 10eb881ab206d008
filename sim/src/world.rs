//! [`World`]: one seeded run. Replicas, clients and the network live in one process; a queue
//! of events ordered by simulated time (and, at equal times, by the order they were queued)
//! drives them; every random choice comes from one generator seeded from the run's number.
//!
//! Each replica's log is on a [`SimDisk`]. A cycle that wrote starts an fsync that ends after a
//! simulated latency (short, or long while the disk is slow); until it ends, what the cycle
//! produced (raft messages, answers) is held back and the replica takes nothing else, as the
//! head's owner takes no message while its cycle awaits the fsync. A crash in that window
//! keeps a random prefix of the write (a torn write) and loses everything buffered.
//!
//! An operator changes the group's membership while the faults run, as `escher heads add` and
//! `remove` do: one change at a time, proposed to the replica it believes leads and sent again
//! (elsewhere, after "not leader" or a silence) until the group applies it. A replica to add is
//! started first with an empty disk to join (`--join`; restarted the same way after a crash,
//! which may come before it caught up), then added as a voter, as the head adds one; a member
//! to remove is drawn from the group as the operator knows it, the leader included, and goes on
//! running (and crashing) outside the group. At the end the members (as the most advanced
//! replica has them) must be what the operator was told, each of them up, converged and of the
//! same mind about who the members are.
//!
//! The operator also restarts the leader as a planned restart does (`SIGTERM`): the leader
//! hands the lead over (`Replica::hand_over`), serves on until it no longer leads or an
//! election timeout passed, stops after its fsync under way, and is started again 0.2–3 s
//! later.
//!
//! Workers (`workers.rs`, [`crate::worker`]) register, attach to the leader, heartbeat for
//! leases and run what the leading replica's applied entries assign; a replica's leading self
//! plays the owner's part (streams, with the head's own `Liveness` deciding about heartbeat
//! clocks, leases and declaring silent nodes lost). With
//! workers the history ends with the quiet end, and the group is then given `DRAIN_MS` with
//! the workers silent to converge.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use escher_client::ClientError;
use escher_client::retry::{Answered, Retry, Step};
use escher_core::state::{Command, Effect, Joining, SecretHash, StateConfig};
use escher_head::replication::sim::{SimOutput, SimReplica};
use escher_head::replication::{NotAccepted, SimDisk};
use escher_proto::types::{
    CapacityOp, HeadChange, Labels, NodeId, NodeSpec, ResourceName, ResourceUpdate, TaskKind,
    TaskSpec,
};
use raft::eraftpb::{Message, MessageType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::checker::{self, Checker};
use crate::client::{Client, Intent, Replica};
use crate::history::History;
use crate::network::Network;
use crate::worker::{ToWorker, Worker};

mod workers;

use workers::{FromWorker, Owner, Wire};

/// The simulated time the run starts at (milliseconds since the epoch, arbitrary).
const T0: u64 = 1_800_000_000_000;
/// How often a replica ticks (the head's default).
const TICK_MS: u64 = 50;
/// How long a client (and the operator) waited for an answer before it sent again elsewhere,
/// under the simulation's own rules of before ([`Options::client_rules`] off). Under the real
/// client's rules it is the real client's figure, `escher_client::SILENT_REPLICA_TIMEOUT`
/// (the HTTP/2 keep-alive's interval and ping timeout: 3 s); see [`World::call_timeout_ms`].
const OLD_CLIENT_TIMEOUT_MS: u64 = 1_000;
/// How long the quiet end lasts: no faults, no new writes; the group must converge.
const QUIET_MS: u64 = 10_000;
/// With workers, how long after the history ends the group is given to converge (the
/// workers silent meanwhile).
const DRAIN_MS: u64 = 3_000;
/// A client's pause before it sends a write again as a new call, after its call failed (a full
/// disk, no leader within the failover timeout, an unknown outcome).
const BUSY_RETRY_MS: u64 = 200;
/// One in this many fsyncs, while faults run, has a crash of its replica scheduled inside it
/// (at most `World::fsync_crashes` per run).
const CRASH_IN_FSYNC: u32 = 150;

/// What a run looks like.
#[derive(Debug, Clone)]
pub struct Options {
    /// Replicas in the group (3 or 5).
    pub replicas: u64,
    /// Clients writing at once.
    pub clients: u64,
    /// Simulated milliseconds of faults and writes, before the quiet end.
    pub duration_ms: u64,
    /// Keep every event's line.
    pub trace: bool,
    /// Clients send their idempotency keys (the real client always does; without them a
    /// retried write may apply twice, which the checker must see).
    pub idempotency_keys: bool,
    /// Disks fail: torn writes at crashes, full disks, slow fsyncs.
    pub disk_faults: bool,
    /// An operator adds and removes replicas while the faults run (`escher heads add` and
    /// `remove`: one raft membership change at a time, as the head proposes them).
    pub membership: bool,
    /// Simulated workers that register, hold leases, run what the head assigns and report it
    /// (0: none; the nodes are registered by a client and never run anything, as the
    /// simulation did before the workers, and a seed replays as it did then).
    pub workers: u64,
    /// The workers' fence: a task stops when its worker's lease runs out, and an assignment
    /// read after it ran out is refused (off, the checker's own test: tasks then run twice).
    pub fence: bool,
    /// Planned restarts: the operator asks the leader to stop (`SIGTERM`), which hands the
    /// lead over first (`Replica::hand_over`), stops, and is started again a moment later.
    pub hand_overs: bool,
    /// The clients retry by the real client's rules (`escher_client::retry`). Off, they retry
    /// as the simulation's own rules had them before (to the leader named by "not leader", else
    /// a random replica, 30 ms later; to a random replica after 1 s of silence, or 200 ms after
    /// a full disk; never giving up), and workers leave an open stream after 500 ms without a
    /// message instead of by the real worker's `Protocol::stale`, so that a seed found before
    /// replays as it ran.
    pub client_rules: bool,
    /// While the storm lasts, one assignment in ten that a leader sends a worker is sent twice
    /// on its stream (as a head that sends an assignment again after a registration's
    /// reconciliation does): the worker's `Protocol` must run it once, and the history checker
    /// fails a run where an attempt ran twice. Off, a seed replays as it ran before.
    pub duplicate_assignments: bool,
    /// A replica that stops leading (or stops) answers the writes it proposed and cannot answer
    /// for that they may still commit, as the head does. Off, it answers "not leader", as the
    /// head did before: the checker's own test (a call then tells its caller a write was not
    /// applied that committed).
    pub in_doubt_answers: bool,
    /// A leader of a group whose disk fills up answers what waits on it ("may still commit")
    /// as soon as it stalls, as the head's owner does (`cannot_lead_now`). Off, it answers
    /// them only when it loses the lead, as the simulation did before (a seed found then
    /// replays as it ran).
    pub stall_answers: bool,
    /// A leader's removal of a node it declared lost names the registration it judged
    /// (`RemoveJudgedNode`, `liveness::removal`), and changes nothing once the node's worker
    /// registered again. Off, it is the plain `RemoveNode` of the data formats before 9, as
    /// the head removed nodes before: the checker's own test (such a removal then removes a
    /// registration it never judged, which the checker reports).
    pub judged_removals: bool,
    /// The workers' streams fail as the network and a worker that does not read make them
    /// fail: the network closes a stream (the worker hears of it a moment later, the leader
    /// later still, and what the leader sends meanwhile finds it closed and waits in the node's
    /// outbox, as the head's owner keeps it), a stream stops being read for a while (its queue,
    /// bounded per seed, fills; the leader drops a full stream as the head's owner does), and
    /// a lease renewal goes through the stream's queue as the head sends it (`send_now`). Off,
    /// a stream is never full and a broken one is forgotten by the leader at once, as the
    /// simulation had it before: a seed found then replays as it ran.
    pub stream_faults: bool,
    /// With [`Options::stream_faults`]: a stream's queue is bounded in bytes too, as the head's
    /// `LinkSender` is (`OUTBOX_BYTES`; each message counted as the head counts it,
    /// `HeadMessage::queued_bytes`, an assignment from its real spec), the bound and the
    /// clients' task sizes drawn per seed (one task in four carries 1–6 KB of arguments). Off,
    /// a queue is bounded in messages only and tasks carry no arguments, as before 2026-12-07's
    /// second round: a seed found then replays as it ran.
    pub stream_bytes: bool,
    /// With [`Options::stream_faults`]: one side of a worker's stream closes while the other
    /// goes on (0–2 times per worker for each side): the head's (it reads nothing more and
    /// forgets the stream; the worker reads what was queued, then sees the end) or the
    /// worker's (it registers again; the head's queue takes what is offered and nobody reads
    /// it until the reset reaches the head, up to a heartbeat timeout later). Off, a seed
    /// replays as it ran before them.
    pub half_closes: bool,
    /// With [`Options::disk_faults`], in one seed of two of a group of three or more, one crash
    /// of one replica also cuts the tail of its log: the newest 1–4 records it had synced are
    /// lost, the cut falling inside a record, and its log reports the lost write at open as
    /// `DiskLog`'s recovery does (`LogStore::lost_tail`); the replica's owner, as the head's
    /// does, skips the ids it may have given out (`Command::SkipIds`) once it leads. Off by
    /// default: the head's replica does not survive every such cut yet (seeds 1015 and 1356,
    /// docs/RELIABILITY.md, "A cut tail"), so the sweeps would fail; off, a seed replays as it
    /// ran before them.
    pub cut_tails: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            replicas: 3,
            clients: 3,
            duration_ms: 20_000,
            trace: false,
            idempotency_keys: true,
            disk_faults: true,
            membership: true,
            workers: 2,
            fence: true,
            hand_overs: true,
            client_rules: true,
            duplicate_assignments: true,
            in_doubt_answers: true,
            stall_answers: true,
            judged_removals: true,
            stream_faults: true,
            stream_bytes: true,
            half_closes: true,
            cut_tails: false,
        }
    }
}

/// What a run did and found.
#[derive(Debug)]
pub struct Outcome {
    /// Its seed.
    pub seed: u64,
    /// Every event, one line each (only with [`Options::trace`]).
    pub trace: Vec<String>,
    /// What broke; empty when the run passed.
    pub violations: Vec<String>,
    /// Counts of what happened.
    pub stats: Stats,
    /// The final state's fingerprint and applied index (equal runs give equal ones).
    pub end: (u64, u64),
}

/// Counts of what a run did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    /// Events handled.
    pub events: u64,
    /// Raft messages delivered.
    pub delivered: u64,
    /// Raft messages lost (dropped or cut by a partition).
    pub lost: u64,
    /// Raft messages delivered twice.
    pub duplicated: u64,
    /// Replica crashes.
    pub crashes: u64,
    /// Partitions.
    pub partitions: u64,
    /// Writes acknowledged.
    pub acknowledged: u64,
    /// Client sends (first tries and retries).
    pub sends: u64,
    /// Client calls that ended with an unknown outcome (the real client's retry rules), each
    /// sent again under the same key.
    pub unknown_outcomes: u64,
    /// Proposals (clients' writes and the operator's changes) answered "it may still commit":
    /// the replica that proposed them stopped leading, or stopped, before they committed.
    pub in_doubt: u64,
    /// Of those, the ones whose entry the group committed after all (under the next leader).
    pub in_doubt_committed: u64,
    /// Times a stalled leader (full disk, in a group) answered what waited on it at once
    /// ([`Options::stall_answers`]).
    pub stall_answers: u64,
    /// The operator's membership-change calls that ended with an unknown outcome (each made
    /// again as a new call).
    pub unknown_change_outcomes: u64,
    /// Snapshots a replica installed from its leader.
    pub snapshots: u64,
    /// fsyncs (cycles that wrote).
    pub fsyncs: u64,
    /// Crashes that cut an fsync short (a torn write).
    pub torn: u64,
    /// Records a crash cut off an fsync under way.
    pub records_lost: u64,
    /// Times a disk filled up.
    pub disks_full: u64,
    /// Times a replica stalled on its full disk.
    pub stalls: u64,
    /// Times a disk turned slow.
    pub slow_disks: u64,
    /// Membership changes acknowledged to the operator (replicas added and removed).
    pub membership_changes: u64,
    /// Task processes the workers started.
    pub executions: u64,
    /// Assignments a leader sent twice ([`Options::duplicate_assignments`]).
    pub duplicated_assignments: u64,
    /// Assignments a worker did not start because it was given them before
    /// (`Admit::Again`: sent twice, or again by a registration's reconciliation).
    pub given_again: u64,
    /// Tasks a worker's fence killed (its lease ran out).
    pub fenced: u64,
    /// Nodes a leader declared lost (no heartbeat for a heartbeat timeout).
    pub nodes_lost: u64,
    /// Removals of nodes declared lost that applied after the node's worker registered again,
    /// and so changed nothing (their judged registration was not the node's any more).
    pub stale_removals: u64,
    /// Worker processes that crashed (their tasks with them).
    pub worker_crashes: u64,
    /// Workers frozen (SIGSTOP) for a while.
    pub freezes: u64,
    /// Workers cut from every replica for a while.
    pub worker_cuts: u64,
    /// Worker streams the network closed ([`Options::stream_faults`]).
    pub stream_closes: u64,
    /// Worker streams that stopped being read for a while.
    pub stream_stalls: u64,
    /// Worker streams a leader dropped because their queue was full.
    pub stream_overflows: u64,
    /// Of them, those full by their bytes while they held fewer messages than their room
    /// ([`Options::stream_bytes`]).
    pub stream_full_by_bytes: u64,
    /// Worker streams whose head's side closed while their worker read on
    /// ([`Options::half_closes`]).
    pub head_half_closes: u64,
    /// Worker streams whose worker's side closed while their head still held them.
    pub worker_half_closes: u64,
    /// Messages a leader's queue took for a stream whose worker's side had closed (nobody read
    /// them).
    pub taken_unread: u64,
    /// Messages a leader offered to a stream that had closed (they waited in the node's
    /// outbox).
    pub offered_closed: u64,
    /// Planned restarts of a leader that had handed the lead to another replica by the time it
    /// stopped.
    pub hand_overs: u64,
    /// Planned restarts (a replica asked to stop, stopped and started again).
    pub planned_restarts: u64,
    /// Crashes that also cut the tail of the replica's log ([`Options::cut_tails`]).
    pub cut_tails: u64,
    /// Synced records those cuts took.
    pub records_cut: u64,
    /// Ids skipped by a leader whose log had lost a tail (`Command::SkipIds` proposed).
    pub skips: u64,
}

impl Stats {
    /// The faults injected: crashes, partitions, full and slow disks, and membership changes
    /// (each a fault in the sense that it moves the quorum under the other faults).
    pub fn faults(&self) -> u64 {
        self.crashes
            + self.partitions
            + self.disks_full
            + self.slow_disks
            + self.membership_changes
            + self.planned_restarts
            + self.cut_tails
            + self.worker_faults()
    }

    /// The workers' faults: crashes, freezes and cuts.
    pub fn worker_faults(&self) -> u64 {
        self.worker_crashes
            + self.freezes
            + self.worker_cuts
            + self.stream_closes
            + self.stream_stalls
            + self.head_half_closes
            + self.worker_half_closes
    }

    /// Adds another run's counts to these.
    pub fn add(&mut self, other: &Stats) {
        let Stats {
            events,
            delivered,
            lost,
            duplicated,
            crashes,
            partitions,
            acknowledged,
            sends,
            unknown_outcomes,
            in_doubt,
            in_doubt_committed,
            stall_answers,
            unknown_change_outcomes,
            snapshots,
            fsyncs,
            torn,
            records_lost,
            disks_full,
            stalls,
            slow_disks,
            membership_changes,
            executions,
            duplicated_assignments,
            given_again,
            fenced,
            nodes_lost,
            stale_removals,
            worker_crashes,
            freezes,
            worker_cuts,
            stream_closes,
            stream_stalls,
            stream_overflows,
            stream_full_by_bytes,
            head_half_closes,
            worker_half_closes,
            taken_unread,
            offered_closed,
            hand_overs,
            planned_restarts,
            cut_tails,
            records_cut,
            skips,
        } = *other;
        self.events += events;
        self.delivered += delivered;
        self.lost += lost;
        self.duplicated += duplicated;
        self.crashes += crashes;
        self.partitions += partitions;
        self.acknowledged += acknowledged;
        self.sends += sends;
        self.unknown_outcomes += unknown_outcomes;
        self.in_doubt += in_doubt;
        self.in_doubt_committed += in_doubt_committed;
        self.stall_answers += stall_answers;
        self.unknown_change_outcomes += unknown_change_outcomes;
        self.snapshots += snapshots;
        self.fsyncs += fsyncs;
        self.torn += torn;
        self.records_lost += records_lost;
        self.disks_full += disks_full;
        self.stalls += stalls;
        self.slow_disks += slow_disks;
        self.membership_changes += membership_changes;
        self.executions += executions;
        self.duplicated_assignments += duplicated_assignments;
        self.given_again += given_again;
        self.fenced += fenced;
        self.nodes_lost += nodes_lost;
        self.stale_removals += stale_removals;
        self.worker_crashes += worker_crashes;
        self.freezes += freezes;
        self.worker_cuts += worker_cuts;
        self.stream_closes += stream_closes;
        self.stream_stalls += stream_stalls;
        self.stream_overflows += stream_overflows;
        self.stream_full_by_bytes += stream_full_by_bytes;
        self.head_half_closes += head_half_closes;
        self.worker_half_closes += worker_half_closes;
        self.taken_unread += taken_unread;
        self.offered_closed += offered_closed;
        self.hand_overs += hand_overs;
        self.planned_restarts += planned_restarts;
        self.cut_tails += cut_tails;
        self.records_cut += records_cut;
        self.skips += skips;
    }
}

#[derive(Debug)]
enum Event {
    Tick(u64),
    Deliver {
        from: u64,
        to: u64,
        msg: Message,
    },
    /// The sender of a snapshot learns whether it arrived, as the real transport's call ends.
    SnapshotSent {
        from: u64,
        to: u64,
        delivered: bool,
    },
    /// The sender of a lost message learns it, as the real transport's failed call tells it.
    Unreachable {
        from: u64,
        to: u64,
    },
    Request {
        client: usize,
        to: u64,
        attempt: u64,
    },
    Response {
        client: usize,
        attempt: u64,
        answer: Answer,
    },
    Timeout {
        client: usize,
        attempt: u64,
    },
    Think(usize),
    Retry(usize),
    Crash(u64),
    /// Replica `id` crashes and its disk cuts the tail of its log ([`Options::cut_tails`]).
    CutTail(u64),
    Restart(u64),
    Partition,
    Heal,
    /// Replica `id`'s fsync ends (if it is still the same life of the replica).
    Synced {
        id: u64,
        life: u64,
    },
    DiskFull(u64),
    DiskFree(u64),
    SlowDisk(u64),
    /// The operator starts its next planned membership change, if it has none under way.
    Operate,
    /// The operator's change reaches replica `to`.
    Change {
        to: u64,
        attempt: u64,
    },
    /// What became of the operator's change (as its call's answer).
    Changed {
        attempt: u64,
        answer: ChangeAnswer,
    },
    /// The operator heard nothing: it asks another replica.
    ChangeTimeout {
        attempt: u64,
    },
    /// Worker `w` (its process `boot`) heartbeats, or finds its stream silent.
    WorkerTick {
        w: usize,
        boot: u64,
    },
    /// Worker `w`'s fence supervisor looks at the lease.
    Supervise {
        w: usize,
        boot: u64,
    },
    /// A message on worker `w`'s stream of `epoch` reaches it.
    ToWorker {
        w: usize,
        boot: u64,
        epoch: u64,
        msg: ToWorker,
    },
    /// A message of worker `w`'s stream reaches replica `to`.
    AtHead {
        to: u64,
        w: usize,
        boot: u64,
        epoch: u64,
        msg: FromWorker,
    },
    /// A task's process (the history's execution `exec`) exits by itself.
    Exit {
        w: usize,
        boot: u64,
        exec: usize,
    },
    WorkerCrash(usize),
    WorkerRestart(usize),
    Freeze(usize),
    Cut(usize),
    /// The network closes worker `w`'s current stream.
    CloseStream(usize),
    /// Worker `w`'s current stream stops being read for a while.
    StallStream(usize),
    /// The leader holding worker `w`'s stream `epoch` sees it end.
    StreamEnded {
        w: usize,
        epoch: u64,
    },
    /// One side of worker `w`'s current stream closes: the head's (`head`) or the worker's.
    HalfClose {
        w: usize,
        head: bool,
    },
    /// The reset of worker `w`'s stream `epoch`, whose worker's side closed, reaches the head.
    ResetSeen {
        w: usize,
        epoch: u64,
    },
    /// The operator asks the replica it finds leading to stop for a planned restart.
    PlannedRestart,
    /// Replica `id`, asked to stop, looks whether its hand-over is done (it no longer leads,
    /// or waited an election timeout): then it stops.
    Stopping {
        id: u64,
        life: u64,
    },
}

/// What the operator hears about its membership change.
#[derive(Debug, Clone)]
enum ChangeAnswer {
    /// Applied by the group.
    Done,
    /// Not taken now (not the leader, a change already pending, a full disk): again later.
    /// The leader named, if any; why, in words; and how the real head would have answered.
    Again(Option<u64>, String, Refusal),
}

/// How the real head answers a membership change that it did not apply, as the real client's
/// retry rules read it (`escher_client::retry::Answered`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// "Not leader" (UNAVAILABLE with the leader's URL or none): nothing was proposed, or
    /// another leader's entry took the proposal's index.
    NotLeader,
    /// The replica proposed it and stopped leading (or stopped) before it committed: it may
    /// still commit (`escher-outcome: may-still-commit`).
    InDoubt,
    /// ABORTED: another change is pending, or raft dropped this one; `escher heads` asks again
    /// 200 ms later.
    Aborted,
    /// The replica's own refusal (a full disk, a change raft or the group refuses).
    Refused,
}

/// A planned membership change.
#[derive(Debug, Clone, Copy)]
enum Plan {
    /// Start a new replica (with `--join`) and add it.
    Add,
    /// Remove one member, chosen when the change starts.
    Remove,
}

/// The operator: one membership change at a time, retried until the group applies it.
#[derive(Debug, Default)]
struct Operator {
    /// Changes still to make, in order.
    plan: VecDeque<Plan>,
    /// The change under way, if any.
    current: Option<HeadChange>,
    /// Sends of it so far (answers to older ones are ignored).
    attempt: u64,
    /// The replica it asks next.
    target: u64,
    /// The real client's retry rules of the call under way ([`Options::client_rules`]).
    retry: Option<Retry<Replica>>,
}

#[derive(Debug, Clone)]
enum Answer {
    Done(Result<escher_core::state::Reply, String>),
    NotLeader(Option<u64>),
    /// The replica proposed the write and stopped leading (or stopped) before it committed: it
    /// may still commit. The leader it names, if any.
    MayStillCommit(Option<u64>),
    /// The replica's disk is full: try again later.
    Busy(String),
}

/// A proposal waiting to be applied: who gets the answer.
#[derive(Debug, Clone, Copy)]
struct Waiter {
    term: u64,
    client: usize,
    attempt: u64,
}

/// One replica's slot: what its disk keeps survives a crash, the replica, its waiters and
/// what it held back for its fsync do not.
#[derive(Debug)]
struct Slot {
    disk: SimDisk,
    replica: Option<SimReplica>,
    waiters: BTreeMap<u64, Vec<Waiter>>,
    /// The end of the fsync under way: until then the replica takes nothing.
    busy_until: Option<u64>,
    /// What the cycle that started the fsync produced, sent when it ends.
    held: (Vec<SimOutput>, Vec<Message>),
    /// Counts the replica's lives: an fsync's end from before a crash is ignored.
    life: u64,
    /// fsyncs are slow until then.
    slow_until: u64,
    /// Started to join a running group (`--join`): restarted the same way.
    joiner: bool,
    /// The operator's change proposed here: its index, term and send.
    change: Option<(u64, u64, u64)>,
    /// The owner's soft state about the workers, while this replica leads.
    owner: Owner,
    /// The last `DiskFull` this life of the replica reported said the disk is full.
    disk_full: bool,
    /// Asked to stop: it hands the lead over and stops by then at the latest.
    stopping: Option<u64>,
    /// The write its log lost at open (a cut tail), as the head's owner keeps it from its
    /// start until it first leads and skips the ids it may have given out.
    lost_tail: Option<escher_head::replication::LostTail>,
}

impl Slot {
    fn new(joiner: bool) -> Slot {
        Slot {
            disk: SimDisk::new(),
            replica: None,
            waiters: BTreeMap::new(),
            busy_until: None,
            held: (Vec::new(), Vec::new()),
            life: 0,
            slow_until: 0,
            joiner,
            change: None,
            owner: Owner::default(),
            disk_full: false,
            stopping: None,
            lost_tail: None,
        }
    }
}

/// One run. See the [module documentation](self).
#[derive(Debug)]
pub struct World {
    seed: u64,
    options: Options,
    rng: StdRng,
    now: u64,
    seq: u64,
    queue: BTreeMap<(u64, u64), Event>,
    slots: BTreeMap<u64, Slot>,
    /// Every replica that exists (the first group's and those the operator started), members
    /// of the group or not.
    voters: Vec<u64>,
    /// The group's members as the operator knows them: the first group, and every change it
    /// was told the group applied.
    members: BTreeSet<u64>,
    /// The first group's replicas (what each of them is started with).
    first_group: Vec<u64>,
    operator: Operator,
    network: Network,
    clients: Vec<Client>,
    /// Nodes registered so far (a resource write targets one).
    nodes: Vec<NodeId>,
    /// Whether faults and new writes go on (false in the quiet end).
    stormy: bool,
    checker: Checker,
    stats: Stats,
    trace: Vec<String>,
    /// A replica failed in a way the head would stop for.
    fatal: Option<String>,
    /// How long a quick fsync takes on this run's disks (milliseconds, inclusive range).
    fsync_ms: (u64, u64),
    /// Crashes inside an fsync still to schedule.
    fsync_crashes: u32,
    /// The simulated workers.
    workers: Vec<Worker>,
    /// What they ran, and what the head assigned.
    history: History,
    /// When the last message of each worker stream (worker, epoch) arrives: a stream delivers
    /// in order.
    worker_streams: BTreeMap<(usize, u64), u64>,
    /// What the leaders' owners put on their workers' streams, to send
    /// (`workers.rs`, [`workers::SimLink`]).
    wire: Wire,
    /// How long a task runs (milliseconds, inclusive range; per seed).
    task_ms: (u64, u64),
    /// When the workers' history ended (with workers, before the group is left to converge).
    history_end: Option<u64>,
    /// The term of the entry committed at each index (as any replica applied it).
    committed: BTreeMap<u64, u64>,
    /// The (index, term) of every proposal answered "it may still commit".
    in_doubt: Vec<(u64, u64)>,
    /// The requests (client, send; the operator as `usize::MAX`) a replica received: under the
    /// real client's rules a copy the network duplicated is dropped, as a request on an HTTP/2
    /// stream reaches the server once (raft's messages are still duplicated).
    received: BTreeSet<(usize, u64)>,
    /// Calls that ended with an error that is not an unknown outcome (the caller takes the
    /// write as not applied), with the (index, term) of each proposal their attempts made: none
    /// of those may commit.
    denied: Vec<Denied>,
    /// The removals the leaders proposed of nodes they declared lost, by (replica, index),
    /// until that replica applies the index (`workers.rs`, `owner_tick`).
    removals: BTreeMap<(u64, u64), workers::Removal>,
}

/// A client's call that ended with an error other than an unknown outcome.
#[derive(Debug)]
struct Denied {
    client: usize,
    key: escher_proto::types::RequestKey,
    /// The (index, term) of each proposal its attempts made.
    proposed: Vec<(u64, u64)>,
    /// The error, in words.
    error: String,
}

/// A pause in whole simulated milliseconds (the retry rules' pauses are whole milliseconds).
fn millis(pause: std::time::Duration) -> u64 {
    u64::try_from(pause.as_millis()).unwrap_or(u64::MAX)
}

/// Runs seed `seed` and checks it.
pub fn run(seed: u64, options: &Options) -> Outcome {
    let mut world = World::new(seed, options.clone());
    world.run();
    world.outcome()
}

impl World {
    fn new(seed: u64, options: Options) -> World {
        let mut rng = StdRng::seed_from_u64(seed);
        let network = Network::random(&mut rng);
        let voters: Vec<u64> = (1..=options.replicas).collect();
        let mut world = World {
            seed,
            rng,
            now: T0,
            seq: 0,
            queue: BTreeMap::new(),
            slots: BTreeMap::new(),
            voters: voters.clone(),
            members: voters.iter().copied().collect(),
            first_group: voters.clone(),
            operator: Operator::default(),
            network,
            clients: Vec::new(),
            nodes: Vec::new(),
            stormy: true,
            checker: Checker::default(),
            stats: Stats::default(),
            trace: Vec::new(),
            fatal: None,
            fsync_ms: (0, 0),
            fsync_crashes: 0,
            workers: Vec::new(),
            history: History::default(),
            worker_streams: BTreeMap::new(),
            wire: Wire::default(),
            task_ms: (0, 0),
            history_end: None,
            committed: BTreeMap::new(),
            in_doubt: Vec::new(),
            received: BTreeSet::new(),
            denied: Vec::new(),
            removals: BTreeMap::new(),
            options,
        };
        if world.options.disk_faults {
            let quick = world.rng.random_range(0..4);
            world.fsync_ms = (quick, quick + world.rng.random_range(0..4));
            world.fsync_crashes = world.rng.random_range(0..4);
        }
        for id in voters {
            world.slots.insert(id, Slot::new(false));
            world.open(id);
            let first = world.rng.random_range(0..TICK_MS);
            world.at(first, Event::Tick(id));
        }
        // Client 0 is the operator: it names the cluster and registers two workers.
        for c in 0..=world.options.clients {
            let target = world.random_replica();
            world.clients.push(Client::new(1000 + c, target));
            let start = world.rng.random_range(100..1_000);
            world.at(start, Event::Think(c as usize));
        }
        let crashes = world.rng.random_range(0..4);
        for _ in 0..crashes {
            let when = world.rng.random_range(500..world.options.duration_ms);
            let who = world.random_replica();
            world.at(when, Event::Crash(who));
        }
        let partitions = world.rng.random_range(0..4);
        for _ in 0..partitions {
            let when = world.rng.random_range(500..world.options.duration_ms);
            world.at(when, Event::Partition);
        }
        if world.options.disk_faults {
            for _ in 0..world.rng.random_range(0..3) {
                let when = world.rng.random_range(500..world.options.duration_ms);
                let who = world.random_replica();
                world.at(when, Event::DiskFull(who));
            }
            for _ in 0..world.rng.random_range(0..4) {
                let when = world.rng.random_range(0..world.options.duration_ms);
                let who = world.random_replica();
                world.at(when, Event::SlowDisk(who));
            }
            if world.options.cut_tails && world.options.replicas >= 3 && world.rng.random_bool(0.5)
            {
                let when = world.rng.random_range(500..world.options.duration_ms);
                let who = world.random_replica();
                world.at(when, Event::CutTail(who));
            }
        }
        if world.options.membership && world.options.replicas > 1 {
            // Grow then shrink, shrink then grow, or one of the two: each change starts at a
            // random moment of the storm, after the one before it is done.
            let plan: &[Plan] = match world.rng.random_range(0..5) {
                0 => &[Plan::Add, Plan::Remove],
                1 => &[Plan::Remove, Plan::Add],
                2 => &[Plan::Add],
                3 => &[Plan::Remove],
                _ => &[],
            };
            world.operator.plan = plan.iter().copied().collect();
            if !plan.is_empty() {
                let when = world.rng.random_range(500..world.options.duration_ms / 2);
                world.at(when, Event::Operate);
            }
        }
        if world.options.workers > 0 {
            // Drawn last: without workers a seed draws what it drew before them.
            let short = world.rng.random_range(10..100);
            world.task_ms = (short, short + world.rng.random_range(0..400));
            world.start_workers();
        }
        if world.options.hand_overs {
            // Drawn after the workers: with `hand_overs` off a seed draws what it drew before.
            for _ in 0..world.rng.random_range(0..3) {
                let when = world.rng.random_range(500..world.options.duration_ms);
                world.at(when, Event::PlannedRestart);
            }
        }
        world
    }

    fn run(&mut self) {
        let storm_end = T0 + self.options.duration_ms;
        let end = storm_end + QUIET_MS;
        // With workers, the history ends at `end`; then, for the group to converge, the
        // workers and their leaders' soft state go quiet while raft finishes what is under way.
        let drained = if self.workers.is_empty() {
            end
        } else {
            end + DRAIN_MS
        };
        while let Some(((time, _), event)) = self.queue.pop_first() {
            if time > drained || self.fatal.is_some() {
                break;
            }
            if self.stormy && time >= storm_end {
                self.calm();
            }
            if self.history_end.is_none() && time > end {
                self.history_end = Some(self.now);
            }
            self.now = time;
            if self.history_end.is_some() && self.of_workers(&event) {
                continue;
            }
            self.stats.events += 1;
            self.handle(event);
        }
        self.history_end.get_or_insert(self.now);
        self.finish();
    }

    /// Whether `event` is a worker's, or its client's, or a leader's heartbeat watch.
    fn of_workers(&self, event: &Event) -> bool {
        match event {
            Event::WorkerTick { .. }
            | Event::Supervise { .. }
            | Event::ToWorker { .. }
            | Event::AtHead { .. }
            | Event::Exit { .. }
            | Event::WorkerCrash(_)
            | Event::WorkerRestart(_)
            | Event::Freeze(_)
            | Event::Cut(_)
            | Event::CloseStream(_)
            | Event::StallStream(_)
            | Event::StreamEnded { .. }
            | Event::HalfClose { .. }
            | Event::ResetSeen { .. } => true,
            Event::Think(client)
            | Event::Retry(client)
            | Event::Timeout { client, .. }
            | Event::Request { client, .. }
            | Event::Response { client, .. } => self.worker_of(*client).is_some(),
            _ => false,
        }
    }

    /// The quiet end: heal, restart everyone, stop writing; the group must converge.
    fn calm(&mut self) {
        self.stormy = false;
        self.network.heal();
        self.network.drop = 0;
        self.network.duplicate = 0;
        self.note("calm: healed, disks freed and quick, every replica up, no new writes".into());
        self.operator.plan.clear();
        for id in self.voters.clone() {
            let slot = self.slots.get_mut(&id).expect("every voter has a slot");
            slot.disk.set_full(false);
            slot.slow_until = 0;
            if self.slots[&id].replica.is_none() {
                self.restart(id);
            }
        }
        self.calm_workers();
    }

    /// The replica an event must wait for while its fsync is under way.
    fn waits_for(event: &Event) -> Option<u64> {
        match event {
            Event::Deliver { to, .. } | Event::Request { to, .. } => Some(*to),
            Event::SnapshotSent { from, .. } | Event::Unreachable { from, .. } => Some(*from),
            Event::AtHead { to, .. } => Some(*to),
            _ => None,
        }
    }

    fn handle(&mut self, event: Event) {
        if let Some(id) = Self::waits_for(&event)
            && let Some(until) = self.slots[&id].busy_until
        {
            // Queued behind the fsync, as the head's inbox holds messages during a cycle.
            self.seq += 1;
            self.queue.insert((until, self.seq), event);
            return;
        }
        if let Event::Timeout { client, .. }
        | Event::Think(client)
        | Event::Retry(client)
        | Event::Response { client, .. } = &event
            && let Some(until) = self.client_frozen(*client)
        {
            // A frozen worker's writes wait with it.
            self.seq += 1;
            self.queue.insert((until, self.seq), event);
            return;
        }
        match event {
            Event::Tick(id) => {
                self.at(TICK_MS, Event::Tick(id));
                if self.slots[&id].busy_until.is_some() {
                    return;
                }
                if let Some(replica) = self.replica(id) {
                    replica.tick();
                    self.drive(id);
                }
                if !self.workers.is_empty()
                    && self.history_end.is_none()
                    && self.slots[&id].busy_until.is_none()
                {
                    self.owner_tick(id);
                }
            }
            Event::WorkerTick { w, boot } => self.worker_tick(w, boot),
            Event::Supervise { w, boot } => self.supervise(w, boot),
            Event::ToWorker {
                w,
                boot,
                epoch,
                msg,
            } => self.at_worker(w, boot, epoch, msg),
            Event::AtHead {
                to,
                w,
                boot,
                epoch,
                msg,
            } => self.at_head(to, w, boot, epoch, msg),
            Event::Exit { w, boot, exec } => self.exit(w, boot, exec),
            Event::WorkerCrash(w) => self.worker_crash(w),
            Event::WorkerRestart(w) => self.worker_restart(w),
            Event::Freeze(w) => self.freeze(w),
            Event::Cut(w) => self.cut(w),
            Event::CloseStream(w) => self.close_stream(w),
            Event::StallStream(w) => self.stall_stream(w),
            Event::StreamEnded { w, epoch } => self.stream_ended(w, epoch),
            Event::HalfClose { w, head } => self.half_close(w, head),
            Event::ResetSeen { w, epoch } => self.reset_seen(w, epoch),
            Event::Deliver { from, to, msg } => {
                let snapshot = msg.get_msg_type() == MessageType::MsgSnapshot;
                let up = self.slots[&to].replica.is_some();
                if snapshot {
                    let delivered = up;
                    self.at(
                        1,
                        Event::SnapshotSent {
                            from,
                            to,
                            delivered,
                        },
                    );
                }
                if !up {
                    return;
                }
                if self.options.trace {
                    let line = format!("deliver {from}->{to} {:?}", msg.get_msg_type());
                    self.note(line);
                }
                self.stats.delivered += 1;
                if let Some(replica) = self.replica(to) {
                    replica.step(from, vec![msg]);
                }
                self.drive(to);
            }
            Event::SnapshotSent {
                from,
                to,
                delivered,
            } => {
                if let Some(replica) = self.replica(from) {
                    replica.snapshot_sent(to, delivered);
                    self.drive(from);
                }
            }
            Event::Unreachable { from, to } => {
                if let Some(replica) = self.replica(from) {
                    replica.unreachable(to);
                    self.drive(from);
                }
            }
            Event::Request {
                client,
                to,
                attempt,
            } => self.request(client, to, attempt),
            Event::Response {
                client,
                attempt,
                answer,
            } => self.response(client, attempt, answer),
            Event::Timeout { client, attempt } if !self.options.client_rules => {
                if self.clients[client].awaits(attempt) {
                    let target = self.random_replica();
                    self.note(format!("client {client} timed out; tries replica {target}"));
                    self.clients[client].target = target;
                    self.send(client);
                }
            }
            Event::Timeout { client, attempt } => {
                if self.clients[client].awaits(attempt) {
                    // What the real client sees of a silent replica: its connection's
                    // keep-alive gives up, and the call fails after it went out.
                    let target = self.clients[client].target;
                    self.note(format!(
                        "client {client} heard nothing from replica {target}"
                    ));
                    let what = format!(
                        "Unavailable: no answer within {} ms (the keep-alive gave up)",
                        self.call_timeout_ms()
                    );
                    let silent = Answered::Unreachable { sent: true, what };
                    self.failed(client, silent, None);
                }
            }
            Event::Think(client) => self.think(client),
            Event::Retry(usize::MAX) => {
                if self.operator.current.is_some() {
                    self.send_change();
                }
            }
            Event::Retry(client) => {
                if self.clients[client].current.is_some() {
                    self.send(client);
                }
            }
            Event::Crash(id) => {
                if self.stormy && self.slots[&id].replica.is_some() {
                    self.crash(id);
                }
            }
            Event::CutTail(id) => {
                if self.stormy && self.slots[&id].replica.is_some() {
                    self.crash_cut(id);
                } else if self.stormy {
                    // Down: the cut waits for its next life.
                    self.at(250, Event::CutTail(id));
                }
            }
            Event::Synced { id, life } => {
                let slot = self.slots.get_mut(&id).expect("every voter has a slot");
                if slot.life != life || slot.busy_until.is_none() {
                    return;
                }
                slot.disk.settle();
                slot.busy_until = None;
                let (outputs, messages) = std::mem::take(&mut slot.held);
                self.release(id, outputs, messages);
                self.drive(id);
            }
            Event::DiskFull(id) => {
                if self.stormy {
                    self.stats.disks_full += 1;
                    self.note(format!("the disk of replica {id} is full"));
                    self.slots[&id].disk.set_full(true);
                    let free = self.rng.random_range(300..6_000);
                    self.at(free, Event::DiskFree(id));
                }
            }
            Event::DiskFree(id) => {
                self.note(format!("the disk of replica {id} has space again"));
                self.slots[&id].disk.set_full(false);
            }
            Event::SlowDisk(id) => {
                if self.stormy {
                    self.stats.slow_disks += 1;
                    let lasts = self.rng.random_range(500..6_000);
                    self.note(format!("the disk of replica {id} is slow for {lasts} ms"));
                    let slot = self.slots.get_mut(&id).expect("every voter has a slot");
                    slot.slow_until = self.now + lasts;
                }
            }
            Event::Restart(id) => {
                if self.slots[&id].replica.is_none() {
                    self.restart(id);
                }
            }
            Event::Partition => {
                if self.stormy {
                    let mut side = BTreeSet::new();
                    for id in &self.voters {
                        if self.rng.random_bool(0.5) {
                            side.insert(*id);
                        }
                    }
                    self.stats.partitions += 1;
                    self.note(format!("partition {side:?} from the rest"));
                    self.network.partition(side);
                    let heal = self.rng.random_range(300..5_000);
                    self.at(heal, Event::Heal);
                }
            }
            Event::Heal => {
                self.note("heal".to_string());
                self.network.heal();
            }
            Event::PlannedRestart => {
                if self.stormy {
                    self.plan_restart();
                }
            }
            Event::Stopping { id, life } => self.stopping(id, life),
            Event::Operate => self.operate(),
            Event::Change { to, attempt } => self.change(to, attempt),
            Event::Changed { attempt, answer } => self.changed(attempt, answer),
            Event::ChangeTimeout { attempt } if self.options.client_rules => {
                if self.operator.attempt == attempt && self.operator.current.is_some() {
                    let target = self.operator.target;
                    let what = format!(
                        "Unavailable: no answer within {} ms (the keep-alive gave up)",
                        self.call_timeout_ms()
                    );
                    self.note(format!("the operator heard nothing from replica {target}"));
                    let silent = Answered::Unreachable {
                        sent: true,
                        what: what.clone(),
                    };
                    self.change_failed(silent, what);
                }
            }
            Event::ChangeTimeout { attempt } => {
                if self.operator.attempt == attempt && self.operator.current.is_some() {
                    let target = self.random_replica();
                    self.note(format!("the operator timed out; asks replica {target}"));
                    self.operator.target = target;
                    self.send_change();
                }
            }
        }
    }

    /// The operator starts its next planned change: a new replica is started with `--join`
    /// first (as `escher heads add` wants), then added; a member is removed.
    fn operate(&mut self) {
        if !self.stormy || self.operator.current.is_some() {
            return;
        }
        let Some(plan) = self.operator.plan.pop_front() else {
            return;
        };
        let change = match plan {
            Plan::Add => {
                let id = self.voters.iter().max().copied().unwrap_or(0) + 1;
                self.slots.insert(id, Slot::new(true));
                self.voters.push(id);
                self.note(format!(
                    "the operator starts replica {id} to join the group"
                ));
                self.open(id);
                let first = self.rng.random_range(0..TICK_MS);
                self.at(first, Event::Tick(id));
                // Sometimes the new replica crashes too, before or after it caught up.
                if self.rng.random_bool(0.5) {
                    let when = self.rng.random_range(1..self.options.duration_ms / 2);
                    self.at(when, Event::Crash(id));
                }
                HeadChange::Add {
                    id,
                    address: format!("sim-{id}:7600"),
                }
            }
            Plan::Remove => {
                if self.members.len() < 2 {
                    return;
                }
                let members: Vec<u64> = self.members.iter().copied().collect();
                let id = members[self.rng.random_range(0..members.len())];
                HeadChange::Remove { id }
            }
        };
        self.note(format!("the operator asks for {change:?}"));
        self.operator.current = Some(change);
        self.operator.retry = Some(self.operator_call(self.elapsed()));
        self.operator.target = self.random_replica();
        self.send_change();
    }

    /// Sends the operator's change to its target, and sets its timeout.
    fn send_change(&mut self) {
        self.operator.attempt += 1;
        let (to, attempt) = (self.operator.target, self.operator.attempt);
        for delay in self.network.weather(&mut self.rng) {
            self.at(delay, Event::Change { to, attempt });
        }
        let timeout = self.call_timeout_ms();
        self.at(timeout, Event::ChangeTimeout { attempt });
    }

    /// The operator's change reaches replica `to`, which proposes it if it leads.
    fn change(&mut self, to: u64, attempt: u64) {
        let Some(change) = self.operator.current.clone() else {
            return;
        };
        if !self.first_copy(usize::MAX, attempt) {
            return;
        }
        let Some(replica) = self.replica(to) else {
            return;
        };
        let leader = replica.leader();
        let answer = match replica.propose_change(&change) {
            Ok((index, term)) => {
                let slot = self.slots.get_mut(&to).expect("every replica has a slot");
                slot.change = Some((index, term, attempt));
                self.drive(to);
                return;
            }
            Err(NotAccepted::NotLeader(_)) => {
                ChangeAnswer::Again(leader, "not the leader".into(), Refusal::NotLeader)
            }
            Err(other) => {
                let refusal = match other {
                    NotAccepted::ChangePending(_) => Refusal::Aborted,
                    _ => Refusal::Refused,
                };
                ChangeAnswer::Again(None, format!("{other:?}"), refusal)
            }
        };
        self.change_answer(attempt, answer);
    }

    /// An answer to the operator travels back (it may be lost: the operator times out).
    fn change_answer(&mut self, attempt: u64, answer: ChangeAnswer) {
        for delay in self.network.weather(&mut self.rng) {
            let answer = answer.clone();
            self.at(delay, Event::Changed { attempt, answer });
        }
    }

    fn changed(&mut self, attempt: u64, answer: ChangeAnswer) {
        if self.operator.attempt != attempt {
            return;
        }
        let Some(change) = self.operator.current.clone() else {
            return;
        };
        match answer {
            ChangeAnswer::Done => {
                self.stats.membership_changes += 1;
                match change {
                    HeadChange::Add { id, .. } => self.members.insert(id),
                    HeadChange::Remove { id } => self.members.remove(&id),
                };
                self.note(format!(
                    "the operator's {change:?} is done: members {:?}",
                    self.members
                ));
                self.operator.current = None;
                self.operator.retry = None;
                let next = self.rng.random_range(200..self.options.duration_ms / 2);
                self.at(next, Event::Operate);
            }
            ChangeAnswer::Again(hint, why, refusal) if self.options.client_rules => {
                self.note(format!("the operator's change is not taken ({why})"));
                let answered = match refusal {
                    Refusal::NotLeader => {
                        hint.map_or(Answered::NoLeader, |l| Answered::Leader(Replica(l)))
                    }
                    Refusal::InDoubt => Answered::MayStillCommit {
                        leader: hint.map(Replica),
                    },
                    Refusal::Aborted | Refusal::Refused => Answered::Failed { sent: false },
                };
                self.change_failed(answered, why);
            }
            ChangeAnswer::Again(hint, why, _) => {
                self.note(format!("the operator's change is not taken ({why}); again"));
                self.operator.target = match hint {
                    Some(leader) => leader,
                    None => self.random_replica(),
                };
                self.at(BUSY_RETRY_MS, Event::Retry(usize::MAX));
            }
        }
    }

    /// Replica `id`'s process stops: its fsync under way keeps a random prefix of its
    /// records, what it buffered is lost, and it comes back later from what its disk kept.
    fn crash(&mut self, id: u64) {
        self.stats.crashes += 1;
        let in_flight = self.slots[&id].disk.in_flight();
        let keep = self.rng.random_range(0..=in_flight);
        if in_flight > 0 {
            self.stats.torn += 1;
            self.stats.records_lost += (in_flight - keep) as u64;
        }
        self.note(format!(
            "crash replica {id} (its fsync under way keeps {keep} of {in_flight} records)"
        ));
        let slot = self.slots.get_mut(&id).expect("every voter has a slot");
        slot.disk = slot.disk.crash(keep);
        self.down(id);
    }

    /// Replica `id` crashes and its disk loses the end of its log: what it had not synced and
    /// the newest 1–4 records it had ([`Options::cut_tails`]).
    fn crash_cut(&mut self, id: u64) {
        self.stats.crashes += 1;
        self.stats.cut_tails += 1;
        let cut = self.rng.random_range(1..=4);
        let slot = self.slots.get_mut(&id).expect("every voter has a slot");
        let disk = slot.disk.crash_cut(cut);
        let lost = escher_head::replication::LogStore::lost_tail(&disk).map(|l| l.describe());
        slot.disk = disk;
        if lost.is_some() {
            self.stats.records_cut += cut as u64;
        }
        self.note(format!(
            "crash replica {id}, its disk cut {cut} synced records off its log's end: {lost:?}"
        ));
        self.down(id);
    }

    /// Replica `id`'s process is gone (its disk was crashed already): its soft state with it;
    /// it comes back 0.2–8 s later.
    fn down(&mut self, id: u64) {
        let slot = self.slots.get_mut(&id).expect("every voter has a slot");
        slot.replica = None;
        slot.waiters.clear();
        slot.change = None;
        slot.busy_until = None;
        slot.held = (Vec::new(), Vec::new());
        slot.owner = Owner::default();
        slot.disk_full = false;
        slot.stopping = None;
        slot.life += 1;
        let back = self.rng.random_range(200..8_000);
        self.at(back, Event::Restart(id));
    }

    /// Replica `id` leads: if its log lost a tail, it skips the ids the lost write may have
    /// given out, once, as the head's owner does when it takes the lead
    /// (`runtime/owner/leadership.rs`, `Command::SkipIds` with `LostTail::ids_at_risk`).
    fn skip_lost_ids(&mut self, id: u64) {
        let now = self.now;
        let slot = self.slots.get_mut(&id).expect("every voter has a slot");
        let Some(lost) = slot.lost_tail.take() else {
            return;
        };
        let Some(replica) = slot.replica.as_mut() else {
            return;
        };
        let (count, why) = (lost.ids_at_risk(), lost.describe());
        let proposed = replica.propose(vec![(Command::SkipIds { count, why }, None)], now);
        self.stats.skips += 1;
        self.note(format!(
            "replica {id} leads with a lost tail: skips {count} ids ({proposed:?})"
        ));
    }

    /// The operator asks the replica it finds leading (the highest term's) to stop for a
    /// planned restart, as `SIGTERM` does: it hands the lead to the most up-to-date other
    /// voter, goes on serving until it no longer leads or an election timeout passed, and
    /// stops; a replica with no one to hand over to stops at once.
    fn plan_restart(&mut self) {
        let leader = self
            .slots
            .iter()
            .filter(|(_, s)| s.stopping.is_none())
            .filter_map(|(id, s)| s.replica.as_ref().map(|r| (*id, r)))
            .filter(|(_, r)| r.is_leader())
            .max_by_key(|(_, r)| r.term())
            .map(|(id, _)| id);
        let Some(id) = leader else {
            // The operator waits for the group to have a leader again.
            self.note("a planned restart finds no leader; the operator tries again soon".into());
            self.at(500, Event::PlannedRestart);
            return;
        };
        let Some(replica) = self.replica(id) else {
            return;
        };
        let handed = replica.hand_over();
        self.note(format!(
            "the operator stops replica {id} (leading) for a planned restart: it hands the lead              to {handed:?}"
        ));
        self.drive(id);
        let slot = self.slots.get_mut(&id).expect("every replica has a slot");
        let life = slot.life;
        if handed.is_some() {
            slot.stopping = Some(self.now + SimReplica::hand_over_wait());
        } else {
            slot.stopping = Some(self.now);
        }
        self.at(0, Event::Stopping { id, life });
    }

    /// Replica `id` (of its life `life`), asked to stop, stops once its hand-over is done,
    /// after the fsync under way ends (the head awaits its cycle before it stops).
    fn stopping(&mut self, id: u64, life: u64) {
        let slot = &self.slots[&id];
        let (Some(until), Some(replica)) = (slot.stopping, slot.replica.as_ref()) else {
            return;
        };
        if slot.life != life {
            return;
        }
        let handed = !replica.is_leader();
        if !handed && self.now < until {
            return self.at(10, Event::Stopping { id, life });
        }
        if let Some(busy) = slot.busy_until {
            let wait = busy.saturating_sub(self.now);
            return self.at(wait, Event::Stopping { id, life });
        }
        self.stop(id, handed);
    }

    /// Replica `id`'s process stops as a head does when asked to: what its cycles wrote is
    /// synced (none is under way), its callers hear it is going (they try another replica),
    /// its workers' streams end; it is started again 0.2–3 s later.
    fn stop(&mut self, id: u64, handed: bool) {
        self.stats.planned_restarts += 1;
        if handed {
            self.stats.hand_overs += 1;
        }
        self.note(format!(
            "replica {id} stops (planned; {})",
            if handed {
                "the lead was handed over"
            } else {
                "still leading"
            }
        ));
        let leader = self
            .replica(id)
            .and_then(|r| r.leader())
            .filter(|l| *l != id);
        let slot = self.slots.get_mut(&id).expect("every voter has a slot");
        let waiters = std::mem::take(&mut slot.waiters);
        let change = slot.change.take();
        self.abandon(waiters, leader);
        if let Some((index, term, attempt)) = change {
            let why = "the replica is stopping".to_string();
            self.stats.in_doubt += 1;
            self.in_doubt.push((index, term));
            self.change_answer(attempt, ChangeAnswer::Again(leader, why, Refusal::InDoubt));
        }
        if !self.workers.is_empty() {
            self.let_workers_go(id);
        }
        let slot = self.slots.get_mut(&id).expect("every voter has a slot");
        let in_flight = slot.disk.in_flight();
        slot.disk = slot.disk.crash(in_flight);
        slot.replica = None;
        slot.busy_until = None;
        slot.held = (Vec::new(), Vec::new());
        slot.owner = Owner::default();
        slot.disk_full = false;
        slot.stopping = None;
        slot.life += 1;
        let back = self.rng.random_range(200..3_000);
        self.at(back, Event::Restart(id));
    }

    fn restart(&mut self, id: u64) {
        self.note(format!("restart replica {id} from its log"));
        self.open(id);
    }

    fn open(&mut self, id: u64) {
        let log = self.slots[&id].disk.clone();
        let opened = if self.slots[&id].joiner {
            SimReplica::join(id, log, StateConfig::default(), 4 * 1024)
        } else {
            SimReplica::open(id, &self.first_group, log, StateConfig::default(), 4 * 1024)
        };
        match opened {
            Ok(replica) => {
                if let Some(lost) = replica.lost_tail() {
                    self.note(format!(
                        "replica {id} opens a log that lost its tail: {}",
                        lost.describe()
                    ));
                }
                let slot = self.slots.get_mut(&id).expect("every voter has a slot");
                // As the head's owner reads it at its start.
                slot.lost_tail = replica.lost_tail();
                slot.replica = Some(replica);
                self.drive(id);
            }
            Err(e) => self.fail(format!("replica {id} cannot open its log: {e}")),
        }
    }

    /// A client's next write, or its retry.
    fn think(&mut self, client: usize) {
        if let Some(w) = self.worker_of(client) {
            return self.worker_think(w);
        }
        if !self.stormy || self.clients[client].current.is_some() {
            return;
        }
        let c = &self.clients[client];
        let seq = c.next_seq();
        let (command, intent) = if client == 0 {
            match seq {
                1 => (
                    Command::Init {
                        cluster_id: "sim".to_string(),
                        task_key: "sim-key".to_string(),
                    },
                    Intent::Init,
                ),
                // The workers register themselves.
                2 | 3 if self.options.workers > 0 => return,
                2 | 3 => (register(seq), Intent::Register),
                _ => return,
            }
        } else if !self.nodes.is_empty() && self.rng.random_bool(0.3) {
            let marker = format!("c{}w{seq}", c.id);
            let node = self.nodes[self.rng.random_range(0..self.nodes.len())];
            (
                set_resource(&marker, node),
                Intent::SetResource { marker, node },
            )
        } else {
            let count = self.rng.random_range(1..=3);
            let names: Vec<String> = (0..count).map(|i| format!("c{}w{seq}t{i}", c.id)).collect();
            // With workers, an attempt a fault stopped is retried (without, nothing ever fails).
            let retries = if self.options.workers > 0 { 3 } else { 0 };
            // With the streams bounded in bytes, one task in four is large (its arguments).
            let sized =
                self.options.workers > 0 && self.options.stream_faults && self.options.stream_bytes;
            let sizes: Vec<usize> = names
                .iter()
                .map(|_| match sized {
                    true if self.rng.random_ratio(1, 4) => self.rng.random_range(1_000..6_000),
                    _ => 0,
                })
                .collect();
            (submit(&names, retries, &sizes), Intent::Submit(names))
        };
        self.note(format!("client {client} writes {intent:?}"));
        let now = self.elapsed();
        self.clients[client].start(command, intent, now);
        self.send(client);
    }

    /// Sends the client's write in flight to its target, and sets its timeout.
    fn send(&mut self, client: usize) {
        self.stats.sends += 1;
        let c = &mut self.clients[client];
        c.attempt += 1;
        let (to, attempt) = (c.target, c.attempt);
        let cut = self.client_cut(client);
        for delay in self.network.weather(&mut self.rng) {
            if cut {
                break;
            }
            self.at(
                delay,
                Event::Request {
                    client,
                    to,
                    attempt,
                },
            );
        }
        let timeout = self.call_timeout_ms();
        self.at(timeout, Event::Timeout { client, attempt });
    }

    /// A client's write reaches replica `to`.
    fn request(&mut self, client: usize, to: u64, attempt: u64) {
        let Some(write) = self.clients[client].current.clone() else {
            return;
        };
        if !self.first_copy(client, attempt) {
            return;
        }
        let now = self.now;
        // A worker's registration carries no key, as the head proposes it (each one is applied,
        // and reconciles what the worker runs against what the state has now).
        let keyed = !matches!(write.intent, Intent::Attach { .. });
        let key = (self.options.idempotency_keys && keyed).then_some(write.key);
        let Some(replica) = self.replica(to) else {
            return;
        };
        let proposed = replica.propose(vec![(write.command, key)], now);
        match proposed {
            Ok((index, term)) => {
                self.clients[client].proposed.push((index, term));
                let slot = self.slots.get_mut(&to).expect("every voter has a slot");
                slot.waiters.entry(index).or_default().push(Waiter {
                    term,
                    client,
                    attempt,
                });
                self.drive(to);
            }
            Err(NotAccepted::NotLeader(_)) => {
                let leader = self.replica(to).and_then(|r| r.leader());
                self.answer(client, attempt, Answer::NotLeader(leader));
            }
            Err(NotAccepted::DiskFull(why)) => {
                self.answer(client, attempt, Answer::Busy(why));
            }
            Err(other) => {
                self.answer(client, attempt, Answer::Done(Err(format!("{other:?}"))));
            }
        }
    }

    /// An answer travels back to its client (it may be lost: the client times out).
    fn answer(&mut self, client: usize, attempt: u64, answer: Answer) {
        let cut = self.client_cut(client);
        for delay in self.network.weather(&mut self.rng) {
            if cut {
                break;
            }
            let answer = answer.clone();
            self.at(
                delay,
                Event::Response {
                    client,
                    attempt,
                    answer,
                },
            );
        }
    }

    fn response(&mut self, client: usize, attempt: u64, answer: Answer) {
        if !self.clients[client].awaits(attempt) {
            return;
        }
        match answer {
            Answer::Done(reply) => {
                self.clients[client].settle();
                if reply.is_ok() {
                    self.stats.acknowledged += 1;
                }
                if let Ok(escher_core::state::Reply::Registered(node)) = &reply {
                    self.nodes.push(*node);
                }
                self.note(format!("client {client} answered: {reply:?}"));
                let worker = self.worker_of(client);
                let intent = self.clients[client]
                    .current
                    .as_ref()
                    .map(|w| w.intent.clone());
                self.clients[client].answer(reply.clone());
                if let (Some(w), Some(intent)) = (worker, intent) {
                    return self.worker_answered(w, &intent, &reply);
                }
                let pause = self.rng.random_range(0..300);
                self.at(pause, Event::Think(client));
            }
            answer if !self.options.client_rules => self.retry_as_before(client, answer),
            Answer::NotLeader(Some(leader)) => {
                self.failed(client, Answered::Leader(Replica(leader)), None);
            }
            Answer::NotLeader(None) => self.failed(client, Answered::NoLeader, None),
            Answer::MayStillCommit(leader) => {
                let leader = leader.map(Replica);
                self.failed(client, Answered::MayStillCommit { leader }, None);
            }
            Answer::Busy(why) => {
                // The real head answers RESOURCE_EXHAUSTED: the replica's own answer, which
                // ends the call with a retryable error.
                let url = format!("replica {}", self.clients[client].target);
                let error = ClientError::Unavailable { url, message: why };
                self.failed(client, Answered::Failed { sent: false }, Some(error));
            }
        }
    }

    /// `client`'s write was not taken: it retries as the simulation's clients did before they
    /// ran the real client's rules ([`Options::client_rules`] off).
    fn retry_as_before(&mut self, client: usize, answer: Answer) {
        /// The pause before a retry after "not leader".
        const RETRY_MS: u64 = 30;
        let target = match answer {
            Answer::Done(_) => return,
            Answer::NotLeader(Some(leader)) | Answer::MayStillCommit(Some(leader)) => leader,
            Answer::NotLeader(None) | Answer::MayStillCommit(None) => self.random_replica(),
            Answer::Busy(why) => {
                self.note(format!("client {client} refused: {why}"));
                let target = self.random_replica();
                self.clients[client].target = target;
                self.at(BUSY_RETRY_MS, Event::Retry(client));
                return;
            }
        };
        self.clients[client].target = target;
        self.at(RETRY_MS, Event::Retry(client));
    }

    /// An attempt of `client`'s call failed with `answered`: the real client's retry rules
    /// (`escher_client::retry`) say what it does next. `own` is the error the attempt's own
    /// answer makes (what the call ends with on [`Step::Fail`]).
    fn failed(&mut self, client: usize, answered: Answered<Replica>, own: Option<ClientError>) {
        let (now, known) = (self.elapsed(), self.voters.len());
        let c = &mut self.clients[client];
        c.settle();
        let from = Replica(c.target);
        let step = c.retry.step(from, answered, now, known);
        match step {
            Step::Follow(Replica(leader)) => {
                self.clients[client].target = leader;
                self.at(0, Event::Retry(client));
            }
            Step::Next(pause) => {
                let next = self.next_replica(self.clients[client].target);
                self.clients[client].target = next;
                self.at(millis(pause), Event::Retry(client));
            }
            Step::Unavailable { message } => {
                let error = self.clients[client].retry.unavailable(message);
                self.call_failed(client, error);
            }
            Step::Fail => {
                let error = own.unwrap_or_else(|| ClientError::Unavailable {
                    url: format!("replica {}", from.0),
                    message: "the connection broke".to_string(),
                });
                self.call_failed(client, error);
            }
        }
    }

    /// `client`'s call ended with `error` (made an unknown outcome by the retry rules when an
    /// attempt may have been applied). Every error the simulated answers make is retryable, or
    /// an unknown outcome to retry under its key: the client does what it says and sends the
    /// same write, under the same key, as a new call a moment later.
    fn call_failed(&mut self, client: usize, error: ClientError) {
        let now = self.elapsed();
        let c = &mut self.clients[client];
        let Some(key) = c.current.as_ref().map(|w| w.key) else {
            return;
        };
        let error = c.retry.outcome("write", Some(key), error);
        let proposed = std::mem::take(&mut c.proposed);
        // A worker's registration is proposed without a key, and each one applied reconciles
        // anew: one applied after the worker gave up on it is no harm.
        let keyed = !matches!(
            c.current.as_ref().map(|w| &w.intent),
            Some(Intent::Attach { .. })
        );
        if matches!(error, ClientError::UnknownOutcome { .. }) {
            self.stats.unknown_outcomes += 1;
        } else if keyed && !proposed.is_empty() {
            self.denied.push(Denied {
                client,
                key,
                proposed,
                error: error.to_string(),
            });
        }
        let c = &mut self.clients[client];
        c.call(now);
        self.note(format!("client {client}'s call failed: {error}"));
        self.at(BUSY_RETRY_MS, Event::Retry(client));
    }

    /// The proposals of `waiters` (one replica's, which stopped leading or stopped) are
    /// answered that they may still commit, naming `leader`: as the head's owner answers what
    /// it proposed and can no longer answer for (`statuses::in_doubt`).
    fn abandon(&mut self, waiters: BTreeMap<u64, Vec<Waiter>>, leader: Option<u64>) {
        for (index, ws) in waiters {
            for w in ws {
                self.stats.in_doubt += 1;
                self.in_doubt.push((index, w.term));
                let answer = if self.options.in_doubt_answers {
                    Answer::MayStillCommit(leader)
                } else {
                    Answer::NotLeader(leader)
                };
                self.answer(w.client, w.attempt, answer);
            }
        }
    }

    /// Replica `id`'s disk filled up. A leader of a group that cannot lead now answers what
    /// waits on it at once, as the head's owner does when it lets its workers and callers go
    /// (`Output::DiskFull`, `stop_leading`): every write it proposed may still commit under
    /// the next leader, and so may the operator's change (with [`Options::stall_answers`] off,
    /// they wait, as they did here before, until it loses the lead).
    fn stalled_leader_answers(&mut self, id: u64) {
        if !self.options.stall_answers {
            return;
        }
        let slot = self.slots.get_mut(&id).expect("every replica has a slot");
        let Some(replica) = slot.replica.as_ref() else {
            return;
        };
        if !(replica.is_leader() && replica.stalled() && replica.members().len() > 1) {
            return;
        }
        let waiters = std::mem::take(&mut slot.waiters);
        let change = slot.change.take();
        if !waiters.is_empty() || change.is_some() {
            self.stats.stall_answers += 1;
            self.note(format!(
                "replica {id} cannot lead with its disk full: it answers what waits on it"
            ));
        }
        self.abandon(waiters, None);
        if let Some((index, term, attempt)) = change {
            let why = "its disk is full".to_string();
            self.stats.in_doubt += 1;
            self.in_doubt.push((index, term));
            self.change_answer(attempt, ChangeAnswer::Again(None, why, Refusal::InDoubt));
        }
    }

    /// Whether a request (`client`'s send `attempt`) reaches its replica: always under the
    /// simulation's old rules, only its first copy under the real client's (see
    /// [`World::received`]).
    fn first_copy(&mut self, client: usize, attempt: u64) -> bool {
        !self.options.client_rules || self.received.insert((client, attempt))
    }

    /// How long a call waits for an answer before it counts as broken: the real client's
    /// figure under its rules, the simulation's old second without them.
    fn call_timeout_ms(&self) -> u64 {
        if self.options.client_rules {
            millis(escher_client::SILENT_REPLICA_TIMEOUT)
        } else {
            OLD_CLIENT_TIMEOUT_MS
        }
    }

    /// The retry rules of one of the operator's calls that begins at `now`, as `escher heads`
    /// has them (the real client's, with its failover timeout).
    fn operator_call(&self, now: std::time::Duration) -> Retry<Replica> {
        Retry::new("the simulated replicas", crate::client::FAILOVER, now)
    }

    /// An attempt of the operator's call failed with `answered` (`why`, in words): the real
    /// client's retry rules say what it does next, as for `escher heads add|remove`.
    fn change_failed(&mut self, answered: Answered<Replica>, why: String) {
        let (now, known) = (self.elapsed(), self.voters.len());
        let from = Replica(self.operator.target);
        let fresh = self.operator_call(now);
        let retry = self.operator.retry.get_or_insert(fresh);
        let step = retry.step(from, answered, now, known);
        match step {
            Step::Follow(Replica(leader)) => {
                self.operator.target = leader;
                self.at(0, Event::Retry(usize::MAX));
            }
            Step::Next(pause) => {
                self.operator.target = self.next_replica(self.operator.target);
                self.at(millis(pause), Event::Retry(usize::MAX));
            }
            Step::Unavailable { message } => {
                let error = ClientError::Unavailable {
                    url: "the simulated replicas".to_string(),
                    message,
                };
                self.change_call_failed(error);
            }
            Step::Fail => {
                let error = ClientError::Unavailable {
                    url: format!("replica {}", from.0),
                    message: why,
                };
                self.change_call_failed(error);
            }
        }
    }

    /// The operator's call ended with `error` (an unknown outcome when an attempt may have been
    /// applied). `escher heads` asks again 200 ms later after ABORTED (another change pending);
    /// after any other error the operator runs the same change again, as its error says, a
    /// moment later: a change applied already is judged "already a member" (or "not a member")
    /// in log order, and done.
    fn change_call_failed(&mut self, error: ClientError) {
        let now = self.elapsed();
        let retry = self.operator.retry.take();
        let error = match retry {
            Some(retry) => retry.outcome("heads change", None, error),
            None => error,
        };
        if matches!(error, ClientError::UnknownOutcome { .. }) {
            self.stats.unknown_change_outcomes += 1;
        }
        self.note(format!("the operator's call failed: {error}"));
        let again = now + std::time::Duration::from_millis(BUSY_RETRY_MS);
        self.operator.retry = Some(self.operator_call(again));
        self.at(BUSY_RETRY_MS, Event::Retry(usize::MAX));
    }

    /// A call that ended with an error other than an unknown outcome tells its caller the write
    /// was not applied: none of the proposals its attempts made may have committed. And how
    /// many of the proposals answered "it may still commit" did.
    fn judge_in_doubt(&mut self) {
        self.stats.in_doubt_committed = self
            .in_doubt
            .iter()
            .filter(|(index, term)| self.committed.get(index) == Some(term))
            .count() as u64;
        for d in &self.denied {
            if let Some((index, term)) = d
                .proposed
                .iter()
                .find(|(index, term)| self.committed.get(index) == Some(term))
            {
                self.checker.violations.push(format!(
                    "client {}'s call of write {} ended with \"{}\", which says it was not \
                     applied, but its proposal at index {index} (term {term}) committed",
                    d.client,
                    escher_proto::types::key_text(d.key),
                    d.error
                ));
            }
        }
    }

    /// The replica after `id` in the list every client knows (the real client's rotation).
    fn next_replica(&self, id: u64) -> u64 {
        let at = self.voters.iter().position(|v| *v == id);
        let next = at.map_or(0, |i| (i + 1) % self.voters.len());
        self.voters[next]
    }

    /// The simulated time since the run began.
    fn elapsed(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.now - T0)
    }

    /// Runs replica `id`'s cycles until raft has nothing ready, and sends what they produced.
    fn drive(&mut self, id: u64) {
        let (seed, now) = (self.seed, self.now);
        for _ in 0..16 {
            if self.slots[&id].busy_until.is_some() {
                return;
            }
            let Some(replica) = self.replica(id) else {
                return;
            };
            replica.set_clock(now - T0);
            let outputs = match replica.cycle() {
                Ok(outputs) => outputs,
                Err(e) => return self.fail(format!("replica {id} failed a cycle: {e}")),
            };
            let messages = replica.take_messages();
            let (term, leading) = (replica.term(), replica.is_leader());
            let salt = checker::hash(&format!("{seed} {id} {term} {leading}")) as usize;
            replica.pin_election_timeout(salt);
            if self.slots[&id].disk.syncing() {
                self.start_fsync(id, outputs, messages);
                return;
            }
            if outputs.is_empty() && messages.is_empty() {
                return;
            }
            self.release(id, outputs, messages);
        }
    }

    /// Replica `id`'s cycle wrote: its fsync takes a while, and what the cycle produced waits
    /// for it.
    fn start_fsync(&mut self, id: u64, outputs: Vec<SimOutput>, messages: Vec<Message>) {
        self.stats.fsyncs += 1;
        let slow = self.slots[&id].slow_until > self.now;
        let took = if slow {
            self.rng.random_range(100..1_500)
        } else {
            self.rng.random_range(self.fsync_ms.0..=self.fsync_ms.1)
        };
        let crash_inside = self.stormy
            && self.fsync_crashes > 0
            && took > 0
            && self.rng.random_range(0..CRASH_IN_FSYNC) == 0;
        let slot = self.slots.get_mut(&id).expect("every voter has a slot");
        slot.busy_until = Some(self.now + took);
        slot.held = (outputs, messages);
        let life = slot.life;
        if crash_inside {
            self.fsync_crashes -= 1;
            let when = self.rng.random_range(0..took);
            self.at(when, Event::Crash(id));
        }
        self.at(took, Event::Synced { id, life });
    }

    /// Hands on what replica `id`'s cycle produced: answers to clients, raft messages to the
    /// network.
    fn release(&mut self, id: u64, outputs: Vec<SimOutput>, messages: Vec<Message>) {
        {
            for output in outputs {
                self.output(id, output);
            }
            for msg in messages {
                let to = msg.to;
                let delays = self.network.fate(&mut self.rng, id, to);
                match delays.len() {
                    0 => {
                        self.stats.lost += 1;
                        let wait = self.network.max_delay;
                        if msg.get_msg_type() == MessageType::MsgSnapshot {
                            let delivered = false;
                            self.at(
                                wait,
                                Event::SnapshotSent {
                                    from: id,
                                    to,
                                    delivered,
                                },
                            );
                        }
                        self.at(wait, Event::Unreachable { from: id, to });
                    }
                    2 => self.stats.duplicated += 1,
                    _ => {}
                }
                for delay in delays {
                    let msg = msg.clone();
                    self.at(delay, Event::Deliver { from: id, to, msg });
                }
            }
        }
    }

    fn output(&mut self, id: u64, output: SimOutput) {
        match output {
            SimOutput::Applied {
                index,
                term,
                results,
                effects,
                events,
            } => {
                self.removal_applied(id, index, term, &events);
                for effect in &effects {
                    if let Effect::Assign { node, assignment } = effect {
                        let key = (assignment.task_id, assignment.attempt, *node);
                        self.history.assigned.entry(key).or_insert(self.now);
                    }
                }
                if !self.workers.is_empty()
                    && self.slots[&id]
                        .replica
                        .as_ref()
                        .is_some_and(SimReplica::is_leader)
                {
                    self.perform(id, &effects);
                }
                self.committed.insert(index, term);
                if self.options.trace {
                    self.note(format!("replica {id} applied {index} of term {term}"));
                }
                let text = format!("{results:?}");
                let slot = &self.slots[&id];
                let Some(replica) = &slot.replica else { return };
                let last = replica.applied();
                let leads_this_term = replica.is_leader() && replica.term() == term;
                self.checker
                    .applied(id, index, last, &text, replica.state());
                let waiters = self
                    .slots
                    .get_mut(&id)
                    .and_then(|s| s.waiters.remove(&index))
                    .unwrap_or_default();
                for w in waiters {
                    let answer = if w.term == term {
                        let reply = results
                            .first()
                            .cloned()
                            .map(|r| r.map_err(|e| e.to_string()))
                            .unwrap_or_else(|| Err("an empty batch".to_string()));
                        if let (true, Ok(escher_core::state::Reply::Registered(node))) =
                            (leads_this_term, &reply)
                        {
                            // The head's owner answers a registration only in the leadership
                            // that proposed it, and takes the node's stream only then.
                            let now = workers::clock(self.now);
                            let slot = self.slots.get_mut(&id).expect("every replica has a slot");
                            slot.owner.registered(*node, now);
                        }
                        Answer::Done(reply)
                    } else {
                        Answer::NotLeader(None)
                    };
                    self.answer(w.client, w.attempt, answer);
                }
            }
            SimOutput::Empty { index, term } => {
                self.committed.insert(index, term);
                let waiters = self
                    .slots
                    .get_mut(&id)
                    .and_then(|s| s.waiters.remove(&index))
                    .unwrap_or_default();
                for w in waiters {
                    self.answer(w.client, w.attempt, Answer::NotLeader(None));
                }
                self.change_at(id, index, None);
            }
            SimOutput::Membership {
                index,
                term,
                result,
            } => {
                self.committed.insert(index, term);
                self.note(format!(
                    "replica {id} applied the membership change at {index}: {result:?}, voters \
                     {:?}",
                    self.slots[&id].replica.as_ref().map(SimReplica::members)
                ));
                let waiters = self
                    .slots
                    .get_mut(&id)
                    .and_then(|s| s.waiters.remove(&index))
                    .unwrap_or_default();
                for w in waiters {
                    self.answer(w.client, w.attempt, Answer::NotLeader(None));
                }
                self.change_at(id, index, Some((term, result)));
            }
            SimOutput::Role { leading, leader } => {
                self.note(format!(
                    "replica {id}: leading {leading}, leader {leader:?}"
                ));
                if leading {
                    self.skip_lost_ids(id);
                }
                if !self.workers.is_empty() {
                    self.owner_lead(id, leading);
                }
                if !leading
                    && let Some((index, term, attempt)) =
                        self.slots.get_mut(&id).and_then(|s| s.change.take())
                {
                    let why = "the replica stopped leading".to_string();
                    self.stats.in_doubt += 1;
                    self.in_doubt.push((index, term));
                    let answer = ChangeAnswer::Again(leader, why, Refusal::InDoubt);
                    self.change_answer(attempt, answer);
                }
                if !leading {
                    let waiters = std::mem::take(
                        &mut self
                            .slots
                            .get_mut(&id)
                            .expect("every voter has a slot")
                            .waiters,
                    );
                    self.abandon(waiters, leader);
                }
            }
            SimOutput::Restored => {
                // What it applied is the snapshot's now: its removals are not followed further.
                self.removals.retain(|(replica, _), _| *replica != id);
                self.stats.snapshots += 1;
                self.note(format!("replica {id} installed a snapshot"));
            }
            SimOutput::DiskFull(why) => {
                if why.is_some() {
                    self.stats.stalls += 1;
                }
                let stalls = why.is_some() && !self.slots[&id].disk_full;
                if !self.workers.is_empty() {
                    self.owner_disk(id, why.is_some());
                }
                self.slots
                    .get_mut(&id)
                    .expect("every replica has a slot")
                    .disk_full = why.is_some();
                self.note(format!("replica {id}: disk full: {why:?}"));
                if stalls {
                    self.stalled_leader_answers(id);
                }
            }
        }
    }

    /// Replica `id` applied the entry at `index`: a membership change (`Some`: its term and
    /// whether it took effect) or nothing. If the operator's change was proposed there at that
    /// index, the operator hears what became of it.
    fn change_at(&mut self, id: u64, index: u64, applied: Option<(u64, Result<(), String>)>) {
        let slot = self.slots.get_mut(&id).expect("every replica has a slot");
        let Some((at, term, attempt)) = slot.change else {
            return;
        };
        if at != index {
            return;
        }
        slot.change = None;
        let answer = match applied {
            Some((t, Ok(()))) if t == term => ChangeAnswer::Done,
            // Judged in log order: an earlier send of the change was applied before this one.
            Some((t, Err(why)))
                if t == term
                    && (why.contains("already a member") || why.contains("is not a member")) =>
            {
                self.note(format!("replica {id}: {why}"));
                ChangeAnswer::Done
            }
            Some((_, Err(why))) => ChangeAnswer::Again(None, why, Refusal::Refused),
            // Raft dropped it (another change was pending): the head answers ABORTED.
            None => ChangeAnswer::Again(None, "its entry was replaced".into(), Refusal::Aborted),
            // Another leader's entry took its index: "not leader".
            Some(_) => {
                ChangeAnswer::Again(None, "its entry was replaced".into(), Refusal::NotLeader)
            }
        };
        self.change_answer(attempt, answer);
    }

    /// The end: every member of the group must have converged on one state, which must hold
    /// every acknowledged write, in the membership the operator was told of.
    fn finish(&mut self) {
        for client in &mut self.clients {
            client.give_up();
        }
        if let Some(why) = self.fatal.take() {
            self.checker.violations.push(why);
            return;
        }
        self.judge_in_doubt();
        // The group's members, as the replica that applied the most has them.
        let members: BTreeSet<u64> = self
            .slots
            .values()
            .filter_map(|s| s.replica.as_ref())
            .max_by_key(|r| r.applied())
            .map(|r| r.members().into_iter().collect())
            .unwrap_or_default();
        let acknowledged = &self.members;
        let in_flight = self.operator.current.as_ref().map(|change| {
            let mut after = acknowledged.clone();
            match change {
                HeadChange::Add { id, .. } => after.insert(*id),
                HeadChange::Remove { id } => after.remove(id),
            };
            after
        });
        if members != *acknowledged && in_flight.as_ref() != Some(&members) {
            self.checker.violations.push(format!(
                "the group's members are {members:?}, where the operator was told {acknowledged:?} \
                 (with {:?} under way)",
                self.operator.current
            ));
        }
        let applied: BTreeMap<u64, u64> = self
            .slots
            .iter()
            .filter(|(id, _)| members.contains(id))
            .filter_map(|(id, s)| s.replica.as_ref().map(|r| (*id, r.applied())))
            .collect();
        let distinct: BTreeSet<u64> = applied.values().copied().collect();
        if distinct.len() != 1 || applied.len() != members.len() {
            self.checker.violations.push(format!(
                "the group {members:?} did not converge in the quiet end: applied indexes \
                 {applied:?}"
            ));
        }
        for id in &members {
            let theirs = self.slots[id].replica.as_ref().map(SimReplica::members);
            if theirs
                .as_ref()
                .is_some_and(|m| m.iter().copied().collect::<BTreeSet<_>>() != members)
            {
                self.checker.violations.push(format!(
                    "member {id} has the group as {theirs:?}, the most advanced as {members:?}"
                ));
            }
        }
        for (id, slot) in &self.slots {
            if let Some(replica) = &slot.replica {
                self.checker
                    .compare(*id, u64::MAX - replica.applied(), replica.state());
            }
        }
        let leader = self
            .slots
            .values()
            .filter_map(|s| s.replica.as_ref())
            .max_by_key(|r| r.applied());
        if let Some(replica) = leader {
            self.checker.finish(&self.clients, replica.state());
            if !self.workers.is_empty() {
                let violations = self.check_history(replica.state());
                self.checker.violations.extend(violations);
            }
        }
    }

    fn outcome(self) -> Outcome {
        let end = self
            .slots
            .values()
            .filter_map(|s| s.replica.as_ref())
            .map(|r| (checker::fingerprint(r.state()), r.applied()))
            .next()
            .unwrap_or_default();
        Outcome {
            seed: self.seed,
            trace: self.trace,
            violations: self.checker.violations,
            stats: self.stats,
            end,
        }
    }

    fn replica(&mut self, id: u64) -> Option<&mut SimReplica> {
        self.slots.get_mut(&id).and_then(|s| s.replica.as_mut())
    }

    fn random_replica(&mut self) -> u64 {
        self.voters[self.rng.random_range(0..self.voters.len())]
    }

    fn at(&mut self, delay: u64, event: Event) {
        self.seq += 1;
        self.queue.insert((self.now + delay, self.seq), event);
    }

    fn note(&mut self, line: String) {
        if self.options.trace {
            self.trace.push(format!("{:>8} {line}", self.now - T0));
        }
    }

    fn fail(&mut self, why: String) {
        self.note(format!("FATAL {why}"));
        self.fatal.get_or_insert(why);
    }
}

fn register(seq: u64) -> Command {
    let name = format!("node{seq}");
    Command::RegisterNode {
        worker: Joining {
            name: name.clone(),
            address: format!("{name}.sim:7601"),
            resources: "cpu=4".parse().expect("a valid resource set"),
            labels: Labels::new(),
            gpus: Vec::new(),
            boot: 1,
        },
        secret: SecretHash::of(&format!("secret of {name}")),
    }
}

/// A submission of tasks `names`, each with an argument of `sizes` bytes (none for 0).
fn submit(names: &[String], max_retries: u32, sizes: &[usize]) -> Command {
    let tasks = names
        .iter()
        .zip(sizes)
        .map(|(name, &size)| TaskSpec {
            name: name.clone(),
            kind: TaskKind::Command {
                argv: std::iter::once("true".to_string())
                    .chain((size > 0).then(|| "x".repeat(size)))
                    .collect(),
                env: Vec::new(),
                cwd: None,
            },
            resources: "cpu=1".parse().expect("a valid resource set"),
            labels: Labels::new(),
            max_retries,
            timeout: None,
            pending_deadline: None,
            on_start: Vec::new(),
            on_success: Vec::new(),
        })
        .collect();
    Command::Submit {
        tasks,
        namespace: None,
    }
}

fn set_resource(marker: &str, node: NodeId) -> Command {
    Command::SetResources {
        updates: vec![ResourceUpdate {
            name: ResourceName::new(marker).expect("markers are valid resource names"),
            op: CapacityOp::Set("1".parse().expect("a valid capacity")),
            target: NodeSpec::Node(node),
        }],
        namespace: None,
        caller_task: None,
    }
}
