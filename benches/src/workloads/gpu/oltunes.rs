//! The GPU workload's OLTunes part (Kim, Ha, Kim, 2025): OLTunes against MLaaS and Orion on
//! the simulated heterogeneous cluster of the paper's §5, in memory; and its servers as actors on
//! an embedded cluster ([`oltunes_on_cluster`]).

use super::*;

/// OLTunes against the paper's two baselines (MLaaS, Orion) on the simulated heterogeneous
/// cluster of its §5 (5 A100, 2 A30, 1 RTX 4090), every arrival pattern at Table 7's rates and
/// at 4 times them, seeded: SLO violations, the small models' queueing and p99, energy. Every
/// input is the paper's or an assumption marked in `gpu/src/oltunes/README.md`.
pub(super) fn oltunes_in_memory(ctx: &Ctx, report: &mut WorkloadReport) -> serde_json::Value {
    use escher_gpu::oltunes::{runs, table};
    // The smoke test's tiny size runs Table 7's rates alone (the 4x load is the same code).
    let (seeds, secs, loads): (&[u64], u64, &[f64]) = ctx.size.pick(
        (&[42], 10, &[1.0]),
        (&[42, 7], 20, &[1.0, 4.0]),
        (&[42, 7, 1], 20, &[1.0, 4.0]),
    );
    let mut out = Vec::new();
    for r in runs(loads, seeds, secs) {
        println!(
            "OLTunes, {} arrivals at {}x Table 7's rates, seed {}:\n{}",
            r.pattern.name(),
            r.load,
            r.seed,
            table(r.pattern, &r.rows)
        );
        for m in &r.rows {
            for (key, what, value) in [
                (
                    "slo_violation",
                    "SLO violations, execution alone against the deadline (queueing not counted), % of tasks",
                    m.all.slo_violation,
                ),
                (
                    "slo_violation_queued",
                    "SLO violations, latency from arrival (queueing counted) against the deadline, % of tasks",
                    m.all.slo_violation_queued,
                ),
            ] {
                let mut f = Figure::new(
                    format!(
                        "gpu.oltunes.{}.x{}.seed{}.{key}.{}",
                        r.pattern.name(),
                        r.load,
                        r.seed,
                        m.name.to_lowercase()
                    ),
                    format!(
                        "in memory (inputs assumed, gpu/src/oltunes/README.md), {} arrivals at \
                         {}x Table 7, seed {}, {}: {what}",
                        r.pattern.name(),
                        r.load,
                        r.seed,
                        m.name
                    ),
                    "%",
                    100.0 * value,
                );
                f.better = Better::Lower;
                report.figures.push(f);
            }
        }
        out.push(json!({
            "pattern": r.pattern.name(), "load": r.load, "seed": r.seed,
            "rows": r.rows.iter().map(|m| json!({
                "scheduler": m.name,
                "slo_violation": m.all.slo_violation,
                "slo_violation_queued": m.all.slo_violation_queued,
                "p50_ms": m.all.p50_ms,
                "p99_ms": m.all.p99_ms,
                "small_queue_ms": m.small.queue_ms,
                "small_p99_ms": m.small.p99_ms,
                "large_queue_ms": m.large.queue_ms,
                "util_swing": m.util_swing,
                "energy_kj": m.energy_kj,
            })).collect::<Vec<_>>(),
        }));
    }
    report.notes.push(
        "OLTunes (gpu.oltunes.*): an in-memory simulation of the paper's cluster and workload \
         (inputs assumed from its tables, see gpu/src/oltunes/README.md). A violation is counted \
         two ways, each its own figure: slo_violation, an execution longer than the deadline \
         (queueing not counted), and slo_violation_queued, a latency from arrival (queueing and \
         execution, the latency of the paper's p50, §4.1.3) longer than the deadline; an \
         unfinished task is a violation in both. The paper does not say which its Fig. 14 counts; \
         its task must be 'executed with latency within' the deadline (§3.4.1). Which scheduler has \
         the fewest of each, at each load and pattern, is in the figures and the tables above."
            .into(),
    );
    json!({"mix": "oltunes", "runs": out})
}

/// SLO violations of a run's tasks (execution, start to end, longer than the deadline; an
/// unfinished task is one), % of tasks.
fn violations(
    outcomes: &[escher_gpu::oltunes::sim::Outcome],
    tasks: &[escher_gpu::oltunes::Task],
) -> f64 {
    let late = tasks
        .iter()
        .filter(|t| match (outcomes[t.id].start_ms, outcomes[t.id].end_ms) {
            (Some(s), Some(e)) => (e - s) as f64 > t.deadline_ms,
            _ => true,
        })
        .count();
    100.0 * late as f64 / tasks.len().max(1) as f64
}

/// OLTunes on a cluster (`escher_gpu::oltunes::cluster`): its scheduler places every inference
/// server as an actor of the built-in serving class on one of three simulated A100-40GB
/// devices of an embedded cluster's worker (standing for an A100, an A30 and an RTX 4090),
/// holding a co-location slot of the device and its batch's memory; the same workload is run
/// in memory beside it. Measured: the servers' actors (created, refused and recreated,
/// finished), how long the cluster took to start them, whether each counted what the driver
/// says it served. Assumed: the requests and their speeds (the in-memory model), at a fraction
/// of Table 7's rates so that a run stays short.
pub(super) async fn oltunes_on_cluster(
    ctx: &Ctx,
    report: &mut WorkloadReport,
) -> anyhow::Result<serde_json::Value> {
    use escher_gpu::oltunes::compare::profile;
    use escher_gpu::oltunes::sim::simulate;
    use escher_gpu::oltunes::task::{GpuType, Pattern, models, workload_at};
    use escher_gpu::oltunes::{OlTunes, OlTunesCluster, ServerEnd};

    let (secs, load): (u64, f64) = ctx.size.pick((2, 0.05), (5, 0.1), (10, 0.2));
    let seed = 42;
    let cluster = LocalCluster::builder()
        .no_workers()
        .worker_with_gpus("cpu=16".parse()?, ["a100-40gb", "a100-40gb", "a100-40gb"])
        .start()
        .await?;
    let client = cluster.client().await?;
    let node = cluster.nodes()[0];
    let types = [GpuType::A100, GpuType::A30, GpuType::Rtx4090];
    let gpus: Vec<_> = (0u32..).zip(types).map(|(i, ty)| (node, i, ty)).collect();
    let olt = OlTunesCluster::create(client.clone(), "bench", &gpus).await?;
    let models = models();
    let tasks = workload_at(Pattern::Uniform, secs, seed, load);
    let horizon = (secs + 10) * 1000;
    let trained = profile(&models, seed ^ 0x5eed);
    let mut on_cluster = OlTunes::new(models.clone(), &types, &trained, seed);
    let run = olt
        .run(&mut on_cluster, &tasks, &models, horizon, seed)
        .await?;
    let mut in_memory = OlTunes::new(models.clone(), &types, &trained, seed);
    let trace = simulate(&mut in_memory, &types, &tasks, &models, horizon, seed);
    olt.dissolve().await?;
    cluster.shutdown().await;

    let count = |end: &ServerEnd| run.servers.iter().filter(|s| &s.end == end).count();
    let (finished, refused, drained) = (
        count(&ServerEnd::Finished),
        count(&ServerEnd::Refused),
        count(&ServerEnd::Drained),
    );
    let agreed = run
        .servers
        .iter()
        .filter(|s| s.end == ServerEnd::Finished && s.counted == Some(s.served))
        .count();
    let starts: Vec<f64> = run.servers.iter().filter_map(|s| s.start_wall_ms).collect();
    let start = crate::stats::Summary::of(&starts);
    let (cluster_late, memory_late) = (
        violations(&run.outcomes, &tasks),
        violations(&trace.outcomes, &tasks),
    );
    println!(
        "OLTunes on a cluster (3 simulated A100-40GB devices standing for an A100, an A30 and an \
         RTX 4090), uniform arrivals at {load}x Table 7's rates for {secs} s, seed {seed}:\n  \
         {} tasks, {} served; {} servers (actors): {finished} finished, {refused} refused by the \
         cluster and recreated by OLTunes' feedback, {drained} drained at the end, {} failed; \
         {agreed} of {finished} counted what the driver says they served\n  \
         actor created -> running (measured, wall): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms\n  \
         SLO violations (execution > deadline; simulated speeds): on the cluster {cluster_late:.1}%, \
         in memory {memory_late:.1}% (on the cluster a server's time starts when the driver sees its actor run, and its co-runners are those the cluster ran)",
        tasks.len(),
        run.finished(),
        run.servers.len(),
        run.failed.len(),
        start.p50,
        start.p99,
        start.max,
    );
    for (key, what, unit, value) in [
        (
            "server_start_p50_ms",
            "an OLTunes server's actor, created to seen running (wall, measured), p50",
            "ms",
            start.p50,
        ),
        (
            "slo_violation",
            "SLO violations on the cluster (execution > deadline, simulated speeds), % of tasks",
            "%",
            cluster_late,
        ),
    ] {
        let mut f = Figure::new(
            format!("gpu.oltunes.cluster.{key}"),
            format!(
                "on a cluster (actors real, requests simulated), uniform at {load}x Table 7 for \
                 {secs} s: {what}"
            ),
            unit,
            value,
        );
        f.better = Better::Lower;
        report.figures.push(f);
    }
    report.notes.push(
        "OLTunes on a cluster (gpu.oltunes.cluster.*): every inference server OLTunes places is an \
         actor of the built-in serving class, created on the (simulated) GPU it chose, holding a \
         quarter of that device (a co-location slot) and its batch's memory as an ephemeral \
         resource; a server the cluster does not start within 500 ms is killed and OLTunes' \
         feedback relaunches its task (a new actor). Real: placement, the actors, the resources \
         held and released, the start latency. Simulated: the requests and how fast a server \
         serves them (the in-memory model, with interference from the servers running on the \
         same GPU on the cluster); the GPU types are stand-ins (simulated A100-40GB devices)."
            .into(),
    );
    if !run.failed.is_empty() {
        anyhow::bail!("OLTunes on the cluster: {:?}", run.failed);
    }
    Ok(json!({
        "mix": "oltunes-cluster", "load": load, "secs": secs, "seed": seed,
        "tasks": tasks.len(), "served": run.finished(), "servers": run.servers.len(),
        "finished": finished, "refused": refused, "drained": drained, "counted_agree": agreed,
        "start_ms": start, "slo_violation_cluster": cluster_late,
        "slo_violation_in_memory": memory_late,
    }))
}
