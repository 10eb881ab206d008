//! Temporal policies from escher's scheduling libraries, on an embedded cluster of two
//! workers: *when* tasks run, decided only with ephemeral resources.
//!
//! Run it with `cargo run --example dag_and_queues`. Each step prints what it shows and the
//! check it makes; the program exits with an error if a check fails.
//!
//! 1. a DAG (P2 signals): tasks submitted last-first still run in dependency order;
//! 2. a barrier (P2): a task waits for three parties;
//! 3. a queue (P3): tasks wait until the application releases a batch;
//! 4. weighted fair queueing (P3): two queues share slots 1:2;
//! 5. strict priority (P3): only the highest queue with work runs;
//! 6. a lock (P4): a ghost task reserves 4 cpus; tasks run inside them, others wait.

use std::collections::BTreeMap;
use std::time::Duration;

use escher::esl::{Barrier, Dag, Domain, FairQueues, Lock, PriorityQueues, Queue, ResourceSpec};
use escher::types::{NodeSpec, TaskId, TaskState};
use escher::{Client, Functions, LocalCluster, Task};

type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const LIMIT: Duration = Duration::from_secs(30);
/// How long a `hold` task runs unless cancelled.
const HOLD: u64 = 60_000;

fn functions() -> Functions {
    Functions::new().typed_function("hold", |ctx, ms: u64| async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok::<_, String>(ctx.node_id().0)
    })
}

fn check(ok: bool, what: &str) -> AnyResult<()> {
    println!("   check: {what}: {}", if ok { "yes" } else { "NO" });
    if ok {
        Ok(())
    } else {
        Err(format!("check failed: {what}").into())
    }
}

fn hold(ms: u64, cpu: &str) -> Task {
    Task::function_typed("hold", &ms).resources_str(cpu)
}

async fn submit(client: &Client, t: Task) -> AnyResult<TaskId> {
    Ok(client.submit(t).await?.id())
}

async fn state(client: &Client, id: TaskId) -> AnyResult<TaskState> {
    Ok(client.task_info(id).await?.status.state)
}

/// Waits until `n` of `ids` run; how many of each list run then.
async fn until_running(client: &Client, lists: &[&[TaskId]], n: usize) -> AnyResult<Vec<usize>> {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let mut counts = Vec::new();
        for ids in lists {
            let mut c = 0;
            for id in *ids {
                if state(client, *id).await? == TaskState::Running {
                    c += 1;
                }
            }
            counts.push(c);
        }
        if counts.iter().sum::<usize>() >= n {
            return Ok(counts);
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("{n} tasks did not start in time ({counts:?})").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::main]
async fn main() -> AnyResult<()> {
    let cluster = LocalCluster::builder()
        .workers(2)
        .functions(functions())
        .start()
        .await?;
    let client = cluster.client().await?;
    let nodes = cluster.nodes();
    println!("escher ESL tour (time): nodes {nodes:?}, 4 cpus each");

    println!(
        "\n── 1. DAG: each task raises done-<dag>-<task> on success; tasks wait for their \
         predecessors' signals"
    );
    let mut dag = Dag::new(client.clone(), "etl")?;
    dag.task("extract", &[])?
        .task("clean", &["extract"])?
        .task("stats", &["extract"])?
        .task("report", &["clean", "stats"])?;
    let plan = dag.plan()?;
    let mut ids = BTreeMap::new();
    for (name, spec) in plan.order().iter().rev() {
        ids.insert(
            name.clone(),
            submit(&client, spec.apply(hold(50, "cpu=1"))).await?,
        );
    }
    let mut times = BTreeMap::new();
    for (name, id) in &ids {
        client.get(*id, Some(LIMIT)).await?;
        let info = client.task_info(*id).await?;
        let (start, end) = (
            info.started_at_ms.unwrap_or(0),
            info.finished_at_ms.unwrap_or(0),
        );
        times.insert(name.clone(), (start, end));
    }
    let t0 = times.values().map(|t| t.0).min().unwrap_or(0);
    let mut ordered = true;
    for (name, _) in plan.order() {
        let (start, end) = times[name];
        let preds = plan.predecessors(name);
        println!(
            "   {name:8} ran {:4} .. {:4} ms, after {preds:?}",
            start - t0,
            end - t0
        );
        ordered &= preds.iter().all(|p| start >= times[p].1);
    }
    check(ordered, "no task started before its predecessors finished")?;
    dag.cleanup().await?;

    println!("\n── 2. barrier: the waiter needs one unit of bar-<name>-<i> from each party");
    let barrier = Barrier::new(client.clone(), "sync", 3)?;
    let waiter = submit(&client, barrier.waiter()?.apply(hold(0, "cpu=1"))).await?;
    let mut parties = Vec::new();
    for i in 0..3 {
        parties.push(submit(&client, barrier.party(i)?.apply(hold(50, "cpu=1"))).await?);
    }
    client.get(waiter, Some(LIMIT)).await?;
    let started = client.task_info(waiter).await?.started_at_ms.unwrap_or(0);
    let mut last = 0;
    for p in &parties {
        last = last.max(
            client
                .task_info(*p)
                .await?
                .finished_at_ms
                .unwrap_or(u64::MAX),
        );
    }
    println!(
        "   the waiter started {} ms after the last party finished",
        started.saturating_sub(last)
    );
    check(started >= last, "the waiter started after every party")?;
    barrier.reset().await?;

    println!("\n── 3. queue: q-<name> starts at capacity 0; release(2) lets a batch of two in");
    let mut queue = Queue::create(client.clone(), "batch", Domain::node(nodes[0])).await?;
    let mut queued = Vec::new();
    for _ in 0..5 {
        queued.push(queue.submit(hold(HOLD, "cpu=1")).await?);
    }
    let reason = client
        .task_info(queued[0])
        .await?
        .status
        .reason
        .unwrap_or_default();
    println!("   5 queued; the first waits because: {reason}");
    queue.release(2).await?;
    let counts = until_running(&client, &[&queued], 2).await?;
    let backlog = queue.backlog().await?;
    println!(
        "   after release(2): {} running, {} pending",
        backlog.running, backlog.pending
    );
    check(
        counts == [2] && backlog.pending == 3,
        "exactly the batch runs",
    )?;
    queue.close().await?;
    client.cancel(queued).await?;

    println!("\n── 4. weighted fair queueing: weights 1:2 over 3 slots");
    let mut fair = FairQueues::new(vec![
        (
            Queue::create(client.clone(), "light", Domain::node(nodes[1])).await?,
            1,
        ),
        (
            Queue::create(client.clone(), "heavy", Domain::node(nodes[1])).await?,
            2,
        ),
    ])?;
    let (mut light, mut heavy) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        light.push(fair.submit(0, hold(HOLD, "")).await?);
        heavy.push(fair.submit(1, hold(HOLD, "")).await?);
    }
    let shares = fair.rebalance(3).await?;
    let counts = until_running(&client, &[&light, &heavy], 3).await?;
    println!("   shares {shares:?}, running {counts:?}");
    check(counts == [1, 2], "running in proportion to the weights")?;
    client
        .cancel(light.into_iter().chain(heavy).collect::<Vec<_>>())
        .await?;

    println!("\n── 5. strict priority: all slots to the highest queue with work");
    let mut prio = PriorityQueues::new(vec![
        Queue::create(client.clone(), "urgent", Domain::node(nodes[1])).await?,
        Queue::create(client.clone(), "bulk", Domain::node(nodes[1])).await?,
    ]);
    let bulk: Vec<TaskId> = vec![
        prio.submit(1, hold(HOLD, "")).await?,
        prio.submit(1, hold(HOLD, "")).await?,
    ];
    prio.rebalance(1).await?;
    until_running(&client, &[&bulk], 1).await?;
    let urgent = prio.submit(0, hold(0, "")).await?;
    let shares = prio.rebalance(1).await?;
    println!("   urgent work arrives: shares {shares:?}");
    client.get(urgent, Some(LIMIT)).await?;
    let counts = until_running(&client, &[&bulk], 1).await?;
    check(
        counts == [1],
        "bulk holds its one running task but starts no other",
    )?;
    client.cancel(bulk).await?;

    println!(
        "\n── 6. lock: a ghost holds cpu=4 on {:?} and creates lock-<name>",
        nodes[0]
    );
    let lock = Lock::reserve(
        client.clone(),
        "bundle",
        "cpu=4".parse()?,
        NodeSpec::Node(nodes[0]),
    )
    .await?;
    let at = lock.wait_ready(LIMIT).await?;
    let mut inside = Vec::new();
    for _ in 0..5 {
        inside.push(submit(&client, lock.spec().apply(hold(HOLD, ""))).await?);
    }
    let counts = until_running(&client, &[&inside], 4).await?;
    let fifth = state(&client, inside[4]).await?;
    println!(
        "   bundle on {at:?}: {} tasks inside, the fifth is {fifth}",
        counts[0]
    );
    check(
        counts == [4] && fifth == TaskState::Pending,
        "four slots, no more",
    )?;
    let plain = submit(&client, ResourceSpec::new().apply(hold(0, "cpu=4"))).await?;
    let plain_node = client.get(plain, Some(LIMIT)).await?.node;
    check(
        plain_node == Some(nodes[1]),
        "a plain 4-cpu task can only use the other node",
    )?;
    lock.release().await?;
    client.cancel(inside).await?;

    cluster.shutdown().await;
    println!("\nall checks passed");
    Ok(())
}
