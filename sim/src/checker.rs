//! [`Checker`]: the properties every run must keep.
//!
//! - after every cycle that applied entries, on every replica, the state's own invariants hold
//!   (the scheduler's `sanity_check`; a cycle applies every entry that committed, and the state
//!   is seen after it);
//! - replicas agree: the same entry at the same index gives the same results everywhere; at
//!   every 16th index a cycle ends on, the whole state's fingerprint is the same on every
//!   replica there; at the end of the run every replica's is;
//! - at the end: every acknowledged write is in the state exactly once (a submit's tasks, each
//!   by its unique name, under the ids its reply gave; a resource set, on its node), a write
//!   with an unknown outcome is there at most once, and no task id was handed to two tasks.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use escher_core::state::{ClusterState, Reply};

use crate::client::{Client, Intent};

/// Collects the violations of one run. See the [module documentation](self).
#[derive(Debug, Default)]
pub struct Checker {
    /// The first replica to apply each index, and a digest of what applying it returned.
    results: BTreeMap<u64, (u64, u64)>,
    /// The first replica to reach each sampled index, and the state's fingerprint there.
    fingerprints: BTreeMap<u64, (u64, u64)>,
    /// What went wrong, in the order it was seen.
    pub violations: Vec<String>,
    /// Nodes whose worker restarted or that a leader declared lost: their registration again
    /// replaces the resources set on them, so an acknowledged resource write need not be there.
    pub reset_nodes: std::collections::BTreeSet<escher_proto::types::NodeId>,
}

/// Every this many indexes the whole state is compared.
const SAMPLE: u64 = 16;

impl Checker {
    /// Replica `replica` applied the entry at `index`, whose commands returned `results`
    /// (their debug text), in a cycle that left its state `state` at applied index `last`
    /// (a cycle applies every entry that committed; the state is seen after it).
    pub fn applied(
        &mut self,
        replica: u64,
        index: u64,
        last: u64,
        results: &str,
        state: &ClusterState,
    ) {
        if index != last {
            // The state is seen once per cycle, at its last entry.
            self.record(replica, index, results);
            return;
        }
        if let Err(why) = state.core().sanity_check() {
            self.violations.push(format!(
                "replica {replica}: the state's invariants broke at index {index}: {why}"
            ));
        }
        self.record(replica, index, results);
        if index.is_multiple_of(SAMPLE) {
            self.compare(replica, index, state);
        }
    }

    /// Checks what applying `index` returned against the first replica that applied it.
    fn record(&mut self, replica: u64, index: u64, results: &str) {
        let digest = hash(results);
        match self.results.get(&index) {
            Some((first, seen)) if *seen != digest => self.violations.push(format!(
                "replicas {first} and {replica} applied index {index} with different results"
            )),
            Some(_) => {}
            None => {
                self.results.insert(index, (replica, digest));
            }
        }
    }

    /// Compares `state`, as replica `replica` has it at `index`, with the first replica's there.
    pub fn compare(&mut self, replica: u64, index: u64, state: &ClusterState) {
        let print = fingerprint(state);
        match self.fingerprints.get(&index) {
            Some((first, seen)) if *seen != print => self.violations.push(format!(
                "replicas {first} and {replica} differ in state at applied index {index}"
            )),
            Some(_) => {}
            None => {
                self.fingerprints.insert(index, (replica, print));
            }
        }
    }

    /// The end-of-run checks against the final committed state.
    pub fn finish(&mut self, clients: &[Client], state: &ClusterState) {
        let mut by_name: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for id in state.task_ids() {
            if let Some(task) = state.task(id) {
                by_name
                    .entry(task.spec.name.as_str())
                    .or_default()
                    .push(id.0);
            }
        }
        for (name, ids) in &by_name {
            if ids.len() > 1 {
                self.violations.push(format!(
                    "task {name} is in the state {} times: ids {ids:?}",
                    ids.len()
                ));
            }
        }
        let status = state.cluster_status();
        let mut owner: BTreeMap<u64, u64> = BTreeMap::new();
        for client in clients {
            for id in &client.ids {
                if let Some(other) = owner.insert(id.0, client.id) {
                    self.violations.push(format!(
                        "task id {} was given to clients {other} and {} (or twice)",
                        id.0, client.id
                    ));
                }
            }
            for answered in &client.answered {
                let Ok(reply) = &answered.reply else { continue };
                match (&answered.write.intent, reply) {
                    (Intent::Submit(names), Reply::Submitted(ids)) => {
                        if names.len() != ids.len() {
                            self.violations.push(format!(
                                "a submit of {} tasks was acknowledged with {} ids",
                                names.len(),
                                ids.len()
                            ));
                        }
                        for (name, id) in names.iter().zip(ids) {
                            match by_name.get(name.as_str()) {
                                Some(held) if held == &[id.0] => {}
                                Some(held) => self.violations.push(format!(
                                    "acknowledged task {name} got id {} but the state has it \
                                     under {held:?}",
                                    id.0
                                )),
                                None => self.violations.push(format!(
                                    "acknowledged task {name} (id {}) is not in the state",
                                    id.0
                                )),
                            }
                        }
                    }
                    (Intent::SetResource { node, .. }, Reply::ResourcesSet(_))
                        if self.reset_nodes.contains(node) => {}
                    (Intent::SetResource { marker, node }, Reply::ResourcesSet(_)) => {
                        let there = status
                            .nodes
                            .iter()
                            .any(|n| n.id == *node && n.resource(marker).is_some());
                        if !there {
                            self.violations.push(format!(
                                "acknowledged resource {marker} is not on node {}",
                                node.0
                            ));
                        }
                    }
                    (
                        Intent::Init
                        | Intent::Register
                        | Intent::Attach { .. }
                        | Intent::Report { .. },
                        _,
                    ) => {}
                    (intent, reply) => self
                        .violations
                        .push(format!("{intent:?} was answered with {reply:?}")),
                }
            }
        }
    }
}

/// A digest of text, the same in every run.
pub fn hash(text: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}

/// A fingerprint of everything the state's queries show: each task's name and status, each
/// node and its resources, the cluster's counts. Built from queries (ordered by id), not from
/// the state's encoding, whose hash maps iterate in an order that depends on their history.
pub fn fingerprint(state: &ClusterState) -> u64 {
    let mut hasher = DefaultHasher::new();
    for id in state.task_ids() {
        if let Some(task) = state.task(id) {
            task.spec.name.hash(&mut hasher);
        }
        format!("{:?}", state.status(id)).hash(&mut hasher);
    }
    let mut status = state.cluster_status();
    for node in &mut status.nodes {
        // The scheduler lists a node's resources in its hash map's order.
        node.resources
            .sort_by(|x, y| x.name.as_str().cmp(y.name.as_str()));
    }
    format!("{status:?} {:?}", state.cluster_id()).hash(&mut hasher);
    hasher.finish()
}
