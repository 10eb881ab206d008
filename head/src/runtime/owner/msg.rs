//! [`Msg`], what gRPC handlers ask of the owner, and [`Owner::handle`], where each is taken:
//! a write joins this turn's batch, a read its ReadIndex batch (or runs at once when stale),
//! the rest is answered from the soft state or handed to the file that keeps it.

use escher_proto::types::{
    HeadChange, HeadReplica, NodeId, RegisterReply, RegisterRequest, RequestKey, TaskId,
    TaskLogsRequest, WaitReply, WorkerMessage,
};
use tokio::sync::oneshot;
use tonic::Status;

use super::Owner;
use crate::replication::LogStore;
use crate::runtime::logs::LogReply;
use crate::runtime::proposals::Pending;
use crate::runtime::reads::{Query, ReadJob};
use crate::runtime::statuses::not_accepted;
use crate::runtime::watch::{Filter, Subscription};
use crate::state::{Command, Reply};

/// A request to the owner.
pub(crate) enum Msg {
    /// Apply a command through the log.
    Apply {
        command: Command,
        key: Option<RequestKey>,
        reply: oneshot::Sender<Result<Reply, Status>>,
    },
    /// Run a read-only query.
    Read { job: Query, stale: bool },
    /// Answer when `num_returns` of `ids` are terminal.
    Wait {
        ids: Vec<TaskId>,
        num_returns: usize,
        reply: oneshot::Sender<Result<WaitReply, Status>>,
    },
    /// A worker registers.
    Register {
        request: RegisterRequest,
        reply: oneshot::Sender<Result<RegisterReply, Status>>,
    },
    /// A worker's stream opened: answered once its node takes tasks (`Owner::attach`).
    Attach {
        node: NodeId,
        secret: String,
        conn: u64,
        tx: crate::runtime::workers::LinkSender,
        reply: oneshot::Sender<Result<(), Status>>,
    },
    /// A worker's stream closed.
    Detach { node: NodeId, conn: u64 },
    /// A worker sent a batch of messages (in order).
    Worker {
        node: NodeId,
        msgs: Vec<WorkerMessage>,
    },
    /// Fetch a piece of a task's log from its worker.
    Logs {
        request: TaskLogsRequest,
        reply: LogReply,
    },
    /// This replica's own status, the group's id and every member's address.
    Heads { reply: oneshot::Sender<HeadsView> },
    /// How many messages wait for each worker (on its stream, or until it attaches).
    Outboxes {
        reply: oneshot::Sender<Vec<(NodeId, usize)>>,
    },
    /// Change the group's membership.
    ChangeHeads {
        change: HeadChange,
        reply: oneshot::Sender<Result<(), Status>>,
    },
    /// Subscribe to events after a revision (or from now).
    Watch {
        filter: Filter,
        after: Option<u64>,
        reply: oneshot::Sender<Result<Subscription, Status>>,
    },
    /// A client renews its object session: answered with the lapse time (leader only).
    RenewObjectSession {
        session: u64,
        namespace: Option<escher_proto::types::Namespace>,
        sees_everything: bool,
        reply: oneshot::Sender<Result<std::time::Duration, Status>>,
    },
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Msg::Apply { .. } => "Apply",
            Msg::Read { .. } => "Read",
            Msg::Wait { .. } => "Wait",
            Msg::Register { .. } => "Register",
            Msg::Attach { .. } => "Attach",
            Msg::Detach { .. } => "Detach",
            Msg::Worker { .. } => "Worker",
            Msg::Logs { .. } => "Logs",
            Msg::Heads { .. } => "Heads",
            Msg::Outboxes { .. } => "Outboxes",
            Msg::ChangeHeads { .. } => "ChangeHeads",
            Msg::Watch { .. } => "Watch",
            Msg::RenewObjectSession { .. } => "RenewObjectSession",
        })
    }
}

/// What one replica knows of its group, for `escher heads`.
#[derive(Debug, Clone)]
pub(crate) struct HeadsView {
    pub(crate) group: String,
    pub(crate) me: HeadReplica,
    pub(crate) members: std::collections::BTreeMap<u64, String>,
}

impl<S: LogStore> Owner<S> {
    /// Whether this replica, leading a group of several, is stalled (its disk full): raft can
    /// confirm nothing it does, and the others will elect another leader, so it answers no
    /// linearizable read, takes no worker, and renews no lease.
    pub(super) fn cannot_lead_now(&self) -> bool {
        self.replica.stalled() && self.replica.members().len() > 1
    }

    pub(super) fn stalled_status(&self) -> tonic::Status {
        tonic::Status::unavailable(format!(
            "head replica {} cannot confirm it leads while its disk is full; another replica \
             will lead shortly",
            self.replica.id()
        ))
    }

    pub(super) fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Apply {
                command,
                key,
                reply,
            } => {
                if let Command::CloseObjectSession { session, .. } = &command
                    && self.leading
                {
                    // What the close keeps (pinned objects) goes once no task pins it.
                    let lapse = self.config.object_session_lapse;
                    self.sessions
                        .closed(*session, lapse, std::time::Instant::now());
                }
                self.propose(command, key, Pending::Reply(reply));
            }
            Msg::Read { job, stale: true } => job(Ok(self.replica.state())),
            // A lone head whose disk is full still answers reads: its state holds every write
            // it acknowledged, and no other replica can have acknowledged more.
            Msg::Read { job, stale: false } if self.leading && self.replica.stalled() => {
                if self.replica.members().len() <= 1 {
                    job(Ok(self.replica.state()));
                } else {
                    // Raft cannot confirm the lead now; the others elect a new leader, which
                    // the client finds.
                    job(Err(self.stalled_status()));
                }
            }
            Msg::Read { job, stale: false } => {
                if self.leading {
                    self.reads.push(ReadJob::Query(job));
                } else {
                    job(Err(self.not_leader()));
                }
            }
            Msg::Wait {
                ids,
                num_returns,
                reply,
            } if self.leading && self.replica.stalled() => {
                if self.replica.members().len() > 1 {
                    let _ = reply.send(Err(self.stalled_status()));
                    return;
                }
                let state = self.replica.state();
                match ids.iter().find_map(|id| state.check_known(*id).err()) {
                    Some(err) => {
                        let _ = reply.send(Err(crate::runtime::statuses::to_status(err)));
                    }
                    None => self.waiters.add(state, ids, num_returns, reply),
                }
            }
            Msg::Wait {
                ids,
                num_returns,
                reply,
            } => {
                if self.leading {
                    self.reads.push(ReadJob::Wait {
                        ids,
                        num_returns,
                        reply,
                    });
                } else {
                    let _ = reply.send(Err(self.not_leader()));
                }
            }
            Msg::Register { request, reply } => self.register(request, reply),
            Msg::Attach {
                node,
                secret,
                conn,
                tx,
                reply,
            } => self.attach(node, &secret, conn, tx, reply),
            Msg::Detach { node, conn } => {
                if self.workers.detach(node, conn) {
                    tracing::info!(%node, "worker detached");
                    if self.leading && self.replica.state().node_draining(node) {
                        // A drained worker said goodbye: no need to wait for its heartbeats.
                        let reason = "worker shut down".to_string();
                        let command = self.removal(node, reason);
                        self.propose(command, None, Pending::Quiet);
                        self.workers.forget(node);
                    }
                }
            }
            Msg::Worker { node, msgs } => {
                for msg in msgs {
                    self.on_worker_message(node, msg);
                }
            }
            Msg::Logs { request, reply } => self.fetch_logs(request, reply),
            Msg::Heads { reply } => {
                let _ = reply.send(HeadsView {
                    group: self.replica.group().to_string(),
                    me: self.replica.status(),
                    members: self.replica.members().clone(),
                });
            }
            Msg::Outboxes { reply } => {
                let _ = reply.send(self.workers.depths());
            }
            Msg::Watch {
                filter,
                after,
                reply,
            } => {
                let answer = if self.leading {
                    self.watch.subscribe(filter, after)
                } else {
                    Err(self.not_leader())
                };
                let _ = reply.send(answer);
            }
            Msg::RenewObjectSession {
                session,
                namespace,
                sees_everything,
                reply,
            } => {
                let answer = if !self.leading {
                    Err(self.not_leader())
                } else if self.cannot_lead_now() {
                    Err(self.stalled_status())
                } else if !self.replica.state().may_renew_session(
                    session,
                    namespace.as_ref(),
                    sees_everything,
                ) {
                    Err(Status::not_found(format!(
                        "unknown object session {session} (the head never gave it out, or its \
                         objects are another namespace's)"
                    )))
                } else {
                    self.sessions.renew(session, std::time::Instant::now());
                    Ok(self.config.object_session_lapse)
                };
                let _ = reply.send(answer);
            }
            Msg::ChangeHeads { change, reply } => {
                // What came before it in this turn goes first.
                self.flush();
                match self.replica.propose_change(&change) {
                    Ok((index, term)) => {
                        self.proposals
                            .insert(index, term, vec![Pending::Change(reply)]);
                    }
                    Err(why) => {
                        let _ = reply.send(Err(not_accepted(why)));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_owner;
    use super::*;

    #[test]
    fn a_stale_read_runs_at_once_and_a_linearizable_one_needs_the_leader() {
        let mut owner = test_owner();
        let (tx, rx) = std::sync::mpsc::channel();
        let job: Query = Box::new(move |state| {
            let _ = tx.send(state.map(|s| s.revision()).map_err(|s| s.code()));
        });
        owner.handle(Msg::Read { job, stale: true });
        assert!(rx.try_recv().unwrap().is_ok());
        let (tx, rx) = std::sync::mpsc::channel();
        let job: Query = Box::new(move |state| {
            let _ = tx.send(state.map(|s| s.revision()).map_err(|s| s.code()));
        });
        owner.handle(Msg::Read { job, stale: false });
        assert_eq!(rx.try_recv().unwrap(), Err(tonic::Code::Unavailable));
    }

    #[test]
    fn what_only_a_leader_answers_is_refused_by_a_follower() {
        let mut owner = test_owner();
        let (reply, mut rx) = oneshot::channel();
        owner.handle(Msg::Wait {
            ids: vec![TaskId(1)],
            num_returns: 1,
            reply,
        });
        let status = rx.try_recv().unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        let (reply, mut rx) = oneshot::channel();
        owner.handle(Msg::Apply {
            command: Command::Tick,
            key: None,
            reply,
        });
        let status = rx.try_recv().unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(owner.batch.is_empty());
    }

    #[test]
    fn heads_and_outboxes_are_answered_by_any_replica() {
        let mut owner = test_owner();
        let (reply, mut rx) = oneshot::channel();
        owner.handle(Msg::Heads { reply });
        let view = rx.try_recv().unwrap();
        assert_eq!(view.me.id, 1);
        assert_eq!(
            view.members.get(&1).map(String::as_str),
            Some("127.0.0.1:1")
        );
        let (reply, mut rx) = oneshot::channel();
        owner.handle(Msg::Outboxes { reply });
        assert!(rx.try_recv().unwrap().is_empty());
    }

    #[test]
    fn a_renewal_needs_the_leader_and_a_session_it_gave_out() {
        let renew = |owner: &mut super::super::Owner<_>| {
            let (reply, mut rx) = oneshot::channel();
            owner.handle(Msg::RenewObjectSession {
                session: crate::state::FIRST_SESSION,
                namespace: None,
                sees_everything: true,
                reply,
            });
            rx.try_recv().unwrap().unwrap_err()
        };
        let mut owner = test_owner();
        assert_eq!(renew(&mut owner).code(), tonic::Code::Unavailable);
        owner.on_role(escher_proto::types::ReplicaRole::Leader, Some(1));
        let status = renew(&mut owner);
        assert_eq!(status.code(), tonic::Code::NotFound);
        assert!(
            status.message().contains("unknown object session"),
            "{status:?}"
        );
        assert_eq!(
            owner.sessions.len(),
            0,
            "no clock for a session never given out"
        );
    }

    #[test]
    fn a_message_shows_its_kind_only() {
        let (reply, _rx) = oneshot::channel();
        let msg = Msg::Apply {
            command: Command::Tick,
            key: None,
            reply,
        };
        assert_eq!(format!("{msg:?}"), "Apply");
        let msg = Msg::Detach {
            node: NodeId(3),
            conn: 1,
        };
        assert_eq!(format!("{msg:?}"), "Detach");
    }
}
