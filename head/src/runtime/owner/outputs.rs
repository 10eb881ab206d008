//! What a ready cycle of the replica produced, acted on: proposals answered once their entries
//! are applied ([`Owner::settle`]), effects performed and waits resumed on the leader, role
//! changes, batched reads run, and the watch history restarted after a snapshot.

use escher_proto::types::RegisterReply;
use tonic::Status;

use super::Owner;
use super::workers::unknown_node;
use crate::replication::{Applied, LogStore, NotAccepted, Output};
use crate::runtime::proposals::Pending;
use crate::runtime::reads::ReadJob;
use crate::runtime::statuses::{in_doubt, not_accepted, to_status};
use crate::state::{ApplyError, Reply};

impl<S: LogStore> Owner<S> {
    pub(super) fn on_output(&mut self, output: Output) {
        match output {
            Output::Applied {
                index,
                term,
                results,
            } => {
                let overwritten = || not_accepted(NotAccepted::NotLeader(None));
                let mut pending = self
                    .proposals
                    .take(index, term, overwritten)
                    .unwrap_or_default()
                    .into_iter();
                for Applied {
                    result,
                    effects,
                    finished,
                    events,
                    timing: (command, took),
                } in results
                {
                    self.metrics.applied(command, took);
                    self.events.extend(events);
                    if self.leading {
                        self.perform(effects);
                        for status in finished {
                            self.waiters.on_terminal(status);
                        }
                    }
                    match pending.next() {
                        Some(p) => self.settle(p, result),
                        None => {
                            if let Err(err) = result {
                                tracing::debug!(index, %err, "a command was refused");
                            }
                        }
                    }
                }
            }
            Output::ConfChanged {
                index,
                term,
                result,
            } => {
                let overwritten = || not_accepted(NotAccepted::NotLeader(None));
                for p in self
                    .proposals
                    .take(index, term, overwritten)
                    .unwrap_or_default()
                {
                    match p {
                        Pending::Change(reply) => {
                            let _ = reply.send(result.clone().map_err(Status::failed_precondition));
                        }
                        other => other.fail(Status::internal("a proposal met a membership change")),
                    }
                }
            }
            Output::Empty { index, term } => {
                let overwritten = || not_accepted(NotAccepted::NotLeader(None));
                for p in self
                    .proposals
                    .take(index, term, overwritten)
                    .unwrap_or_default()
                {
                    p.fail(Status::aborted(
                        "raft dropped the change: another membership change is still in \
                         progress; try again once it is done (escher heads)",
                    ));
                }
            }
            Output::Role { role, leader } => self.on_role(role, leader),
            Output::ReadReady { token } => {
                for job in self.reads.ready(token) {
                    if let Some(ReadJob::Wait {
                        ids,
                        num_returns,
                        reply,
                    }) = job.run(self.replica.state())
                    {
                        let state = self.replica.state();
                        if let Some(err) = ids.iter().find_map(|id| state.check_known(*id).err()) {
                            let _ = reply.send(Err(to_status(err)));
                            continue;
                        }
                        self.waiters.add(state, ids, num_returns, reply);
                    }
                }
            }
            Output::DiskFull(why) => {
                let stalls = why.is_some() && self.disk_full.is_none();
                let resumes = why.is_none() && self.disk_full.is_some();
                self.disk_full = why;
                if resumes && self.leading && self.replica.members().len() > 1 {
                    // Still leading after the stall (nobody else was elected): its workers,
                    // let go meanwhile, get a whole heartbeat timeout to come back, as under a
                    // new leader.
                    self.workers.lead(self.replica.state());
                }
                if stalls && self.leading && self.cannot_lead_now() {
                    // As if it had lost the lead, which it will (see `cannot_lead_now`): its
                    // workers go to the replica the others elect now rather than when their
                    // leases run out, and what waits on it (proposals, reads, waits, streams) is
                    // answered UNAVAILABLE instead of waiting for space; a write in flight may
                    // yet commit under the new leader, and its key makes a retry apply it once.
                    tracing::warn!(
                        "the disk is full: this replica lets its workers and callers go to the \
                         replica the others elect"
                    );
                    let status = self.stalled_status();
                    self.stop_leading(move || status.clone());
                }
            }
            Output::Restored => {
                // A snapshot from the leader replaced the log: an entry proposed here before
                // may be in it, committed, or not.
                self.proposals
                    .fail_all(|| in_doubt(&not_accepted(NotAccepted::NotLeader(None))));
                // What came before the snapshot goes first; the history starts again after it.
                self.publish_events();
                self.watch.restart(self.replica.state().revision());
            }
        }
    }

    /// Answers a proposal with what applying its entry returned.
    fn settle(&mut self, pending: Pending, result: Result<Reply, ApplyError>) {
        match pending {
            Pending::Reply(reply) => {
                let _ = reply.send(result.map_err(to_status));
            }
            Pending::Register { reply, secret } => {
                let answer = match result {
                    Ok(Reply::Registered(node_id)) => {
                        self.workers.registered(node_id);
                        tracing::info!(node = %node_id, new = secret.is_some(), "worker registered");
                        let state = self.replica.state();
                        let cluster = state.cluster_id().unwrap_or_default();
                        Ok(RegisterReply {
                            node_id,
                            heartbeat_interval: self.config.heartbeat_interval,
                            heartbeat_timeout: Some(self.config.heartbeat_timeout),
                            secret,
                            group: cluster.to_string(),
                            incarnation: state.incarnation().id(),
                        })
                    }
                    Ok(other) => Err(Status::internal(format!(
                        "unexpected reply to a registration: {other:?}"
                    ))),
                    Err(ApplyError::UnknownNode(node)) => Err(unknown_node(node)),
                    Err(err) => Err(to_status(err)),
                };
                let _ = reply.send(answer);
            }
            Pending::Report { node, report } => self.workers.ack(node, report),
            Pending::Adopted { node, id, copy } => self.adopted(node, (id, copy), result),
            Pending::Attached(reply) => {
                let _ = reply.send(result.map(drop).map_err(to_status));
            }
            Pending::Change(reply) => {
                let _ = reply.send(Err(Status::internal("a membership change met an entry")));
            }
            Pending::Quiet => {
                if let Err(err) = result {
                    tracing::debug!(%err, "a runtime command was refused");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_owner;
    use super::*;

    fn applied(result: Result<Reply, ApplyError>) -> Applied {
        Applied {
            result,
            effects: Vec::new(),
            finished: Vec::new(),
            events: Vec::new(),
            timing: ("tick", std::time::Duration::ZERO),
        }
    }

    #[test]
    fn a_proposal_is_answered_by_its_own_entry_only() {
        let mut owner = test_owner();
        let (reply, mut answered) = tokio::sync::oneshot::channel();
        owner.proposals.insert(7, 2, vec![Pending::Reply(reply)]);
        let (reply, mut overwritten) = tokio::sync::oneshot::channel();
        owner.proposals.insert(8, 2, vec![Pending::Reply(reply)]);
        owner.on_output(Output::Applied {
            index: 7,
            term: 2,
            results: vec![applied(Ok(Reply::Done))],
        });
        assert!(matches!(answered.try_recv().unwrap(), Ok(Reply::Done)));
        // Another leader's entry took index 8: its proposal learns it was not applied.
        owner.on_output(Output::Applied {
            index: 8,
            term: 3,
            results: vec![applied(Ok(Reply::Done))],
        });
        let status = overwritten.try_recv().unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert_eq!(owner.proposals.len(), 0);
    }

    #[test]
    fn a_proposal_waiting_when_a_snapshot_replaced_the_log_may_still_commit() {
        let mut owner = test_owner();
        let (reply, mut rx) = tokio::sync::oneshot::channel();
        owner.proposals.insert(9, 2, vec![Pending::Reply(reply)]);
        owner.on_output(Output::Restored);
        let status = rx.try_recv().unwrap().unwrap_err();
        assert!(
            escher_proto::replicas::may_still_commit(&status),
            "{status:?}"
        );
    }

    #[test]
    fn a_refused_command_is_answered_with_its_status_and_a_quiet_one_with_nothing() {
        let mut owner = test_owner();
        let (reply, mut rx) = tokio::sync::oneshot::channel();
        owner
            .proposals
            .insert(3, 1, vec![Pending::Reply(reply), Pending::Quiet]);
        let unknown = ApplyError::UnknownTask(escher_proto::types::TaskId(4));
        owner.on_output(Output::Applied {
            index: 3,
            term: 1,
            results: vec![applied(Err(unknown)), applied(Ok(Reply::Done))],
        });
        let status = rx.try_recv().unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::NotFound);
    }

    #[test]
    fn an_entry_dropped_by_raft_fails_its_membership_change() {
        let mut owner = test_owner();
        let (reply, mut rx) = tokio::sync::oneshot::channel();
        owner.proposals.insert(5, 1, vec![Pending::Change(reply)]);
        owner.on_output(Output::Empty { index: 5, term: 1 });
        let status = rx.try_recv().unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Aborted);
    }
}
