//! [`SimReplica`]: one real `Replica` driven by hand, for the deterministic simulation of a
//! replica group (`escher-sim`, docs/RELIABILITY.md).
//!
//! It is the replica the head runs, over a [`SimDisk`] (the simulation's disk: torn and lost
//! writes, a full disk, fsyncs that end when the simulation says), with its transport captured
//! (`Transport::captured`): raft's messages are handed to the caller instead of sent, so the
//! caller decides when, whether and how often each arrives. Nothing here starts a task, opens a
//! socket or reads a clock: a cycle's writes run inline (the simulated disk never blocks: the
//! caller decides when its fsync ends, [`SimDisk::settle`], and holds back what the cycle
//! produced until then), the time a full disk's retries are measured by is the caller's
//! ([`SimReplica::set_clock`]), and the election timeouts raft would draw from its thread's
//! random generator are chosen by the caller ([`SimReplica::pin_election_timeout`]).

use std::collections::BTreeMap;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use escher_proto::types::{HeadChange, RequestKey};
use raft::StateRole;
use raft::eraftpb::Message;

use super::SimDisk;
use super::codec;
use super::config::ReplicaConfig;
use super::replica::{NotAccepted, Output, Persistence, Replica, ReplicationError};
use super::transport::Transport;
use crate::scheduler::Millis;
use crate::state::{ApplyError, ClusterState, Command, Effect, Reply, StateConfig};

/// What one cycle of a [`SimReplica`] did, in order.
#[derive(Debug)]
pub enum SimOutput {
    /// A raft entry was applied: one result per command, in proposal order.
    Applied {
        /// Its log index.
        index: u64,
        /// Its term.
        term: u64,
        /// What applying each command returned.
        results: Vec<Result<Reply, ApplyError>>,
        /// What the commands asked the runtime to do (assignments and cancellations for the
        /// workers, ...), in order: the head's owner performs them only while it leads.
        effects: Vec<Effect>,
        /// The events the commands recorded (for watchers), in order.
        events: Vec<escher_proto::types::WatchEvent>,
    },
    /// An entry with nothing to apply (a new leader's first), or a membership change: a
    /// proposal waiting at this index was not applied.
    Empty {
        /// Its log index.
        index: u64,
        /// Its term.
        term: u64,
    },
    /// A membership change was applied (`Ok`) or refused by raft: a client's proposal waiting at
    /// this index was not applied.
    Membership {
        /// Its log index.
        index: u64,
        /// Its term.
        term: u64,
        /// Whether it took effect.
        result: Result<(), String>,
    },
    /// The role or the leader changed.
    Role {
        /// Whether this replica leads now.
        leading: bool,
        /// The leader, if known.
        leader: Option<u64>,
    },
    /// A leader's snapshot replaced the whole state.
    Restored,
    /// The log's disk is full (`Some`, why) and raft waits for it; `None`: its writes went
    /// through.
    DiskFull(Option<String>),
}

/// One replica of a simulated group. See the [module documentation](self).
#[derive(Debug)]
pub struct SimReplica {
    replica: Replica<SimDisk>,
}

impl SimReplica {
    /// Opens replica `id` of the group whose replicas are `voters`, over `log`: a fresh log
    /// starts the group, one with entries resumes from them (a restart).
    /// `snapshot_bytes` is the log size that triggers a snapshot (small, to exercise them).
    pub fn open(
        id: u64,
        voters: &[u64],
        log: SimDisk,
        state_config: StateConfig,
        snapshot_bytes: u64,
    ) -> Result<SimReplica, ReplicationError> {
        let peers: BTreeMap<u64, String> = voters.iter().map(|v| (*v, address(*v))).collect();
        let mut config = ReplicaConfig::member(id, peers, Some("sim".to_string()))
            .map_err(|e| ReplicationError::Restore(e.to_string()))?;
        config.snapshot_bytes = snapshot_bytes;
        let transport = Transport::captured(id, &config.group, &config.address);
        let replica = Replica::open(
            config,
            log,
            state_config,
            transport,
            Persistence::Inline,
            false,
            None,
        )?;
        Ok(SimReplica { replica })
    }

    /// Opens replica `id` to join a running group (`escher-head --join`): an empty log waits
    /// for a leader that added it; a log with entries resumes from them.
    pub fn join(
        id: u64,
        log: SimDisk,
        state_config: StateConfig,
        snapshot_bytes: u64,
    ) -> Result<SimReplica, ReplicationError> {
        let peers = BTreeMap::from([(id, address(id))]);
        let mut config = ReplicaConfig::member(id, peers, Some("sim".to_string()))
            .map_err(|e| ReplicationError::Restore(e.to_string()))?;
        config.join = true;
        config.snapshot_bytes = snapshot_bytes;
        let transport = Transport::captured(id, &config.group, &config.address);
        let replica = Replica::open(
            config,
            log,
            state_config,
            transport,
            Persistence::Inline,
            false,
            None,
        )?;
        Ok(SimReplica { replica })
    }

    /// The last write of its log, if the log lost it at open though it may have been
    /// acknowledged (a cut tail, `SimDisk::crash_cut`): what the head's owner reads at start to
    /// skip the ids it may have given out once it leads (`Command::SkipIds`).
    pub fn lost_tail(&self) -> Option<crate::replication::LostTail> {
        self.replica.lost_tail()
    }

    /// Proposes a membership change, as `escher heads add|remove` has the leader do (see
    /// `Replica::propose_change`): its index and term.
    pub fn propose_change(&mut self, change: &HeadChange) -> Result<(u64, u64), NotAccepted> {
        self.replica.propose_change(change)
    }

    /// Starts handing the lead to the most up-to-date other voter, as a head asked to stop
    /// (`SIGTERM`) does before it stops (`Replica::hand_over`): the replica chosen, or `None`
    /// when this one does not lead or leads alone. The head then stops once it no longer leads,
    /// or after [`SimReplica::hand_over_wait`] at most.
    pub fn hand_over(&mut self) -> Option<u64> {
        self.replica.hand_over()
    }

    /// How long (milliseconds) a stopping head waits for its hand-over before it stops anyway:
    /// an election timeout, after which raft-rs gives the transfer up too.
    pub fn hand_over_wait() -> Millis {
        let election =
            super::DEFAULT_TICK * u32::try_from(super::DEFAULT_ELECTION_TICKS).unwrap_or(u32::MAX);
        u64::try_from(election.as_millis()).unwrap_or(u64::MAX)
    }

    /// The group's voters as this replica's raft has them.
    pub fn members(&self) -> Vec<u64> {
        self.replica.raft().prs().conf().to_conf_state().voters
    }

    /// Sets the simulated time (milliseconds) a full disk's stall and retries are measured by.
    pub fn set_clock(&mut self, now: Millis) {
        self.replica
            .set_stall_clock(std::time::Duration::from_millis(now));
    }

    /// Whether the log's disk is full and raft waits for it (proposals are refused, ticks and
    /// messages dropped, as in the head).
    pub fn stalled(&self) -> bool {
        self.replica.stalled()
    }

    /// Proposes `commands` as one raft entry stamped `now` (see `Replica::propose`).
    pub fn propose(
        &mut self,
        commands: Vec<(Command, Option<RequestKey>)>,
        now: Millis,
    ) -> Result<(u64, u64), NotAccepted> {
        self.replica.propose(commands, now)
    }

    /// The data format this replica writes now (the newest every member reads).
    pub fn writes_format(&mut self) -> u16 {
        self.replica.writes_format()
    }

    /// Hands raft messages from replica `from` to this one.
    pub fn step(&mut self, from: u64, messages: Vec<Message>) {
        let format = u32::from(codec::newest_readable());
        self.replica.step(from, &address(from), format, messages);
    }

    /// One raft tick.
    pub fn tick(&mut self) {
        self.replica.tick();
    }

    /// Tells raft that a message to `to` was lost.
    pub fn unreachable(&mut self, to: u64) {
        self.replica
            .on_transport(super::transport::TransportEvent::Unreachable(to));
    }

    /// Tells raft whether a snapshot sent to `to` arrived (the real transport reports the end
    /// of each snapshot's call): raft sends no other until it is told.
    pub fn snapshot_sent(&mut self, to: u64, delivered: bool) {
        self.replica
            .on_transport(super::transport::TransportEvent::Snapshot { to, delivered });
    }

    /// Runs one ready cycle to its end and returns what it did.
    pub fn cycle(&mut self) -> Result<Vec<SimOutput>, ReplicationError> {
        let mut out = Vec::new();
        {
            let mut cycle = pin!(self.replica.cycle(&mut out));
            let mut cx = Context::from_waker(Waker::noop());
            match cycle.as_mut().poll(&mut cx) {
                Poll::Ready(result) => result?,
                Poll::Pending => {
                    return Err(ReplicationError::Interrupted(
                        "a cycle over a log in memory waited, which it never should".into(),
                    ));
                }
            }
        }
        Ok(out.into_iter().filter_map(simplify).collect())
    }

    /// The messages raft wants sent since the last call, in order.
    pub fn take_messages(&mut self) -> Vec<Message> {
        self.replica.take_captured()
    }

    /// Sets raft's election timeout to `salt` brought into its range (the election ticks up to
    /// twice as many), replacing the one raft drew from its thread's random generator.
    pub fn pin_election_timeout(&mut self, salt: usize) {
        self.replica.set_election_timeout(salt);
    }

    /// The replicated state.
    pub fn state(&self) -> &ClusterState {
        self.replica.state()
    }

    /// Whether this replica leads now.
    pub fn is_leader(&self) -> bool {
        self.replica.raft().state == StateRole::Leader
    }

    /// The leader this replica knows of, if any.
    pub fn leader(&self) -> Option<u64> {
        let leader = self.replica.raft().leader_id;
        (leader != 0).then_some(leader)
    }

    /// raft's current term here.
    pub fn term(&self) -> u64 {
        self.replica.raft().term
    }

    /// The index of the last entry applied to the state.
    pub fn applied(&self) -> u64 {
        self.replica.raft().raft_log.applied
    }

    /// The commit index known here.
    pub fn committed(&self) -> u64 {
        self.replica.raft().raft_log.committed
    }
}

/// The address replica `id` has in a simulated group (it is never dialled).
fn address(id: u64) -> String {
    format!("sim-{id}:7600")
}

fn simplify(output: Output) -> Option<SimOutput> {
    Some(match output {
        Output::Applied {
            index,
            term,
            results,
        } => {
            let mut effects = Vec::new();
            let mut events = Vec::new();
            let results = results
                .into_iter()
                .map(|a| {
                    effects.extend(a.effects);
                    events.extend(a.events.into_iter().map(|r| r.event));
                    a.result
                })
                .collect();
            SimOutput::Applied {
                index,
                term,
                results,
                effects,
                events,
            }
        }
        Output::ConfChanged {
            index,
            term,
            result,
        } => SimOutput::Membership {
            index,
            term,
            result,
        },
        Output::Empty { index, term } => SimOutput::Empty { index, term },
        Output::Role { role, leader } => SimOutput::Role {
            leading: role == escher_proto::types::ReplicaRole::Leader,
            leader,
        },
        Output::Restored => SimOutput::Restored,
        Output::DiskFull(why) => SimOutput::DiskFull(why),
        Output::ReadReady { .. } => return None,
    })
}
