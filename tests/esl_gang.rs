//! End to end: gang scheduling in the thesis' three designs (AppSpace ghosts with timeouts,
//! the LibSpace serializing coordinator, the FrameSpace head-native reservation) and soft
//! constraints, on a real [`LocalCluster`] (a real head and three real workers, cpu=4 each,
//! talking gRPC on loopback).
//!
//! For every design, applications running as concurrent tokio tasks ask for gangs of three
//! bundles that together need more than the cluster has. Each must start all or none (every
//! holder runs when the gang is granted, and its members are all dispatched by the very
//! submit that sends them, each on its bundle's node), nothing may leak after timeouts or
//! releases (no application resource left, every cpu free), and every gang must eventually
//! complete. Every await is bounded; nothing asserts speed.
//!
//! [`LocalCluster`]: escher::LocalCluster

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use escher::esl::gang::{
    CoordinatorConfig, Gang, GangCoordinator, GangRequest, GangScheduler, GhostConfig, GhostGangs,
    NativeGangs,
};
use escher::esl::soft::{Method, SoftConstraints};
use escher::esl::testing;
use escher::esl::{EslError, ResourceSpec};
use escher::types::{
    Capacity, ClusterStatus, GangStrategy, NodeId, NodeSpec, ResourceSet, TaskId, TaskState,
};
use escher::{Client, Functions, LocalCluster, Task};

/// The bound on any single wait: twice the harness's, since gangs that contend run in turn.
const LIMIT: Duration = Duration::from_secs(60);

async fn within<F: Future>(what: &str, f: F) -> F::Output {
    testing::within_for(LIMIT, what, f).await
}

/// Three workers with cpu=4 (and memory=4096) each; `nap` sleeps its argument in ms.
async fn start() -> (LocalCluster, Client) {
    let functions = Functions::new().typed_function("nap", |ctx, ms: u64| async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok::<_, String>(ctx.node_id().0)
    });
    let cluster = within(
        "starting the cluster",
        LocalCluster::builder()
            .functions(functions)
            .workers(3)
            .start(),
    )
    .await
    .expect("the cluster starts");
    let client = within("connecting", cluster.client())
        .await
        .expect("the client connects");
    (cluster, client)
}

fn set(text: &str) -> ResourceSet {
    text.parse().expect("a valid resource set")
}

fn gang(name: &str, bundles: &[&str]) -> GangRequest {
    GangRequest::new(name, bundles.iter().map(|b| set(b)).collect()).expect("a valid gang")
}

/// Five gangs of three bundles in mixed shapes: 15 bundles, 40 cpus, on 12 cpus. The shapes
/// differ so that ghosts of different gangs can hold parts of each other's room.
fn competing(design: &str) -> Vec<GangRequest> {
    let shapes: [&[&str]; 3] = [
        &["cpu=4", "cpu=4", "cpu=4"],
        &["cpu=2", "cpu=2", "cpu=2"],
        &["cpu=3", "cpu=1", "cpu=4"],
    ];
    (0..5)
        .map(|i| gang(&format!("gang-{design}-{i}"), shapes[i % shapes.len()]))
        .collect()
}

async fn state(client: &Client, id: TaskId) -> TaskState {
    client.task_info(id).await.expect("task_info").status.state
}

async fn node(client: &Client, id: TaskId) -> Option<NodeId> {
    client.task_info(id).await.expect("task_info").status.node
}

/// One application: acquire, check the gang is held whole, run one member per bundle inside
/// it (all dispatched at once, each on its bundle's node), release.
async fn app<S: GangScheduler>(s: &S, client: &Client, req: &GangRequest) -> Result<(), EslError> {
    let gang: Gang = s.acquire(req).await?;
    let mut holder_nodes = Vec::new();
    for h in gang.holders() {
        assert_eq!(
            state(client, *h).await,
            TaskState::Running,
            "{} partial",
            req.name()
        );
        holder_nodes.push(node(client, *h).await);
    }
    let members: Vec<Task> = gang
        .members()
        .iter()
        .map(|spec| spec.apply(Task::function_typed("nap", &150u64)))
        .collect();
    let refs = client.submit_batch(members).await?;
    for (i, r) in refs.iter().enumerate() {
        let s = state(client, r.id()).await;
        assert_ne!(s, TaskState::Pending, "member {i} of {} waited", req.name());
        let holder = holder_nodes[i.min(holder_nodes.len() - 1)];
        assert_eq!(
            node(client, r.id()).await,
            holder,
            "member {i} off its bundle"
        );
    }
    let (done, _) = client.wait(&refs, refs.len(), Some(LIMIT)).await?;
    assert!(
        done.iter().all(|s| s.state == TaskState::Succeeded),
        "members of {}: {done:?}",
        req.name()
    );
    s.release(gang).await
}

/// Runs one application per gang at once; all must complete.
async fn all_complete<S, F>(client: &Client, design: &str, make: F)
where
    S: GangScheduler + 'static,
    F: Fn(usize) -> Arc<S>,
{
    let mut apps = tokio::task::JoinSet::new();
    for (i, req) in competing(design).into_iter().enumerate() {
        let (s, client) = (make(i), client.clone());
        apps.spawn(async move { app(s.as_ref(), &client, &req).await });
    }
    within("every gang completes", async {
        while let Some(out) = apps.join_next().await {
            out.expect("no application panicked")
                .expect("every gang is eventually held");
        }
    })
    .await;
}

/// What is left on the cluster: application resources (name@node) and cpu in use per node.
async fn leftovers(client: &Client) -> (Vec<String>, Vec<String>, ClusterStatus) {
    let status = within("status", client.cluster_status()).await.unwrap();
    let mut names = Vec::new();
    let mut cpu = Vec::new();
    for n in &status.nodes {
        names.extend(
            n.resources
                .iter()
                .filter(|r| !r.name.is_physical())
                .map(|r| format!("{}@{}", r.name, n.id)),
        );
        cpu.push(n.resource("cpu").map(|r| r.used.to_string()).unwrap());
    }
    cpu.sort();
    (names, cpu, status)
}

async fn assert_clean(client: &Client) {
    let (names, cpu, status) = leftovers(client).await;
    assert!(names.is_empty(), "gang resources left behind: {names:?}");
    assert_eq!(cpu, ["0", "0", "0"], "cpu still held");
    assert_eq!((status.pending_tasks, status.running_tasks), (0, 0));
}

/// Something else holding a whole node.
async fn blocker(client: &Client) -> TaskId {
    let task = Task::ghost().name("blocker").resources_str("cpu=4");
    client.submit(task).await.unwrap().id()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appspace_ghosts_time_out_without_leaks_and_all_gangs_complete() {
    let (cluster, client) = start().await;

    // A gang that cannot fit while a node is blocked: each attempt holds two bundles, times
    // out and is rolled back; after the last attempt nothing of it remains.
    let other = blocker(&client).await;
    let config = GhostConfig {
        timeout: Duration::from_millis(300),
        max_attempts: 2,
        ..GhostConfig::default()
    };
    let ghosts = GhostGangs::new(client.clone(), config);
    let big = gang("gang-big", &["cpu=4", "cpu=4", "cpu=4"]);
    let err = within("timing out", ghosts.acquire(&big))
        .await
        .unwrap_err();
    assert!(matches!(err, EslError::Timeout { .. }), "{err}");
    assert_eq!(ghosts.rollbacks(), 2);
    let (names, cpu, _) = leftovers(&client).await;
    assert!(names.is_empty(), "{names:?}");
    assert_eq!(cpu, ["0", "0", "4"], "only the blocker holds anything");
    client.cancel([other]).await.unwrap();
    within("the gang once there is room", app(&ghosts, &client, &big))
        .await
        .unwrap();

    // Competing applications, each with its own seed.
    let made = std::sync::Mutex::new(Vec::new());
    all_complete(&client, "app", |i| {
        let config = GhostConfig {
            timeout: Duration::from_secs(1),
            max_attempts: 200,
            seed: i as u64,
            ..GhostConfig::default()
        };
        let g = Arc::new(GhostGangs::new(client.clone(), config));
        made.lock().unwrap().push(g.clone());
        g
    })
    .await;
    let rollbacks: u64 = made.lock().unwrap().iter().map(|g| g.rollbacks()).sum();
    println!("appspace: {rollbacks} rollbacks among the competing gangs");
    assert_clean(&client).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libspace_coordinator_serializes_and_all_gangs_complete() {
    let (cluster, client) = start().await;
    let coordinator = Arc::new(GangCoordinator::spawn(
        client.clone(),
        CoordinatorConfig::default(),
    ));
    all_complete(&client, "lib", |_| coordinator.clone()).await;
    assert_clean(&client).await;

    // A deadline on one gang rolls that gang back, and the queue goes on.
    let other = blocker(&client).await;
    let bounded = GangCoordinator::spawn(
        client.clone(),
        CoordinatorConfig {
            max_wait: Some(Duration::from_millis(300)),
            ..CoordinatorConfig::default()
        },
    );
    let big = gang("gang-lib-big", &["cpu=4", "cpu=4", "cpu=4"]);
    let err = within("timing out", bounded.acquire(&big))
        .await
        .unwrap_err();
    assert!(matches!(err, EslError::Timeout { .. }), "{err}");
    let (names, cpu, _) = leftovers(&client).await;
    assert!(names.is_empty(), "{names:?}");
    assert_eq!(cpu, ["0", "0", "4"]);
    client.cancel([other]).await.unwrap();
    within("after the blocker", app(&bounded, &client, &big))
        .await
        .unwrap();
    assert_clean(&client).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framespace_reservations_are_atomic_and_all_gangs_complete() {
    let (cluster, client) = start().await;

    // A reservation that does not fit holds nothing, and the head's timeout cancels it whole.
    let other = blocker(&client).await;
    let bundles = vec![set("cpu=4"), set("cpu=4"), set("cpu=4")];
    let r = client
        .reserve(
            "gang-res",
            bundles.clone(),
            GangStrategy::Spread,
            Some(Duration::from_millis(300)),
        )
        .await
        .unwrap();
    assert!(!r.placed());
    let (names, cpu, _) = leftovers(&client).await;
    assert!(names.is_empty(), "{names:?}");
    assert_eq!(cpu, ["0", "0", "4"], "nothing held partially");
    let err = within("ready", r.ready(&client, None)).await.unwrap_err();
    assert!(err.to_string().contains("cancelled"), "{err}");
    client.cancel([other]).await.unwrap();
    // A running ghost ends when its worker confirms; only then is its cpu free.
    within("the blocker ends", client.get(other, None))
        .await
        .unwrap();
    assert_clean(&client).await;

    // Placed whole, with the head's resources on every bundle's node while held.
    let r = client
        .reserve("gang-res", bundles, GangStrategy::StrictSpread, None)
        .await
        .unwrap();
    within("ready", r.ready(&client, Some(LIMIT)))
        .await
        .unwrap();
    let (names, cpu, _) = leftovers(&client).await;
    assert_eq!(
        names.len(),
        6,
        "gang-res.cpu and gang-res-I.cpu on 3 nodes: {names:?}"
    );
    assert_eq!(cpu, ["4", "4", "4"]);
    r.release(&client).await.unwrap();
    assert_clean(&client).await;

    let native = Arc::new(NativeGangs::new(client.clone(), None));
    all_complete(&client, "frame", |_| native.clone()).await;
    assert_clean(&client).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_constraints_fall_back_in_order() {
    let (cluster, client) = start().await;
    let fast_node = cluster.nodes()[1];
    client
        .set_resource("fast", Capacity::Unbounded, NodeSpec::Node(fast_node))
        .await
        .unwrap();
    let prefs: Vec<ResourceSpec> = ["gpu=1", "fast=1", ""]
        .iter()
        .map(|p| ResourceSpec {
            resources: set(p),
            ..ResourceSpec::default()
        })
        .collect();
    let task = Task::function_typed("nap", &50u64)
        .resources_str("cpu=1")
        .build()
        .unwrap();

    // The thesis: gpu=1 cannot start anywhere, is cancelled after the timeout, then fast=1.
    let thesis = SoftConstraints::new(client.clone(), Duration::from_millis(500));
    let placed = within("thesis method", thesis.submit(&task, &prefs))
        .await
        .unwrap();
    assert_eq!((placed.choice, placed.started), (1, true));
    assert_eq!(placed.abandoned.len(), 1);
    assert_eq!(
        state(&client, placed.abandoned[0]).await,
        TaskState::Cancelled
    );
    assert_eq!(node(&client, placed.task).await, Some(fast_node));

    // Checking what fits first: fast=1 directly, nothing abandoned.
    let fits = thesis.clone().method(Method::FitsNowFirst);
    let placed = within("fits-now method", fits.submit(&task, &prefs))
        .await
        .unwrap();
    assert_eq!((placed.choice, placed.abandoned.len()), (1, 0));
    assert_eq!(node(&client, placed.task).await, Some(fast_node));
    within("the nap", client.get(placed.task, None))
        .await
        .unwrap();
    cluster.shutdown().await;
}
