//! Shapes: pending tasks grouped by identical requirements, each group a FIFO queue.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use escher_proto::types::{Amount, NodeId, TaskId};
use rustc_hash::FxHashMap;

use super::event::InfeasibleReason;
use super::interner::ResourceId;

/// A requirement vector, sorted by resource id, zero amounts removed. Shared by a shape and its
/// tasks, so running tasks keep it after their shape is gone.
pub(crate) type Req = Arc<[(ResourceId, Amount)]>;

/// A shape's id; ids only grow, so they also order shapes by creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub(crate) struct ShapeId(pub(crate) u64);

/// Where a woken shape should look for room in the next round.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Wake {
    /// Not woken.
    #[default]
    None,
    /// Only these nodes changed in its favour.
    Nodes(BTreeSet<NodeId>),
    /// Look everywhere (a new shape).
    All,
}

impl Wake {
    pub(crate) fn add_node(&mut self, node: NodeId) {
        match self {
            Wake::None => *self = Wake::Nodes(BTreeSet::from([node])),
            Wake::Nodes(nodes) => {
                nodes.insert(node);
            }
            Wake::All => {}
        }
    }
}

/// One queue of pending tasks with identical requirements.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Shape {
    pub(crate) req: Req,
    /// Queue entries are `(task, submission sequence)`; an entry whose task is no longer pending
    /// under that sequence number is stale and skipped.
    pub(crate) queue: VecDeque<(TaskId, u64)>,
    /// Number of live (non-stale) entries.
    pub(crate) live: usize,
    /// Set while no live node could hold this shape.
    pub(crate) infeasible: Option<Arc<InfeasibleReason>>,
    /// Where to look in the next round.
    pub(crate) wake: Wake,
    /// A capacity fell or a node left: check in the next round whether it is still feasible.
    pub(crate) recheck: bool,
}

/// All shapes with pending tasks, and the index from resource to the shapes that request it.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Shapes {
    #[serde(serialize_with = "super::sorted::sorted")]
    pub(crate) by_req: FxHashMap<Req, ShapeId>,
    #[serde(serialize_with = "super::sorted::sorted")]
    pub(crate) shapes: FxHashMap<ShapeId, Shape>,
    /// For each resource, the shapes that request it. The empty shape is in none of these.
    /// Lists are small and unordered (wake-ups are sets); an emptied list keeps its allocation.
    #[serde(serialize_with = "super::sorted::sorted")]
    pub(crate) by_resource: FxHashMap<ResourceId, Vec<ShapeId>>,
    /// The shape that requests nothing, if it has pending tasks.
    pub(crate) empty: Option<ShapeId>,
    /// Shapes to examine in the next round.
    pub(crate) woken: BTreeSet<ShapeId>,
    next_id: u64,
}

impl Shapes {
    /// The shape for `req`, created (and woken everywhere) if new.
    pub(crate) fn get_or_create(&mut self, req: &Req) -> (ShapeId, &mut Shape) {
        let id = match self.by_req.get(req) {
            Some(id) => *id,
            None => {
                let id = ShapeId(self.next_id);
                self.next_id += 1;
                self.by_req.insert(req.clone(), id);
                if req.is_empty() {
                    self.empty = Some(id);
                }
                for (r, _) in req.iter() {
                    self.by_resource.entry(*r).or_default().push(id);
                }
                self.woken.insert(id);
                id
            }
        };
        // `by_req` and `shapes` are kept together (`remove` drops both), so the entry exists
        // for a known requirement; the type does not need that to hold.
        let shape = self.shapes.entry(id).or_insert_with(|| Shape {
            req: req.clone(),
            queue: VecDeque::new(),
            live: 0,
            infeasible: None,
            wake: Wake::All,
            recheck: false,
        });
        (id, shape)
    }

    /// Forgets a shape with no live tasks.
    pub(crate) fn remove(&mut self, id: ShapeId) {
        let Some(shape) = self.shapes.remove(&id) else {
            return;
        };
        debug_assert_eq!(shape.live, 0);
        self.by_req.remove(&shape.req);
        if self.empty == Some(id) {
            self.empty = None;
        }
        for (r, _) in shape.req.iter() {
            if let Some(list) = self.by_resource.get_mut(r)
                && let Some(at) = list.iter().position(|s| *s == id)
            {
                list.swap_remove(at);
            }
        }
        self.woken.remove(&id);
    }

    /// Wakes every shape requesting `r`, to look at `node`.
    pub(crate) fn wake_at(&mut self, r: ResourceId, node: NodeId) {
        if let Some(ids) = self.by_resource.get(&r) {
            for id in ids {
                if let Some(shape) = self.shapes.get_mut(id) {
                    shape.wake.add_node(node);
                    self.woken.insert(*id);
                }
            }
        }
    }

    /// Wakes the shapes requesting `r` that some live node could hold, to look at `node`,
    /// where a task freed some of `r`. A shape that no node could hold is left asleep: freed
    /// capacity changes no node's totals, which its feasibility reads alone (the closest
    /// nodes its reason names can lose one whose deleted resource's last holder ended; the
    /// reason catches up when a capacity it requests next grows). Waking them re-explained
    /// each at every task's end, a look at every node holding what it requests: in E2 at 100
    /// nodes, where a user's tasks waiting on nodes that left its share are infeasible until
    /// withdrawn, that held the head's loop for most of 135 ms at B's arrival (profiled;
    /// `closest` 1.5% of the run's CPU samples, 0.14% without).
    pub(crate) fn wake_feasible_at(&mut self, r: ResourceId, node: NodeId) {
        if let Some(ids) = self.by_resource.get(&r) {
            for id in ids {
                if let Some(shape) = self.shapes.get_mut(id)
                    && shape.infeasible.is_none()
                {
                    shape.wake.add_node(node);
                    self.woken.insert(*id);
                }
            }
        }
    }

    /// Wakes shape `id` to look at `nodes`.
    pub(crate) fn wake_at_nodes(&mut self, id: ShapeId, nodes: impl IntoIterator<Item = NodeId>) {
        if let Some(shape) = self.shapes.get_mut(&id) {
            for node in nodes {
                shape.wake.add_node(node);
            }
            self.woken.insert(id);
        }
    }

    /// Wakes the shape that requests nothing, to look at `node`.
    pub(crate) fn wake_empty_at(&mut self, node: NodeId) {
        if let Some(id) = self.empty
            && let Some(shape) = self.shapes.get_mut(&id)
        {
            shape.wake.add_node(node);
            self.woken.insert(id);
        }
    }

    /// Asks every feasible shape requesting `r` to check that it still is.
    pub(crate) fn recheck(&mut self, r: ResourceId) {
        if let Some(ids) = self.by_resource.get(&r) {
            for id in ids {
                if let Some(shape) = self.shapes.get_mut(id)
                    && shape.infeasible.is_none()
                {
                    shape.recheck = true;
                    self.woken.insert(*id);
                }
            }
        }
    }
}
