//! A client's submissions share one stream to the head, several requests in flight:
//! concurrent `submit` calls are coalesced into shared requests, and each call still succeeds
//! or fails on its own.

mod common;

use std::collections::BTreeSet;

use common::{start, within};
use escher::Task;
use escher::types::{Capacity, CapacityOp, NodeSpec, ResourceName, ResourceUpdate, TaskState};

#[tokio::test]
async fn concurrent_submits_each_get_their_own_answer() {
    let (cluster, client) = start(2).await;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..300u64 {
        let c = client.clone();
        set.spawn(async move {
            let task = Task::function("noop", Vec::new()).resources_str("cpu=0.01");
            // One task asks the head to set a physical resource when it succeeds: refused.
            let task = if i == 150 {
                task.on_success(ResourceUpdate {
                    name: ResourceName::cpu(),
                    op: CapacityOp::Set(Capacity::Unbounded),
                    target: NodeSpec::Local,
                })
            } else {
                task
            };
            (i, c.submit(task).await)
        });
    }
    let mut ids = BTreeSet::new();
    let mut refused = Vec::new();
    while let Some(joined) = within("submits", set.join_next()).await {
        match joined.expect("submit task panicked") {
            (_, Ok(r)) => assert!(ids.insert(r.id()), "ids are unique"),
            (i, Err(e)) => refused.push((i, e.to_string())),
        }
    }
    assert_eq!(refused.len(), 1, "only the bad task fails: {refused:?}");
    assert_eq!(refused[0].0, 150);
    assert!(refused[0].1.contains("physical"), "{}", refused[0].1);
    assert_eq!(ids.len(), 299);
    all_succeed(&client, &ids).await;
    cluster.shutdown().await;
}

#[tokio::test]
async fn namespaced_clients_do_not_share_a_batch() {
    let (cluster, client) = start(1).await;
    let a = client.clone().with_namespace("app-a".parse().unwrap());
    let b = client.clone().with_namespace("app-b".parse().unwrap());
    let node = cluster.nodes()[0];
    a.set_resource("slot", 100, NodeSpec::Node(node))
        .await
        .unwrap();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..40 {
        let (a, b) = (a.clone(), b.clone());
        set.spawn(async move {
            let c = if i % 2 == 0 { a } else { b };
            let r = c
                .submit(Task::function("noop", Vec::new()).resources_str("slot=1"))
                .await
                .unwrap();
            (i % 2 == 0, r.id())
        });
    }
    let mut by_ns = (Vec::new(), Vec::new());
    while let Some(joined) = within("submits", set.join_next()).await {
        let (in_a, id) = joined.unwrap();
        if in_a {
            by_ns.0.push(id)
        } else {
            by_ns.1.push(id)
        }
    }
    let (ready, _) = within(
        "app-a's tasks",
        a.wait(by_ns.0.clone(), by_ns.0.len(), None),
    )
    .await
    .unwrap();
    assert!(
        ready.iter().all(|s| s.state == TaskState::Succeeded),
        "app-a/slot exists"
    );
    for id in &by_ns.1 {
        let info = b.task_info(*id).await.unwrap();
        assert_eq!(
            info.status.state,
            TaskState::Pending,
            "app-b/slot does not exist"
        );
        assert!(info.spec.resources.contains("app-b/slot"));
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_submits_and_waits_in_one_call() {
    let (cluster, client) = start(1).await;
    let ok = within("run", client.run(Task::command(["true"]), None))
        .await
        .unwrap();
    assert_eq!(ok.state, TaskState::Succeeded);
    let failed = within(
        "run",
        client.run(Task::command(["sh", "-c", "exit 3"]), None),
    )
    .await
    .unwrap();
    assert_eq!(failed.state, TaskState::Failed);
    assert_eq!(
        failed.result,
        Some(escher::types::TaskResult::Exited { code: 3 })
    );
    // Past its timeout it is the client's timeout error, and the task goes on.
    let err = client
        .run(
            Task::command(["sleep", "30"]),
            Some(std::time::Duration::from_millis(300)),
        )
        .await
        .unwrap_err();
    let escher::ClientError::Timeout { id, .. } = err else {
        panic!("{err}");
    };
    assert_eq!(
        client.task_info(id).await.unwrap().status.state,
        TaskState::Running
    );
    client.cancel([id]).await.unwrap();

    // The head takes one task per Run: several are refused, saying what to do instead.
    let channel = tonic::transport::Endpoint::from_shared(cluster.head_url().to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let bearer = escher_proto::access::Bearer::new(cluster.admin_token());
    let mut raw =
        escher_proto::wire::cluster_client::ClusterClient::with_interceptor(channel, bearer);
    let two = escher::types::SubmitRequest {
        tasks: vec![
            Task::command(["true"]).build().unwrap(),
            Task::command(["true"]).build().unwrap(),
        ],
        namespace: None,
    };
    let refused = raw
        .run(escher_proto::wire::RunRequest {
            submit: Some(two.into()),
            timeout_ms: None,
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused
            .message()
            .contains("Run takes exactly one task (2 given)"),
        "{}",
        refused.message()
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_and_submits_in_flight_together_all_land() {
    let (cluster, client) = start(2).await;
    let mut set = tokio::task::JoinSet::new();
    // Batches from four callers and single submits from many, all on one client's stream:
    // requests are answered out of the order their keys were issued in.
    for _ in 0..4 {
        let c = client.clone();
        set.spawn(async move {
            let mut ids = Vec::new();
            for _ in 0..10 {
                let batch = (0..50).map(|_| Task::function("noop", Vec::new()));
                let refs = c.submit_batch(batch).await.expect("a batch lands");
                ids.extend(refs.iter().map(|r| r.id()));
            }
            ids
        });
    }
    for _ in 0..200 {
        let c = client.clone();
        set.spawn(async move {
            let task = Task::function("noop", Vec::new());
            vec![c.submit(task).await.expect("a submit lands").id()]
        });
    }
    let mut ids = BTreeSet::new();
    while let Some(joined) = within("submissions", set.join_next()).await {
        for id in joined.expect("no submitter panicked") {
            assert!(ids.insert(id), "ids are unique");
        }
    }
    assert_eq!(ids.len(), 4 * 10 * 50 + 200);
    all_succeed(&client, &ids).await;
    cluster.shutdown().await;
}

/// Waits for every task of `ids` and checks that each succeeded.
async fn all_succeed(client: &escher::Client, ids: &BTreeSet<escher::types::TaskId>) {
    let (ready, not_ready) = within(
        "all finish",
        client.wait(ids.iter().copied(), ids.len(), None),
    )
    .await
    .unwrap();
    assert!(not_ready.is_empty());
    assert!(ready.iter().all(|s| s.state == TaskState::Succeeded));
}
