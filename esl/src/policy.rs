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
    CapacityOp, ClusterStatus, MAX_WATCH_TASKS, NodeId, NodeSpec, ResourceName, ResourceSet,
    ResourceUpdate, TaskId, TaskState, TaskStatus, WatchKind, WatchRequest,
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
            .filter(|n| n.takes_tasks())
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

/// Waits until every task in `tasks` has left `Pending` (it runs, or it ended), or `timeout`
/// passes; their statuses, in order. It learns of each start, end and return to pending from
/// the cluster's events ([`ClusterApi::watch`]), not by polling: it subscribes first, then
/// reads every status once, and reads a task's status again only when an event names it, so
/// no change between the first reads and the subscription goes unseen, and a wait of any
/// length costs one subscription and a few status reads per task.
///
/// Unlike [`await_started`](crate::api::await_started), a task that ended (before starting,
/// or after) counts as having left `Pending`, and the wait goes on for the others: the caller
/// judges the statuses (a ghost that is not running, a member that already finished).
pub(crate) async fn wait_started<C: ClusterApi>(
    cluster: &C,
    tasks: &[TaskId],
    what: &str,
    timeout: Duration,
) -> Result<Vec<TaskStatus>, EslError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let kinds = [WatchKind::Started, WatchKind::Finished, WatchKind::Pending];
    // A filter names at most `MAX_WATCH_TASKS` tasks; past that, every task's events come and
    // those of others are skipped here.
    let request = if tasks.len() <= MAX_WATCH_TASKS {
        WatchRequest::tasks(tasks.iter().copied()).kinds(kinds)
    } else {
        WatchRequest::all().kinds(kinds)
    };
    let mut events = cluster.watch(request.clone()).await?;
    let mut statuses = Vec::with_capacity(tasks.len());
    for task in tasks {
        statuses.push(cluster.status(*task).await?);
    }
    loop {
        if statuses.iter().all(has_started) {
            return Ok(statuses);
        }
        let next = match tokio::time::timeout_at(deadline, events.next()).await {
            Ok(next) => next,
            Err(_) => {
                return Err(EslError::Timeout {
                    what: what.to_string(),
                    after: timeout,
                });
            }
        };
        match next {
            Some(Ok(event)) => {
                let Some(task) = event.event.task() else {
                    continue;
                };
                let pending_again = event.event.kind() == WatchKind::Pending;
                for (status, t) in statuses.iter_mut().zip(tasks) {
                    // A pending task whose reason changed is still pending: no read.
                    if *t == task && (!pending_again || has_started(status)) {
                        *status = cluster.status(task).await?;
                    }
                }
            }
            // The feed broke past resuming (the head no longer keeps the events after its
            // last revision): subscribe again, then read every status afresh.
            Some(Err(e)) => {
                tracing::debug!(error = %e, "the event feed broke; subscribing again");
                events = cluster.watch(request.clone()).await?;
                for (status, task) in statuses.iter_mut().zip(tasks) {
                    *status = cluster.status(*task).await?;
                }
            }
            None => return Err(EslError::Refused("the cluster's event feed ended".into())),
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Helpers for the policies' unit tests: a seeded RNG, a cluster that counts status
    //! reads, and a task builder.

    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use escher_client::Task;
    use escher_proto::types::{TaskId, TaskSpec, TaskStatus};

    use crate::{ClusterApi, EslError, InMemoryCluster, ResourceSpec};

    /// The seeded generator of test scenarios: `fastrand`'s, with the few draws the tests use.
    #[derive(Debug, Clone)]
    pub(crate) struct Rng(fastrand::Rng);

    impl Rng {
        pub(crate) fn new(seed: u64) -> Rng {
            Rng(fastrand::Rng::with_seed(seed))
        }

        /// Uniform in `lo..=hi`.
        pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
            self.0.u64(lo..=hi)
        }

        pub(crate) fn below(&mut self, n: usize) -> usize {
            self.0.usize(..n)
        }

        pub(crate) fn chance(&mut self, percent: u64) -> bool {
            self.0.u64(..100) < percent
        }

        pub(crate) fn shuffle<T>(&mut self, items: &mut [T]) {
            self.0.shuffle(items);
        }
    }

    /// An [`InMemoryCluster`] that counts the status reads made through it (how a test
    /// tells waiting on events from polling).
    #[derive(Debug, Clone)]
    pub(crate) struct Counting {
        pub(crate) inner: InMemoryCluster,
        statuses: Arc<AtomicUsize>,
    }

    impl Counting {
        pub(crate) fn new(inner: InMemoryCluster) -> Counting {
            Counting {
                inner,
                statuses: Arc::default(),
            }
        }

        /// Status reads so far.
        pub(crate) fn statuses(&self) -> usize {
            self.statuses.load(Ordering::SeqCst)
        }
    }

    impl ClusterApi for Counting {
        fn inner(&self) -> &impl ClusterApi {
            &self.inner
        }

        async fn status(&self, task: TaskId) -> Result<TaskStatus, EslError> {
            self.statuses.fetch_add(1, Ordering::SeqCst);
            self.inner.status(task).await
        }
    }

    /// A function task with these physical resources and this policy spec.
    pub(crate) fn task(resources: &str, spec: &ResourceSpec) -> TaskSpec {
        spec.apply(Task::function("work", Vec::new()).resources_str(resources))
            .build()
            .expect("a valid test task")
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use escher_proto::types::{Amount, Capacity, NodeSpec, ResourceName, TaskState};

    use super::testing::{Counting, task};
    use super::*;
    use crate::{InMemoryCluster, Mode, ResourceSpec};

    /// `n` tasks that need `x`, which no node has yet.
    async fn waiting(cluster: &Counting, n: usize) -> Vec<TaskId> {
        let spec = ResourceSpec::new().require(x(), Amount::ONE).unwrap();
        cluster.submit(vec![task("cpu=1", &spec); n]).await.unwrap()
    }

    fn x() -> ResourceName {
        ResourceName::new("x").unwrap()
    }

    /// However long the wait, each task's status is read about once when the wait begins and
    /// once when an event says it started: the wait hears the starts, it does not poll.
    #[tokio::test(start_paused = true)]
    async fn waiting_for_starts_reads_statuses_per_event_not_per_interval() {
        let cluster = Counting::new(InMemoryCluster::new(Mode::Manual));
        let node = cluster.inner.add_node("cpu=8");
        let tasks = waiting(&cluster, 4).await;
        let later = async {
            tokio::time::sleep(Duration::from_secs(20)).await;
            cluster
                .set_resource(x(), Capacity::Unbounded, NodeSpec::Node(node))
                .await
                .unwrap();
        };
        let (statuses, ()) = tokio::join!(
            wait_started(&cluster, &tasks, "starting", Duration::from_secs(60)),
            later
        );
        let statuses = statuses.unwrap();
        assert!(statuses.iter().all(|s| s.state == TaskState::Running));
        assert!(
            cluster.statuses() <= 2 * tasks.len(),
            "{} status reads for {} tasks over 20 s: polling",
            cluster.statuses(),
            tasks.len()
        );
    }

    /// The timeout and its error are what they were: `what` and the time given.
    #[tokio::test(start_paused = true)]
    async fn a_wait_that_times_out_says_what_and_after_how_long() {
        let cluster = Counting::new(InMemoryCluster::new(Mode::Manual));
        cluster.inner.add_node("cpu=8");
        let tasks = waiting(&cluster, 3).await;
        let err = wait_started(
            &cluster,
            &tasks,
            "placing the ghosts",
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        match err {
            EslError::Timeout { what, after } => {
                assert_eq!(what, "placing the ghosts");
                assert_eq!(after, Duration::from_secs(5));
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert_eq!(
            cluster.statuses(),
            tasks.len(),
            "one read each, then events"
        );
    }

    /// A task that ends before it starts has left `Pending` too: the wait goes on for the
    /// others and returns every status, for the caller to judge.
    #[tokio::test(start_paused = true)]
    async fn a_task_that_ends_early_counts_as_no_longer_pending() {
        let cluster = Counting::new(InMemoryCluster::new(Mode::Manual));
        let node = cluster.inner.add_node("cpu=8");
        let tasks = waiting(&cluster, 2).await;
        let later = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            cluster.cancel(vec![tasks[0]]).await.unwrap();
            tokio::time::sleep(Duration::from_secs(1)).await;
            cluster
                .set_resource(x(), Capacity::Unbounded, NodeSpec::Node(node))
                .await
                .unwrap();
        };
        let (statuses, ()) = tokio::join!(
            wait_started(&cluster, &tasks, "starting", Duration::from_secs(60)),
            later
        );
        let states: Vec<TaskState> = statuses.unwrap().iter().map(|s| s.state).collect();
        assert_eq!(states, vec![TaskState::Cancelled, TaskState::Running]);
    }

    /// Tasks that run already: one read each and no wait.
    #[tokio::test(start_paused = true)]
    async fn tasks_already_running_are_answered_at_once() {
        let cluster = Counting::new(InMemoryCluster::new(Mode::Manual));
        cluster.inner.add_node("cpu=8");
        let tasks = cluster
            .submit(vec![task("cpu=1", &ResourceSpec::new()); 3])
            .await
            .unwrap();
        let start = tokio::time::Instant::now();
        let statuses = wait_started(&cluster, &tasks, "starting", Duration::from_secs(5))
            .await
            .unwrap();
        assert!(statuses.iter().all(has_started));
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(cluster.statuses(), 3);
    }
}
