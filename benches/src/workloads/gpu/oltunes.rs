//! The GPU workload's OLTunes part (Kim, Ha, Kim, 2025): OLTunes against MLaaS and Orion on
//! the simulated heterogeneous cluster of the paper's §5, in memory.

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
