//! End to end: the first set of scheduling libraries on a real [`LocalCluster`] (a real head
//! and real workers talking gRPC on loopback), one test per policy, each checking the policy's
//! property: co-location and data locality, anti-affinity, load balancing (static and
//! dynamic), DAG order and mutual exclusion, queues (release and weighted fair shares),
//! resource locking, bin packing.
//!
//! Waits are `escher_esl::testing`'s, an ESL author's harness: each is bounded by
//! [`testing::LIMIT`], and a wait for a state listens to the cluster's events instead of
//! polling; nothing asserts speed. Order is checked with the head's own timestamps (a task's
//! start against its predecessors' ends).
//!
//! [`LocalCluster`]: escher::LocalCluster

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use escher::esl::testing::{self, LIMIT, all_running, cancel, within};
use escher::esl::{
    Affinity, AntiAffinity, BinPacking, Dag, DataLocality, Domain, FairQueues, LeastLoaded,
    LoadBalance, Lock, Queue, ResourceSpec, Semaphore,
};
use escher::types::{
    Amount, Capacity, NodeId, NodeSpec, ResourceName, ResourceSet, TaskId, TaskInfo, TaskState,
};
use escher::{Client, Functions, LocalCluster, Task};

/// How long a `hold` task runs unless cancelled: far longer than any test.
const HOLD_MS: u64 = 120_000;

/// `where`: the node it runs on; `hold(ms)`: sleeps, then its node.
fn functions() -> Functions {
    Functions::new()
        .typed_function("where", |ctx, ()| async move {
            Ok::<_, String>(ctx.node_id().0)
        })
        .typed_function("hold", |ctx, ms: u64| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok::<_, String>(ctx.node_id().0)
        })
}

async fn start(workers: usize) -> (LocalCluster, Client) {
    let cluster = within(
        "starting the cluster",
        LocalCluster::builder()
            .functions(functions())
            .workers(workers)
            .grace(Duration::from_secs(1))
            .start(),
    )
    .await
    .expect("the local cluster starts");
    let client = within("connecting", cluster.client())
        .await
        .expect("the client connects");
    (cluster, client)
}

fn set(text: &str) -> ResourceSet {
    text.parse().expect("a valid resource set")
}

fn where_task(spec: &ResourceSpec) -> Task {
    spec.apply(Task::function_typed("where", &()).resources_str("cpu=1"))
}

fn hold_task(resources: &str, spec: &ResourceSpec) -> Task {
    spec.apply(Task::function_typed("hold", &HOLD_MS).resources_str(resources))
}

/// Submits one task (the harness takes built specs).
async fn submit(client: &Client, task: Task) -> TaskId {
    testing::submit(client, vec![task.build().expect("a valid task")]).await[0]
}

/// The node a finished `where`/`hold` task returned.
async fn node_of(client: &Client, task: TaskId) -> NodeId {
    let node: u64 = within("result", client.get_typed(task, None))
        .await
        .unwrap_or_else(|e| panic!("task {task}: {e}"));
    NodeId(node)
}

async fn info(client: &Client, task: TaskId) -> TaskInfo {
    client.task_info(task).await.expect("task_info")
}

async fn state(client: &Client, task: TaskId) -> TaskState {
    info(client, task).await.status.state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_join_their_leader_and_readers_find_their_data() {
    let (cluster, client) = start(3).await;
    let nodes = cluster.nodes();

    // Affinity: followers submitted before the leader wait for it, then join it.
    let mut group = Affinity::group(client.clone(), "team").unwrap();
    let leader_spec = group.next_spec();
    let mut followers = Vec::new();
    for _ in 0..3 {
        followers.push(submit(&client, where_task(&group.next_spec())).await);
    }
    let leader = submit(&client, where_task(&leader_spec)).await;
    let home = node_of(&client, leader).await;
    for f in followers {
        assert_eq!(node_of(&client, f).await, home, "follower {f}");
    }
    group.dissolve().await.unwrap();

    // Data locality: registered data, and data produced by a task.
    let data = DataLocality::new(client.clone());
    data.register("chunk-7", nodes[2]).await.unwrap();
    for _ in 0..3 {
        let spec = DataLocality::<Client>::consumer("chunk-7").unwrap();
        let reader = submit(&client, where_task(&spec)).await;
        assert_eq!(node_of(&client, reader).await, nodes[2]);
    }
    let consumer = DataLocality::<Client>::consumer("out-1").unwrap();
    let readers = [
        submit(&client, where_task(&consumer)).await,
        submit(&client, where_task(&consumer)).await,
    ];
    let producer_spec = DataLocality::<Client>::produce("out-1").unwrap();
    let producer = submit(&client, where_task(&producer_spec)).await;
    let made_on = node_of(&client, producer).await;
    let made_at = info(&client, producer).await.finished_at_ms.unwrap();
    for r in readers {
        assert_eq!(node_of(&client, r).await, made_on);
        assert!(
            info(&client, r).await.started_at_ms.unwrap() >= made_at,
            "after the data"
        );
    }
    data.forget("chunk-7").await.unwrap();
    data.forget("out-1").await.unwrap();
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anti_affine_members_land_on_distinct_nodes() {
    let (cluster, client) = start(3).await;
    let mut group = AntiAffinity::create(client.clone(), "replicas", 3, Domain::All)
        .await
        .unwrap();
    let mut members = Vec::new();
    for i in 0..3 {
        members.push(submit(&client, hold_task("cpu=1", &group.member(i).unwrap())).await);
    }
    let placed = within("placing", group.wait_placed(LIMIT)).await.unwrap();
    let running = all_running(&client, &members).await;
    assert_eq!(running, placed, "member i runs where ghost i is");
    let distinct: BTreeSet<NodeId> = running.iter().copied().collect();
    assert_eq!(distinct.len(), 3, "never two members on one node");
    within("settling", group.settle(&members, LIMIT))
        .await
        .unwrap();
    group.dissolve().await.unwrap();
    // A group larger than the cluster is refused rather than co-located.
    let err = AntiAffinity::create(client.clone(), "too-many", 4, Domain::All)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("eligible"), "{err}");
    cancel(&client, &members).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_is_spread_statically_and_by_utilisation() {
    let (cluster, client) = start(3).await;
    let nodes = cluster.nodes();

    // Static: one slot per node; three long tasks take one node each, a fourth waits.
    let lb = LoadBalance::create(client.clone(), "svc", 1, Domain::All)
        .await
        .unwrap();
    let mut spread = Vec::new();
    for _ in 0..3 {
        spread.push(submit(&client, hold_task("cpu=1", &lb.spec())).await);
    }
    let on: BTreeSet<NodeId> = all_running(&client, &spread).await.into_iter().collect();
    assert_eq!(on.len(), 3, "one per node");
    let fourth = submit(&client, hold_task("cpu=1", &lb.spec())).await;
    assert_eq!(state(&client, fourth).await, TaskState::Pending);
    cancel(&client, &spread).await;
    all_running(&client, &[fourth]).await;
    cancel(&client, &[fourth]).await;
    lb.dissolve().await.unwrap();

    // Dynamic: each task to the least-utilised node, one after the other, from an idle
    // cluster (the cancelled tasks' cpus are released asynchronously).
    testing::until(&client, "an idle cluster", async || {
        let status = client.cluster_status().await.unwrap();
        let idle = status
            .nodes
            .iter()
            .all(|n| n.resource("cpu").is_some_and(|c| c.used.is_zero()));
        idle.then_some(())
    })
    .await;
    let mut least = LeastLoaded::new(client.clone(), "cpu").unwrap();
    let mut placed = Vec::new();
    for _ in 0..6 {
        let spec = least.next_spec(Amount::ONE).await.unwrap();
        let t = submit(&client, hold_task("cpu=1", &spec)).await;
        all_running(&client, &[t]).await;
        placed.push(t);
    }
    let mut per_node: BTreeMap<NodeId, usize> = BTreeMap::new();
    for n in all_running(&client, &placed).await {
        *per_node.entry(n).or_default() += 1;
    }
    assert_eq!(
        per_node.into_iter().collect::<Vec<_>>(),
        nodes.iter().map(|n| (*n, 2)).collect::<Vec<_>>()
    );
    cancel(&client, &placed).await;
    least.dissolve().await.unwrap();
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dag_runs_in_order_and_a_mutex_excludes() {
    let (cluster, client) = start(2).await;
    let nodes = cluster.nodes();
    let mut dag = Dag::new(client.clone(), "etl").unwrap();
    dag.task("extract", &[])
        .unwrap()
        .task("clean", &["extract"])
        .unwrap()
        .task("stats", &["extract"])
        .unwrap()
        .task("report", &["clean", "stats"])
        .unwrap();
    let plan = dag.plan().unwrap();
    // Submitted last-first: the signals, not the submission order, give the order.
    let mut ids = BTreeMap::new();
    for (name, spec) in plan.order().iter().rev() {
        let task = spec.apply(Task::function_typed("hold", &50u64).resources_str("cpu=1"));
        ids.insert(name.clone(), submit(&client, task).await);
    }
    for (name, id) in &ids {
        let status = within(name, client.get(*id, None)).await.unwrap();
        assert_eq!(status.state, TaskState::Succeeded, "{name}: {status:?}");
    }
    for (name, id) in &ids {
        let started = info(&client, *id).await.started_at_ms.unwrap();
        for pred in plan.predecessors(name) {
            let done = info(&client, ids[pred]).await.finished_at_ms.unwrap();
            assert!(started >= done, "{name} started before {pred} finished");
        }
    }
    dag.cleanup().await.unwrap();

    // A mutex on one node: its holders never overlap.
    let mutex = Semaphore::mutex(client.clone(), "db", Domain::node(nodes[1]))
        .await
        .unwrap();
    let mut holders = Vec::new();
    for _ in 0..3 {
        let task = mutex
            .spec()
            .apply(Task::function_typed("hold", &50u64).resources_str("cpu=1"));
        holders.push(submit(&client, task).await);
    }
    let mut spans = Vec::new();
    for h in &holders {
        within("holder", client.get(*h, None)).await.unwrap();
        let i = info(&client, *h).await;
        assert_eq!(i.status.node, Some(nodes[1]));
        spans.push((i.started_at_ms.unwrap(), i.finished_at_ms.unwrap()));
    }
    spans.sort();
    for pair in spans.windows(2) {
        assert!(pair[1].0 >= pair[0].1, "overlapping holders: {spans:?}");
    }
    mutex.dissolve().await.unwrap();
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_release_what_they_are_told_and_share_by_weight() {
    let (cluster, client) = start(2).await;
    let nodes = cluster.nodes();
    let mut queue = Queue::create(client.clone(), "batch", Domain::node(nodes[0]))
        .await
        .unwrap();
    let mut queued = Vec::new();
    for _ in 0..5 {
        queued.push(
            queue
                .submit(hold_task("cpu=1", &ResourceSpec::new()))
                .await
                .unwrap(),
        );
    }
    for t in &queued {
        let i = info(&client, *t).await;
        assert_eq!(i.status.state, TaskState::Pending);
        assert!(i.status.reason.unwrap_or_default().contains("q-batch"));
    }
    queue.release(2).await.unwrap();
    all_running(&client, &queued[..2]).await;
    for t in &queued[2..] {
        assert_eq!(
            state(&client, *t).await,
            TaskState::Pending,
            "only the batch"
        );
    }
    let backlog = queue.backlog().await.unwrap();
    assert_eq!((backlog.pending, backlog.running), (3, 2));
    queue.close().await.unwrap();
    cancel(&client, &queued).await;

    // Weighted fair queueing: weights 1:2 over 3 slots on one node.
    let mut fair = FairQueues::new(vec![
        (
            Queue::create(client.clone(), "low", Domain::node(nodes[1]))
                .await
                .unwrap(),
            1,
        ),
        (
            Queue::create(client.clone(), "high", Domain::node(nodes[1]))
                .await
                .unwrap(),
            2,
        ),
    ])
    .unwrap();
    let mut per_queue = vec![Vec::new(), Vec::new()];
    for (i, ids) in per_queue.iter_mut().enumerate() {
        for _ in 0..4 {
            ids.push(
                fair.submit(i, hold_task("", &ResourceSpec::new()))
                    .await
                    .unwrap(),
            );
        }
    }
    assert_eq!(fair.rebalance(3).await.unwrap(), [1, 2]);
    all_running(&client, &per_queue[0][..1]).await;
    all_running(&client, &per_queue[1][..2]).await;
    let mut running = [0, 0];
    for (i, ids) in per_queue.iter().enumerate() {
        for t in ids {
            if state(&client, *t).await == TaskState::Running {
                running[i] += 1;
            }
        }
    }
    assert_eq!(running, [1, 2], "in proportion to the weights");
    for ids in &per_queue {
        cancel(&client, ids).await;
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locked_cpus_serve_only_the_tasks_inside_the_lock() {
    let (cluster, client) = start(2).await;
    let nodes = cluster.nodes();
    let lock = Lock::reserve(
        client.clone(),
        "bundle",
        set("cpu=4"),
        NodeSpec::Node(nodes[0]),
    )
    .await
    .unwrap();
    assert_eq!(
        within("lock", lock.wait_ready(LIMIT)).await.unwrap(),
        nodes[0]
    );
    // A plain task that may only run on the locked node waits for the lock's cpus.
    let only_a = ResourceName::new("only-a").unwrap();
    client
        .set_resource(
            only_a.clone(),
            Capacity::Unbounded,
            NodeSpec::Node(nodes[0]),
        )
        .await
        .unwrap();
    let pinned = ResourceSpec::new()
        .require(only_a.clone(), Amount::ONE)
        .unwrap();
    let outsider = submit(&client, where_task(&pinned)).await;
    let mut inside = Vec::new();
    for _ in 0..5 {
        inside.push(submit(&client, hold_task("", &lock.spec())).await);
    }
    let on = all_running(&client, &inside[..4]).await;
    assert!(
        on.iter().all(|n| *n == nodes[0]),
        "inside the bundle's node"
    );
    assert_eq!(
        state(&client, inside[4]).await,
        TaskState::Pending,
        "4 slots"
    );
    assert_eq!(
        state(&client, outsider).await,
        TaskState::Pending,
        "the cpus are locked"
    );
    lock.release().await.unwrap();
    assert_eq!(
        node_of(&client, outsider).await,
        nodes[0],
        "runs once released"
    );
    cancel(&client, &inside).await;
    client
        .delete_resource(only_a, NodeSpec::Node(nodes[0]))
        .await
        .unwrap();
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bin_packing_fills_nodes() {
    let (cluster, client) = start(3).await;
    let mut bp = BinPacking::new(client.clone(), "cpu").unwrap();
    let demands: Vec<ResourceSet> = ["cpu=3", "cpu=1", "cpu=2", "cpu=2", "cpu=1", "cpu=3"]
        .iter()
        .map(|d| set(d))
        .collect();
    let specs = bp.place_all(&demands).await.unwrap();
    let mut ids = Vec::new();
    for (d, s) in demands.iter().zip(&specs) {
        ids.push(submit(&client, hold_task(&d.to_string(), s)).await);
    }
    all_running(&client, &ids).await;
    let status = client.cluster_status().await.unwrap();
    for node in cluster.nodes() {
        let cpu = status.node(node).unwrap().resource("cpu").unwrap().clone();
        assert_eq!(cpu.available(), Some(Amount::ZERO), "node {node} is full");
    }
    cancel(&client, &ids).await;
    bp.dissolve().await.unwrap();
    cluster.shutdown().await;
}
