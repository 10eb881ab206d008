//! End to end: ephemeral resources over the real API, on a real [`LocalCluster`] (a real head
//! and real workers talking gRPC on loopback).
//!
//! Topics, in order: locality (a resource a task creates attracts the next task), infeasible
//! tasks and their reasons, concurrent updates, `NodeSpec::Match`, shrinking below use,
//! namespaces, the `escher` CLI inside a command task, and bad input on every call (the head
//! must refuse it, stay up and change nothing). Malformed wire messages that the typed client
//! cannot express are sent with the raw generated client.
//!
//! [`LocalCluster`]: escher::LocalCluster

mod common;

use std::time::Duration;

use common::{
    cluster, escher_bin, eventually, finished, resource, running, start, status, units, within,
};
use escher::client::ResourceUpdateExt;
use escher::types::{
    ClusterStatus, LogStream, Namespace, NodeId, NodeSpec, ResourceSet, ResourceUpdate, TaskId,
    TaskKind, TaskState, TaskSummary,
};
use escher::{Client, ClientError, Task};
use escher_proto::wire;
use escher_proto::wire::cluster_client::ClusterClient;

fn set(text: &str) -> ResourceSet {
    text.parse().expect("a valid resource set")
}

// ---- locality -------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_created_by_a_task_attracts_the_next_task() {
    let (cluster, client) = start(3).await;
    let nodes = cluster.nodes();
    for i in 0..6 {
        let name = format!("near-{i}");
        let marker = client
            .submit(Task::function_typed("mark_here", &name))
            .await
            .unwrap();
        let here: u64 = within("marker", client.get_typed(&marker, None))
            .await
            .unwrap();
        let here = NodeId(here);
        assert!(nodes.contains(&here));
        assert_eq!(finished(&client, &marker).await.node, Some(here));

        let follower = client
            .submit(Task::function_typed("where", &()).resource(name.as_str(), 1))
            .await
            .unwrap();
        let there: u64 = within("follower", client.get_typed(&follower, None))
            .await
            .unwrap();
        assert_eq!(NodeId(there), here, "follower of {name}");
        let s = status(&client).await;
        for n in &nodes {
            assert_eq!(
                resource(&s, *n, &name).is_some(),
                *n == here,
                "{name} exists only on node {here}"
            );
        }
    }
    cluster.shutdown().await;
}

// ---- infeasible tasks -----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_infeasible_task_says_why_and_runs_once_its_resource_appears() {
    let (cluster, client) = start(2).await;
    let t = client
        .submit(Task::function_typed("where", &()).resource("dataset-q", 2))
        .await
        .unwrap();
    let info = eventually("a pending reason", || async {
        let info = client.task_info(&t).await.unwrap();
        info.pending_reason.is_some().then_some(info)
    })
    .await;
    assert_eq!(info.status.state, TaskState::Pending);
    let why = info.pending_reason.unwrap();
    assert_eq!(why.resource.as_str(), "dataset-q");
    assert_eq!(why.requested.to_string(), "2");
    assert_eq!(why.best_total, None, "no node has it at all");
    assert!(why.message.contains("dataset-q"), "{}", why.message);

    let pending = client
        .list_tasks(Some(TaskState::Pending), None)
        .await
        .unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].id, t.id());
    let listed = pending[0].reason.as_deref().unwrap_or("");
    assert!(listed.contains("dataset-q"), "{listed}");

    // Too little of it is still infeasible, with the best total reported.
    let target = cluster.nodes()[1];
    client
        .set_resource("dataset-q", 1, NodeSpec::Node(target))
        .await
        .unwrap();
    let why = eventually("an updated reason", || async {
        let info = client.task_info(&t).await.unwrap();
        info.pending_reason
            .filter(|r| r.best_total.is_some())
            .map(|r| (info.status.state, r))
    })
    .await;
    assert_eq!(why.0, TaskState::Pending);
    assert_eq!(why.1.best_total, Some(units(1)));

    client
        .set_resource("dataset-q", 2, NodeSpec::Node(target))
        .await
        .unwrap();
    let ran: u64 = within("the task runs", client.get_typed(&t, None))
        .await
        .unwrap();
    assert_eq!(NodeId(ran), target);
    assert!(
        client
            .list_tasks(Some(TaskState::Pending), None)
            .await
            .unwrap()
            .is_empty()
    );
    cluster.shutdown().await;
}

/// A `memory` request larger than any node has is a limit no node can hold: the task stays
/// pending, and its reason names memory and the largest node's amount (what to change).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_memory_than_any_node_has_stays_pending_and_says_so() {
    let (cluster, client) = start(2).await;
    let status = status(&client).await;
    let largest = cluster
        .nodes()
        .iter()
        .filter_map(|n| resource(&status, *n, "memory"))
        .filter_map(|r| match r.total {
            escher_proto::Capacity::Finite(amount) => Some(amount),
            escher_proto::Capacity::Unbounded => None,
        })
        .max()
        .map(escher_proto::Capacity::Finite)
        .expect("the nodes report their memory");
    let t = client
        .submit(Task::command(["true"]).resources_str("memory=100000000"))
        .await
        .unwrap();
    let info = eventually("a pending reason", || async {
        let info = client.task_info(&t).await.unwrap();
        info.pending_reason.is_some().then_some(info)
    })
    .await;
    assert_eq!(info.status.state, TaskState::Pending);
    let why = info.pending_reason.unwrap();
    assert_eq!(why.resource.as_str(), "memory");
    assert_eq!(why.best_total, Some(largest), "{}", why.message);
    assert!(why.message.contains("memory"), "{}", why.message);
    cluster.shutdown().await;
}

// ---- concurrency ----------------------------------------------------------------------------

async fn adjust_from_many_clients(url: &str, node: NodeId, name: &'static str, deltas: &[i32]) {
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let client = Client::connect(url).await.unwrap();
        let deltas = deltas.to_vec();
        clients.spawn(async move {
            let mut calls = tokio::task::JoinSet::new();
            for delta in deltas {
                let client = client.clone();
                calls.spawn(async move {
                    client
                        .adjust_resource(name, delta, NodeSpec::Node(node))
                        .await
                });
            }
            while let Some(done) = calls.join_next().await {
                assert_eq!(done.unwrap().unwrap(), vec![node]);
            }
        });
    }
    within("concurrent adjustments", async {
        while let Some(done) = clients.join_next().await {
            done.unwrap();
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_adjustments_are_never_lost() {
    let (cluster, client) = start(2).await;
    let node = cluster.nodes()[0];

    adjust_from_many_clients(cluster.head_url(), node, "counter", &[1; 50]).await;
    let s = status(&client).await;
    assert_eq!(resource(&s, node, "counter").unwrap().total, units(400));

    // +2 and -1, 25 of each per client, all in flight at once: they may land in any order, so
    // start from a floor that no order can take below zero (at most 200 decrements).
    client
        .set_resource("mixed", 200, NodeSpec::Node(node))
        .await
        .unwrap();
    let deltas: Vec<i32> = (0..50).map(|i| if i % 2 == 0 { 2 } else { -1 }).collect();
    adjust_from_many_clients(cluster.head_url(), node, "mixed", &deltas).await;
    let s = status(&client).await;
    assert_eq!(
        resource(&s, node, "mixed").unwrap().total,
        units(200 + 8 * 25)
    );
    // The other node was never touched.
    assert_eq!(resource(&s, cluster.nodes()[1], "counter"), None);
    cluster.shutdown().await;
}

// ---- NodeSpec::Match ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn match_selects_nodes_by_available_resources() {
    let cluster = within(
        "start",
        cluster()
            .no_workers()
            .worker(set("accel=1"))
            .worker(set("accel=1"))
            .worker(set("cpu=2"))
            .start(),
    )
    .await
    .unwrap();
    let client = cluster.client().await.unwrap();
    let nodes = cluster.nodes();
    let accel_nodes = &nodes[..2];

    // Occupy one node's accelerator.
    let busy = client
        .submit(Task::function_typed("nap", &30_000u64).resource("accel", 1))
        .await
        .unwrap();
    let taken = running(&client, &busy).await.node.unwrap();
    assert!(accel_nodes.contains(&taken));
    let free = *accel_nodes.iter().find(|n| **n != taken).unwrap();

    let changed = client
        .set_resource(
            "free-accel",
            1,
            NodeSpec::Match {
                resources: set("accel=1"),
                num_nodes: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(changed, vec![free], "the busy node is skipped");
    let s = status(&client).await;
    assert!(resource(&s, free, "free-accel").is_some());
    assert!(resource(&s, taken, "free-accel").is_none());

    // num_nodes takes the first matches in node id order; an empty match takes every node.
    let changed = client
        .set_resource(
            "first",
            1,
            NodeSpec::Match {
                resources: set("cpu=2"),
                num_nodes: Some(1),
            },
        )
        .await
        .unwrap();
    assert_eq!(changed, vec![nodes[0]]);
    let changed = client
        .set_resource(
            "everywhere",
            "unbounded",
            NodeSpec::Match {
                resources: ResourceSet::new(),
                num_nodes: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(changed, nodes);
    // Nothing matches a resource no node has: nothing changes, and that is not an error.
    let changed = client
        .set_resource(
            "nowhere",
            1,
            NodeSpec::Match {
                resources: set("no-such-thing=1"),
                num_nodes: None,
            },
        )
        .await
        .unwrap();
    assert!(changed.is_empty());

    // Once the accelerator is free again, both accelerator nodes match.
    client.cancel([&busy]).await.unwrap();
    finished(&client, &busy).await;
    let changed = client
        .set_resource(
            "free-accel",
            2,
            NodeSpec::Match {
                resources: set("accel=1"),
                num_nodes: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(changed, accel_nodes.to_vec());
    cluster.shutdown().await;
}

// ---- shrinking below use --------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shrinking_below_use_keeps_holders_and_admits_nothing_new() {
    let (cluster, client) = start(1).await;
    let node = cluster.nodes()[0];
    client
        .set_resource("slots", 2, NodeSpec::Node(node))
        .await
        .unwrap();
    let holders = client
        .submit_batch((0..2).map(|_| Task::ghost().resource("slots", 1)))
        .await
        .unwrap();
    for h in &holders {
        running(&client, h).await;
    }

    client
        .set_resource("slots", 1, NodeSpec::Node(node))
        .await
        .unwrap();
    let s = status(&client).await;
    let slots = resource(&s, node, "slots").unwrap();
    assert_eq!(slots.total, units(1));
    assert_eq!(
        slots.used.to_string(),
        "2",
        "running tasks keep what they hold"
    );
    assert_eq!(slots.shortfall().to_string(), "1");
    for h in &holders {
        assert_eq!(
            client.task_info(h).await.unwrap().status.state,
            TaskState::Running
        );
    }

    let newcomer = client
        .submit(Task::function_typed("where", &()).resource("slots", 1))
        .await
        .unwrap();
    // One holder leaves: use (1) is not under the capacity (1) yet.
    client.cancel([&holders[0]]).await.unwrap();
    assert_eq!(
        finished(&client, &holders[0]).await.state,
        TaskState::Cancelled
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        client.task_info(&newcomer).await.unwrap().status.state,
        TaskState::Pending
    );
    let s = status(&client).await;
    assert_eq!(resource(&s, node, "slots").unwrap().used.to_string(), "1");

    // The other leaves: the newcomer runs.
    client.cancel([&holders[1]]).await.unwrap();
    let done = finished(&client, &newcomer).await;
    assert_eq!(done.state, TaskState::Succeeded, "{done:?}");

    // Deleting a resource in use behaves the same: it goes when its last holder ends.
    let holder = client
        .submit(Task::ghost().resource("slots", 1))
        .await
        .unwrap();
    running(&client, &holder).await;
    client
        .delete_resource("slots", NodeSpec::Node(node))
        .await
        .unwrap();
    let s = status(&client).await;
    let slots = resource(&s, node, "slots").expect("still held, still shown");
    assert_eq!(slots.used.to_string(), "1");
    client.cancel([&holder]).await.unwrap();
    finished(&client, &holder).await;
    eventually("the deleted resource disappears", || async {
        resource(&status(&client).await, node, "slots")
            .is_none()
            .then_some(())
    })
    .await;
    cluster.shutdown().await;
}

// ---- namespaces -----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_keep_applications_apart() {
    let (cluster, client) = start(2).await;
    let (n1, n2) = (cluster.nodes()[0], cluster.nodes()[1]);
    let a = client
        .clone()
        .with_namespace(Namespace::new("app-a").unwrap());
    let b = client
        .clone()
        .with_namespace(Namespace::new("app-b").unwrap());

    a.set_resource("queue", 1, NodeSpec::Node(n1))
        .await
        .unwrap();
    b.set_resource("queue", 1, NodeSpec::Node(n2))
        .await
        .unwrap();
    let s = status(&client).await;
    assert!(resource(&s, n1, "app-a/queue").is_some(), "{s:?}");
    assert!(resource(&s, n2, "app-b/queue").is_some(), "{s:?}");
    assert!(resource(&s, n1, "queue").is_none() && resource(&s, n2, "queue").is_none());

    for _ in 0..2 {
        let ta = a
            .submit(Task::function_typed("where", &()).resource("queue", 1))
            .await
            .unwrap();
        let tb = b
            .submit(Task::function_typed("where", &()).resource("queue", 1))
            .await
            .unwrap();
        let on_a: u64 = within("a", a.get_typed(&ta, None)).await.unwrap();
        let on_b: u64 = within("b", b.get_typed(&tb, None)).await.unwrap();
        assert_eq!((NodeId(on_a), NodeId(on_b)), (n1, n2));
    }

    // A third application has no queue at all, whatever the others set.
    let c = client
        .clone()
        .with_namespace(Namespace::new("app-c").unwrap());
    let tc = c
        .submit(Task::function_typed("where", &()).resource("queue", 1))
        .await
        .unwrap();
    let why = eventually("app-c's reason", || async {
        client.task_info(&tc).await.unwrap().pending_reason
    })
    .await;
    assert_eq!(why.resource.as_str(), "app-c/queue");
    client.cancel([&tc]).await.unwrap();

    // A task of an application that marks its own node does so in its namespace, and a
    // follower of the same application finds the mark.
    let marker = a
        .submit(Task::function_typed("mark_here", &"warm".to_string()))
        .await
        .unwrap();
    let here: u64 = within("marker", a.get_typed(&marker, None)).await.unwrap();
    let s = status(&client).await;
    assert!(
        resource(&s, NodeId(here), "app-a/warm").is_some(),
        "the mark is qualified with the task's namespace: {s:?}"
    );
    let follower = a
        .submit(Task::function_typed("where", &()).resource("warm", 1))
        .await
        .unwrap();
    let there: u64 = within("follower", a.get_typed(&follower, None))
        .await
        .unwrap();
    assert_eq!(there, here);
    cluster.shutdown().await;
}

// ---- the escher CLI inside a task ------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_task_uses_the_cli_to_mark_its_node() {
    let bin = escher_bin();
    let (cluster, client) = start(3).await;
    let marker = client
        .submit(
            Task::command([
                "sh",
                "-c",
                r#""$ESCHER_BIN" resource set here-x unbounded --local"#,
            ])
            .env("ESCHER_BIN", bin.to_str().unwrap()),
        )
        .await
        .unwrap();
    let done = finished(&client, &marker).await;
    let stderr = client.logs(&marker, LogStream::Stderr).await.unwrap();
    assert_eq!(
        done.state,
        TaskState::Succeeded,
        "{done:?}; stderr: {}",
        String::from_utf8_lossy(&stderr)
    );
    let node = done.node.unwrap();
    let stdout = client.logs(&marker, LogStream::Stdout).await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&stdout),
        format!("changed node {node}\n")
    );

    for _ in 0..3 {
        let follower = client
            .submit(Task::function_typed("where", &()).resource("here-x", 1))
            .await
            .unwrap();
        let ran: u64 = within("follower", client.get_typed(&follower, None))
            .await
            .unwrap();
        assert_eq!(NodeId(ran), node);
    }

    // In a namespace, the CLI inside the task qualifies the name as the head qualified the
    // task's requests (the worker passes ESCHER_NAMESPACE), so the application's follower
    // finds it.
    let app = client
        .clone()
        .with_namespace(Namespace::new("cli-app").unwrap());
    let marker = app
        .submit(
            Task::command([
                "sh",
                "-c",
                r#""$ESCHER_BIN" resource set here-y unbounded --local"#,
            ])
            .env("ESCHER_BIN", bin.to_str().unwrap()),
        )
        .await
        .unwrap();
    let done = finished(&client, &marker).await;
    assert_eq!(done.state, TaskState::Succeeded, "{done:?}");
    let node = done.node.unwrap();
    let s = status(&client).await;
    assert!(resource(&s, node, "cli-app/here-y").is_some(), "{s:?}");
    let follower = app
        .submit(Task::function_typed("where", &()).resource("here-y", 1))
        .await
        .unwrap();
    let ran: u64 = within("namespaced follower", app.get_typed(&follower, None))
        .await
        .unwrap();
    assert_eq!(NodeId(ran), node);

    // Outside a task, --local is refused with a message (and a failing exit status).
    let out = within(
        "escher outside a task",
        tokio::process::Command::new(&bin)
            .args(["--head", cluster.head_url()])
            .args(["resource", "set", "outside", "1", "--local"])
            .env_remove("ESCHER_TASK_ID")
            .output(),
    )
    .await
    .unwrap();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("--local"), "{text}");
    cluster.shutdown().await;
}

// ---- bad input ------------------------------------------------------------------------------

/// What bad input must leave exactly as it was.
async fn snapshot(client: &Client) -> (ClusterStatus, Vec<TaskSummary>) {
    let tasks = within("list_tasks", client.list_tasks(None, None))
        .await
        .unwrap();
    (status(client).await, tasks)
}

/// The raw generated client, for messages the typed client cannot express, calling with the
/// cluster's admin token.
macro_rules! raw {
    ($cluster:expr) => {{
        let channel = within(
            "raw connect",
            tonic::transport::Endpoint::from_shared($cluster.head_url().to_string())
                .unwrap()
                .connect(),
        )
        .await
        .unwrap();
        let token = escher_proto::access::Bearer::new($cluster.admin_token());
        ClusterClient::with_interceptor(channel, token).max_encoding_message_size(256 * 1024 * 1024)
    }};
}

/// The gRPC code of a raw call's error, by name (`InvalidArgument`, `NotFound`, ...), and its
/// message; fails the test if the call succeeded.
macro_rules! code {
    ($call:expr $(,)?) => {
        match $call {
            Ok(reply) => panic!("the head accepted a malformed request: {reply:?}"),
            Err(status) => (format!("{:?}", status.code()), status.message().to_string()),
        }
    };
}

/// The cluster still runs tasks.
async fn still_works(client: &Client) {
    let t = client
        .submit(Task::function_typed("where", &()))
        .await
        .unwrap();
    within("a task after bad input", client.get_typed::<u64>(&t, None))
        .await
        .unwrap();
}

fn invalid_argument(err: ClientError, mentions: &str) {
    match &err {
        ClientError::InvalidArgument(text) => {
            assert!(
                text.contains(mentions),
                "{text:?} does not mention {mentions:?}"
            )
        }
        other => panic!("expected InvalidArgument mentioning {mentions:?}, got {other:?}"),
    }
}

fn not_found(err: ClientError, mentions: &str) {
    match &err {
        ClientError::NotFound(text) => {
            assert!(
                text.contains(mentions),
                "{text:?} does not mention {mentions:?}"
            )
        }
        other => panic!("expected NotFound mentioning {mentions:?}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_names_and_physical_resources_are_refused() {
    let (cluster, client) = start(1).await;
    let node = cluster.nodes()[0];
    let before = snapshot(&client).await;

    // The typed client refuses malformed names before sending.
    let err = client
        .set_resource("b@d", 1, NodeSpec::Node(node))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Invalid(_)), "{err:?}");
    assert!(err.to_string().contains("b@d"), "{err}");
    let err = client
        .submit(Task::command(["true"]).resources_str("b@d=1"))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Usage(_)), "{err:?}");

    // The head refuses them too when they arrive anyway.
    let mut rpc = raw!(cluster);
    let spec = wire::TaskSpec {
        name: "t".into(),
        kind: Some(wire::task_spec::Kind::Command(wire::CommandTask {
            argv: vec!["true".into()],
            ..Default::default()
        })),
        resources: vec![wire::ResourceAmount {
            name: "b@d".into(),
            amount: 10_000,
        }],
        ..Default::default()
    };
    let (c, m) = code!(
        rpc.submit(wire::SubmitRequest {
            tasks: vec![spec],
            namespace: String::new(),
            key: None,
        })
        .await,
    );
    assert_eq!(c, "InvalidArgument");
    assert!(m.contains("b@d"), "{m}");
    let update = wire::ResourceUpdate {
        name: "b@d".into(),
        op: Some(wire::CapacityOp {
            op: Some(wire::capacity_op::Op::Adjust(10_000)),
        }),
        target: Some(wire::NodeSpec {
            target: Some(wire::node_spec::Target::Node(node.0)),
        }),
    };
    let (c, m) = code!(
        rpc.set_resources(wire::SetResourcesRequest {
            updates: vec![update],
            ..Default::default()
        })
        .await,
    );
    assert_eq!(c, "InvalidArgument");
    assert!(m.contains("b@d"), "{m}");

    // Physical resources are the workers' to report.
    for name in ["cpu", "memory", "gpu", "mig.1g.5gb", "gpu.0"] {
        let err = client
            .set_resource(name, 8, NodeSpec::Node(node))
            .await
            .unwrap_err();
        invalid_argument(err, name);
        let err = client
            .adjust_resource(name, 1, NodeSpec::Node(node))
            .await
            .unwrap_err();
        invalid_argument(err, "physical");
    }
    let err = client
        .delete_resource("cpu", NodeSpec::Node(node))
        .await
        .unwrap_err();
    invalid_argument(err, "cpu");
    // ...also from a namespaced application, in a ghost's creates, and in a hook.
    let ns = client
        .clone()
        .with_namespace(Namespace::new("app").unwrap());
    let err = ns
        .set_resource("cpu", 8, NodeSpec::Node(node))
        .await
        .unwrap_err();
    invalid_argument(err, "cpu");
    let err = client
        .submit(Task::ghost().creates("memory", 1))
        .await
        .unwrap_err();
    invalid_argument(err, "memory");
    let hook = ResourceUpdate::set("cpu", 64, NodeSpec::Local).unwrap();
    let err = client
        .submit(Task::function_typed("noop", &()).on_success(hook))
        .await
        .unwrap_err();
    invalid_argument(err, "cpu");

    assert_eq!(
        snapshot(&client).await,
        before,
        "refused calls change nothing"
    );
    still_works(&client).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_nodes_and_tasks_are_not_found() {
    let (cluster, client) = start(1).await;
    let node = cluster.nodes()[0];
    let pending = client
        .submit(Task::function_typed("noop", &()).resource("never-set", 1))
        .await
        .unwrap();
    let before = snapshot(&client).await;
    let ghost_node = NodeId(999);
    let ghost_task = TaskId(999_999);

    let err = client
        .set_resource("x", 1, NodeSpec::Node(ghost_node))
        .await
        .unwrap_err();
    not_found(err, "999");
    // A batch is all or none: the good update before the bad one is not applied either.
    let err = client
        .set_resources(vec![
            ResourceUpdate::set("good", 1, NodeSpec::Node(node)).unwrap(),
            ResourceUpdate::set("bad", 1, NodeSpec::Node(ghost_node)).unwrap(),
        ])
        .await
        .unwrap_err();
    not_found(err, "999");

    let err = within("get", client.get(ghost_task, None))
        .await
        .unwrap_err();
    not_found(err, "999999");
    let err = client.cancel([ghost_task]).await.unwrap_err();
    not_found(err, "999999");
    // Cancel is all or none as well: the known task stays pending.
    let err = client.cancel([pending.id(), ghost_task]).await.unwrap_err();
    not_found(err, "999999");
    let err = client.task_info(ghost_task).await.unwrap_err();
    not_found(err, "999999");
    let err = within("logs", client.logs(ghost_task, LogStream::Stdout))
        .await
        .unwrap_err();
    not_found(err, "999999");
    let err = within(
        "wait",
        client.wait([pending.id(), ghost_task], 1, Some(Duration::from_secs(5))),
    )
    .await
    .unwrap_err();
    not_found(err, "999999");

    assert_eq!(snapshot(&client).await, before);
    client.cancel([&pending]).await.unwrap();
    still_works(&client).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adjusting_below_zero_is_refused_and_changes_nothing() {
    let (cluster, client) = start(1).await;
    let node = cluster.nodes()[0];
    client
        .set_resource("counter", 1, NodeSpec::Node(node))
        .await
        .unwrap();
    let before = snapshot(&client).await;

    let err = client
        .adjust_resource("counter", -2, NodeSpec::Node(node))
        .await
        .unwrap_err();
    invalid_argument(err, "negative");
    // A resource that does not exist counts as zero.
    let err = client
        .adjust_resource("absent", -1, NodeSpec::Node(node))
        .await
        .unwrap_err();
    invalid_argument(err, "negative");
    // In a batch, the whole batch is refused.
    let err = client
        .set_resources(vec![
            ResourceUpdate::set("other", 5, NodeSpec::Node(node)).unwrap(),
            ResourceUpdate::adjust("counter", 1, NodeSpec::Node(node)).unwrap(),
            ResourceUpdate::adjust("counter", -3, NodeSpec::Node(node)).unwrap(),
        ])
        .await
        .unwrap_err();
    invalid_argument(err, "counter");

    let after = snapshot(&client).await;
    assert_eq!(after, before);
    assert_eq!(resource(&after.0, node, "counter").unwrap().total, units(1));
    assert!(resource(&after.0, node, "other").is_none());

    // Down to exactly zero deletes it.
    client
        .adjust_resource("counter", -1, NodeSpec::Node(node))
        .await
        .unwrap();
    assert!(resource(&status(&client).await, node, "counter").is_none());
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_messages_are_refused_and_the_cluster_keeps_working() {
    let (cluster, client) = start(1).await;
    let before = snapshot(&client).await;
    let huge = vec![0u8; 80 * 1024 * 1024];

    // The typed client refuses to send more than the 64 MiB message limit, and says so.
    let err = within(
        "oversized submit",
        client.submit(Task::function("echo", huge.clone())),
    )
    .await
    .unwrap_err();
    match &err {
        ClientError::MessageTooLarge { call, size, limit } => {
            assert_eq!(*call, "submit");
            assert!(*size > huge.len(), "{err:?}");
            assert_eq!(*limit, escher::client::MAX_MESSAGE_BYTES);
        }
        other => panic!("expected MessageTooLarge, got {other:?}"),
    }
    assert!(err.to_string().contains("by reference"), "{err}");
    assert!(!err.is_retryable(), "{err:?}");

    // The head refuses it when a client sends it anyway.
    let mut rpc = raw!(cluster);
    let spec = wire::TaskSpec {
        name: "huge".into(),
        kind: Some(wire::task_spec::Kind::Function(wire::FunctionTask {
            name: "echo".into(),
            args: huge.into(),
        })),
        ..Default::default()
    };
    let (c, m) = code!(
        within(
            "raw oversized submit",
            rpc.submit(wire::SubmitRequest {
                tasks: vec![spec],
                namespace: String::new(),
                key: None,
            }),
        )
        .await,
    );
    assert!(c == "OutOfRange" || c == "ResourceExhausted", "{c}: {m}");
    assert!(m.contains("too large"), "{m}");

    assert_eq!(snapshot(&client).await, before);
    still_works(&client).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_specs_and_local_outside_a_task_are_refused() {
    let (cluster, client) = start(1).await;
    let node = cluster.nodes()[0];
    // A task that shows its credential (which stops naming a node once it ends).
    let done = client
        .submit(Task::command([
            "sh",
            "-c",
            "printf %s \"$ESCHER_TASK_TOKEN\"",
        ]))
        .await
        .unwrap();
    finished(&client, &done).await;
    let before = snapshot(&client).await;

    // A spec built by hand with an empty command line.
    let mut spec = Task::command(["true"]).build().unwrap();
    spec.kind = TaskKind::Command {
        argv: Vec::new(),
        env: Vec::new(),
        cwd: None,
    };
    let err = client.submit(spec).await.unwrap_err();
    invalid_argument(err, "argv");
    // An empty function name.
    let mut spec = Task::function_typed("noop", &()).build().unwrap();
    spec.kind = TaskKind::Function {
        name: String::new(),
        args: Default::default(),
    };
    let err = client.submit(spec).await.unwrap_err();
    assert!(matches!(err, ClientError::InvalidArgument(_)), "{err:?}");
    // A batch with one bad spec submits none.
    let good = Task::command(["true"]).build().unwrap();
    let mut bad = good.clone();
    bad.kind = TaskKind::Command {
        argv: Vec::new(),
        env: Vec::new(),
        cwd: None,
    };
    let err = client.submit_batch([good, bad]).await.unwrap_err();
    assert!(matches!(err, ClientError::InvalidArgument(_)), "{err:?}");

    // Local from outside a task: the client refuses before sending...
    let err = client
        .set_resource("x", 1, NodeSpec::Local)
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Usage(_)), "{err:?}");
    assert!(err.to_string().contains("inside a running task"), "{err}");
    // ...and the head refuses it from a caller that is not a task (the admin here).
    let mut rpc = raw!(cluster);
    let local = || wire::SetResourcesRequest {
        updates: vec![wire::ResourceUpdate {
            name: "x".into(),
            op: Some(wire::CapacityOp {
                op: Some(wire::capacity_op::Op::Adjust(10_000)),
            }),
            target: Some(wire::NodeSpec {
                target: Some(wire::node_spec::Target::Local(wire::Local {})),
            }),
        }],
        namespace: String::new(),
        key: None,
    };
    let (c, m) = code!(rpc.set_resources(local()).await);
    assert_eq!(c, "InvalidArgument", "{m}");
    assert!(m.contains("--local"), "{m}");
    // The credential of a task that has ended is refused: it acts for nothing now.
    let token = String::from_utf8(client.logs(&done, LogStream::Stdout).await.unwrap()).unwrap();
    assert!(token.starts_with("escher-task-"), "{token:?}");
    let channel = tonic::transport::Endpoint::from_shared(cluster.head_url().to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut as_task =
        ClusterClient::with_interceptor(channel, escher_proto::access::Bearer::new(&token));
    let (c, m) = code!(as_task.set_resources(local()).await);
    assert_eq!(c, "Unauthenticated", "{m}");
    assert!(m.contains("only while that attempt runs"), "{m}");

    assert_eq!(snapshot(&client).await, before);
    assert!(resource(&before.0, node, "x").is_none());
    still_works(&client).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_wire_messages_are_refused() {
    let (cluster, client) = start(1).await;
    let node = cluster.nodes()[0];
    let known = client.submit(Task::command(["true"])).await.unwrap();
    finished(&client, &known).await;
    let before = snapshot(&client).await;
    let mut rpc = raw!(cluster);

    let command = || {
        Some(wire::task_spec::Kind::Command(wire::CommandTask {
            argv: vec!["true".into()],
            ..Default::default()
        }))
    };
    let submit = |spec: wire::TaskSpec| wire::SubmitRequest {
        tasks: vec![spec],
        namespace: String::new(),
        key: None,
    };
    let node_target = || {
        Some(wire::NodeSpec {
            target: Some(wire::node_spec::Target::Node(node.0)),
        })
    };
    let set_finite = |raw: u64| {
        Some(wire::CapacityOp {
            op: Some(wire::capacity_op::Op::Set(wire::Capacity {
                kind: Some(wire::capacity::Kind::Finite(raw)),
            })),
        })
    };
    let update = |op, target| wire::SetResourcesRequest {
        updates: vec![wire::ResourceUpdate {
            name: "r".into(),
            op,
            target,
        }],
        ..Default::default()
    };
    // The largest valid raw amount is 10^18 (10^14 units).
    let too_much = 1_000_000_000_000_000_001u64;

    let mut cases: Vec<(&str, (String, String), &str)> = Vec::new();
    // Submit: a spec without its kind; amounts above the maximum; a bad state in a hook.
    cases.push((
        "spec without kind",
        code!(rpc.submit(submit(wire::TaskSpec::default())).await),
        "kind",
    ));
    cases.push((
        "resource amount above the maximum",
        code!(
            rpc.submit(submit(wire::TaskSpec {
                kind: command(),
                resources: vec![wire::ResourceAmount {
                    name: "r".into(),
                    amount: too_much,
                }],
                ..Default::default()
            }))
            .await,
        ),
        "amount",
    ));
    cases.push((
        "hook without op",
        code!(
            rpc.submit(submit(wire::TaskSpec {
                kind: command(),
                on_success: vec![wire::ResourceUpdate {
                    name: "r".into(),
                    op: None,
                    target: node_target(),
                }],
                ..Default::default()
            }))
            .await,
        ),
        "op",
    ));
    cases.push((
        "ghost creating a capacity without kind",
        code!(
            rpc.submit(submit(wire::TaskSpec {
                kind: Some(wire::task_spec::Kind::Ghost(wire::GhostTask {
                    creates: vec![wire::ResourceCapacity {
                        name: "r".into(),
                        capacity: Some(wire::Capacity { kind: None }),
                    }],
                    ttl_ms: None,
                })),
                ..Default::default()
            }))
            .await,
        ),
        "kind",
    ));
    // SetResources: missing op, target, capacity kind; capacities and deltas out of range;
    // num_nodes of zero.
    cases.push((
        "update without op",
        code!(rpc.set_resources(update(None, node_target())).await),
        "op",
    ));
    cases.push((
        "update without target",
        code!(rpc.set_resources(update(set_finite(10_000), None)).await),
        "target",
    ));
    cases.push((
        "node spec without target",
        code!(
            rpc.set_resources(update(
                set_finite(10_000),
                Some(wire::NodeSpec { target: None }),
            ))
            .await,
        ),
        "target",
    ));
    cases.push((
        "capacity without kind",
        code!(
            rpc.set_resources(update(
                Some(wire::CapacityOp {
                    op: Some(wire::capacity_op::Op::Set(wire::Capacity { kind: None })),
                }),
                node_target(),
            ))
            .await,
        ),
        "kind",
    ));
    cases.push((
        "capacity above the maximum",
        code!(
            rpc.set_resources(update(set_finite(too_much), node_target()))
                .await,
        ),
        "",
    ));
    cases.push((
        "delta above the maximum",
        code!(
            rpc.set_resources(update(
                Some(wire::CapacityOp {
                    op: Some(wire::capacity_op::Op::Adjust(i64::MAX)),
                }),
                node_target(),
            ))
            .await,
        ),
        "",
    ));
    cases.push((
        "match with num_nodes 0",
        code!(
            rpc.set_resources(update(
                set_finite(10_000),
                Some(wire::NodeSpec {
                    target: Some(wire::node_spec::Target::Match(wire::Match {
                        resources: Vec::new(),
                        num_nodes: Some(0),
                    })),
                }),
            ))
            .await,
        ),
        "num_nodes",
    ));
    // Wait: num_returns above the number of ids, zero, duplicates.
    let wait = |ids: Vec<u64>, num_returns| wire::WaitRequest {
        task_ids: ids,
        num_returns,
        timeout_ms: Some(1_000),
    };
    cases.push((
        "num_returns above the ids",
        code!(rpc.wait(wait(vec![known.id().0], 2)).await),
        "num_returns",
    ));
    cases.push((
        "num_returns zero",
        code!(rpc.wait(wait(vec![known.id().0], 0)).await),
        "num_returns",
    ));
    cases.push((
        "duplicate ids",
        code!(rpc.wait(wait(vec![known.id().0, known.id().0], 1)).await),
        "",
    ));
    // Enums: value 0 is never valid.
    cases.push((
        "list with state UNSPECIFIED",
        code!(
            rpc.list_tasks(wire::ListTasksRequest {
                state: Some(0),
                ..Default::default()
            })
            .await,
        ),
        "state",
    ));
    cases.push((
        "logs of stream UNSPECIFIED",
        code!(
            rpc.task_logs(wire::TaskLogsRequest {
                task_id: known.id().0,
                stream: 0,
                ..Default::default()
            })
            .await,
        ),
        "stream",
    ));

    for (what, (code, message), mentions) in &cases {
        assert_eq!(code, "InvalidArgument", "{what}: {message}");
        assert!(
            message.contains(mentions),
            "{what}: {message:?} does not mention {mentions:?}"
        );
    }

    assert_eq!(snapshot(&client).await, before);
    still_works(&client).await;
    cluster.shutdown().await;
}
