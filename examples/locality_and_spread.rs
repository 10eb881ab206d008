//! Spatial policies from escher's scheduling libraries, on an embedded cluster of three
//! workers: where tasks run, decided only with ephemeral resources.
//!
//! Run it with `cargo run --example locality_and_spread`. Each step prints what it shows and
//! the check it makes; the program exits with an error if a check fails.
//!
//! 1. affinity (P1): followers submitted before their leader run on the leader's node;
//! 2. data locality (P1): readers run where their data was registered;
//! 3. anti-affinity (ghost tasks + barrier): three replicas on three distinct nodes;
//! 4. static load balancing: one slot per node spreads a burst;
//! 5. dynamic load balancing: each task to the least-utilised node;
//! 6. bin packing: best fit decreasing fills whole nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use escher::esl::{
    Affinity, AntiAffinity, BinPacking, DataLocality, Domain, LeastLoaded, LoadBalance,
    ResourceSpec,
};
use escher::types::{Amount, NodeId, ResourceSet, TaskId, TaskState};
use escher::{Client, Functions, LocalCluster, Task};

type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const LIMIT: Duration = Duration::from_secs(30);
/// How long a `hold` task runs unless cancelled (each step cancels its own).
const HOLD: u64 = 60_000;

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

fn check(ok: bool, what: &str) -> AnyResult<()> {
    println!("   check: {what}: {}", if ok { "yes" } else { "NO" });
    if ok {
        Ok(())
    } else {
        Err(format!("check failed: {what}").into())
    }
}

fn task(function: &str, ms: u64, cpu: &str, spec: &ResourceSpec) -> Task {
    let t = if function == "hold" {
        Task::function_typed("hold", &ms)
    } else {
        Task::function_typed("where", &())
    };
    spec.apply(t.resources_str(cpu))
}

async fn node(client: &Client, id: TaskId) -> AnyResult<NodeId> {
    Ok(NodeId(client.get_typed::<u64>(id, Some(LIMIT)).await?))
}

/// Waits until every task runs; their nodes.
async fn running(client: &Client, ids: &[TaskId]) -> AnyResult<Vec<NodeId>> {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let mut nodes = Vec::new();
        for id in ids {
            let s = client.task_info(*id).await?.status;
            if s.state == TaskState::Running {
                nodes.extend(s.node);
            }
        }
        if nodes.len() == ids.len() {
            return Ok(nodes);
        }
        if tokio::time::Instant::now() > deadline {
            return Err("tasks did not start in time".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn submit(client: &Client, t: Task) -> AnyResult<TaskId> {
    Ok(client.submit(t).await?.id())
}

/// Cancels tasks and waits until no cpu is in use any more.
async fn clear(client: &Client, ids: Vec<TaskId>) -> AnyResult<()> {
    client.cancel(ids).await?;
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let status = client.cluster_status().await?;
        let idle = status
            .nodes
            .iter()
            .all(|n| n.resource("cpu").is_none_or(|c| c.used.is_zero()));
        if idle {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err("cancelled tasks did not release their cpus in time".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::main]
async fn main() -> AnyResult<()> {
    let cluster = LocalCluster::builder()
        .workers(3)
        .functions(functions())
        .start()
        .await?;
    let client = cluster.client().await?;
    let nodes = cluster.nodes();
    println!("escher ESL tour (space): nodes {nodes:?}, 4 cpus each");

    println!("\n── 1. affinity: aff-<group> created by the leader's on_start hook");
    let mut group = Affinity::group(client.clone(), "pair")?;
    let leader_spec = group.next_spec();
    let mut followers = Vec::new();
    for _ in 0..3 {
        followers.push(submit(&client, task("where", 0, "cpu=1", &group.next_spec())).await?);
    }
    let leader = submit(&client, task("where", 0, "cpu=1", &leader_spec)).await?;
    let home = node(&client, leader).await?;
    let mut places = Vec::new();
    for f in followers {
        places.push(node(&client, f).await?);
    }
    println!("   leader on {home:?}, followers on {places:?}");
    check(
        places.iter().all(|p| *p == home),
        "every follower is on the leader's node",
    )?;
    group.dissolve().await?;

    println!("\n── 2. data locality: data-<id> registered on the node holding it");
    let data = DataLocality::new(client.clone());
    data.register("chunk-0", nodes[2]).await?;
    let mut readers = Vec::new();
    for _ in 0..3 {
        let spec = DataLocality::<Client>::consumer("chunk-0")?;
        readers.push(
            node(
                &client,
                submit(&client, task("where", 0, "cpu=1", &spec)).await?,
            )
            .await?,
        );
    }
    println!("   chunk-0 on {:?}, readers on {readers:?}", nodes[2]);
    check(
        readers.iter().all(|r| *r == nodes[2]),
        "every reader is where the data is",
    )?;
    data.forget("chunk-0").await?;

    println!("\n── 3. anti-affinity: aa-<group> = 1 per node, one ghost per member");
    let mut replicas = AntiAffinity::create(client.clone(), "replicas", 3, Domain::All).await?;
    let mut members = Vec::new();
    for i in 0..3 {
        members.push(submit(&client, task("hold", HOLD, "cpu=1", &replicas.member(i)?)).await?);
    }
    let on = running(&client, &members).await?;
    replicas.settle(&members, LIMIT).await?;
    println!("   replicas on {on:?}");
    check(
        on.iter().collect::<BTreeSet<_>>().len() == 3,
        "no two replicas share a node",
    )?;
    replicas.dissolve().await?;
    clear(&client, members).await?;

    println!("\n── 4. static load balancing: lb-<name> = 1 slot per node");
    let lb = LoadBalance::create(client.clone(), "burst", 1, Domain::All).await?;
    let mut burst = Vec::new();
    for _ in 0..3 {
        burst.push(submit(&client, task("hold", HOLD, "cpu=1", &lb.spec())).await?);
    }
    let on = running(&client, &burst).await?;
    println!("   three long tasks on {on:?}");
    check(
        on.iter().collect::<BTreeSet<_>>().len() == 3,
        "one per node",
    )?;
    let fourth = submit(&client, task("hold", HOLD, "cpu=1", &lb.spec())).await?;
    let waiting = client.task_info(fourth).await?.status.state == TaskState::Pending;
    check(waiting, "a fourth waits for a free slot")?;
    burst.push(fourth);
    clear(&client, burst).await?;
    lb.dissolve().await?;

    println!("\n── 5. dynamic load balancing: least used/total cpu, pinned with lb-node-<id>");
    let mut least = LeastLoaded::new(client.clone(), "cpu")?;
    let mut placed = Vec::new();
    for _ in 0..6 {
        let spec = least.next_spec(Amount::ONE).await?;
        let id = submit(&client, task("hold", HOLD, "cpu=1", &spec)).await?;
        running(&client, &[id]).await?;
        placed.push(id);
    }
    let mut per_node: BTreeMap<NodeId, usize> = BTreeMap::new();
    for n in running(&client, &placed).await? {
        *per_node.entry(n).or_default() += 1;
    }
    println!("   tasks per node: {per_node:?}");
    check(per_node.values().all(|c| *c == 2), "two per node")?;
    clear(&client, placed).await?;
    least.dissolve().await?;

    println!("\n── 6. bin packing: best fit decreasing, pinned with bp-node-<id>");
    let mut bp = BinPacking::new(client.clone(), "cpu")?;
    let demands: Vec<ResourceSet> = ["cpu=3", "cpu=1", "cpu=2", "cpu=2", "cpu=1", "cpu=3"]
        .iter()
        .map(|d| d.parse())
        .collect::<Result<_, _>>()?;
    let specs = bp.place_all(&demands).await?;
    let mut packed = Vec::new();
    for (d, s) in demands.iter().zip(&specs) {
        packed.push(submit(&client, task("hold", HOLD, &d.to_string(), s)).await?);
    }
    let on = running(&client, &packed).await?;
    let status = client.cluster_status().await?;
    let full = nodes.iter().all(|n| {
        status
            .node(*n)
            .and_then(|s| s.resource("cpu"))
            .is_some_and(|c| c.available() == Some(Amount::ZERO))
    });
    for (d, n) in demands.iter().zip(&on) {
        println!("   {d} on {n:?}");
    }
    check(full, "all three nodes are exactly full")?;
    clear(&client, packed).await?;
    bp.dissolve().await?;

    cluster.shutdown().await;
    println!("\nall checks passed");
    Ok(())
}
