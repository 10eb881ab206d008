//! [`Scheduler`]: the state of the core and how each event changes it.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

use escher_proto::types::{
    Amount, Capacity, CapacityOp, Delta, Labels, NodeId, NodeSpec, ResourceName, ResourceSet,
    TaskId,
};
use rustc_hash::FxHashMap;

use super::error::CoreError;
use super::event::{Decision, Event, Millis};
use super::interner::{Interner, ResourceId};
use super::node::{Node, Slot};
use super::shape::{Req, ShapeId, Shapes};

/// Where a task the core knows is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Place {
    /// Queued in a shape under this submission sequence number.
    Pending { shape: ShapeId, seq: u64 },
    /// Waiting with the other members of a gang.
    Gang { gang: super::gang::GangId },
    /// Holding its requirements on a node.
    Running { node: NodeId },
}

/// A task the core knows: pending or running. Finished tasks are forgotten.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Task {
    pub(crate) req: Req,
    pub(crate) place: Place,
    pub(crate) deadline: Option<Millis>,
}

/// The scheduler core. See the [module documentation](super) for what it promises.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Scheduler {
    pub(crate) names: Interner,
    /// Live nodes.
    pub(crate) nodes: BTreeMap<NodeId, Node>,
    /// For each resource, the live nodes that have a slot for it.
    #[serde(serialize_with = "super::sorted::sorted")]
    pub(crate) holders: FxHashMap<ResourceId, BTreeSet<NodeId>>,
    /// For each resource used as a round-robin key, the node last chosen.
    #[serde(serialize_with = "super::sorted::sorted")]
    pub(crate) cursors: FxHashMap<Option<ResourceId>, NodeId>,
    #[serde(serialize_with = "super::sorted::sorted")]
    pub(crate) tasks: FxHashMap<TaskId, Task>,
    pub(crate) shapes: Shapes,
    pub(crate) gangs: super::gang::Gangs,
    /// A starving gang's hold on the nodes it needs, if any (see `gang.rs`).
    pub(crate) hold: Option<super::gang::Hold>,
    pub(crate) deadlines: BTreeSet<(Millis, TaskId)>,
    pub(crate) next_seq: u64,
    /// Soft locality: for a pending task, the resources whose holders it would rather run on,
    /// in the order to try them ([`Scheduler::prefer`]). Not part of a snapshot: the caller
    /// derives it from what it keeps of the task (the head, from the task's object arguments)
    /// and sets it again after a restore, so the bytes of a snapshot stay what they were.
    #[serde(skip)]
    pub(crate) prefer: BTreeMap<TaskId, Vec<ResourceName>>,
    /// Walltimes and time limits (`walltime.rs`), derived from what snapshots already hold
    /// (nodes' labels, tasks' specs): not written, rebuilt by [`Scheduler::restore_walltimes`].
    #[serde(skip)]
    pub(crate) time: super::walltime::TimeIndex,
}

/// One resource on one node, as [`Scheduler::node`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceView {
    /// The resource.
    pub name: ResourceName,
    /// Its capacity (a finite zero while a deleted resource is still held).
    pub total: Capacity,
    /// How much running tasks hold.
    pub used: Amount,
}

/// A live node as [`Scheduler::node`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// The node.
    pub id: NodeId,
    /// Its labels.
    pub labels: Labels,
    /// Its resources, by name.
    pub resources: Vec<ResourceView>,
    /// Tasks running there.
    pub running: Vec<TaskId>,
}

impl Scheduler {
    /// An empty cluster.
    pub fn new() -> Scheduler {
        Scheduler::default()
    }

    /// Applies one event at time `now`, appending what it decided to `out`.
    ///
    /// An event that makes no sense (an unknown node, a duplicate task, a capacity that would go
    /// negative, ...) returns an error and changes nothing. For `ResourceChanged` the returned
    /// list holds the nodes that changed; for every other event it is empty.
    pub fn handle(
        &mut self,
        event: Event,
        now: Millis,
        out: &mut Vec<Decision>,
    ) -> Result<Vec<NodeId>, CoreError> {
        let changed = self.apply(event, now, out)?;
        self.expire(now, out);
        self.round(now, out);
        self.reclaim_names();
        Ok(changed)
    }

    /// Applies `events` in order as one change: the scheduling round that [`handle`] runs
    /// after each event runs once, after the last, so that no task is placed on a state in
    /// which only part of the change is made (a resource set on every node at once, as
    /// Python's dataflow signals are, is on every node before a task that waited for it is
    /// placed, and soft locality then sees its holder). Stops at the first event it refuses,
    /// the ones before it applied; the head sends only events it has checked.
    ///
    /// [`handle`]: Self::handle
    pub fn handle_all(
        &mut self,
        events: impl IntoIterator<Item = Event>,
        now: Millis,
        out: &mut Vec<Decision>,
    ) -> Result<(), CoreError> {
        let mut result = Ok(());
        for event in events {
            if let Err(e) = self.apply(event, now, out) {
                result = Err(e);
                break;
            }
        }
        self.expire(now, out);
        self.round(now, out);
        self.reclaim_names();
        result
    }

    /// One event's change, without the round that follows it.
    fn apply(
        &mut self,
        event: Event,
        now: Millis,
        out: &mut Vec<Decision>,
    ) -> Result<Vec<NodeId>, CoreError> {
        let mut changed = Vec::new();
        match event {
            Event::NodeAdded {
                node,
                resources,
                labels,
            } => {
                self.add_node(node, resources, labels)?;
            }
            Event::NodeRemoved { node } => self.remove_node(node, out)?,
            Event::ResourceChanged { target, name, op } => {
                changed = self.change_resource(&target, &name, op)?;
            }
            Event::TaskSubmitted {
                task,
                resources,
                deadline,
                time_limit,
            } => {
                self.submit(task, &resources, deadline, time_limit, out)?;
            }
            Event::GangSubmitted {
                tasks,
                strategy,
                deadline,
            } => {
                self.submit_gang(tasks, strategy, deadline, now)?;
            }
            Event::TaskFinished { task } => self.finish(task)?,
            Event::TaskCancelled { task } => self.cancel(task)?,
            Event::Tick => {}
        }
        Ok(changed)
    }

    /// The nodes `NodeSpec::Match` selects right now: live nodes whose available resources
    /// contain `resources`, in ascending id order, at most `num_nodes` of them.
    pub fn resolve_match(
        &self,
        resources: &ResourceSet,
        num_nodes: Option<u32>,
    ) -> Result<Vec<NodeId>, CoreError> {
        if num_nodes == Some(0) {
            return Err(CoreError::ZeroNumNodes);
        }
        let limit = num_nodes.map_or(usize::MAX, |n| n as usize);
        let Some(req) = self.lookup_req(resources) else {
            return Ok(Vec::new()); // asks for a resource no node has ever had
        };
        let mut found = Vec::new();
        for node in self.candidates(&req) {
            if found.len() == limit {
                break;
            }
            if self.nodes.get(&node).is_some_and(|n| n.fits(&req)) {
                found.push(node);
            }
        }
        found.sort_unstable();
        Ok(found)
    }

    /// A live node's labels, resources and running tasks.
    pub fn node(&self, id: NodeId) -> Option<NodeView> {
        let node = self.nodes.get(&id)?;
        let mut resources: Vec<ResourceView> = node
            .slots
            .iter()
            .filter_map(|(r, s)| {
                Some(ResourceView {
                    name: self.names.name(*r)?.clone(),
                    total: s.total,
                    used: s.used,
                })
            })
            .collect();
        resources.sort_by(|a, b| a.name.cmp(&b.name));
        Some(NodeView {
            id,
            labels: node.labels.clone(),
            resources,
            running: node.running.iter().copied().collect(),
        })
    }

    /// The capacity of `name` on a live node, if the node has it.
    pub fn capacity(&self, node: NodeId, name: &str) -> Option<Capacity> {
        let r = self.names.get(name)?;
        self.nodes.get(&node)?.slots.get(&r).map(|s| s.total)
    }

    /// Whether `node` is live.
    pub fn has_node(&self, node: NodeId) -> bool {
        self.nodes.contains_key(&node)
    }

    /// Live node ids in ascending order.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes.keys().copied()
    }

    /// The node a running task holds its resources on.
    pub fn running_on(&self, task: TaskId) -> Option<NodeId> {
        match self.tasks.get(&task)?.place {
            Place::Running { node } => Some(node),
            Place::Pending { .. } | Place::Gang { .. } => None,
        }
    }

    /// Whether some live node holds a resource named `name`.
    pub fn is_held(&self, name: &str) -> bool {
        self.names
            .get(name)
            .is_some_and(|r| self.holders.get(&r).is_some_and(|h| !h.is_empty()))
    }

    /// How many names of namespace `ns` some live node holds (one pass over the names).
    pub fn held_in_namespace(&self, ns: &str) -> usize {
        self.names
            .iter()
            .filter(|(id, name, _)| {
                name.namespace() == Some(ns) && self.holders.get(id).is_some_and(|h| !h.is_empty())
            })
            .count()
    }

    /// Whether the core knows `task` as pending.
    pub fn is_pending(&self, task: TaskId) -> bool {
        self.tasks
            .get(&task)
            .is_some_and(|t| !matches!(t.place, Place::Running { .. }))
    }

    /// The reason a pending task is infeasible, if it is.
    pub fn infeasible_reason(&self, task: TaskId) -> Option<&super::InfeasibleReason> {
        match self.tasks.get(&task)?.place {
            Place::Pending { shape, .. } => match self.shapes.shapes.get(&shape)?.infeasible {
                Some(ref reason) => Some(&**reason),
                None => self.time.held_back(task),
            },
            Place::Gang { gang } => self.gangs.gangs.get(&gang)?.infeasible.as_deref(),
            Place::Running { .. } => None,
        }
    }

    /// Number of pending tasks.
    pub fn pending_count(&self) -> usize {
        let in_gangs: usize = self.gangs.gangs.values().map(|g| g.members.len()).sum();
        self.shapes.shapes.values().map(|s| s.live).sum::<usize>() + in_gangs
    }

    /// Number of running tasks.
    pub fn running_count(&self) -> usize {
        self.tasks.len() - self.pending_count()
    }

    /// Replaces a live node's labels. They change no placement (resources do that; they are
    /// what the node is, for people and for ESLs) but two: a walltime's end
    /// ([`ENDS_AT_LABEL`](escher_proto::types::ENDS_AT_LABEL)), which tasks with a time limit
    /// must not outlast and which decides where tasks without one and reservations go first;
    /// and a disk under its reserve
    /// ([`DISK_UNDER_RESERVE_LABEL`](escher_proto::types::DISK_UNDER_RESERVE_LABEL)), while
    /// which nothing new is placed there. A later end (or none), or the disk's label removed,
    /// wakes the shapes and gangs this node could hold.
    pub fn set_node_labels(&mut self, id: NodeId, labels: Labels) -> Result<(), CoreError> {
        let node = self.nodes.get_mut(&id).ok_or(CoreError::UnknownNode(id))?;
        let before = super::walltime::ends_at(&node.labels);
        let after = super::walltime::ends_at(&labels);
        let resumed = node.paused() && !escher_proto::types::under_disk_reserve(&labels);
        node.labels = labels;
        self.time.set_end(id, after);
        let longer = match (before, after) {
            (Some(b), Some(a)) => a > b,
            (Some(_), None) => true,
            (None, _) => false,
        };
        // A node that lasts longer, or whose disk has room again, may take what waits.
        if (longer || resumed)
            && let Some(node) = self.nodes.get(&id)
        {
            for r in node.slots.keys() {
                self.shapes.wake_at(*r, id);
                self.gangs.wake(*r);
            }
            self.shapes.wake_empty_at(id);
            self.gangs.wake_empty();
        }
        Ok(())
    }

    /// Soft locality: until `task` is dispatched (or forgotten), a node that holds one of
    /// `resources` and has room for the task is chosen before the round-robin order, trying
    /// the names in the order given and their holders in ascending id order. It is a
    /// preference only: it never makes a task wait, and a task none of whose preferred nodes
    /// has room goes wherever it fits, as without it. Set it just before the task's
    /// [`Event::TaskSubmitted`] (and again before a resubmission, or after a restore: it is
    /// not part of a snapshot). Gangs ignore it. An empty list clears it.
    pub fn prefer(&mut self, task: TaskId, resources: Vec<ResourceName>) {
        if resources.is_empty() {
            self.prefer.remove(&task);
        } else {
            self.prefer.insert(task, resources);
        }
    }

    /// The preference set for a task with [`prefer`](Self::prefer), while it is pending.
    pub fn preference(&self, task: TaskId) -> Option<&[ResourceName]> {
        self.prefer.get(&task).map(Vec::as_slice)
    }

    /// The earliest pending deadline, so a runtime knows when to send a [`Event::Tick`].
    pub fn next_deadline(&self) -> Option<Millis> {
        self.deadlines.first().map(|(t, _)| *t)
    }

    // ---- events ----------------------------------------------------------------------------

    fn add_node(
        &mut self,
        id: NodeId,
        resources: Vec<(ResourceName, Capacity)>,
        labels: Labels,
    ) -> Result<(), CoreError> {
        if self.nodes.contains_key(&id) {
            return Err(CoreError::DuplicateNode(id));
        }
        self.time.set_end(id, super::walltime::ends_at(&labels));
        let mut node = Node {
            labels,
            ..Node::default()
        };
        for (name, total) in resources {
            if total.is_zero() {
                continue;
            }
            let r = self.names.intern(&name);
            let slot = Slot {
                total,
                used: Amount::ZERO,
            };
            if node.slots.insert(r, slot).is_none() {
                self.names.hold(r);
            }
        }
        for r in node.slots.keys() {
            self.holders.entry(*r).or_default().insert(id);
            self.shapes.wake_at(*r, id);
            self.gangs.wake(*r);
        }
        self.shapes.wake_empty_at(id);
        self.gangs.wake_empty();
        self.nodes.insert(id, node);
        Ok(())
    }

    fn remove_node(&mut self, id: NodeId, out: &mut Vec<Decision>) -> Result<(), CoreError> {
        let node = self.nodes.remove(&id).ok_or(CoreError::UnknownNode(id))?;
        self.time.set_end(id, None);
        for task in &node.running {
            self.forget_task(*task);
            out.push(Decision::Lost {
                task: *task,
                node: id,
            });
        }
        for r in node.slots.keys() {
            self.names.release(*r);
            if let Some(set) = self.holders.get_mut(r) {
                set.remove(&id);
                if set.is_empty() {
                    self.holders.remove(r);
                    self.cursors.remove(&Some(*r));
                }
            }
            self.shapes.recheck(*r);
            self.gangs.recheck(*r);
        }
        Ok(())
    }

    /// Resolves the target, checks the change on every node, then applies it everywhere.
    fn change_resource(
        &mut self,
        target: &NodeSpec,
        name: &ResourceName,
        op: CapacityOp,
    ) -> Result<Vec<NodeId>, CoreError> {
        let nodes = match target {
            NodeSpec::Local => return Err(CoreError::UnresolvedLocal),
            NodeSpec::Node(id) if self.nodes.contains_key(id) => vec![*id],
            NodeSpec::Node(id) => return Err(CoreError::UnknownNode(*id)),
            NodeSpec::Match {
                resources,
                num_nodes,
            } => self.resolve_match(resources, *num_nodes)?,
        };
        let r = self.names.get(name.as_str());
        let mut plan = Vec::with_capacity(nodes.len());
        for id in &nodes {
            let current = r.and_then(|r| self.nodes.get(id)?.slots.get(&r)).copied();
            plan.push((*id, new_total(*id, name, current.map(|s| s.total), op)?));
        }
        let r = self.names.intern(name);
        for (id, total) in plan {
            self.set_total(id, r, total);
        }
        Ok(nodes)
    }

    /// Sets the capacity of `r` on `id` to `total` (a finite zero deletes it once unused) and
    /// wakes or rechecks the shapes that request it.
    fn set_total(&mut self, id: NodeId, r: ResourceId, total: Capacity) {
        let Some(node) = self.nodes.get_mut(&id) else {
            return;
        };
        let before = node.slots.get(&r).map(|s| s.total);
        if before.is_none() {
            self.names.hold(r);
        }
        let slot = node.slots.entry(r).or_insert(Slot {
            total,
            used: Amount::ZERO,
        });
        slot.total = total;
        if slot.is_dead() {
            node.slots.remove(&r);
            self.names.release(r);
            if let Some(set) = self.holders.get_mut(&r) {
                set.remove(&id);
                if set.is_empty() {
                    self.holders.remove(&r);
                    self.cursors.remove(&Some(r));
                }
            }
        } else {
            self.holders.entry(r).or_default().insert(id);
        }
        let grew = match (before, total) {
            (None, _) => !total.is_zero(),
            (Some(Capacity::Unbounded), _) => false,
            (Some(Capacity::Finite(_)), Capacity::Unbounded) => true,
            (Some(Capacity::Finite(a)), Capacity::Finite(b)) => b > a,
        };
        let shrank = before.is_some() && before != Some(total) && !grew;
        if grew {
            self.shapes.wake_at(r, id);
            self.gangs.wake(r);
        }
        if shrank {
            self.shapes.recheck(r);
            self.gangs.recheck(r);
        }
    }

    /// A task's requirement as interned ids in id order, each name held (so that it stays
    /// interned) until the task is forgotten.
    fn hold_requirement(&mut self, resources: &ResourceSet) -> Vec<(ResourceId, Amount)> {
        let mut req: Vec<(ResourceId, Amount)> = resources
            .iter()
            .map(|(n, a)| (self.names.intern(n), a))
            .collect();
        req.sort_unstable_by_key(|(r, _)| *r);
        for (r, _) in &req {
            self.names.hold(*r);
        }
        req
    }

    fn submit(
        &mut self,
        task: TaskId,
        resources: &ResourceSet,
        deadline: Option<Millis>,
        time_limit: Option<Millis>,
        out: &mut Vec<Decision>,
    ) -> Result<(), CoreError> {
        if self.tasks.contains_key(&task) {
            return Err(CoreError::DuplicateTask(task));
        }
        let req = self.hold_requirement(resources);
        let req: Req = req.into();
        let (shape_id, shape) = self.shapes.get_or_create(&req);
        let behind_others = shape.live > 0;
        let seq = self.next_seq;
        self.next_seq += 1;
        shape.queue.push_back((task, seq));
        shape.live += 1;
        if let Some(reason) = &shape.infeasible {
            out.push(Decision::Infeasible {
                task,
                reason: reason.clone(),
            });
        }
        let req = shape.req.clone();
        self.tasks.insert(
            task,
            Task {
                req,
                place: Place::Pending {
                    shape: shape_id,
                    seq,
                },
                deadline,
            },
        );
        if let Some(at) = deadline {
            self.deadlines.insert((at, task));
        }
        if let Some(limit) = time_limit {
            self.time.limits.insert(task, limit);
        }
        if behind_others && self.time.has_ends() {
            // Its elders wait, but this one may last less than they do: it may fit a node
            // with a walltime that they would outlast.
            self.shapes
                .wake_at_nodes(shape_id, self.time.ending_nodes());
        }
        Ok(())
    }

    fn finish(&mut self, id: TaskId) -> Result<(), CoreError> {
        match self.tasks.get(&id) {
            None => Err(CoreError::UnknownTask(id)),
            Some(Task {
                place: Place::Pending { .. } | Place::Gang { .. },
                ..
            }) => Err(CoreError::NotRunning(id)),
            Some(Task {
                place: Place::Running { .. },
                ..
            }) => {
                self.release(id);
                Ok(())
            }
        }
    }

    fn cancel(&mut self, id: TaskId) -> Result<(), CoreError> {
        match self.tasks.get(&id).map(|t| t.place) {
            None => Err(CoreError::UnknownTask(id)),
            Some(Place::Running { .. }) => {
                self.release(id);
                Ok(())
            }
            Some(Place::Pending { shape, .. }) => {
                self.forget_pending(id, shape);
                Ok(())
            }
            Some(Place::Gang { gang }) => {
                self.leave_gang(id, gang);
                Ok(())
            }
        }
    }

    /// Accepts the members of a gang, all or none.
    fn submit_gang(
        &mut self,
        tasks: Vec<(TaskId, ResourceSet)>,
        strategy: escher_proto::types::GangStrategy,
        deadline: Option<Millis>,
        now: Millis,
    ) -> Result<(), CoreError> {
        let Some(first) = tasks.first().map(|(t, _)| *t) else {
            return Err(CoreError::EmptyGang);
        };
        let mut seen = BTreeSet::new();
        for (task, _) in &tasks {
            if self.tasks.contains_key(task) || !seen.insert(*task) {
                return Err(CoreError::DuplicateTask(*task));
            }
        }
        let members: Vec<TaskId> = tasks.iter().map(|(t, _)| *t).collect();
        for (task, resources) in tasks {
            let req = self.hold_requirement(&resources);
            let place = Place::Gang { gang: first };
            self.tasks.insert(
                task,
                Task {
                    req: req.into(),
                    place,
                    deadline,
                },
            );
            if let Some(at) = deadline {
                self.deadlines.insert((at, task));
            }
        }
        self.add_gang(first, members, strategy, now);
        Ok(())
    }

    /// Removes one pending member from its gang (cancelled); the rest wait on.
    fn leave_gang(&mut self, id: TaskId, gang: super::gang::GangId) {
        let Some(g) = self.gangs.gangs.get(&gang) else {
            return;
        };
        let (members, strategy, since) = (g.members.clone(), g.strategy, g.since);
        self.remove_gang(gang);
        if let Some(task) = self.forget_task(id)
            && let Some(at) = task.deadline
        {
            self.deadlines.remove(&(at, id));
        }
        let rest: Vec<TaskId> = members.into_iter().filter(|m| *m != id).collect();
        if !rest.is_empty() {
            self.add_gang(gang, rest, strategy, since);
        }
    }

    /// Forgets a pending task; its queue entry goes stale and is skipped later.
    pub(crate) fn forget_pending(&mut self, id: TaskId, shape: ShapeId) {
        if let Some(task) = self.forget_task(id)
            && let Some(at) = task.deadline
        {
            self.deadlines.remove(&(at, id));
        }
        if let Some(s) = self.shapes.shapes.get_mut(&shape) {
            s.live = s.live.saturating_sub(1);
            if s.live == 0 {
                self.shapes.remove(shape);
            }
        }
    }

    /// Releases a running task's allocation and wakes the shapes waiting for what it held.
    fn release(&mut self, id: TaskId) {
        let Some(task) = self.forget_task(id) else {
            return;
        };
        let Place::Running { node: node_id } = task.place else {
            return;
        };
        let Some(node) = self.nodes.get_mut(&node_id) else {
            return;
        };
        node.running.remove(&id);
        for (r, amount) in task.req.iter() {
            if let Some(slot) = node.slots.get_mut(r) {
                slot.used = slot.used.saturating_sub(*amount);
                if slot.is_dead() {
                    node.slots.remove(r);
                    self.names.release(*r);
                    if let Some(set) = self.holders.get_mut(r) {
                        set.remove(&node_id);
                        if set.is_empty() {
                            self.holders.remove(r);
                            self.cursors.remove(&Some(*r));
                        }
                    }
                    continue;
                }
            }
            self.shapes.wake_feasible_at(*r, node_id);
            self.gangs.wake(*r);
        }
    }

    /// Gives up on pending tasks whose deadline is at or before `now`.
    fn expire(&mut self, now: Millis, out: &mut Vec<Decision>) {
        while let Some(&(at, id)) = self.deadlines.first() {
            if at > now {
                break;
            }
            self.deadlines.pop_first();
            match self.tasks.get(&id).map(|t| t.place) {
                Some(Place::Pending { shape, .. }) => {
                    self.forget_pending(id, shape);
                    out.push(Decision::DeadlinePassed { task: id });
                }
                Some(Place::Gang { gang }) => {
                    // The whole gang gives up together.
                    let members = self
                        .gangs
                        .gangs
                        .get(&gang)
                        .map(|g| g.members.clone())
                        .unwrap_or_default();
                    self.remove_gang(gang);
                    for m in members {
                        if let Some(t) = self.forget_task(m)
                            && let Some(at) = t.deadline
                        {
                            self.deadlines.remove(&(at, m));
                        }
                        out.push(Decision::DeadlinePassed { task: m });
                    }
                }
                _ => {}
            }
        }
    }

    /// Forgets a task the core knows, releasing the names it requests. Every task leaves the
    /// core through here.
    fn forget_task(&mut self, id: TaskId) -> Option<Task> {
        self.prefer.remove(&id);
        let task = self.tasks.remove(&id)?;
        self.time.forget(id);
        for (r, _) in task.req.iter() {
            self.names.release(*r);
        }
        Some(task)
    }

    /// Frees the names nothing refers to any more (see the interner), and drops them from
    /// every index. Only names whose count fell to zero in this event are looked at.
    fn reclaim_names(&mut self) {
        for r in self.names.sweep() {
            self.holders.remove(&r);
            self.cursors.remove(&Some(r));
            self.shapes.by_resource.remove(&r);
            self.gangs.by_resource.remove(&r);
        }
    }

    /// How many resource names the core keeps (every one held by a node or requested by a
    /// pending or running task).
    pub fn name_count(&self) -> usize {
        self.names.len()
    }

    /// `resources` as a requirement vector of known ids, or `None` if a name was never seen.
    pub(crate) fn lookup_req(&self, resources: &ResourceSet) -> Option<Req> {
        let mut req = Vec::with_capacity(resources.len());
        for (name, amount) in resources.iter() {
            req.push((self.names.get(name.as_str())?, amount));
        }
        req.sort_unstable_by_key(|(r, _)| *r);
        Some(req.into())
    }
}

/// The capacity `op` leaves when applied to `current` (absent: `None`).
pub(crate) fn new_total(
    node: NodeId,
    name: &ResourceName,
    current: Option<Capacity>,
    op: CapacityOp,
) -> Result<Capacity, CoreError> {
    let current_or_zero = current.unwrap_or(Capacity::Finite(Amount::ZERO));
    match op {
        CapacityOp::Set(c) => Ok(c),
        CapacityOp::Delete => Ok(Capacity::Finite(Amount::ZERO)),
        CapacityOp::Adjust(delta) => match current_or_zero {
            Capacity::Unbounded => Ok(Capacity::Unbounded),
            Capacity::Finite(total) => adjust(node, name, total, delta).map(Capacity::Finite),
        },
    }
}

fn adjust(
    node: NodeId,
    name: &ResourceName,
    total: Amount,
    delta: Delta,
) -> Result<Amount, CoreError> {
    delta.apply_to(total).map_err(|_| {
        if delta.is_negative() {
            CoreError::NegativeCapacity {
                node,
                resource: name.clone(),
                capacity: Capacity::Finite(total),
                delta,
            }
        } else {
            CoreError::CapacityOverflow {
                node,
                resource: name.clone(),
                delta,
                max: Amount::MAX,
            }
        }
    })
}
