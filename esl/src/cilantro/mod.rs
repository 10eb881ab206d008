//! Cilantro as an ESL: performance-aware allocation learned online (thesis chapter 3,
//! "Performance-aware Scheduling with Cilantro").
//!
//! **Policy.** A fixed pool of one fungible resource (`cpu` by default) is shared by jobs
//! that do not state demands. Each round, every job's performance with the allocation it had
//! is reported; a learner per job turns the reports into confidence bounds on performance as
//! a function of allocation ([`Learner`]), and an uncertainty-aware policy turns the bounds
//! into the next allocations ([`Objective`]: NJC fairness, social or egalitarian welfare;
//! resource-fair as the baseline), changing no job by more than `B` units a round.
//!
//! **Construction (ours: the thesis does not build Cilantro on ESCHER).** Cilantro's resource
//! allocator is essentially the HFS ESL (thesis §4.4.2) with learned rather than weighted
//! targets: each job has an ephemeral resource `cil-<instance>-<job>`, finite, spread over the
//! nodes of the domain so that its capacities sum to the job's allocation and, on each node, all jobs together fit the node's total of
//! the pooled resource. A job's replicas request one unit of it (plus their physical needs,
//! [`Cilantro::spec`]), so at most its allocation of them run. [`Cilantro::round`] decides and
//! applies the new capacities in one all-or-none `set_resources` batch, keeping each job on
//! the nodes it had as far as its new allocation allows (fewer replicas move).
//!
//! **Needs from the cluster.** `get_cluster_status` (the domain's nodes and their sizes) and
//! batched `set_resource`. The performance feedback is the application's: it calls
//! [`Cilantro::report`] with what a job measured (in the example, what the job's monitor task
//! reported each round as task telemetry, read with `Client::telemetry`); the thesis' sidecars
//! push the same over gRPC.
//!
//! **Limits.** Lowering a capacity preempts nothing: replicas above the new allocation keep
//! running until the application scales the job down (it cancels them); the learner is told
//! the allocation the job *had*, which the application reports with the performance. One
//! pooled resource, as in the thesis. SW/EW are optimised greedily rather than by the
//! thesis' evolutionary algorithm (see [`policy`]); the load forecaster is left out (the
//! synthetic experiment's load is constant), so performance is learned against allocation
//! alone.

mod learner;
pub mod policy;
#[cfg(test)]
mod tests;

pub use learner::{Learner, LearnerConfig};
pub use policy::{Decision, JobView, Objective, RoundConfig, decide, njc_split, utility};

use std::collections::BTreeMap;

use escher_proto::types::{
    Amount, Capacity, CapacityOp, NodeId, NodeSpec, ResourceName, ResourceUpdate,
};

use crate::policy::{Domain, er_name};
use crate::{ClusterApi, EslError, ResourceSpec};

/// A job under Cilantro.
#[derive(Debug, Clone)]
pub struct Job {
    /// Its resource, `cil-<instance>-<job>`.
    pub resource: ResourceName,
    /// Its performance objective.
    pub slo: f64,
    /// What it learned.
    pub learner: Learner,
    /// Units it has now.
    pub allocation: u64,
    /// Its last NJC demand.
    pub demand: Option<f64>,
    /// Where its units are: node → capacity.
    pub placement: BTreeMap<NodeId, u64>,
}

/// A Cilantro instance over a domain of nodes.
#[derive(Debug)]
pub struct Cilantro<C> {
    cluster: C,
    instance: String,
    domain: Domain,
    pooled: ResourceName,
    objective: Objective,
    learner: LearnerConfig,
    config: RoundConfig,
    jobs: BTreeMap<String, Job>,
}

impl<C: ClusterApi> Cilantro<C> {
    /// An instance sharing the `pooled` resource (`cpu`) of `domain`'s nodes under
    /// `objective`, with the thesis' B = 10 and β = 3/4 (see [`Cilantro::with_round`]).
    pub fn new(
        cluster: C,
        instance: &str,
        domain: Domain,
        pooled: &str,
        objective: Objective,
    ) -> Result<Cilantro<C>, EslError> {
        er_name(&["cil", instance])?;
        Ok(Cilantro {
            cluster,
            instance: instance.to_string(),
            domain,
            pooled: ResourceName::new(pooled)?,
            objective,
            learner: LearnerConfig::default(),
            config: RoundConfig::default(),
            jobs: BTreeMap::new(),
        })
    }

    /// Uses these round parameters (`total` is always the domain's pool, read each round).
    pub fn with_round(mut self, config: RoundConfig) -> Cilantro<C> {
        self.config = config;
        self
    }

    /// Learns with these parameters (for jobs added afterwards).
    pub fn with_learner(mut self, config: LearnerConfig) -> Cilantro<C> {
        self.learner = config;
        self
    }

    /// Adds job `id` with its SLO (the performance at which its utility is 1); it gets units
    /// from the next round on.
    pub fn add_job(&mut self, id: &str, slo: f64) -> Result<&Job, EslError> {
        let resource = er_name(&["cil", &self.instance, id])?;
        let job = Job {
            resource,
            slo,
            learner: Learner::new(self.learner),
            allocation: 0,
            demand: None,
            placement: BTreeMap::new(),
        };
        Ok(self.jobs.entry(id.to_string()).or_insert(job))
    }

    /// Job `id`.
    pub fn job(&self, id: &str) -> Option<&Job> {
        self.jobs.get(id)
    }

    /// Every job, by id.
    pub fn jobs(&self) -> &BTreeMap<String, Job> {
        &self.jobs
    }

    /// What each replica of job `id` requires besides its physical needs: one unit of the
    /// job's resource.
    pub fn spec(&self, id: &str) -> Result<ResourceSpec, EslError> {
        let job = self
            .jobs
            .get(id)
            .ok_or_else(|| unknown(&self.instance, id))?;
        ResourceSpec::new().require(job.resource.clone(), Amount::ONE)
    }

    /// Job `id` performed `performance` while it had `allocation` units.
    pub fn report(&mut self, id: &str, allocation: u64, performance: f64) -> Result<(), EslError> {
        let instance = self.instance.clone();
        let job = self
            .jobs
            .get_mut(id)
            .ok_or_else(|| unknown(&instance, id))?;
        job.learner.observe(allocation as f64, performance);
        Ok(())
    }

    /// Decides the next allocations and applies them; job → units.
    pub async fn round(&mut self) -> Result<BTreeMap<String, u64>, EslError> {
        let status = self.cluster.cluster_status().await?;
        let sizes: Vec<(NodeId, u64)> = self
            .domain
            .resolve(&status)
            .into_iter()
            .filter_map(|id| {
                let r = status.node(id)?.resource(self.pooled.as_str())?;
                match r.total {
                    Capacity::Finite(units) => Some((id, units.as_f64().floor() as u64)),
                    Capacity::Unbounded => None,
                }
            })
            .collect();
        let total: u64 = sizes.iter().map(|(_, s)| s).sum();
        if total == 0 {
            return Err(EslError::Missing(self.pooled.clone()));
        }
        let ids: Vec<String> = self.jobs.keys().cloned().collect();
        let decision = {
            let views: Vec<JobView<'_>> = ids
                .iter()
                .map(|id| {
                    let j = &self.jobs[id];
                    JobView {
                        learner: &j.learner,
                        slo: j.slo,
                        previous: j.allocation,
                        previous_demand: j.demand,
                    }
                })
                .collect();
            let config = RoundConfig {
                total,
                ..self.config
            };
            decide(self.objective, &views, config)
        };
        let placements = place(
            &sizes,
            &ids.iter()
                .zip(&decision.allocations)
                .map(|(id, a)| (self.jobs[id].placement.clone(), *a))
                .collect::<Vec<_>>(),
        );
        let mut updates = Vec::new();
        for (id, placement) in ids.iter().zip(&placements) {
            let job = &self.jobs[id];
            for (node, _) in sizes.iter() {
                let (was, now) = (
                    job.placement.get(node).copied().unwrap_or(0),
                    placement.get(node).copied().unwrap_or(0),
                );
                if was == now {
                    continue;
                }
                let op = if now == 0 {
                    CapacityOp::Delete
                } else {
                    CapacityOp::Set(Capacity::Finite(Amount::units(now)?))
                };
                updates.push(ResourceUpdate {
                    name: job.resource.clone(),
                    op,
                    target: NodeSpec::Node(*node),
                });
            }
        }
        if !updates.is_empty() {
            self.cluster.set_resources(updates).await?;
        }
        let mut out = BTreeMap::new();
        for (i, id) in ids.iter().enumerate() {
            let job = self.jobs.get_mut(id).expect("listed above");
            job.allocation = decision.allocations[i];
            job.demand = decision.demands.get(i).copied();
            job.placement = placements[i].clone();
            out.insert(id.clone(), job.allocation);
        }
        Ok(out)
    }

    /// Removes every job's resource from the cluster.
    pub async fn dissolve(self) -> Result<(), EslError> {
        let updates: Vec<ResourceUpdate> = self
            .jobs
            .values()
            .flat_map(|j| {
                j.placement.keys().map(|n| ResourceUpdate {
                    name: j.resource.clone(),
                    op: CapacityOp::Delete,
                    target: NodeSpec::Node(*n),
                })
            })
            .collect();
        if !updates.is_empty() {
            self.cluster.set_resources(updates).await?;
        }
        Ok(())
    }
}

fn unknown(instance: &str, id: &str) -> EslError {
    EslError::Unsatisfiable(format!(
        "cilantro instance {instance} has no job {id:?}; add it with add_job first"
    ))
}

/// Spreads each job's units over the nodes (`sizes`: node → units it has), keeping a job's
/// units where it had them first, then filling the nodes with the most room. Jobs are
/// `(previous placement, units now)`; together they must fit in the nodes' total.
pub fn place(
    sizes: &[(NodeId, u64)],
    jobs: &[(BTreeMap<NodeId, u64>, u64)],
) -> Vec<BTreeMap<NodeId, u64>> {
    let mut room: BTreeMap<NodeId, u64> = sizes.iter().copied().collect();
    let mut out: Vec<BTreeMap<NodeId, u64>> = vec![BTreeMap::new(); jobs.len()];
    let mut left: Vec<u64> = jobs.iter().map(|(_, units)| *units).collect();
    // Keep what can stay, shrinking from the nodes it had least on.
    for (j, (previous, _)) in jobs.iter().enumerate() {
        let mut had: Vec<(NodeId, u64)> = previous.iter().map(|(n, c)| (*n, *c)).collect();
        had.sort_by_key(|(n, c)| (std::cmp::Reverse(*c), *n));
        for (node, count) in had {
            let Some(r) = room.get_mut(&node) else {
                continue;
            };
            let keep = count.min(left[j]).min(*r);
            if keep > 0 {
                out[j].insert(node, keep);
                *r -= keep;
                left[j] -= keep;
            }
        }
    }
    // Then the rest, on the nodes with the most room.
    for j in 0..jobs.len() {
        while left[j] > 0 {
            let Some((node, r)) = room
                .iter_mut()
                .filter(|(_, r)| **r > 0)
                .max_by_key(|(n, r)| (**r, std::cmp::Reverse(**n)))
            else {
                break;
            };
            let give = (*r).min(left[j]);
            *r -= give;
            left[j] -= give;
            *out[j].entry(*node).or_insert(0) += give;
        }
    }
    out
}
