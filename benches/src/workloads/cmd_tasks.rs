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
    // The physical limit: this machine spawning and reaping `true` itself, as many at once as
    // the worker runs, measured in the same run; first, so that the files it creates and
    // deletes weigh on escher's run rather than the other way round (ext4 scans recently
    // deleted inodes when it creates a file).
    let spawned = spawn_limit(n, 8).await?;
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
    report.figures.push(Figure::new(
        "cmd.spawn_limit_per_s",
        "the physical limit: `true` spawned and reaped directly (tokio, 8 at once, output to \
         files)",
        "spawns/s",
        spawned,
    ));
    report.figures.push(Figure::new(
        "cmd.of_spawn_limit",
        "command tasks ÷ the physical limit (target ≥ 0.6)",
        "×",
        rate / spawned,
    ));
    let mut detail = json!({ "tasks_per_s": rate, "spawn_limit_per_s": spawned });
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

/// Spawns `true` `n` times, `concurrency` at once, each with its stdout and stderr in a file
/// of its own (as a worker keeps them), waiting for each; spawns/s. No scheduler, no worker:
/// what the machine itself allows.
async fn spawn_limit(n: usize, concurrency: usize) -> anyhow::Result<f64> {
    let dir = tempfile::tempdir()?;
    let spawn_one = |i: usize| {
        let dir = dir.path().to_path_buf();
        async move {
            let out = std::fs::File::create(dir.join(format!("{i}.out")))?;
            let err = std::fs::File::create(dir.join(format!("{i}.err")))?;
            let status = tokio::process::Command::new("true")
                .stdin(std::process::Stdio::null())
                .stdout(out)
                .stderr(err)
                .status()
                .await?;
            anyhow::ensure!(status.success(), "`true` failed: {status}");
            Ok::<_, anyhow::Error>(())
        }
    };
    let start = std::time::Instant::now();
    let mut running = tokio::task::JoinSet::new();
    for i in 0..n {
        if running.len() == concurrency {
            running.join_next().await.expect("one runs")??;
        }
        running.spawn(spawn_one(i));
    }
    while let Some(done) = running.join_next().await {
        done??;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}
