//! The journal's bookkeeping, with no I/O: which ephemeral resources the application created
//! where, what their users need, and, given a cluster status, the changes that put lost
//! resources back ([`Ledger::plan`]).

use std::collections::{BTreeMap, BTreeSet};

use escher_proto::types::{
    Amount, Capacity, CapacityOp, ClusterStatus, NodeId, NodeSpec, NodeStatus, ResourceName,
    ResourceSet, ResourceUpdate, TaskSpec,
};

/// Where a journaled resource is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// On the node it was created on.
    Home,
    /// On another node while its home is gone; `created` if the journal created it there
    /// (and so removes it when the home returns), `false` if the node had it already.
    StandIn {
        /// The node standing in.
        node: NodeId,
        /// Whether the journal created it there.
        created: bool,
    },
    /// Its home is gone and no eligible node was found yet.
    Waiting,
    /// Its home is gone and its `Match` spec was applied again on the nodes matching now.
    Reapplied,
}

/// One journaled resource on one node: what the application set, and where it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The resource.
    pub name: ResourceName,
    /// Its capacity on that node (net of later adjustments).
    pub capacity: Capacity,
    /// The node spec of the call that created it.
    pub spec: NodeSpec,
    /// The node it was created on (the returned node's id, once a lost home comes back).
    pub home: NodeId,
    /// Where it is now.
    pub place: Place,
}

impl Entry {
    /// The node that holds it now, if any.
    pub fn location(&self) -> Option<NodeId> {
        match self.place {
            Place::Home => Some(self.home),
            Place::StandIn { node, .. } => Some(node),
            Place::Waiting | Place::Reapplied => None,
        }
    }
}

/// What the journal did about a node that went away or came back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    /// The node holding `name` is gone.
    Lost {
        /// The resource.
        name: ResourceName,
        /// The node that held it.
        node: NodeId,
    },
    /// `name` was created again on `to` in place of `from`.
    Replayed {
        /// The resource.
        name: ResourceName,
        /// The lost node.
        from: NodeId,
        /// The node standing in.
        to: NodeId,
    },
    /// The lost node came back (as `node`, a new id with the old name) and got `name` back.
    Restored {
        /// The resource.
        name: ResourceName,
        /// The returned node.
        node: NodeId,
        /// The id it had before.
        previous: NodeId,
        /// The stand-in the journal removed it from, if any.
        stand_in: Option<NodeId>,
    },
}

/// The journal's state.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ledger {
    /// By (resource, home).
    entries: BTreeMap<(ResourceName, NodeId), Entry>,
    /// What the tasks that require a resource also require (the most of each).
    needs: BTreeMap<ResourceName, ResourceSet>,
    /// Node names, as last seen.
    names: BTreeMap<NodeId, String>,
    /// Every node id seen so far; `None` before the first status.
    seen: Option<BTreeSet<NodeId>>,
    pub(crate) keep_stand_ins: bool,
}

/// Whether `node` holds `name` now (a non-zero capacity).
fn holds(node: &NodeStatus, name: &ResourceName) -> bool {
    node.resource(name.as_str())
        .is_some_and(|r| !r.total.is_zero())
}

/// Whether a spec means "every node" (a delete there drops every entry of the name).
fn everywhere(spec: &NodeSpec) -> bool {
    matches!(spec, NodeSpec::Match { resources, num_nodes: None } if resources.is_empty())
}

fn set(name: &ResourceName, capacity: Capacity, node: NodeId) -> ResourceUpdate {
    ResourceUpdate {
        name: name.clone(),
        op: CapacityOp::Set(capacity),
        target: NodeSpec::Node(node),
    }
}

impl Ledger {
    pub(crate) fn entries(&self) -> Vec<Entry> {
        self.entries.values().cloned().collect()
    }

    pub(crate) fn has_seen(&self) -> bool {
        self.seen.is_some()
    }

    /// Learns node names and ids.
    pub(crate) fn observe(&mut self, status: &ClusterStatus) {
        let seen = self.seen.get_or_insert_with(BTreeSet::new);
        for n in &status.nodes {
            self.names.insert(n.id, n.name.clone());
            seen.insert(n.id);
        }
    }

    /// Records a change the application made; the (resource, node) pairs whose new capacity
    /// it cannot know (an adjustment of a resource it did not create), to be read back.
    pub(crate) fn record(
        &mut self,
        u: &ResourceUpdate,
        nodes: &[NodeId],
    ) -> Vec<(ResourceName, NodeId)> {
        let mut unknown = Vec::new();
        match u.op {
            CapacityOp::Set(c) if !c.is_zero() => {
                for n in nodes {
                    let entry = Entry {
                        name: u.name.clone(),
                        capacity: c,
                        spec: u.target.clone(),
                        home: *n,
                        place: Place::Home,
                    };
                    self.entries.insert((u.name.clone(), *n), entry);
                }
            }
            CapacityOp::Set(_) | CapacityOp::Delete => {
                let all = everywhere(&u.target);
                self.entries.retain(|(name, _), e| {
                    name != &u.name || !(all || e.location().is_some_and(|l| nodes.contains(&l)))
                });
            }
            CapacityOp::Adjust(delta) => {
                for n in nodes {
                    let mut found = false;
                    let mut emptied = Vec::new();
                    for (key, e) in self.entries.iter_mut() {
                        if e.name != u.name || e.location() != Some(*n) {
                            continue;
                        }
                        found = true;
                        if let Capacity::Finite(total) = e.capacity {
                            match delta.apply_to(total) {
                                Ok(t) if t.is_zero() => emptied.push(key.clone()),
                                Ok(t) => e.capacity = Capacity::Finite(t),
                                Err(_) => unknown.push((u.name.clone(), *n)),
                            }
                        }
                    }
                    for key in emptied {
                        self.entries.remove(&key);
                    }
                    if !found {
                        unknown.push((u.name.clone(), *n));
                    }
                }
            }
        }
        unknown
    }

    /// Records `name`'s capacity on `node` as the cluster reports it (absent: forgotten).
    pub(crate) fn adopt(&mut self, name: &ResourceName, node: NodeId, total: Option<Capacity>) {
        let at = self
            .entries
            .iter()
            .find(|(_, e)| &e.name == name && e.location() == Some(node))
            .map(|(k, _)| k.clone());
        match (at, total) {
            (Some(key), Some(c)) if !c.is_zero() => {
                if let Some(e) = self.entries.get_mut(&key) {
                    e.capacity = c;
                }
            }
            (Some(key), _) => {
                self.entries.remove(&key);
            }
            (None, Some(c)) if !c.is_zero() => {
                let entry = Entry {
                    name: name.clone(),
                    capacity: c,
                    spec: NodeSpec::Node(node),
                    home: node,
                    place: Place::Home,
                };
                self.entries.insert((name.clone(), node), entry);
            }
            (None, _) => {}
        }
    }

    /// Remembers what a task requiring application resources also needs.
    pub(crate) fn note_task(&mut self, task: &TaskSpec) {
        for (name, _) in task.resources.iter().filter(|(n, _)| !n.is_physical()) {
            let need = self.needs.entry(name.clone()).or_default();
            for (other, amount) in task.resources.iter().filter(|(n, _)| *n != name) {
                if need.get(other.as_str()) < amount {
                    need.insert(other.clone(), amount);
                }
            }
        }
    }

    /// The changes that put back what lost nodes held, and what they mean; updates the ledger
    /// as if they were applied (the caller applies them, and keeps this ledger only if that
    /// succeeds).
    pub(crate) fn plan(&mut self, status: &ClusterStatus) -> (Vec<ResourceUpdate>, Vec<Recovery>) {
        let live: BTreeMap<NodeId, &NodeStatus> = status
            .nodes
            .iter()
            .filter(|n| n.alive)
            .map(|n| (n.id, n))
            .collect();
        let seen_before = self.seen.clone().unwrap_or_default();
        self.observe(status);
        let mut updates = Vec::new();
        let mut events = Vec::new();

        // 1. Lost homes that came back: a node never seen before, with the same name and a
        //    later id (the head never reuses ids), one returned node per lost home.
        let mut lost_homes: Vec<NodeId> = self
            .entries
            .values()
            .map(|e| e.home)
            .filter(|h| !live.contains_key(h))
            .collect();
        lost_homes.sort_unstable();
        lost_homes.dedup();
        let mut claimed = BTreeSet::new();
        for home in lost_homes {
            let Some(name) = self.names.get(&home) else {
                continue;
            };
            let back = live.keys().copied().find(|r| {
                *r > home
                    && !seen_before.contains(r)
                    && !claimed.contains(r)
                    && self.names.get(r) == Some(name)
            });
            if let Some(r) = back {
                claimed.insert(r);
                self.restore(home, r, &live, &mut updates, &mut events);
            }
        }

        // 2. Resources whose node is gone now wait.
        for e in self.entries.values_mut() {
            if let Some(at) = e.location().filter(|at| !live.contains_key(at)) {
                e.place = Place::Waiting;
                events.push(Recovery::Lost {
                    name: e.name.clone(),
                    node: at,
                });
            }
        }

        // 3. Waiting resources get a stand-in.
        self.replay(&live, &mut updates, &mut events);
        (updates, events)
    }

    /// Moves every entry of `home` to the returned node `back`.
    fn restore(
        &mut self,
        home: NodeId,
        back: NodeId,
        live: &BTreeMap<NodeId, &NodeStatus>,
        updates: &mut Vec<ResourceUpdate>,
        events: &mut Vec<Recovery>,
    ) {
        let keys: Vec<(ResourceName, NodeId)> = self
            .entries
            .keys()
            .filter(|(_, h)| *h == home)
            .cloned()
            .collect();
        for key in keys {
            let Some(mut e) = self.entries.remove(&key) else {
                continue;
            };
            updates.push(set(&e.name, e.capacity, back));
            let mut stand_in = None;
            if let Place::StandIn {
                node,
                created: true,
            } = e.place
                && live.contains_key(&node)
                && !self.keep_stand_ins
                && !self
                    .entries
                    .values()
                    .any(|o| o.name == e.name && o.location() == Some(node))
            {
                updates.push(ResourceUpdate {
                    name: e.name.clone(),
                    op: CapacityOp::Delete,
                    target: NodeSpec::Node(node),
                });
                stand_in = Some(node);
            }
            if e.spec == NodeSpec::Node(home) {
                e.spec = NodeSpec::Node(back);
            }
            e.home = back;
            e.place = Place::Home;
            events.push(Recovery::Restored {
                name: e.name.clone(),
                node: back,
                previous: home,
                stand_in,
            });
            self.entries.insert((e.name.clone(), back), e);
        }
    }

    /// Chooses stand-ins for the waiting entries.
    fn replay(
        &mut self,
        live: &BTreeMap<NodeId, &NodeStatus>,
        updates: &mut Vec<ResourceUpdate>,
        events: &mut Vec<Recovery>,
    ) {
        // (name, node) pairs placed in this pass, on top of what the nodes hold.
        let mut placed: BTreeSet<(ResourceName, NodeId)> = BTreeSet::new();
        let has = |placed: &BTreeSet<(ResourceName, NodeId)>, name: &ResourceName, n: NodeId| {
            placed.contains(&(name.clone(), n)) || live.get(&n).is_some_and(|s| holds(s, name))
        };
        let waiting: Vec<(ResourceName, NodeId)> = self
            .entries
            .iter()
            .filter(|(_, e)| e.place == Place::Waiting)
            .map(|(k, _)| k.clone())
            .collect();

        // Node (and Local) specs: one stand-in per lost home, so that what was together stays
        // together.
        let mut by_home: BTreeMap<NodeId, Vec<(ResourceName, NodeId)>> = BTreeMap::new();
        for key in &waiting {
            match &self.entries[key].spec {
                NodeSpec::Match {
                    resources,
                    num_nodes,
                } => {
                    let e = self.entries[key].clone();
                    let matching: Vec<NodeId> = live
                        .values()
                        .filter(|n| fits_available(n, resources))
                        .map(|n| n.id)
                        .filter(|n| !has(&placed, &e.name, *n))
                        .collect();
                    if num_nodes.is_some() {
                        // Keep the count: one replacement, the first match in id order.
                        if let Some(to) = matching.first() {
                            updates.push(set(&e.name, e.capacity, *to));
                            placed.insert((e.name.clone(), *to));
                            self.stand_in(key, *to, true, events);
                        }
                    } else {
                        // "Every matching node": evaluate the spec again.
                        for to in matching {
                            updates.push(set(&e.name, e.capacity, to));
                            placed.insert((e.name.clone(), to));
                            let entry = Entry {
                                home: to,
                                place: Place::Home,
                                ..e.clone()
                            };
                            self.entries.insert((e.name.clone(), to), entry);
                        }
                        if let Some(entry) = self.entries.get_mut(key) {
                            entry.place = Place::Reapplied;
                        }
                    }
                }
                NodeSpec::Node(_) | NodeSpec::Local => {
                    by_home.entry(key.1).or_default().push(key.clone());
                }
            }
        }
        for (home, keys) in by_home {
            let names: BTreeSet<ResourceName> = keys.iter().map(|(n, _)| n.clone()).collect();
            let mut need = ResourceSet::new();
            for name in &names {
                for (r, a) in self.needs.get(name).map(|s| s.iter()).into_iter().flatten() {
                    if !names.contains(r) && need.get(r.as_str()) < a {
                        need.insert(r.clone(), a);
                    }
                }
            }
            let physical = ResourceSet::from_pairs(
                need.iter()
                    .filter(|(r, _)| r.is_physical())
                    .map(|(r, a)| (r.clone(), a)),
            )
            .unwrap_or_default();
            let eligible = |set: &ResourceSet| -> Vec<NodeId> {
                live.values()
                    .filter(|n| n.id != home && could_hold_all(n, set))
                    .map(|n| n.id)
                    .collect()
            };
            let mut candidates = eligible(&need);
            if candidates.is_empty() {
                candidates = eligible(&physical);
            }
            let chosen = candidates.into_iter().min_by_key(|n| {
                let already = names.iter().filter(|name| has(&placed, name, *n)).count();
                (already, std::cmp::Reverse(free_cpu(live[n])), *n)
            });
            let Some(to) = chosen else { continue };
            for key in keys {
                let e = &self.entries[&key];
                let created = !has(&placed, &e.name, to);
                if created {
                    updates.push(set(&e.name, e.capacity, to));
                    placed.insert((e.name.clone(), to));
                }
                self.stand_in(&key, to, created, events);
            }
        }
    }

    fn stand_in(
        &mut self,
        key: &(ResourceName, NodeId),
        to: NodeId,
        created: bool,
        events: &mut Vec<Recovery>,
    ) {
        if let Some(e) = self.entries.get_mut(key) {
            e.place = Place::StandIn { node: to, created };
            events.push(Recovery::Replayed {
                name: e.name.clone(),
                from: e.home,
                to,
            });
        }
    }
}

/// Whether `node`'s totals could hold every amount of `set`.
fn could_hold_all(node: &NodeStatus, set: &ResourceSet) -> bool {
    set.iter().all(|(name, amount)| {
        amount.is_zero()
            || node
                .resource(name.as_str())
                .is_some_and(|r| !r.total.is_zero() && r.total.could_hold(amount))
    })
}

/// Whether `node` has `set` available now (the head's `Match` rule).
fn fits_available(node: &NodeStatus, set: &ResourceSet) -> bool {
    set.iter().all(|(name, amount)| {
        node.resource(name.as_str())
            .is_some_and(|r| r.available().is_none_or(|a| a >= amount))
    })
}

/// The node's free cpu (unbounded: the most).
fn free_cpu(node: &NodeStatus) -> Amount {
    match node.resource("cpu") {
        Some(r) => r.available().unwrap_or(Amount::MAX),
        None => Amount::ZERO,
    }
}
