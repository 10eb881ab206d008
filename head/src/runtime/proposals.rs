//! [`Proposals`]: what waits for each proposed entry, keyed by the (index, term) raft gave it.
//!
//! Entries are applied in index order and every index produces one output, so a proposal is
//! settled when its index is applied: with its reply if the applied entry has its term, with
//! a retryable "not leader" if another leader's entry took the index. When this replica stops
//! leading, everything still waiting is answered "not leader" at once: some of those entries
//! may commit later, which is why clients retry with the same idempotency key.

use std::collections::BTreeMap;

use escher_proto::types::{NodeId, RegisterReply, RunningTask};
use tokio::sync::oneshot;
use tonic::Status;

use crate::state::Reply;

/// What to do when a proposed entry is applied.
#[derive(Debug)]
pub(crate) enum Pending {
    /// A client's write: answer with the reply.
    Reply(oneshot::Sender<Result<Reply, Status>>),
    /// A worker's registration: answer with its node id (and new secret).
    Register {
        /// Where the answer goes.
        reply: oneshot::Sender<Result<RegisterReply, Status>>,
        /// The secret of a new node, given back only once committed.
        secret: Option<String>,
    },
    /// A worker's task report: acknowledge it to the worker.
    Report {
        /// The worker's node.
        node: NodeId,
        /// The report's task and attempt.
        report: RunningTask,
    },
    /// A membership change: answer when it took effect.
    Change(oneshot::Sender<Result<(), Status>>),
    /// The runtime's own command (a tick, a lost node): nothing to answer.
    Quiet,
}

impl Pending {
    /// Answers with `status` whatever waits.
    pub(crate) fn fail(self, status: Status) {
        match self {
            Pending::Reply(reply) => {
                let _ = reply.send(Err(status));
            }
            Pending::Register { reply, .. } => {
                let _ = reply.send(Err(status));
            }
            Pending::Change(reply) => {
                let _ = reply.send(Err(status));
            }
            Pending::Report { .. } | Pending::Quiet => {}
        }
    }
}

/// Proposals waiting for their entries. See the [module documentation](self).
#[derive(Debug, Default)]
pub(crate) struct Proposals {
    waiting: BTreeMap<u64, (u64, Pending)>,
}

impl Proposals {
    /// Waits for the entry at (index, term).
    pub(crate) fn insert(&mut self, index: u64, term: u64, pending: Pending) {
        if let Some((_, old)) = self.waiting.insert(index, (term, pending)) {
            // Only a new term can reuse an index, and that failed the old proposal already.
            old.fail(Status::aborted(
                "the proposal's log position was taken over",
            ));
        }
    }

    /// The proposal settled by the entry applied at (index, term), if one waits there and it
    /// is this entry; a proposal overwritten by another leader's entry is failed with
    /// `overwritten`.
    pub(crate) fn take(
        &mut self,
        index: u64,
        term: u64,
        overwritten: impl FnOnce() -> Status,
    ) -> Option<Pending> {
        let (t, pending) = self.waiting.remove(&index)?;
        if t == term {
            return Some(pending);
        }
        pending.fail(overwritten());
        None
    }

    /// Fails every waiting proposal.
    pub(crate) fn fail_all(&mut self, status: impl Fn() -> Status) {
        for (_, (_, pending)) in std::mem::take(&mut self.waiting) {
            pending.fail(status());
        }
    }

    /// How many proposals wait.
    pub(crate) fn len(&self) -> usize {
        self.waiting.len()
    }
}
