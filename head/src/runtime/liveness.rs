//! [`Liveness`]: the leader's decisions about whether its workers are alive, with the time
//! passed in: when a worker was last heard, which heartbeat renews its lease, when a node is
//! declared lost, the full timeout every live node gets when a replica takes over, and the
//! nodes whose stream this leadership may take.
//!
//! It reads no clock and runs no task: the owner (`workers.rs`, `owner/`) passes the time since
//! an origin of its own, and the deterministic simulation (`escher-sim`) passes its simulated
//! time, so both run these rules and a bug in them is found seed by seed.
//!
//! The rules (DESIGN §13, `workers.rs`'s "Leases"):
//!
//! - any message of a live node's worker restarts its clock ([`Liveness::heard`]); a node
//!   declared lost is ignored (its tasks were retried already), and the worker must register
//!   again;
//! - a heartbeat renews the worker's lease unless the replica cannot lead now (its disk is
//!   full in a group: the others may elect another leader meanwhile, which would declare the
//!   node lost while this lease kept its tasks running); the lease runs for
//!   [`Liveness::lease`] of the heartbeat timeout from when the worker sent the heartbeat (the
//!   worker's fence measures it);
//! - a live node silent for longer than the heartbeat timeout, or whose stream overflowed
//!   longer ago than that, is declared lost, on this replica's own clock
//!   ([`Liveness::tick`]), never while the replica cannot lead now;
//! - a replica that takes over the lead gives every live node a full heartbeat timeout
//!   ([`Liveness::lead`]), so it honours the leases its predecessor granted; a node it learns
//!   of later (a log replayed) gets one too ([`Liveness::adopt`]);
//! - a stream is taken only for a node whose registration this leadership answered
//!   ([`Liveness::registered`], [`Liveness::registered_here`]);
//! - a removal names the registration it was judged on ([`removal`]): applied after the
//!   node's worker registered again, it changes nothing, and the node is no longer declared.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use escher_proto::types::NodeId;

use crate::replication::JUDGED_REMOVAL_FORMAT;
use crate::state::{ClusterState, Command};

/// The command that removes `node`, judged on its registration in `state` (declared lost, or
/// its drained worker gone), for a group that writes data format `writes`: from
/// [`JUDGED_REMOVAL_FORMAT`] on it names that registration, so that it changes nothing once
/// the node's worker registered again (`escher_core::state` `registrations.rs`); before, it
/// is the plain `RemoveNode` every release reads.
pub fn removal(state: &ClusterState, node: NodeId, reason: String, writes: u16) -> Command {
    if writes >= JUDGED_REMOVAL_FORMAT {
        Command::RemoveJudgedNode {
            node,
            registration: state.registration(node),
            reason,
        }
    } else {
        Command::RemoveNode { node, reason }
    }
}

/// What the leader makes of a message from a node's worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard {
    /// The node was declared lost (or is unknown): nothing of its stream counts, and its
    /// worker must register again.
    Ignored,
    /// Its clock restarts; `renew`: whether a heartbeat renews its lease (not while the
    /// replica cannot lead now).
    Noted {
        /// Whether a heartbeat is answered with a lease.
        renew: bool,
    },
}

/// The leader's clocks about its workers. See the [module documentation](self).
#[derive(Debug, Default, Clone)]
pub struct Liveness {
    /// When each node's worker was last heard.
    last_seen: BTreeMap<NodeId, Duration>,
    /// Nodes whose stream filled up, and when: declared lost a heartbeat timeout later
    /// unless they attach again.
    overflowed: BTreeMap<NodeId, Duration>,
    /// Nodes whose registration this leadership answered.
    registered: BTreeSet<NodeId>,
    /// Nodes this leadership declared lost, when, and the registration judged (its number, if
    /// it has one), whose removal has not applied yet: such a node gets no lease and no stream
    /// until it has, or until the node registered again (see [`Liveness::tick`]).
    declared: BTreeMap<NodeId, (Duration, Option<u64>)>,
}

impl Liveness {
    /// The lease a heartbeat grants, for a heartbeat timeout of `timeout`: half of it (at
    /// least 50 ms), as the worker's fence takes it.
    pub fn lease(timeout: Duration) -> Duration {
        (timeout / 2).max(Duration::from_millis(50))
    }

    /// This replica took over the lead at `now`: it forgets what it knew and every live node
    /// gets a full heartbeat timeout from now.
    pub fn lead(&mut self, state: &ClusterState, now: Duration) {
        self.clear();
        self.adopt(state, now);
    }

    /// Starts the clock of every live node that has none, at `now`.
    pub fn adopt(&mut self, state: &ClusterState, now: Duration) {
        for node in state.live_nodes() {
            self.last_seen.entry(node).or_insert(now);
        }
    }

    /// Forgets everything (this replica stopped leading, or lets its workers go).
    pub fn clear(&mut self) {
        self.last_seen.clear();
        self.overflowed.clear();
        self.registered.clear();
        self.declared.clear();
    }

    /// This leadership answered `node`'s registration at `now`: its stream is taken here, and
    /// its clock restarts.
    pub fn registered(&mut self, node: NodeId, now: Duration) {
        self.registered.insert(node);
        self.seen(node, now);
    }

    /// Whether this leadership answered `node`'s registration and has not forgotten the node
    /// since: else its stream is refused, and the worker registers again.
    pub fn registered_here(&self, node: NodeId) -> bool {
        self.registered.contains(&node) && !self.declared.contains_key(&node)
    }

    /// `node`'s stream opened at `now`: its clock restarts, an overflow is forgotten.
    pub fn attached(&mut self, node: NodeId, now: Duration) {
        self.seen(node, now);
        self.overflowed.remove(&node);
    }

    /// `node`'s worker was heard at `now`.
    pub fn seen(&mut self, node: NodeId, now: Duration) {
        self.last_seen.insert(node, now);
    }

    /// A message of `node`'s worker arrived at `now`, at a replica that leads (`cannot_lead`:
    /// but whose disk is full in a group). See [`Heard`].
    pub fn heard(
        &mut self,
        state: &ClusterState,
        node: NodeId,
        now: Duration,
        cannot_lead: bool,
    ) -> Heard {
        if !state.node_alive(node) || self.declared.contains_key(&node) {
            return Heard::Ignored;
        }
        self.seen(node, now);
        Heard::Noted {
            renew: !cannot_lead,
        }
    }

    /// `node`'s stream filled up at `now` (its worker does not read it): unless it attaches
    /// again, the node is declared lost a heartbeat timeout later.
    pub fn overflowed(&mut self, node: NodeId, now: Duration) {
        self.overflowed.entry(node).or_insert(now);
    }

    /// Forgets a node that left or was declared lost.
    pub fn forget(&mut self, node: NodeId) {
        self.last_seen.remove(&node);
        self.overflowed.remove(&node);
        self.registered.remove(&node);
    }

    /// The leader's periodic check at `now`: the live nodes to declare lost (silent for longer
    /// than `timeout`, or overflowed longer ago than that), in node order, each forgotten as
    /// it is returned. Every live node without a clock gets one first; a replica that cannot
    /// lead now (`cannot_lead`) declares nothing.
    ///
    /// A node declared lost stays declared until its removal applies: its worker may register
    /// again (a `RejoinNode` proposed before the removal and applied first), but the removal
    /// still applies after it and retries the node's tasks elsewhere, so this leadership
    /// renews no lease of that node and takes no stream of it until then (its messages are
    /// ignored; its worker registers again once the node is gone). Were the lease renewed, the
    /// worker would run what its registration's reconcile sent while the removal gave the same
    /// task to another node (found by the simulation, seed 2141). A removal that names the
    /// registration it judged ([`removal`]) changes nothing once the node registered again:
    /// then the node is no longer declared, and the new registration's worker is heard, leased
    /// and streamed as any. A removal that has not applied a heartbeat timeout after it was
    /// declared (its proposal lost) is declared again.
    pub fn tick(
        &mut self,
        state: &ClusterState,
        timeout: Duration,
        now: Duration,
        cannot_lead: bool,
    ) -> Vec<NodeId> {
        if cannot_lead {
            return Vec::new();
        }
        self.declared.retain(|node, (_, judged)| {
            state.node_alive(*node) && state.registration(*node) == *judged
        });
        let mut silent: Vec<NodeId> = Vec::new();
        for (node, (at, _)) in &mut self.declared {
            if now.saturating_sub(*at) > timeout {
                *at = now;
                silent.push(*node);
            }
        }
        for node in state.live_nodes() {
            if !self.declared.contains_key(&node) {
                self.last_seen.entry(node).or_insert(now);
            }
        }
        silent.extend(
            self.last_seen
                .iter()
                .filter(|(n, seen)| now.saturating_sub(**seen) > timeout && state.node_alive(**n))
                .map(|(n, _)| *n),
        );
        self.overflowed.retain(|node, since| {
            if now.saturating_sub(*since) <= timeout {
                return true;
            }
            if state.node_alive(*node) && !silent.contains(node) {
                silent.push(*node);
            }
            false
        });
        silent.sort();
        silent.dedup();
        for node in &silent {
            self.forget(*node);
            let judged = state.registration(*node);
            self.declared.entry(*node).or_insert((now, judged));
        }
        silent
    }

    /// How many nodes have a clock.
    pub fn len(&self) -> usize {
        self.last_seen.len()
    }

    /// Whether no node has a clock.
    pub fn is_empty(&self) -> bool {
        self.last_seen.is_empty()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::state::{Command, Entry, Joining, Reply, SecretHash, StateConfig};

    const TIMEOUT: Duration = Duration::from_millis(2_000);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A named cluster with `n` live nodes (also `streams.rs`'s tests').
    pub(in crate::runtime) fn state_with(n: usize) -> (ClusterState, Vec<NodeId>) {
        let mut state = ClusterState::new(StateConfig::default());
        let init = Command::Init {
            cluster_id: "c".into(),
            task_key: "k".into(),
        };
        state.apply(Entry::new(1, init)).expect("named");
        let nodes = (0..n)
            .map(|i| {
                let worker = Joining {
                    name: format!("w{i}"),
                    address: String::new(),
                    resources: "cpu=1".parse().expect("a resource set"),
                    labels: Default::default(),
                    gpus: Vec::new(),
                    boot: 1,
                };
                let register = Command::RegisterNode {
                    worker,
                    secret: SecretHash::of("s"),
                };
                match state.apply(Entry::new(2, register)) {
                    Ok(Reply::Registered(node)) => node,
                    other => panic!("{other:?}"),
                }
            })
            .collect();
        (state, nodes)
    }

    fn declare_lost(state: &mut ClusterState, node: NodeId) {
        let remove = Command::RemoveNode {
            node,
            reason: "test".into(),
        };
        state.apply(Entry::new(3, remove)).expect("removed");
    }

    #[test]
    fn a_node_heard_within_the_timeout_is_not_declared_lost_and_one_silent_past_it_is_once() {
        let (state, nodes) = state_with(2);
        let mut live = Liveness::default();
        live.lead(&state, ms(0));
        assert_eq!(
            live.heard(&state, nodes[0], ms(1_500), false),
            Heard::Noted { renew: true }
        );
        // Exactly the timeout is not past it.
        assert!(live.tick(&state, TIMEOUT, ms(2_000), false).is_empty());
        assert_eq!(live.tick(&state, TIMEOUT, ms(2_001), false), vec![nodes[1]]);
        // Forgotten as it was returned: the next tick gives it a clock again (the state still
        // has it alive until the removal applies), and does not declare it twice at once.
        assert!(live.tick(&state, TIMEOUT, ms(2_002), false).is_empty());
        assert_eq!(live.tick(&state, TIMEOUT, ms(3_501), false), vec![nodes[0]]);
    }

    #[test]
    fn a_new_leader_gives_every_live_node_a_full_timeout_from_when_it_took_over() {
        let (state, nodes) = state_with(2);
        let mut live = Liveness::default();
        live.lead(&state, ms(0));
        live.seen(nodes[0], ms(100));
        // Another leadership later: what the first one heard does not count, nor against.
        live.lead(&state, ms(10_000));
        assert!(live.tick(&state, TIMEOUT, ms(11_999), false).is_empty());
        assert_eq!(
            live.tick(&state, TIMEOUT, ms(12_001), false),
            vec![nodes[0], nodes[1]]
        );
    }

    #[test]
    fn a_replica_that_cannot_lead_now_renews_no_lease_and_declares_nothing() {
        let (state, nodes) = state_with(1);
        let mut live = Liveness::default();
        live.lead(&state, ms(0));
        assert_eq!(
            live.heard(&state, nodes[0], ms(500), true),
            Heard::Noted { renew: false }
        );
        assert!(live.tick(&state, TIMEOUT, ms(60_000), true).is_empty());
        // The clock ran on while it could not lead: declared once it can.
        assert_eq!(
            live.tick(&state, TIMEOUT, ms(60_000), false),
            vec![nodes[0]]
        );
    }

    #[test]
    fn a_node_declared_lost_is_ignored() {
        let (mut state, nodes) = state_with(1);
        let mut live = Liveness::default();
        live.lead(&state, ms(0));
        declare_lost(&mut state, nodes[0]);
        assert_eq!(live.heard(&state, nodes[0], ms(10), false), Heard::Ignored);
        // Nor declared again.
        assert!(live.tick(&state, TIMEOUT, ms(10_000), false).is_empty());
    }

    #[test]
    fn an_overflowed_stream_is_declared_lost_a_timeout_later_unless_it_attaches_again() {
        let (state, nodes) = state_with(2);
        let mut live = Liveness::default();
        live.lead(&state, ms(0));
        live.overflowed(nodes[0], ms(100));
        live.overflowed(nodes[1], ms(100));
        live.attached(nodes[1], ms(200));
        for at in (300..=2_100).step_by(100) {
            // Both keep heartbeating: only the overflow counts against node 0.
            live.seen(nodes[0], ms(at));
            live.seen(nodes[1], ms(at));
            let lost = live.tick(&state, TIMEOUT, ms(at), false);
            assert!(lost.is_empty(), "at {at}: {lost:?}");
        }
        assert_eq!(live.tick(&state, TIMEOUT, ms(2_101), false), vec![nodes[0]]);
    }

    #[test]
    fn a_stream_is_taken_only_in_the_leadership_that_answered_the_registration() {
        let (state, nodes) = state_with(1);
        let mut live = Liveness::default();
        live.lead(&state, ms(0));
        assert!(!live.registered_here(nodes[0]));
        live.registered(nodes[0], ms(1_900));
        assert!(live.registered_here(nodes[0]));
        // The registration's answer restarted the clock.
        assert!(live.tick(&state, TIMEOUT, ms(3_000), false).is_empty());
        live.lead(&state, ms(3_000));
        assert!(!live.registered_here(nodes[0]));
        live.registered(nodes[0], ms(3_100));
        live.forget(nodes[0]);
        assert!(!live.registered_here(nodes[0]));
    }

    /// Seed 2141 of the simulation: a node declared lost whose worker registers again before
    /// the removal applies must not be leased or streamed to, since the removal still applies
    /// after the registration and retries its tasks elsewhere.
    #[test]
    fn a_node_declared_lost_gets_no_lease_or_stream_until_its_removal_applies() {
        let (mut state, nodes) = state_with(2);
        let mut live = Liveness::default();
        live.lead(&state, ms(0));
        live.heard(&state, nodes[0], ms(1_900), false);
        assert_eq!(live.tick(&state, TIMEOUT, ms(2_001), false), vec![nodes[1]]);
        // Its worker registers again and the registration is answered here (the RejoinNode
        // applied before the RemoveNode): still no stream, no lease.
        live.registered(nodes[1], ms(2_010));
        assert!(!live.registered_here(nodes[1]));
        assert_eq!(
            live.heard(&state, nodes[1], ms(2_020), false),
            Heard::Ignored
        );
        // Not declared twice while its removal may still apply.
        assert!(live.tick(&state, TIMEOUT, ms(2_500), false).is_empty());
        // A removal that never applied is declared again a timeout later.
        live.heard(&state, nodes[0], ms(3_900), false);
        assert_eq!(live.tick(&state, TIMEOUT, ms(4_002), false), vec![nodes[1]]);
        // Once it applied, the node is gone and nothing of it is kept.
        declare_lost(&mut state, nodes[1]);
        assert!(live.tick(&state, TIMEOUT, ms(4_100), false).is_empty());
        assert!(live.declared.is_empty());
        assert_eq!(
            live.heard(&state, nodes[0], ms(4_200), false),
            Heard::Noted { renew: true }
        );
    }

    /// The same race, with the removal that names the registration it judged: once the node's
    /// worker registered again, the removal changes nothing, and the new registration is
    /// heard, leased and streamed to as any.
    #[test]
    fn a_node_that_registered_again_after_it_was_declared_lost_is_no_longer_declared() {
        let (mut state, nodes) = state_with(1);
        let node = nodes[0];
        let mut live = Liveness::default();
        live.lead(&state, ms(0));
        assert_eq!(live.tick(&state, TIMEOUT, ms(2_001), false), vec![node]);
        let remove = removal(&state, node, "test".into(), JUDGED_REMOVAL_FORMAT);
        let plain = removal(&state, node, "test".into(), JUDGED_REMOVAL_FORMAT - 1);
        assert!(matches!(plain, Command::RemoveNode { .. }), "{plain:?}");
        // The worker's registration applies before the removal, and is answered here.
        let back = crate::state::Returning {
            cluster: "c".into(),
            node,
            secret: SecretHash::of("s"),
            running: Vec::new(),
            finished: Vec::new(),
        };
        let worker = Joining {
            name: "w0".into(),
            address: String::new(),
            resources: "cpu=1".parse().expect("a resource set"),
            labels: Default::default(),
            gpus: Vec::new(),
            boot: 1,
        };
        let rejoin = Command::RejoinNode { worker, back };
        state.apply(Entry::new(3, rejoin)).expect("registered");
        live.registered(node, ms(2_010));
        state.apply(Entry::new(4, remove)).expect("applied");
        assert!(
            state.node_alive(node),
            "the removal judged another registration"
        );
        // The next tick forgets the declaration: the node is streamed to and leased.
        assert!(live.tick(&state, TIMEOUT, ms(2_020), false).is_empty());
        assert!(live.declared.is_empty());
        assert!(live.registered_here(node));
        assert_eq!(
            live.heard(&state, node, ms(2_030), false),
            Heard::Noted { renew: true }
        );
    }

    #[test]
    fn the_lease_is_half_the_timeout() {
        assert_eq!(Liveness::lease(TIMEOUT), ms(1_000));
        assert_eq!(Liveness::lease(ms(40)), ms(50));
    }
}
