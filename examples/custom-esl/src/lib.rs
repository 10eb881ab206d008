//! # escher-custom-esl: a scheduling library of your own, from the template
//!
//! This crate is the running example of `docs/writing-an-esl.md`: one policy, built only on
//! the public [`ClusterApi`] seam of `escher-esl`, unit-tested on
//! [`InMemoryCluster`](escher_esl::InMemoryCluster) and tested end to end on a real
//! `escher::LocalCluster`. Copy it, rename it, replace the policy.
//!
//! ## The policy: [`ExposureCap`]
//!
//! **Policy.** At most `percent`% of a job's tasks run at once on *risky* nodes: spot or
//! preemptible machines that may vanish together, canary machines that run a new kernel or
//! driver first. The rest of the job runs on the other nodes, so a wave of preemptions or a
//! bad canary takes down at most that share of the job. `percent = 0` keeps the job off risky
//! nodes entirely; `100` does not limit it.
//!
//! **Construction.** A node is risky when its totals contain a marker resource the
//! operator gives such workers (`spot=1`, `canary=1`): [`Domain::Having`] selects them. The
//! job's budget is `⌊tasks × percent / 100⌋`. One ephemeral resource, `xcap-<job>`, and
//! every task of the job requires one unit of it:
//!
//! - on every live *safe* node it is unbounded: there the cap does not bind;
//! - on the live *risky* nodes it is finite, and the capacities add up to at most the
//!   budget. The scheduler does the rest: a risky node admits the job's tasks while its share
//!   has room, and the head releases a unit when a task ends.
//!
//! The budget is spread by water-filling ([`plan`]): the unit no node has yet goes to the
//! risky node with the smallest share (ties: the lowest id), so `5` over two nodes is `3 + 2`.
//! A share is never lowered: moving a unit from one live node to another cannot be made
//! atomic with the starts that race it, and only raising capacities keeps the cap exact.
//! What a lost risky node held comes back to the pool (its tasks died with it) and is spread
//! over the risky nodes still alive.
//!
//! [`ExposureCap::follow`] keeps the spread current from the cluster's events
//! ([`ClusterApi::watch`], node kind): a node that joins gets its capacity (unbounded if
//! safe, a share of what is unallocated if risky), a lost node's share is spread again. No
//! polling.
//!
//! **Needs from the cluster.** `get_cluster_status` (which nodes are live, which are risky,
//! the shares they have), batched `set_resource` (all or none), `watch` for following.
//!
//! **Limits.** Nodes that join after [`ExposureCap::create`] have no `xcap-<job>` (so the
//! job's tasks cannot use them) until [`ExposureCap::spread`] runs again, which
//! [`ExposureCap::follow`] does for you. A risky node that joins while the whole budget is
//! spread gets nothing: shares are never taken back. The cap counts tasks, not their size.
//! One `ExposureCap` per job: two of them with the same job name would both spread the
//! budget. Shares are read back from `get_cluster_status` by the resource's name as given:
//! through a client with a namespace the head shows it qualified (`ns/xcap-<job>`), the
//! shares read as none, and a spread after a node loss sets them afresh (still adding up to
//! the budget, but no longer only raising them).
//!
//! The crate has a second item, [`Audit`]: a [`ClusterApi`] decorator that records every
//! resource update passing through it, the example of a decorator that overrides one
//! method.

use std::sync::{Arc, Mutex};

use escher_esl::{ClusterApi, Domain, EslError, Policy, ResourceSpec};
use escher_proto::types::{
    Amount, Capacity, CapacityOp, ClusterEvent, ClusterStatus, NodeId, NodeSpec, ResourceName,
    ResourceSet, ResourceUpdate, WatchKind, WatchRequest,
};

/// What this library's resources are named after: `xcap-<job>`. One prefix per library keeps
/// its resources apart from other libraries' and from the application's own.
pub const PREFIX: &str = "xcap";

/// The resource of `job`'s cap, `xcap-<job>`; an error if `job` makes an invalid name.
pub fn resource_name(job: &str) -> Result<ResourceName, EslError> {
    Ok(ResourceName::new(&format!("{PREFIX}-{job}"))?)
}

/// How many of `tasks` may run on risky nodes at once under `percent`: `⌊tasks × percent /
/// 100⌋`.
pub fn budget(tasks: u64, percent: u8) -> u64 {
    // u128: no overflow whatever `tasks` is.
    (u128::from(tasks) * u128::from(percent.min(100)) / 100) as u64
}

/// Where the budget is, as [`plan`] decides it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spread {
    /// Each live risky node, in id order, and how many of the job's tasks it may run at once.
    pub risky: Vec<(NodeId, u64)>,
    /// The live safe nodes, in id order: the job's tasks run there without a cap.
    pub safe: Vec<NodeId>,
    /// What no node has: the whole budget when no risky node is live.
    pub unallocated: u64,
}

impl Spread {
    /// The share of `node`, if it is a live risky node.
    pub fn share(&self, node: NodeId) -> Option<u64> {
        self.risky.iter().find(|(n, _)| *n == node).map(|(_, s)| *s)
    }
}

/// Whole units of a finite capacity (none for an unbounded one).
fn units(capacity: Capacity) -> u64 {
    match capacity {
        Capacity::Finite(amount) => amount.raw() / Amount::ONE.raw(),
        Capacity::Unbounded => 0,
    }
}

/// Decides the spread of `budget` units of `resource` over the nodes `status` shows, the
/// nodes whose totals contain `marker` being the risky ones. Pure: it reads the shares the
/// risky nodes have now and only adds to them (see the crate doc).
pub fn plan(
    status: &ClusterStatus,
    resource: &ResourceName,
    marker: &ResourceSet,
    budget: u64,
) -> Spread {
    let risky = Domain::Having(marker.clone()).resolve(status);
    let safe = Domain::All
        .resolve(status)
        .into_iter()
        .filter(|n| !risky.contains(n))
        .collect();
    let mut shares: Vec<(NodeId, u64)> = risky
        .iter()
        .map(|&n| {
            let have = status
                .node(n)
                .and_then(|node| node.resource(resource.as_str()))
                .map_or(0, |r| units(r.total));
            (n, have)
        })
        .collect();
    let held: u64 = shares.iter().map(|(_, s)| s).sum();
    let mut pool = budget.saturating_sub(held);
    // Water-filling: raise the lowest shares to the next level up, all together, until the
    // pool runs out; what cannot be split evenly goes one unit each to the lowest ids.
    while pool > 0 && !shares.is_empty() {
        let low = shares.iter().map(|(_, s)| *s).min().unwrap_or(0);
        let at_low = shares.iter().filter(|(_, s)| *s == low).count() as u64;
        let next = shares
            .iter()
            .map(|(_, s)| *s)
            .filter(|s| *s > low)
            .min()
            .unwrap_or(u64::MAX);
        let each = (next - low).min(pool / at_low);
        if each == 0 {
            // Fewer units than nodes at the lowest level: one each, lowest ids first.
            for (_, s) in shares.iter_mut().filter(|(_, s)| *s == low) {
                if pool == 0 {
                    break;
                }
                *s += 1;
                pool -= 1;
            }
        } else {
            for (_, s) in shares.iter_mut().filter(|(_, s)| *s == low) {
                *s += each;
            }
            pool -= each * at_low;
        }
    }
    Spread {
        risky: shares,
        safe,
        unallocated: pool,
    }
}

/// The updates that bring the cluster from `status` to `spread`: only what differs.
fn updates(
    status: &ClusterStatus,
    resource: &ResourceName,
    spread: &Spread,
) -> Vec<ResourceUpdate> {
    let now = |n: NodeId| {
        status
            .node(n)
            .and_then(|node| node.resource(resource.as_str()))
            .map(|r| r.total)
    };
    let set = |n: NodeId, capacity: Capacity| ResourceUpdate {
        name: resource.clone(),
        op: CapacityOp::Set(capacity),
        target: NodeSpec::Node(n),
    };
    let mut out = Vec::new();
    for &n in &spread.safe {
        if now(n) != Some(Capacity::Unbounded) {
            out.push(set(n, Capacity::Unbounded));
        }
    }
    for &(n, share) in &spread.risky {
        if share > 0 && now(n).map(units) != Some(share) {
            // `share` is at most the budget, itself at most a u64 of tasks; a share above
            // 10^14 units is refused by `Amount::units` and reported.
            if let Ok(amount) = Amount::units(share) {
                out.push(set(n, Capacity::Finite(amount)));
            }
        }
    }
    out
}

/// At most a share of a job's tasks at once on risky nodes (see the crate doc). Cheap to
/// clone (shared).
#[derive(Debug, Clone)]
pub struct ExposureCap<C> {
    cluster: C,
    resource: ResourceName,
    marker: ResourceSet,
    budget: u64,
    /// One spread at a time: two reading the same pool would hand it out twice.
    serial: Arc<tokio::sync::Mutex<()>>,
}

impl<C: ClusterApi> ExposureCap<C> {
    /// Caps `job`, of `tasks` tasks, to `percent`% of them on the nodes whose totals contain
    /// the resource `risky` (one unit of it: `spot`, `canary`), and spreads the budget now.
    pub async fn create(
        cluster: C,
        job: &str,
        risky: &str,
        tasks: u64,
        percent: u8,
    ) -> Result<ExposureCap<C>, EslError> {
        if percent > 100 {
            return Err(EslError::Unsatisfiable(format!(
                "{job}: {percent}% of a job is more than the job"
            )));
        }
        let mut marker = ResourceSet::new();
        marker.insert(ResourceName::new(risky)?, Amount::ONE);
        let cap = ExposureCap {
            cluster,
            resource: resource_name(job)?,
            marker,
            budget: budget(tasks, percent),
            serial: Arc::default(),
        };
        cap.spread().await?;
        Ok(cap)
    }

    /// The job's resource, `xcap-<job>`.
    pub fn resource(&self) -> &ResourceName {
        &self.resource
    }

    /// How many of the job's tasks may run on risky nodes at once.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// A task's spec: one unit of the job's resource. Attach it to every task of the job
    /// ([`ResourceSpec::apply`]); it composes with other policies' specs
    /// ([`ResourceSpec::and`]).
    pub fn spec(&self) -> ResourceSpec {
        ResourceSpec::new()
            .require(self.resource.clone(), Amount::ONE)
            .expect("one unit of a single resource cannot overflow")
    }

    /// Reads the cluster and gives every live node what [`plan`] says, in one all-or-none
    /// batch; if the batch is refused (a node left between the read and the write), reads
    /// once more and tries again. The spread it left.
    pub async fn spread(&self) -> Result<Spread, EslError> {
        let _one_at_a_time = self.serial.lock().await;
        let mut last = None;
        for _attempt in 0..2 {
            let status = self.cluster.cluster_status().await?;
            let spread = plan(&status, &self.resource, &self.marker, self.budget);
            let batch = updates(&status, &self.resource, &spread);
            if batch.is_empty() {
                return Ok(spread);
            }
            match self.cluster.set_resources(batch).await {
                Ok(_) => return Ok(spread),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| EslError::Missing(self.resource.clone())))
    }

    /// Spreads again whenever a node joins, returns or is lost, from the cluster's events,
    /// until the handle is stopped or dropped. The subscription is in place when this
    /// returns, and one spread follows it (nothing that happened before is missed).
    pub async fn follow(&self) -> Result<Follower, EslError> {
        let mut events = self
            .cluster
            .watch(WatchRequest::all().kinds([WatchKind::Node]))
            .await?;
        self.spread().await?;
        let cap = self.clone();
        let task = tokio::spawn(async move {
            while let Some(event) = events.next().await {
                match event {
                    Ok(e) if matches!(e.event, ClusterEvent::Node { .. }) => {
                        // A failed spread is tried again at the next node event; the cap
                        // itself holds meanwhile (shares are only ever raised).
                        let _ = cap.spread().await;
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        });
        Ok(Follower { task })
    }

    /// Removes the job's resource from every node (running tasks keep their units).
    pub async fn dissolve(self) -> Result<(), EslError> {
        let every_node = NodeSpec::Match {
            resources: ResourceSet::new(),
            num_nodes: None,
        };
        self.cluster
            .delete_resource(self.resource.clone(), every_node)
            .await?;
        Ok(())
    }
}

/// Every policy of `escher-esl` implements [`Policy`]: code that takes "some policy" can
/// take this one. All of a job's tasks are alike to it (`Key = ()`).
impl<C: ClusterApi> Policy for ExposureCap<C> {
    type Key = ();

    async fn spec_for(&mut self, _key: &()) -> Result<ResourceSpec, EslError> {
        Ok(self.spec())
    }
}

/// [`ExposureCap::follow`]'s background task; stops when dropped.
#[derive(Debug)]
pub struct Follower {
    task: tokio::task::JoinHandle<()>,
}

impl Follower {
    /// Stops following.
    pub fn stop(self) {}
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A [`ClusterApi`] in front of another that records every resource update passing through
/// it, batch by batch: the smallest useful decorator. It overrides `set_resources` alone,
/// which the conveniences (`set_resource`, `adjust_resource`, `delete_resource`) go through
/// too; everything else reaches the cluster underneath by [`ClusterApi::inner`].
#[derive(Debug, Clone)]
pub struct Audit<C> {
    inner: C,
    log: Arc<Mutex<Vec<Vec<ResourceUpdate>>>>,
}

impl<C: ClusterApi> Audit<C> {
    /// Records what goes through to `inner`.
    pub fn new(inner: C) -> Audit<C> {
        Audit {
            inner,
            log: Arc::default(),
        }
    }

    /// Every batch that went through so far, in order (refused ones too).
    pub fn batches(&self) -> Vec<Vec<ResourceUpdate>> {
        self.log
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

impl<C: ClusterApi> ClusterApi for Audit<C> {
    fn inner(&self) -> &impl ClusterApi {
        &self.inner
    }

    async fn set_resources(
        &self,
        updates: Vec<ResourceUpdate>,
    ) -> Result<Vec<Vec<NodeId>>, EslError> {
        self.log
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(updates.clone());
        self.inner.set_resources(updates).await
    }
}

#[cfg(test)]
mod tests;
