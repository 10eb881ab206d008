//! Resource locking (primitive P4): reserve a bundle of resources on one node, then run tasks
//! inside it.
//!
//! **Policy.** [`Lock::reserve`] takes a bundle (e.g. `cpu=4,memory=8192`) on one node and
//! keeps it until [`Lock::release`]; tasks given [`Lock::spec`] run inside the bundle, on
//! that node, and nothing else can use the bundle's resources meanwhile.
//!
//! **Construction (thesis §4.4.1 P4).** "Ghost tasks — long-running tasks which acquire the
//! bundle like a regular task and create a local ephemeral resource to accommodate new tasks.
//! Ghost tasks create a pattern of indirection where tasks request ephemeral resources instead
//! of physical resources to get scheduled." The ghost requests the bundle (plus a site marker
//! `lock-<name>-site` set on the target node(s), for targeted placement) and creates, on its
//! node, for as long as it lives:
//! - `lock-<name>` with one unit per *slot* (by default the bundle's CPUs), requested by
//!   [`Lock::spec`] (`lock-<name>: 1` and **no** physical resources);
//! - `lock-<name>.<resource>` with the bundle's amount of each resource, requested by
//!   [`Lock::spec_sized`] for tasks that declare what they use of the bundle.
//!
//! Releasing cancels the ghost: its bundle returns to the node and its ERs go (tasks still
//! running inside keep what they hold until they end; waiting ones wait for a new lock).
//!
//! **Needs from the cluster.** Ghost tasks, `set_resource` (the site marker), cancellation,
//! the watch API with task status ([`Lock::wait_ready`] hears the ghost start or end; it
//! does not poll).
//!
//! **Limits.** The bundle is an admission-control reservation: tasks inside it are not
//! confined by the OS to its CPUs (thesis §4.5: Ray does not pin CPUs either; Kubernetes
//! would use cgroups). The ghost is placed like any task: if the bundle fits nowhere, the lock
//! waits (with a reason) until it does, and [`Lock::wait_ready`] times out. A ghost whose node
//! dies ends the lock; the tasks inside were lost with the node.

use std::time::Duration;

use escher_client::Task;
use escher_proto::types::{
    Amount, Capacity, NodeId, NodeSpec, ResourceName, ResourceSet, TaskId, TaskState,
};

use crate::policy::{Policy, er_name, every_node, wait_started};
use crate::{ClusterApi, EslError, ResourceSpec};

/// A bundle of resources reserved by a ghost task.
#[derive(Debug)]
pub struct Lock<C> {
    cluster: C,
    slots: ResourceName,
    site: ResourceName,
    bundle: ResourceSet,
    ghost: TaskId,
    released: bool,
}

impl<C: ClusterApi> Lock<C> {
    /// Reserves `bundle` on a node of `target` (`Node(id)`, or `Match { resources, .. }`: a
    /// node whose available resources contain `resources` now; `Match` on the bundle itself
    /// means "wherever it fits"), with one slot per CPU of the bundle (at least one).
    pub async fn reserve(
        cluster: C,
        name: &str,
        bundle: ResourceSet,
        target: NodeSpec,
    ) -> Result<Lock<C>, EslError> {
        let cpus = bundle.get("cpu");
        let slots = if cpus.is_zero() { Amount::ONE } else { cpus };
        Lock::reserve_slots(cluster, name, bundle, slots, target).await
    }

    /// Like [`reserve`](Self::reserve), with `slots` tasks of [`spec`](Self::spec) at once.
    pub async fn reserve_slots(
        cluster: C,
        name: &str,
        bundle: ResourceSet,
        slots: Amount,
        target: NodeSpec,
    ) -> Result<Lock<C>, EslError> {
        if bundle.is_empty() || slots.is_zero() {
            return Err(EslError::Unsatisfiable(format!(
                "lock {name:?} needs a non-empty bundle and at least one slot"
            )));
        }
        let lock = er_name(&["lock", name])?;
        let site = er_name(&["lock", name, "site"])?;
        if target == NodeSpec::Local {
            return Err(EslError::Unsatisfiable(format!(
                "lock {name:?}: an ESL runs outside the cluster and has no local node; \
                 give a node id or a Match"
            )));
        }
        let nodes = cluster
            .set_resource(site.clone(), Capacity::Unbounded, target.clone())
            .await?;
        if nodes.is_empty() {
            return Err(EslError::Unsatisfiable(format!(
                "lock {name:?}: no live node matches {target:?}"
            )));
        }
        let mut ghost = Task::ghost()
            .name(lock.as_str())
            .resources(bundle.clone())
            .resource(site.clone(), 1)
            .creates(lock.clone(), Capacity::Finite(slots));
        for (resource, amount) in bundle.iter() {
            ghost = ghost.creates(dimension(&lock, resource)?, Capacity::Finite(amount));
        }
        let ghost = cluster.submit(vec![ghost.build()?]).await?[0];
        Ok(Lock {
            cluster,
            slots: lock,
            site,
            bundle,
            ghost,
            released: false,
        })
    }

    /// The slot resource, `lock-<name>`.
    pub fn resource(&self) -> &ResourceName {
        &self.slots
    }

    /// The ghost task holding the bundle.
    pub fn ghost(&self) -> TaskId {
        self.ghost
    }

    /// The bundle.
    pub fn bundle(&self) -> &ResourceSet {
        &self.bundle
    }

    /// Waits until the bundle is held; the node holding it.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<NodeId, EslError> {
        let what = format!("reserving {} ({{{}}})", self.slots, self.bundle);
        let status = wait_started(&self.cluster, &[self.ghost], &what, timeout).await?;
        match (status[0].state, status[0].node) {
            (TaskState::Running, Some(node)) => Ok(node),
            (state, _) => Err(EslError::Unsatisfiable(format!(
                "the ghost of {} is {state}: {}",
                self.slots,
                status[0].reason.clone().unwrap_or_default()
            ))),
        }
    }

    /// A task inside the bundle: one slot, no physical resources of its own.
    pub fn spec(&self) -> ResourceSpec {
        ResourceSpec::new()
            .require(self.slots.clone(), Amount::ONE)
            .expect("one unit of a single resource cannot overflow")
    }

    /// A task inside the bundle that uses `demand` of it: one slot and its share of each of
    /// the bundle's resources.
    pub fn spec_sized(&self, demand: &ResourceSet) -> Result<ResourceSpec, EslError> {
        let mut spec = self.spec();
        for (resource, amount) in demand.iter() {
            let held = self.bundle.get(resource.as_str());
            if amount > held {
                return Err(EslError::Unsatisfiable(format!(
                    "the task wants {resource}={amount} but the bundle of {} holds {held}",
                    self.slots
                )));
            }
            spec = spec.require(dimension(&self.slots, resource)?, amount)?;
        }
        Ok(spec)
    }

    /// Releases the bundle: cancels the ghost and removes the site marker.
    pub async fn release(mut self) -> Result<(), EslError> {
        self.cluster.cancel(vec![self.ghost]).await?;
        self.released = true;
        self.cluster
            .delete_resource(self.site.clone(), every_node())
            .await?;
        Ok(())
    }

    /// Whether [`release`](Self::release) ran.
    pub fn is_released(&self) -> bool {
        self.released
    }
}

/// `lock-<name>.<resource>` (a namespaced resource's `/` becomes `.`).
fn dimension(lock: &ResourceName, resource: &ResourceName) -> Result<ResourceName, EslError> {
    let local = resource.as_str().replace('/', ".");
    Ok(ResourceName::new(&format!("{lock}.{local}"))?)
}

impl<C: ClusterApi> Policy for Lock<C> {
    /// What the task uses of the bundle (empty: one slot).
    type Key = ResourceSet;

    async fn spec_for(&mut self, demand: &ResourceSet) -> Result<ResourceSpec, EslError> {
        if demand.is_empty() {
            Ok(self.spec())
        } else {
            self.spec_sized(demand)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::policy::testing::{Counting, Rng, task};
    use crate::{InMemoryCluster, Mode};

    const WAIT: Duration = Duration::from_secs(5);

    fn set(text: &str) -> ResourceSet {
        text.parse().unwrap()
    }

    #[tokio::test]
    async fn locked_tasks_run_inside_the_bundle_and_nothing_else_gets_its_cpus() {
        let cluster = InMemoryCluster::new(Mode::Manual);
        let a = cluster.add_node("cpu=4");
        let b = cluster.add_node("cpu=2");
        let lock = Lock::reserve(cluster.clone(), "train", set("cpu=4"), NodeSpec::Node(a))
            .await
            .unwrap();
        assert_eq!(lock.wait_ready(WAIT).await.unwrap(), a);
        let plain = cluster
            .submit(vec![task("cpu=1", &ResourceSpec::new()); 3])
            .await
            .unwrap();
        let inside = cluster
            .submit(vec![task("", &lock.spec()); 6])
            .await
            .unwrap();
        let on = |node| {
            let running: BTreeSet<TaskId> = cluster
                .running()
                .into_iter()
                .filter(|(_, n)| *n == node)
                .map(|(t, _)| t)
                .collect();
            running
        };
        let on_a = on(a);
        assert_eq!(
            on_a.iter().filter(|t| inside.contains(t)).count(),
            4,
            "4 slots"
        );
        assert!(
            plain.iter().all(|t| !on_a.contains(t)),
            "A's cpus are locked"
        );
        assert_eq!(on(b).len(), 2, "plain tasks use B");
        assert!(
            inside
                .iter()
                .all(|t| cluster.node_of(*t).is_none_or(|n| n == a))
        );
        // A locked task ends: the next one takes its slot, not a plain task.
        let first = *on_a.iter().find(|t| inside.contains(t)).unwrap();
        cluster.finish(first, true);
        assert_eq!(on(a).len(), 5, "the ghost and four locked tasks");
        assert!(plain.iter().all(|t| !on(a).contains(t)));
        // Release: the bundle's cpus go back; waiting locked tasks wait for a new lock.
        lock.release().await.unwrap();
        for t in on(a) {
            if inside.contains(&t) {
                cluster.finish(t, true);
            }
        }
        let now_a = on(a);
        assert_eq!(now_a.len(), 1, "the waiting plain task");
        assert!(plain.contains(now_a.iter().next().unwrap()));
        let waiting = inside
            .iter()
            .filter(|t| cluster.node_of(**t).is_none())
            .count();
        assert_eq!(waiting, 1);
    }

    /// Sized tasks inside a random bundle never use more of it than it holds, and only ever
    /// run on the lock's node.
    #[tokio::test]
    async fn sized_tasks_never_exceed_the_bundle() {
        let mut rng = Rng::new(8);
        for round in 0..40 {
            let cluster = InMemoryCluster::new(Mode::Manual);
            let nodes: Vec<NodeId> = (0..rng.range(1, 3))
                .map(|_| cluster.add_node("cpu=8,memory=16"))
                .collect();
            let (cpu, mem) = (rng.range(1, 8), rng.range(1, 16));
            let bundle = set(&format!("cpu={cpu},memory={mem}"));
            let target = NodeSpec::Match {
                resources: bundle.clone(),
                num_nodes: Some(1),
            };
            let mut lock = Lock::reserve(cluster.clone(), &format!("r{round}"), bundle, target)
                .await
                .unwrap();
            let home = lock.wait_ready(WAIT).await.unwrap();
            assert!(nodes.contains(&home));
            let mut demands: BTreeMap<TaskId, (u64, u64)> = BTreeMap::new();
            for _ in 0..rng.range(1, 12) {
                let d = (rng.range(0, cpu), rng.range(0, mem));
                let demand = set(&format!("cpu={},memory={}", d.0, d.1));
                let spec = lock.spec_for(&demand).await.unwrap();
                let id = cluster.submit(vec![task("", &spec)]).await.unwrap()[0];
                demands.insert(id, d);
            }
            loop {
                let inside: Vec<(TaskId, NodeId)> = cluster
                    .running()
                    .into_iter()
                    .filter(|(t, _)| demands.contains_key(t))
                    .collect();
                assert!(inside.iter().all(|(_, n)| *n == home), "round {round}");
                let used = inside.iter().fold((0, 0), |acc, (t, _)| {
                    (acc.0 + demands[t].0, acc.1 + demands[t].1)
                });
                assert!(used.0 <= cpu && used.1 <= mem, "round {round}: {used:?}");
                assert!(inside.len() as u64 <= cpu, "round {round}: slots");
                if inside.is_empty() {
                    break;
                }
                cluster.finish(inside[rng.below(inside.len())].0, true);
            }
            assert!(
                demands.keys().all(|t| cluster.node_of(*t).is_some()),
                "all ran"
            );
            let too_big = set(&format!("cpu={}", cpu + 1));
            assert!(lock.spec_sized(&too_big).is_err());
            lock.release().await.unwrap();
        }
    }

    #[tokio::test]
    async fn impossible_locks_are_refused_or_time_out() {
        let cluster = InMemoryCluster::new(Mode::Manual);
        let node = cluster.add_node("cpu=4");
        let local = Lock::reserve(cluster.clone(), "l", set("cpu=1"), NodeSpec::Local).await;
        assert!(local.is_err());
        let nowhere = NodeSpec::Match {
            resources: set("gpu=1"),
            num_nodes: None,
        };
        assert!(
            Lock::reserve(cluster.clone(), "g", set("gpu=1"), nowhere)
                .await
                .is_err()
        );
        assert!(
            Lock::reserve(cluster.clone(), "e", set(""), NodeSpec::Node(node))
                .await
                .is_err()
        );
        let big = Lock::reserve(cluster.clone(), "big", set("cpu=16"), NodeSpec::Node(node))
            .await
            .unwrap();
        let err = big.wait_ready(Duration::from_millis(30)).await.unwrap_err();
        assert!(matches!(err, EslError::Timeout { .. }), "{err}");
        big.release().await.unwrap();
    }

    /// Waiting for the bundle hears the ghost start: a few status reads however long it
    /// waits (polling read it every few milliseconds).
    #[tokio::test(start_paused = true)]
    async fn waiting_for_the_bundle_reads_the_ghost_status_per_event_not_per_interval() {
        let cluster = Counting::new(InMemoryCluster::new(Mode::Manual));
        let node = cluster.inner.add_node("cpu=4");
        let busy = cluster
            .submit(vec![task("cpu=4", &ResourceSpec::new())])
            .await
            .unwrap();
        let lock = Lock::reserve(cluster.clone(), "late", set("cpu=4"), NodeSpec::Node(node))
            .await
            .unwrap();
        let later = async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            cluster.inner.finish(busy[0], true);
        };
        let (ready, ()) = tokio::join!(lock.wait_ready(Duration::from_secs(60)), later);
        assert_eq!(ready.unwrap(), node);
        assert!(
            cluster.statuses() <= 2,
            "{} status reads over 30 s: polling",
            cluster.statuses()
        );
    }

    /// A ghost that ends before it holds the bundle is reported as before: its state and why.
    #[tokio::test(start_paused = true)]
    async fn a_ghost_that_ends_before_starting_is_reported_with_its_state() {
        let cluster = InMemoryCluster::new(Mode::Manual);
        let node = cluster.add_node("cpu=4");
        let lock = Lock::reserve(cluster.clone(), "gone", set("cpu=16"), NodeSpec::Node(node))
            .await
            .unwrap();
        let later = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            cluster.cancel(vec![lock.ghost()]).await.unwrap();
        };
        let (ready, ()) = tokio::join!(lock.wait_ready(Duration::from_secs(60)), later);
        let err = ready.unwrap_err();
        assert!(
            matches!(&err, EslError::Unsatisfiable(why)
                if why.starts_with("the ghost of lock-gone is cancelled")),
            "{err}"
        );
    }
}
