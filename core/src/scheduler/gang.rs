//! Gangs: reservations of several bundles that are dispatched all together or not at all
//! (escher's head-native gang scheduling, design (c) of the thesis' Fig. 4.8).
//!
//! A gang is a list of member tasks, one per bundle, and a [`GangStrategy`]. Its members are
//! not queued in shapes: in each round, after the shapes, every woken gang is placed against a
//! scratch copy of availability. Only a complete placement is committed (one `Dispatch` per
//! member, in member order); otherwise nothing is taken and the gang waits until a resource it
//! requests grows somewhere. Placement is greedy first fit, per strategy:
//!
//! - `Pack`: nodes the gang already uses first, then other candidates in id order;
//! - `Spread`: candidates the gang does not use yet first, then the least-used of its nodes;
//! - `StrictPack`: the first node that holds the sum of all bundles;
//! - `StrictSpread`: every bundle on a distinct node.
//!
//! Where nodes have walltimes (`escher.ends-at`), "candidates" are only the nodes with the
//! least time left (the head's `--min-time-left`), those that never end first and then the
//! latest to end, instead of id order: a reservation has no time limit of its own (it holds
//! until released), so it is placed like a task without one (`walltime.rs`), and reported
//! infeasible with reason `escher.walltime` when no node able to hold a bundle lasts.
//!
//! Greedy placement can miss a placement that exists (bundles `[2, 4]` CPUs over nodes of 4 and
//! 2: first fit puts the 2 on the 4). When it does, a gang of at most [`EXACT_BUNDLES`] bundles
//! is placed by an exact search: depth first, the bundle with the fewest nodes that fit it
//! first, trying every node that fits under the strategy and backing out of dead ends, for at
//! most [`SEARCH_STEPS`] steps per round (then it waits for the next wake-up like a gang that
//! does not fit). Larger gangs are placed greedily only. A gang is reported infeasible, with
//! its reason, when some bundle (or, for `StrictPack`, the sum) fits no live node even idle,
//! or, for `StrictSpread`, when no assignment of bundles to distinct live nodes that could
//! each hold theirs exists (a bipartite matching, for gangs of at most [`MATCH_BUNDLES`]
//! bundles; beyond, when there are fewer such nodes than bundles).
//!
//! # Starvation
//!
//! Gangs are examined after ordinary tasks, so a stream of small tasks could take every
//! resource a large gang needs as soon as it frees, forever. The rule against that: a gang
//! that has waited [`GANG_PATIENCE`] (30 s) without being placed *holds* the nodes of a
//! placement that would fit there if they were idle (the oldest such gang; one hold at a
//! time). While the hold lasts, ordinary tasks and other gangs may take on a held node only
//! what leaves the held bundles room beside what runs there now, so the node drains towards
//! the gang as its tasks end; the gang itself is still placed wherever it fits first. The
//! hold ends when the gang is placed, cancelled, expires or becomes infeasible, or when a held
//! node leaves (then the gang, still starving, holds a new placement in the next round). Time
//! comes from the events (a hold is taken in the first round after the patience ran out),
//! which keeps the core deterministic: a stream of small tasks is a stream of events.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::sync::Arc;

use escher_proto::types::{Amount, GangStrategy, NodeId, TaskId};
use rustc_hash::FxHashMap;

use super::core::{Place, Scheduler};
use super::event::describe_spread;
use super::event::{Decision, InfeasibleReason, Millis};
use super::interner::ResourceId;
use super::shape::Req;

/// A gang's id: its first member's task id.
pub(crate) type GangId = TaskId;

/// A pending gang.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Gang {
    /// Members in bundle order.
    pub(crate) members: Vec<TaskId>,
    pub(crate) strategy: GangStrategy,
    pub(crate) infeasible: Option<Arc<InfeasibleReason>>,
    /// A requested resource grew somewhere: try to place it in the next round.
    pub(crate) woken: bool,
    /// A capacity fell or a node left: check that it is still feasible.
    pub(crate) recheck: bool,
    /// When it started waiting.
    pub(crate) since: Millis,
}

/// How long a gang waits before it holds the nodes it needs against later work (30 s).
pub const GANG_PATIENCE: Millis = 30_000;

/// A starving gang's hold on the nodes of its target placement (see *Starvation* in the
/// module documentation).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Hold {
    /// The gang that holds.
    pub(crate) gang: GangId,
    /// What its target placement takes, per node and resource.
    #[serde(serialize_with = "super::sorted::sorted")]
    pub(crate) taken: Taken,
}

/// Amounts per node and resource: what a placement takes, or what a hold keeps.
pub(crate) type Taken = FxHashMap<(NodeId, ResourceId), Amount>;

/// Against what a placement is computed: what is free now, or what the nodes hold in total.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Avail {
    Now,
    Idle,
}

/// All pending gangs, and the index from resource to the gangs that request it.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Gangs {
    pub(crate) gangs: std::collections::BTreeMap<GangId, Gang>,
    #[serde(serialize_with = "super::sorted::sorted")]
    pub(crate) by_resource: FxHashMap<ResourceId, BTreeSet<GangId>>,
    /// Gangs whose members request nothing at all: woken by any new node.
    pub(crate) empty: BTreeSet<GangId>,
}

impl Gangs {
    pub(crate) fn wake(&mut self, r: ResourceId) {
        if let Some(ids) = self.by_resource.get(&r) {
            for id in ids {
                if let Some(g) = self.gangs.get_mut(id) {
                    g.woken = true;
                }
            }
        }
    }

    pub(crate) fn wake_empty(&mut self) {
        for id in &self.empty {
            if let Some(g) = self.gangs.get_mut(id) {
                g.woken = true;
            }
        }
    }

    pub(crate) fn recheck(&mut self, r: ResourceId) {
        if let Some(ids) = self.by_resource.get(&r) {
            for id in ids {
                if let Some(g) = self.gangs.get_mut(id) {
                    g.recheck = true;
                }
            }
        }
    }
}

impl Scheduler {
    /// Registers a gang whose members are already known as pending tasks, waiting since
    /// `since`.
    pub(crate) fn add_gang(
        &mut self,
        id: GangId,
        members: Vec<TaskId>,
        strategy: GangStrategy,
        since: Millis,
    ) {
        let mut resources = BTreeSet::new();
        for m in &members {
            if let Some(t) = self.tasks.get(m) {
                resources.extend(t.req.iter().map(|(r, _)| *r));
            }
        }
        if resources.is_empty() {
            self.gangs.empty.insert(id);
        }
        for r in resources {
            self.gangs.by_resource.entry(r).or_default().insert(id);
        }
        let gang = Gang {
            members,
            strategy,
            infeasible: None,
            woken: true,
            recheck: true,
            since,
        };
        self.gangs.gangs.insert(id, gang);
    }

    /// Forgets a gang (placed, expired, or emptied by cancellation).
    pub(crate) fn remove_gang(&mut self, id: GangId) {
        let Some(gang) = self.gangs.gangs.remove(&id) else {
            return;
        };
        self.gangs.empty.remove(&id);
        for m in &gang.members {
            if let Some(t) = self.tasks.get(m) {
                for (r, _) in t.req.iter() {
                    if let Some(set) = self.gangs.by_resource.get_mut(r) {
                        set.remove(&id);
                        if set.is_empty() {
                            self.gangs.by_resource.remove(r);
                        }
                    }
                }
            }
        }
    }

    /// Keeps the hold of a gang that still starves, drops one whose gang is gone, and lets the
    /// oldest gang that has waited [`GANG_PATIENCE`] take one when none is held.
    pub(crate) fn update_hold(&mut self, now: Millis) {
        if let Some(hold) = &self.hold {
            let kept = self
                .gangs
                .gangs
                .get(&hold.gang)
                .is_some_and(|g| g.infeasible.is_none())
                && hold.taken.keys().all(|(n, _)| self.nodes.contains_key(n));
            if kept {
                return;
            }
            self.release_hold();
        }
        let starving = self
            .gangs
            .gangs
            .iter()
            .filter(|(_, g)| g.infeasible.is_none() && g.since.saturating_add(GANG_PATIENCE) <= now)
            .min_by_key(|(id, g)| (g.since, **id))
            .map(|(id, g)| (*id, g.strategy));
        let Some((gang, strategy)) = starving else {
            return;
        };
        let reqs = self.gang_reqs(gang);
        let Some(nodes) = self.place_gang(&reqs, strategy, Avail::Idle, &Taken::default(), now)
        else {
            return;
        };
        let mut taken = Taken::default();
        for ((_, req), node) in reqs.iter().zip(nodes) {
            add(&mut taken, node, req);
        }
        self.hold = Some(Hold { gang, taken });
    }

    /// Ends the hold, waking what waits for the resources it kept.
    pub(crate) fn release_hold(&mut self) {
        let Some(hold) = self.hold.take() else {
            return;
        };
        for (node, r) in hold.taken.keys() {
            self.shapes.wake_at(*r, *node);
            self.gangs.wake(*r);
        }
    }

    /// Whether an ordinary task requesting `req` may be admitted on `node` now: it fits, and
    /// leaves a hold on the node room for what it keeps.
    pub(crate) fn fits_beside_hold(&self, node: NodeId, req: &Req) -> bool {
        let Some(hold) = &self.hold else {
            return self.nodes.get(&node).is_some_and(|n| n.fits(req));
        };
        self.fits_with(node, req, &hold.taken, Avail::Now)
    }

    /// The members of a gang with their requirements, in bundle order.
    fn gang_reqs(&self, id: GangId) -> Vec<(TaskId, Req)> {
        let Some(gang) = self.gangs.gangs.get(&id) else {
            return Vec::new();
        };
        gang.members
            .iter()
            .filter_map(|m| self.tasks.get(m).map(|t| (*m, t.req.clone())))
            .collect()
    }

    /// Places every woken gang that fits now, in gang order, and settles feasibility. A gang
    /// other than the holding one places only beside the hold.
    pub(crate) fn gang_round(&mut self, now: Millis, out: &mut Vec<Decision>) {
        let woken: Vec<GangId> = self
            .gangs
            .gangs
            .iter()
            .filter(|(_, g)| g.woken || g.recheck)
            .map(|(id, _)| *id)
            .collect();
        for id in woken {
            let Some(gang) = self.gangs.gangs.get_mut(&id) else {
                continue;
            };
            let woken = std::mem::take(&mut gang.woken);
            gang.recheck = false;
            let strategy = gang.strategy;
            let was_infeasible = gang.infeasible.is_some();
            let reqs = self.gang_reqs(id);
            let base = match &self.hold {
                Some(hold) if hold.gang != id => hold.taken.clone(),
                _ => Taken::default(),
            };
            if woken && let Some(nodes) = self.place_gang(&reqs, strategy, Avail::Now, &base, now) {
                if was_infeasible {
                    for (task, _) in &reqs {
                        out.push(Decision::Feasible { task: *task });
                    }
                }
                self.remove_gang(id);
                for ((task, req), node) in reqs.iter().zip(nodes) {
                    self.commit(*task, node, req, out);
                }
                if self.hold.as_ref().is_some_and(|h| h.gang == id) {
                    self.release_hold();
                }
                continue;
            }
            let reason = self.gang_infeasibility(&reqs, strategy, now);
            let Some(gang) = self.gangs.gangs.get_mut(&id) else {
                continue; // still pending: only a placement, above, removes it
            };
            match (was_infeasible, reason) {
                (false, Some(reason)) => {
                    let reason = Arc::new(reason);
                    gang.infeasible = Some(reason.clone());
                    for (task, _) in &reqs {
                        out.push(Decision::Infeasible {
                            task: *task,
                            reason: reason.clone(),
                        });
                    }
                    if self.hold.as_ref().is_some_and(|h| h.gang == id) {
                        self.release_hold();
                    }
                }
                (true, None) => {
                    gang.infeasible = None;
                    for (task, _) in &reqs {
                        out.push(Decision::Feasible { task: *task });
                    }
                }
                _ => {}
            }
        }
    }

    /// A complete placement of the bundles against `avail`, on top of `base`, or `None`:
    /// greedy first fit, then, for small gangs it missed, the exact search. Only nodes with
    /// the least time left at `now` are used, those that last longest first (`walltime.rs`).
    fn place_gang(
        &self,
        reqs: &[(TaskId, Req)],
        strategy: GangStrategy,
        avail: Avail,
        base: &Taken,
        now: Millis,
    ) -> Option<Vec<NodeId>> {
        self.place_greedy(reqs, strategy, avail, base, now)
            .or_else(|| {
                let small = reqs.len() <= EXACT_BUNDLES && strategy != GangStrategy::StrictPack;
                small
                    .then(|| self.place_exact(reqs, strategy, avail, base, now))
                    .flatten()
            })
    }

    /// Whether `req` fits on `node` (against `avail`), on top of what is `taken` there.
    fn fits_with(&self, node: NodeId, req: &Req, taken: &Taken, avail: Avail) -> bool {
        let Some(n) = self.nodes.get(&node) else {
            return false;
        };
        if avail == Avail::Now && n.paused() {
            return false;
        }
        req.iter().all(|(r, a)| {
            n.slots.get(r).is_some_and(|s| {
                let extra = taken.get(&(node, *r)).copied().unwrap_or_default();
                let used = match avail {
                    Avail::Now => s.used,
                    Avail::Idle => Amount::ZERO,
                };
                s.total
                    .admits(used.checked_add(extra).unwrap_or(Amount::MAX), *a)
            })
        })
    }

    /// The exact search (see the module documentation); `None` when no placement exists or
    /// the step budget ran out.
    fn place_exact(
        &self,
        reqs: &[(TaskId, Req)],
        strategy: GangStrategy,
        avail: Avail,
        base: &Taken,
        now: Millis,
    ) -> Option<Vec<NodeId>> {
        let fitting: Vec<Vec<NodeId>> = reqs
            .iter()
            .map(|(_, req)| {
                self.lasting_candidates(req, now)
                    .filter(|n| self.fits_with(*n, req, base, avail))
                    .collect()
            })
            .collect();
        let mut order: Vec<usize> = (0..reqs.len()).collect();
        order.sort_by_key(|i| (fitting[*i].len(), *i));
        let mut search = Search {
            scheduler: self,
            reqs,
            fitting: &fitting,
            order: &order,
            distinct: strategy == GangStrategy::StrictSpread,
            avail,
            taken: base.clone(),
            placement: vec![None; reqs.len()],
            steps: 0,
        };
        if !search.place(0) {
            return None;
        }
        search.placement.into_iter().collect()
    }

    /// Greedy first fit, per strategy.
    fn place_greedy(
        &self,
        reqs: &[(TaskId, Req)],
        strategy: GangStrategy,
        avail: Avail,
        base: &Taken,
        now: Millis,
    ) -> Option<Vec<NodeId>> {
        let mut taken = base.clone();
        let mut used: Vec<NodeId> = Vec::new();
        let mut count: FxHashMap<NodeId, usize> = FxHashMap::default();
        let fits = |node: NodeId, req: &Req, taken: &Taken| self.fits_with(node, req, taken, avail);
        if strategy == GangStrategy::StrictPack {
            let total = sum_of(reqs);
            let node = self
                .lasting_candidates(&total, now)
                .find(|n| fits(*n, &total, &taken))?;
            return Some(vec![node; reqs.len()]);
        }
        let mut placement = Vec::with_capacity(reqs.len());
        for (_, req) in reqs {
            let fresh = || {
                self.lasting_candidates(req, now)
                    .filter(|n| !count.contains_key(n))
            };
            let node = match strategy {
                GangStrategy::Pack => used
                    .iter()
                    .copied()
                    .find(|n| fits(*n, req, &taken))
                    .or_else(|| fresh().find(|n| fits(*n, req, &taken))),
                GangStrategy::Spread => fresh().find(|n| fits(*n, req, &taken)).or_else(|| {
                    let mut by_load = used.clone();
                    by_load.sort_by_key(|n| (count[n], *n));
                    by_load.into_iter().find(|n| fits(*n, req, &taken))
                }),
                GangStrategy::StrictSpread => fresh().find(|n| fits(*n, req, &taken)),
                // Handled above, before the loop; were it reached, nothing is placed.
                GangStrategy::StrictPack => None,
            }?;
            add(&mut taken, node, req);
            if !count.contains_key(&node) {
                used.push(node);
            }
            *count.entry(node).or_default() += 1;
            placement.push(node);
        }
        Some(placement)
    }

    /// Why no live node set could ever hold the gang, if that is so.
    fn gang_infeasibility(
        &self,
        reqs: &[(TaskId, Req)],
        strategy: GangStrategy,
        now: Millis,
    ) -> Option<InfeasibleReason> {
        for (_, req) in reqs {
            if !req.is_empty() && !self.could_run_somewhere(req) {
                return self.explain(req);
            }
        }
        if strategy == GangStrategy::StrictPack {
            let total = sum_of(reqs);
            if !total.is_empty() && !self.could_run_somewhere(&total) {
                return self.explain(&total);
            }
        }
        if strategy == GangStrategy::StrictSpread
            && let Some(reason) = self.spread_infeasibility(reqs)
        {
            return Some(reason);
        }
        // Nodes with the least time left: for a strict-pack one, the sum on one node.
        let total = (strategy == GangStrategy::StrictPack).then(|| sum_of(reqs));
        let bundles: Vec<&Req> = match &total {
            Some(total) => vec![total],
            None => reqs.iter().map(|(_, r)| r).collect(),
        };
        self.gang_walltime(&bundles, now)
    }

    /// For `StrictSpread`: why no set of distinct live nodes could ever hold one bundle each,
    /// if that is so (a maximum bipartite matching of bundles to the nodes that could hold
    /// them, idle).
    fn spread_infeasibility(&self, reqs: &[(TaskId, Req)]) -> Option<InfeasibleReason> {
        let capable: Vec<Vec<NodeId>> = reqs
            .iter()
            .map(|(_, req)| {
                self.candidates(req)
                    .filter(|n| self.nodes.get(n).is_some_and(|n| n.could_hold(req)))
                    .collect()
            })
            .collect();
        let nodes: BTreeSet<NodeId> = capable.iter().flatten().copied().collect();
        let matched = if reqs.len() <= MATCH_BUNDLES {
            max_matching(&capable)
        } else {
            nodes.len().min(reqs.len())
        };
        if matched >= reqs.len() {
            return None;
        }
        let first = reqs.first().map(|(_, r)| r.clone());
        let (resource, requested) = first
            .as_deref()
            .and_then(|r| r.first())
            .and_then(|(r, a)| Some((self.names.name(*r)?.clone(), *a)))?;
        Some(InfeasibleReason {
            best_total: None,
            closest_nodes: nodes.iter().copied().take(3).collect(),
            message: describe_spread(reqs.len(), matched, nodes.len()),
            resource,
            requested,
        })
    }

    /// Dispatches one task to a node without a shape (gang members).
    fn commit(&mut self, task: TaskId, node_id: NodeId, req: &Req, out: &mut Vec<Decision>) {
        let Some(node) = self.nodes.get_mut(&node_id) else {
            return;
        };
        for (r, amount) in req.iter() {
            if let Some(slot) = node.slots.get_mut(r) {
                slot.used = slot.used.checked_add(*amount).unwrap_or(Amount::MAX);
            }
        }
        node.running.insert(task);
        if let Some(entry) = self.tasks.get_mut(&task) {
            entry.place = Place::Running { node: node_id };
            if let Some(at) = entry.deadline {
                self.deadlines.remove(&(at, task));
            }
        }
        out.push(Decision::Dispatch {
            task,
            node: node_id,
        });
    }
}

/// Gangs of at most this many bundles get the exact search when greedy placement misses.
pub(crate) const EXACT_BUNDLES: usize = 8;
/// The most nodes the exact search tries per gang and round.
pub(crate) const SEARCH_STEPS: usize = 20_000;
/// Strict-spread gangs of at most this many bundles get the matching infeasibility check.
pub(crate) const MATCH_BUNDLES: usize = 256;

/// The exact search's state: a depth-first walk over bundles (most constrained first).
struct Search<'a> {
    scheduler: &'a Scheduler,
    reqs: &'a [(TaskId, Req)],
    fitting: &'a [Vec<NodeId>],
    order: &'a [usize],
    distinct: bool,
    avail: Avail,
    taken: Taken,
    placement: Vec<Option<NodeId>>,
    steps: usize,
}

impl Search<'_> {
    /// Places the bundles from `depth` on; true when all are placed.
    fn place(&mut self, depth: usize) -> bool {
        let Some(&bundle) = self.order.get(depth) else {
            return true;
        };
        let req = &self.reqs[bundle].1;
        for &node in &self.fitting[bundle] {
            self.steps += 1;
            if self.steps > SEARCH_STEPS {
                return false;
            }
            if self.distinct && self.placement.contains(&Some(node)) {
                continue;
            }
            if !self.scheduler.fits_with(node, req, &self.taken, self.avail) {
                continue;
            }
            self.take(node, req, true);
            self.placement[bundle] = Some(node);
            if self.place(depth + 1) {
                return true;
            }
            self.placement[bundle] = None;
            self.take(node, req, false);
        }
        false
    }

    /// Adds `req` to what the placement takes on `node`, or gives it back.
    fn take(&mut self, node: NodeId, req: &Req, add: bool) {
        for (r, a) in req.iter() {
            let e = self.taken.entry((node, *r)).or_default();
            *e = if add {
                e.checked_add(*a).unwrap_or(Amount::MAX)
            } else {
                e.checked_sub(*a).unwrap_or_default()
            };
        }
    }
}

/// The size of a maximum matching of bundles to distinct nodes (`capable[b]`: the nodes that
/// could hold bundle `b`), by augmenting paths.
fn max_matching(capable: &[Vec<NodeId>]) -> usize {
    fn augment(
        b: usize,
        capable: &[Vec<NodeId>],
        owner: &mut FxHashMap<NodeId, usize>,
        seen: &mut BTreeSet<NodeId>,
    ) -> bool {
        for &n in &capable[b] {
            if !seen.insert(n) {
                continue;
            }
            let free = match owner.get(&n) {
                None => true,
                Some(&other) => augment(other, capable, owner, seen),
            };
            if free {
                owner.insert(n, b);
                return true;
            }
        }
        false
    }
    let mut owner = FxHashMap::default();
    (0..capable.len())
        .filter(|b| augment(*b, capable, &mut owner, &mut BTreeSet::new()))
        .count()
}

/// Adds `req` on `node` to `taken`.
fn add(taken: &mut Taken, node: NodeId, req: &Req) {
    for (r, a) in req.iter() {
        let e = taken.entry((node, *r)).or_default();
        *e = e.checked_add(*a).unwrap_or(Amount::MAX);
    }
}

/// The sum of every bundle's requirements (what a strict-pack gang needs on one node).
fn sum_of(reqs: &[(TaskId, Req)]) -> Req {
    let mut sum: FxHashMap<ResourceId, Amount> = FxHashMap::default();
    for (_, req) in reqs {
        for (r, a) in req.iter() {
            let e = sum.entry(*r).or_default();
            *e = e.checked_add(*a).unwrap_or(Amount::MAX);
        }
    }
    let mut total: Vec<(ResourceId, Amount)> = sum.into_iter().collect();
    total.sort_unstable();
    total.into()
}
