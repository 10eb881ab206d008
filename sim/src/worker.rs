//! [`Worker`]: a simulated worker, as `escher-worker` behaves towards the head (DESIGN §13 and
//! `head/src/runtime/workers.rs`'s protocol), with its fence. Its rules (which assignments it
//! starts, what a registration lists, which reports it keeps and sends again, when its lease
//! holds and when it has run out) are the worker's own code, `escher_worker::protocol::Protocol`,
//! run on the simulated clock; the transport around them (streams, writes) is the world's.
//!
//! - It registers once (`RegisterNode`, a write with an idempotency key, retried like a
//!   client's) and keeps its node id and secret across its own restarts, as its state
//!   directory does.
//! - It opens a stream to the leader: each time (a new leader, a stream that did not open, or
//!   one whose lease the head stopped renewing: `Protocol::stale`, as the real worker) it
//!   registers again with `RejoinNode`, listing what it runs and the reports no head
//!   acknowledged, then attaches. A stream carries its epoch: a message of an older stream is
//!   never read (a TCP stream that broke delivers nothing more).
//! - It heartbeats on its stream; the leader answers each (naming its number) with a lease
//!   that runs for [`lease_ms`] from when the heartbeat was sent.
//! - It runs an assignment only while its lease holds, and each attempt once (an attempt sent
//!   again is not run again; its report is sent again instead). A task runs for a random
//!   while; its report (`TaskFinished`) is a write, retried until answered.
//! - Its fence supervisor, a process of its own, kills every task it runs once the lease has
//!   run out, even while the worker is frozen (SIGSTOP), and before a renewal that comes after
//!   it ran out; the worker reports them as stopped by the fence. When it kills is the real
//!   supervisor's rule (`escher_worker::fence::countdown::Countdown`), fed the lines the
//!   worker writes it: the lease when it attaches, and what is left of it at each beat (every
//!   [`beat_ms`], not while frozen).
//!
//! The world (`world/workers.rs`) moves the messages, runs the faults (a worker's crash kills
//! its tasks with it; a freeze; a cut from every replica) and plays the leader's side.

use std::collections::VecDeque;

use escher_proto::types::{HeadMessage, NodeId, TaskId};
use escher_worker::fence::countdown::Countdown;
use escher_worker::protocol::{Attempt, Protocol};

/// How long the leader waits without a heartbeat before it declares the node lost.
pub const HEARTBEAT_TIMEOUT_MS: u64 = 2_000;

/// How long a lease lasts from the heartbeat it answers: what the head's rules grant for
/// [`HEARTBEAT_TIMEOUT_MS`] (`Liveness::lease`, half of it), as the worker's fence takes it.
pub fn lease_ms() -> u64 {
    let timeout = std::time::Duration::from_millis(HEARTBEAT_TIMEOUT_MS);
    let lease = escher_head::runtime::liveness::Liveness::lease(timeout);
    u64::try_from(lease.as_millis()).unwrap_or(u64::MAX)
}
/// How often a worker heartbeats.
pub const HEARTBEAT_MS: u64 = 100;
/// How long a worker waits for its stream to open (the head's `Attached`) before it takes the
/// stream for broken; an open stream is left by the worker's own rule (`Protocol::stale`).
pub const SILENCE_MS: u64 = 500;
/// How often the fence supervisor's clock is looked at (the real one wakes when its wait runs
/// out; here it is seen within this).
pub const SUPERVISE_MS: u64 = 25;

/// How often the worker's beat tells its fence supervisor what is left of its lease: a quarter
/// of the lease, at most 500 ms, as `worker/src/fence` beats.
pub fn beat_ms() -> u64 {
    (lease_ms() / 4).min(500)
}
/// CPUs each simulated worker has (every task takes one).
pub const CPUS: usize = 4;

/// What the leader sends on a worker's stream (or answers to it).
#[derive(Debug, Clone)]
pub enum ToWorker {
    /// Run this attempt.
    Assign {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: u32,
        /// What the head's message (`HeadMessage::Assign` of the real assignment) counts in
        /// its stream's queue (`HeadMessage::queued_bytes`).
        bytes: u64,
    },
    /// Stop this attempt.
    Cancel {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: u32,
    },
    /// The stream is open, and a lease runs from `sent`, when the worker asked for it.
    Attached {
        /// When the worker sent its attach.
        sent: u64,
    },
    /// Heartbeat `seq` was heard: the lease runs for `lease_ms()` from when it was sent.
    Lease {
        /// The heartbeat's number.
        seq: u64,
    },
    /// This replica does not lead (the leader it knows of, if any), or does not take this
    /// node's stream: find the leader and register again.
    Refused(Option<u64>),
    /// The stream broke (a message on it was lost).
    Broken,
}

impl ToWorker {
    /// What this message counts in its stream's queue, as the head's `LinkSender` counts it
    /// against `OUTBOX_BYTES` (`HeadMessage::queued_bytes`): an assignment its real message's
    /// size, anything else what the head's `CancelTask` and `LeaseRenewed` count.
    pub fn queued_bytes(&self) -> u64 {
        match self {
            ToWorker::Assign { bytes, .. } => *bytes,
            ToWorker::Cancel { task, attempt } => HeadMessage::CancelTask {
                task_id: *task,
                attempt: *attempt,
                reason: String::new(),
                force: false,
            }
            .queued_bytes(),
            ToWorker::Lease { seq } => HeadMessage::LeaseRenewed { seq: *seq }.queued_bytes(),
            // Answered beside the queue (on the call), or the stream's end: nothing queued.
            ToWorker::Attached { .. } | ToWorker::Refused(_) | ToWorker::Broken => 0,
        }
    }
}

/// One simulated worker. See the [module documentation](self).
#[derive(Debug)]
pub struct Worker {
    /// Its number in the world.
    pub index: usize,
    /// Its node id, once it registered (kept across its restarts).
    pub node: Option<NodeId>,
    /// Its process's boot number (a restart is a new boot).
    pub boot: u64,
    /// The world's client slot its writes go through (a new one each boot).
    pub client: usize,
    /// Whether its process runs.
    pub up: bool,
    /// Frozen (SIGSTOP) until then: it handles nothing, its tasks run on.
    pub frozen_until: u64,
    /// Cut off from every replica until then.
    pub cut_until: u64,
    /// Its stream's epoch: each new stream has a higher one.
    pub epoch: u64,
    /// Whether the stream of `epoch` is open.
    pub attached: bool,
    /// Whether it registered again for the stream of `epoch` (its `RejoinNode` was answered).
    pub registered: bool,
    /// The replica it talks to.
    pub target: u64,
    /// The last time anything came on its stream.
    pub last_heard: u64,
    /// The worker's rules (`escher_worker::protocol`): what it runs (attempt to execution, the
    /// history's index), the attempts it was given, its unacknowledged reports, its lease.
    pub protocol: Protocol<usize>,
    /// Reports to write, in order (each written if still unacknowledged then).
    pub outbox: VecDeque<Attempt>,
    /// Its fence supervisor's rule of when to kill, the real one's (`Countdown`), fed the lines
    /// the worker writes it.
    pub fence: Countdown,
    /// When its beat last wrote to the supervisor.
    pub last_beat: u64,
}

impl Worker {
    /// A worker's first process, whose writes go through client slot `client`.
    pub fn new(index: usize, client: usize, target: u64) -> Worker {
        Worker {
            index,
            node: None,
            boot: 1,
            client,
            up: true,
            frozen_until: 0,
            cut_until: 0,
            epoch: 1,
            attached: false,
            registered: false,
            target,
            last_heard: 0,
            protocol: Protocol::new(),
            outbox: VecDeque::new(),
            fence: Countdown::default(),
            last_beat: 0,
        }
    }

    /// Its name, as it registers.
    pub fn name(&self) -> String {
        format!("worker{}", self.index)
    }

    /// The secret its first registration was given.
    pub fn secret(&self) -> String {
        format!("secret of worker{}", self.index)
    }

    /// Its stream is gone: a new one (registered again first) is needed.
    pub fn detach(&mut self) {
        self.epoch += 1;
        self.attached = false;
        self.registered = false;
    }

    /// The process died: everything in memory is gone (its tasks died with it, the caller
    /// ends them); it comes back as boot `boot + 1` with its identity.
    pub fn crash(&mut self) {
        self.up = false;
        self.detach();
        self.protocol = Protocol::new();
        self.outbox.clear();
        self.fence = Countdown::default();
    }

    /// The attempts it runs.
    pub fn running(&self) -> usize {
        self.protocol.running_count()
    }
}
