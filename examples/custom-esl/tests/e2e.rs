//! End to end: the exposure cap on a real `escher::LocalCluster` (a head and workers in this
//! process, talking gRPC on loopback), through the real `Client` as its `ClusterApi`.
//!
//! Every wait is bounded; nothing asserts speed.

use std::future::Future;
use std::time::Duration;

use escher::types::{NodeId, ResourceSet, TaskId, TaskState};
use escher::{Client, Functions, LocalCluster, Task};
use escher_custom_esl::ExposureCap;
use escher_esl::ResourceSpec;

/// The bound on any single wait.
const LIMIT: Duration = Duration::from_secs(30);
/// How long a `hold` task runs unless cancelled: far longer than the test.
const HOLD_MS: u64 = 120_000;

fn set(text: &str) -> ResourceSet {
    text.parse().expect("a valid resource set")
}

/// Workers with these resources, each registering `hold(ms)`: sleeps, then returns.
async fn start(workers: &[&str]) -> (LocalCluster, Client) {
    let functions = Functions::new().typed_function("hold", |_ctx, ms: u64| async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok::<_, String>(())
    });
    let mut builder = LocalCluster::builder().functions(functions).no_workers();
    for w in workers {
        builder = builder.worker(set(w));
    }
    let cluster = within(
        "starting the cluster",
        builder.grace(Duration::from_secs(1)).start(),
    )
    .await
    .expect("the local cluster starts");
    let client = within("connecting", cluster.client())
        .await
        .expect("the client connects");
    (cluster, client)
}

async fn within<F: Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(LIMIT, f).await {
        Ok(out) => out,
        Err(_) => panic!("{what}: did not finish within {LIMIT:?}"),
    }
}

/// Polls `check` every 20 ms until it returns `Some`, failing after [`LIMIT`].
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    within(what, async {
        loop {
            if let Some(found) = check().await {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

/// Submits `n` long tasks of one cpu under `spec`.
async fn submit_holds(client: &Client, spec: &ResourceSpec, n: usize) -> Vec<TaskId> {
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        let task = spec.apply(Task::function_typed("hold", &HOLD_MS).resources_str("cpu=1"));
        ids.push(
            within("submit", client.submit(task))
                .await
                .expect("submitted")
                .id(),
        );
    }
    ids
}

/// Each task's state and node now.
async fn where_they_are(client: &Client, tasks: &[TaskId]) -> Vec<(TaskState, Option<NodeId>)> {
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        let status = client.task_info(*t).await.expect("task_info").status;
        assert!(!status.state.is_terminal(), "task {t} ended: {status:?}");
        out.push((status.state, status.node));
    }
    out
}

/// The live nodes whose totals have `marker`.
async fn nodes_with(client: &Client, marker: &str) -> Vec<NodeId> {
    let status = client.cluster_status().await.expect("status");
    status
        .nodes
        .iter()
        .filter(|n| n.alive && n.resource(marker).is_some())
        .map(|n| n.id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_a_fifth_of_the_job_runs_on_the_spot_worker() {
    // The spot worker comes first and has the most room: without the cap it could take the
    // whole job.
    let (cluster, client) = start(&["cpu=16,spot=1", "cpu=4", "cpu=4"]).await;
    let spot = nodes_with(&client, "spot").await;
    assert_eq!(spot.len(), 1);
    let spot = spot[0];

    let cap = ExposureCap::create(client.clone(), "web", "spot", 10, 20)
        .await
        .expect("the cap is set");
    assert_eq!(cap.budget(), 2);
    let tasks = submit_holds(&client, &cap.spec(), 10).await;
    let placed = eventually("all ten running", || async {
        let now = where_they_are(&client, &tasks).await;
        now.iter()
            .all(|(state, _)| *state == TaskState::Running)
            .then_some(now)
    })
    .await;
    let on_spot = placed.iter().filter(|(_, n)| *n == Some(spot)).count();
    assert_eq!(on_spot, 2, "two of ten on spot, eight on the safe workers");

    // An eleventh task of the job waits, though the spot worker has 14 cpus free ...
    let late = submit_holds(&client, &cap.spec(), 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        where_they_are(&client, &late).await[0].0,
        TaskState::Pending
    );
    // ... until one of the job's spot tasks ends and gives its unit back.
    let ended = tasks[placed.iter().position(|(_, n)| *n == Some(spot)).unwrap()];
    within("cancel", client.cancel(vec![ended]))
        .await
        .expect("cancelled");
    eventually("the late task runs on spot", || async {
        let now = where_they_are(&client, &late).await[0];
        (now == (TaskState::Running, Some(spot))).then_some(())
    })
    .await;

    let mut all = tasks;
    all.extend(late);
    all.retain(|t| *t != ended);
    within("cancel", client.cancel(all))
        .await
        .expect("cancelled");
    cap.dissolve().await.expect("dissolved");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_joins_is_given_its_capacity_from_the_event_feed() {
    let (mut cluster, client) = start(&["cpu=1", "cpu=8,spot=1"]).await;
    // Four tasks, half on spot at most: two there, one on the safe worker, one waits.
    let cap = ExposureCap::create(client.clone(), "batch", "spot", 4, 50)
        .await
        .expect("the cap is set");
    let follower = cap.follow().await.expect("following");
    let tasks = submit_holds(&client, &cap.spec(), 4).await;
    let waiting = eventually("three running, one waiting", || async {
        let now = where_they_are(&client, &tasks).await;
        let running = now.iter().filter(|(s, _)| *s == TaskState::Running).count();
        (running == 3).then(|| {
            let i = now
                .iter()
                .position(|(s, _)| *s == TaskState::Pending)
                .unwrap();
            tasks[i]
        })
    })
    .await;

    // A safe worker joins: the follower hears of it and gives it an unbounded xcap-batch.
    let joined = within(
        "adding a worker",
        cluster.add_worker(set("cpu=1,memory=4096")),
    )
    .await
    .expect("the worker joins");
    eventually("the waiting task runs on the new worker", || async {
        let now = where_they_are(&client, &[waiting]).await[0];
        (now == (TaskState::Running, Some(joined))).then_some(())
    })
    .await;

    follower.stop();
    within("cancel", client.cancel(tasks))
        .await
        .expect("cancelled");
    cluster.shutdown().await;
}
