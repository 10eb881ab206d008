//! The GPU policies end to end (issue 13): MIGM's schemes A and B against the sequential
//! full-GPU baseline, each driven on a cluster's GPU ([`escher::esl::gpu::drive`]) through the
//! head and a worker, on an embedded cluster whose worker has a simulated A100-40GB. Every job
//! is a real command task running `escher sim-work` (this binary serves as that program) on
//! the MIG slice the policy launched it on; every reconfiguration is the worker's, with
//! MIGRator's latency model; time is compressed (a simulated second lasts `scale` wall
//! seconds, the same for the jobs and the reconfigurations).
//!
//! The mixes are MIGM's, as `examples/gpu_policies.rs` builds them for the in-memory
//! simulator (same job models: 20 s on the whole GPU; small 4 GB / 1 GPC, medium 9 GB / 2,
//! large 15 GB / 3, full 30 GB / 7; Ml3's 18 GB / 4), fewer jobs so that a run stays short.
//! What the cluster adds to the simulator's figures is everything real: process starts, the
//! scheduler's placement, the policy's polling round (25 ms), the reconfiguration round trip.
//! Throughput and energy are normalised to the sequential baseline measured in the same run;
//! energy is the jobs' reported busy energy plus the GPU's idle power over the makespan
//! (`escher_proto::mig::PowerModel`), so only ratios mean anything.

use std::time::{Duration, Instant};

use escher::esl::gpu::{
    ClusterGpu, DriveReport, GpuPolicy, Migm, MigmJob, Scheme, Sequential, drive,
};
use escher::types::{TaskId, TaskSpec, TaskState};
use escher::{LocalCluster, Task};
use escher_proto::mig::{GpuModel, JobModel, MemoryModel, PowerModel, SpeedModel};
use serde_json::json;

use super::Ctx;
use crate::report::{Better, Figure, Line, Plot, PlotData, WorkloadReport};

/// The argument that makes this binary run `escher sim-work` (see `bin/escher-bench.rs`).
pub const SIM_WORK_ARG: &str = "sim-work";

/// One mix: its name, its jobs, and the MIGM paper's gain of scheme A and B where it gives one.
struct Mix {
    name: &'static str,
    jobs: Vec<JobModel>,
    paper: (Option<f64>, Option<f64>),
}

/// `small : medium : large : full` jobs, interleaved as MIGM's heterogeneous mixes.
fn mix(small: usize, medium: usize, large: usize, full: usize) -> Vec<JobModel> {
    let kinds = [
        (small, JobModel::fixed(20.0, 1, 4.0)),
        (medium, JobModel::fixed(20.0, 2, 9.0)),
        (large, JobModel::fixed(20.0, 3, 15.0)),
        (full, JobModel::fixed(20.0, 7, 30.0)),
    ];
    let most = kinds.iter().map(|(n, _)| *n).max().unwrap_or(0);
    let mut out = Vec::new();
    for i in 0..most {
        for (n, job) in &kinds {
            if i < *n {
                out.push(*job);
            }
        }
    }
    out
}

fn mixes(ctx: &Ctx) -> Vec<Mix> {
    let k = ctx.size.pick(1, 2, 2);
    vec![
        Mix {
            name: "Hm2",
            jobs: vec![JobModel::fixed(20.0, 1, 4.0); 7 * k],
            paper: (Some(6.2), Some(6.2)),
        },
        Mix {
            name: "Ht1",
            jobs: mix(4 * k, 0, k, k),
            paper: (Some(1.64), Some(1.47)),
        },
        Mix {
            name: "Ml3",
            jobs: vec![JobModel::fixed(20.0, 4, 18.0); 3 * k],
            paper: (Some(1.24), Some(1.43)),
        },
    ]
}

/// What one policy's run on one mix gave.
#[derive(Debug, Clone, serde::Serialize)]
struct Outcome {
    policy: String,
    /// Makespan in simulated seconds.
    makespan_s: f64,
    /// Busy plus idle energy, simulated joules.
    energy_j: f64,
    reconfigurations: usize,
    restarts: usize,
    /// (simulated s, instances) each time the layout changed.
    layouts: Vec<(f64, usize, String)>,
}

/// The `sim-work` command of a job, time compressed by `scale`.
fn spec(exe: &str, job: &JobModel, scale: f64) -> TaskSpec {
    let mut argv = vec![
        exe.to_string(),
        SIM_WORK_ARG.to_string(),
        "--work".into(),
        job.work_s.to_string(),
        "--gpcs".into(),
        job.parallelism.to_string(),
        "--iterations".into(),
        iterations(job).to_string(),
        "--scale".into(),
        scale.to_string(),
    ];
    match job.memory {
        MemoryModel::Fixed { gb } => argv.extend(["--mem-gb".into(), gb.to_string()]),
        MemoryModel::Growing {
            base_gb,
            per_iteration_gb,
            jitter_gb,
            seed,
        } => argv.extend([
            "--mem-gb".into(),
            base_gb.to_string(),
            "--mem-growth-gb".into(),
            per_iteration_gb.to_string(),
            "--mem-jitter-gb".into(),
            jitter_gb.to_string(),
            "--seed".into(),
            seed.to_string(),
        ]),
    }
    if job.pcie_bound {
        argv.push("--pcie-bound".into());
    }
    escher::Task::command(argv)
        .build()
        .expect("a valid command spec")
}

/// A job's iterations (telemetry samples): its own, at least 4.
fn iterations(job: &JobModel) -> u32 {
    job.iterations.max(4)
}

/// What MIGM is told of a job's memory before it runs: a fixed job's peak, a growing job's
/// first iteration (what a static estimate sees; the growth is what restarts are for).
fn estimate_gb(job: &JobModel) -> f64 {
    match job.memory {
        MemoryModel::Fixed { gb } => gb,
        MemoryModel::Growing { base_gb, .. } => base_gb,
    }
}

/// Runs `policy` over `jobs` on a fresh cluster; the outcome and the drive's report.
async fn run_one(
    policy: &mut dyn Policy,
    jobs: &[JobModel],
    scale: f64,
) -> anyhow::Result<(Outcome, DriveReport)> {
    let cluster = LocalCluster::builder()
        .no_workers()
        .worker_with_gpus("cpu=16".parse()?, ["a100-40gb:mig="])
        .sim_mig_latency_scale(scale)
        .start()
        .await?;
    let client = cluster.client().await?;
    let node = cluster.nodes()[0];
    let mut gpu = ClusterGpu::new(client.clone(), node, 0).await?;
    let exe = std::env::current_exe()?.display().to_string();
    let specs = jobs.iter().map(|j| spec(&exe, j, scale)).collect();
    let ids = gpu.submit(specs).await?;
    for (id, job) in ids.iter().zip(jobs) {
        policy.add(*id, job);
    }
    let started = Instant::now();
    let report = drive(policy.as_policy(), &mut gpu, Duration::from_secs(600)).await?;
    let wall = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        report.finished_at.is_some() && report.refused.is_empty() && report.failed.is_empty(),
        "{} did not finish cleanly: {:?}",
        policy.as_policy().name(),
        report
    );
    let telemetry = client.telemetry(ids.clone(), None).await?;
    let busy: f64 = telemetry.iter().filter_map(|t| t.latest("energy_j")).sum();
    let makespan_s = wall / scale;
    let idle = PowerModel::default().power_w(0) * makespan_s;
    let outcome = Outcome {
        policy: policy.as_policy().name(),
        makespan_s,
        energy_j: busy + idle,
        reconfigurations: report.reconfigurations,
        restarts: policy.restarts(),
        layouts: report
            .layouts
            .iter()
            .map(|(ms, l)| {
                (
                    *ms as f64 / 1000.0 / scale,
                    l.placements().len(),
                    l.to_string(),
                )
            })
            .collect(),
    };
    cluster.shutdown().await;
    Ok((outcome, report))
}

/// The policies compared, behind one face.
trait Policy: Send {
    fn add(&mut self, task: TaskId, job: &JobModel);
    fn as_policy(&mut self) -> &mut dyn GpuPolicy;
    fn restarts(&self) -> usize;
}

impl Policy for Migm {
    fn add(&mut self, task: TaskId, job: &JobModel) {
        self.submit(MigmJob {
            task,
            memory_gb: Some(estimate_gb(job)),
            iterations: iterations(job),
        });
    }
    fn as_policy(&mut self) -> &mut dyn GpuPolicy {
        self
    }
    fn restarts(&self) -> usize {
        Migm::restarts(self).len()
    }
}

impl Policy for Sequential {
    fn add(&mut self, task: TaskId, _: &JobModel) {
        self.submit(task);
    }
    fn as_policy(&mut self) -> &mut dyn GpuPolicy {
        self
    }
    fn restarts(&self) -> usize {
        0
    }
}

/// The `gpu` workload (see the module doc).
pub async fn run(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    let scale = ctx.size.pick(0.01, 0.02, 0.05);
    let model = GpuModel::A100_40GB;
    let mut report = WorkloadReport::new(
        "gpu",
        "GPU policies end to end: MIGM A and B against the sequential full GPU, on a cluster's simulated A100",
        ctx.size.as_str(),
    );
    report.setup = json!({
        "cluster": "a head and one in-process worker over gRPC on loopback; --sim-gpu a100-40gb:mig= (no instances at start)",
        "jobs": "command tasks running `escher sim-work` on the slice the policy launched them on (4 iterations each)",
        "time": format!("1 simulated s = {scale} wall s, for the jobs and for MIGRator's reconfiguration latency (0.5 s destroy; 1.5 s create, 1.5 s library and 2.5 s model load per new instance)"),
        "policy round": "25 ms (drive polls the GPU and the launched tasks)",
        "energy": "jobs' busy energy (200 W x GPCs/7 over their run) + 50 W idle over the makespan",
    });
    let mut detail = Vec::new();
    for mix in mixes(ctx) {
        let seq = run_one(&mut Sequential::new(model), &mix.jobs, scale).await?;
        let a = run_one(
            &mut Migm::new(model, Scheme::BySize, false),
            &mix.jobs,
            scale,
        )
        .await?;
        let b = run_one(&mut Migm::new(model, Scheme::Fifo, false), &mix.jobs, scale).await?;
        let base = &seq.0;
        for ((scheme, run), paper) in [("a", &a.0), ("b", &b.0)]
            .into_iter()
            .zip([mix.paper.0, mix.paper.1])
        {
            let mut thru = Figure::new(
                format!("gpu.{}.throughput.{scheme}", mix.name.to_lowercase()),
                format!(
                    "{}: {} jobs, MIGM scheme {} throughput / sequential ({} reconfigurations)",
                    mix.name,
                    mix.jobs.len(),
                    scheme.to_uppercase(),
                    run.reconfigurations
                ),
                "x",
                base.makespan_s / run.makespan_s,
            );
            thru.better = Better::Higher;
            if let Some(p) = paper {
                thru = thru.thesis(p);
            }
            report.figures.push(thru);
            let mut energy = Figure::new(
                format!("gpu.{}.energy.{scheme}", mix.name.to_lowercase()),
                format!(
                    "{}: MIGM scheme {} energy saving (sequential / MIGM)",
                    mix.name,
                    scheme.to_uppercase()
                ),
                "x",
                base.energy_j / run.energy_j,
            );
            energy.better = Better::Higher;
            report.figures.push(energy);
        }
        if mix.name == "Ht1" {
            // A staircase: each layout holds until the next, the last until the makespan.
            let step = |o: &Outcome| {
                let mut points = Vec::new();
                for (i, (t, n, _)) in o.layouts.iter().enumerate() {
                    if i > 0 {
                        points.push((*t, o.layouts[i - 1].1 as f64));
                    }
                    points.push((*t, *n as f64));
                }
                if let Some((_, n, _)) = o.layouts.last() {
                    points.push((o.makespan_s, *n as f64));
                }
                Line {
                    name: o.policy.clone(),
                    points,
                }
            };
            report.plots.push(Plot {
                file: "gpu-migm-layouts.png".into(),
                title: "MIGM on a cluster's A100 (Ht1): instances in the GPU's layout over time"
                    .into(),
                x_label: "simulated seconds".into(),
                y_label: "MIG instances".into(),
                data: PlotData::Lines {
                    lines: vec![step(&a.0), step(&b.0)],
                    x_log: false,
                },
            });
        }
        detail.push(json!({
            "mix": mix.name,
            "jobs": mix.jobs.len(),
            "sequential": seq.0,
            "migm_a": a.0,
            "migm_b": b.0,
        }));
    }
    detail.push(restarts(ctx, scale, &mut report).await?);
    detail.push(preinitialization(scale, &mut report).await?);
    report.notes.push(
        "the paper's figures (the thesis column) are MIGM's measured gains on an A100 with Rodinia; \
         ours use the assumed job models of proto/src/mig/work.rs, on fewer jobs"
            .into(),
    );
    report.detail = json!(detail);
    Ok(report)
}

/// MIGM's restarts end to end: jobs whose memory grows past the slice their estimate picks,
/// under scheme B with the out-of-memory restart alone and with early restart from the
/// memory predictor. The waste is the GPU time of the attempts a restart threw away.
async fn restarts(
    ctx: &Ctx,
    scale: f64,
    report: &mut WorkloadReport,
) -> anyhow::Result<serde_json::Value> {
    let model = GpuModel::A100_40GB;
    // 2 GB growing by 0.25 GB per iteration to 7 GB: estimated 2, so started on a 1g.5gb
    // slice, out of memory at iteration 12 of 20 (2 s each).
    let job = JobModel {
        work_s: 40.0,
        parallelism: 1,
        pcie_bound: false,
        memory: MemoryModel::Growing {
            base_gb: 2.0,
            per_iteration_gb: 0.25,
            jitter_gb: 0.05,
            seed: 7,
        },
        iterations: 20,
    };
    let jobs = vec![job; ctx.size.pick(2, 4, 6)];
    let mut out = Vec::new();
    for early in [false, true] {
        let mut migm = Migm::new(model, Scheme::Fifo, early);
        let (outcome, _) = run_one(&mut migm, &jobs, scale).await?;
        let speed = SpeedModel::default();
        let wasted: f64 = migm
            .restarts()
            .iter()
            .map(|r| {
                speed.duration_s(&job, r.from.profile) / f64::from(job.iterations)
                    * f64::from(r.iteration)
            })
            .sum();
        let which = if early { "predicted" } else { "oom" };
        let mut f = Figure::new(
            format!("gpu.grow.makespan.{which}"),
            format!(
                "{} growing jobs, MIGM B with {}: makespan ({} restarts, {wasted:.0} s of slice time thrown away)",
                jobs.len(),
                if early {
                    "early restart"
                } else {
                    "out-of-memory restart only"
                },
                outcome.restarts
            ),
            "s (simulated)",
            outcome.makespan_s,
        );
        f.better = Better::Lower;
        report.figures.push(f);
        let mut w = Figure::new(
            format!("gpu.grow.wasted.{which}"),
            format!("growing jobs, {which} restarts: slice time of the attempts thrown away"),
            "s (simulated)",
            wasted,
        );
        w.better = Better::Lower;
        report.figures.push(w);
        out.push(json!({ "early_restart": early, "outcome": outcome, "wasted_s": wasted }));
    }
    Ok(json!({ "mix": "grow", "runs": out }))
}

/// MIGRator's pre-initialization through the framework (`escher mig prepare`): a GPU serving
/// on its 3g.20gb@4 goes from 2g@0, 2g@2, 3g@4 to 4g@0, 2g@4, 1g@6 when the serving task ends.
/// Applied at that switch, the whole reconfiguration is on the switch's path; prepared while
/// the 3g serves (the idle 2g's fused into the 4g ahead of time), only the 3g's replacement
/// is. The switch's time is the framework's own report of it (`last_reconfiguration`: from
/// the request to the worker's done), in simulated seconds.
async fn preinitialization(
    scale: f64,
    report: &mut WorkloadReport,
) -> anyhow::Result<serde_json::Value> {
    let (from, to) = (
        "2g.10gb@0,2g.10gb@2,3g.20gb@4",
        "4g.20gb@0,2g.10gb@4,1g.5gb@6",
    );
    let mut switch_s = Vec::new();
    let mut out = Vec::new();
    for prepare in [false, true] {
        let gpu = format!("a100-40gb:mig={from}");
        let cluster = LocalCluster::builder()
            .no_workers()
            .worker_with_gpus("cpu=4".parse()?, [gpu])
            .sim_mig_latency_scale(scale)
            .start()
            .await?;
        let client = cluster.client().await?;
        let node = cluster.nodes()[0];
        let serving = client
            .submit(Task::command(["sleep", "600"]).resources_str("mig.3g.20gb=1"))
            .await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while client.task_info(&serving).await?.status.state != TaskState::Running {
            anyhow::ensure!(Instant::now() < deadline, "the serving task did not start");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let ahead = if prepare {
            client.prepare_mig_layout(node, 0, to).await?;
            let done = client
                .wait_mig_layout(node, 0, Some(Duration::from_secs(60)))
                .await?;
            done.last_reconfiguration
        } else {
            None
        };
        // The switch: the serving task ends, then the layout.
        client.cancel([&serving]).await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match client.apply_mig_layout(node, 0, to, false).await {
                // Busy until the worker confirms the stop.
                Err(e) if e.is_retryable() && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                other => {
                    other?;
                    break;
                }
            }
        }
        let done = client
            .wait_mig_layout(node, 0, Some(Duration::from_secs(60)))
            .await?;
        let switch = done
            .last_reconfiguration
            .ok_or_else(|| anyhow::anyhow!("the switch left no report"))?;
        anyhow::ensure!(switch.target == to, "the switch ended at {}", switch.target);
        let seconds = (switch.done_ms - switch.asked_ms) as f64 / 1000.0 / scale;
        switch_s.push(seconds);
        let which = if prepare { "prepared" } else { "applied" };
        let mut f = Figure::new(
            format!("gpu.preinit.switch.{which}"),
            format!(
                "switch 2g,2g,3g -> 4g,2g,1g when the 3g's task ends, {}: request to done \
                 (destroy {}, create {})",
                if prepare {
                    "after `mig prepare` while it served"
                } else {
                    "applied at the switch"
                },
                switch.phases.destroyed,
                switch.phases.created
            ),
            "s (simulated)",
            seconds,
        );
        f.better = Better::Lower;
        report.figures.push(f);
        out.push(json!({ "prepared": prepare, "ahead": ahead, "switch": switch }));
        cluster.shutdown().await;
    }
    let mut hidden = Figure::new(
        "gpu.preinit.hidden",
        "share of the switch's reconfiguration time that pre-initialization took off its path",
        "%",
        100.0 * (1.0 - switch_s[1] / switch_s[0]),
    )
    .thesis(83.0);
    hidden.better = Better::Higher;
    report.figures.push(hidden);
    report.notes.push(
        "pre-initialization: MIGRator's 83% is its average over its traces' switches; ours is \
         one switch, where what can be built ahead is the 4g from the two idle 2g's (the model's \
         phases: 0.5 s per destroy, 1.5 s create, 1.5 s library and 2.5 s model load per new \
         instance)"
            .into(),
    );
    Ok(json!({ "mix": "preinit", "runs": out }))
}
