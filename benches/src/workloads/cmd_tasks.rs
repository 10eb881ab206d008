//! Command tasks: N tasks running `true`, submitted at once, from submission to the last
//! exit; tasks/s. This is the workload HyperQueue is compared on (its tasks are programs, not
//! functions): its Python `LocalCluster` with one worker of 8 cores against one escher worker
//! with `cpu=8`, each task holding one CPU in both. Both spawn a real child process per task
//! and keep its stdout and stderr, so the figure is dominated by process creation on 2 cores.

use std::time::Duration;

use escher::Task;
use escher::worker::exec::TaskUsers;
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
    // ext4 scans the inodes deleted in the last minutes whenever it creates a file, so every
    // file this workload creates is deleted only at its end: no measurement pays for the
    // files of another. The physical limit (this machine spawning and reaping `true` itself,
    // as many at once as the worker runs) is measured before and after escher's run, and the
    // faster of the two is the limit: files deleted in the minutes before the workload weigh
    // on both sides, and taking the best the machine did keeps escher's share conservative.
    let (before, limit_files) = spawn_limit(n, 8).await?;
    let plain = CmdCluster::start(limit).await?;
    let rate = plain.run(n, limit).await?;
    let (after, more_limit_files) = spawn_limit(n, 8).await?;
    let spawned = before.max(after);
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
         files; the faster of a run before escher's and one after)",
        "spawns/s",
        spawned,
    ));
    report.figures.push(Figure::new(
        "cmd.of_spawn_limit",
        "command tasks ÷ the physical limit (target ≥ 0.6)",
        "×",
        rate / spawned,
    ));
    let mut detail = json!({
        "tasks_per_s": rate,
        "spawn_limit_per_s": spawned,
        "spawn_limit_before_per_s": before,
        "spawn_limit_after_per_s": after,
    });
    // The same with the fence supervisor an `escher-worker` runs (every task's process group
    // registered with it over a pipe): what fencing costs. Only the harness binary can serve
    // as the supervisor; from a test executable the second figure is left out.
    let exe = std::env::current_exe()?;
    let is_harness = exe.file_stem().is_some_and(|s| s == "escher-bench");
    let mut fenced_cluster = None;
    if is_harness {
        escher::worker::fence::start(&exe)?;
        let cluster = CmdCluster::start(limit).await?;
        let fenced = cluster.run(n, limit).await?;
        fenced_cluster = Some(cluster);
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
    // Each namespace's tasks as a user of their own (what an `escher-worker` started as root
    // does), against the worker's own user, alternating three times on two clusters that
    // differ only in that: what the task boundary costs. Only a process that may change user
    // can measure it. Both are new, as for the cgroup's ratio below: the first cluster
    // started before the fence supervisor (its task cgroups cost the supervisor a line each)
    // and holds the log files of every run so far.
    if nix_is_root() {
        let worker_user = CmdCluster::start_as(limit, TaskUsers::Off).await?;
        let users = CmdCluster::start_as(limit, TaskUsers::Auto).await?;
        let (mut shared, mut own) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            shared.push(worker_user.run(n, limit).await?);
            own.push(users.run(n, limit).await?);
        }
        worker_user.shutdown().await;
        users.shutdown().await;
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (shared_rate, own_rate) = (median(&mut shared), median(&mut own));
        report.figures.push(Figure::new(
            "cmd.per_uid_tasks_per_s",
            "the same, each namespace's tasks as a user of their own (median of 3, alternating \
             with the worker's own user)",
            "tasks/s",
            own_rate,
        ));
        report.figures.push(Figure::new(
            "cmd.per_uid_ratio",
            "a user per namespace ÷ the worker's user (target ≥ 0.9)",
            "×",
            own_rate / shared_rate,
        ));
        detail["per_uid_runs_tasks_per_s"] = json!(own);
        detail["shared_user_runs_tasks_per_s"] = json!(shared);
    }
    // A cgroup per command task (what a worker that may create cgroups does, as root does)
    // against the process group alone, alternating three times on two clusters that differ
    // only in that: what kernel containment costs. Both are new: the first cluster started
    // before the fence supervisor, so its worker's directory of task cgroups is not
    // registered with it as an `escher-worker`'s is at start, and each of its tasks costs the
    // supervisor a line; and it holds the log files of every run so far.
    if nix_is_root() {
        let bare = CmdCluster::start_with(limit, TaskUsers::Off, false).await?;
        let cgrouped = CmdCluster::start_with(limit, TaskUsers::Off, true).await?;
        let (mut without, mut with) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            without.push(bare.run(n, limit).await?);
            with.push(cgrouped.run(n, limit).await?);
        }
        bare.shutdown().await;
        cgrouped.shutdown().await;
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (without_rate, with_rate) = (median(&mut without), median(&mut with));
        report.figures.push(Figure::new(
            "cmd.cgroup_ratio",
            "a cgroup per task ÷ its process group only (median of 3, alternating)",
            "×",
            with_rate / without_rate,
        ));
        detail["cgroup_runs_tasks_per_s"] = json!(with);
        detail["no_cgroup_runs_tasks_per_s"] = json!(without);
    }
    // The whole containment of a root worker (a user per namespace, and a cgroup per task
    // holding it to its request) against neither, alternating three times on two clusters
    // that differ only in that: what the tenant boundary and the limits cost together
    // (target: at least 0.8 of the throughput without them).
    if nix_is_root() {
        let bare = CmdCluster::start_with(limit, TaskUsers::Off, false).await?;
        let contained = CmdCluster::start_with(limit, TaskUsers::Auto, true).await?;
        let (mut without, mut with) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            without.push(bare.run(n, limit).await?);
            with.push(contained.run(n, limit).await?);
        }
        bare.shutdown().await;
        contained.shutdown().await;
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (without_rate, with_rate) = (median(&mut without), median(&mut with));
        report.figures.push(Figure::new(
            "cmd.contained_tasks_per_s",
            "the same, each namespace's tasks as a user of their own and in a cgroup holding \
             them to their request (median of 3, alternating with neither)",
            "tasks/s",
            with_rate,
        ));
        report.figures.push(Figure::new(
            "cmd.contained_ratio",
            "a user per namespace and limits ÷ neither (target ≥ 0.8)",
            "×",
            with_rate / without_rate,
        ));
        detail["contained_runs_tasks_per_s"] = json!(with);
        detail["uncontained_runs_tasks_per_s"] = json!(without);
    }
    // Now the files go: the clusters' logs, then the limit's.
    plain.shutdown().await;
    if let Some(cluster) = fenced_cluster {
        cluster.shutdown().await;
    }
    drop((limit_files, more_limit_files));
    report.detail = detail;
    Ok(report)
}

/// A one-worker cluster (`cpu=8`) for command tasks, warmed up, with a client.
struct CmdCluster {
    cluster: escher::LocalCluster,
    client: escher::Client,
}

impl CmdCluster {
    /// Starts the cluster and runs 20 tasks through it.
    async fn start(limit: Duration) -> anyhow::Result<CmdCluster> {
        CmdCluster::start_as(limit, TaskUsers::Off).await
    }

    /// The same, its worker running command tasks as `users` says.
    async fn start_as(limit: Duration, users: TaskUsers) -> anyhow::Result<CmdCluster> {
        CmdCluster::start_with(limit, users, true).await
    }

    /// The same, with or without a cgroup per command task.
    async fn start_with(
        limit: Duration,
        users: TaskUsers,
        cgroups: bool,
    ) -> anyhow::Result<CmdCluster> {
        let cluster = cluster::builder(1, "cpu=8")?
            .task_users(users)
            .task_cgroups(cgroups)
            .start()
            .await?;
        let client = cluster.client().await?;
        cluster::run_batch(&client, (0..20).map(|_| task()).collect(), limit).await?;
        Ok(CmdCluster { cluster, client })
    }

    /// Runs `n` command tasks, submitted at once; tasks/s.
    async fn run(&self, n: usize, limit: Duration) -> anyhow::Result<f64> {
        let wall =
            cluster::run_batch(&self.client, (0..n).map(|_| task()).collect(), limit).await?;
        Ok(n as f64 / wall.as_secs_f64())
    }

    /// Stops the cluster (its worker deletes its logs).
    async fn shutdown(self) {
        drop(self.client);
        self.cluster.shutdown().await;
    }
}

/// Whether this process runs as root (and so may run tasks as other users).
fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// The task: `true`, holding one CPU.
fn task() -> Task {
    Task::command(["true"]).resource("cpu", 1)
}

/// Spawns `true` `n` times, `concurrency` at once, each with its stdout and stderr in a file
/// of its own (as a worker keeps them), waiting for each; spawns/s. No scheduler, no worker:
/// what the machine itself allows. Returns the directory of the files too, for the caller to
/// delete when deleting them no longer weighs on what it measures.
async fn spawn_limit(n: usize, concurrency: usize) -> anyhow::Result<(f64, tempfile::TempDir)> {
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
    Ok((n as f64 / start.elapsed().as_secs_f64(), dir))
}
