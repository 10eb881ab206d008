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
    let mut cluster = within(
        "starting three heads",
        cluster().heads(3).workers(2).start(),
    )
    .await
    .expect("the cluster starts");
    let client = within("connecting", Client::connect(cluster.head_url()))
        .await
        .unwrap();
    let nodes = cluster.nodes();
    let first = leader(&cluster).await;

    let heads = client.heads().await.unwrap();
    assert_eq!(heads.replicas.len(), 3, "{heads:#?}");
    assert!(
        heads.replicas.iter().all(|r| r.reachable && r.in_memory),
        "{heads:#?}"
    );
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
    // A `get` waiting on the client's result stream when its leader goes.
    let in_flight = {
        let (client, id) = (client.clone(), long.id());
        tokio::spawn(async move { client.get(id, Some(LIMIT)).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;

    cluster.stop_head(first).await;
    let second = leader(&cluster).await;
    assert_ne!(second, first, "a new leader was elected");

    // The same client follows the new leader; everything acknowledged is there.
    let status = finished(&client, &done).await;
    assert_eq!(status.state, TaskState::Succeeded);
    assert_eq!(
        status.result,
        Some(TaskResult::Returned(
            escher::codec::encode(&()).unwrap().into()
        ))
    );
    let lane = common::resource(&common::status(&client).await, nodes[0], "lane")
        .expect("the resource survived the failover");
    assert_eq!(lane.total.to_string(), "3");
    let long = within("the running task to finish", client.get(&long, Some(LIMIT)))
        .await
        .unwrap();
    assert_eq!(long.state, TaskState::Succeeded, "{long:?}");
    assert_eq!(
        long.attempt, 1,
        "it kept running through the failover: {long:?}"
    );
    let waited = within("the get in flight through the failover", in_flight)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((waited.state, waited.attempt), (TaskState::Succeeded, 1));
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

/// `escher heads remove` of the replica that leads: the change is acknowledged, the removed
/// leader steps down and goes on answering (raft-rs kept it leading, and its next append answer
/// panicked inside raft-rs: the simulation found it, seed 4), the two others elect a leader
/// among themselves, and the group goes on with everything acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_removed_from_its_group_steps_down_and_the_others_go_on() {
    let cluster = within(
        "starting three heads",
        cluster().heads(3).workers(1).start(),
    )
    .await
    .expect("the cluster starts");
    let client = within("connecting", Client::connect(cluster.head_url()))
        .await
        .unwrap();
    leader(&cluster).await;
    let first = client.submit(Task::command(["true"])).await.unwrap();
    assert_eq!(finished(&client, &first).await.state, TaskState::Succeeded);
    let heads = client.heads().await.unwrap();
    let removed = heads.leader().expect("a leader").clone();
    within("removing the leader", client.remove_head(removed.id))
        .await
        .expect("the removal is acknowledged");

    let client = Client::connect(cluster.head_urls().join(","))
        .await
        .unwrap();
    eventually("a leader among the two others", || {
        let client = client.clone();
        async move {
            let heads = client.heads().await.ok()?;
            let leader = heads.leader()?;
            (leader.id != removed.id).then_some(())
        }
    })
    .await;
    // Writes go on (and are replicated: the removed replica hears nothing of them).
    for _ in 0..5 {
        let after = client.submit(Task::command(["true"])).await.unwrap();
        assert!(after.id() > first.id());
        assert_eq!(finished(&client, &after).await.state, TaskState::Succeeded);
    }
    // The removed replica still answers, and no longer leads.
    let alone = Client::connect(format!("http://{}", removed.address))
        .await
        .unwrap();
    let seen = within("the removed replica's view", alone.heads())
        .await
        .expect("the removed replica answers");
    let itself = seen
        .replicas
        .iter()
        .find(|r| r.id == removed.id)
        .expect("it lists itself");
    assert_ne!(itself.role, Some(ReplicaRole::Leader), "{seen:#?}");
    cluster.shutdown().await;
}

/// A replica of `group` started empty with `join`, on `listener`, sharing the group's access
/// file; returns its stop token.
fn joining_head(
    listener: tokio::net::TcpListener,
    id: u64,
    group: &str,
    access: &escher::access::AccessFile,
) -> (tokio_util::sync::CancellationToken, String) {
    let address = listener.local_addr().unwrap().to_string();
    let mut config = escher_head::HeadConfig {
        access: access.clone(),
        ..escher_head::HeadConfig::default()
    };
    config.replica.id = id;
    config.replica.group = group.to_string();
    config.replica.join = true;
    let stop = tokio_util::sync::CancellationToken::new();
    let token = stop.clone();
    tokio::spawn(escher_head::run(listener, config, async move {
        token.cancelled().await
    }));
    (stop, address)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_added_to_a_running_head_catch_up_from_a_snapshot_and_take_over() {
    common::init_tracing();
    // A lone head that snapshots as soon as its log outgrows its state, so a new replica
    // needs a snapshot (and adding one takes a snapshot that includes it).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let first = listener.local_addr().unwrap().to_string();
    let mut config = escher_head::HeadConfig::default();
    config.replica.snapshot_bytes = 1;
    let access = config.access.clone();
    let stop_first = tokio_util::sync::CancellationToken::new();
    let token = stop_first.clone();
    tokio::spawn(escher_head::run(listener, config, async move {
        token.cancelled().await
    }));
    let client = within("connecting", Client::connect(format!("http://{first}")))
        .await
        .unwrap();
    let group = client.heads().await.unwrap().group;
    let before = client
        .submit_batch((0..5).map(|_| Task::command(["true"])))
        .await
        .unwrap();
    client
        .set_resource(
            "kept",
            7,
            NodeSpec::Match {
                resources: Default::default(),
                num_nodes: None,
            },
        )
        .await
        .unwrap();

    let (stop_2, second) = joining_head(
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        2,
        &group,
        &access,
    );
    let (stop_3, third) = joining_head(
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        3,
        &group,
        &access,
    );
    let heads = client.add_head(2, second.clone()).await.unwrap();
    assert_eq!(heads.replicas.len(), 2, "{heads:#?}");
    client.add_head(3, third.clone()).await.unwrap();
    let err = client.add_head(3, third.clone()).await.unwrap_err();
    assert!(err.to_string().contains("already a member"), "{err}");
    // Judged when applied, in log order: refused, and nothing changed.
    let err = client.remove_head(9).await.unwrap_err();
    assert!(
        err.to_string().contains("replica 9 is not a member"),
        "{err}"
    );
    assert_eq!(client.heads().await.unwrap().replicas.len(), 3);
    eventually("the new replicas to catch up", || {
        let client = client.clone();
        async move {
            let heads = client.heads().await.ok()?;
            let applied: std::collections::BTreeSet<u64> =
                heads.replicas.iter().map(|r| r.applied_index).collect();
            let all = heads.replicas.len() == 3 && heads.replicas.iter().all(|r| r.reachable);
            (all && applied.len() == 1).then_some(())
        }
    })
    .await;

    // The first replica goes; the two that joined elect a leader and hold everything.
    stop_first.cancel();
    let urls = format!("http://{first},http://{second},http://{third}");
    let client = Client::connect(&urls).await.unwrap();
    let listed = within("listing after the failover", client.list_tasks(None, None))
        .await
        .unwrap();
    let ids: Vec<TaskId> = listed.iter().map(|t| t.id).collect();
    let expected: Vec<TaskId> = before.iter().map(|t| t.id()).collect();
    assert_eq!(ids, expected);
    let after = client.submit(Task::command(["true"])).await.unwrap();
    assert_eq!(after.id(), TaskId(6), "ids continue on the new leader");
    let heads = client.heads().await.unwrap();
    let leader = heads.leader().expect("a leader");
    assert_ne!(leader.address, first, "{heads:#?}");
    stop_2.cancel();
    stop_3.cancel();
}
