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
    let limit = Duration::from_secs(600);
    let rate = measure(n, limit).await?;
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
    let mut detail = json!({ "tasks_per_s": rate });
    // The same with the fence supervisor an `escher-worker` runs (every task's process group
    // registered with it over a pipe): what fencing costs. Only the harness binary can serve
    // as the supervisor; from a test executable the second figure is left out.
    let exe = std::env::current_exe()?;
    let is_harness = exe.file_stem().is_some_and(|s| s == "escher-bench");
    if is_harness {
        escher::worker::fence::start(&exe)?;
        let fenced = measure(n, limit).await?;
        report.figures.push(Figure::new(
            "cmd.fenced_tasks_per_s",
            "the same, with the worker's fence supervisor",
            "tasks/s",
            fenced,
        ));
        report.figures.push(Figure::new(
            "cmd.fenced_ratio",
            "with the fence ÷ without",
            "×",
            fenced / rate,
        ));
        detail["fenced_tasks_per_s"] = json!(fenced);
    }
    report.detail = detail;
    Ok(report)
}

/// Starts a one-worker cluster and runs `n` command tasks through it; tasks/s.
async fn measure(n: usize, limit: Duration) -> anyhow::Result<f64> {
    let cluster = cluster::start(1, "cpu=8").await?;
    let client = cluster.client().await?;
    let task = || Task::command(["true"]).resource("cpu", 1);
    cluster::run_batch(&client, (0..20).map(|_| task()).collect(), limit).await?;
    let wall = cluster::run_batch(&client, (0..n).map(|_| task()).collect(), limit).await?;
    drop(client);
    cluster.shutdown().await;
    Ok(n as f64 / wall.as_secs_f64())
}
