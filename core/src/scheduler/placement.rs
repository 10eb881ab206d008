//! A scheduling round: woken shapes look for nodes, dispatch, and learn whether they are
//! feasible at all.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::Arc;

use escher_proto::types::{Amount, Capacity, NodeId, ResourceName, TaskId};

use super::core::{Place, Scheduler};
use super::event::{Decision, InfeasibleReason, Millis, describe};
use super::interner::ResourceId;
use super::shape::{Req, ShapeId, Wake};

impl Scheduler {
    /// Examines every woken shape, oldest waiting task first, then every woken gang; a
    /// starving gang's hold is settled first, and what a hold released is examined again.
    pub(crate) fn round(&mut self, now: Millis, out: &mut Vec<Decision>) {
        if !self.gangs.gangs.is_empty() || self.hold.is_some() {
            self.update_hold(now);
        }
        if !self.shapes.woken.is_empty() {
            self.shape_round(now, out);
        }
        // A hold that ends in the gang round wakes what it kept from others: one more pass.
        while !self.gangs.gangs.is_empty() {
            let held = self.hold.is_some();
            self.gang_round(now, out);
            if !held || self.hold.is_some() {
                break;
            }
            if !self.shapes.woken.is_empty() {
                self.shape_round(now, out);
            }
        }
    }

    fn shape_round(&mut self, now: Millis, out: &mut Vec<Decision>) {
        let mut order: Vec<(TaskId, ShapeId)> = std::mem::take(&mut self.shapes.woken)
            .into_iter()
            .filter_map(|id| self.head(id).map(|task| (task, id)))
            .collect();
        order.sort_unstable();
        for (_, id) in order {
            self.examine(id, now, out);
        }
    }

    /// Settles one woken shape: reports it feasible again if a change made it so, dispatches
    /// what fits where it was woken, and reports it infeasible if no live node could hold it.
    fn examine(&mut self, id: ShapeId, now: Millis, out: &mut Vec<Decision>) {
        let Some(shape) = self.shapes.shapes.get_mut(&id) else {
            return;
        };
        let wake = std::mem::take(&mut shape.wake);
        let recheck = std::mem::take(&mut shape.recheck);
        let req = shape.req.clone();
        if shape.infeasible.is_some() {
            // Only a node that changed in its favour can make it feasible.
            let now_feasible = match &wake {
                Wake::None => false,
                Wake::Nodes(nodes) => nodes
                    .iter()
                    .any(|n| self.nodes.get(n).is_some_and(|n| n.could_hold(&req))),
                Wake::All => self.could_run_somewhere(&req),
            };
            if !now_feasible {
                // Still infeasible, but a change to what it requests can change why (a node
                // now has some of a resource that no node had): keep the reason current.
                if wake != Wake::None {
                    self.refresh_reason(id, &req, out);
                }
                return;
            }
            if let Some(shape) = self.shapes.shapes.get_mut(&id) {
                shape.infeasible = None; // live: only `examine` and a cancel remove shapes
            }
            for task in self.pending_in(id) {
                out.push(Decision::Feasible { task });
            }
        }
        let dispatched = match &wake {
            Wake::None => 0,
            Wake::All => self.dispatch_round_robin(id, &req, now, out),
            Wake::Nodes(nodes) => self.dispatch_on(id, &req, nodes, now, out),
        };
        if self.shapes.shapes.get(&id).is_none_or(|s| s.live == 0) {
            self.shapes.remove(id);
            return;
        }
        if wake != Wake::None || recheck {
            self.settle_walltimes(id, &req, now, out);
        }
        // Still waiting. Only a full look can say that no node could ever hold it.
        let must_look = recheck || wake == Wake::All;
        if dispatched > 0 || req.is_empty() || !must_look || self.could_run_somewhere(&req) {
            return;
        }
        let Some(reason) = self.explain(&req).map(Arc::new) else {
            return;
        };
        let Some(shape) = self.shapes.shapes.get_mut(&id) else {
            return; // live: it was looked up above and nothing removed it
        };
        shape.infeasible = Some(reason.clone());
        for task in self.pending_in(id) {
            out.push(Decision::Infeasible {
                task,
                reason: reason.clone(),
            });
        }
    }

    /// Reports an infeasible shape's tasks infeasible again if the reason changed.
    fn refresh_reason(&mut self, id: ShapeId, req: &Req, out: &mut Vec<Decision>) {
        let Some(reason) = self.explain(req) else {
            return;
        };
        let Some(shape) = self.shapes.shapes.get_mut(&id) else {
            return;
        };
        if shape.infeasible.as_deref() == Some(&reason) {
            return;
        }
        let reason = Arc::new(reason);
        shape.infeasible = Some(reason.clone());
        for task in self.pending_in(id) {
            out.push(Decision::Infeasible {
                task,
                reason: reason.clone(),
            });
        }
    }

    /// Whether some live node could hold `req` if it were idle.
    pub(crate) fn could_run_somewhere(&self, req: &Req) -> bool {
        self.candidates(req)
            .any(|n| self.nodes.get(&n).is_some_and(|n| n.could_hold(req)))
    }

    /// Round-robin over the holders of the scarcest resource, starting after the node last
    /// chosen for it, until the queue is empty or a whole cycle of nodes has no room.
    fn dispatch_round_robin(
        &mut self,
        id: ShapeId,
        req: &Req,
        now: Millis,
        out: &mut Vec<Decision>,
    ) -> usize {
        let key = self.scarcest(req);
        let cycle = self.key_len(key);
        let mut cursor = self.cursors.get(&key).copied();
        let (mut dispatched, mut misses) = (0, 0);
        // Nothing frees up during the loop, so a full cycle of misses means nothing fits.
        while misses < cycle {
            let Some(task) = self.head(id) else { break };
            if let Some(node) = self.preferred_node(task, req, now)
                && self.dispatch(task, id, node, req, out)
            {
                dispatched += 1;
                misses = 0;
                continue;
            }
            let Some(node) = self.next_after(key, cursor) else {
                break;
            };
            cursor = Some(node);
            let task = match self.fits_beside_hold(node, req) {
                true => self.pick(id, node, now),
                false => None,
            };
            // A task without a time limit goes to a node that lasts longer, if one has room.
            let target = task
                .and_then(|t| self.longer_lasting(t, req, node))
                .unwrap_or(node);
            if let Some(task) = task
                && self.dispatch(task, id, target, req, out)
            {
                self.cursors.insert(key, node);
                dispatched += 1;
                misses = 0;
            } else {
                misses += 1;
            }
        }
        dispatched
    }

    /// The first node that holds one of `task`'s preferred resources (in the order it gave
    /// them, then by node id), where `req` fits now and that lasts for the task's time limit,
    /// if any ([`Scheduler::prefer`]).
    fn preferred_node(&self, task: TaskId, req: &Req, now: Millis) -> Option<NodeId> {
        let names = self.prefer.get(&task)?;
        names
            .iter()
            .filter_map(|name| self.holders.get(&self.names.get(name.as_str())?))
            .flat_map(|holders| holders.iter().copied())
            .find(|node| self.fits_beside_hold(*node, req) && self.lasts_on(task, *node, now))
    }

    /// Dispatches as many tasks as fit on each of `nodes`, in node order (a task with a
    /// preferred node that has room goes there instead).
    fn dispatch_on(
        &mut self,
        id: ShapeId,
        req: &Req,
        nodes: &BTreeSet<NodeId>,
        now: Millis,
        out: &mut Vec<Decision>,
    ) -> usize {
        let mut dispatched = 0;
        for node in nodes {
            loop {
                if self.head(id).is_none() {
                    return dispatched;
                }
                if !self.fits_beside_hold(*node, req) {
                    break;
                }
                let Some(task) = self.pick(id, *node, now) else {
                    break;
                };
                let target = self.preferred_node(task, req, now).unwrap_or(*node);
                if !self.dispatch(task, id, target, req, out) {
                    break;
                }
                dispatched += 1;
            }
        }
        dispatched
    }

    /// Places `task` of `shape` (its head, or on a node with an end the task `pick` chose) on
    /// `node_id`, which the caller found it fits.
    /// Returns whether it did: every lookup is made before anything changes, so a caller that
    /// broke those preconditions (a node that is not live, a task or shape the core does not
    /// know) gets `false` and an unchanged core, never a panic.
    fn dispatch(
        &mut self,
        task: TaskId,
        shape: ShapeId,
        node_id: NodeId,
        req: &Req,
        out: &mut Vec<Decision>,
    ) -> bool {
        let (Some(node), Some(entry), Some(s)) = (
            self.nodes.get_mut(&node_id),
            self.tasks.get_mut(&task),
            self.shapes.shapes.get_mut(&shape),
        ) else {
            return false;
        };
        // Safety (and every slot of `req` exists on the node): dispatch only where it fits.
        if !node.fits(req) {
            return false;
        }
        for (r, amount) in req.iter() {
            if let Some(slot) = node.slots.get_mut(r) {
                slot.used = slot.used.checked_add(*amount).unwrap_or(Amount::MAX);
            }
        }
        node.running.insert(task);
        entry.place = Place::Running { node: node_id };
        if let Some(at) = entry.deadline {
            self.deadlines.remove(&(at, task));
        }
        // A task picked from behind the head leaves a stale entry, skipped like a cancelled one.
        if s.queue.front().is_some_and(|(t, _)| *t == task) {
            s.queue.pop_front();
        }
        s.live = s.live.saturating_sub(1);
        self.prefer.remove(&task);
        self.time.forget(task);
        out.push(Decision::Dispatch {
            task,
            node: node_id,
        });
        true
    }

    /// The oldest live task of a shape, dropping stale entries on the way.
    pub(crate) fn head(&mut self, id: ShapeId) -> Option<TaskId> {
        let shape = self.shapes.shapes.get_mut(&id)?;
        while let Some(&(task, seq)) = shape.queue.front() {
            match self.tasks.get(&task) {
                Some(t) if t.place == (Place::Pending { shape: id, seq }) => return Some(task),
                _ => {
                    shape.queue.pop_front();
                }
            }
        }
        None
    }

    /// The live tasks of a shape in queue order.
    pub(crate) fn pending_in(&self, id: ShapeId) -> Vec<TaskId> {
        let Some(shape) = self.shapes.shapes.get(&id) else {
            return Vec::new();
        };
        shape
            .queue
            .iter()
            .filter(|(task, seq)| {
                self.tasks.get(task).is_some_and(|t| {
                    t.place
                        == Place::Pending {
                            shape: id,
                            seq: *seq,
                        }
                })
            })
            .map(|(task, _)| *task)
            .collect()
    }

    /// The round-robin key of a requirement: its scarcest resource, or `None` for "all nodes".
    fn scarcest(&self, req: &Req) -> Option<ResourceId> {
        req.iter()
            .map(|(r, _)| (self.holders.get(r).map_or(0, BTreeSet::len), *r))
            .min()
            .map(|(_, r)| r)
    }

    /// How many nodes the round-robin key ranges over.
    fn key_len(&self, key: Option<ResourceId>) -> usize {
        match key {
            None => self.nodes.len(),
            Some(r) => self.holders.get(&r).map_or(0, BTreeSet::len),
        }
    }

    /// The next node after `after` in the key's cyclic order (the first node if `None`).
    fn next_after(&self, key: Option<ResourceId>, after: Option<NodeId>) -> Option<NodeId> {
        let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
        match key {
            None => {
                let mut next = self.nodes.range((lower, Bound::Unbounded)).map(|(n, _)| *n);
                next.next().or_else(|| self.nodes.keys().next().copied())
            }
            Some(r) => {
                let nodes = self.holders.get(&r)?;
                nodes
                    .range((lower, Bound::Unbounded))
                    .next()
                    .or_else(|| nodes.first())
                    .copied()
            }
        }
    }

    /// The only nodes that could ever hold `req`: the holders of its scarcest resource.
    pub(crate) fn candidates(&self, req: &Req) -> Box<dyn Iterator<Item = NodeId> + '_> {
        match self.scarcest(req) {
            None => Box::new(self.nodes.keys().copied()),
            Some(r) => match self.holders.get(&r) {
                Some(nodes) => Box::new(nodes.iter().copied()),
                None => Box::new(std::iter::empty()),
            },
        }
    }

    /// Why no live node could ever hold `req`; `None` only for a requirement that asks for
    /// nothing (which every live node could hold, so no caller asks).
    pub(crate) fn explain(&self, req: &Req) -> Option<InfeasibleReason> {
        let reason = |r: ResourceId,
                      requested: Amount,
                      best_total: Option<Capacity>,
                      closest_nodes: Vec<NodeId>| {
            let resource = self.names.name(r)?.clone();
            let near = best_total
                .is_none()
                .then(|| self.same_but_case(&resource))
                .flatten();
            let message = describe(&resource, requested, best_total, &closest_nodes, near);
            Some(InfeasibleReason {
                resource,
                requested,
                best_total,
                closest_nodes,
                message,
            })
        };
        // A resource no node has, or more of one than any node has in total.
        for (r, amount) in req.iter() {
            let best = self.best_total(*r);
            if !best.is_some_and(|b| b.could_hold(*amount)) {
                let closest = self.closest(req, 3);
                return reason(*r, *amount, best, closest);
            }
        }
        // Every resource exists in sufficient size somewhere, but never all on one node.
        let closest = self.closest(req, 3);
        let (r, amount) = closest
            .first()
            .and_then(|n| self.nodes.get(n)?.missing(req).next())
            .or_else(|| req.first().copied())?;
        reason(r, amount, self.best_total(r), closest)
    }

    /// A resource some live node has whose name differs from `name` only by case (`CPU` for
    /// `cpu`): names are case-sensitive, and that is the likeliest slip.
    fn same_but_case(&self, name: &ResourceName) -> Option<ResourceName> {
        self.names
            .iter()
            .filter(|(_, other, _)| {
                *other != name && other.as_str().eq_ignore_ascii_case(name.as_str())
            })
            .find(|(id, _, _)| self.holders.get(id).is_some_and(|h| !h.is_empty()))
            .map(|(_, other, _)| other.clone())
    }

    fn best_total(&self, r: ResourceId) -> Option<Capacity> {
        self.holders
            .get(&r)?
            .iter()
            .filter_map(|n| self.nodes.get(n)?.slots.get(&r))
            .map(|s| s.total)
            .max_by(|a, b| match (a, b) {
                (Capacity::Unbounded, Capacity::Unbounded) => std::cmp::Ordering::Equal,
                (Capacity::Unbounded, _) => std::cmp::Ordering::Greater,
                (_, Capacity::Unbounded) => std::cmp::Ordering::Less,
                (Capacity::Finite(x), Capacity::Finite(y)) => x.cmp(y),
            })
    }

    /// Up to `k` nodes holding some requested resource, fewest unmet requirements first.
    fn closest(&self, req: &Req, k: usize) -> Vec<NodeId> {
        let mut seen = BTreeSet::new();
        for (r, _) in req.iter() {
            if let Some(nodes) = self.holders.get(r) {
                seen.extend(nodes.iter().copied());
            }
        }
        let mut ranked: Vec<(usize, NodeId)> = seen
            .into_iter()
            .filter_map(|n| Some((self.nodes.get(&n)?.missing(req).count(), n)))
            .collect();
        ranked.sort_unstable();
        ranked.into_iter().take(k).map(|(_, n)| n).collect()
    }
}
