//! W1 throughput: no-op function tasks submitted asynchronously from one client; tasks/s.
//!
//! Two ways of submitting, both without waiting for results until everything is in:
//! - **batched**: `submit_batch` of 1,000 tasks per call (what an application that has many
//!   tasks at hand does);
//! - **per task**: one `submit()` call per task, 256 calls in flight on the one client (the
//!   shape of Ray's `f.remote()` loop); the client coalesces calls in flight into batched
//!   `Submit` RPCs.
//!
//! The cluster mirrors the Ray peer's `ray.init(num_cpus=8)`: two workers with 4 CPUs each, and
//! each task holds one CPU (Ray's default), so at most 8 run at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::task::JoinSet;

use super::Ctx;
use crate::cluster::{self, noop};
use crate::report::{Figure, Line, Plot, PlotData, WorkloadReport};

/// How many single-task `Submit` calls are in flight at once in the per-task mode.
const IN_FLIGHT: usize = 256;

/// Runs W1.
pub async fn run(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    let mut report = WorkloadReport::new(
        "w1",
        "throughput: no-op function tasks submitted asynchronously from one client",
        ctx.size.as_str(),
    );
    report.setup = json!({
        "nodes": "2 in-process workers (worker library), cpu=4 each: 8 CPUs, like ray.init(num_cpus=8)",
        "task": "function task `noop`, cpu=1",
        "batched": "submit_batch of 1,000 tasks per Submit call, then one wait for all",
        "per_task": format!("one Submit call per task, {IN_FLIGHT} in flight, then one wait for all"),
        "tasks": ctx.params.w1_tasks,
    });
    let cluster = cluster::start(2, "cpu=4").await?;
    let client = cluster.client().await?;
    let limit = ctx.limit(Duration::from_secs(600));
    // Warm up connections and allocations.
    cluster::run_batch(&client, (0..200).map(|_| noop()).collect(), limit).await?;

    let mut batched = Vec::new();
    let mut per_task = Vec::new();
    let mut detail = Vec::new();
    for &n in &ctx.params.w1_tasks {
        let wall = cluster::run_batch(&client, (0..n).map(|_| noop()).collect(), limit).await?;
        let rate = n as f64 / wall.as_secs_f64();
        batched.push((n as f64, rate));
        report.figures.push(
            Figure::new(
                format!("w1.batched.{n}"),
                format!(
                    "{} no-op tasks, async, one client, batches of 1,000",
                    thousands(n)
                ),
                "tasks/s",
                rate,
            )
            .vs("ray", &format!("w1.{n}")),
        );

        let wall = submit_per_task(&client, n, limit).await?;
        let rate_single = n as f64 / wall.as_secs_f64();
        per_task.push((n as f64, rate_single));
        report.figures.push(
            Figure::new(
                format!("w1.per_task.{n}"),
                format!(
                    "{} no-op tasks, async, one client, one submit() call per task (coalesced by the client)",
                    thousands(n)
                ),
                "tasks/s",
                rate_single,
            )
            .vs("ray", &format!("w1.{n}")),
        );
        detail.push(
            json!({"tasks": n, "batched_tasks_per_s": rate, "per_task_tasks_per_s": rate_single}),
        );
    }
    report.detail = json!(detail);
    report.plots.push(Plot {
        file: "w1-throughput.png".into(),
        title: "W1: no-op task throughput from one client".into(),
        x_label: "tasks submitted".into(),
        y_label: "tasks/s".into(),
        data: PlotData::Lines {
            lines: vec![
                Line {
                    name: "escher, batches of 1,000".into(),
                    points: batched,
                },
                Line {
                    name: "escher, one submit() per task".into(),
                    points: per_task,
                },
            ],
            x_log: true,
        },
    });
    drop(client);
    cluster.shutdown().await;
    Ok(report)
}

/// Submits `n` no-op tasks one `Submit` call each, [`IN_FLIGHT`] at a time, then waits for all.
pub(crate) async fn submit_per_task(
    client: &escher::Client,
    n: usize,
    limit: Duration,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let client = Arc::new(client.clone());
    let mut ids = Vec::with_capacity(n);
    let mut set = JoinSet::new();
    for _ in 0..n {
        if set.len() >= IN_FLIGHT
            && let Some(done) = set.join_next().await
        {
            ids.push(done??);
        }
        let c = Arc::clone(&client);
        set.spawn(async move { c.submit(noop()).await.map(|r| r.id()) });
    }
    while let Some(done) = set.join_next().await {
        ids.push(done??);
    }
    cluster::wait_all(&client, &ids, limit).await?;
    Ok(start.elapsed())
}

/// `100000` as `100,000`.
pub fn thousands(n: usize) -> String {
    crate::report::num(n as f64)
}
