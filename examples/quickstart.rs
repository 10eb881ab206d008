//! A short tour of escher on an embedded cluster (a head and three workers in this process).
//!
//! Run it with `cargo run --release --example quickstart`. Each step prints what it shows and
//! how long it took:
//!
//! 1. plain tasks: function and command tasks, results and exit codes;
//! 2. P1 locality: a task creates an ephemeral resource on its node, a second task follows it;
//! 3. P2 signalling: a task waits for a resource that does not exist yet, with its reason shown,
//!    and starts the moment an earlier task's completion hook creates it;
//! 4. P3 queues: tasks wait on a zero-capacity queue resource that is then raised to release
//!    them in batches;
//! 5. the cluster status: every node's resources, total and available.

use std::time::{Duration, Instant};

use escher::types::{
    Capacity, CapacityOp, NodeId, NodeSpec, ResourceName, ResourceUpdate, TaskState,
};
use escher::{Functions, LocalCluster, Task};

type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn functions() -> Functions {
    Functions::new()
        .typed_function(
            "square",
            |_ctx, x: u64| async move { Ok::<_, String>(x * x) },
        )
        .typed_function("where", |ctx, ()| async move {
            Ok::<_, String>(ctx.node_id().0)
        })
        .typed_function("nap", |ctx, ms: u64| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok::<_, String>(ctx.node_id().0)
        })
        // P1: create an unbounded locality marker on this task's node.
        .typed_function("mark_here", |ctx, name: String| async move {
            let name = ResourceName::new(&name).map_err(|e| e.to_string())?;
            ctx.set_resource(name, CapacityOp::Set(Capacity::Unbounded))
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(ctx.node_id().0)
        })
}

fn step(n: u32, title: &str) -> Instant {
    println!("\n── {n}. {title}");
    Instant::now()
}

fn took(start: Instant) {
    println!("   took {:.1} ms", start.elapsed().as_secs_f64() * 1e3);
}

#[tokio::main]
async fn main() -> AnyResult<()> {
    let t = Instant::now();
    let cluster = LocalCluster::builder()
        .workers(3)
        .functions(functions())
        .start()
        .await?;
    let client = cluster.client().await?;
    println!(
        "escher quickstart: head at {}, nodes {:?}",
        cluster.head_url(),
        cluster.nodes()
    );
    println!("   cluster up in {:.1} ms", t.elapsed().as_secs_f64() * 1e3);

    // 1. Plain tasks.
    let t = step(1, "plain tasks: 100 function tasks and a command task");
    let refs = client
        .submit_batch(
            (0..100u64).map(|x| Task::function_typed("square", &x).resources_str("cpu=0.1")),
        )
        .await?;
    let mut sum = 0u64;
    for r in &refs {
        sum += client.get_typed::<u64>(r.id(), None).await?;
    }
    println!("   sum of squares 0..100 = {sum} (expected 328350)");
    let echo = client
        .submit(Task::command([
            "sh",
            "-c",
            "echo hello from $ESCHER_NODE_ID; exit 3",
        ]))
        .await?;
    let status = client.get(&echo, None).await?;
    let out = client
        .logs(echo.id(), escher::types::LogStream::Stdout)
        .await?;
    println!(
        "   command task: {} ({}), stdout {:?}",
        status.state,
        status.reason.unwrap_or_default(),
        String::from_utf8_lossy(&out).trim()
    );
    took(t);

    // 2. P1 locality.
    let t = step(
        2,
        "P1 locality: a task marks its node, another follows it there",
    );
    let marker = client
        .submit(Task::function_typed("mark_here", &"near-first".to_string()))
        .await?;
    let first: u64 = client.get_typed(marker.id(), None).await?;
    let follower = client
        .submit(Task::function_typed("where", &()).resources_str("near-first=1"))
        .await?;
    let second: u64 = client.get_typed(follower.id(), None).await?;
    println!(
        "   marker ran on node {first}, follower ran on node {second} (same: {})",
        first == second
    );
    took(t);

    // 3. P2 signalling.
    let t = step(
        3,
        "P2 signalling: a task waits for a resource an earlier task creates on success",
    );
    let waiting = client
        .submit(Task::function_typed("where", &()).resources_str("after-a=1"))
        .await?;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let info = client.task_info(waiting.id()).await?;
    let reason = info
        .pending_reason
        .map(|r| r.message)
        .unwrap_or_else(|| "-".into());
    println!("   waiting task is {}: {reason}", info.status.state);
    let signal = ResourceUpdate {
        name: ResourceName::new("after-a")?,
        op: CapacityOp::Set(Capacity::Finite("1".parse()?)),
        target: NodeSpec::Local,
    };
    let a = client
        .submit(Task::function_typed("nap", &100u64).on_success(signal))
        .await?;
    let a_node: u64 = client.get_typed(a.id(), None).await?;
    let b_node: u64 = client.get_typed(waiting.id(), None).await?;
    println!("   task A finished on node {a_node}; the waiting task then ran on node {b_node}");
    took(t);

    // 4. P3 queues.
    let t = step(
        4,
        "P3 queue: 6 tasks wait on queue capacity 0, then drain 2 at a time",
    );
    let queue: Vec<_> = client
        .submit_batch((0..6).map(|_| Task::function_typed("nap", &150u64).resources_str("queue=1")))
        .await?;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let pending = client
        .list_tasks(Some(TaskState::Pending), None)
        .await?
        .len();
    println!("   before: {pending} tasks pending on the queue");
    let node = NodeId(cluster.nodes()[0].0);
    let drain = Instant::now();
    client
        .set_resource("queue", 2, NodeSpec::Node(node))
        .await?;
    let mut finished = Vec::new();
    for r in &queue {
        client.get(r, None).await?;
        finished.push(drain.elapsed().as_millis());
    }
    println!("   finished at (ms after raising the queue to 2): {finished:?}");
    took(t);

    // 5. Cluster status.
    let t = step(5, "cluster status");
    let status = client.cluster_status().await?;
    for node in &status.nodes {
        let resources: Vec<String> = node
            .resources
            .iter()
            .map(|r| match r.available() {
                Some(avail) => format!("{}={}/{}", r.name, avail, r.total),
                None => format!("{}=unbounded", r.name),
            })
            .collect();
        println!(
            "   node {} ({}): {}",
            node.id,
            node.name,
            resources.join(" ")
        );
    }
    println!(
        "   {} pending, {} running",
        status.pending_tasks, status.running_tasks
    );
    took(t);

    cluster.shutdown().await;
    Ok(())
}
