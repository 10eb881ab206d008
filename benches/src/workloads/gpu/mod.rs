//! The GPU policies end to end (docs/DESIGN.md §6): MIGM's schemes A and B against the sequential
//! full-GPU baseline, MIGRator's pre-initialization, and one MIGRator window of each of two
//! trace shapes (bursty, diurnal) against Ekya's and PARIS's schedules, MIGRator planning
//! from its forecast and from the exact arrivals, each driven on a cluster's GPU
//! ([`escher_gpu::drive`]) through the head and a worker, on an embedded cluster whose
//! worker has a simulated A100-40GB; and MIGRator against its baselines in memory over
//! several windows of three trace shapes ([`escher_gpu::compare`]). Every job
//! is a real command task running `escher sim-work` (this binary serves as that program) on
//! the MIG slice the policy launched it on, except in the MIGRator windows on a cluster,
//! whose retraining runs as actors of the built-in trainer class (the same run time and
//! iterations) and whose replicas are actors of the built-in serving class; every
//! reconfiguration is the worker's, with
//! MIGRator's latency model; time is compressed (a simulated second lasts `scale` wall
//! seconds, the same for the jobs and the reconfigurations).
//!
//! The mixes are MIGM's Hm2, Ht3 (4:0:1:1) and Ml3, as `examples/gpu_policies.rs` builds them
//! for the in-memory simulator (same job models: 20 s on the whole GPU; small 4 GB / 1 GPC,
//! medium 9 GB / 2, large 15 GB / 3, full 30 GB / 7; Ml3's 18 GB / 4), fewer jobs so that a
//! run stays short. Each is printed with the ratio of its own jobs, and a run refuses a mix
//! whose jobs are not the paper's mix of that name (`check_mix`).
//! What the cluster adds to the simulator's figures is everything real: process starts, the
//! scheduler's placement, the policy's polling round (25 ms), the reconfiguration round trip.
//! Throughput and energy are normalised to the sequential baseline measured in the same run;
//! energy is the jobs' reported busy energy plus the GPU's idle power over the makespan
//! (`escher_proto::mig::PowerModel`), so only ratios mean anything.
//!
//! By paper: this file holds what the parts share (the cluster, a job's `sim-work` command)
//! and the dispatch of the parts; `migm.rs` MIGM's mixes and restarts; `migrator.rs`
//! MIGRator's pre-initialization and its windows against Ekya and PARIS, in memory and on a
//! cluster; `astraea.rs` Astraea against its baselines; `ekya_profile.rs` Ekya's
//! micro-profiler inside the thief; `oltunes.rs` OLTunes against MLaaS and Orion, and OLTunes' servers as actors on a cluster;
//! `partition.rs` slices on demand.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use escher::types::{NodeId, SERVING_REPLICA_CLASS, TaskId, TaskSpec, TaskState};
use escher::{LocalCluster, Task};
use escher_gpu::compare::{Comparison, POLICIES, compare, psi_for};
use escher_gpu::migrator::ilp::Solved;
use escher_gpu::migrator::problem::Problem;
use escher_gpu::migrator::reconfig::lead_steps;
use escher_gpu::migrator::solve_priced;
use escher_gpu::migrator::workload::{HISTORY_WINDOWS, Shape, Workload};
use escher_gpu::shares::{Outcome as PolicyOutcome, evaluate_mig};
use escher_gpu::{
    ClusterGpu, Command as GpuCommand, DriveReport, Event, GpuPolicy, GpuView, InferenceModel,
    Migm, MigmJob, Migrator, Scheme, Sequential, TenantTasks, drive, drive_with, online_on_mig,
    paris,
};
use escher_proto::mig::{GpuModel, JobModel, Layout, MemoryModel, PowerModel, SpeedModel};
use serde_json::json;

mod astraea;
mod ekya_profile;
mod migm;
mod migrator;
mod oltunes;
mod partition;

use super::Ctx;
use crate::report::{Better, Figure, Line, Plot, PlotData, WorkloadReport};

/// A part of the `gpu` workload (`escher-bench gpu --gpu-parts ...`; all when none is named).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    /// MIGM's schemes A and B against the sequential full GPU, on a cluster.
    Migm,
    /// MIGM's out-of-memory and early restarts, on a cluster.
    Restarts,
    /// MIGRator's pre-initialization, on a cluster.
    Preinit,
    /// MIGRator against Ekya (MPS), PARIS and the oracle, in memory.
    Migrator,
    /// OLTunes against MLaaS and Orion, in memory; and OLTunes' servers as actors on a cluster.
    Oltunes,
    /// Ekya's micro-profiler inside the thief, in memory.
    EkyaProfile,
    /// Slices on demand against first-fit and a static layout, in memory.
    Partition,
    /// Slices on demand against first-fit and a static layout, on a cluster.
    PartitionCluster,
    /// One MIGRator window per trace shape against Ekya and PARIS, on a cluster.
    MigratorCluster,
    /// Astraea against FIRM and Laius, on a cluster, with and without NVLink.
    Astraea,
}

/// Whether `part` is to run.
fn wanted(ctx: &Ctx, part: Part) -> bool {
    ctx.gpu_parts.is_empty() || ctx.gpu_parts.contains(&part)
}

/// The argument that makes this binary run `escher sim-work` (see `bin/escher-bench.rs`).
pub const SIM_WORK_ARG: &str = "sim-work";

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

/// An embedded cluster whose one worker has the simulated GPU `gpu` (`--sim-gpu`'s text),
/// reconfiguring at `scale` of MIGRator's latencies; a client and the worker's node.
async fn gpu_cluster(
    gpu: &str,
    scale: f64,
) -> anyhow::Result<(LocalCluster, escher::Client, NodeId)> {
    let cluster = LocalCluster::builder()
        .no_workers()
        .worker_with_gpus("cpu=16".parse()?, [gpu])
        .sim_mig_latency_scale(scale)
        .start()
        .await?;
    let client = cluster.client().await?;
    let node = cluster.nodes()[0];
    Ok((cluster, client, node))
}

/// The `gpu` workload (see the module doc).
pub async fn run(ctx: &Ctx) -> anyhow::Result<WorkloadReport> {
    let scale = ctx.size.pick(0.01, 0.02, 0.05);
    let mut report = WorkloadReport::new(
        "gpu",
        "GPU policies end to end on a cluster's simulated A100: MIGM A and B against the sequential full GPU, pre-initialization, one MIGRator window per trace shape (forecast and oracle) against Ekya and PARIS; MIGRator against its baselines in memory over several windows of three shapes; Astraea against FIRM and Laius on MPS shares of simulated A100s (one and three servers, without NVLink and with it for every policy); slices made on demand against first-fit and a static layout",
        ctx.size.as_str(),
    );
    report.setup = json!({
        "cluster": "a head and one in-process worker over gRPC on loopback; --sim-gpu a100-40gb:mig= (no instances at start)",
        "jobs": "command tasks running `escher sim-work` on the slice the policy launched them on (4 iterations each); in the MIGRator windows on the cluster, retraining as actors of the built-in trainer class (the same run time, 4 iterations) and replicas as actors of the built-in serving class",
        "time": format!("1 simulated s = {scale} wall s, for the jobs and for MIGRator's reconfiguration latency (0.5 s destroy; 1.5 s create, 1.5 s library and 2.5 s model load per new instance)"),
        "policy round": "25 ms (drive polls the GPU and the launched tasks)",
        "energy": "jobs' busy energy (200 W x GPCs/7 over their run) + 50 W idle over the makespan",
    });
    let mut detail = Vec::new();
    if wanted(ctx, Part::Migm) {
        detail.extend(migm::migm_on_cluster(ctx, scale, &mut report).await?);
    }
    if wanted(ctx, Part::Restarts) {
        detail.push(migm::restarts(ctx, scale, &mut report).await?);
    }
    if wanted(ctx, Part::Preinit) {
        detail.push(migrator::preinitialization(scale, &mut report).await?);
    }
    if wanted(ctx, Part::Migrator) {
        detail.push(migrator::migrator_in_memory(ctx, &mut report)?);
    }
    if wanted(ctx, Part::Oltunes) {
        detail.push(oltunes::oltunes_in_memory(ctx, &mut report));
        detail.push(oltunes::oltunes_on_cluster(ctx, &mut report).await?);
    }
    if wanted(ctx, Part::EkyaProfile) {
        detail.push(ekya_profile::ekya_profiler_in_memory(ctx, &mut report));
    }
    if wanted(ctx, Part::Partition) {
        detail.push(partition::partition_in_memory(ctx, &mut report));
    }
    if wanted(ctx, Part::PartitionCluster) {
        detail.push(partition::partition_on_cluster(ctx, &mut report).await?);
    }
    if wanted(ctx, Part::MigratorCluster) {
        detail.push(migrator::migrator_on_cluster(ctx, &mut report).await?);
    }
    if wanted(ctx, Part::Astraea) {
        detail.push(astraea::astraea_on_cluster(ctx, &mut report).await?);
    }
    if !ctx.gpu_parts.is_empty() {
        report
            .notes
            .push(format!("only these parts were run: {:?}", ctx.gpu_parts));
    }
    report.notes.push(
        "MIGM: the paper's figures (the thesis column) are its measured gains on an A100 with Rodinia \
         and DNN jobs, each mix against the sequential full GPU; ours use the assumed job models of \
         proto/src/mig/work.rs (every job 20 s on the whole GPU), on fewer jobs (the paper: Hm2 x50, \
         Ht3 x36, Ml3 x18). Hm2's jobs are 1-GPC jobs with no PCIe, memory-bandwidth or memory-management \
         contention modelled between slices, so its gain is the number of waves the slices save (the \
         paper's PCIe-bound Needleman-Wunsch mix reached 1.92x of a theoretical 7x, §5.1)"
            .into(),
    );
    report.detail = json!(detail);
    Ok(report)
}
