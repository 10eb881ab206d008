//! End to end: the exposure cap on a real `escher::LocalCluster` (a head and workers in this
//! process, talking gRPC on loopback), through the real `Client` as its `ClusterApi`.
//!
//! The helpers come from `escher_esl::testing`: every wait is bounded and listens to the
//! cluster's events; nothing asserts speed.

use std::time::Duration;

use escher::types::{ResourceSet, TaskId, TaskState};
use escher::{Client, Functions, LocalCluster, Task};
use escher_custom_esl::ExposureCap;
use escher_esl::ResourceSpec;
use escher_esl::testing::{self, within};

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

/// Submits `n` long tasks of one cpu under `spec`.
async fn submit_holds(client: &Client, spec: &ResourceSpec, n: usize) -> Vec<TaskId> {
    let task = spec.apply(Task::function_typed("hold", &HOLD_MS).resources_str("cpu=1"));
    let task = task.build().expect("a valid task");
    testing::submit(client, vec![task; n]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_a_fifth_of_the_job_runs_on_the_spot_worker() {
    // The spot worker comes first and has the most room: without the cap it could take the
    // whole job.
    let (cluster, client) = start(&["cpu=16,spot=1", "cpu=4", "cpu=4"]).await;
    let spot = testing::nodes_having(&client, "spot").await;
    assert_eq!(spot.len(), 1);
    let spot = spot[0];

    let cap = ExposureCap::create(client.clone(), "web", "spot", 10, 20)
        .await
        .expect("the cap is set");
    assert_eq!(cap.budget(), 2);
    let tasks = submit_holds(&client, &cap.spec(), 10).await;
    let placed = testing::all_running(&client, &tasks).await;
    let on_spot = placed.iter().filter(|n| **n == spot).count();
    assert_eq!(on_spot, 2, "two of ten on spot, eight on the safe workers");

    // An eleventh task of the job waits, though the spot worker has 14 cpus free: a task
    // submitted after it, outside the job, starts there while it stays pending ...
    let late = submit_holds(&client, &cap.spec(), 1).await;
    let other = Task::function_typed("hold", &HOLD_MS).resources_str("cpu=1,spot=1");
    let other = testing::submit(&client, vec![other.build().expect("a valid task")]).await;
    assert_eq!(testing::all_running(&client, &other).await, vec![spot]);
    assert_eq!(
        testing::placements(&client, &late).await,
        vec![(TaskState::Pending, None)]
    );
    // ... until one of the job's spot tasks ends and gives its unit back.
    let ended = tasks[placed.iter().position(|n| *n == spot).unwrap()];
    testing::cancel(&client, &[ended]).await;
    assert_eq!(testing::all_running(&client, &late).await, vec![spot]);

    let mut all = tasks;
    all.extend(late);
    all.extend(other);
    all.retain(|t| *t != ended);
    testing::cancel(&client, &all).await;
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
    let waiting = testing::until(&client, "three running, one waiting", async || {
        let now = testing::placements(&client, &tasks).await;
        let running = now.iter().filter(|(s, _)| *s == TaskState::Running).count();
        (running == 3).then_some(())?;
        let i = now.iter().position(|(s, _)| *s == TaskState::Pending)?;
        Some(tasks[i])
    })
    .await;

    // A safe worker joins: the follower hears of it and gives it an unbounded xcap-batch.
    let joined = within(
        "adding a worker",
        cluster.add_worker(set("cpu=1,memory=4096")),
    )
    .await
    .expect("the worker joins");
    assert_eq!(
        testing::all_running(&client, &[waiting]).await,
        vec![joined]
    );

    follower.stop();
    testing::cancel(&client, &tasks).await;
    cluster.shutdown().await;
}
