//! Queues (primitive P3): the application decides when queued tasks may start.
//!
//! **Policy.** A [`Queue`] holds its tasks back until the application opens slots for them:
//! [`release(k)`](Queue::release) lets `k` more run (batch release),
//! [`drain_to(k)`](Queue::drain_to) sets how many may run, with no background thread in the
//! ESL. Over several queues,
//! [`FairQueues`] splits a total among queues in proportion to weights (weighted fair
//! queueing, recomputed from the backlogs whenever the application calls
//! [`rebalance`](FairQueues::rebalance)), and [`PriorityQueues`] gives it all to the highest
//! queue that has work (strict priority).
//!
//! **Construction (thesis §4.4.1 P3).** "Creating a queue is simply creating a unique
//! ephemeral resource `E_q` with initial capacity 0 ... The queue drain rate can be set by
//! changing the capacity of `E_q` ... batched scheduling by incrementing the capacity of
//! `E_q` by the desired batch size." Here `E_q` is `q-<name>` on each node of a [`Domain`];
//! a queued task requests `q-<name>: 1` ([`Queue::spec`]). Capacity 0 is no resource at all,
//! so a new queue's tasks wait, pending with the reason "no node has `q-<name>`". The thesis
//! wraps each task in a wrapper that holds `E_q` only while it submits the real task; here
//! the task itself holds its unit while it runs, so no wrapper process is needed and the
//! capacity is exactly *how many of the queue's tasks run at once* per node: the drain rate
//! in tasks per task-duration. Fair shares and priorities are pure functions
//! ([`weighted_fair_shares`], [`strict_priority`]) applied with `drain_to`, lowering
//! capacities before raising any, so that the total is never exceeded even in between.
//!
//! **Needs from the cluster.** `set_resource` (absolute and relative), `get_cluster_status`
//! (the domain and current capacities), task status (backlogs).
//!
//! **Limits.** Capacities are per node: on `Domain::All` with three nodes, `drain_to(2)`
//! lets six tasks run. A queue on one node (`Domain::node(id)`) has cluster-wide counts but
//! runs its tasks on that node; the ER API has no cluster-wide counter (a resource lives on a
//! node), so a cluster-wide queue whose tasks run anywhere needs the thesis' wrapper tasks.
//! Lowering a capacity below what runs stops admissions but preempts nothing. Backlogs count
//! only the tasks submitted through [`Queue::submit`] or [`Queue::track`]. `release` adds to
//! the nodes of the domain *now*: a node that joins later has only what later calls give it
//! (`drain_to` sets every node alike).

mod fair;

pub use fair::{FairQueues, PriorityQueues, strict_priority, weighted_fair_shares};

use std::collections::BTreeMap;

use escher_client::Task;
use escher_proto::types::{
    Amount, Capacity, CapacityOp, Delta, NodeId, NodeSpec, ResourceName, ResourceUpdate, TaskId,
    TaskState,
};

use crate::policy::{Domain, Policy, apply_on_domain, er_name, every_node};
use crate::{ClusterApi, EslError, ResourceSpec};

/// How many of a queue's tracked tasks wait and run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Submitted, not started.
    pub pending: u64,
    /// Running (holding a slot).
    pub running: u64,
}

impl Backlog {
    /// Tasks that want a slot: pending and running.
    pub fn demand(&self) -> u64 {
        self.pending + self.running
    }
}

/// A queue of tasks released by the application.
#[derive(Debug)]
pub struct Queue<C> {
    cluster: C,
    slots: ResourceName,
    domain: Domain,
    tracked: Vec<TaskId>,
}

impl<C: ClusterApi> Queue<C> {
    /// A new, closed queue `q-<name>` over the nodes of `domain` (a leftover capacity from an
    /// earlier queue of the same name is removed).
    pub async fn create(cluster: C, name: &str, domain: Domain) -> Result<Queue<C>, EslError> {
        let slots = er_name(&["q", name])?;
        cluster.delete_resource(slots.clone(), every_node()).await?;
        Ok(Queue {
            cluster,
            slots,
            domain,
            tracked: Vec::new(),
        })
    }

    /// The queue's resource, `q-<name>`.
    pub fn resource(&self) -> &ResourceName {
        &self.slots
    }

    /// A queued task's spec: one slot while it runs.
    pub fn spec(&self) -> ResourceSpec {
        ResourceSpec::new()
            .require(self.slots.clone(), Amount::ONE)
            .expect("one unit of a single resource cannot overflow")
    }

    /// Enqueues a task (adds the spec, submits it, and counts it in the backlog).
    pub async fn submit(&mut self, task: Task) -> Result<TaskId, EslError> {
        let spec = self.spec().apply(task).build()?;
        let id = self.cluster.submit(vec![spec]).await?[0];
        self.tracked.push(id);
        Ok(id)
    }

    /// Counts a task submitted elsewhere with [`spec`](Self::spec) in the backlog.
    pub fn track(&mut self, task: TaskId) {
        self.tracked.push(task);
    }

    /// Opens `k` more slots on every node of the domain (a batch of `k`).
    pub async fn release(&self, k: u64) -> Result<Vec<NodeId>, EslError> {
        if k == 0 {
            return Ok(Vec::new());
        }
        let add = CapacityOp::Adjust(Delta::increase(Amount::units(k)?));
        apply_on_domain(&self.cluster, &self.domain, &self.slots, add).await
    }

    /// Sets the slots on every node of the domain to `k` (0 closes the queue; running tasks
    /// go on).
    pub async fn drain_to(&self, k: u64) -> Result<Vec<NodeId>, EslError> {
        let set = CapacityOp::Set(Capacity::Finite(Amount::units(k)?));
        apply_on_domain(&self.cluster, &self.domain, &self.slots, set).await
    }

    /// Closes the queue: no new task starts until slots are opened again.
    pub async fn close(&self) -> Result<(), EslError> {
        self.cluster
            .delete_resource(self.slots.clone(), every_node())
            .await?;
        Ok(())
    }

    /// The slots on each node that has any.
    pub async fn capacity(&self) -> Result<BTreeMap<NodeId, Capacity>, EslError> {
        let status = self.cluster.cluster_status().await?;
        Ok(status
            .nodes
            .iter()
            .filter_map(|n| Some((n.id, n.resource(self.slots.as_str())?.total)))
            .collect())
    }

    /// How many tracked tasks wait and run (finished ones are forgotten).
    pub async fn backlog(&mut self) -> Result<Backlog, EslError> {
        let mut backlog = Backlog::default();
        let mut live = Vec::with_capacity(self.tracked.len());
        for id in &self.tracked {
            match self.cluster.status(*id).await?.state {
                TaskState::Pending => backlog.pending += 1,
                TaskState::Running => backlog.running += 1,
                _ => continue,
            }
            live.push(*id);
        }
        self.tracked = live;
        Ok(backlog)
    }

    /// The updates that set this queue to `k` per node of its domain, split into those that
    /// lower a capacity and those that raise one.
    async fn retarget(
        &self,
        k: u64,
    ) -> Result<(Vec<ResourceUpdate>, Vec<ResourceUpdate>), EslError> {
        let status = self.cluster.cluster_status().await?;
        let target = Amount::units(k)?;
        let (mut lower, mut raise) = (Vec::new(), Vec::new());
        for node in self.domain.resolve(&status) {
            let now = status
                .node(node)
                .and_then(|n| n.resource(self.slots.as_str()))
                .map_or(Capacity::Finite(Amount::ZERO), |r| r.total);
            let update = ResourceUpdate {
                name: self.slots.clone(),
                op: CapacityOp::Set(Capacity::Finite(target)),
                target: NodeSpec::Node(node),
            };
            match now {
                Capacity::Finite(a) if a == target => {}
                Capacity::Finite(a) if a < target => raise.push(update),
                _ => lower.push(update),
            }
        }
        Ok((lower, raise))
    }
}

impl<C: ClusterApi> Policy for Queue<C> {
    type Key = ();

    async fn spec_for(&mut self, _key: &()) -> Result<ResourceSpec, EslError> {
        Ok(self.spec())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::policy::testing::Rng;
    use crate::{InMemoryCluster, Mode};

    fn work() -> Task {
        Task::function("work", Vec::new()).resources_str("cpu=1")
    }

    /// Whatever the sequence of submissions, releases, drains and completions, no node ever
    /// runs more of the queue's tasks than its slots, and slots never stay idle while tasks
    /// wait.
    #[tokio::test]
    async fn a_queue_never_runs_more_than_its_slots() {
        let mut rng = Rng::new(2024);
        for round in 0..40 {
            let cluster = InMemoryCluster::new(Mode::Manual);
            let nodes: Vec<NodeId> = (0..rng.range(1, 3))
                .map(|_| cluster.add_node("cpu=64"))
                .collect();
            let domain = if rng.chance(50) {
                Domain::node(nodes[rng.below(nodes.len())])
            } else {
                Domain::All
            };
            let in_domain = domain.resolve(&cluster.cluster_status().await.unwrap());
            let mut queue = Queue::create(cluster.clone(), &format!("r{round}"), domain)
                .await
                .unwrap();
            let mut ours = BTreeSet::new();
            // The model: slots per node of the domain.
            let mut slots: u64 = 0;
            let mut seen = 0;
            for _step in 0..60 {
                match rng.below(5) {
                    0 | 1 => {
                        ours.insert(queue.submit(work()).await.unwrap());
                    }
                    2 => {
                        let k = rng.range(0, 2);
                        queue.release(k).await.unwrap();
                        slots += k;
                    }
                    3 => {
                        let k = rng.range(0, 3);
                        queue.drain_to(k).await.unwrap();
                        slots = k;
                    }
                    _ => {
                        let running = cluster.running();
                        if !running.is_empty() {
                            cluster.finish(running[rng.below(running.len())].0, true);
                        }
                    }
                }
                let mut per_node: BTreeMap<NodeId, u64> = BTreeMap::new();
                for (t, n) in cluster.running() {
                    assert!(ours.contains(&t));
                    assert!(in_domain.contains(&n), "round {round}: outside the domain");
                    *per_node.entry(n).or_default() += 1;
                }
                // Holders beyond a lowered capacity keep running, so check admissions: a
                // node that admitted a task in this step is within its slots afterwards.
                let dispatches = cluster.dispatches();
                for (_, n) in &dispatches[seen..] {
                    assert!(
                        per_node[n] <= slots,
                        "round {round}: {per_node:?} > {slots}"
                    );
                }
                seen = dispatches.len();
                let backlog = queue.backlog().await.unwrap();
                if backlog.pending > 0 {
                    for n in &in_domain {
                        let running = per_node.get(n).copied().unwrap_or(0);
                        assert!(
                            running >= slots,
                            "round {round}: idle slots while tasks wait"
                        );
                    }
                }
                let capacity = queue.capacity().await.unwrap();
                for (n, c) in capacity {
                    assert_eq!(
                        c,
                        Capacity::Finite(Amount::units(slots).unwrap()),
                        "node {n:?}"
                    );
                }
            }
        }
    }

    /// Releases admit exactly as many as they open, and running holders keep their slot.
    #[tokio::test]
    async fn batch_release_admits_exactly_the_batch() {
        let cluster = InMemoryCluster::new(Mode::Manual);
        let node = cluster.add_node("cpu=64");
        let mut queue = Queue::create(cluster.clone(), "jobs", Domain::node(node))
            .await
            .unwrap();
        for _ in 0..10 {
            queue.submit(work()).await.unwrap();
        }
        let pending = queue.backlog().await.unwrap();
        assert_eq!(
            pending,
            Backlog {
                pending: 10,
                running: 0
            }
        );
        let reason = cluster
            .status(queue.tracked[0])
            .await
            .unwrap()
            .reason
            .unwrap();
        assert!(reason.contains("q-jobs"), "{reason}");
        queue.release(3).await.unwrap();
        assert_eq!(
            queue.backlog().await.unwrap(),
            Backlog {
                pending: 7,
                running: 3
            }
        );
        queue.release(2).await.unwrap();
        assert_eq!(cluster.running().len(), 5);
        queue.drain_to(1).await.unwrap();
        for (t, _) in cluster.running().into_iter().take(3) {
            cluster.finish(t, true);
        }
        assert_eq!(
            cluster.running().len(),
            2,
            "lowered: no admission until below 1"
        );
        queue.close().await.unwrap();
        for (t, _) in cluster.running() {
            cluster.finish(t, true);
        }
        assert_eq!(
            queue.backlog().await.unwrap(),
            Backlog {
                pending: 5,
                running: 0
            }
        );
        assert!(queue.capacity().await.unwrap().is_empty());
    }
}
