//! Incarnations: a state restored from a backup begins a new one.
//!
//! A backup is the state as of one moment, and the cluster it was taken from may have gone on
//! after it: given out task and node ids, run and ended attempts, acknowledged outcomes that
//! the restored state knows nothing of. Its workers come back by themselves, still running
//! what they ran, with per-task log files named by those ids. So a restored state is a new
//! incarnation of its cluster (same cluster id, same node identities), which:
//!
//! - **never gives out an id given out before**, those after the backup included. The state
//!   cannot know how many the cluster gave out after the backup, so it skips what the fastest
//!   cluster could have: [`TASK_IDS_PER_SECOND`] task ids and [`NODE_IDS_PER_SECOND`] node ids
//!   for every second from the backup to the restore, plus [`CLOCK_MARGIN_MS`] of each for the
//!   clocks that measured the two moments. The bound grows with the restore's time, so two
//!   restores of one backup skip past each other too (the later one skips at least what the
//!   earlier one could have given out meanwhile).
//! - **reconciles each returning node strictly** (`nodes.rs`): an attempt the state believes
//!   runs there that the worker neither runs nor reported may have ended after the backup, so
//!   it is counted as failed, with the reason, and retried under `max_retries` (never sent
//!   again: the worker ran it already); what the worker runs that the state does not run there
//!   is stopped; a task that waits here while its worker runs a later attempt of it numbers
//!   its next attempt past that one.
//! - **names itself** ([`Incarnation::id`], the first task id it gives out), which the head
//!   tells every worker that registers: a worker that sees it change forgets which attempts it
//!   ran, since the restored state numbers attempts from what the backup knew.
//!
//! The change happens at the first entry the restored state applies (whatever that entry is),
//! with that entry's time: every replica of a restored group applies the same entries, so
//! they agree on it, and no id is given out before it.

use std::collections::BTreeSet;

use escher_proto::types::NodeId;
use serde::{Deserialize, Serialize};

use super::apply::ClusterState;
use crate::scheduler::Millis;

/// The most task ids a cluster is taken to give out per second between a backup and its
/// restore: 2.5 times the fastest submission escher has measured (386,000 tasks/s, W8 in
/// BENCHMARKS.md).
pub const TASK_IDS_PER_SECOND: u64 = 1_000_000;
/// The most node ids a cluster is taken to give out per second between a backup and its
/// restore.
pub const NODE_IDS_PER_SECOND: u64 = 1_000;
/// How far apart the clock that stamped the backup and the clock of the restored leader may
/// be: the skip counts this much more time.
pub const CLOCK_MARGIN_MS: u64 = 10 * 60 * 1000;

/// Which life of its cluster a state is in (see the module documentation of `incarnation.rs`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Incarnation {
    /// 0 for a state never restored; one more at each restore.
    pub number: u64,
    /// The first task id this incarnation gave out (0 for the first incarnation).
    pub first_task: u64,
    /// When it began, in milliseconds since the Unix epoch (0 for the first).
    pub began_at: Millis,
    /// When the backup it was restored from was taken (0 for the first).
    pub backup_taken_at: Millis,
    /// A restore that has not begun yet: when its backup was taken. Set when a state is read
    /// from a backup, taken by the first entry applied.
    pub pending: Option<Millis>,
    /// The nodes that were live when it began and have not come back since: the first return
    /// of each is reconciled strictly.
    pub unreconciled: BTreeSet<NodeId>,
    /// The task ids skipped (by restores and by lost log tails), as `[from, to)` ranges, the
    /// last [`MAX_SKIPS_KEPT`]: an id in one was never given out by this state (if at all, by
    /// the cluster's life before the restore), so asking for it is "unknown task", not
    /// "evicted".
    pub skipped: Vec<(u64, u64)>,
}

/// How many skipped ranges of task ids a state remembers.
pub const MAX_SKIPS_KEPT: usize = 16;

impl Incarnation {
    /// The incarnation's name, never repeated in its cluster: the first task id it gave out
    /// (0 for a state never restored).
    pub fn id(&self) -> u64 {
        self.first_task
    }

    /// Whether task id `id` lies in a range this state skipped (never gave out).
    pub fn skipped(&self, id: u64) -> bool {
        self.skipped.iter().any(|&(from, to)| from <= id && id < to)
    }
}

/// The ids a restore skips for a backup taken at `taken_at` and restored at `now`: (task
/// ids, node ids).
pub fn ids_to_skip(taken_at: Millis, now: Millis) -> (u64, u64) {
    let span_ms = now.saturating_sub(taken_at).saturating_add(CLOCK_MARGIN_MS);
    let per_ms = |per_second: u64| span_ms.saturating_mul(per_second).div_ceil(1000);
    (per_ms(TASK_IDS_PER_SECOND), per_ms(NODE_IDS_PER_SECOND))
}

impl ClusterState {
    /// This state read from a backup taken at `taken_at` (milliseconds since the Unix epoch):
    /// the first entry it applies begins a new incarnation.
    pub fn restored_from_backup(mut self, taken_at: Millis) -> ClusterState {
        self.incarnation.pending = Some(taken_at);
        self
    }

    /// Which incarnation this state is in.
    pub fn incarnation(&self) -> &Incarnation {
        &self.incarnation
    }

    /// Puts back the incarnation a snapshot kept beside the state (see `codec.rs` in the head:
    /// it travels after the state, so that images without it still read).
    pub fn set_incarnation(&mut self, incarnation: Incarnation) {
        self.incarnation = incarnation;
    }

    /// Begins the new incarnation of a restored state, at the first entry it applies.
    pub(crate) fn begin_incarnation(&mut self, now: Millis) {
        let Some(taken_at) = self.incarnation.pending.take() else {
            return;
        };
        let (tasks, nodes) = ids_to_skip(taken_at, now);
        self.skip_task_ids(tasks);
        self.next_node = self.next_node.saturating_add(nodes);
        let live: BTreeSet<NodeId> = self
            .nodes
            .iter()
            .filter(|(_, r)| r.alive)
            .map(|(id, _)| *id)
            .collect();
        self.incarnation = Incarnation {
            number: self.incarnation.number + 1,
            first_task: self.next_task,
            began_at: now,
            backup_taken_at: taken_at,
            pending: None,
            unreconciled: live,
            skipped: std::mem::take(&mut self.incarnation.skipped),
        };
        tracing::warn!(
            incarnation = self.incarnation.number,
            backup_taken_at = taken_at,
            skipped_task_ids = tasks,
            skipped_node_ids = nodes,
            next_task = self.next_task,
            next_node = self.next_node,
            nodes_to_reconcile = self.incarnation.unreconciled.len(),
            "restored from a backup: a new incarnation of the cluster begins; ids given out \
             after the backup are skipped, and each returning worker is reconciled with what \
             the backup believed it ran"
        );
    }

    /// Skips `count` task ids, remembering the range.
    pub(crate) fn skip_task_ids(&mut self, count: u64) {
        let from = self.next_task;
        self.next_task = self.next_task.saturating_add(count);
        let skipped = &mut self.incarnation.skipped;
        skipped.push((from, self.next_task));
        if skipped.len() > MAX_SKIPS_KEPT {
            skipped.remove(0);
        }
    }

    /// Why an attempt the state believed runs on `node` counts as failed when that node's
    /// worker returns to a restored state without it.
    pub(crate) fn restored_attempt_lost(&self, node: NodeId) -> String {
        format!(
            "the head was restored from a backup taken at {} ms; node {node}'s worker returned \
             neither running this attempt nor reporting its end, so it may have ended after the \
             backup and its outcome is unknown",
            self.incarnation.backup_taken_at
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_skip_grows_with_the_time_since_the_backup() {
        let (tasks, nodes) = ids_to_skip(1_000, 1_000);
        assert_eq!(tasks, CLOCK_MARGIN_MS * 1000);
        assert_eq!(nodes, CLOCK_MARGIN_MS);
        // Two restores of one backup a second apart: the later skips past all the earlier
        // could have given out in that second.
        let (first, _) = ids_to_skip(1_000, 60_000);
        let (second, _) = ids_to_skip(1_000, 61_000);
        assert_eq!(second - first, TASK_IDS_PER_SECOND);
        // A restoring clock behind the backup's counts no negative time.
        assert_eq!(ids_to_skip(5_000, 1_000), ids_to_skip(1_000, 1_000));
    }
}
