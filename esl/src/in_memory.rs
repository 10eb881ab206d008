//! [`InMemoryCluster`]: a fake cluster for unit tests of policies. It is named a fake because it
//! has no network, no processes and no clock of its own, but it is not a mock: every call goes
//! through the head's real state machine (`escher_core::state::ClusterState`), so resources,
//! admission, namespaces-free naming, hooks, ghosts and infeasibility behave exactly as on a
//! real head. Only the workers are simulated: a dispatched task starts at once and then either
//! finishes at once ([`Mode::Instant`]) or waits until the test finishes it ([`Mode::Manual`]).
//! Ghost tasks run until cancelled in both modes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use escher_client::ClientError;
use escher_core::state::{
    ClusterState, Command, Effect, Entry, Joining, Recorded, Reply, SecretHash, StateConfig,
};
use escher_proto::types::{
    ClusterStatus, GangStrategy, Labels, MigChange, MigPlan, NodeGpus, NodeId, PolicyRow,
    ReserveReply, ResourceName, ResourceSet, ResourceUpdate, Sample, TaskFinished, TaskId,
    TaskKind, TaskResult, TaskSpec, TaskStatus, TaskTelemetry, WatchEvent, WatchRequest,
};
use tokio::sync::{Notify, mpsc};

use crate::api::Events;
use crate::{ClusterApi, EslError};

/// How simulated workers run the tasks they are given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Non-ghost tasks succeed as soon as they are dispatched.
    Instant,
    /// Tasks run until the test calls [`InMemoryCluster::finish`] (or cancels them).
    Manual,
}

#[derive(Debug)]
struct Inner {
    state: ClusterState,
    now: u64,
    mode: Mode,
    /// Running tasks: node and attempt.
    running: BTreeMap<TaskId, (NodeId, u32)>,
    /// Every dispatch in order: (task, node).
    history: Vec<(TaskId, NodeId)>,
    /// What running tasks reported ([`InMemoryCluster::report`]).
    telemetry: BTreeMap<TaskId, TaskTelemetry>,
    /// Each policy's latest report ([`ClusterApi::report_policy`]).
    policies: BTreeMap<String, Vec<PolicyRow>>,
    /// Subscribers to events, with what each asked for.
    watchers: Vec<(WatchRequest, mpsc::UnboundedSender<WatchEvent>)>,
}

/// An in-memory cluster behind the [`ClusterApi`] seam. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct InMemoryCluster {
    inner: Arc<Mutex<Inner>>,
    changed: Arc<Notify>,
}

impl InMemoryCluster {
    /// The latest report of `policy` ([`ClusterApi::report_policy`]), if it made one.
    pub fn policy_report(&self, policy: &str) -> Option<Vec<PolicyRow>> {
        self.lock().policies.get(policy).cloned()
    }

    /// An empty cluster whose simulated workers run tasks in `mode`.
    pub fn new(mode: Mode) -> InMemoryCluster {
        InMemoryCluster {
            inner: Arc::new(Mutex::new(Inner {
                state: ClusterState::new(StateConfig::default()),
                now: 0,
                mode,
                running: BTreeMap::new(),
                history: Vec::new(),
                telemetry: BTreeMap::new(),
                policies: BTreeMap::new(),
                watchers: Vec::new(),
            })),
            changed: Arc::new(Notify::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock can only come from a failing test; keep going.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds a node with these resources (`"cpu=4,gpu=1"`); returns its id.
    pub fn add_node(&self, resources: &str) -> NodeId {
        let resources: ResourceSet = resources.parse().unwrap_or_default();
        let command = Command::RegisterNode {
            worker: Joining {
                name: "sim".into(),
                address: "in-memory".into(),
                resources,
                labels: Labels::new(),
                gpus: Vec::new(),
                boot: 1,
            },
            secret: SecretHash::of("in-memory"),
        };
        match self.apply(command) {
            Ok(Reply::Registered(id)) => id,
            other => unreachable!("registration cannot fail: {other:?}"),
        }
    }

    /// Removes a node, as if its worker died.
    pub fn remove_node(&self, node: NodeId) {
        let _ = self.apply(Command::RemoveNode {
            node,
            reason: "removed by the test".into(),
        });
    }

    /// Finishes a running task, successfully or not.
    pub fn finish(&self, task: TaskId, success: bool) {
        let attempt = self.lock().running.get(&task).map(|(_, a)| *a);
        if let Some(attempt) = attempt {
            let outcome = if success {
                Ok(TaskResult::Returned(Default::default()))
            } else {
                Err("failed by the test".into())
            };
            let report = TaskFinished {
                task_id: task,
                attempt,
                outcome,
                timed_out: false,
                output: None,
            };
            let _ = self.apply(Command::TaskFinished(report));
        }
    }

    /// Tasks running now, with their nodes.
    pub fn running(&self) -> Vec<(TaskId, NodeId)> {
        self.lock()
            .running
            .iter()
            .map(|(t, (n, _))| (*t, *n))
            .collect()
    }

    /// Every dispatch so far, in order: which task went to which node.
    pub fn dispatches(&self) -> Vec<(TaskId, NodeId)> {
        self.lock().history.clone()
    }

    /// The node a task ran (or runs) on.
    pub fn node_of(&self, task: TaskId) -> Option<NodeId> {
        self.lock().state.status(task).and_then(|s| s.node)
    }

    /// Reports samples as running task `task` would (`ctx.report` on a real worker), stamped
    /// with the simulated clock; refused when the task is not running.
    pub fn report(&self, task: TaskId, samples: &[(&str, f64)]) -> Result<(), EslError> {
        let mut inner = self.lock();
        let Some((_, attempt)) = inner.running.get(&task).copied() else {
            return Err(EslError::Refused(format!(
                "task {task} is not running: only a running task reports telemetry"
            )));
        };
        let now = inner.now;
        let mut fresh = Vec::with_capacity(samples.len());
        for (key, value) in samples {
            let mut s = Sample::new(key, *value)?;
            s.at_ms = now;
            fresh.push(s);
        }
        let kept = inner
            .telemetry
            .entry(task)
            .or_insert_with(|| TaskTelemetry {
                task,
                attempt,
                samples: Vec::new(),
            });
        if attempt > kept.attempt {
            kept.attempt = attempt;
            kept.samples.clear();
        }
        kept.samples.extend(fresh);
        Ok(())
    }

    /// Advances the simulated clock (expires pending deadlines).
    pub fn advance(&self, by: Duration) {
        self.lock().now += by.as_millis() as u64;
        let _ = self.apply(Command::Tick);
    }

    /// Applies a command and plays the simulated workers until nothing more happens.
    fn apply(&self, command: Command) -> Result<Reply, EslError> {
        let mut inner = self.lock();
        let now = inner.now;
        let reply =
            inner
                .state
                .apply(Entry::new(now, command))
                .map_err(|e| match e.mig_refusal() {
                    // What the real head's status carries beside its message.
                    Some(refusal) => EslError::Client(ClientError::MigRefused {
                        refusal,
                        message: e.to_string(),
                    }),
                    None => EslError::Refused(e.to_string()),
                })?;
        let mut effects = inner.state.take_effects();
        while !effects.is_empty() {
            for effect in effects {
                inner.play(effect);
            }
            effects = inner.state.take_effects();
        }
        let events = inner.state.take_events();
        inner.publish(events);
        drop(inner);
        self.changed.notify_waiters();
        Ok(reply)
    }
}

impl Inner {
    /// Hands each event to the watchers that asked for it (no namespaces in memory).
    fn publish(&mut self, events: Vec<Recorded>) {
        if self.watchers.is_empty() {
            return;
        }
        for recorded in events {
            let event = &recorded.event.event;
            self.watchers.retain(|(request, tx)| {
                let kinds = &request.kinds;
                let wanted = (kinds.is_empty() || kinds.contains(&event.kind()))
                    && match event.task() {
                        Some(task) => {
                            (request.tasks.is_empty() || request.tasks.contains(&task))
                                && request.labels.iter().all(|(k, v)| {
                                    let have = recorded.labels.get(k);
                                    have.is_some() && (v.is_none() || have == v.as_deref())
                                })
                        }
                        None => !request.tasks_only(),
                    };
                !wanted || tx.send(recorded.event.clone()).is_ok()
            });
        }
    }

    /// What a worker would do with an effect.
    fn play(&mut self, effect: Effect) {
        let now = self.now;
        match effect {
            Effect::Assign { node, assignment } => {
                let (task, attempt) = (assignment.task_id, assignment.attempt);
                self.running.insert(task, (node, attempt));
                self.history.push((task, node));
                let _ = self
                    .state
                    .apply(Entry::new(now, Command::TaskStarted { task, attempt }));
                let ghost = matches!(assignment.spec.kind, TaskKind::Ghost { .. });
                if self.mode == Mode::Instant && !ghost {
                    let outcome = Ok(TaskResult::Returned(Default::default()));
                    self.report(task, attempt, outcome);
                }
            }
            Effect::Cancel { task, attempt, .. } => {
                self.report(task, attempt, Ok(TaskResult::Released))
            }
            Effect::Terminal { task } => {
                self.running.remove(&task);
            }
            // No GPUs in memory: nothing to reconfigure; no worker comes back; no store holds
            // object bytes.
            Effect::ReconfigureMig { .. }
            | Effect::Rejoined { .. }
            | Effect::DeleteObjects { .. } => {}
        }
    }

    fn report(&mut self, task: TaskId, attempt: u32, outcome: Result<TaskResult, String>) {
        self.running.remove(&task);
        let report = TaskFinished {
            task_id: task,
            attempt,
            outcome,
            timed_out: false,
            output: None,
        };
        let _ = self
            .state
            .apply(Entry::new(self.now, Command::TaskFinished(report)));
    }
}

impl ClusterApi for InMemoryCluster {
    async fn requeue(&self, task: TaskId, resources: ResourceSet) -> Result<TaskStatus, EslError> {
        match self.apply(Command::Requeue { task, resources })? {
            Reply::Requeued(status) => Ok(status),
            other => Err(EslError::Refused(format!("unexpected reply {other:?}"))),
        }
    }

    /// The GPUs its nodes registered with (none unless a test gave them); reconfigurations
    /// are accepted by the state machine but no simulated worker carries them out.
    async fn gpus(&self) -> Result<Vec<NodeGpus>, EslError> {
        Ok(self.lock().state.gpu_status().nodes)
    }

    async fn change_mig(
        &self,
        node: NodeId,
        gpu: u32,
        change: MigChange,
        drain: bool,
    ) -> Result<MigPlan, EslError> {
        let command = Command::ApplyMigLayout {
            node,
            gpu,
            change,
            drain,
        };
        match self.apply(command)? {
            Reply::MigPlan(plan) => Ok(plan),
            other => Err(EslError::Refused(format!("unexpected reply {other:?}"))),
        }
    }

    async fn set_resources(
        &self,
        updates: Vec<ResourceUpdate>,
    ) -> Result<Vec<Vec<NodeId>>, EslError> {
        let command = Command::SetResources {
            updates,
            namespace: None,
            caller_task: None,
        };
        match self.apply(command)? {
            Reply::ResourcesSet(nodes) => Ok(nodes),
            other => Err(EslError::Refused(format!("unexpected reply {other:?}"))),
        }
    }

    async fn cluster_status(&self) -> Result<ClusterStatus, EslError> {
        Ok(self.lock().state.cluster_status())
    }

    async fn report_policy(&self, policy: String, rows: Vec<PolicyRow>) -> Result<(), EslError> {
        escher_proto::types::check_policy_rows(&policy, &rows)
            .map_err(|why| EslError::Client(ClientError::InvalidArgument(why)))?;
        self.lock().policies.insert(policy, rows);
        Ok(())
    }

    async fn telemetry(
        &self,
        tasks: Vec<TaskId>,
        after_ms: Option<u64>,
    ) -> Result<Vec<TaskTelemetry>, EslError> {
        let inner = self.lock();
        let after = after_ms.unwrap_or(0);
        Ok(tasks
            .iter()
            .filter_map(|t| {
                let kept = inner.telemetry.get(t)?;
                let samples: Vec<Sample> = kept
                    .samples
                    .iter()
                    .filter(|s| after_ms.is_none() || s.at_ms > after)
                    .cloned()
                    .collect();
                (!samples.is_empty()).then_some(TaskTelemetry {
                    samples,
                    ..kept.clone()
                })
            })
            .collect())
    }

    async fn reserve(
        &self,
        name: ResourceName,
        bundles: Vec<ResourceSet>,
        strategy: GangStrategy,
        timeout: Option<Duration>,
    ) -> Result<ReserveReply, EslError> {
        let command = Command::Reserve {
            name,
            bundles,
            strategy,
            timeout,
            namespace: None,
        };
        match self.apply(command)? {
            Reply::Reserved { tasks, placed } => Ok(ReserveReply {
                task_ids: tasks,
                placed,
            }),
            other => Err(EslError::Refused(format!("unexpected reply {other:?}"))),
        }
    }

    async fn submit(&self, tasks: Vec<TaskSpec>) -> Result<Vec<TaskId>, EslError> {
        match self.apply(Command::Submit {
            tasks,
            namespace: None,
        })? {
            Reply::Submitted(ids) => Ok(ids),
            other => Err(EslError::Refused(format!("unexpected reply {other:?}"))),
        }
    }

    async fn cancel(&self, tasks: Vec<TaskId>) -> Result<Vec<TaskStatus>, EslError> {
        self.apply(Command::Cancel {
            tasks: tasks.clone(),
        })?;
        let inner = self.lock();
        Ok(tasks
            .iter()
            .filter_map(|t| inner.state.status(*t))
            .collect())
    }

    async fn status(&self, task: TaskId) -> Result<TaskStatus, EslError> {
        self.lock()
            .state
            .status(task)
            .ok_or_else(|| EslError::Refused(format!("unknown task {task}")))
    }

    async fn watch(&self, request: WatchRequest) -> Result<Events, EslError> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.lock().watchers.push((request, tx));
        Ok(Events::local(rx))
    }

    async fn wait(
        &self,
        tasks: Vec<TaskId>,
        num: usize,
        timeout: Duration,
    ) -> Result<Vec<TaskStatus>, EslError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            let statuses: Vec<TaskStatus> = {
                let inner = self.lock();
                let mut all = Vec::with_capacity(tasks.len());
                for t in &tasks {
                    all.push(
                        inner
                            .state
                            .status(*t)
                            .ok_or_else(|| EslError::Refused(format!("unknown task {t}")))?,
                    );
                }
                all
            };
            let done = statuses.iter().filter(|s| s.state.is_terminal()).count();
            if done >= num.min(tasks.len()) {
                return Ok(statuses);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Ok(statuses);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use escher_proto::types::{Capacity, NodeSpec, ResourceName, TaskState};

    use super::*;

    fn task(resources: &str) -> TaskSpec {
        escher_client::Task::function("f", Vec::new())
            .resources_str(resources)
            .build()
            .unwrap()
    }

    #[tokio::test]
    async fn running_tasks_report_telemetry_that_policies_read() {
        let cluster = InMemoryCluster::new(Mode::Manual);
        cluster.add_node("cpu=1");
        let ids = cluster
            .submit(vec![task("cpu=1"), task("cpu=1")])
            .await
            .unwrap();
        cluster.report(ids[0], &[("mem_used_gb", 2.0)]).unwrap();
        cluster.advance(Duration::from_millis(10));
        cluster.report(ids[0], &[("mem_used_gb", 3.0)]).unwrap();
        // The second task waits for the cpu: it cannot report.
        assert!(cluster.report(ids[1], &[("mem_used_gb", 1.0)]).is_err());
        assert!(cluster.report(ids[0], &[("bad key", 1.0)]).is_err());
        let got = ClusterApi::telemetry(&cluster, ids.clone(), None)
            .await
            .unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].series("mem_used_gb"), vec![2.0, 3.0]);
        let newer = ClusterApi::telemetry(&cluster, ids, Some(0)).await.unwrap();
        assert_eq!(newer[0].series("mem_used_gb"), vec![3.0]);
    }

    #[tokio::test]
    async fn tasks_run_through_the_real_state_machine() {
        let cluster = InMemoryCluster::new(Mode::Manual);
        let a = cluster.add_node("cpu=1");
        let b = cluster.add_node("cpu=1");
        let ids = cluster
            .submit(vec![task("cpu=1"), task("cpu=1"), task("cpu=1,x=1")])
            .await
            .unwrap();
        assert_eq!(cluster.running().len(), 2);
        let status = cluster.status(ids[2]).await.unwrap();
        assert_eq!(status.state, TaskState::Pending);
        assert!(
            status.reason.unwrap().contains("x"),
            "infeasible with a reason"
        );
        cluster
            .set_resource(
                ResourceName::new("x").unwrap(),
                Capacity::Unbounded,
                NodeSpec::Node(b),
            )
            .await
            .unwrap();
        cluster.finish(ids[1], true);
        assert_eq!(
            cluster.node_of(ids[2]),
            Some(b),
            "follows the resource once cpu frees up"
        );
        let all = cluster
            .wait(ids.clone(), 1, Duration::from_millis(10))
            .await
            .unwrap();
        assert_eq!(all[1].state, TaskState::Succeeded);
        assert_eq!(cluster.node_of(ids[0]), Some(a));
    }

    #[tokio::test]
    async fn instant_mode_finishes_tasks_and_wait_returns() {
        let cluster = InMemoryCluster::new(Mode::Instant);
        cluster.add_node("cpu=2");
        let ids = cluster.submit(vec![task("cpu=1"); 5]).await.unwrap();
        let all = cluster.wait(ids, 5, Duration::from_secs(1)).await.unwrap();
        assert!(all.iter().all(|s| s.state == TaskState::Succeeded));
    }
}
