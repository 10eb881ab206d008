//! What an ESL author needs to test a policy: the in-process cluster, bounded waits, and
//! helpers to submit tasks and watch where they run.
//!
//! Every helper here takes any [`ClusterApi`], so one test body runs on both clusters a policy
//! is tested on:
//! - [`InMemoryCluster`] (feature `in-memory`, on by default): the head's real state machine
//!   with simulated workers, in the test's process, no network; tasks run until the test
//!   finishes them ([`Mode::Manual`]) or end at once ([`Mode::Instant`]);
//! - `escher::LocalCluster` (the facade, a dev-dependency): a real head and real workers in the
//!   test's process talking gRPC on loopback, whose `client()` is a [`ClusterApi`].
//!
//! Waits are bounded by [`LIMIT`] and fail the test with what they waited for; a wait for a
//! state listens to the cluster's events ([`until`], [`all_running`]) instead of sleeping.
//! Nothing here measures time: a test asserts properties, not speed.
//!
//! ```
//! use escher_esl::testing::{self, InMemoryCluster, Mode};
//! use escher_esl::ClusterApi;
//! use escher_proto::types::TaskSpec;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let cluster = InMemoryCluster::new(Mode::Manual);
//! let node = cluster.add_node("cpu=2");
//! let task = escher_client::Task::function("work", Vec::new()).resources_str("cpu=1");
//! let tasks = testing::submit(&cluster, vec![task.build().unwrap(); 3]).await;
//! // Two fit; the third waits until one of them ends.
//! let waiting = testing::until(&cluster, "two running", async || {
//!     let now = testing::placements(&cluster, &tasks).await;
//!     (testing::count_on(&now, node) == 2).then_some(())?;
//!     now.iter().position(|(_, n)| n.is_none()).map(|i| tasks[i])
//! })
//! .await;
//! cluster.finish(tasks[0], true);
//! assert_eq!(testing::all_running(&cluster, &[waiting]).await, vec![node]);
//! # }
//! ```

use std::future::Future;
use std::time::Duration;

use escher_proto::types::{NodeId, TaskId, TaskSpec, TaskState, WatchRequest};

use crate::ClusterApi;
use crate::api::{Started, await_started};
#[cfg(feature = "in-memory")]
pub use crate::in_memory::{InMemoryCluster, Mode};

/// The bound on any one wait of these helpers.
pub const LIMIT: Duration = Duration::from_secs(30);

/// `f`'s output, or a panic naming `what` if it takes longer than [`LIMIT`].
pub async fn within<F: Future>(what: &str, f: F) -> F::Output {
    within_for(LIMIT, what, f).await
}

/// `f`'s output, or a panic naming `what` if it takes longer than `limit`: for a wait that is
/// long by design (many gangs in turn, shares that converge), where [`within`]'s bound is too
/// short.
pub async fn within_for<F: Future>(limit: Duration, what: &str, f: F) -> F::Output {
    match tokio::time::timeout(limit, f).await {
        Ok(out) => out,
        Err(_) => panic!("{what}: did not happen within {limit:?}"),
    }
}

/// Waits until `check` returns `Some`, reading it again after each of the cluster's events
/// (task, node and resource changes alike), and fails the test after [`LIMIT`].
///
/// The subscription comes first, then the first check, so a change between the two is not
/// missed. Work the test's own process does in the background (a policy's follower) is given
/// its turn between checks.
pub async fn until<C, T>(cluster: &C, what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T
where
    C: ClusterApi,
{
    within(what, async {
        let mut events = cluster
            .watch(WatchRequest::all())
            .await
            .unwrap_or_else(|e| panic!("{what}: cannot watch the cluster: {e}"));
        loop {
            tokio::task::yield_now().await;
            if let Some(found) = check().await {
                return found;
            }
            match events.next().await {
                Some(Ok(_)) => {}
                Some(Err(e)) => panic!("{what}: the event feed failed: {e}"),
                None => panic!("{what}: the event feed ended"),
            }
        }
    })
    .await
}

/// Submits `tasks` (built specs), failing the test if the cluster refuses them; their ids, in
/// order.
pub async fn submit<C: ClusterApi>(cluster: &C, tasks: Vec<TaskSpec>) -> Vec<TaskId> {
    within("submitting", cluster.submit(tasks))
        .await
        .unwrap_or_else(|e| panic!("submitting: {e}"))
}

/// Each task's state and node now (a pending task has none). A task that has ended fails the
/// test: these helpers are for tasks the test keeps running.
pub async fn placements<C: ClusterApi>(
    cluster: &C,
    tasks: &[TaskId],
) -> Vec<(TaskState, Option<NodeId>)> {
    let mut out = Vec::with_capacity(tasks.len());
    for task in tasks {
        let status = within("reading a task's status", cluster.status(*task))
            .await
            .unwrap_or_else(|e| panic!("task {task}: {e}"));
        assert!(!status.state.is_terminal(), "task {task} ended: {status:?}");
        let node = match status.state {
            TaskState::Running => status.node,
            _ => None,
        };
        out.push((status.state, node));
    }
    out
}

/// How many of `placements` run on `node`.
pub fn count_on(placements: &[(TaskState, Option<NodeId>)], node: NodeId) -> usize {
    placements.iter().filter(|(_, n)| *n == Some(node)).count()
}

/// Waits until every task of `tasks` runs (from the cluster's events); their nodes, in order.
/// Fails the test if one of them ends first, or after [`LIMIT`].
pub async fn all_running<C: ClusterApi>(cluster: &C, tasks: &[TaskId]) -> Vec<NodeId> {
    let deadline = tokio::time::Instant::now() + LIMIT;
    match await_started(cluster, tasks, Some(deadline)).await {
        Ok(Started::All) => {}
        Ok(Started::Ended(status)) => panic!("task {} ended: {status:?}", status.id),
        Ok(Started::TimedOut(waiting)) => {
            panic!("tasks {waiting:?} did not start within {LIMIT:?}")
        }
        Err(e) => panic!("waiting for tasks to start: {e}"),
    }
    placements(cluster, tasks)
        .await
        .into_iter()
        .zip(tasks)
        .map(|((_, node), task)| node.unwrap_or_else(|| panic!("task {task} started and left")))
        .collect()
}

/// The live nodes whose totals have the resource `name` (a marker such as `spot`), in id
/// order.
pub async fn nodes_having<C: ClusterApi>(cluster: &C, name: &str) -> Vec<NodeId> {
    let status = within("reading the cluster's status", cluster.cluster_status())
        .await
        .unwrap_or_else(|e| panic!("reading the cluster's status: {e}"));
    let mut nodes: Vec<NodeId> = status
        .nodes
        .iter()
        .filter(|n| n.alive && n.resource(name).is_some())
        .map(|n| n.id)
        .collect();
    nodes.sort();
    nodes
}

/// Cancels `tasks`, failing the test if the cluster refuses.
pub async fn cancel<C: ClusterApi>(cluster: &C, tasks: &[TaskId]) {
    within("cancelling", cluster.cancel(tasks.to_vec()))
        .await
        .unwrap_or_else(|e| panic!("cancelling {tasks:?}: {e}"));
}
