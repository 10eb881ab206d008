//! Unit tests on the in-memory cluster (the head's real state machine, simulated workers):
//! every decision here can be checked by hand.

use escher_client::Task;
use escher_esl::testing::{self, InMemoryCluster, Mode};
use escher_proto::types::{TaskId, TaskSpec};

use super::*;

/// A task of `resources` under `spec`, as the application would build it.
fn task(resources: &str, spec: &ResourceSpec) -> TaskSpec {
    spec.apply(Task::function("work", Vec::new()).resources_str(resources))
        .build()
        .expect("a valid task")
}

/// The capacity of `name` on `node` now.
async fn capacity(
    cluster: &impl ClusterApi,
    node: NodeId,
    name: &ResourceName,
) -> Option<Capacity> {
    let status = cluster.cluster_status().await.expect("status");
    status.node(node)?.resource(name.as_str()).map(|r| r.total)
}

fn finite(units: u64) -> Option<Capacity> {
    Some(Capacity::Finite(Amount::units(units).expect("small")))
}

/// How many of `tasks` run now on each of `nodes` (tasks that ended fail the test).
async fn running_on(cluster: &InMemoryCluster, tasks: &[TaskId], nodes: &[NodeId]) -> Vec<usize> {
    let now = testing::placements(cluster, tasks).await;
    nodes.iter().map(|n| testing::count_on(&now, *n)).collect()
}

#[test]
fn the_budget_is_the_floor_of_the_percentage() {
    assert_eq!(budget(10, 20), 2);
    assert_eq!(budget(10, 25), 2);
    assert_eq!(budget(3, 50), 1);
    assert_eq!(budget(7, 0), 0);
    assert_eq!(budget(7, 100), 7);
    assert_eq!(budget(u64::MAX, 100), u64::MAX);
}

#[tokio::test]
async fn five_units_over_two_risky_nodes_are_three_and_two() {
    let cluster = InMemoryCluster::new(Mode::Manual);
    let safe = cluster.add_node("cpu=4");
    let r1 = cluster.add_node("cpu=4,spot=1");
    let r2 = cluster.add_node("cpu=4,spot=1");
    let cap = ExposureCap::create(cluster.clone(), "train", "spot", 10, 50)
        .await
        .unwrap();
    assert_eq!(cap.budget(), 5);
    assert_eq!(cap.resource().as_str(), "xcap-train");
    let name = cap.resource();
    assert_eq!(
        capacity(&cluster, safe, name).await,
        Some(Capacity::Unbounded)
    );
    assert_eq!(
        capacity(&cluster, r1, name).await,
        finite(3),
        "the lower id gets the odd unit"
    );
    assert_eq!(capacity(&cluster, r2, name).await, finite(2));
}

#[tokio::test]
async fn the_cap_holds_where_the_risky_node_has_the_most_room() {
    let cluster = InMemoryCluster::new(Mode::Manual);
    // The spot node comes first and has the most room: without the cap it would take all.
    let spot = cluster.add_node("cpu=16,spot=1");
    let s1 = cluster.add_node("cpu=4");
    let s2 = cluster.add_node("cpu=4");
    // 10 tasks, at most 20% on spot: 2 there, and the 8 others fill the two safe nodes.
    let cap = ExposureCap::create(cluster.clone(), "web", "spot", 10, 20)
        .await
        .unwrap();
    let tasks = cluster
        .submit(vec![task("cpu=1", &cap.spec()); 10])
        .await
        .unwrap();
    assert_eq!(
        running_on(&cluster, &tasks, &[spot, s1, s2]).await,
        vec![2, 4, 4]
    );
    // An eleventh task of the job waits, though the spot node has 14 cpus free.
    let late = cluster
        .submit(vec![task("cpu=1", &cap.spec())])
        .await
        .unwrap();
    assert_eq!(cluster.node_of(late[0]), None);
    // One of the spot tasks ends: its unit comes back, and the late task takes it.
    let on_spot = tasks
        .iter()
        .find(|t| cluster.node_of(**t) == Some(spot))
        .copied()
        .unwrap();
    cluster.finish(on_spot, true);
    assert_eq!(cluster.node_of(late[0]), Some(spot));
}

#[tokio::test]
async fn zero_percent_keeps_the_job_off_risky_nodes() {
    let cluster = InMemoryCluster::new(Mode::Manual);
    let safe = cluster.add_node("cpu=2");
    let canary = cluster.add_node("cpu=8,canary=1");
    let cap = ExposureCap::create(cluster.clone(), "db", "canary", 4, 0)
        .await
        .unwrap();
    assert_eq!(capacity(&cluster, canary, cap.resource()).await, None);
    let tasks = cluster
        .submit(vec![task("cpu=1", &cap.spec()); 4])
        .await
        .unwrap();
    assert_eq!(
        running_on(&cluster, &tasks, &[safe, canary]).await,
        vec![2, 0]
    );
}

#[tokio::test]
async fn a_lost_risky_node_s_share_is_spread_over_the_others() {
    let cluster = InMemoryCluster::new(Mode::Manual);
    cluster.add_node("cpu=4");
    let r1 = cluster.add_node("cpu=4,spot=1");
    let r2 = cluster.add_node("cpu=4,spot=1");
    let cap = ExposureCap::create(cluster.clone(), "etl", "spot", 8, 50)
        .await
        .unwrap();
    assert_eq!(capacity(&cluster, r1, cap.resource()).await, finite(2));
    assert_eq!(capacity(&cluster, r2, cap.resource()).await, finite(2));

    cluster.remove_node(r2);
    let spread = cap.spread().await.unwrap();
    assert_eq!(spread.risky, vec![(r1, 4)]);
    assert_eq!(capacity(&cluster, r1, cap.resource()).await, finite(4));

    // With the whole budget on r1, a risky node that joins gets nothing (shares are never
    // taken back), and a safe one is unbounded.
    let r3 = cluster.add_node("cpu=4,spot=1");
    let s2 = cluster.add_node("cpu=4");
    let spread = cap.spread().await.unwrap();
    assert_eq!(spread.share(r3), Some(0));
    assert!(spread.safe.contains(&s2));
    assert_eq!(capacity(&cluster, r3, cap.resource()).await, None);
    assert_eq!(
        capacity(&cluster, s2, cap.resource()).await,
        Some(Capacity::Unbounded)
    );
}

#[tokio::test]
async fn water_filling_raises_the_lowest_shares_first() {
    let cluster = InMemoryCluster::new(Mode::Manual);
    let a = cluster.add_node("spot=1");
    let b = cluster.add_node("spot=1");
    let c = cluster.add_node("spot=1");
    let name = resource_name("j").unwrap();
    let marker: ResourceSet = "spot=1".parse().unwrap();
    // Shares a: 3, b: 0, c: 1 now, budget 7: the pool of 3 raises b to 1 (2 left), then b
    // and c to 2 (0 left).
    cluster
        .set_resource(
            name.clone(),
            Capacity::Finite(Amount::units(3).unwrap()),
            NodeSpec::Node(a),
        )
        .await
        .unwrap();
    cluster
        .set_resource(
            name.clone(),
            Capacity::Finite(Amount::ONE),
            NodeSpec::Node(c),
        )
        .await
        .unwrap();
    let status = cluster.cluster_status().await.unwrap();
    let spread = plan(&status, &name, &marker, 7);
    assert_eq!(spread.risky, vec![(a, 3), (b, 2), (c, 2)]);
    assert_eq!(spread.unallocated, 0);
    // A budget below what the nodes hold hands out nothing and takes nothing back.
    assert_eq!(
        plan(&status, &name, &marker, 2).risky,
        vec![(a, 3), (b, 0), (c, 1)]
    );
    // No risky node: the whole budget is unallocated.
    let none: ResourceSet = "canary=1".parse().unwrap();
    let spread = plan(&status, &name, &none, 7);
    assert!(spread.risky.is_empty());
    assert_eq!(spread.unallocated, 7);
    assert_eq!(spread.safe, vec![a, b, c]);
}

#[tokio::test]
async fn follow_gives_a_joining_safe_node_its_capacity_and_the_waiting_task_runs() {
    let cluster = InMemoryCluster::new(Mode::Manual);
    let safe = cluster.add_node("cpu=1");
    cluster.add_node("cpu=8,spot=1");
    // 4 tasks, 50%: 2 on spot, 1 on the safe node, 1 waits for room.
    let cap = ExposureCap::create(cluster.clone(), "batch", "spot", 4, 50)
        .await
        .unwrap();
    let follower = cap.follow().await.unwrap();
    let tasks = cluster
        .submit(vec![task("cpu=1", &cap.spec()); 4])
        .await
        .unwrap();
    let waiting: Vec<TaskId> = tasks
        .iter()
        .copied()
        .filter(|t| cluster.node_of(*t).is_none())
        .collect();
    assert_eq!(waiting.len(), 1);
    assert_eq!(running_on(&cluster, &tasks, &[safe]).await, vec![1]);

    let joined = cluster.add_node("cpu=1");
    // The follower hears of the node from the event feed and gives it its capacity.
    assert_eq!(testing::all_running(&cluster, &waiting).await, vec![joined]);
    follower.stop();
}

#[tokio::test]
async fn a_spread_is_one_batch_of_what_differs() {
    let inner = InMemoryCluster::new(Mode::Manual);
    inner.add_node("cpu=4");
    inner.add_node("cpu=4,spot=1");
    let audit = Audit::new(inner.clone());
    let cap = ExposureCap::create(audit.clone(), "svc", "spot", 4, 25)
        .await
        .unwrap();
    let batches = audit.batches();
    assert_eq!(batches.len(), 1, "one all-or-none batch");
    assert_eq!(batches[0].len(), 2, "the safe node and the spot node");
    // Nothing changed: nothing is sent.
    cap.spread().await.unwrap();
    assert_eq!(audit.batches().len(), 1);
    // The conveniences go through the decorator's `set_resources` too.
    cap.dissolve().await.unwrap();
    assert_eq!(audit.batches().len(), 2);
    // And what it does not override reaches the cluster underneath.
    assert_eq!(audit.cluster_status().await.unwrap().nodes.len(), 2);
}

#[tokio::test]
async fn without_the_cap_the_same_job_crowds_onto_the_spot_node() {
    // The control of `the_cap_holds_where_the_risky_node_has_the_most_room`: the same
    // cluster and job, no spec.
    let cluster = InMemoryCluster::new(Mode::Manual);
    let spot = cluster.add_node("cpu=16,spot=1");
    let s1 = cluster.add_node("cpu=4");
    let s2 = cluster.add_node("cpu=4");
    let tasks = cluster
        .submit(vec![task("cpu=1", &ResourceSpec::new()); 10])
        .await
        .unwrap();
    let on = running_on(&cluster, &tasks, &[spot, s1, s2]).await;
    assert!(on[0] > 2, "the scheduler alone put {on:?} on spot, s1, s2");
}
