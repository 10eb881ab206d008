//! Fair share over time: usage decayed by a half-life, priorities, quotas that a cohort
//! borrows and lends (Kueue's cohorts), and preemption of over-share or lower-priority work.
//!
//! **Policy.** Each namespace (a tenant of this policy) has a weight, a priority, a guarantee
//! and optionally a cohort ([`Namespace`]). What it uses is charged continuously in weighted
//! resource-seconds ([`ResourceWeights`]: CPU, memory, GPUs, MIG slices by their compute
//! slices) and decayed with a half-life ([`HalfLife`], [`DecayedUsage`]). Its standing is
//! Slurm's classic fair-share factor `F = 2^(-U/S)`, `U` its share of all decayed usage, `S`
//! its share of all weights ([`fair_share_factor`]). Waiting jobs are admitted by priority,
//! then by `F`, within the cluster's capacity and their cohort's quota; a namespace may use the
//! idle guarantee of its cohort and gets its own back by preemption when it needs it. The
//! decisions come from the pure [`Arbiter`] (its module doc gives the exact rules); a job is
//! preempted only while its namespace holds more than its guarantee.
//!
//! **Construction.** [`FairTime`] drives the arbiter over a [`ClusterApi`]: jobs are submitted
//! to it, not to the cluster; each [`FairTime::round`] reads the cluster's capacity
//! (`cluster_status`: the totals of live nodes; a resource no live node has is none, so a job
//! asking for it waits), learns which of its tasks ended from
//! the watch API's `Finished` events, asks the arbiter, then carries the decisions out:
//! `submit` for an admission, `cancel` for a preemption. A preempted job whose spec says
//! [`OnPreempt::Requeue`] waits again in its place and is submitted anew when admitted again
//! (a new task id: [`FairTime::task_of`] follows it); one that says [`OnPreempt::Fail`] ends
//! as preempted ([`JobState::Preempted`]).
//!
//! **How graceful a preemption is.** The `ClusterApi` has no call that sends SIGTERM and waits
//! a grace period chosen by the caller. Its `cancel` stops a running command task the way
//! escher stops any: the worker sends SIGTERM to the task's process group and SIGKILL once the
//! *worker's* grace period (`escher-worker`'s setting, 5 s by default) passes. The grace is
//! the worker's, not the job's or the policy's, and a function task has no signal handler of
//! its own to see. `ClusterApi::requeue` stops a task the same way but sends it straight back
//! to the head's queue, where it would compete with the job it made room for, so it is not
//! used.
//!
//! **Limits.** Capacity is counted cluster-wide, not per node: a job that fits in total may
//! still wait at the head for a node with room (fragmentation), and the arbiter does not place.
//! Usage is charged from admission to the end the policy hears of (the few milliseconds a task
//! waits at the head to be placed count). The policy owns what it admits: other work on the
//! cluster is not counted against anyone's quota, though it does hold capacity. The usage
//! ledger lives in the policy's memory; [`FairTime::record_usage`] carries history over a
//! restart. [`FairTime::publish`] reports each namespace's standing to the head, which
//! `escher status` and `/metrics` show (`escher_policy_measure{policy="fair-time"}`).

mod arbiter;
mod config;
mod round;
mod usage;

#[cfg(test)]
mod tests;

pub use arbiter::{Arbiter, Decision, Job, JobId, OnPreempt, Reason, Share};
pub use config::{FairTimeConfig, FairTimeError, HalfLife, Namespace, PRIORITIES, ResourceWeights};
pub use usage::{DecayedUsage, fair_share_factor};

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use escher_proto::types::{Amount, Capacity, PolicyRow, ResourceSet, TaskId, TaskSpec, TaskState};

use crate::ends::TaskEnds;
use crate::{ClusterApi, EslError};

/// Where a job of [`FairTime`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    /// Waiting for admission (also after a preemption that requeued it).
    Waiting,
    /// Admitted: its task was submitted.
    Admitted(TaskId),
    /// Its task ended.
    Ended(TaskId),
    /// Preempted, and its spec said to fail.
    Preempted,
}

#[derive(Debug)]
struct Record {
    spec: TaskSpec,
    state: JobState,
    preemptions: u32,
}

#[derive(Debug)]
struct Inner {
    arbiter: Arbiter,
    jobs: BTreeMap<JobId, Record>,
    /// The job each submitted task belongs to, while it is the job's current task.
    tasks: BTreeMap<TaskId, JobId>,
}

/// The fair-share-over-time ESL over a cluster. See the module doc.
#[derive(Debug)]
pub struct FairTime<C> {
    api: C,
    inner: Mutex<Inner>,
    ends: Mutex<TaskEnds>,
}

impl<C: ClusterApi> FairTime<C> {
    /// The policy over `api`, subscribed to its task ends.
    pub async fn new(api: C, config: FairTimeConfig) -> Result<FairTime<C>, EslError> {
        let ends = TaskEnds::start(&api).await?;
        Ok(FairTime {
            api,
            inner: Mutex::new(Inner {
                arbiter: Arbiter::new(config),
                jobs: BTreeMap::new(),
                tasks: BTreeMap::new(),
            }),
            ends: Mutex::new(ends),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `spec` for `namespace`; it is submitted when a round admits it. Refused, with
    /// nothing queued, if the namespace is not configured or `priority` is out of range.
    pub fn submit(
        &self,
        namespace: &str,
        spec: TaskSpec,
        priority: Option<i32>,
        on_preempt: OnPreempt,
    ) -> Result<JobId, EslError> {
        let mut inner = self.lock();
        let id = inner.arbiter.arrive(Job {
            namespace: namespace.to_string(),
            priority,
            resources: spec.resources.clone(),
            on_preempt,
        })?;
        let record = Record {
            spec,
            state: JobState::Waiting,
            preemptions: 0,
        };
        inner.jobs.insert(id, record);
        Ok(id)
    }

    /// Adds past usage to `namespace` (weighted resource-seconds, at `now_ms`).
    pub fn record_usage(
        &self,
        namespace: &str,
        resource_seconds: f64,
        now_ms: u64,
    ) -> Result<(), EslError> {
        Ok(self
            .lock()
            .arbiter
            .record_usage(namespace, resource_seconds, now_ms)?)
    }

    /// Where `job` is.
    pub fn state(&self, job: JobId) -> Result<JobState, EslError> {
        let inner = self.lock();
        let record = inner
            .jobs
            .get(&job)
            .ok_or(FairTimeError::UnknownJob(job.0))?;
        Ok(record.state)
    }

    /// The task `job` runs as now, or ran as last.
    pub fn task_of(&self, job: JobId) -> Option<TaskId> {
        match self.lock().jobs.get(&job)?.state {
            JobState::Admitted(t) | JobState::Ended(t) => Some(t),
            JobState::Waiting | JobState::Preempted => None,
        }
    }

    /// How many times `job` was preempted.
    pub fn preemptions(&self, job: JobId) -> u32 {
        self.lock().jobs.get(&job).map_or(0, |r| r.preemptions)
    }

    /// Every namespace's decayed usage, fair-share factor and holdings at `now_ms`.
    pub fn shares(&self, now_ms: u64) -> Vec<Share> {
        self.lock().arbiter.shares(now_ms)
    }

    /// The name this policy reports under ([`FairTime::publish`]).
    pub const POLICY: &'static str = "fair-time";

    /// Reports every namespace's standing at `now_ms` to the cluster
    /// ([`ClusterApi::report_policy`], as [`FairTime::POLICY`]): its decayed `usage`
    /// (weighted resource-seconds), fair-share `factor`, jobs `waiting` and `running`, and
    /// what it `holds.RESOURCE` now (the first 12 resources by name), so that `escher status`,
    /// the dashboard and `/metrics` show what each has used, is owed and holds. Call it after
    /// each [`round`](FairTime::round).
    pub async fn publish(&self, now_ms: u64) -> Result<(), EslError> {
        let rows = self
            .shares(now_ms)
            .into_iter()
            .map(|share| {
                let mut measures = BTreeMap::from([
                    ("usage".to_string(), share.usage),
                    ("factor".to_string(), share.factor),
                    ("waiting".to_string(), share.waiting as f64),
                    ("running".to_string(), share.running as f64),
                ]);
                for (resource, amount) in share.holds.into_iter().take(12) {
                    measures.insert(format!("holds.{resource}"), amount);
                }
                PolicyRow {
                    row: share.namespace,
                    measures,
                }
            })
            .collect();
        self.api.report_policy(Self::POLICY.to_string(), rows).await
    }

    /// One round at `now_ms` (the caller's clock, in ms): learns ends and capacity, decides,
    /// cancels the preempted and submits the admitted. Returns the decisions carried out.
    pub async fn round(&self, now_ms: u64) -> Result<Vec<Decision>, EslError> {
        let ended = self.ended().await?;
        let status = self.api.cluster_status().await?;
        let mut capacity: BTreeMap<_, u64> = BTreeMap::new();
        for node in status.nodes.iter().filter(|n| n.takes_tasks()) {
            for r in &node.resources {
                let total = match r.total {
                    Capacity::Finite(total) => total.raw(),
                    Capacity::Unbounded => Amount::MAX.raw(),
                };
                let sum = capacity.entry(r.name.clone()).or_default();
                *sum = sum.saturating_add(total);
            }
        }
        let mut capacity_set = ResourceSet::new();
        for (name, raw) in capacity {
            capacity_set.insert(name, Amount::from_raw(raw.min(Amount::MAX.raw()))?);
        }
        let (decisions, submit) = {
            let mut inner = self.lock();
            for task in ended {
                if let Some(job) = inner.tasks.remove(&task) {
                    inner.arbiter.end(job, now_ms)?;
                    if let Some(r) = inner.jobs.get_mut(&job) {
                        r.state = JobState::Ended(task);
                    }
                }
            }
            inner.arbiter.set_cluster_capacity(&capacity_set);
            let decisions = inner.arbiter.decide(now_ms);
            let submit: Vec<(JobId, TaskSpec)> = decisions
                .iter()
                .filter_map(|d| match d {
                    Decision::Admit { job, .. } => Some((*job, inner.jobs.get(job)?.spec.clone())),
                    Decision::Preempt { .. } => None,
                })
                .collect();
            (decisions, submit)
        };
        self.preempt(&decisions).await?;
        if submit.is_empty() {
            return Ok(decisions);
        }
        let (jobs, specs): (Vec<JobId>, Vec<TaskSpec>) = submit.into_iter().unzip();
        let ids = match self.api.submit(specs).await {
            Ok(ids) => ids,
            Err(e) => {
                // Nothing was submitted (a batch is all or none): the jobs wait again.
                let mut inner = self.lock();
                for job in &jobs {
                    inner.arbiter.put_back(*job, now_ms)?;
                }
                return Err(e);
            }
        };
        self.ends_lock().track(ids.iter().copied());
        let mut inner = self.lock();
        for (job, task) in jobs.into_iter().zip(ids) {
            inner.tasks.insert(task, job);
            if let Some(r) = inner.jobs.get_mut(&job) {
                r.state = JobState::Admitted(task);
            }
        }
        Ok(decisions)
    }

    fn ends_lock(&self) -> MutexGuard<'_, TaskEnds> {
        self.ends.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Cancels the preempted jobs' tasks and records what became of each.
    async fn preempt(&self, decisions: &[Decision]) -> Result<(), EslError> {
        let mut cancel = Vec::new();
        {
            let mut inner = self.lock();
            for d in decisions {
                let Decision::Preempt { job, then, .. } = d else {
                    continue;
                };
                let Some(record) = inner.jobs.get_mut(job) else {
                    continue;
                };
                record.preemptions += 1;
                let previous = std::mem::replace(
                    &mut record.state,
                    match then {
                        OnPreempt::Requeue => JobState::Waiting,
                        OnPreempt::Fail => JobState::Preempted,
                    },
                );
                if let JobState::Admitted(task) = previous {
                    inner.tasks.remove(&task);
                    cancel.push(task);
                }
                tracing::info!(job = job.0, ?then, "fair share: preempting");
            }
        }
        if !cancel.is_empty() {
            self.api.cancel(cancel).await?;
        }
        Ok(())
    }

    /// The tasks of this policy that ended since the last round. If the event feed broke,
    /// a new one is started and every admitted task's status is read once.
    async fn ended(&self) -> Result<Vec<TaskId>, EslError> {
        if let Some(ended) = self.ends_lock().take_ended() {
            return Ok(ended);
        }
        let fresh = TaskEnds::start(&self.api).await?;
        let tasks: Vec<TaskId> = self.lock().tasks.keys().copied().collect();
        fresh.track(tasks.iter().copied());
        *self.ends_lock() = fresh;
        let mut ended = Vec::new();
        for task in tasks {
            if matches!(
                self.api.status(task).await?.state,
                TaskState::Succeeded | TaskState::Failed | TaskState::Cancelled
            ) {
                ended.push(task);
            }
        }
        Ok(ended)
    }
}
