//! W9, the cost of durability and replication: the W1 shape (no-op function tasks from one
//! client, 2 workers × 4 CPUs) against three heads in the same run, one after the other:
//!
//! - **in-memory**: one head, its raft log in memory (the W1 configuration);
//! - **durable**: one head with its raft log on disk (`--data-dir`): every batch of writes is
//!   fsync'd before it is acknowledged;
//! - **3 replicas**: a raft group of three durable heads in this process (each with its own
//!   log directory): every write is fsync'd by a majority before it is acknowledged.
//!
//! Each is measured submitting in batches of 1,000 and with one `submit()` per task (coalesced
//! by the client), and reported as tasks/s and as a ratio of the in-memory figure. docs/DESIGN.md
//! §8 asks that three replicas keep at least half of the in-memory throughput.
//!
//! In the W1 shape only 8 tasks run at once (8 CPUs, 1 each), and a CPU is free again only
//! once its task's end is committed, so a durable head finishes at most 8 tasks per commit:
//! its throughput is about 8 ÷ the commit latency (one fsync, or one fsync on a majority),
//! whatever the batching. A second shape shows what group commit does when more tasks run at
//! once: **wide**, the same tasks holding 0.01 CPU each (800 at once), batched.

use std::time::Duration;

use serde_json::json;

use super::Ctx;
use super::w1_throughput::submit_per_task;
use crate::cluster::{self, noop};
use crate::report::{Figure, WorkloadReport};

/// The configurations, in run order: (id, description, replicas, durable).
const CONFIGS: [(&str, &str, usize, bool); 4] = [
    ("memory", "one head, log in memory", 1, false),
    ("durable", "one head, log on disk (fsync)", 1, true),
    ("replicas3", "three durable replicas", 3, true),
    ("replicas3mem", "three replicas, logs in memory", 3, false),
];

/// A no-op task holding 0.01 CPU: 800 run at once on the 8 CPUs.
fn wide() -> escher::Task {
    escher::Task::function(cluster::NOOP, Vec::new()).resources_str("cpu=0.01")
}

/// Runs W9.
pub async fn run(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    let n = ctx.params.w9_tasks;
    let mut report = WorkloadReport::new(
        "w9",
        "throughput with a durable head and with three replicas, as a ratio of the in-memory head",
        ctx.size.as_str(),
    );
    report.setup = json!({
        "nodes": "2 in-process workers, cpu=4 each",
        "task": "function task `noop`, cpu=1",
        "tasks": n,
        "configurations": CONFIGS.iter().map(|c| c.1).collect::<Vec<_>>(),
        "disk": "the data directories are under the system temporary directory",
    });
    let limit = ctx.limit(Duration::from_secs(600));
    let mut base: Option<(f64, f64, f64)> = None;
    let mut detail = Vec::new();
    for (id, what, heads, durable) in CONFIGS {
        let dir = tempfile::Builder::new().prefix("escher-w9-").tempdir()?;
        let mut builder = cluster::builder(2, "cpu=4")?.heads(heads);
        if durable {
            builder = builder.data_dir(dir.path());
        }
        let cluster = builder.start().await?;
        let client = cluster.client().await?;
        cluster::run_batch(&client, (0..200).map(|_| noop()).collect(), limit).await?;
        let wall = cluster::run_batch(&client, (0..n).map(|_| noop()).collect(), limit).await?;
        let batched = n as f64 / wall.as_secs_f64();
        let wall = submit_per_task(&client, n, limit).await?;
        let per_task = n as f64 / wall.as_secs_f64();
        let wall = cluster::run_batch(&client, (0..n).map(|_| wide()).collect(), limit).await?;
        let wide_rate = n as f64 / wall.as_secs_f64();
        drop(client);
        cluster.shutdown().await;
        let (base_batched, base_per_task, base_wide) =
            *base.get_or_insert((batched, per_task, wide_rate));
        report.figures.push(Figure::new(
            format!("w9.{id}.wide"),
            format!("{what}: no-op tasks/s, 0.01 CPU each (800 at once), batches of 1,000"),
            "tasks/s",
            wide_rate,
        ));
        report.figures.push(Figure::new(
            format!("w9.{id}.batched"),
            format!("{what}: no-op tasks/s, batches of 1,000"),
            "tasks/s",
            batched,
        ));
        report.figures.push(Figure::new(
            format!("w9.{id}.per_task"),
            format!("{what}: no-op tasks/s, one submit() per task"),
            "tasks/s",
            per_task,
        ));
        if id != "memory" {
            report.figures.push(Figure::new(
                format!("w9.{id}.batched_ratio"),
                format!("{what} ÷ in-memory, batches of 1,000"),
                "× in-memory",
                batched / base_batched,
            ));
            report.figures.push(Figure::new(
                format!("w9.{id}.per_task_ratio"),
                format!("{what} ÷ in-memory, one submit() per task"),
                "× in-memory",
                per_task / base_per_task,
            ));
            report.figures.push(Figure::new(
                format!("w9.{id}.wide_ratio"),
                format!("{what} ÷ in-memory, 0.01 CPU each (800 at once)"),
                "× in-memory",
                wide_rate / base_wide,
            ));
        }
        detail.push(json!({
            "configuration": id,
            "batched_tasks_per_s": batched,
            "per_task_tasks_per_s": per_task,
            "wide_tasks_per_s": wide_rate,
        }));
    }
    report.detail = json!(detail);
    Ok(report)
}
