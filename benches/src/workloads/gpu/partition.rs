//! The GPU workload's partitioning part: slices made on demand by
//! `escher_gpu::partition::Partitioner`, against HAMi-style first-fit and a static layout, on
//! the same seeded workload and the same simulated fleet, in memory.

use escher_gpu::partition::fleet::{compare_packing, workload};
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
         and in simulated time; the same policy runs on a cluster through ClusterApi \
         (escher_gpu::partition::cluster, tests/e2e_gpu_partition.rs), not measured here."
            .into(),
    );
    json!({"mix": "partition", "runs": out})
}
