//! The core's invariants, checked from scratch. Tests call [`Scheduler::sanity_check`] after
//! every step.

use std::collections::BTreeMap;

use escher_proto::types::Amount;

use super::core::{Place, Scheduler};
use super::shape::Wake;

impl Scheduler {
    /// Checks every invariant and describes the first one broken.
    ///
    /// - every slot's `used` is the sum of what the tasks running on that node hold;
    /// - (safety itself is checked where it can be broken: a dispatch happens only if the node
    ///   has room for the whole allocation; a slot may hold more than its capacity only because
    ///   the capacity was lowered after its holders were admitted);
    /// - the resource-to-nodes index matches the nodes' slots exactly, and no dead slot remains;
    /// - every running task is on a live node that lists it, and every pending task sits in its
    ///   shape's queue; the shape counts and the resource-to-shapes index are exact;
    /// - deadlines and soft-locality preferences belong to pending tasks;
    /// - every interned name is referenced, and its count is exactly the number of node slots
    ///   and known tasks that refer to it; every index names only live ids (so a freed id,
    ///   which may be handed out again, can never be mistaken for the name it had);
    /// - a starving gang's hold names a waiting, feasible gang and live nodes;
    /// - **liveness**: no pending task fits any live node beside a starving gang's hold (the
    ///   queue heads are checked; within a shape all tasks are alike but for their time limits,
    ///   so on a node with an end only a shape with a task without a limit is checked) and no
    ///   shape is left woken.
    pub fn sanity_check(&self) -> Result<(), String> {
        // A soft-locality preference lives only while its task waits.
        for task in self.prefer.keys() {
            if !self.is_pending(*task) {
                return Err(format!("task {task} has a preference but is not pending"));
            }
        }
        // Allocations per node and resource, recomputed from the running tasks.
        let mut held: BTreeMap<(u64, u32), Amount> = BTreeMap::new();
        for (id, task) in &self.tasks {
            match task.place {
                Place::Running { node } => {
                    let n = self
                        .nodes
                        .get(&node)
                        .ok_or(format!("task {id} runs on dead node {node}"))?;
                    if !n.running.contains(id) {
                        return Err(format!("node {node} does not list its task {id}"));
                    }
                    for (r, a) in task.req.iter() {
                        let e = held.entry((node.0, r.0)).or_default();
                        *e = e.checked_add(*a).map_err(|e| e.to_string())?;
                    }
                }
                Place::Pending { shape, seq } => {
                    let s = self
                        .shapes
                        .shapes
                        .get(&shape)
                        .ok_or(format!("task {id} in dead shape"))?;
                    if !s.queue.contains(&(*id, seq)) {
                        return Err(format!("pending task {id} is not queued in its shape"));
                    }
                    if s.req != task.req {
                        return Err(format!("task {id} and its shape disagree on requirements"));
                    }
                }
                Place::Gang { gang } => {
                    let g = self
                        .gangs
                        .gangs
                        .get(&gang)
                        .ok_or(format!("task {id} in dead gang"))?;
                    if !g.members.contains(id) {
                        return Err(format!("task {id} is not a member of its gang"));
                    }
                    for (r, _) in task.req.iter() {
                        if !self
                            .gangs
                            .by_resource
                            .get(r)
                            .is_some_and(|s| s.contains(&gang))
                        {
                            return Err(format!("gang {gang} is missing from the resource index"));
                        }
                    }
                }
            }
        }
        if let Some(hold) = &self.hold {
            let gang = self.gangs.gangs.get(&hold.gang);
            if gang.is_none_or(|g| g.infeasible.is_some()) {
                return Err(format!("a hold for gang {} that does not wait", hold.gang));
            }
            if let Some((node, _)) = hold.taken.keys().find(|(n, _)| !self.nodes.contains_key(n)) {
                return Err(format!("gang {} holds dead node {node}", hold.gang));
            }
        }
        for (gang_id, gang) in &self.gangs.gangs {
            if gang.woken || gang.recheck {
                return Err(format!("gang {gang_id} keeps a wake-up after a round"));
            }
            for m in &gang.members {
                if self.tasks.get(m).map(|t| t.place) != Some(Place::Gang { gang: *gang_id }) {
                    return Err(format!(
                        "gang {gang_id} lists {m}, which is not pending in it"
                    ));
                }
            }
        }
        for (node_id, node) in &self.nodes {
            for task in &node.running {
                if self.tasks.get(task).map(|t| t.place) != Some(Place::Running { node: *node_id })
                {
                    return Err(format!(
                        "node {node_id} lists task {task} that does not run there"
                    ));
                }
            }
            for (r, slot) in &node.slots {
                let Some(name) = self.names.name(*r) else {
                    return Err(format!("node {node_id} has a slot of freed id {}", r.0));
                };
                let expect = held.remove(&(node_id.0, r.0)).unwrap_or_default();
                if slot.used != expect {
                    return Err(format!(
                        "node {node_id} {name}: used {} but running tasks hold {expect}",
                        slot.used
                    ));
                }
                if slot.is_dead() {
                    return Err(format!("node {node_id} keeps dead slot {name}"));
                }
                if !self.holders.get(r).is_some_and(|h| h.contains(node_id)) {
                    return Err(format!("index misses {name} on node {node_id}"));
                }
            }
        }
        if let Some(((node, r), _)) = held.into_iter().next() {
            return Err(format!(
                "tasks hold resource id {r} on node {node}, which has no such slot"
            ));
        }
        for (r, nodes) in &self.holders {
            for n in nodes {
                if !self
                    .nodes
                    .get(n)
                    .is_some_and(|node| node.slots.contains_key(r))
                {
                    return Err(format!("index lists node {n} for a resource it lacks"));
                }
            }
        }
        for (at, id) in &self.deadlines {
            match self.tasks.get(id) {
                Some(t) if !matches!(t.place, Place::Running { .. }) && t.deadline == Some(*at) => {
                }
                _ => {
                    return Err(format!(
                        "deadline {at} of task {id} is not a pending task's"
                    ));
                }
            }
        }
        self.check_names()?;
        self.check_shapes()
    }

    /// Recounts every reference to every resource id from scratch and compares.
    fn check_names(&self) -> Result<(), String> {
        self.names.check()?;
        let mut refs: BTreeMap<u32, u32> = BTreeMap::new();
        let slots = self.nodes.values().flat_map(|n| n.slots.keys());
        let requested = self
            .tasks
            .values()
            .flat_map(|t| t.req.iter().map(|(r, _)| r));
        for r in slots.chain(requested) {
            *refs.entry(r.0).or_default() += 1;
        }
        for (id, name, count) in self.names.iter() {
            let counted = refs.remove(&id.0).unwrap_or(0);
            if counted != count {
                return Err(format!(
                    "name {name} counts {count} references but {counted} slots and tasks hold it"
                ));
            }
        }
        if let Some((id, _)) = refs.into_iter().next() {
            return Err(format!("resource id {id} is in use but not live"));
        }
        let indexed = self
            .holders
            .keys()
            .chain(self.shapes.by_resource.keys())
            .chain(self.gangs.by_resource.keys())
            .chain(self.cursors.keys().flatten());
        for r in indexed {
            if !self.names.is_live(*r) {
                return Err(format!("an index keeps freed resource id {}", r.0));
            }
        }
        Ok(())
    }

    fn check_shapes(&self) -> Result<(), String> {
        if !self.shapes.woken.is_empty() {
            return Err("shapes left woken after a round".into());
        }
        for (id, shape) in &self.shapes.shapes {
            if shape.wake != Wake::None || shape.recheck {
                return Err(format!("shape {id:?} keeps a wake-up after a round"));
            }
            let live = shape
                .queue
                .iter()
                .filter(|(t, seq)| {
                    self.tasks.get(t).is_some_and(|t| {
                        t.place
                            == Place::Pending {
                                shape: *id,
                                seq: *seq,
                            }
                    })
                })
                .count();
            if live != shape.live || live == 0 {
                return Err(format!(
                    "shape {id:?} counts {} live tasks, has {live}",
                    shape.live
                ));
            }
            if self.shapes.by_req.get(&shape.req) != Some(id) {
                return Err(format!("shape {id:?} is not indexed by its requirements"));
            }
            for (r, _) in shape.req.iter() {
                if !self
                    .shapes
                    .by_resource
                    .get(r)
                    .is_some_and(|s| s.contains(id))
                {
                    return Err(format!("shape {id:?} is missing from the resource index"));
                }
            }
            // On a node with an end, a waiting task may be one that outlasts it: only a task
            // without a limit, with no least time left set, is known to fit there whatever
            // the time.
            let unlimited = || {
                shape.queue.iter().any(|(task, seq)| {
                    self.tasks.get(task).is_some_and(|t| {
                        t.place
                            == Place::Pending {
                                shape: *id,
                                seq: *seq,
                            }
                    }) && !self.time.limits.contains_key(task)
                        && self.time.min_left == 0
                })
            };
            if let Some(node) = self.nodes.keys().find(|n| {
                self.fits_beside_hold(**n, &shape.req)
                    && (!self.time.ending_nodes().any(|e| e == **n) || unlimited())
            }) {
                return Err(format!(
                    "liveness: shape {id:?} {:?} waits although node {} has room",
                    shape.req, node
                ));
            }
            let feasible = self.nodes.values().any(|n| n.could_hold(&shape.req));
            if !shape.req.is_empty() && feasible == shape.infeasible.is_some() {
                return Err(format!(
                    "shape {id:?} is marked {} but is {}",
                    if shape.infeasible.is_some() {
                        "infeasible"
                    } else {
                        "feasible"
                    },
                    if feasible { "feasible" } else { "infeasible" }
                ));
            }
        }
        Ok(())
    }
}
