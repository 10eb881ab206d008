//! Gang scheduling in the thesis' three designs (§4.6.2, Fig. 4.8) on an embedded cluster of
//! three workers with cpu=4 each.
//!
//! Run it with `cargo run --release --example gang`. For each design, five applications ask at
//! once for gangs of three bundles (40 cpus in all, on 12): each gang is held whole before its
//! three members start, every member is dispatched at once onto its own bundle's node, and
//! after all gangs complete no gang resource and no cpu is left held. It prints what it checks
//! and the time each gang waited (a tour, not a benchmark: see `benches/` for measurements).
//!
//! - AppSpace ([`GhostGangs`]): one ghost per bundle; a timeout rolls back a partial hold and a
//!   seeded, jittered exponential back-off breaks live-lock. It also shows the rollback: a gang
//!   that cannot fit times out and leaves nothing behind.
//! - LibSpace ([`GangCoordinator`]): a shared service places gangs one at a time; never a
//!   partial hold by two gangs, so no timeout and no rollback.
//! - FrameSpace ([`NativeGangs`]): the head reserves every bundle atomically.

use std::sync::Arc;
use std::time::{Duration, Instant};

use escher::esl::EslError;
use escher::esl::gang::{
    CoordinatorConfig, GangCoordinator, GangRequest, GangScheduler, GhostConfig, GhostGangs,
    NativeGangs,
};
use escher::types::{ResourceSet, TaskState};
use escher::{Client, Functions, LocalCluster, Task};

type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn gangs(design: &str) -> AnyResult<Vec<GangRequest>> {
    let shapes: [&[&str]; 3] = [
        &["cpu=4", "cpu=4", "cpu=4"],
        &["cpu=2", "cpu=2", "cpu=2"],
        &["cpu=3", "cpu=1", "cpu=4"],
    ];
    (0..5)
        .map(|i| {
            let bundles = shapes[i % 3]
                .iter()
                .map(|b| b.parse::<ResourceSet>())
                .collect::<Result<Vec<_>, _>>()?;
            Ok(GangRequest::new(&format!("{design}-{i}"), bundles)?)
        })
        .collect()
}

/// One application: acquire, check, run the members, release. Returns how long it waited.
async fn app<S: GangScheduler>(s: &S, client: &Client, req: &GangRequest) -> AnyResult<Duration> {
    let asked = Instant::now();
    let gang = s.acquire(req).await?;
    let waited = asked.elapsed();
    for h in gang.holders() {
        if client.task_info(*h).await?.status.state != TaskState::Running {
            return Err(format!("{}: holder {h} is not running", req.name()).into());
        }
    }
    let members = gang
        .members()
        .iter()
        .map(|spec| spec.apply(Task::function_typed("nap", &100u64)))
        .collect::<Vec<_>>();
    let refs = client.submit_batch(members).await?;
    for r in &refs {
        if client.task_info(r).await?.status.state == TaskState::Pending {
            return Err(format!("{}: member {} had to wait", req.name(), r.id()).into());
        }
    }
    let (done, _) = client
        .wait(&refs, refs.len(), Some(Duration::from_secs(60)))
        .await?;
    if done.iter().any(|s| s.state != TaskState::Succeeded) {
        return Err(format!("{}: a member failed: {done:?}", req.name()).into());
    }
    s.release(gang).await?;
    Ok(waited)
}

/// Runs the five applications at once with schedulers from `make`; prints the waits.
async fn compete<S, F>(client: &Client, design: &str, make: F) -> AnyResult<()>
where
    S: GangScheduler + 'static,
    F: Fn(usize) -> Arc<S>,
{
    let mut apps = tokio::task::JoinSet::new();
    for (i, req) in gangs(design)?.into_iter().enumerate() {
        let (s, client) = (make(i), client.clone());
        apps.spawn(async move { app(s.as_ref(), &client, &req).await });
    }
    let mut waits = Vec::new();
    while let Some(out) = apps.join_next().await {
        waits.push(out??);
    }
    waits.sort();
    let ms: Vec<String> = waits
        .iter()
        .map(|w| format!("{:.0}", w.as_secs_f64() * 1e3))
        .collect();
    println!(
        "   5 gangs held whole, 15 members each dispatched at once onto its bundle; waits (ms): {}",
        ms.join(" ")
    );
    check_clean(client).await
}

async fn check_clean(client: &Client) -> AnyResult<()> {
    let status = client.cluster_status().await?;
    let left: Vec<String> = status
        .nodes
        .iter()
        .flat_map(|n| n.resources.iter().filter(|r| !r.name.is_physical()))
        .map(|r| r.name.to_string())
        .collect();
    let busy = status
        .nodes
        .iter()
        .filter_map(|n| n.resource("cpu"))
        .any(|r| !r.used.is_zero());
    if !left.is_empty() || busy {
        return Err(format!("left behind: {left:?}, cpu busy: {busy}").into());
    }
    println!("   nothing left behind: no gang resource, every cpu free");
    Ok(())
}

#[tokio::main]
async fn main() -> AnyResult<()> {
    let functions = Functions::new().typed_function("nap", |_ctx, ms: u64| async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok::<_, String>(())
    });
    let cluster = LocalCluster::builder()
        .functions(functions)
        .workers(3)
        .start()
        .await?;
    let client = cluster.client().await?;
    println!("3 workers x cpu=4; 5 applications x gangs of 3 bundles (40 cpus asked for)");

    println!("\n── AppSpace: ghost tasks, timeouts, seeded back-off");
    let blocker = client
        .submit(Task::ghost().name("blocker").resources_str("cpu=4"))
        .await?;
    let config = GhostConfig {
        timeout: Duration::from_millis(200),
        max_attempts: 2,
        ..GhostConfig::default()
    };
    let ghosts = GhostGangs::new(client.clone(), config);
    let big = gangs("big")?.remove(0);
    match ghosts.acquire(&big).await {
        Err(EslError::Timeout { .. }) => println!(
            "   a gang that cannot fit (one node blocked): {} partial holds rolled back, then gave up",
            ghosts.rollbacks()
        ),
        other => return Err(format!("expected a timeout, got {other:?}").into()),
    }
    // A running task ends when its worker confirms it has stopped, which a cancel does not wait
    // for: wait for it before counting what is free.
    client.cancel([&blocker]).await?;
    client
        .wait([&blocker], 1, Some(Duration::from_secs(30)))
        .await?;
    check_clean(&client).await?;
    let made = std::sync::Mutex::new(Vec::new());
    compete(&client, "app", |i| {
        let config = GhostConfig {
            timeout: Duration::from_secs(1),
            max_attempts: 200,
            seed: i as u64,
            ..GhostConfig::default()
        };
        let g = Arc::new(GhostGangs::new(client.clone(), config));
        made.lock().map(|mut m| m.push(g.clone())).ok();
        g
    })
    .await?;
    let rollbacks: u64 = made
        .lock()
        .map(|m| m.iter().map(|g| g.rollbacks()).sum())
        .unwrap_or(0);
    println!("   {rollbacks} rollbacks while competing");

    println!("\n── LibSpace: one coordinator serializes every gang request");
    let coordinator = Arc::new(GangCoordinator::spawn(
        client.clone(),
        CoordinatorConfig::default(),
    ));
    compete(&client, "lib", |_| coordinator.clone()).await?;

    println!("\n── FrameSpace: the head reserves all bundles atomically");
    let native = Arc::new(NativeGangs::new(client.clone(), None));
    compete(&client, "frame", |_| native.clone()).await?;

    cluster.shutdown().await;
    Ok(())
}
