//! Command tasks: N tasks running `true`, submitted at once, from submission to the last
//! exit; tasks/s. This is the workload HyperQueue is compared on (its tasks are programs, not
//! functions): its Python `LocalCluster` with one worker of 8 cores against one escher worker
//! with `cpu=8`, each task holding one CPU in both. Both spawn a real child process per task
//! and keep its stdout and stderr, so the figure is dominated by process creation on 2 cores.

use std::time::Duration;

use escher::Task;
use serde_json::json;

use super::Ctx;
use crate::cluster;
use crate::report::{Figure, WorkloadReport};

/// Runs the command-task workload.
pub async fn run(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    let n = ctx.params.cmd_tasks;
    let mut report = WorkloadReport::new(
        "cmd",
        "command tasks (`true`) submitted at once: the HyperQueue comparison",
        ctx.size.as_str(),
    );
    report.setup = json!({
        "nodes": "1 in-process worker, cpu=8 (HyperQueue: LocalCluster with one 8-core worker)",
        "task": "command task `true`, cpu=1; stdout and stderr kept",
        "tasks": n,
    });
    let cluster = cluster::start(1, "cpu=8").await?;
    let client = cluster.client().await?;
    let limit = Duration::from_secs(600);
    let task = || Task::command(["true"]).resource("cpu", 1);
    cluster::run_batch(&client, (0..20).map(|_| task()).collect(), limit).await?;
    let wall = cluster::run_batch(&client, (0..n).map(|_| task()).collect(), limit).await?;
    let rate = n as f64 / wall.as_secs_f64();
    report.figures.push(
        Figure::new(
            "cmd.tasks_per_s",
            format!(
                "{} command tasks `true`, submitted at once",
                crate::report::num(n as f64)
            ),
            "tasks/s",
            rate,
        )
        .vs("hyperqueue", "cmd"),
    );
    report.detail = json!({ "wall_s": wall.as_secs_f64() });
    drop(client);
    cluster.shutdown().await;
    Ok(report)
}
