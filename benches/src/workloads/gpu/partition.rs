//! The GPU workload's partitioning parts: slices made on demand by
//! `escher_gpu::partition::Partitioner`, against HAMi-style first-fit and a static layout, on
//! the same seeded workload: in memory on a simulated fleet ([`partition_in_memory`]), and on
//! a cluster ([`partition_on_cluster`]): an embedded head and a worker with three simulated
//! A100-40GBs, each policy driving them through the cluster API
//! (`escher_gpu::partition::cluster::ClusterFleet`), every request a real command task
//! (`escher sim-work`) placed by the scheduler on the slice the policy made or found.

use escher_gpu::partition::cluster::ClusterFleet;
use escher_gpu::partition::fleet::{
    Arrival, FirstFitPolicy, Placer, StaticPolicy, compare_packing, workload,
};
use escher_gpu::partition::{Partitioner, static_layout};
use escher_proto::mig::GpuModel;

use super::*;

/// Three simulated A100-40GBs, each seed's requests (single slices of 1g to 4g, one gang in
/// eight) arriving over 60 s: tasks served, time from submit to launch, utilization up to the
/// last task's end, for each policy; simulated time (50 ms rounds), so the figures do not
/// depend on the machine's load.
pub(super) fn partition_in_memory(ctx: &Ctx, report: &mut WorkloadReport) -> serde_json::Value {
    let models = [GpuModel::A100_40GB; 3];
    let (seeds, count): (&[u64], usize) =
        ctx.size.pick((&[1], 20), (&[1, 2], 40), (&[1, 2, 3], 60));
    let mut out = Vec::new();
    println!(
        "Slices on demand (3 simulated A100-40GB, {count} requests over 60 s per seed, simulated time):"
    );
    println!(
        "{:>4} {:<14} {:>9} {:>8} {:>12} {:>11} {:>8} {:>11}",
        "seed",
        "policy",
        "submitted",
        "launched",
        "mean wait s",
        "max wait s",
        "util %",
        "makespan s"
    );
    for &seed in seeds {
        let arrivals = workload(&models, count, 60_000, seed);
        let rows = compare_packing(&models, &arrivals, 3_000_000, 50);
        for r in &rows {
            println!(
                "{:>4} {:<14} {:>9} {:>8} {:>12.1} {:>11.1} {:>8.1} {:>11.1}",
                seed,
                r.policy,
                r.submitted,
                r.launched,
                r.mean_wait_ms / 1000.0,
                r.max_wait_ms as f64 / 1000.0,
                100.0 * r.utilization,
                r.makespan_ms as f64 / 1000.0
            );
            let key = r.policy.replace([' ', '-'], "_");
            for (what, label, unit, value, better) in [
                (
                    "wait",
                    "mean time from submit to launch",
                    "s",
                    r.mean_wait_ms / 1000.0,
                    Better::Lower,
                ),
                (
                    "utilization",
                    "busy slices' share of the fleet's GPCs up to the last task's end",
                    "%",
                    100.0 * r.utilization,
                    Better::Higher,
                ),
                (
                    "served",
                    "tasks launched of those submitted",
                    "%",
                    100.0 * r.launched as f64 / r.submitted.max(1) as f64,
                    Better::Higher,
                ),
            ] {
                let mut f = Figure::new(
                    format!("gpu.partition.seed{seed}.{what}.{key}"),
                    format!(
                        "slices on demand, in memory (3 simulated A100-40GB, {count} requests, seed \
                         {seed}, workload assumed: gpu/src/partition/fleet.rs), {}: {label}",
                        r.policy
                    ),
                    unit,
                    value,
                );
                f.better = better;
                report.figures.push(f);
            }
            out.push(json!({
                "seed": seed, "policy": r.policy, "submitted": r.submitted, "launched": r.launched,
                "mean_wait_ms": r.mean_wait_ms, "max_wait_ms": r.max_wait_ms,
                "utilization": r.utilization, "makespan_ms": r.makespan_ms,
                "double_holds": r.double_holds,
            }));
        }
    }
    report.notes.push(
        "Slices on demand (gpu.partition.*): escher_gpu::partition::Partitioner (idle slices reused \
         first, one GPU reshaped per request with the fewest idle slices destroyed and MIGM's \
         reachability, gangs on one GPU) against HAMi-style first-fit (ours, after HAMi's description: \
         idle slices reused, else the first GPU where the slices fit at their lowest starts, else the \
         first wholly idle GPU emptied) and a static layout (3g + 2g + 1g + 1g per GPU, planned in \
         advance), on the same seeded requests and the same fleet of simulated A100-40GBs; instance \
         creation 1.5 s and destruction instant (SimGpu), job times from the speed model. In memory \
         and in simulated time; the same requests on a cluster: gpu.partition.cluster.*."
            .into(),
    );
    json!({"mix": "partition", "runs": out})
}

/// What one policy did with the workload on the cluster.
#[derive(Debug, Clone, serde::Serialize)]
struct OnCluster {
    policy: &'static str,
    submitted: usize,
    ran: usize,
    /// Submit to running, simulated seconds, by task.
    waits_s: Vec<f64>,
    /// Busy slices' share of the fleet's GPCs from the first submit to the last end.
    utilization: f64,
    makespan_s: f64,
    reconfigurations: usize,
}

/// The seeded workload of [`partition_in_memory`] on a cluster, time compressed by `scale` (a
/// simulated second lasts `scale` wall seconds, for the arrivals, the jobs and the workers'
/// reconfigurations): each policy on a fresh cluster whose worker has three simulated
/// A100-40GBs (empty for the partitioner and first-fit, the static layout carved in advance for
/// the static policy), the requests submitted at their arrival times while the policy rounds
/// every 25 ms, until every task has ended.
pub(super) async fn partition_on_cluster(
    ctx: &Ctx,
    report: &mut WorkloadReport,
) -> anyhow::Result<serde_json::Value> {
    let models = [GpuModel::A100_40GB; 3];
    let scale = ctx.size.pick(0.02, 0.05, 0.05);
    // The in-memory part's first seed and count at each size, so that the two compare.
    let (seed, count) = ctx.size.pick((1, 20), (1, 40), (1, 60));
    let arrivals = workload(&models, count, 60_000, seed);
    println!(
        "Slices on demand on a cluster (3 simulated A100-40GB, {count} requests over 60 s, seed \
         {seed}, 1 simulated s = {scale} wall s):"
    );
    println!(
        "{:<14} {:>9} {:>4} {:>11} {:>10} {:>10} {:>7} {:>11} {:>8}",
        "policy",
        "submitted",
        "ran",
        "mean wait s",
        "p50 wait",
        "max wait",
        "util %",
        "makespan s",
        "reconfs"
    );
    let runs = [
        run_on_cluster(Partitioner::new(), &arrivals, None, scale).await?,
        run_on_cluster(FirstFitPolicy::default(), &arrivals, None, scale).await?,
        run_on_cluster(
            StaticPolicy::default(),
            &arrivals,
            Some(static_layout(GpuModel::A100_40GB)),
            scale,
        )
        .await?,
    ];
    let mut out = Vec::new();
    for r in &runs {
        let mut waits = r.waits_s.clone();
        waits.sort_by(f64::total_cmp);
        let mean = waits.iter().sum::<f64>() / waits.len().max(1) as f64;
        let p50 = waits.get(waits.len() / 2).copied().unwrap_or(0.0);
        let max = waits.last().copied().unwrap_or(0.0);
        println!(
            "{:<14} {:>9} {:>4} {:>11.2} {:>10.2} {:>10.2} {:>7.1} {:>11.1} {:>8}",
            r.policy,
            r.submitted,
            r.ran,
            mean,
            p50,
            max,
            100.0 * r.utilization,
            r.makespan_s,
            r.reconfigurations
        );
        let key = r.policy.replace([' ', '-'], "_");
        for (what, label, unit, value, better) in [
            (
                "wait",
                "mean time from submit to running",
                "s",
                mean,
                Better::Lower,
            ),
            (
                "wait_p50",
                "median time from submit to running",
                "s",
                p50,
                Better::Lower,
            ),
            (
                "utilization",
                "busy slices' share of the fleet's GPCs from the first submit to the last end",
                "%",
                100.0 * r.utilization,
                Better::Higher,
            ),
            (
                "served",
                "tasks that ran of those submitted",
                "%",
                100.0 * r.ran as f64 / r.submitted.max(1) as f64,
                Better::Higher,
            ),
        ] {
            let mut f = Figure::new(
                format!("gpu.partition.cluster.{what}.{key}"),
                format!(
                    "slices on demand on a cluster (an embedded head and a worker with 3 simulated \
                     A100-40GB, {count} requests of seed {seed}, workload assumed: \
                     gpu/src/partition/fleet.rs; simulated seconds), {}: {label}",
                    r.policy
                ),
                unit,
                value,
            );
            f.better = better;
            report.figures.push(f);
        }
        out.push(json!(r));
    }
    report.notes.push(format!(
        "Slices on demand on a cluster (gpu.partition.cluster.*): the in-memory workload's seed {seed} \
         ({count} requests) replayed against an embedded head and one worker with three simulated \
         A100-40GBs, each policy driving the GPUs through the cluster API (ClusterFleet: \
         apply_mig_layout for a new layout, requeue of the task onto its slice); every request a \
         command task running `escher sim-work` on the slice it was given, submitted at its arrival \
         time; time compressed ({scale} wall s per simulated s) for the arrivals, the jobs and the \
         worker's reconfiguration latency (MIGRator's model, assumed: a new instance 1.5 s to \
         create, 1.5 s library load, 2.5 s model load). What the cluster adds to the in-memory \
         figures: the policy's 25 ms round, the scheduler's placement, process starts and the \
         reconfiguration round trip, all in compressed time (one wall ms is {:.2} simulated s).",
        0.001 / scale
    ));
    Ok(json!({"mix": "partition on a cluster", "seed": seed, "scale": scale, "runs": out}))
}

/// One policy over `arrivals` on a fresh cluster whose GPUs start with `layout` (none: no
/// slice).
async fn run_on_cluster<P: Placer>(
    policy: P,
    arrivals: &[Arrival],
    layout: Option<escher_proto::mig::Layout>,
    scale: f64,
) -> anyhow::Result<OnCluster> {
    let name = policy.name();
    let gpu = format!(
        "a100-40gb:mig={}",
        layout.map(|l| l.to_string()).unwrap_or_default()
    );
    let cluster = LocalCluster::builder()
        .no_workers()
        .worker_with_gpus("cpu=64".parse()?, [gpu.as_str(); 3])
        .sim_mig_latency_scale(scale)
        .start()
        .await?;
    let client = cluster.client().await?;
    let mut fleet = ClusterFleet::with_policy(client.clone(), policy).await?;
    anyhow::ensure!(
        fleet.gpus().len() == 3,
        "three MIG GPUs: {:?}",
        fleet.gpus()
    );
    let exe = std::env::current_exe()?.display().to_string();
    let began = Instant::now();
    let mut ids: Vec<TaskId> = Vec::new();
    for (at_ms, request, job) in arrivals {
        let due = Duration::from_secs_f64(*at_ms as f64 / 1000.0 * scale);
        while began.elapsed() < due {
            fleet.round().await?;
            tokio::time::sleep(escher_gpu::partition::cluster::ROUND).await;
        }
        let specs: Vec<TaskSpec> = request
            .members
            .iter()
            .map(|(_, profile)| {
                let mut spec = spec(&exe, job, scale);
                spec.resources = format!("cpu=1,mig.{profile}=1")
                    .parse()
                    .expect("a resource set");
                spec
            })
            .collect();
        if request.one_gpu {
            ids.extend(fleet.submit_gang(specs).await?);
        } else {
            for s in specs {
                ids.push(fleet.submit(s).await?);
            }
        }
    }
    // Until every task has ended, or until the requests left have waited a simulated 30 s with
    // nothing running or being made (a static layout without their profile): those are not
    // served, and cancelled.
    let mut idle_since: Option<Instant> = None;
    let give_up = Duration::from_secs_f64(30.0 * scale);
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        fleet.round().await?;
        if !fleet.busy() {
            break;
        }
        if fleet.only_waiting() {
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= give_up {
                break;
            }
        } else {
            idle_since = None;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{name} did not finish within 600 s: {:?}",
            fleet.pending()
        );
        tokio::time::sleep(escher_gpu::partition::cluster::ROUND).await;
    }
    let unserved: Vec<TaskId> = fleet.pending().into_iter().flat_map(|p| p.0).collect();
    if !unserved.is_empty() {
        client.cancel(unserved.clone()).await?;
    }
    let mut waits_s = Vec::new();
    let mut busy_gpc_ms = 0.0;
    let (mut first, mut last) = (u64::MAX, 0u64);
    let launches = fleet.report().launches.clone();
    for id in &ids {
        let info = client.task_info(*id).await?;
        first = first.min(info.submitted_at_ms);
        if unserved.contains(id) {
            continue;
        }
        anyhow::ensure!(
            info.status.state == TaskState::Succeeded,
            "{name}: task {id} ended {:?}: {:?}",
            info.status.state,
            info.status.reason
        );
        let (Some(start), Some(end)) = (info.started_at_ms, info.finished_at_ms) else {
            continue;
        };
        last = last.max(end);
        waits_s.push(start.saturating_sub(info.submitted_at_ms) as f64 / 1000.0 / scale);
        let gpcs: u8 = launches
            .iter()
            .filter(|l| l.0 == *id)
            .map(|l| l.2.profile.compute)
            .sum();
        busy_gpc_ms += f64::from(gpcs) * end.saturating_sub(start) as f64;
    }
    let span_ms = last.saturating_sub(first).max(1) as f64;
    let out = OnCluster {
        policy: name,
        submitted: ids.len(),
        ran: waits_s.len(),
        waits_s,
        utilization: busy_gpc_ms / (7.0 * 3.0 * span_ms),
        makespan_s: span_ms / 1000.0 / scale,
        reconfigurations: fleet.report().reconfigurations.len(),
    };
    cluster.shutdown().await;
    Ok(out)
}
