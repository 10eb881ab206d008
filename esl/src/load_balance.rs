//! Load balancing: static spreading with per-node slots, and dynamic least-utilised placement.
//!
//! **Policy.** [`LoadBalance`] (static): at most `k` of the policy's tasks run on any node
//! at once, so a burst spreads over the cluster. [`LeastLoaded`] (dynamic): each task goes to
//! the node whose utilisation of a resource (`used / total` of `cpu`, or any other) is the
//! lowest when it is placed.
//!
//! **Construction.**
//! - Static (thesis Fig. 4.4b, §4.4.2 "Policy composition"): `for node in cluster:
//!   set_resource("load_balancing", 1, node)`; each task requests `{load_balancing: 1}`.
//!   Here the resource is `lb-<name>` with `k` per node on every node of a [`Domain`], set in
//!   one all-or-none batch.
//! - Dynamic (thesis §4.3.5: "utilisation-aware balancing computes the current load from the
//!   cluster state"; §4.7 lists it as possible "with higher overhead"): read
//!   `get_cluster_status`, compute `used / total` per node with integer cross-multiplication
//!   (no floats), pick the lowest among the nodes where the task's demand fits (ties: the lower
//!   node id), and pin the task there with the targeted-placement marker `lb-node-<id>`
//!   (unbounded, on that node only).
//!
//! **Needs from the cluster.** Static: `set_resource` and, to find the domain's nodes,
//! `get_cluster_status`. Dynamic: `get_cluster_status` before every placement.
//!
//! **Limits.** The static policy limits concurrency per node but does not look at load: a
//! node full of other work still gets its `k`. The dynamic policy decides from a snapshot
//! that is advisory and racy (thesis §4.7: no atomic check-and-reserve): the chosen node may
//! fill up before the task arrives, and then the task waits *there* (the pin is a hard
//! constraint). Tasks placed by one [`LeastLoaded::place`] call account for each other; tasks
//! placed by separate calls see each other only once they run. A pinned task whose node dies
//! waits until the application places it again.

use std::cmp::Ordering;
use std::collections::BTreeSet;

use escher_proto::types::{Amount, Capacity, CapacityOp, ClusterStatus, NodeId, ResourceName};

use crate::policy::{Domain, Policy, apply_on_domain, er_name, every_node};
use crate::target::Targets;
use crate::{ClusterApi, EslError, ResourceSpec};

/// Static spreading: at most `k` of the policy's tasks per node at once.
#[derive(Debug, Clone)]
pub struct LoadBalance<C> {
    cluster: C,
    slots: ResourceName,
    domain: Domain,
}

impl<C: ClusterApi> LoadBalance<C> {
    /// Sets `lb-<name>` to `per_node` on every node of `domain`.
    pub async fn create(
        cluster: C,
        name: &str,
        per_node: u64,
        domain: Domain,
    ) -> Result<LoadBalance<C>, EslError> {
        let lb = LoadBalance {
            cluster,
            slots: er_name(&["lb", name])?,
            domain,
        };
        lb.resize(per_node).await?;
        Ok(lb)
    }

    /// The per-node slot resource, `lb-<name>`.
    pub fn resource(&self) -> &ResourceName {
        &self.slots
    }

    /// A task's spec: one slot.
    pub fn spec(&self) -> ResourceSpec {
        ResourceSpec::new()
            .require(self.slots.clone(), Amount::ONE)
            .expect("one unit of a single resource cannot overflow")
    }

    /// Sets the slots per node on every node of the domain now (nodes that joined get theirs
    /// too); the nodes changed.
    pub async fn resize(&self, per_node: u64) -> Result<Vec<NodeId>, EslError> {
        if per_node == 0 {
            return Err(EslError::Unsatisfiable(format!(
                "{}: zero slots per node would admit nothing; use dissolve to remove it",
                self.slots
            )));
        }
        let set = CapacityOp::Set(Capacity::Finite(Amount::units(per_node)?));
        let nodes = apply_on_domain(&self.cluster, &self.domain, &self.slots, set).await?;
        if nodes.is_empty() {
            return Err(EslError::Unsatisfiable(format!(
                "{}: the domain ({}) has no node",
                self.slots, self.domain
            )));
        }
        Ok(nodes)
    }

    /// Removes the slots from every node (running tasks keep theirs).
    pub async fn dissolve(self) -> Result<(), EslError> {
        self.cluster
            .delete_resource(self.slots.clone(), every_node())
            .await?;
        Ok(())
    }
}

impl<C: ClusterApi> Policy for LoadBalance<C> {
    type Key = ();

    async fn spec_for(&mut self, _key: &()) -> Result<ResourceSpec, EslError> {
        Ok(self.spec())
    }
}

/// One node's use of the balanced resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeLoad {
    /// The node.
    pub node: NodeId,
    /// How much running tasks hold.
    pub used: Amount,
    /// The node's capacity (finite and non-zero).
    pub total: Amount,
}

impl NodeLoad {
    /// The load of every live node with a finite, non-zero amount of `resource`.
    pub fn of(status: &ClusterStatus, resource: &str) -> Vec<NodeLoad> {
        status
            .nodes
            .iter()
            .filter(|n| n.takes_tasks())
            .filter_map(|n| {
                let r = n.resource(resource)?;
                match r.total {
                    Capacity::Finite(total) if !total.is_zero() => Some(NodeLoad {
                        node: n.id,
                        used: r.used,
                        total,
                    }),
                    _ => None,
                }
            })
            .collect()
    }

    /// `used / total` compared exactly (cross-multiplied).
    pub fn cmp_utilisation(&self, other: &NodeLoad) -> Ordering {
        let a = u128::from(self.used.raw()) * u128::from(other.total.raw());
        let b = u128::from(other.used.raw()) * u128::from(self.total.raw());
        a.cmp(&b)
    }

    /// Utilisation, then node id: the order in which nodes are preferred.
    fn preference(&self, other: &NodeLoad) -> Ordering {
        self.cmp_utilisation(other).then(self.node.cmp(&other.node))
    }

    fn fits(&self, demand: Amount) -> bool {
        self.total.saturating_sub(self.used) >= demand
    }
}

/// Places `n` tasks of `demand` each, one after the other, each on the least-utilised node
/// where it fits (or, when it fits nowhere now, the least-utilised node, where it will wait),
/// counting the earlier ones of the batch. Empty when there are no nodes.
pub fn plan_least_utilised(loads: &[NodeLoad], demand: Amount, n: usize) -> Vec<NodeId> {
    let mut loads = loads.to_vec();
    let mut plan = Vec::with_capacity(n);
    for _ in 0..n {
        let fitting = loads
            .iter()
            .enumerate()
            .filter(|(_, l)| l.fits(demand))
            .min_by(|a, b| a.1.preference(b.1));
        let any = || loads.iter().enumerate().min_by(|a, b| a.1.preference(b.1));
        let Some((i, _)) = fitting.or_else(any) else {
            break;
        };
        loads[i].used = loads[i].used.checked_add(demand).unwrap_or(Amount::MAX);
        plan.push(loads[i].node);
    }
    plan
}

/// Dynamic balancing: each task to the least-utilised node.
#[derive(Debug, Clone)]
pub struct LeastLoaded<C> {
    cluster: C,
    resource: ResourceName,
    targets: Targets,
    pinned: BTreeSet<NodeId>,
}

impl<C: ClusterApi> LeastLoaded<C> {
    /// Balances the utilisation of `resource` (e.g. `cpu`).
    pub fn new(cluster: C, resource: &str) -> Result<LeastLoaded<C>, EslError> {
        Ok(LeastLoaded {
            cluster,
            resource: ResourceName::new(resource)?,
            targets: Targets::new("lb-node"),
            pinned: BTreeSet::new(),
        })
    }

    /// The spec of one task that will hold `demand` of the balanced resource.
    pub async fn next_spec(&mut self, demand: Amount) -> Result<ResourceSpec, EslError> {
        let mut specs = self.place(1, demand).await?;
        Ok(specs.remove(0))
    }

    /// The specs of `n` tasks of `demand` each, spread as [`plan_least_utilised`] says.
    pub async fn place(&mut self, n: usize, demand: Amount) -> Result<Vec<ResourceSpec>, EslError> {
        let status = self.cluster.cluster_status().await?;
        let loads = NodeLoad::of(&status, self.resource.as_str());
        if loads.is_empty() && n > 0 {
            return Err(EslError::Missing(self.resource.clone()));
        }
        let plan = plan_least_utilised(&loads, demand, n);
        self.pinned.extend(plan.iter().copied());
        self.targets.pin(&self.cluster, &plan).await
    }

    /// Removes the markers this policy created (pinned tasks that have not started wait).
    pub async fn dissolve(self) -> Result<(), EslError> {
        let pinned: Vec<NodeId> = self.pinned.iter().copied().collect();
        self.targets.clear(&self.cluster, &pinned).await
    }
}

impl<C: ClusterApi> Policy for LeastLoaded<C> {
    type Key = Amount;

    async fn spec_for(&mut self, demand: &Amount) -> Result<ResourceSpec, EslError> {
        self.next_spec(*demand).await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use escher_proto::types::TaskId;

    use super::*;
    use crate::policy::testing::{Rng, task};
    use crate::{InMemoryCluster, Mode};

    fn units(n: u64) -> Amount {
        Amount::units(n).unwrap()
    }

    #[tokio::test]
    async fn static_slots_bound_every_node_and_spread_a_burst() {
        let mut rng = Rng::new(42);
        for round in 0..40 {
            let cluster = InMemoryCluster::new(Mode::Manual);
            let nodes: Vec<NodeId> = (0..rng.range(2, 5))
                .map(|_| cluster.add_node("cpu=16"))
                .collect();
            let k = rng.range(1, 3) as usize;
            let mut lb = LoadBalance::create(cluster.clone(), "web", k as u64, Domain::All)
                .await
                .unwrap();
            let count = rng.range(1, 20) as usize;
            let spec = lb.spec_for(&()).await.unwrap();
            let ids: BTreeSet<TaskId> = cluster
                .submit(vec![task("cpu=1", &spec); count])
                .await
                .unwrap()
                .into_iter()
                .collect();
            let mut done = 0;
            while done < count {
                let mut per_node: BTreeMap<NodeId, usize> = BTreeMap::new();
                for (t, n) in cluster.running() {
                    if ids.contains(&t) {
                        *per_node.entry(n).or_default() += 1;
                    }
                }
                assert!(
                    per_node.values().all(|c| *c <= k),
                    "round {round}: {per_node:?}"
                );
                let busy: usize = per_node.values().sum();
                // Work-conserving: as many run as the slots allow.
                assert_eq!(busy, (count - done).min(k * nodes.len()), "round {round}");
                let running = cluster.running();
                let (t, _) = running[rng.below(running.len())];
                cluster.finish(t, true);
                done += 1;
            }
            lb.dissolve().await.unwrap();
        }
    }

    #[tokio::test]
    async fn resizing_reaches_nodes_that_joined_later() {
        let cluster = InMemoryCluster::new(Mode::Manual);
        cluster.add_node("cpu=4,ssd=1");
        cluster.add_node("cpu=4");
        let ssd = Domain::Having("ssd=1".parse().unwrap());
        let lb = LoadBalance::create(cluster.clone(), "io", 1, ssd)
            .await
            .unwrap();
        let late = cluster.add_node("cpu=4,ssd=1");
        let nodes = lb.resize(2).await.unwrap();
        assert_eq!(nodes.len(), 2);
        assert!(nodes.contains(&late));
        assert!(lb.resize(0).await.is_err());
    }

    #[test]
    fn plans_fill_the_least_utilised_node_first() {
        let load = |node, used, total| NodeLoad {
            node: NodeId(node),
            used: units(used),
            total: units(total),
        };
        // 1/4 = 25%, 1/2 = 50%, 0/2 = 0%.
        let loads = [load(1, 1, 4), load(2, 1, 2), load(3, 0, 2)];
        let plan = plan_least_utilised(&loads, units(1), 5);
        // n3 (0%) -> n3 50%; n1 25% -> n1 50%; ties at 50% by id: n1 -> 75%, then n2 (50%),
        // then n3 (50%).
        let ids: Vec<u64> = plan.iter().map(|n| n.0).collect();
        assert_eq!(ids, vec![3, 1, 1, 2, 3]);
        // A demand that fits nowhere goes to the least utilised node, where it waits.
        assert_eq!(plan_least_utilised(&loads, units(5), 1), vec![NodeId(3)]);
        assert!(plan_least_utilised(&[], units(1), 3).is_empty());
    }

    /// Every task lands on a node whose utilisation was minimal among those that fit.
    #[tokio::test]
    async fn each_task_goes_to_a_least_utilised_node() {
        let mut rng = Rng::new(5);
        for round in 0..30 {
            let cluster = InMemoryCluster::new(Mode::Manual);
            let sizes = [2, 4, 8];
            for _ in 0..rng.range(2, 5) {
                cluster.add_node(&format!("cpu={}", sizes[rng.below(3)]));
            }
            let mut lb = LeastLoaded::new(cluster.clone(), "cpu").unwrap();
            for _ in 0..rng.range(3, 12) {
                if rng.chance(30) {
                    let running = cluster.running();
                    if !running.is_empty() {
                        cluster.finish(running[rng.below(running.len())].0, true);
                    }
                }
                let demand = units(rng.range(1, 2));
                let before = NodeLoad::of(&cluster.cluster_status().await.unwrap(), "cpu");
                let spec = lb.spec_for(&demand).await.unwrap();
                let cpu = format!("cpu={demand}");
                let id = cluster.submit(vec![task(&cpu, &spec)]).await.unwrap()[0];
                let fitting: Vec<&NodeLoad> = before.iter().filter(|l| l.fits(demand)).collect();
                let Some(node) = cluster.node_of(id) else {
                    assert!(
                        fitting.is_empty(),
                        "round {round}: waits only if nothing fits"
                    );
                    continue;
                };
                let chosen = before.iter().find(|l| l.node == node).unwrap();
                for other in fitting {
                    assert_ne!(
                        other.cmp_utilisation(chosen),
                        Ordering::Less,
                        "round {round}: {other:?} was less utilised than {chosen:?}"
                    );
                }
            }
            lb.dissolve().await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_batch_accounts_for_itself() {
        let cluster = InMemoryCluster::new(Mode::Manual);
        let nodes: Vec<NodeId> = (0..3).map(|_| cluster.add_node("cpu=4")).collect();
        let mut lb = LeastLoaded::new(cluster.clone(), "cpu").unwrap();
        let specs = lb.place(6, Amount::ONE).await.unwrap();
        let tasks = specs.iter().map(|s| task("cpu=1", s)).collect();
        let ids = cluster.submit(tasks).await.unwrap();
        let mut per_node: BTreeMap<NodeId, usize> = BTreeMap::new();
        for id in ids {
            *per_node.entry(cluster.node_of(id).unwrap()).or_default() += 1;
        }
        assert_eq!(
            per_node.into_iter().collect::<Vec<_>>(),
            nodes.iter().map(|n| (*n, 2)).collect::<Vec<_>>()
        );
        let missing = LeastLoaded::new(cluster.clone(), "gpu")
            .unwrap()
            .next_spec(Amount::ONE)
            .await;
        assert!(matches!(missing, Err(EslError::Missing(_))));
    }
}
