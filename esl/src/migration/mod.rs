//! Migration, the EscherTune pattern (thesis §4.6.1 "Distributed Training", Fig. 4.6b;
//! "Bin packing (dynamic)", one of the four policies of §4.2.1 and Table 4.1).
//!
//! **Policy.** A *job* is a set of tasks that should run together on as few nodes as
//! possible. When it cannot fit on one node it starts spread over several; as soon as one
//! node has room for the whole job, the job is checkpointed, stopped and relaunched there.
//!
//! **Construction.** The thesis: "EscherTune triggers a migration whenever it detects
//! sufficient available resources to place all workers of a job on the same node ...
//! checkpoints the current job ... and destroys all current workers. Then, EscherTune assigns
//! ephemeral resources to the new target node, and relaunches all worker tasks of the
//! training job without modifying their ephemeral resource requests." Here the job's
//! resource is `job-<id>`: a finite capacity on each chosen node equal to the number of the
//! job's tasks placed there (co-location by construction), and every task requires
//! `job-<id>: 1` besides its own needs. [`Migrator::maybe_migrate`] reads
//! `get_cluster_status`; a node has room for the job when its available resources *plus what
//! the job itself holds there* cover the job's total needs. It then calls the checkpoint
//! hook, re-targets the resource in one all-or-none batch (`job-<id>` = n on the target,
//! deleted on the other nodes), cancels the job's unfinished tasks, waits until they have
//! released what they held, and resubmits the very same task specs: the requests are
//! byte-for-byte those of the first launch.
//!
//! **Needs from the cluster.** `get_cluster_status` (room, and where the job runs), batched
//! `set_resource`, `submit`, `cancel`, task status and `wait`.
//!
//! **Limits.** The room check reads an advisory snapshot (thesis §4.7, no atomic
//! check-and-reserve): another task may take the room between the check and the relaunch,
//! and then the relaunched tasks wait on the target (the job resource pins them there) until
//! it frees up. The job is stopped and restarted whole: progress since the checkpoint is the
//! application's business. A task that ends while the migration runs is relaunched anyway
//! if it had not ended at the snapshot. Only the tasks that had not ended move; finished ones
//! stay finished.

use std::collections::BTreeMap;
use std::time::Duration;

use escher_proto::types::{
    Amount, Capacity, CapacityOp, ClusterStatus, NodeId, NodeSpec, ResourceName, ResourceSet,
    ResourceUpdate, TaskId, TaskSpec, TaskState,
};

use crate::policy::{Policy, er_name};
use crate::{ClusterApi, EslError, ResourceSpec};

/// How long a migration waits for the cancelled tasks to release their resources.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// A job under the migrator's care.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// The job's id.
    pub id: String,
    /// Its co-location resource, `job-<id>`.
    pub resource: ResourceName,
    /// The task specs as submitted (with the job requirement), in order; relaunches submit
    /// exactly these.
    pub specs: Vec<TaskSpec>,
    /// The ids of the latest launch, one per spec.
    pub tasks: Vec<TaskId>,
    /// How many of its tasks each node may run (the capacity of `job-<id>` there).
    pub placement: BTreeMap<NodeId, u64>,
    /// How many times it moved.
    pub migrations: u32,
}

/// What one migration did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// The nodes the job ran on.
    pub from: Vec<NodeId>,
    /// The node it runs on now.
    pub to: NodeId,
    /// The tasks relaunched there, in spec order.
    pub relaunched: Vec<TaskId>,
}

type Checkpoint = Box<dyn FnMut(&Job) + Send>;

/// Places jobs and moves each to a single node when one has room (EscherTune).
pub struct Migrator<C> {
    cluster: C,
    jobs: BTreeMap<String, Job>,
    checkpoint: Option<Checkpoint>,
}

impl<C> std::fmt::Debug for Migrator<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Migrator")
            .field("jobs", &self.jobs)
            .field("checkpoint", &self.checkpoint.is_some())
            .finish_non_exhaustive()
    }
}

/// The needs of a task without its job requirement (what must fit on a node).
fn needs(spec: &TaskSpec, job: &ResourceName) -> ResourceSet {
    ResourceSet::from_pairs(
        spec.resources
            .iter()
            .filter(|(n, _)| *n != job)
            .map(|(n, a)| (n.clone(), a)),
    )
    .unwrap_or_default()
}

/// `a + b`, per resource.
fn sum(a: &ResourceSet, b: &ResourceSet) -> Result<ResourceSet, EslError> {
    let mut out = a.clone();
    out.merge(b)?;
    Ok(out)
}

/// How much of `name` is free on `node` (unbounded: `None`); absent: zero.
fn free(status: &ClusterStatus, node: NodeId, name: &ResourceName) -> Option<Amount> {
    match status.node(node).and_then(|n| n.resource(name.as_str())) {
        Some(r) => r.available(),
        None => Some(Amount::ZERO),
    }
}

/// Whether `need` fits in what is free on `node` plus `extra`.
fn fits(status: &ClusterStatus, node: NodeId, need: &ResourceSet, extra: &ResourceSet) -> bool {
    need.iter()
        .all(|(name, amount)| match free(status, node, name) {
            None => status
                .node(node)
                .and_then(|n| n.resource(name.as_str()))
                .is_some(),
            Some(f) => f
                .checked_add(extra.get(name.as_str()))
                .is_ok_and(|room| room >= amount),
        })
}

impl<C: ClusterApi> Migrator<C> {
    /// A migrator with no jobs and no checkpoint hook.
    pub fn new(cluster: C) -> Migrator<C> {
        Migrator {
            cluster,
            jobs: BTreeMap::new(),
            checkpoint: None,
        }
    }

    /// Calls `hook` with the job (its old tasks still running) before each migration stops it.
    pub fn on_checkpoint(mut self, hook: impl FnMut(&Job) + Send + 'static) -> Migrator<C> {
        self.checkpoint = Some(Box::new(hook));
        self
    }

    /// The job resource of `id`: `job-<id>`.
    pub fn resource(id: &str) -> Result<ResourceName, EslError> {
        er_name(&["job", id])
    }

    /// Job `id`, if launched.
    pub fn job(&self, id: &str) -> Option<&Job> {
        self.jobs.get(id)
    }

    /// Launches `tasks` as job `id`: all on one node if one has room for them all now, else
    /// spread, each task on the node that already has most of the job and still has room.
    pub async fn launch(&mut self, id: &str, tasks: Vec<TaskSpec>) -> Result<&Job, EslError> {
        let resource = Self::resource(id)?;
        let status = self.cluster.cluster_status().await?;
        let live: Vec<NodeId> = status
            .nodes
            .iter()
            .filter(|n| n.takes_tasks())
            .map(|n| n.id)
            .collect();
        let mut placement: BTreeMap<NodeId, u64> = BTreeMap::new();
        let mut taken: BTreeMap<NodeId, ResourceSet> = BTreeMap::new();
        let total = tasks
            .iter()
            .try_fold(ResourceSet::new(), |acc, t| sum(&acc, &needs(t, &resource)))?;
        if let Some(home) = live
            .iter()
            .find(|n| fits(&status, **n, &total, &ResourceSet::new()))
        {
            placement.insert(*home, tasks.len() as u64);
        } else {
            for t in &tasks {
                let need = needs(t, &resource);
                // Fits in what is left after this job's own earlier tasks.
                let room = |n: &NodeId| {
                    let used = taken.get(n).cloned().unwrap_or_default();
                    let with = sum(&used, &need).unwrap_or_default();
                    fits(&status, *n, &with, &ResourceSet::new())
                };
                let chosen = live
                    .iter()
                    .filter(|n| room(n))
                    .max_by_key(|n| {
                        (
                            placement.get(*n).copied().unwrap_or(0),
                            std::cmp::Reverse(n.0),
                        )
                    })
                    .copied()
                    .ok_or_else(|| {
                        EslError::Unsatisfiable(format!(
                            "job {id}: no live node has room for a task needing {need} now"
                        ))
                    })?;
                *placement.entry(chosen).or_insert(0) += 1;
                let used = taken.entry(chosen).or_default();
                *used = sum(used, &need)?;
            }
        }
        self.start(id, resource, tasks, placement).await
    }

    /// Launches `tasks` as job `id` with the placement chosen by the application: `count`
    /// tasks may run on each node.
    pub async fn place(
        &mut self,
        id: &str,
        tasks: Vec<TaskSpec>,
        placement: BTreeMap<NodeId, u64>,
    ) -> Result<&Job, EslError> {
        let resource = Self::resource(id)?;
        self.start(id, resource, tasks, placement).await
    }

    async fn start(
        &mut self,
        id: &str,
        resource: ResourceName,
        mut specs: Vec<TaskSpec>,
        placement: BTreeMap<NodeId, u64>,
    ) -> Result<&Job, EslError> {
        let spec = ResourceSpec::new().require(resource.clone(), Amount::ONE)?;
        for s in &mut specs {
            spec.apply_to(s)?;
        }
        let updates = placement
            .iter()
            .map(|(node, count)| {
                Ok(ResourceUpdate {
                    name: resource.clone(),
                    op: CapacityOp::Set(Capacity::Finite(Amount::units(*count)?)),
                    target: NodeSpec::Node(*node),
                })
            })
            .collect::<Result<Vec<_>, EslError>>()?;
        self.cluster.set_resources(updates).await?;
        let tasks = self.cluster.submit(specs.clone()).await?;
        let job = Job {
            id: id.to_string(),
            resource,
            specs,
            tasks,
            placement,
            migrations: 0,
        };
        self.jobs.insert(id.to_string(), job);
        Ok(&self.jobs[id])
    }

    /// Moves job `id` to one node if it is spread and some node now has room for all of its
    /// unfinished tasks; what it did, or `None`. A job whose unfinished tasks already all run
    /// on one node is not moved; its resource is only removed from the other nodes.
    pub async fn maybe_migrate(&mut self, id: &str) -> Result<Option<Migration>, EslError> {
        let job = self.jobs.get(id).cloned().ok_or_else(|| {
            EslError::Unsatisfiable(format!(
                "no job {id:?}; launch it with Migrator::launch first"
            ))
        })?;
        if job.placement.len() <= 1 {
            return Ok(None);
        }
        let status = self.cluster.cluster_status().await?;
        // The job's unfinished tasks, where they run, and what they hold there.
        let mut unfinished = Vec::new();
        let mut on: Vec<Option<NodeId>> = Vec::new();
        let mut held: BTreeMap<NodeId, ResourceSet> = BTreeMap::new();
        let mut total = ResourceSet::new();
        for (i, task) in job.tasks.iter().enumerate() {
            let s = self.cluster.status(*task).await?;
            if s.state.is_terminal() {
                continue;
            }
            let need = needs(&job.specs[i], &job.resource);
            total = sum(&total, &need)?;
            let node = s.node.filter(|_| s.state == TaskState::Running);
            if let Some(node) = node {
                let h = held.entry(node).or_default();
                *h = sum(h, &need)?;
            }
            unfinished.push(i);
            on.push(node);
        }
        if unfinished.is_empty() {
            return Ok(None);
        }
        if let Some(Some(first)) = on.first()
            && on.iter().all(|n| *n == Some(*first))
        {
            self.retarget(&job, *first, unfinished.len(), &status)
                .await?;
            return Ok(None);
        }
        let here = |n: &NodeId| {
            held.get(n)
                .map_or(0, |h| h.iter().map(|(_, a)| a.raw()).sum::<u64>())
        };
        let target = status
            .nodes
            .iter()
            .filter(|n| n.takes_tasks())
            .map(|n| n.id)
            .filter(|n| {
                fits(
                    &status,
                    *n,
                    &total,
                    &held.get(n).cloned().unwrap_or_default(),
                )
            })
            .max_by_key(|n| (here(n), std::cmp::Reverse(n.0)));
        let Some(to) = target else {
            return Ok(None);
        };

        if let Some(hook) = self.checkpoint.as_mut() {
            hook(&job);
        }
        self.retarget(&job, to, unfinished.len(), &status).await?;
        let old: Vec<TaskId> = unfinished.iter().map(|i| job.tasks[*i]).collect();
        self.cluster.cancel(old.clone()).await?;
        let stopped = self
            .cluster
            .wait(old.clone(), old.len(), STOP_TIMEOUT)
            .await?;
        if !stopped.iter().all(|s| s.state.is_terminal()) {
            return Err(EslError::Timeout {
                what: format!("the tasks of job {id} to stop"),
                after: STOP_TIMEOUT,
            });
        }
        let specs: Vec<TaskSpec> = unfinished.iter().map(|i| job.specs[*i].clone()).collect();
        let relaunched = self.cluster.submit(specs).await?;
        let entry = self.jobs.get_mut(id).expect("checked above");
        for (i, new) in unfinished.iter().zip(&relaunched) {
            entry.tasks[*i] = *new;
        }
        entry.migrations += 1;
        Ok(Some(Migration {
            from: job.placement.keys().copied().collect(),
            to,
            relaunched,
        }))
    }

    /// Sets `job-<id>` to `count` on `to` and deletes it on the job's other live nodes, in
    /// one batch; records the new placement.
    async fn retarget(
        &mut self,
        job: &Job,
        to: NodeId,
        count: usize,
        status: &ClusterStatus,
    ) -> Result<(), EslError> {
        let mut updates = vec![ResourceUpdate {
            name: job.resource.clone(),
            op: CapacityOp::Set(Capacity::Finite(Amount::units(count as u64)?)),
            target: NodeSpec::Node(to),
        }];
        let alive = |n: &NodeId| status.node(*n).is_some_and(|s| s.alive);
        for node in job.placement.keys().filter(|n| **n != to && alive(n)) {
            updates.push(ResourceUpdate {
                name: job.resource.clone(),
                op: CapacityOp::Delete,
                target: NodeSpec::Node(*node),
            });
        }
        self.cluster.set_resources(updates).await?;
        if let Some(entry) = self.jobs.get_mut(&job.id) {
            entry.placement = BTreeMap::from([(to, count as u64)]);
        }
        Ok(())
    }
}

impl<C: ClusterApi> Policy for Migrator<C> {
    type Key = str;

    /// The requirement of one more task of job `id` (it runs where the job is placed).
    async fn spec_for(&mut self, id: &str) -> Result<ResourceSpec, EslError> {
        ResourceSpec::new().require(Self::resource(id)?, Amount::ONE)
    }
}

#[cfg(test)]
mod tests;
