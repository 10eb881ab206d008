//! Objective functions through soft constraints: the α/β `obj` construction of thesis
//! §4.4.2 ("Soft constraints with ESCHER", "Objective functions"), balancing CPU and memory
//! utilisation.
//!
//! **Goal.** Balance the weighted utilisation `γ_n = α·M_n + β·C_n` of the nodes (memory and
//! CPU utilisation in `[0, 1]`; the thesis phrases it as an extremum of `γ_n` over nodes): place
//! each task on the node where `γ_n` is lowest.
//!
//! **Construction (thesis).** Every node gets `obj` with capacity `α + β` (one
//! `set_resource(.., Match)` on all nodes). A task with memory `m` and CPU `n`, normalised to
//! the node capacity ([`NodeShape`]), has weight `γ = α·m + β·n` and the soft list
//! `[{obj: γ}, {obj: γ/2}, …, {obj: γ/2^k}]` on top of its hard `{memory: m, cpu: n}`
//! ([`Objective::preferences`]). Since every task holds its own γ, `obj` in use on a node is
//! that node's weighted utilisation, and `obj` available its headroom; admission control on
//! `obj`, `cpu` and `memory` means no node is ever over-allocated.
//!
//! **What the list alone does not do, and what we add.** On identical nodes, `{obj: γ}` fits
//! on every node where the hard requirements fit (`α(1-M)+β(1-C) ≥ αm+βn` whenever
//! `m ≤ 1-M` and `n ≤ 1-C`), so the list by itself never steers: the scheduler's choice
//! among eligible nodes is arbitrary, not "the least utilised". The halved levels only matter
//! when `obj` runs short of the hard resources (γ rounds up here, and nodes may differ from
//! the reference shape). So [`Objective::place`] reads the headroom that `obj` keeps, picks
//! the eligible node with the most `obj` available (ties: the lower id) and puts
//! `{obj: γ, obj-node-<id>: 1}` (a targeted-placement marker, unbounded, created on first use
//! and left for later tasks) in front of the thesis' list, submitted with
//! [`Method::FitsNowFirst`]. At decision time the task lands on
//! the least-utilised node exactly, within the thesis' factor of 2 a fortiori; if that node
//! fills first, the thesis' list takes over.
//!
//! **Limits.** The choice reads a snapshot (thesis §4.7: no atomic check-and-reserve):
//! concurrent placements may pick the same node. Only tasks placed through the objective hold
//! `obj`; other work on a node is invisible to it.

use std::time::Duration;

use escher_proto::types::{
    Amount, Capacity, ClusterStatus, NodeId, NodeSpec, ResourceName, ResourceSet, TaskSpec,
};

use crate::soft::{Method, Placement, SoftConstraints, fitting_node};
use crate::target::Targets;
use crate::{ClusterApi, EslError, ResourceSpec};

/// The capacity that demands are normalised to (the thesis assumes identical nodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeShape {
    /// CPUs of a node.
    pub cpu: Amount,
    /// Memory of a node (MiB).
    pub memory: Amount,
}

/// The α/β objective over a cluster.
#[derive(Debug, Clone)]
pub struct Objective<C> {
    cluster: C,
    obj: ResourceName,
    alpha: Amount,
    beta: Amount,
    shape: NodeShape,
    levels: u32,
    soft: SoftConstraints<C>,
    targets: Targets,
}

impl<C: ClusterApi> Objective<C> {
    /// Sets `obj` (named `name`) to `alpha + beta` on every live node, for demands normalised
    /// to `shape`; each placement waits up to `timeout` for a preference to start.
    pub async fn install(
        cluster: C,
        name: &str,
        (alpha, beta): (Amount, Amount),
        shape: NodeShape,
        timeout: Duration,
    ) -> Result<Objective<C>, EslError> {
        if shape.cpu.is_zero() || shape.memory.is_zero() {
            return Err(EslError::Unsatisfiable(
                "the node shape needs non-zero cpu and memory".into(),
            ));
        }
        let obj = ResourceName::new(name)?;
        let every = NodeSpec::Match {
            resources: ResourceSet::new(),
            num_nodes: None,
        };
        let capacity = Capacity::Finite(alpha.checked_add(beta)?);
        cluster.set_resource(obj.clone(), capacity, every).await?;
        Ok(Objective {
            soft: SoftConstraints::new(cluster.clone(), timeout).method(Method::FitsNowFirst),
            targets: Targets::new(&format!("{name}-node")),
            cluster,
            obj,
            alpha,
            beta,
            shape,
            levels: 3,
        })
    }

    /// The same objective with `k` halvings in the soft list (3 by default).
    pub fn levels(mut self, k: u32) -> Objective<C> {
        self.levels = k.min(32);
        self
    }

    /// γ = α·m/M + β·n/C for memory `m` and CPU `n` on nodes of memory `M` and CPU `C`,
    /// rounded up to the next 1/10,000 (integer arithmetic, no floats).
    pub fn gamma(&self, cpu: Amount, memory: Amount) -> Amount {
        let part = |weight: Amount, used: Amount, total: Amount| {
            let num = u128::from(weight.raw()) * u128::from(used.raw());
            num.div_ceil(u128::from(total.raw()))
        };
        let raw =
            part(self.alpha, memory, self.shape.memory) + part(self.beta, cpu, self.shape.cpu);
        Amount::from_raw(u64::try_from(raw).unwrap_or(u64::MAX)).unwrap_or(Amount::MAX)
    }

    /// The thesis' soft list for a task with this CPU and memory:
    /// `[{obj: γ}, {obj: γ/2}, …, {obj: γ/2^k}]` (the hard requirements stay on the task).
    pub fn preferences(&self, cpu: Amount, memory: Amount) -> Vec<ResourceSpec> {
        let gamma = self.gamma(cpu, memory).raw();
        (0..=self.levels)
            .filter_map(|j| {
                let amount = Amount::from_raw(gamma >> j).ok()?;
                ResourceSpec::new().require(self.obj.clone(), amount).ok()
            })
            .collect()
    }

    /// Submits `task` (whose `cpu` and `memory` requirements are its demand) on the node with
    /// the most `obj` headroom where it fits, falling back to the thesis' soft list.
    /// [`Placement::choice`] 0 is that node when one fits now; otherwise the list starts at 0.
    pub async fn place(&self, task: &TaskSpec) -> Result<Placement, EslError> {
        let (cpu, memory) = (task.resources.get("cpu"), task.resources.get("memory"));
        let gamma = self.gamma(cpu, memory);
        let mut preferences = Vec::new();
        let status = self.cluster.cluster_status().await?;
        if let Some(node) = self.roomiest(&status, task, gamma) {
            let pin = self.targets.pin(&self.cluster, &[node]).await?;
            preferences.push(pin[0].clone().require(self.obj.clone(), gamma)?);
        }
        preferences.extend(self.preferences(cpu, memory));
        self.soft.submit(task, &preferences).await
    }

    /// The live node with the most `obj` available among those where the task and γ fit now.
    fn roomiest(&self, status: &ClusterStatus, task: &TaskSpec, gamma: Amount) -> Option<NodeId> {
        let mut needs = task.resources.clone();
        let mut obj = ResourceSet::new();
        obj.insert(self.obj.clone(), gamma);
        needs.merge(&obj).ok()?;
        status
            .nodes
            .iter()
            .filter(|n| {
                let one = ClusterStatus {
                    nodes: vec![(*n).clone()],
                    ..ClusterStatus::default()
                };
                fitting_node(&one, &needs).is_some()
            })
            .filter_map(|n| {
                let room = n.resource(self.obj.as_str())?.available()?;
                Some((room, std::cmp::Reverse(n.id), n.id))
            })
            .max()
            .map(|(_, _, id)| id)
    }
}

#[cfg(test)]
mod tests {
    use escher_proto::types::{TaskId, TaskState};

    use super::*;
    use crate::{InMemoryCluster, Mode};

    fn units(n: u64) -> Amount {
        Amount::units(n).unwrap()
    }

    async fn setup() -> (InMemoryCluster, Objective<InMemoryCluster>) {
        let cluster = InMemoryCluster::new(Mode::Manual);
        for _ in 0..3 {
            cluster.add_node("cpu=4,memory=4096");
        }
        let shape = NodeShape {
            cpu: units(4),
            memory: units(4096),
        };
        let objective = Objective::install(
            cluster.clone(),
            "obj",
            (units(1), units(1)),
            shape,
            Duration::from_millis(100),
        )
        .await
        .unwrap();
        (cluster, objective)
    }

    fn task(cpu: u64, memory: u64) -> TaskSpec {
        escher_client::Task::function("work", Vec::new())
            .resources_str(&format!("cpu={cpu},memory={memory}"))
            .build()
            .unwrap()
    }

    /// Weighted headroom `α(1-M) + β(1-C)` of every node, in raw 1/10,000 units (α = β = 1).
    fn headroom(status: &ClusterStatus) -> Vec<(NodeId, u128, Amount, Amount)> {
        status
            .nodes
            .iter()
            .map(|n| {
                let free = |r: &str| {
                    n.resource(r)
                        .and_then(|s| s.available())
                        .unwrap_or_default()
                };
                let (cpu, mem) = (free("cpu"), free("memory"));
                let h = u128::from(mem.raw()) * 10_000 / u128::from(units(4096).raw())
                    + u128::from(cpu.raw()) * 10_000 / u128::from(units(4).raw());
                (n.id, h, cpu, mem)
            })
            .collect()
    }

    fn assert_not_over_allocated(status: &ClusterStatus) {
        for n in &status.nodes {
            for r in &n.resources {
                assert!(
                    r.shortfall().is_zero(),
                    "{} over-allocated on node {}: {r:?}",
                    r.name,
                    n.id
                );
            }
        }
    }

    #[test]
    fn the_soft_list_halves_gamma() {
        let cluster = InMemoryCluster::new(Mode::Manual);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let objective = rt.block_on(Objective::install(
            cluster,
            "obj",
            (units(1), units(3)),
            NodeShape {
                cpu: units(4),
                memory: units(4096),
            },
            Duration::from_millis(1),
        ));
        let objective = objective.unwrap();
        // γ = 1 · 1024/4096 + 3 · 1/4 = 1.
        assert_eq!(objective.gamma(units(1), units(1024)), units(1));
        let list: Vec<String> = objective
            .preferences(units(1), units(1024))
            .iter()
            .map(|p| p.resources.to_string())
            .collect();
        assert_eq!(list, ["obj=1", "obj=0.5", "obj=0.25", "obj=0.125"]);
    }

    #[tokio::test(start_paused = true)]
    async fn tasks_land_on_the_least_utilised_node_and_none_is_over_allocated() {
        let (cluster, objective) = setup().await;
        let demands = [
            (1, 512),
            (2, 1024),
            (1, 2048),
            (3, 256),
            (1, 1024),
            (2, 2048),
            (1, 512),
            (1, 256),
            (2, 512),
            (1, 3072),
            (1, 128),
            (2, 256),
        ];
        let mut running: Vec<TaskId> = Vec::new();
        for (k, (cpu, memory)) in demands.into_iter().enumerate() {
            let fits = |h: &[(NodeId, u128, Amount, Amount)]| {
                h.iter()
                    .filter(|(_, _, c, m)| *c >= units(cpu) && *m >= units(memory))
                    .map(|e| e.1)
                    .max()
            };
            let mut before = headroom(&cluster.cluster_status().await.unwrap());
            while fits(&before).is_none() {
                // Make room: the oldest task finishes.
                cluster.finish(running.remove(0), true);
                before = headroom(&cluster.cluster_status().await.unwrap());
            }
            let best = fits(&before).unwrap();
            let placed = objective.place(&task(cpu, memory)).await.unwrap();
            assert!(placed.started && placed.abandoned.is_empty(), "{placed:?}");
            let node = cluster.node_of(placed.task).unwrap();
            let got = before.iter().find(|e| e.0 == node).unwrap().1;
            assert!(
                2 * got >= best,
                "task {k} went to node {node} with headroom {got}, best {best}"
            );
            let status = cluster.cluster_status().await.unwrap();
            assert_not_over_allocated(&status);
            running.push(placed.task);
            if k % 3 == 2 {
                cluster.finish(running.remove(0), true);
            }
        }
        // `obj` in use on each node is the weighted utilisation of what runs there.
        let status = cluster.cluster_status().await.unwrap();
        for node in &status.nodes {
            let used = node.resource("obj").unwrap().used.raw();
            let cpu = node.resource("cpu").unwrap().used;
            let mem = node.resource("memory").unwrap().used;
            let expect = objective.gamma(cpu, mem).raw();
            assert!(
                used.abs_diff(expect) <= running.len() as u64,
                "node {}: {used} vs {expect}",
                node.id
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn when_obj_runs_short_the_halved_levels_take_over() {
        let (cluster, objective) = setup().await;
        // Shrink `obj` below one task's γ = 0.5 on every node: the hard requirements fit, obj
        // does not, so the task gets the first halved level that does (γ/2 = 0.25).
        let every = NodeSpec::Match {
            resources: ResourceSet::new(),
            num_nodes: None,
        };
        let short = Capacity::Finite("0.3".parse().unwrap());
        cluster
            .set_resource(ResourceName::new("obj").unwrap(), short, every)
            .await
            .unwrap();
        let placed = objective.place(&task(1, 1024)).await.unwrap();
        assert_eq!(placed.choice, 1, "{placed:?}");
        assert_eq!(
            cluster.status(placed.task).await.unwrap().state,
            TaskState::Running
        );
        let status = cluster.cluster_status().await.unwrap();
        let node = status.node(cluster.node_of(placed.task).unwrap()).unwrap();
        assert_eq!(node.resource("obj").unwrap().used.to_string(), "0.25");
        assert_not_over_allocated(&status);
    }
}
