//! Lineage: which task submitted which.
//!
//! A task submitted from inside a running task (with that task's credential) is recorded with
//! its parent, by [`Command::SubmitChildren`](super::Command::SubmitChildren): the head takes
//! the parent from the caller's authenticated credential, never from a field of the request.
//! A recursive cancel ([`Command::CancelTasks`](super::Command::CancelTasks)) ends the tasks
//! and every descendant that has not ended, in the one entry.
//!
//! The map is part of a snapshot from data format 11 on (written after the registration
//! numbers by the head's codec); a group writing an older format submits with
//! [`Command::Submit`](super::Command::Submit) and records no parent. Each link lives as long
//! as the child's record: retention's eviction of the child drops it (the parent's eviction
//! does not, so `escher info` of a child still names its parent).

use std::collections::{BTreeMap, BTreeSet};

use escher_proto::types::TaskId;
use serde::{Deserialize, Serialize};

use super::apply::ClusterState;

/// Each recorded child's parent, and (derived) each parent's recorded children.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Lineage {
    parents: BTreeMap<TaskId, TaskId>,
    /// Derived from `parents` (rebuilt when a snapshot is read), so not encoded.
    #[serde(skip)]
    children: BTreeMap<TaskId, BTreeSet<TaskId>>,
}

impl PartialEq for Lineage {
    fn eq(&self, other: &Self) -> bool {
        self.parents == other.parents
    }
}

impl Eq for Lineage {}

impl Lineage {
    /// Whether no task has a recorded parent (a snapshot then needs no newer format for it).
    pub fn is_empty(&self) -> bool {
        self.parents.is_empty()
    }

    /// How many tasks have a recorded parent.
    pub fn len(&self) -> usize {
        self.parents.len()
    }

    /// The parent of `task`, if recorded.
    pub fn parent(&self, task: TaskId) -> Option<TaskId> {
        self.parents.get(&task).copied()
    }

    /// The recorded children of `task`, in id order.
    pub fn children(&self, task: TaskId) -> impl Iterator<Item = TaskId> + '_ {
        self.children.get(&task).into_iter().flatten().copied()
    }

    /// `child` was submitted by `parent`.
    pub(crate) fn link(&mut self, child: TaskId, parent: TaskId) {
        self.parents.insert(child, parent);
        self.children.entry(parent).or_default().insert(child);
    }

    /// `task`'s record is gone (retention evicted it): its own link goes.
    pub(crate) fn forget(&mut self, task: TaskId) {
        let Some(parent) = self.parents.remove(&task) else {
            return;
        };
        if let std::collections::btree_map::Entry::Occupied(mut e) = self.children.entry(parent) {
            e.get_mut().remove(&task);
            if e.get().is_empty() {
                e.remove();
            }
        }
    }

    /// Rebuilds the derived children index (after decoding).
    fn reindex(&mut self) {
        self.children.clear();
        for (child, parent) in &self.parents {
            self.children.entry(*parent).or_default().insert(*child);
        }
    }
}

impl ClusterState {
    /// Which task submitted which (`lineage.rs`).
    pub fn lineage(&self) -> &Lineage {
        &self.lineage
    }

    /// The task that submitted `task`, if one was recorded.
    pub fn parent_of(&self, task: TaskId) -> Option<TaskId> {
        self.lineage.parent(task)
    }

    /// Sets the lineage (a snapshot that carries it was read).
    pub fn set_lineage(&mut self, mut lineage: Lineage) {
        lineage.reindex();
        self.lineage = lineage;
    }

    /// `ids` and, in order after them, every recorded descendant of theirs that has a record
    /// and has not ended, each once. A finished task's children are followed too: a finished
    /// parent may have left running children behind.
    pub(crate) fn with_descendants(&self, ids: &[TaskId]) -> Vec<TaskId> {
        let mut seen: BTreeSet<TaskId> = ids.iter().copied().collect();
        let mut out: Vec<TaskId> = ids.to_vec();
        let mut next = 0;
        while next < out.len() {
            let id = out[next];
            next += 1;
            for child in self.lineage.children(id) {
                if seen.insert(child) {
                    out.push(child);
                }
            }
        }
        let (given, found) = out.split_at(ids.len());
        let mut result = given.to_vec();
        result.extend(found.iter().copied().filter(|id| {
            self.tasks
                .get(id)
                .is_some_and(|rec| !rec.state.is_terminal())
        }));
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_indexed_both_ways_and_forgotten_with_the_child() {
        let mut l = Lineage::default();
        l.link(TaskId(2), TaskId(1));
        l.link(TaskId(3), TaskId(1));
        l.link(TaskId(4), TaskId(3));
        assert_eq!(l.parent(TaskId(4)), Some(TaskId(3)));
        assert_eq!(
            l.children(TaskId(1)).collect::<Vec<_>>(),
            [TaskId(2), TaskId(3)]
        );
        // The parent's eviction keeps its children's links.
        l.forget(TaskId(1));
        assert_eq!(l.parent(TaskId(2)), Some(TaskId(1)));
        l.forget(TaskId(2));
        l.forget(TaskId(3));
        assert_eq!(l.children(TaskId(1)).count(), 0);
        assert_eq!(l.len(), 1);
        // Decoded, the index is rebuilt.
        let config = bincode::config::standard();
        let bytes = bincode::serde::encode_to_vec(&l, config).unwrap();
        let (mut back, _): (Lineage, usize) =
            bincode::serde::decode_from_slice(&bytes, config).unwrap();
        back.reindex();
        assert_eq!(back, l);
        assert_eq!(back.children(TaskId(3)).collect::<Vec<_>>(), [TaskId(4)]);
    }
}
