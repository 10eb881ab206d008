//! One live node as the core sees it: capacities, use, and the tasks running there.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

use escher_proto::types::{Amount, Capacity, Labels, TaskId};
use rustc_hash::FxHashMap;

use super::interner::ResourceId;

/// Capacity and use of one resource on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Slot {
    pub(crate) total: Capacity,
    pub(crate) used: Amount,
}

impl Slot {
    /// Whether `amount` more can be admitted.
    pub(crate) fn admits(&self, amount: Amount) -> bool {
        self.total.admits(self.used, amount)
    }

    /// A slot with no capacity and no holders is gone.
    pub(crate) fn is_dead(&self) -> bool {
        self.total.is_zero() && self.used.is_zero()
    }
}

/// A live node.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Node {
    pub(crate) labels: Labels,
    #[serde(serialize_with = "super::sorted::sorted")]
    pub(crate) slots: FxHashMap<ResourceId, Slot>,
    /// Tasks running here, ordered so that losing the node reports them deterministically.
    pub(crate) running: BTreeSet<TaskId>,
}

impl Node {
    /// Whether a task requesting `req` can be admitted here now: it fits, and the node's disk
    /// is not under its reserve (a task placed there would wait, unstarted).
    pub(crate) fn fits(&self, req: &[(ResourceId, Amount)]) -> bool {
        !self.paused()
            && req
                .iter()
                .all(|(r, a)| self.slots.get(r).is_some_and(|s| s.admits(*a)))
    }

    /// Whether the node admits nothing new for now, though it could hold what it holds: its
    /// labels say its disk is under its reserve
    /// ([`DISK_UNDER_RESERVE_LABEL`](escher_proto::types::DISK_UNDER_RESERVE_LABEL)). Only
    /// what may run *now* asks this; whether a task could ever run here does not.
    pub(crate) fn paused(&self) -> bool {
        escher_proto::types::under_disk_reserve(&self.labels)
    }

    /// Whether a task requesting `req` could ever be admitted here (if the node were idle).
    pub(crate) fn could_hold(&self, req: &[(ResourceId, Amount)]) -> bool {
        self.missing(req).next().is_none()
    }

    /// The requirements this node could never meet, even idle.
    pub(crate) fn missing<'a>(
        &'a self,
        req: &'a [(ResourceId, Amount)],
    ) -> impl Iterator<Item = (ResourceId, Amount)> + 'a {
        req.iter()
            .filter(|(r, a)| !self.slots.get(r).is_some_and(|s| s.total.could_hold(*a)))
            .copied()
    }
}
