//! Soft constraints: an ordered list of preferred requirement sets, of which the task gets
//! the first that can be met (thesis §4.4.2 "Soft constraints with ESCHER", Fig. 4.4a).
//!
//! The scheduler only knows hard requirements, so the preference is the ESL's doing. Two
//! methods, chosen with [`Method`]:
//!
//! - [`Method::WaitForStart`], the thesis' method: submit the task with preference 1 and
//!   wait up to a timeout `t` for its start signal (here: the head's "task started" event,
//!   from the watch API; the thesis used a heartbeat because Ray had no such event); if it has
//!   not started,
//!   cancel it and resubmit with the next preference. Every preference that cannot be met now
//!   costs a blind wait of `t`.
//! - [`Method::FitsNowFirst`]: read `get_cluster_status` first and submit directly the first
//!   remaining preference that fits some live node's *available* resources now; only when
//!   none fits now fall back to the thesis' waiting, from the next preference in order. No
//!   blind wait when something fits. The check is advisory (another task may take the room
//!   first), which the start wait then catches.
//!
//! The last preference is never cancelled: if it has not started within `t` it is left
//! pending (it is the fallback) and the [`Placement`] says so. Preferences compose with the
//! task's own requirements (AND: concatenation) and with each other as OR, e.g. the thesis'
//! conflict resolution `[{fair_a: 1, anti_aff: 1}, {fair_a: 1}]`.
//!
//! **Limit.** A task that starts just as it is cancelled is stopped (the head has no "cancel
//! only if still pending"); the ESL then moves on to the next preference.

use std::time::Duration;

use escher_proto::types::{ClusterStatus, NodeId, ResourceSet, TaskId, TaskSpec};

use crate::api::{Started, await_started};
use crate::{ClusterApi, EslError, ResourceSpec};

/// How the soft-constraints ESL picks a preference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Method {
    /// The thesis: try each preference in order, waiting up to the timeout for each.
    #[default]
    WaitForStart,
    /// Submit the first preference that fits some node now; wait only if none does.
    FitsNowFirst,
}

/// Where a task with soft constraints went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The task that stays (started, or left pending with the last preference).
    pub task: TaskId,
    /// Which preference it got (0 is the most preferred).
    pub choice: usize,
    /// Whether it started; `false` only when it was left pending with the last preference.
    pub started: bool,
    /// Attempts with earlier preferences that were cancelled, in order.
    pub abandoned: Vec<TaskId>,
}

/// The soft-constraints ESL.
#[derive(Debug, Clone)]
pub struct SoftConstraints<C> {
    cluster: C,
    timeout: Duration,
    method: Method,
}

impl<C: ClusterApi> SoftConstraints<C> {
    /// Soft constraints over `cluster`, waiting up to `timeout` for each attempt to start,
    /// with the thesis' method.
    pub fn new(cluster: C, timeout: Duration) -> SoftConstraints<C> {
        SoftConstraints {
            cluster,
            timeout,
            method: Method::WaitForStart,
        }
    }

    /// The same ESL with another [`Method`].
    pub fn method(mut self, method: Method) -> SoftConstraints<C> {
        self.method = method;
        self
    }

    /// Submits `task` (with its own, hard, requirements) under the first of `preferences`
    /// that can be met, trying them in order.
    pub async fn submit(
        &self,
        task: &TaskSpec,
        preferences: &[ResourceSpec],
    ) -> Result<Placement, EslError> {
        if preferences.is_empty() {
            return Err(EslError::Unsatisfiable(
                "soft constraints need at least one preference (an empty spec means none)".into(),
            ));
        }
        let mut abandoned = Vec::new();
        let mut next = 0;
        while next < preferences.len() {
            let choice = match self.method {
                Method::WaitForStart => next,
                Method::FitsNowFirst => {
                    let status = self.cluster.cluster_status().await?;
                    let fits = |p: &ResourceSpec| {
                        let mut needs = task.resources.clone();
                        needs.merge(&p.resources).is_ok() && fitting_node(&status, &needs).is_some()
                    };
                    (next..preferences.len())
                        .find(|i| fits(&preferences[*i]))
                        .unwrap_or(next)
                }
            };
            let mut spec = task.clone();
            preferences[choice].apply_to(&mut spec)?;
            let id = self.cluster.submit(vec![spec]).await?[0];
            let last = choice + 1 == preferences.len();
            let started = self.started(id).await?;
            if started || last {
                return Ok(Placement {
                    task: id,
                    choice,
                    started,
                    abandoned,
                });
            }
            self.cluster.cancel(vec![id]).await?;
            abandoned.push(id);
            next = choice + 1;
        }
        unreachable!("the last preference always returns")
    }

    /// Whether `task` leaves `Pending` (starts, or ends) within the timeout, as the cluster's
    /// events tell.
    async fn started(&self, task: TaskId) -> Result<bool, EslError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let outcome = await_started(&self.cluster, &[task], Some(deadline)).await?;
        Ok(!matches!(outcome, Started::TimedOut(_)))
    }
}

/// The first live node whose available resources contain `needs` now (an unbounded resource
/// always has room; a resource the node lacks has none).
pub fn fitting_node(status: &ClusterStatus, needs: &ResourceSet) -> Option<NodeId> {
    status
        .nodes
        .iter()
        .filter(|n| n.takes_tasks())
        .find(|node| {
            needs.iter().all(|(name, amount)| {
                node.resource(name.as_str())
                    .is_some_and(|r| r.available().is_none_or(|a| a >= amount))
            })
        })
        .map(|n| n.id)
}

#[cfg(test)]
mod tests {
    use escher_proto::types::{Capacity, NodeSpec, ResourceName, TaskState};

    use super::*;
    use crate::{InMemoryCluster, Mode};

    fn prefs(list: &[&str]) -> Vec<ResourceSpec> {
        list.iter()
            .map(|p| ResourceSpec {
                resources: p.parse().unwrap(),
                ..ResourceSpec::default()
            })
            .collect()
    }

    fn task(resources: &str) -> TaskSpec {
        escher_client::Task::function("work", Vec::new())
            .resources_str(resources)
            .build()
            .unwrap()
    }

    /// One node with cpu=4 and the application resource `fast` (unbounded), tasks running
    /// until finished by the test.
    async fn cluster() -> (InMemoryCluster, NodeId) {
        let cluster = InMemoryCluster::new(Mode::Manual);
        let node = cluster.add_node("cpu=4");
        let fast = ResourceName::new("fast").unwrap();
        cluster
            .set_resource(fast, Capacity::Unbounded, NodeSpec::Node(node))
            .await
            .unwrap();
        (cluster, node)
    }

    #[tokio::test(start_paused = true)]
    async fn the_thesis_method_falls_back_in_order() {
        let (cluster, node) = cluster().await;
        let soft = SoftConstraints::new(cluster.clone(), Duration::from_millis(100));
        let list = prefs(&["gpu=1", "tpu=1", "fast=1", ""]);
        let placed = soft.submit(&task("cpu=1"), &list).await.unwrap();
        assert_eq!((placed.choice, placed.started), (2, true));
        assert_eq!(
            placed.abandoned.len(),
            2,
            "gpu, then tpu, each after a timeout"
        );
        for id in &placed.abandoned {
            assert_eq!(
                cluster.status(*id).await.unwrap().state,
                TaskState::Cancelled
            );
        }
        assert_eq!(cluster.node_of(placed.task), Some(node));
        // The first preference that can be met wins even when later ones could too.
        let placed = soft
            .submit(&task("cpu=1"), &prefs(&["", "fast=1"]))
            .await
            .unwrap();
        assert_eq!((placed.choice, placed.abandoned.len()), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn fits_now_first_submits_the_first_preference_that_fits_directly() {
        let (cluster, _) = cluster().await;
        let soft = SoftConstraints::new(cluster.clone(), Duration::from_millis(100))
            .method(Method::FitsNowFirst);
        let list = prefs(&["gpu=1", "tpu=1", "fast=1", ""]);
        let placed = soft.submit(&task("cpu=1"), &list).await.unwrap();
        assert_eq!((placed.choice, placed.started), (2, true));
        assert!(
            placed.abandoned.is_empty(),
            "nothing was submitted that could not start"
        );
        assert_eq!(cluster.dispatches().len(), 1);
        // The task's own needs count too: with one cpu taken, 4 cpus fit nowhere now, so it
        // waits in order like the thesis and leaves the last preference pending.
        let placed = soft.submit(&task("cpu=4"), &list).await.unwrap();
        assert_eq!((placed.choice, placed.started), (3, false));
        assert_eq!(placed.abandoned.len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn when_nothing_fits_now_it_waits_in_order_like_the_thesis() {
        let (cluster, _) = cluster().await;
        let soft = SoftConstraints::new(cluster.clone(), Duration::from_millis(100))
            .method(Method::FitsNowFirst);
        let busy = cluster.submit(vec![task("cpu=4")]).await.unwrap()[0];
        // Room appears 50 ms into the wait for the first preference: it gets it.
        let freer = {
            let cluster = cluster.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                cluster.finish(busy, true);
            })
        };
        let placed = soft
            .submit(&task("cpu=1"), &prefs(&["fast=1", ""]))
            .await
            .unwrap();
        freer.await.unwrap();
        assert_eq!((placed.choice, placed.started), (0, true));
        assert!(placed.abandoned.is_empty());
    }

    #[tokio::test]
    async fn an_empty_list_is_refused_and_fit_reads_available_resources() {
        let (cluster, node) = cluster().await;
        let soft = SoftConstraints::new(cluster.clone(), Duration::from_millis(1));
        assert!(soft.submit(&task("cpu=1"), &[]).await.is_err());
        let status = cluster.cluster_status().await.unwrap();
        let set = |s: &str| s.parse::<ResourceSet>().unwrap();
        assert_eq!(fitting_node(&status, &set("cpu=4,fast=100")), Some(node));
        assert_eq!(fitting_node(&status, &set("cpu=5")), None);
        assert_eq!(fitting_node(&status, &set("gpu=1")), None);
    }
}
