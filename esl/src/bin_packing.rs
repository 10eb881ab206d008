//! Bin packing: fill the fullest node that fits first, so that whole nodes stay free (for big
//! jobs, or to be turned off).
//!
//! **Policy.** *Best fit decreasing* over one resource `R` (e.g. `cpu`): tasks are taken in
//! decreasing order of their demand for `R`, and each goes to the node where it fits (every
//! resource of its demand is available) and leaves the least of `R` free; ties go to the lower
//! node id. [`BinPacking::place`] places one task (best fit); [`BinPacking::place_all`]
//! places a batch (best fit decreasing), accounting for the batch's own placements.
//!
//! **Construction (thesis §4.2.1 and §4.6.1 name dynamic bin packing; Table 4.2's targeted
//! placement).** Read `get_cluster_status`, compute the plan with the pure function
//! [`best_fit_decreasing`], and pin each task to its node with the marker `bp-node-<id>`
//! (unbounded, on that node only). The task keeps its own physical demand, which the core
//! still admission-controls on that node.
//!
//! **Needs from the cluster.** `get_cluster_status` before every placement.
//!
//! **Limits.** The snapshot is advisory (thesis §4.7: no atomic check-and-reserve): another
//! client may take the space first, and then the pinned task waits on its node. A task that
//! fits on no node now is given no pin (the core places it wherever it first fits). Packing
//! is decided at placement time only: running tasks are not moved when nodes empty (that is
//! migration, another ESL). Placements by separate calls see each other only once they run.

use std::collections::{BTreeMap, BTreeSet};

use escher_proto::types::{Amount, Capacity, ClusterStatus, NodeId, ResourceName, ResourceSet};

use crate::policy::Policy;
use crate::target::Targets;
use crate::{ClusterApi, EslError, ResourceSpec};

/// What a node has free, as a bin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bin {
    /// The node.
    pub node: NodeId,
    /// Free amount of each finite resource.
    pub free: BTreeMap<ResourceName, Amount>,
    /// Resources with unbounded capacity (always fit).
    pub unbounded: BTreeSet<ResourceName>,
}

impl Bin {
    /// The bins of every live node.
    pub fn of(status: &ClusterStatus) -> Vec<Bin> {
        status
            .nodes
            .iter()
            .filter(|n| n.takes_tasks())
            .map(|n| {
                let mut bin = Bin {
                    node: n.id,
                    free: BTreeMap::new(),
                    unbounded: BTreeSet::new(),
                };
                for r in &n.resources {
                    match r.total {
                        Capacity::Unbounded => {
                            bin.unbounded.insert(r.name.clone());
                        }
                        Capacity::Finite(_) => {
                            let free = r.available().unwrap_or(Amount::ZERO);
                            bin.free.insert(r.name.clone(), free);
                        }
                    }
                }
                bin
            })
            .collect()
    }

    /// Whether every resource of `demand` is available here.
    pub fn fits(&self, demand: &ResourceSet) -> bool {
        demand.iter().all(|(name, amount)| {
            self.unbounded.contains(name) || self.free.get(name).is_some_and(|free| *free >= amount)
        })
    }

    /// What would be left of `resource` after placing `demand` (unbounded: the most).
    fn left_after(&self, resource: &str, demand: &ResourceSet) -> Amount {
        if self.unbounded.contains(resource) {
            return Amount::MAX;
        }
        let free = self.free.get(resource).copied().unwrap_or(Amount::ZERO);
        free.saturating_sub(demand.get(resource))
    }

    fn take(&mut self, demand: &ResourceSet) {
        for (name, amount) in demand.iter() {
            if let Some(free) = self.free.get_mut(name) {
                *free = free.saturating_sub(amount);
            }
        }
    }
}

/// Best fit decreasing over `resource`: for each demand (in the given order), the node it goes
/// to, or `None` if it fits nowhere. Demands are considered largest first (by `resource`; ties
/// in the given order), each on the fitting node with the least of `resource` left after it.
pub fn best_fit_decreasing(
    bins: &[Bin],
    resource: &str,
    demands: &[ResourceSet],
) -> Vec<Option<NodeId>> {
    let mut bins = bins.to_vec();
    let mut order: Vec<usize> = (0..demands.len()).collect();
    order.sort_by(|a, b| demands[*b].get(resource).cmp(&demands[*a].get(resource)));
    let mut plan = vec![None; demands.len()];
    for i in order {
        let demand = &demands[i];
        let best = bins
            .iter_mut()
            .filter(|b| b.fits(demand))
            .min_by_key(|b| (b.left_after(resource, demand), b.node));
        if let Some(bin) = best {
            bin.take(demand);
            plan[i] = Some(bin.node);
        }
    }
    plan
}

/// Packs tasks onto the fullest nodes that fit.
#[derive(Debug, Clone)]
pub struct BinPacking<C> {
    cluster: C,
    resource: ResourceName,
    targets: Targets,
    pinned: BTreeSet<NodeId>,
}

impl<C: ClusterApi> BinPacking<C> {
    /// Packs by `resource` (e.g. `cpu`).
    pub fn new(cluster: C, resource: &str) -> Result<BinPacking<C>, EslError> {
        Ok(BinPacking {
            cluster,
            resource: ResourceName::new(resource)?,
            targets: Targets::new("bp-node"),
            pinned: BTreeSet::new(),
        })
    }

    /// The spec of one task with this demand (its physical requirements): best fit.
    pub async fn place(&mut self, demand: &ResourceSet) -> Result<ResourceSpec, EslError> {
        let mut specs = self.place_all(std::slice::from_ref(demand)).await?;
        Ok(specs.remove(0))
    }

    /// The specs of a batch of tasks, in the given order: best fit decreasing.
    pub async fn place_all(
        &mut self,
        demands: &[ResourceSet],
    ) -> Result<Vec<ResourceSpec>, EslError> {
        let status = self.cluster.cluster_status().await?;
        let plan = best_fit_decreasing(&Bin::of(&status), self.resource.as_str(), demands);
        let nodes: Vec<NodeId> = plan.iter().flatten().copied().collect();
        self.pinned.extend(nodes.iter().copied());
        let mut pins = self.targets.pin(&self.cluster, &nodes).await?.into_iter();
        Ok(plan
            .iter()
            .map(|p| match p {
                Some(_) => pins.next().unwrap_or_default(),
                None => ResourceSpec::new(),
            })
            .collect())
    }

    /// Removes the markers this policy created (pinned tasks that have not started wait).
    pub async fn dissolve(self) -> Result<(), EslError> {
        let pinned: Vec<NodeId> = self.pinned.iter().copied().collect();
        self.targets.clear(&self.cluster, &pinned).await
    }
}

impl<C: ClusterApi> Policy for BinPacking<C> {
    /// The task's physical demand.
    type Key = ResourceSet;

    async fn spec_for(&mut self, demand: &ResourceSet) -> Result<ResourceSpec, EslError> {
        self.place(demand).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::{Rng, task};
    use crate::{InMemoryCluster, Mode};

    fn set(text: &str) -> ResourceSet {
        text.parse().unwrap()
    }

    fn cpus(n: u64) -> ResourceSet {
        set(&format!("cpu={n}"))
    }

    fn bin(node: u64, cpu: u64) -> Bin {
        Bin {
            node: NodeId(node),
            free: [(ResourceName::cpu(), Amount::units(cpu).unwrap())].into(),
            unbounded: BTreeSet::new(),
        }
    }

    #[test]
    fn best_fit_decreasing_fills_nodes() {
        let bins = [bin(1, 4), bin(2, 4), bin(3, 4)];
        let demands: Vec<ResourceSet> = [3, 1, 2, 2, 1, 3].map(cpus).to_vec();
        let plan = best_fit_decreasing(&bins, "cpu", &demands);
        // 3 -> n1, 3 -> n2, 2 -> n3, 2 -> n3, 1 -> n1 (fullest that fits), 1 -> n2.
        let ids: Vec<u64> = plan.iter().map(|p| p.unwrap().0).collect();
        assert_eq!(ids, [1, 1, 3, 3, 2, 2]);
        // Something that fits nowhere is left out, and the rest still packs.
        let plan = best_fit_decreasing(&bins, "cpu", &[cpus(5), cpus(4)]);
        assert_eq!(plan, [None, Some(NodeId(1))]);
        // Other resources must fit too.
        let mut gpu = bin(4, 8);
        gpu.free.insert(ResourceName::gpu(), Amount::ONE);
        let plan = best_fit_decreasing(&[bin(1, 2), gpu], "cpu", &[set("cpu=1,gpu=1")]);
        assert_eq!(plan, [Some(NodeId(4))]);
    }

    /// Whenever a task opens an emptier node, no fuller node could have held it.
    #[test]
    fn no_task_goes_to_an_emptier_node_than_needed() {
        let mut rng = Rng::new(31);
        for _ in 0..500 {
            let bins: Vec<Bin> = (0..rng.range(1, 5))
                .map(|i| bin(i, rng.range(2, 8)))
                .collect();
            let demands: Vec<ResourceSet> = (0..rng.range(1, 12))
                .map(|_| cpus(rng.range(1, 4)))
                .collect();
            let plan = best_fit_decreasing(&bins, "cpu", &demands);
            // Replay in the decreasing order and check each step.
            let mut free: BTreeMap<NodeId, u64> = bins
                .iter()
                .map(|b| (b.node, b.free[&ResourceName::cpu()].raw() / 10_000))
                .collect();
            let mut order: Vec<usize> = (0..demands.len()).collect();
            order.sort_by_key(|i| std::cmp::Reverse(demands[*i].get("cpu")));
            for i in order {
                let d = demands[i].get("cpu").raw() / 10_000;
                match plan[i] {
                    None => assert!(free.values().all(|f| *f < d), "it fitted somewhere"),
                    Some(node) => {
                        let left = free[&node] - d;
                        for f in free.values() {
                            assert!(*f < d || *f - d >= left, "a fuller node fitted");
                        }
                        *free.get_mut(&node).unwrap() -= d;
                    }
                }
            }
        }
    }

    #[tokio::test]
    async fn tasks_fill_one_node_before_opening_the_next() {
        let cluster = InMemoryCluster::new(Mode::Manual);
        for _ in 0..3 {
            cluster.add_node("cpu=4");
        }
        let mut bp = BinPacking::new(cluster.clone(), "cpu").unwrap();
        let mut ids = Vec::new();
        for k in 1..=9u64 {
            let spec = bp.spec_for(&cpus(1)).await.unwrap();
            ids.push(cluster.submit(vec![task("cpu=1", &spec)]).await.unwrap()[0]);
            let used: BTreeSet<NodeId> = ids.iter().filter_map(|t| cluster.node_of(*t)).collect();
            assert_eq!(used.len() as u64, k.div_ceil(4), "after {k} tasks");
        }
        // A node frees up in part: the next task goes to the fullest node that fits.
        let (first, _) = cluster.running()[0];
        let home = cluster.node_of(first).unwrap();
        cluster.finish(first, true);
        let spec = bp.place(&cpus(1)).await.unwrap();
        let next = cluster.submit(vec![task("cpu=1", &spec)]).await.unwrap()[0];
        assert_eq!(
            cluster.node_of(next),
            Some(home),
            "the 3/4 full node, not the 1/4 one"
        );
        bp.dissolve().await.unwrap();
    }

    #[tokio::test]
    async fn a_packed_batch_runs_where_it_was_planned() {
        let cluster = InMemoryCluster::new(Mode::Manual);
        let nodes: Vec<NodeId> = (0..3).map(|_| cluster.add_node("cpu=4,memory=8")).collect();
        let mut bp = BinPacking::new(cluster.clone(), "cpu").unwrap();
        let demands: Vec<ResourceSet> = ["cpu=3", "cpu=1", "cpu=2", "cpu=2", "cpu=1", "cpu=3"]
            .iter()
            .map(|d| set(d))
            .collect();
        let specs = bp.place_all(&demands).await.unwrap();
        let tasks = demands
            .iter()
            .zip(&specs)
            .map(|(d, s)| task(&d.to_string(), s))
            .collect();
        let ids = cluster.submit(tasks).await.unwrap();
        assert_eq!(cluster.running().len(), 6, "all fit");
        let status = cluster.cluster_status().await.unwrap();
        for node in &nodes {
            let cpu = status.node(*node).unwrap().resource("cpu").unwrap();
            assert_eq!(cpu.available(), Some(Amount::ZERO), "node {node:?} is full");
        }
        assert_eq!(cluster.node_of(ids[0]), cluster.node_of(ids[1]), "3 + 1");
        let none = bp.place(&cpus(1)).await.unwrap();
        assert!(none.resources.is_empty(), "nothing fits now: no pin");
    }
}
