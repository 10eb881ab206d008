//! Clients waiting for tasks to finish (`wait`, `get`): soft state of the leader. A replica
//! that stops leading answers every wait with "not leader"; the client asks the new leader.

use escher_proto::types::{TaskId, WaitReply};
use rustc_hash::FxHashMap;
use tokio::sync::oneshot;
use tonic::Status;

use crate::state::ClusterState;

/// One `wait` call in progress.
#[derive(Debug)]
struct Waiting {
    ids: Vec<TaskId>,
    num_returns: usize,
    /// Terminal tasks still needed before it is answered.
    remaining: usize,
    reply: oneshot::Sender<Result<WaitReply, Status>>,
}

/// Every `wait` call in progress, indexed by the tasks it waits for.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    next: u64,
    by_task: FxHashMap<TaskId, Vec<u64>>,
    waits: FxHashMap<u64, Waiting>,
}

impl Waiters {
    /// Registers a wait, answering at once if enough tasks are already terminal. The ids must
    /// be known tasks (the caller checks).
    pub(crate) fn add(
        &mut self,
        state: &ClusterState,
        ids: Vec<TaskId>,
        num_returns: usize,
        reply: oneshot::Sender<Result<WaitReply, Status>>,
    ) {
        let done = ids.iter().filter(|id| is_terminal(state, **id)).count();
        if done >= num_returns {
            let _ = reply.send(Ok(snapshot(state, &ids, num_returns)));
            return;
        }
        let key = self.next;
        self.next += 1;
        for id in &ids {
            if !is_terminal(state, *id) {
                self.by_task.entry(*id).or_default().push(key);
            }
        }
        let remaining = num_returns - done;
        self.waits.insert(
            key,
            Waiting {
                ids,
                num_returns,
                remaining,
                reply,
            },
        );
    }

    /// A task became terminal: answer the waits it completes.
    pub(crate) fn on_terminal(&mut self, state: &ClusterState, task: TaskId) {
        let Some(keys) = self.by_task.remove(&task) else {
            return;
        };
        for key in keys {
            let Some(wait) = self.waits.get_mut(&key) else {
                continue;
            };
            wait.remaining -= 1;
            if wait.remaining == 0 {
                let wait = self.waits.remove(&key).expect("present above");
                let _ = wait
                    .reply
                    .send(Ok(snapshot(state, &wait.ids, wait.num_returns)));
            }
        }
    }

    /// Answers every wait with `status` (this replica stopped leading).
    pub(crate) fn fail_all(&mut self, status: impl Fn() -> Status) {
        self.by_task.clear();
        for (_, wait) in std::mem::take(&mut self.waits) {
            let _ = wait.reply.send(Err(status()));
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

fn is_terminal(state: &ClusterState, id: TaskId) -> bool {
    state.task(id).is_some_and(|r| r.state.is_terminal())
}

/// Ray's `wait` answer: up to `num_returns` terminal tasks in the order asked, the rest not
/// ready.
pub(crate) fn snapshot(state: &ClusterState, ids: &[TaskId], num_returns: usize) -> WaitReply {
    let mut ready = Vec::new();
    let mut not_ready = Vec::new();
    for id in ids {
        match state.status(*id) {
            Some(status) if status.state.is_terminal() && ready.len() < num_returns => {
                ready.push(status);
            }
            _ => not_ready.push(*id),
        }
    }
    WaitReply { ready, not_ready }
}
