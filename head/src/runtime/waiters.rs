//! Clients waiting for tasks to finish (`wait`, `get`): soft state of the runtime.
//!
//! A wait keeps its own copy of the status of each task it waits for as that task finishes
//! (or at once, for one already finished). Retention may evict a finished task's record at any
//! later entry; the copy makes the answer independent of that, without the replicated state
//! having to know who waits, which only this replica does. A task evicted before the wait
//! began answers from its tombstone: ready, in its final state, marked `evicted`.

use escher_proto::types::{TaskId, TaskStatus, WaitReply};
use rustc_hash::FxHashMap;
use tokio::sync::oneshot;

use crate::state::{ApplyError, ClusterState};

/// One `wait` call in progress.
#[derive(Debug)]
struct Waiting {
    ids: Vec<TaskId>,
    num_returns: usize,
    /// The statuses of the tasks that finished so far, taken when they did.
    finished: FxHashMap<TaskId, TaskStatus>,
    reply: oneshot::Sender<Result<WaitReply, ApplyError>>,
}

/// Every `wait` call in progress, indexed by the tasks it waits for.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    next: u64,
    by_task: FxHashMap<TaskId, Vec<u64>>,
    waits: FxHashMap<u64, Waiting>,
}

impl Waiters {
    /// Registers a wait, answering at once if enough tasks are already terminal. The state
    /// must know every id (a record or a tombstone; the caller checks).
    pub(crate) fn add(
        &mut self,
        state: &ClusterState,
        ids: Vec<TaskId>,
        num_returns: usize,
        reply: oneshot::Sender<Result<WaitReply, ApplyError>>,
    ) {
        let finished = finished_now(state, &ids);
        if finished.len() >= num_returns {
            let _ = reply.send(Ok(answer(&ids, num_returns, &finished)));
            return;
        }
        let key = self.next;
        self.next += 1;
        for id in &ids {
            if !finished.contains_key(id) {
                self.by_task.entry(*id).or_default().push(key);
            }
        }
        let wait = Waiting {
            ids,
            num_returns,
            finished,
            reply,
        };
        self.waits.insert(key, wait);
    }

    /// A task became terminal: note its status in the waits for it, and answer those it
    /// completes.
    pub(crate) fn on_terminal(&mut self, state: &ClusterState, task: TaskId) {
        let Some(keys) = self.by_task.remove(&task) else {
            return;
        };
        let Some(status) = state.status(task) else {
            return;
        };
        for key in keys {
            let Some(wait) = self.waits.get_mut(&key) else {
                continue;
            };
            wait.finished.insert(task, status.clone());
            if wait.finished.len() >= wait.num_returns {
                let wait = self.waits.remove(&key).expect("present above");
                let reply = answer(&wait.ids, wait.num_returns, &wait.finished);
                let _ = wait.reply.send(Ok(reply));
            }
        }
    }

    /// Forgets waits whose caller gave up (timed out or disconnected).
    pub(crate) fn prune(&mut self) {
        self.waits.retain(|_, w| !w.reply.is_closed());
        let waits = &self.waits;
        self.by_task.retain(|_, keys| {
            keys.retain(|k| waits.contains_key(k));
            !keys.is_empty()
        });
    }

    /// Number of waits in progress.
    pub(crate) fn len(&self) -> usize {
        self.waits.len()
    }
}

/// Ray's `wait` answer: up to `num_returns` finished tasks in the order asked, the rest not
/// ready.
fn answer(
    ids: &[TaskId],
    num_returns: usize,
    finished: &FxHashMap<TaskId, TaskStatus>,
) -> WaitReply {
    let mut ready = Vec::new();
    let mut not_ready = Vec::new();
    for id in ids {
        match finished.get(id) {
            Some(status) if ready.len() < num_returns => ready.push(status.clone()),
            _ => not_ready.push(*id),
        }
    }
    WaitReply { ready, not_ready }
}

/// The `wait` answer as the state stands now (a wait that timed out): finished tasks from
/// their records or tombstones.
pub(crate) fn snapshot(state: &ClusterState, ids: &[TaskId], num_returns: usize) -> WaitReply {
    answer(ids, num_returns, &finished_now(state, ids))
}

/// The statuses of those of `ids` that have finished, from their records or tombstones.
fn finished_now(state: &ClusterState, ids: &[TaskId]) -> FxHashMap<TaskId, TaskStatus> {
    ids.iter()
        .filter(|id| state.is_finished(**id))
        .filter_map(|id| Some((*id, state.status(*id)?)))
        .collect()
}
