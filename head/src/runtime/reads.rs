//! [`Reads`]: linearizable reads, batched. Every read that arrives in one turn of the owner
//! loop shares one raft ReadIndex request (a token); when raft confirms this replica still
//! led at that index and the index is applied, the whole batch runs against the state.

use rustc_hash::FxHashMap;
use tokio::sync::oneshot;
use tonic::Status;

use crate::state::ClusterState;
use escher_proto::types::{TaskId, WaitReply};

/// A read job: runs against the state once the read may be answered, or learns why not.
pub(crate) type Query = Box<dyn FnOnce(Result<&ClusterState, Status>) + Send>;

/// A read waiting for its ReadIndex.
pub(crate) enum ReadJob {
    /// A query against the state.
    Query(Query),
    /// A `wait`: checked against the state, then registered with the waiters.
    Wait {
        /// The tasks.
        ids: Vec<TaskId>,
        /// How many must be terminal.
        num_returns: usize,
        /// Where the answer goes.
        reply: oneshot::Sender<Result<WaitReply, Status>>,
    },
}

impl std::fmt::Debug for ReadJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReadJob::Query(_) => "Query",
            ReadJob::Wait { .. } => "Wait",
        })
    }
}

impl ReadJob {
    /// Answers with `status`.
    pub(crate) fn fail(self, status: Status) {
        match self {
            ReadJob::Query(query) => query(Err(status)),
            ReadJob::Wait { reply, .. } => {
                let _ = reply.send(Err(status));
            }
        }
    }

    /// Runs a query job; a wait job is given back for the caller to register.
    pub(crate) fn run(self, state: &ClusterState) -> Option<ReadJob> {
        match self {
            ReadJob::Query(query) => {
                query(Ok(state));
                None
            }
            wait @ ReadJob::Wait { .. } => Some(wait),
        }
    }
}

/// Reads queued in this turn and reads waiting for raft. See the [module documentation](self).
#[derive(Debug, Default)]
pub(crate) struct Reads {
    queued: Vec<ReadJob>,
    waiting: FxHashMap<u64, Vec<ReadJob>>,
    next_token: u64,
}

impl Reads {
    /// Queues a read for the next batch.
    pub(crate) fn push(&mut self, job: ReadJob) {
        self.queued.push(job);
    }

    /// Takes the queued reads as one batch under a new token, if there are any.
    pub(crate) fn batch(&mut self) -> Option<u64> {
        if self.queued.is_empty() {
            return None;
        }
        self.next_token += 1;
        let token = self.next_token;
        self.waiting.insert(token, std::mem::take(&mut self.queued));
        Some(token)
    }

    /// The batch under `token`, now answerable.
    pub(crate) fn ready(&mut self, token: u64) -> Vec<ReadJob> {
        self.waiting.remove(&token).unwrap_or_default()
    }

    /// Fails every read, queued or waiting.
    pub(crate) fn fail_all(&mut self, status: impl Fn() -> Status) {
        for job in std::mem::take(&mut self.queued) {
            job.fail(status());
        }
        for (_, jobs) in std::mem::take(&mut self.waiting) {
            for job in jobs {
                job.fail(status());
            }
        }
    }

    /// How many reads wait.
    pub(crate) fn len(&self) -> usize {
        self.queued.len() + self.waiting.values().map(Vec::len).sum::<usize>()
    }
}
