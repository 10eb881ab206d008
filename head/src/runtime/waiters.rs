//! Clients waiting for tasks to finish (`wait`, `get`): soft state of the leader. A replica
//! that stops leading answers every wait with "not leader"; the client asks the new leader.
//!
//! A wait keeps its own copy of the status of each task it waits for as that task finishes
//! (or at once, for one already finished). Retention may evict a finished task's record at any
//! later entry; the copy makes the answer independent of that, without the replicated state
//! having to know who waits, which only this replica does. A task evicted before the wait
//! began answers from its tombstone: ready, in its final state, marked `evicted`.

use escher_proto::types::{TaskId, TaskStatus, WaitReply};
use rustc_hash::FxHashMap;
use tokio::sync::oneshot;

use tonic::Status;

use crate::state::ClusterState;

/// One `wait` call in progress.
#[derive(Debug)]
struct Waiting {
    ids: Vec<TaskId>,
    num_returns: usize,
    /// The statuses of the tasks that finished so far, taken when they did.
    finished: FxHashMap<TaskId, TaskStatus>,
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
    /// Registers a wait, answering at once if enough tasks are already terminal. The state
    /// must know every id (a record or a tombstone; the caller checks).
    pub(crate) fn add(
        &mut self,
        state: &ClusterState,
        ids: Vec<TaskId>,
        num_returns: usize,
        reply: oneshot::Sender<Result<WaitReply, Status>>,
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

    /// A task became terminal, with `status` as it stood right then: note it in the waits for
    /// it, and answer those it completes.
    pub(crate) fn on_terminal(&mut self, status: TaskStatus) {
        let Some(keys) = self.by_task.remove(&status.id) else {
            return;
        };
        for key in keys {
            let Some(wait) = self.waits.get_mut(&key) else {
                continue;
            };
            wait.finished.insert(status.id, status.clone());
            if wait.finished.len() >= wait.num_returns {
                let wait = self.waits.remove(&key).expect("present above");
                let reply = answer(&wait.ids, wait.num_returns, &wait.finished);
                let _ = wait.reply.send(Ok(reply));
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use escher_proto::types::{
        Labels, ResourceSet, TaskFinished, TaskKind, TaskResult, TaskSpec, TaskState,
    };

    use super::*;
    use crate::state::{Command, Effect, Entry, Joining, RetentionPolicy, SecretHash, StateConfig};

    /// A state that keeps one finished task, and the waiters the runtime would drive.
    struct Env {
        state: ClusterState,
        waiters: Waiters,
        now: u64,
    }

    impl Env {
        fn new() -> Env {
            let config = StateConfig {
                retention: RetentionPolicy {
                    finished: 1,
                    tombstones: 10,
                    ..RetentionPolicy::default()
                },
                ..StateConfig::default()
            };
            let mut env = Env {
                state: ClusterState::new(config),
                waiters: Waiters::default(),
                now: 1_700_000_000_000,
            };
            let worker = Joining {
                name: "w".into(),
                address: "w:1".into(),
                resources: "cpu=8".parse().unwrap(),
                labels: Labels::new(),
                gpus: Vec::new(),
                boot: 1,
            };
            let secret = SecretHash::of("secret");
            env.apply(Command::RegisterNode { worker, secret });
            env
        }

        /// Applies a command and performs its `Terminal` effects as the owner does.
        fn apply(&mut self, command: Command) {
            self.now += 1;
            let entry = Entry {
                now: self.now,
                command,
                key: None,
            };
            self.state.apply(entry).unwrap();
            for effect in self.state.take_effects() {
                if let Effect::Terminal { task } = effect {
                    let status = self.state.status(task).expect("just finished");
                    self.waiters.on_terminal(status);
                }
            }
        }

        fn run(&mut self) -> TaskId {
            let spec = TaskSpec {
                name: "f".into(),
                kind: TaskKind::Function {
                    name: "f".into(),
                    args: Default::default(),
                },
                resources: ResourceSet::new(),
                labels: Labels::new(),
                max_retries: 0,
                timeout: Some(Duration::from_secs(1)),
                pending_deadline: None,
                on_start: Vec::new(),
                on_success: Vec::new(),
            };
            let tasks = vec![spec];
            self.apply(Command::Submit {
                tasks,
                namespace: None,
            });
            TaskId(self.state.next_task_id().0 - 1)
        }

        fn finish(&mut self, task: TaskId, bytes: Vec<u8>) {
            self.apply(Command::TaskFinished(TaskFinished {
                task_id: task,
                attempt: 1,
                outcome: Ok(TaskResult::Returned(bytes.into())),
                timed_out: false,
                output: None,
            }));
        }
    }

    #[test]
    fn a_wait_answers_with_what_it_saw_although_retention_evicted_it_since() {
        let mut env = Env::new();
        let quick = env.run();
        let slow = env.run();
        let (reply, mut rx) = oneshot::channel();
        env.waiters.add(&env.state, vec![quick, slow], 2, reply);
        env.finish(quick, vec![1]);
        // Many tasks finish meanwhile: `quick` loses its record.
        for _ in 0..3 {
            let t = env.run();
            env.finish(t, vec![]);
        }
        assert!(env.state.task(quick).is_none(), "quick was evicted");
        assert!(rx.try_recv().is_err(), "still waiting for slow");
        env.finish(slow, vec![2]);
        let answer = rx.try_recv().unwrap().unwrap();
        let results: Vec<_> = answer.ready.iter().map(|s| s.result.clone()).collect();
        assert_eq!(
            results,
            [
                Some(TaskResult::Returned(vec![1].into())),
                Some(TaskResult::Returned(vec![2].into()))
            ]
        );
        assert!(answer.ready.iter().all(|s| !s.evicted));
    }

    #[test]
    fn a_task_evicted_before_the_wait_is_ready_from_its_tombstone() {
        let mut env = Env::new();
        let old = env.run();
        env.finish(old, vec![1]);
        for _ in 0..2 {
            let t = env.run();
            env.finish(t, vec![]);
        }
        let (reply, mut rx) = oneshot::channel();
        env.waiters.add(&env.state, vec![old], 1, reply);
        let answer = rx.try_recv().unwrap().unwrap();
        assert_eq!(answer.ready.len(), 1);
        let status = &answer.ready[0];
        assert!(status.evicted && status.result.is_none());
        assert_eq!(status.state, TaskState::Succeeded);
        assert_eq!(snapshot(&env.state, &[old], 1), answer);
    }
}
