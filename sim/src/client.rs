//! [`Client`]: a simulated client. It writes one thing at a time through the replica it
//! believes leads, with an idempotency key, and retries by the real client's rules
//! ([`escher_client::retry::Retry`], fed the simulated time): it follows a named leader at
//! once, tries the next replica after the real pauses when a replica knows no leader, is
//! silent (its keep-alive gave up) or has a full disk, and gives up when no leader answered
//! within the failover timeout. Like an application that does what the client's error says,
//! it then sends the same write again, under the same key, as a new call (the error was
//! retryable, or an unknown outcome to retry under its key).
use std::fmt;
use std::time::Duration;

use escher_client::retry::Retry;
use escher_core::state::{Command, Reply};
use escher_proto::types::{NodeId, RequestKey, TaskId};

/// How long a call looks for a leader: the real client's default.
pub const FAILOVER: Duration = escher_client::DEFAULT_FAILOVER_TIMEOUT;

/// A replica, as the retry rules and their messages name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Replica(pub u64);

impl fmt::Display for Replica {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "replica {}", self.0)
    }
}

/// What a write is, for the checker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Intent {
    /// The group's first write: names the cluster.
    Init,
    /// A worker registers.
    Register,
    /// Tasks named by these markers (each name is unique in the whole run).
    Submit(Vec<String>),
    /// A resource named by this marker is set on a node.
    SetResource { marker: String, node: NodeId },
    /// A simulated worker registers (first, or again for a new stream).
    Attach { worker: usize },
    /// A simulated worker reports an attempt's end.
    Report {
        worker: usize,
        task: TaskId,
        attempt: u32,
    },
}

/// One write and its key.
#[derive(Debug, Clone)]
pub struct Write {
    /// Its idempotency key.
    pub key: RequestKey,
    /// The command.
    pub command: Command,
    /// What it means, for the checker.
    pub intent: Intent,
}

/// A write the group answered.
#[derive(Debug, Clone)]
pub struct Answered {
    /// The write.
    pub write: Write,
    /// The reply, or why it was refused.
    pub reply: Result<Reply, String>,
}

/// One simulated client. See the [module documentation](self).
#[derive(Debug)]
pub struct Client {
    /// Its id, as its keys carry it.
    pub id: u64,
    /// Writes numbered so far.
    seq: u64,
    /// The write in flight, if any.
    pub current: Option<Write>,
    /// Counts sends: an answer or a timeout for an earlier send is stale.
    pub attempt: u64,
    /// The last send whose answer (or silence) the retry rules took: a duplicate is ignored.
    settled: u64,
    /// The retry rules of the call under way.
    pub retry: Retry<Replica>,
    /// The replica it sends to next.
    pub target: u64,
    /// Writes the group answered, in order.
    pub answered: Vec<Answered>,
    /// Writes given up on unanswered (the run ended): their outcome is unknown.
    pub unknown: Vec<Write>,
    /// Task ids this client's submits got back.
    pub ids: Vec<TaskId>,
    /// The (index, term) of each proposal the call under way made (one per attempt a leader
    /// took): if the call ends with an error that says the write was not applied, none of them
    /// may commit.
    pub proposed: Vec<(u64, u64)>,
}

impl Client {
    /// A client that first talks to `target`.
    pub fn new(id: u64, target: u64) -> Client {
        Client {
            id,
            seq: 0,
            current: None,
            attempt: 0,
            settled: 0,
            retry: Retry::new("the simulated replicas", FAILOVER, Duration::ZERO),
            target,
            answered: Vec::new(),
            unknown: Vec::new(),
            ids: Vec::new(),
            proposed: Vec::new(),
        }
    }

    /// Starts a new write at `now` (simulated time since the run began); its key is the next
    /// in this client's sequence.
    pub fn start(&mut self, command: Command, intent: Intent, now: Duration) -> &Write {
        self.call(now);
        self.seq += 1;
        let key = RequestKey {
            client: self.id,
            seq: self.seq,
            first_incomplete: self.seq,
        };
        self.current.insert(Write {
            key,
            command,
            intent,
        })
    }

    /// A new call of the write in flight begins at `now`: its retry rules start afresh.
    pub fn call(&mut self, now: Duration) {
        self.retry = Retry::new("the simulated replicas", FAILOVER, now);
        self.proposed.clear();
    }

    /// Whether the answer to send `attempt` is awaited: it is the latest send of the write in
    /// flight and nothing was taken for it yet.
    pub fn awaits(&self, attempt: u64) -> bool {
        self.current.is_some() && self.attempt == attempt && self.settled < attempt
    }

    /// The latest send's answer (or silence) is taken.
    pub fn settle(&mut self) {
        self.settled = self.attempt;
    }

    /// The number of the next write (markers are built from it).
    pub fn next_seq(&self) -> u64 {
        self.seq + 1
    }

    /// The write in flight was answered.
    pub fn answer(&mut self, reply: Result<Reply, String>) {
        if let Some(write) = self.current.take() {
            if let Ok(Reply::Submitted(ids)) = &reply {
                self.ids.extend(ids.iter().copied());
            }
            self.answered.push(Answered { write, reply });
        }
    }

    /// The run ends: a write still in flight has an unknown outcome.
    pub fn give_up(&mut self) {
        if let Some(write) = self.current.take() {
            self.unknown.push(write);
        }
    }
}
