//! End-to-end: the fault-tolerance ESL (`resilience::Journal`) on a real cluster. A worker
//! that holds an ephemeral resource dies; the journal sees the node gone in
//! `get_cluster_status`, replays the resource on another node, and the tasks that were
//! waiting for it run there.

use std::time::Duration;

use escher::esl::resilience::Recovery;
use escher::esl::testing::{self, within};
use escher::esl::{ClusterApi, Journal};
use escher::types::{Capacity, NodeSpec, ResourceName, TaskId, TaskState};
use escher::{Functions, LocalCluster, Task};
use escher_head::HeadConfig;

fn functions() -> Functions {
    Functions::new().typed_function("nap", |ctx, ms: u64| async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok::<_, String>(ctx.node_id().0)
    })
}

fn nap(ms: u64, resources: &str) -> Task {
    Task::function_typed("nap", &ms).resources_str(resources)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_resource_is_replayed_and_the_waiting_tasks_run() {
    let config = HeadConfig {
        heartbeat_interval: Duration::from_millis(100),
        heartbeat_timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let mut cluster = within(
        "starting the cluster",
        LocalCluster::builder()
            .head_config(config)
            .functions(functions())
            .workers(3)
            .start(),
    )
    .await
    .expect("the cluster starts");
    let client = cluster.client().await.expect("client");
    let victim = cluster.nodes()[2];
    let journal = Journal::new(client.clone());
    let data = ResourceName::new("data-7").unwrap();
    within(
        "set data-7",
        journal.set_resource(data.clone(), Capacity::Unbounded, NodeSpec::Node(victim)),
    )
    .await
    .expect("set_resource");

    // A long task fills the victim's 4 cpus; three short ones wait for data-7 behind it.
    let blocker = nap(120_000, "cpu=4,data-7=1")
        .max_retries(0)
        .build()
        .unwrap();
    let blocker = within("submit", journal.submit(vec![blocker]))
        .await
        .unwrap()[0];
    testing::all_running(&client, &[blocker]).await;
    let waiting: Vec<_> = (0..3)
        .map(|_| nap(50, "cpu=1,data-7=1").max_retries(2).build().unwrap())
        .collect();
    let waiting: Vec<TaskId> = within("submit", journal.submit(waiting)).await.unwrap();
    for t in &waiting {
        let s = client.task_info(*t).await.unwrap().status;
        assert_eq!(s.state, TaskState::Pending, "{s:?}");
    }

    let watch = journal.spawn_watch(Duration::from_millis(100));
    cluster.kill_worker(victim);

    // The waiting tasks all succeed, on the node the journal replayed data-7 to.
    let mut ran_on = Vec::new();
    for t in &waiting {
        let s = within("a waiting task to finish", client.get(*t, None))
            .await
            .expect("get");
        assert_eq!(s.state, TaskState::Succeeded, "{s:?}");
        ran_on.push(s.node.expect("it ran somewhere"));
    }
    let stand_in = journal
        .history()
        .iter()
        .find_map(|r| match r {
            Recovery::Replayed { name, from, to } if *name == data && *from == victim => Some(*to),
            _ => None,
        })
        .expect("the journal replayed data-7");
    assert_ne!(stand_in, victim);
    assert!(
        ran_on.iter().all(|n| *n == stand_in),
        "{ran_on:?} vs {stand_in}"
    );
    assert!(journal.history().contains(&Recovery::Lost {
        name: data.clone(),
        node: victim
    }));

    let status = client.cluster_status().await.unwrap();
    assert!(
        !status.node(victim).unwrap().alive,
        "the victim was declared lost"
    );
    let holders: Vec<_> = status
        .nodes
        .iter()
        .filter(|n| n.alive && n.resource("data-7").is_some_and(|r| !r.total.is_zero()))
        .map(|n| n.id)
        .collect();
    assert_eq!(holders, vec![stand_in], "data-7 lives on the stand-in only");
    let blocker = client.task_info(blocker).await.unwrap().status;
    assert_eq!(
        blocker.state,
        TaskState::Failed,
        "out of retries: {blocker:?}"
    );

    within("stopping the watch", watch.stop()).await;
    within("shutdown", cluster.shutdown()).await;
}
