//! The escher side of every workload: an embedded cluster (head and workers in this process,
//! over real gRPC on loopback) and the task batches the workloads submit.
//!
//! "Nodes" are in-process workers from the worker library (`LocalCluster::builder().worker`),
//! each with logical resources (`cpu=N`): each registers over its own HTTP/2 connection and
//! holds its own `WorkerLink` stream, exactly as a worker on another machine would. W8 uses
//! lighter simulated workers instead (`sim.rs`).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use escher::types::{ResourceSet, TaskId};
use escher::{Client, Functions, LocalCluster, LocalClusterBuilder, Task};

/// The no-op function every worker registers.
pub const NOOP: &str = "noop";

/// How many tasks one `Submit` call carries when a workload submits in batches.
pub const SUBMIT_BATCH: usize = 1_000;

/// The function that returns its arguments.
pub const ECHO: &str = "echo";

/// The function handlers of benchmark workers: `noop` returns nothing at once, `echo` returns
/// its arguments at once.
pub fn functions() -> Functions {
    Functions::new()
        .function(NOOP, |_ctx, _args| async move { Ok(Vec::new()) })
        .function(ECHO, |_ctx, args| async move { Ok(args) })
}

/// A no-op function task holding one CPU (Ray's default for a task).
pub fn noop() -> Task {
    Task::function(NOOP, Vec::new()).resource("cpu", 1)
}

/// Starts a cluster of `nodes` in-process workers, each with `resources` (e.g. `cpu=4`).
pub async fn start(nodes: usize, resources: &str) -> anyhow::Result<LocalCluster> {
    builder(nodes, resources)?
        .start()
        .await
        .context("cannot start the local cluster")
}

/// The builder of [`start`]'s cluster, for workloads that change the head (W9).
pub fn builder(nodes: usize, resources: &str) -> anyhow::Result<LocalClusterBuilder> {
    let set: ResourceSet = resources
        .parse()
        .with_context(|| format!("bad resources {resources:?}"))?;
    let mut builder = LocalCluster::builder().no_workers().functions(functions());
    for _ in 0..nodes {
        builder = builder.worker(set.clone());
    }
    Ok(builder)
}

/// Submits `tasks` in calls of [`SUBMIT_BATCH`]; returns their ids.
pub async fn submit_all(client: &Client, tasks: Vec<Task>) -> anyhow::Result<Vec<TaskId>> {
    let mut ids = Vec::with_capacity(tasks.len());
    let mut tasks = tasks.into_iter().peekable();
    while tasks.peek().is_some() {
        let chunk: Vec<Task> = tasks.by_ref().take(SUBMIT_BATCH).collect();
        ids.extend(client.submit_batch(chunk).await?.iter().map(|r| r.id()));
    }
    Ok(ids)
}

/// Waits until every task in `ids` has finished (at most `limit`), and checks they succeeded.
pub async fn wait_all(client: &Client, ids: &[TaskId], limit: Duration) -> anyhow::Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let (ready, not_ready) = client
        .wait(ids.iter().copied(), ids.len(), Some(limit))
        .await?;
    if !not_ready.is_empty() {
        bail!(
            "{} of {} tasks had not finished after {limit:?}",
            not_ready.len(),
            ids.len()
        );
    }
    if let Some(bad) = ready
        .iter()
        .find(|s| s.state != escher::types::TaskState::Succeeded)
    {
        bail!("task {} ended {:?}: {:?}", bad.id, bad.state, bad.reason);
    }
    Ok(())
}

/// Submits `tasks` in batches and waits for all; returns the wall time from the first submit
/// to the last result.
pub async fn run_batch(
    client: &Client,
    tasks: Vec<Task>,
    limit: Duration,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let ids = submit_all(client, tasks).await?;
    wait_all(client, &ids, limit).await?;
    Ok(start.elapsed())
}

/// One submit-then-get round trip of `task`.
pub async fn round_trip(client: &Client, task: Task, limit: Duration) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let r = client.submit(task).await?;
    client.get_result(r.id(), Some(limit)).await?;
    Ok(start.elapsed())
}
