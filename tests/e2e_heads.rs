//! End-to-end tests of a replicated head in one process (`LocalCluster::heads(3)`: three head
//! replicas on loopback ports, in-memory logs): the group elects a leader, every replica
//! reports itself, clients and workers follow the leader, and stopping the leader loses
//! nothing that was acknowledged: tasks, results, resources and node identities survive, ids
//! continue, and a task that was running when the leader stopped finishes once on its worker.

mod common;

use common::{LIMIT, cluster, eventually, finished, within};
use escher::types::{NodeSpec, ReplicaRole, TaskId, TaskResult, TaskState};
use escher::{Client, Task};

/// Waits until a replica leads and returns its index.
async fn leader(cluster: &escher::LocalCluster) -> usize {
    eventually("a head replica to lead", || cluster.leader()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_group_survives_its_leader_and_loses_nothing_acknowledged() {
    let mut cluster = within("starting three heads", cluster().heads(3).workers(2).start())
        .await
        .expect("the cluster starts");
    let client = within("connecting", Client::connect(cluster.head_url()))
        .await
        .unwrap();
    let nodes = cluster.nodes();
    let first = leader(&cluster).await;

    let heads = client.heads().await.unwrap();
    assert_eq!(heads.replicas.len(), 3, "{heads:#?}");
    assert!(heads.replicas.iter().all(|r| r.reachable && r.in_memory), "{heads:#?}");
    let leaders = heads
        .replicas
        .iter()
        .filter(|r| r.role == Some(ReplicaRole::Leader))
        .count();
    assert_eq!(leaders, 1, "{heads:#?}");

    // Acknowledged before the failover: results, an ephemeral resource, and a task that is
    // still running when the leader goes.
    let done = client
        .submit_typed::<()>(Task::function_typed("noop", &()))
        .await
        .unwrap();
    assert_eq!(finished(&client, &done).await.state, TaskState::Succeeded);
    client
        .set_resource("lane", 3, NodeSpec::Node(nodes[0]))
        .await
        .unwrap();
    let long = client
        .submit(Task::function_typed("nap", &1500u64).resource("lane", 1))
        .await
        .unwrap();
    common::running(&client, &long).await;

    cluster.stop_head(first).await;
    let second = leader(&cluster).await;
    assert_ne!(second, first, "a new leader was elected");

    // The same client follows the new leader; everything acknowledged is there.
    let status = finished(&client, &done).await;
    assert_eq!(status.state, TaskState::Succeeded);
    assert_eq!(status.result, Some(TaskResult::Returned(escher::codec::encode(&()).unwrap())));
    let lane = common::resource(&common::status(&client).await, nodes[0], "lane")
        .expect("the resource survived the failover");
    assert_eq!(lane.total.to_string(), "3");
    let long = within("the running task to finish", client.get(&long, Some(LIMIT)))
        .await
        .unwrap();
    assert_eq!(long.state, TaskState::Succeeded, "{long:?}");
    assert_eq!(long.attempt, 1, "it kept running through the failover: {long:?}");
    // New writes get new ids, and the workers kept their nodes.
    let after = client
        .submit(Task::function_typed("noop", &()))
        .await
        .unwrap();
    assert!(after.id() > TaskId(2), "ids continue: {:?}", after.id());
    assert_eq!(finished(&client, &after).await.state, TaskState::Succeeded);
    let live: Vec<_> = common::status(&client)
        .await
        .nodes
        .iter()
        .filter(|n| n.alive)
        .map(|n| n.id)
        .collect();
    assert_eq!(live, nodes, "the workers kept their node ids");
    let heads = client.heads().await.unwrap();
    let stopped = &heads.replicas[first];
    assert!(!stopped.reachable, "{heads:#?}");
    cluster.shutdown().await;
}
