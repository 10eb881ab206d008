//! [`Policy`]: the one small trait every scheduling library implements, and the few helpers
//! the policies share (naming ephemeral resources, "every node", waiting for tasks to start).
//!
//! A policy answers one question, the thesis' ESL workflow (§4.3.1, Fig. 4.3): *what resource
//! specification places this task the way the policy wants?* Static policies answer from
//! their own state (affinity, DAG signals, queues, locks); dynamic ones read
//! `get_cluster_status` and may call `set_resource` first (load balancing, bin packing). The
//! application attaches the answer to its task ([`ResourceSpec::apply`]) and submits it;
//! answers of several policies compose with [`ResourceSpec::and`] (AND is concatenation,
//! §4.4.2).

use std::future::Future;
use std::time::Duration;

use escher_proto::types::{
    CapacityOp, ClusterStatus, NodeId, NodeSpec, ResourceName, ResourceSet, ResourceUpdate, TaskId,
    TaskState, TaskStatus,
};

use crate::{ClusterApi, EslError, ResourceSpec};

/// A scheduling policy: for each task it places, the requirements and signals to attach.
///
/// Every policy of this crate holds the cluster it manages (`C: ClusterApi`, cheap to clone)
/// and also offers inherent methods with the names its domain uses (`leader`, `member`,
/// `release`, ...); this trait is what they have in common, for code that takes "some policy".
pub trait Policy: Send {
    /// What tells this policy's tasks apart: `()` when they are all alike, a member index, a
    /// data id, a DAG task's name, a task's demand.
    type Key: ?Sized + Sync;

    /// The spec that places the task identified by `key` under this policy.
    fn spec_for(
        &mut self,
        key: &Self::Key,
    ) -> impl Future<Output = Result<ResourceSpec, EslError>> + Send;
}

/// A resource name built from a policy prefix and user-given parts (`aa-<group>-<i>`), checked.
pub(crate) fn er_name(parts: &[&str]) -> Result<ResourceName, EslError> {
    Ok(ResourceName::new(&parts.join("-"))?)
}

/// `NodeSpec::Match` with no requirement: every live node, as the head resolves it now.
pub(crate) fn every_node() -> NodeSpec {
    NodeSpec::Match {
        resources: ResourceSet::new(),
        num_nodes: None,
    }
}

/// The nodes a policy's per-node resource lives on (its slots, permits, queue capacity).
///
/// A domain is read from `get_cluster_status` each time it is used, so nodes that joined are
/// included and nodes that died are not. Unlike `NodeSpec::Match`, which selects nodes whose
/// resources are *available* now, [`Domain::Having`] selects the nodes that *have* them (a
/// node whose GPU is busy is still a GPU node).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Domain {
    /// Every live node.
    #[default]
    All,
    /// The live nodes whose total resources contain this set.
    Having(ResourceSet),
    /// These nodes, those of them that are alive. One node makes a per-node count a
    /// cluster-wide one (and pins the policy's tasks to it).
    Nodes(Vec<NodeId>),
}

impl Domain {
    /// One node.
    pub fn node(node: NodeId) -> Domain {
        Domain::Nodes(vec![node])
    }

    /// The live nodes of this domain, in id order.
    pub fn resolve(&self, status: &ClusterStatus) -> Vec<NodeId> {
        let mut nodes: Vec<NodeId> = status
            .nodes
            .iter()
            .filter(|n| n.alive)
            .filter(|n| match self {
                Domain::All => true,
                Domain::Having(set) => set.iter().all(|(name, amount)| {
                    n.resource(name.as_str())
                        .is_some_and(|r| r.total.could_hold(amount))
                }),
                Domain::Nodes(ids) => ids.contains(&n.id),
            })
            .map(|n| n.id)
            .collect();
        nodes.sort_unstable();
        nodes
    }
}

impl std::fmt::Display for Domain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Domain::All => f.write_str("every live node"),
            Domain::Having(set) => write!(f, "the live nodes with {{{set}}}"),
            Domain::Nodes(ids) => write!(f, "nodes {ids:?}"),
        }
    }
}

/// Applies `op` to `name` on every node of `domain`, all or none, in one batch. The domain
/// is read from `get_cluster_status` first; if the batch is refused (a node left between the
/// two calls), it is read again and the batch sent once more. The nodes changed.
pub(crate) async fn apply_on_domain<C: ClusterApi>(
    cluster: &C,
    domain: &Domain,
    name: &ResourceName,
    op: CapacityOp,
) -> Result<Vec<NodeId>, EslError> {
    let mut last = None;
    for _attempt in 0..2 {
        let nodes = domain.resolve(&cluster.cluster_status().await?);
        let updates: Vec<ResourceUpdate> = nodes
            .iter()
            .map(|n| ResourceUpdate {
                name: name.clone(),
                op,
                target: NodeSpec::Node(*n),
            })
            .collect();
        if updates.is_empty() {
            return Ok(nodes);
        }
        match cluster.set_resources(updates).await {
            Ok(_) => return Ok(nodes),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| EslError::Missing(name.clone())))
}

/// Whether a task has been placed: running now, or already finished.
pub(crate) fn has_started(status: &TaskStatus) -> bool {
    status.state != TaskState::Pending
}

/// Waits until every task in `tasks` has left `Pending` (it runs, or it ended), polling the
/// cluster with a growing interval; their statuses. An ESL outside the cluster has no
/// "task started" event (the thesis' soft-constraints ESL uses a heartbeat for the same
/// reason, §4.4.2), so it polls.
pub(crate) async fn wait_started<C: ClusterApi>(
    cluster: &C,
    tasks: &[TaskId],
    what: &str,
    timeout: Duration,
) -> Result<Vec<TaskStatus>, EslError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(2);
    loop {
        let mut statuses = Vec::with_capacity(tasks.len());
        for task in tasks {
            statuses.push(cluster.status(*task).await?);
        }
        if statuses.iter().all(has_started) {
            return Ok(statuses);
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Err(EslError::Timeout {
                what: what.to_string(),
                after: timeout,
            });
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Helpers for the policies' unit tests: a seeded RNG (no `rand` in the workspace) and a
    //! task builder.

    use escher_client::Task;
    use escher_proto::types::TaskSpec;

    use crate::ResourceSpec;

    /// SplitMix64: small, seeded, good enough to shuffle test scenarios.
    #[derive(Debug, Clone)]
    pub(crate) struct Rng(u64);

    impl Rng {
        pub(crate) fn new(seed: u64) -> Rng {
            Rng(seed)
        }

        pub(crate) fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        /// Uniform in `lo..=hi`.
        pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
            lo + self.next_u64() % (hi - lo + 1)
        }

        pub(crate) fn below(&mut self, n: usize) -> usize {
            (self.next_u64() % n as u64) as usize
        }

        pub(crate) fn chance(&mut self, percent: u64) -> bool {
            self.next_u64() % 100 < percent
        }

        pub(crate) fn shuffle<T>(&mut self, items: &mut [T]) {
            for i in (1..items.len()).rev() {
                let j = self.below(i + 1);
                items.swap(i, j);
            }
        }
    }

    /// A function task with these physical resources and this policy spec.
    pub(crate) fn task(resources: &str, spec: &ResourceSpec) -> TaskSpec {
        spec.apply(Task::function("work", Vec::new()).resources_str(resources))
            .build()
            .expect("a valid test task")
    }
}
