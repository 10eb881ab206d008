//! [`Client`]: a simulated client. It writes one thing at a time through the replica it
//! believes leads, with an idempotency key, and retries as the real client does: on "not
//! leader" it goes to the replica named (or another), on silence it times out and sends the
//! same write, with the same key, to another replica.

use escher_core::state::{Command, Reply};
use escher_proto::types::{NodeId, RequestKey, TaskId};

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
    /// The replica it sends to next.
    pub target: u64,
    /// Writes the group answered, in order.
    pub answered: Vec<Answered>,
    /// Writes given up on unanswered (the run ended): their outcome is unknown.
    pub unknown: Vec<Write>,
    /// Task ids this client's submits got back.
    pub ids: Vec<TaskId>,
}

impl Client {
    /// A client that first talks to `target`.
    pub fn new(id: u64, target: u64) -> Client {
        Client {
            id,
            seq: 0,
            current: None,
            attempt: 0,
            target,
            answered: Vec::new(),
            unknown: Vec::new(),
            ids: Vec::new(),
        }
    }

    /// Starts a new write; its key is the next in this client's sequence.
    pub fn start(&mut self, command: Command, intent: Intent) -> &Write {
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
