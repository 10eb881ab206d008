//! [`Proposals`]: what waits for each proposed entry (one per command of the entry's batch, in
//! order), keyed by the (index, term) raft gave it; and [`Batch`], the commands of the current
//! turn, proposed together as one entry.
//!
//! Entries are applied in index order and every index produces one output, so a proposal is
//! settled when its index is applied: with its reply if the applied entry has its term, with
//! a retryable "not leader" if another leader's entry took the index (then its own entry can
//! never commit: the log has one entry per index). When this replica stops leading, everything
//! still waiting is answered at once that it may still commit (`statuses::in_doubt`): raft-rs
//! keeps a deposed leader's uncommitted entries in the followers that got them, and a new
//! leader elected among those commits them with its first entry. Clients read that answer as an
//! open outcome and retry with the same idempotency key, which the state machine applies once.

use std::collections::BTreeMap;

use escher_proto::types::{NodeId, ObjectId, RegisterReply, RequestKey, RunningTask};
use tokio::sync::oneshot;
use tonic::Status;

use crate::state::{Command, Reply};

/// The most commands one raft entry carries.
pub(crate) const MAX_BATCH: usize = 4096;

/// The commands of the current turn, and what waits for each.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub(crate) commands: Vec<(Command, Option<RequestKey>)>,
    pub(crate) pending: Vec<Pending>,
}

impl Batch {
    /// Adds a command; whether the batch is full.
    pub(crate) fn push(
        &mut self,
        command: Command,
        key: Option<RequestKey>,
        pending: Pending,
    ) -> bool {
        self.commands.push((command, key));
        self.pending.push(pending);
        self.commands.len() >= MAX_BATCH
    }

    /// Takes the batch, leaving an empty one.
    pub(crate) fn take(&mut self) -> Batch {
        std::mem::take(self)
    }

    /// Whether it holds no command.
    pub(crate) fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }
}

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
    /// A worker's stream whose node waited for it (`NodeAttached`): answer once the node takes
    /// tasks, so that a worker that says it is attached is given them.
    Attached(oneshot::Sender<Result<(), Status>>),
    /// A copy a worker reported held (`ObjectsHeld`), proposed for adoption: the worker drops
    /// it if the table leaves it out.
    Adopted {
        /// The worker's node.
        node: NodeId,
        /// The object.
        id: ObjectId,
        /// The store's number for the copy.
        copy: u64,
    },
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
            Pending::Change(reply) | Pending::Attached(reply) => {
                let _ = reply.send(Err(status));
            }
            // A copy not adopted is reported again at the worker's next attach.
            Pending::Report { .. } | Pending::Adopted { .. } | Pending::Quiet => {}
        }
    }
}

/// Proposals waiting for their entries. See the [module documentation](self).
#[derive(Debug, Default)]
pub(crate) struct Proposals {
    waiting: BTreeMap<u64, (u64, Vec<Pending>)>,
}

impl Proposals {
    /// Waits for the entry at (index, term), one pending per command.
    pub(crate) fn insert(&mut self, index: u64, term: u64, pending: Vec<Pending>) {
        if let Some((_, old)) = self.waiting.insert(index, (term, pending)) {
            // Only a new term can reuse an index, and that failed the old proposal already.
            for p in old {
                p.fail(Status::aborted(
                    "the proposal's log position was taken over",
                ));
            }
        }
    }

    /// The proposals settled by the entry applied at (index, term), if they wait there and it
    /// is this entry; proposals overwritten by another leader's entry are failed with
    /// `overwritten`.
    pub(crate) fn take(
        &mut self,
        index: u64,
        term: u64,
        overwritten: impl Fn() -> Status,
    ) -> Option<Vec<Pending>> {
        let (t, pending) = self.waiting.remove(&index)?;
        if t == term {
            return Some(pending);
        }
        for p in pending {
            p.fail(overwritten());
        }
        None
    }

    /// Fails every waiting proposal.
    pub(crate) fn fail_all(&mut self, status: impl Fn() -> Status) {
        for (_, (_, pending)) in std::mem::take(&mut self.waiting) {
            for p in pending {
                p.fail(status());
            }
        }
    }

    /// How many entries have proposals waiting.
    pub(crate) fn len(&self) -> usize {
        self.waiting.len()
    }
}
