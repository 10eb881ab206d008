//! Leading: taking the lead (naming a new cluster), losing it (answering everything only a
//! leader could answer), and the owner's periodic tick (the leader's heartbeat checks and
//! timers; pruning on every replica).

use std::time::{Duration, Instant};

use escher_proto::types::{ENDING_SOON_LABEL, Labels, NodeId, ReplicaRole};
use tonic::Status;

use super::{Owner, new_secret, now_ms};
use crate::replication::LogStore;
use crate::runtime::proposals::Pending;
use crate::runtime::statuses::{in_doubt, not_accepted};
use crate::state::Command;

impl<S: LogStore> Owner<S> {
    pub(super) fn on_role(&mut self, role: ReplicaRole, leader: Option<u64>) {
        let leads = role == ReplicaRole::Leader;
        tracing::info!(replica = self.replica.id(), %role, ?leader, "raft role changed");
        self.metrics.leader_changed();
        if leads != self.leading {
            // A new leader gives every object session a full lapse time; one that stops
            // leading forgets its clocks.
            self.sessions.lead();
        }
        if leads && !self.leading {
            self.workers.lead(self.replica.state());
            if self.replica.state().cluster_id().is_none() {
                let cluster_id = new_secret()[..32].to_string();
                tracing::info!(%cluster_id, "naming this new cluster");
                self.leading = true;
                let task_key = new_secret();
                let command = Command::Init {
                    cluster_id,
                    task_key,
                };
                self.propose(command, None, Pending::Quiet);
            }
            if let Some(lost) = self.lost_tail.take() {
                let (count, why) = (lost.ids_at_risk(), lost.describe());
                self.leading = true;
                self.propose(Command::SkipIds { count, why }, None, Pending::Quiet);
            }
            tracing::info!(
                replica = self.replica.id(),
                nodes = self.replica.state().live_nodes().len(),
                "this replica leads the head group now; waiting for workers to attach"
            );
        }
        if !leads && self.leading {
            let status = not_accepted(self.replica.not_leader());
            self.stop_leading(move || status.clone());
        }
        self.leading = leads;
    }

    /// Answers everything that only a leader could answer, and drops every worker stream.
    /// What was never proposed (this turn's batch) is answered `status`: it was not applied.
    /// What was proposed and waits for its entry is answered that it may still commit
    /// ([`in_doubt`]): the entry may be in a majority's logs, and the next leader then commits
    /// it.
    pub(super) fn stop_leading(&mut self, status: impl Fn() -> Status) {
        for p in self.batch.take().pending {
            p.fail(status());
        }
        self.proposals.fail_all(|| in_doubt(&status()));
        self.reads.fail_all(&status);
        let _ = self.replica.drop_reads();
        self.waiters.fail_all(&status);
        self.watch.end_all(&status);
        self.workers.drop_all();
        for (_, pending) in self.logs.drain() {
            let _ = pending.reply.send(Err(status().message().to_string()));
        }
    }

    /// The command that removes `node` (declared lost, or its drained worker gone), judged on
    /// its registration now where the group's data format allows (`Liveness`'s `removal`).
    pub(super) fn removal(&mut self, node: NodeId, reason: String) -> Command {
        let writes = self.replica.writes_format();
        crate::runtime::liveness::removal(self.replica.state(), node, reason, writes)
    }

    pub(super) fn on_tick(&mut self) {
        // A stalled replica of a group is about to lose the lead: it declares nothing (its
        // workers went to the next leader, whose clocks count for them; `Liveness::tick`).
        let cannot_lead = self.cannot_lead_now();
        if self.leading && !cannot_lead {
            self.workers.flush_acks();
        }
        if self.leading {
            let timeout = self.config.heartbeat_timeout;
            for node in self
                .workers
                .tick(self.replica.state(), timeout, cannot_lead)
            {
                tracing::warn!(%node, ?timeout, "worker missed its heartbeats; declaring the node lost");
                let reason = format!("no heartbeat for {timeout:?}");
                let command = self.removal(node, reason);
                self.propose(command, None, Pending::Quiet);
            }
        }
        if self.leading && !cannot_lead {
            self.drain_ending_nodes();
            self.close_lapsed_sessions();
            // Pending deadlines, and finished tasks and dead nodes at the end of their
            // retention.
            if self
                .replica
                .state()
                .next_timer()
                .is_some_and(|d| d <= now_ms())
            {
                self.propose(Command::Tick, None, Pending::Quiet);
            }
        }
        if self.last_prune.elapsed() > std::time::Duration::from_secs(1) {
            self.waiters.prune();
            self.watch.prune();
            self.logs.retain(|_, p| !p.reply.is_closed());
            self.last_prune = Instant::now();
            tracing::trace!(
                waiters = self.waiters.len(),
                proposals = self.proposals.len(),
                reads = self.reads.len(),
                workers = self.workers.len(),
                object_sessions = self.sessions.len(),
                "pruned"
            );
        }
    }
}

impl<S: LogStore> Owner<S> {
    /// Proposes the close of each object session whose client has not renewed it for a lapse
    /// time (`runtime/object_sessions.rs`), once a second, when the group writes a format that
    /// holds the command.
    fn close_lapsed_sessions(&mut self) {
        if self.replica.writes_format() < crate::replication::SESSIONS_FORMAT {
            return;
        }
        let now = Instant::now();
        if !self.sessions.due(now) {
            return;
        }
        let owning = crate::runtime::object_sessions::owning(self.replica.state());
        let lapse = self.config.object_session_lapse;
        for session in self.sessions.lapsed(&owning, lapse, now) {
            tracing::info!(
                session,
                ?lapse,
                "object session lapsed: releasing its objects"
            );
            let command = Command::CloseObjectSession {
                session,
                namespace: None,
                sees_everything: true,
            };
            self.propose(command, None, Pending::Quiet);
        }
    }

    /// Drains each live node whose walltime's drain time has come and labels it ending soon
    /// (`escher.drain-at`, set by a worker started with `--walltime`), once: a proposal still
    /// in flight is not made again for a second.
    fn drain_ending_nodes(&mut self) {
        if self.replica.writes_format() < crate::replication::LABELS_FORMAT {
            return;
        }
        let ending = self.replica.state().nodes_ending(now_ms());
        self.ending
            .retain(|node, at| ending.contains(node) && at.elapsed() < Duration::from_secs(1));
        for node in ending {
            if self.ending.contains_key(&node) {
                continue;
            }
            tracing::info!(%node, "the node's walltime ends soon: draining it");
            let mut set = Labels::new();
            let _ = set.insert(ENDING_SOON_LABEL, "true");
            let command = Command::LabelNode {
                node,
                set,
                remove: Vec::new(),
                drain: true,
            };
            self.ending.insert(node, Instant::now());
            self.propose(command, None, Pending::Quiet);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_owner;
    use super::*;
    use crate::runtime::owner::Msg;

    #[test]
    fn a_write_proposed_before_the_lead_was_lost_may_still_commit_and_one_never_proposed_was_not_applied()
     {
        let (mut owner, _) = super::super::leading_test_owner();
        // Proposed to raft: its entry is in the log, and may be in a majority's.
        let (reply, mut proposed) = tokio::sync::oneshot::channel();
        owner.propose(Command::Tick, None, Pending::Reply(reply));
        owner.flush();
        assert_eq!(owner.proposals.len(), 1);
        // Only in this turn's batch: never proposed.
        let (reply, mut batched) = tokio::sync::oneshot::channel();
        owner.propose(Command::Tick, None, Pending::Reply(reply));
        owner.on_role(ReplicaRole::Follower, None);
        let status = proposed.try_recv().unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(
            escher_proto::replicas::may_still_commit(&status),
            "{status:?}"
        );
        assert!(
            status.message().contains("may still be applied"),
            "{status:?}"
        );
        // Still a "not leader" answer, for a caller that only follows the leader (a worker).
        assert_ne!(
            escher_proto::replicas::answer(&status),
            escher_proto::replicas::Answer::Other
        );
        let status = batched.try_recv().unwrap().unwrap_err();
        assert!(
            !escher_proto::replicas::may_still_commit(&status),
            "{status:?}"
        );
        assert!(status.message().contains("not the leader"), "{status:?}");
    }

    #[test]
    fn the_first_leader_names_the_cluster() {
        let mut owner = test_owner();
        owner.on_role(ReplicaRole::Leader, Some(1));
        assert!(owner.leading);
        let batch = owner.batch.take();
        assert!(
            matches!(
                &batch.commands[..],
                [(Command::Init { cluster_id, task_key }, None)]
                    if cluster_id.len() == 32 && task_key.len() == 64
            ),
            "{:?}",
            batch.commands
        );
    }

    #[test]
    fn a_leader_whose_log_lost_a_written_tail_skips_the_ids_it_may_have_given_out() {
        let mut owner = test_owner();
        owner.lost_tail = Some(crate::replication::LostTail {
            path: "/data/00000000000000000001.log".into(),
            offset: 4096,
            bytes: 300,
            written_whole: true,
        });
        owner.on_role(ReplicaRole::Leader, Some(1));
        let batch = owner.batch.take();
        assert!(
            batch.commands.iter().any(|(c, _)| matches!(
                c,
                Command::SkipIds { count: 300, why } if why.contains("offset 4096")
            )),
            "{:?}",
            batch.commands
        );
        assert!(owner.lost_tail.is_none(), "once");
    }

    #[test]
    fn a_leader_whose_log_lost_a_cut_tail_skips_more_than_the_bytes_left_and_says_what_it_cannot_know()
     {
        // A write without its sync marker: a head stopped while writing it, or a file that lost
        // its end after it was synced. The bytes left say nothing of how much a cut took.
        let mut owner = test_owner();
        owner.lost_tail = Some(crate::replication::LostTail {
            path: "/data/00000000000000000001.log".into(),
            offset: 4096,
            bytes: 40,
            written_whole: false,
        });
        owner.on_role(ReplicaRole::Leader, Some(1));
        let batch = owner.batch.take();
        let skipped = batch.commands.iter().find_map(|(c, _)| match c {
            Command::SkipIds { count, why } => Some((*count, why.clone())),
            _ => None,
        });
        let (count, why) = skipped.expect("ids skipped");
        assert_eq!(count, 40 + crate::replication::CUT_TAIL_IDS);
        assert!(why.contains("cannot tell"), "{why}");
        assert!(!why.contains("never acknowledged,"), "{why}");
    }

    #[tokio::test]
    async fn a_read_asked_before_the_new_leader_commits_in_its_term_is_answered_once_it_does() {
        // A group of one campaigns as it opens: it leads at once, before the entry of its
        // term is committed, when raft drops a ReadIndex without a word. The read is held and
        // asked once the entry commits, so it is answered, not left waiting for the next
        // election.
        let mut owner = test_owner();
        assert!(owner.replica.is_leader());
        owner.replica.read_index(7);
        let mut answered = false;
        for _ in 0..10 {
            let mut out = Vec::new();
            owner.replica.cycle(&mut out).await.unwrap();
            if out
                .iter()
                .any(|o| matches!(o, crate::replication::Output::ReadReady { token: 7 }))
            {
                answered = true;
                break;
            }
        }
        assert!(answered, "the read was dropped");
        // Held reads go with the others when the lead is lost.
        let mut owner = test_owner();
        owner.replica.read_index(8);
        assert_eq!(owner.replica.drop_reads(), vec![8]);
    }

    #[test]
    fn losing_the_lead_answers_what_waited_for_it() {
        let mut owner = test_owner();
        owner.on_role(ReplicaRole::Leader, Some(1));
        let (reply, mut rx) = tokio::sync::oneshot::channel();
        owner.handle(Msg::Apply {
            command: Command::Tick,
            key: None,
            reply,
        });
        assert!(rx.try_recv().is_err(), "waits in the batch");
        owner.on_role(ReplicaRole::Follower, None);
        assert!(!owner.leading);
        assert!(owner.batch.is_empty());
        let status = rx.try_recv().unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
    }
}
