//! Cluster dynamics with ephemeral resources: fault tolerance (thesis §4.3.4) and migration
//! (EscherTune, §4.6.1), on an embedded cluster of three 4-cpu workers.
//!
//! Run it with `cargo run --release --example resilience`. It shows:
//!
//! 1. fault tolerance: `data-7` lives on worker 2, a long task fills that worker and three
//!    tasks needing `data-7` wait behind it. Worker 2 is killed; the head declares it lost
//!    (500 ms heartbeat timeout) and `data-7` vanishes with it. The journal (a `ClusterApi`
//!    decorator watching `get_cluster_status`) replays `data-7` on another node. The check:
//!    the three waiting tasks succeed, on that node;
//! 2. migration: a 4-task job cannot fit on one of the two remaining workers (2 cpus busy on
//!    each), so it starts spread 2 + 2. When the blocker on one worker ends, that worker has
//!    room for the whole job: the migrator checkpoints, moves `job-train` there and relaunches
//!    the tasks. The check: all four run on one node, with byte-identical requests.

use std::time::{Duration, Instant};

use escher::codec;
use escher::esl::resilience::Recovery;
use escher::esl::{ClusterApi, Journal, Migrator};
use escher::types::{Capacity, NodeSpec, ResourceName, TaskId, TaskState};
use escher::{Client, Functions, LocalCluster, Task};
use escher_head::HeadConfig;

type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn functions() -> Functions {
    Functions::new().typed_function("nap", |ctx, ms: u64| async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok::<_, String>(ctx.node_id().0)
    })
}

fn nap(ms: u64, resources: &str) -> AnyResult<escher::types::TaskSpec> {
    Ok(Task::function_typed("nap", &ms)
        .resources_str(resources)
        .build()?)
}

async fn state(client: &Client, t: TaskId) -> AnyResult<TaskState> {
    Ok(client.task_info(t).await?.status.state)
}

#[tokio::main]
async fn main() -> AnyResult<()> {
    let config = HeadConfig {
        heartbeat_interval: Duration::from_millis(100),
        heartbeat_timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let mut cluster = LocalCluster::builder()
        .head_config(config)
        .functions(functions())
        .workers(3)
        .start()
        .await?;
    let client = cluster.client().await?;
    let nodes = cluster.nodes();

    println!("── 1. fault tolerance: replaying a lost node's ephemeral resources");
    let journal = Journal::new(client.clone());
    let victim = nodes[2];
    journal
        .set_resource(
            ResourceName::new("data-7")?,
            Capacity::Unbounded,
            NodeSpec::Node(victim),
        )
        .await?;
    let blocker = journal.submit(vec![nap(60_000, "cpu=4,data-7=1")?]).await?[0];
    while state(&client, blocker).await? != TaskState::Running {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let waiting = journal.submit(vec![nap(50, "cpu=1,data-7=1")?; 3]).await?;
    println!("   data-7 on node {victim}; 3 tasks wait for it behind a blocker");
    let watch = journal.spawn_watch(Duration::from_millis(100));
    let t = Instant::now();
    cluster.kill_worker(victim);
    println!("   killed the worker of node {victim}");
    let mut ran_on = Vec::new();
    for task in &waiting {
        let s = client.get(*task, Some(Duration::from_secs(60))).await?;
        ran_on.push((s.state, s.node));
    }
    println!(
        "   waiting tasks ended after {:.0} ms: {ran_on:?}",
        t.elapsed().as_secs_f64() * 1e3
    );
    for r in journal.history() {
        println!("   journal: {r:?}");
    }
    let stand_in = journal.history().iter().find_map(|r| match r {
        Recovery::Replayed { to, .. } => Some(*to),
        _ => None,
    });
    let ok1 = stand_in.is_some()
        && ran_on
            .iter()
            .all(|(s, n)| *s == TaskState::Succeeded && *n == stand_in);
    println!(
        "   check: all succeeded on the stand-in {stand_in:?}: {}",
        if ok1 { "ok" } else { "FAILED" }
    );
    watch.stop().await;

    println!("\n── 2. migration (EscherTune): a spread job moves to a node that now has room");
    let (n0, n1) = (nodes[0], nodes[1]);
    for (node, ms) in [(n0, 60_000), (n1, 1_500)] {
        let pin = ResourceName::new(&format!("pin-{node}"))?;
        client
            .set_resource(pin.clone(), Capacity::Unbounded, NodeSpec::Node(node))
            .await?;
        client
            .submit(
                Task::function_typed("nap", &ms)
                    .resources_str("cpu=2")
                    .resource(pin, 1u64),
            )
            .await?;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let checkpoints = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let seen = checkpoints.clone();
    let mut migrator = Migrator::new(client.clone()).on_checkpoint(move |job| {
        println!(
            "   checkpoint of job {} before stopping its {} tasks",
            job.id,
            job.tasks.len()
        );
        seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
    let job = migrator
        .launch("train", vec![nap(30_000, "cpu=1")?; 4])
        .await?
        .clone();
    println!("   job-train placed {:?} (node: tasks)", job.placement);
    let t = Instant::now();
    let moved = loop {
        if let Some(m) = migrator.maybe_migrate("train").await? {
            break Some(m);
        }
        if t.elapsed() > Duration::from_secs(30) {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut ok2 = false;
    if let Some(m) = moved {
        println!(
            "   moved from {:?} to {:?} after {:.1} s",
            m.from,
            m.to,
            t.elapsed().as_secs_f64()
        );
        let mut together = true;
        let mut identical = true;
        for (old, new) in job.tasks.iter().zip(&m.relaunched) {
            let (a, b) = (client.task_info(*old).await?, client.task_info(*new).await?);
            identical &= codec::encode(&a.spec)? == codec::encode(&b.spec)?;
            while state(&client, *new).await? == TaskState::Pending {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            together &= client.task_info(*new).await?.status.node == Some(m.to);
        }
        ok2 = together && identical && checkpoints.load(std::sync::atomic::Ordering::SeqCst) == 1;
        println!(
            "   relaunched tasks on one node: {together}; requests byte-identical: {identical}"
        );
        client.cancel(m.relaunched).await?;
    }
    println!("   check: {}", if ok2 { "ok" } else { "FAILED" });

    cluster.shutdown().await;
    if ok1 && ok2 {
        Ok(())
    } else {
        Err("a check failed".into())
    }
}
