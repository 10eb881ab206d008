//! Hierarchical max-min fair sharing (thesis §4.4.2, Fig. 4.5c) on an embedded cluster of 10
//! one-cpu workers, and policy composition with validation before launch.
//!
//! Run it with `cargo run --release --example fair_share`. It shows:
//!
//! 1. the HFS timeline: Sub-Org1 = A and B with weights 2:3, Sub-Org2 = C, equal weights at
//!    the top. A starts alone, B joins at 3 s, C at 6 s; every 500 ms it prints each user's
//!    nodes (where its `fs-...` resource lives) and running tasks. The check: at the end the
//!    shares are 2/3/5 with C = A + B, and the running tasks are within one of them;
//! 2. composition: A's fair share AND an anti-affinity resource that exists nowhere can never
//!    run; `validate` says why before launch, and `relax` drops anti-affinity, keeps fairness.

use std::time::{Duration, Instant};

use escher::esl::compose::{Composition, validate};
use escher::esl::{Domain, Hfs, ResourceSpec};
use escher::types::{Amount, ListTasksRequest, ResourceName, TaskId, TaskState};
use escher::{Client, Functions, LocalCluster, Task};

type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const NAP_MS: u64 = 300;

fn functions() -> Functions {
    Functions::new().typed_function("nap", |_ctx, ms: u64| async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok::<_, String>(())
    })
}

/// Keeps 12 tasks of `user` outstanding until `until`.
async fn drive(hfs: Hfs<Client>, client: Client, user: &'static str, until: Instant) {
    let mut out: Vec<TaskId> = Vec::new();
    while Instant::now() < until {
        let more = (out.len()..12)
            .map(|_| {
                Task::function_typed("nap", &NAP_MS)
                    .name(user)
                    .resources_str("cpu=1")
            })
            .map(|t| t.build().expect("a valid task"))
            .collect();
        out.extend(hfs.submit(user, more).await.expect("submit"));
        let wait = client.wait(out.clone(), 1, Some(Duration::from_millis(200)));
        out = wait.await.expect("wait").1;
    }
    let _ = client.cancel(out).await;
}

/// Per user: (nodes holding its resource, tasks running).
async fn sample(client: &Client, users: &[(&str, String)]) -> AnyResult<Vec<(usize, usize)>> {
    let status = client.cluster_status().await?;
    // One page is one consistent snapshot (a second page could count a task that started
    // after the first was read, next to the one it replaced).
    let running = client
        .list_tasks_page(ListTasksRequest {
            state: Some(TaskState::Running),
            limit: 1000,
            ..ListTasksRequest::default()
        })
        .await
        .map(|page| page.tasks)?;
    Ok(users
        .iter()
        .map(|(user, res)| {
            let nodes = status
                .nodes
                .iter()
                .filter(|n| n.takes_tasks() && n.resource(res).is_some_and(|r| !r.total.is_zero()))
                .count();
            let tasks = running.iter().filter(|t| t.name == *user).count();
            (nodes, tasks)
        })
        .collect())
}

#[tokio::main]
async fn main() -> AnyResult<()> {
    let mut builder = LocalCluster::builder().no_workers().functions(functions());
    for _ in 0..10 {
        builder = builder.worker("cpu=1".parse()?);
    }
    let cluster = builder.start().await?;
    let client = cluster.client().await?;

    println!("── 1. hierarchical fair sharing: Sub-Org1 {{A: 2, B: 3}}, Sub-Org2 {{C}}, 10 nodes");
    let top = Hfs::new(client.clone(), "top", Domain::All)?;
    top.create_user("org1", 1).await?;
    top.create_user("org2", 1).await?;
    let (org1, org2) = (top.child_for("org1")?, top.child_for("org2")?);
    let a = org1.create_user("A", 2).await?;
    let b = org1.create_user("B", 3).await?;
    let c = org2.create_user("C", 1).await?;
    let users = [
        ("A", a.resource().to_string()),
        ("B", b.resource().to_string()),
        ("C", c.resource().to_string()),
    ];
    let rebalancer = top.spawn_rebalancer(Duration::from_millis(150));
    let start = Instant::now();
    let end = start + Duration::from_secs(9);
    let mut drivers = Vec::new();
    let mut last = Vec::new();
    for (user, hfs, at) in [("A", &org1, 0), ("B", &org1, 3), ("C", &org2, 6)] {
        while start.elapsed() < Duration::from_secs(at) {
            tokio::time::sleep(Duration::from_millis(500)).await;
            last = sample(&client, &users).await?;
            println!(
                "   t={:>4.1}s  nodes/running  A {:?}  B {:?}  C {:?}",
                start.elapsed().as_secs_f64(),
                last[0],
                last[1],
                last[2]
            );
        }
        println!(
            "   t={:>4.1}s  {user} starts submitting",
            start.elapsed().as_secs_f64()
        );
        drivers.push(tokio::spawn(drive(
            hfs.clone(),
            client.clone(),
            user,
            end + Duration::from_secs(1),
        )));
    }
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(500)).await;
        last = sample(&client, &users).await?;
        println!(
            "   t={:>4.1}s  nodes/running  A {:?}  B {:?}  C {:?}",
            start.elapsed().as_secs_f64(),
            last[0],
            last[1],
            last[2]
        );
    }
    let shares: Vec<usize> = last.iter().map(|s| s.0).collect();
    let running: Vec<usize> = last.iter().map(|s| s.1).collect();
    let ok = shares == [2, 3, 5]
        && running
            .iter()
            .zip(&shares)
            .all(|(r, s)| r.abs_diff(*s) <= 1);
    println!(
        "   check: shares {shares:?} (want [2, 3, 5], C = A + B), running {running:?} (±1): {}",
        if ok { "ok" } else { "FAILED" }
    );

    println!("\n── 2. composition: fairness AND anti-affinity, relaxed in order");
    let status = client.cluster_status().await?;
    let anti = ResourceSpec::new().require(ResourceName::new("aa-nowhere")?, Amount::ONE)?;
    let composed = Composition::new()
        .with("fair", a.spec())
        .with("anti-affinity", anti);
    match validate(&composed.spec()?, &status) {
        Ok(()) => println!("   the full composition is satisfiable"),
        Err(e) => println!("   rejected before launch: {e}"),
    }
    let relaxed = composed.relax(&status)?;
    println!(
        "   relaxed: dropped {:?}, runs with {}",
        relaxed.dropped, relaxed.spec.resources
    );
    let relaxed_ok = relaxed.dropped == ["anti-affinity"]
        && relaxed.spec.resources.contains(a.resource().as_str());
    println!(
        "   check: anti-affinity dropped, fairness kept: {}",
        if relaxed_ok { "ok" } else { "FAILED" }
    );

    for d in drivers {
        let _ = d.await;
    }
    rebalancer.stop().await;
    cluster.shutdown().await;
    if ok && relaxed_ok {
        Ok(())
    } else {
        Err("a check failed".into())
    }
}
