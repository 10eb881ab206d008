//! [`Semaphore`]: at most `k` of its tasks hold a permit at once (thesis §4.4.1 P2: "Thus,
//! semaphores (and therefore, mutual exclusion) can also be implemented"); a mutex is `k = 1`.
//!
//! The semaphore is the ER `sem-<name>` with capacity `k` on each node of its [`Domain`]; a
//! task requests one permit (or several) and holds them while it runs. Admission control does
//! the rest: the core never allocates past a capacity.
//!
//! **Per node.** Resources live on nodes, so `k` is per node of the domain: with
//! `Domain::All` on three nodes, up to `3k` tasks hold permits at once. A cluster-wide
//! semaphore or mutex is one on a single node (`Domain::node(id)`), which also pins its
//! holders to that node; the ER API has no cluster-wide counter (see the crate report).

use escher_proto::types::{Amount, Capacity, CapacityOp, NodeId, ResourceName};

use crate::policy::{Domain, Policy, apply_on_domain, er_name, every_node};
use crate::{ClusterApi, EslError, ResourceSpec};

/// A counting semaphore (or a mutex) over the nodes of a domain.
#[derive(Debug, Clone)]
pub struct Semaphore<C> {
    cluster: C,
    permits: ResourceName,
    domain: Domain,
}

impl<C: ClusterApi> Semaphore<C> {
    /// Creates `sem-<name>` with `permits` on every node of `domain`.
    pub async fn create(
        cluster: C,
        name: &str,
        permits: u64,
        domain: Domain,
    ) -> Result<Semaphore<C>, EslError> {
        let sem = Semaphore {
            cluster,
            permits: er_name(&["sem", name])?,
            domain,
        };
        sem.resize(permits).await?;
        Ok(sem)
    }

    /// A mutex: one permit per node of `domain`.
    pub async fn mutex(cluster: C, name: &str, domain: Domain) -> Result<Semaphore<C>, EslError> {
        Semaphore::create(cluster, name, 1, domain).await
    }

    /// The permit resource, `sem-<name>`.
    pub fn resource(&self) -> &ResourceName {
        &self.permits
    }

    /// A holder's spec: one permit while it runs.
    pub fn spec(&self) -> ResourceSpec {
        self.spec_n(1).expect("one permit cannot overflow")
    }

    /// A holder's spec for `n` permits at once.
    pub fn spec_n(&self, n: u64) -> Result<ResourceSpec, EslError> {
        ResourceSpec::new().require(self.permits.clone(), Amount::units(n)?)
    }

    /// Sets the permits per node (holders beyond a lowered count keep theirs; nothing new is
    /// admitted until they drop below it). The nodes changed.
    pub async fn resize(&self, permits: u64) -> Result<Vec<NodeId>, EslError> {
        if permits == 0 {
            return Err(EslError::Unsatisfiable(format!(
                "{}: a semaphore with no permits admits nothing; dissolve it instead",
                self.permits
            )));
        }
        let set = CapacityOp::Set(Capacity::Finite(Amount::units(permits)?));
        let nodes = apply_on_domain(&self.cluster, &self.domain, &self.permits, set).await?;
        if nodes.is_empty() {
            return Err(EslError::Unsatisfiable(format!(
                "{}: the domain ({}) has no node",
                self.permits, self.domain
            )));
        }
        Ok(nodes)
    }

    /// Removes the semaphore from every node (holders keep their permits until they end).
    pub async fn dissolve(self) -> Result<(), EslError> {
        self.cluster
            .delete_resource(self.permits.clone(), every_node())
            .await?;
        Ok(())
    }
}

impl<C: ClusterApi> Policy for Semaphore<C> {
    /// How many permits the task holds.
    type Key = u64;

    async fn spec_for(&mut self, permits: &u64) -> Result<ResourceSpec, EslError> {
        self.spec_n(*permits)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use escher_proto::types::TaskId;

    use super::*;
    use crate::policy::testing::{Rng, task};
    use crate::{InMemoryCluster, Mode};

    #[tokio::test]
    async fn holders_never_exceed_the_permits_on_any_node() {
        let mut rng = Rng::new(11);
        for round in 0..40 {
            let cluster = InMemoryCluster::new(Mode::Manual);
            let nodes: Vec<NodeId> = (0..rng.range(1, 4))
                .map(|_| cluster.add_node("cpu=64"))
                .collect();
            let k = rng.range(1, 3);
            let domain = if rng.chance(50) {
                Domain::node(nodes[0])
            } else {
                Domain::All
            };
            let mut sem =
                Semaphore::create(cluster.clone(), &format!("s{round}"), k, domain.clone())
                    .await
                    .unwrap();
            let mut holders: BTreeMap<TaskId, u64> = BTreeMap::new();
            for _ in 0..rng.range(1, 15) {
                let n = rng.range(1, k);
                let spec = sem.spec_for(&n).await.unwrap();
                let id = cluster.submit(vec![task("cpu=1", &spec)]).await.unwrap()[0];
                holders.insert(id, n);
            }
            loop {
                let mut per_node: BTreeMap<NodeId, u64> = BTreeMap::new();
                for (t, node) in cluster.running() {
                    *per_node.entry(node).or_default() += holders[&t];
                }
                assert!(
                    per_node.values().all(|v| *v <= k),
                    "round {round}: {per_node:?}"
                );
                if domain != Domain::All {
                    let used: BTreeSet<_> = per_node.keys().collect();
                    assert!(used.len() <= 1, "a one-node semaphore pins its holders");
                }
                let running = cluster.running();
                if running.is_empty() {
                    break;
                }
                cluster.finish(running[rng.below(running.len())].0, rng.chance(80));
            }
            assert!(
                holders.keys().all(|t| cluster.node_of(*t).is_some()),
                "all ran"
            );
            sem.dissolve().await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_mutex_admits_one_and_a_resize_admits_more() {
        let cluster = InMemoryCluster::new(Mode::Manual);
        let node = cluster.add_node("cpu=8");
        let mutex = Semaphore::mutex(cluster.clone(), "db", Domain::node(node))
            .await
            .unwrap();
        let ids = cluster
            .submit(vec![task("cpu=1", &mutex.spec()); 3])
            .await
            .unwrap();
        assert_eq!(cluster.running().len(), 1);
        mutex.resize(3).await.unwrap();
        assert_eq!(cluster.running().len(), 3);
        assert!(ids.iter().all(|t| cluster.node_of(*t) == Some(node)));
        assert!(mutex.resize(0).await.is_err());
        let empty =
            Semaphore::create(cluster, "none", 1, Domain::Having("gpu=1".parse().unwrap())).await;
        assert!(empty.is_err());
    }
}
