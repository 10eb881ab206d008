//! The GPU workload's OLTunes part (Kim, Ha, Kim, 2025): OLTunes against MLaaS and Orion on
//! the simulated heterogeneous cluster of the paper's §5, in memory.

use super::*;

/// OLTunes against the paper's two baselines (MLaaS, Orion) on the simulated heterogeneous
/// cluster of its §5 (5 A100, 2 A30, 1 RTX 4090), every arrival pattern at Table 7's rates and
/// at 4 times them, seeded: SLO violations, the small models' queueing and p99, energy. Every
/// input is the paper's or an assumption marked in `gpu/src/oltunes/README.md`.
pub(super) fn oltunes_in_memory(ctx: &Ctx, report: &mut WorkloadReport) -> serde_json::Value {
    use escher_gpu::oltunes::{runs, table};
    let (seeds, secs): (&[u64], u64) =
        ctx.size
            .pick((&[42], 10), (&[42, 7], 20), (&[42, 7, 1], 20));
    let mut out = Vec::new();
    for r in runs(&[1.0, 4.0], seeds, secs) {
        println!(
            "OLTunes, {} arrivals at {}x Table 7's rates, seed {}:\n{}",
            r.pattern.name(),
            r.load,
            r.seed,
            table(r.pattern, &r.rows)
        );
        for m in &r.rows {
            let mut f = Figure::new(
                format!(
                    "gpu.oltunes.{}.x{}.seed{}.slo_violation.{}",
                    r.pattern.name(),
                    r.load,
                    r.seed,
                    m.name.to_lowercase()
                ),
                format!(
                    "in memory (inputs assumed, gpu/src/oltunes/README.md), {} arrivals at \
                     {}x Table 7, seed {}, {}: SLO violations, % of tasks",
                    r.pattern.name(),
                    r.load,
                    r.seed,
                    m.name
                ),
                "%",
                100.0 * m.all.slo_violation,
            );
            f.better = Better::Lower;
            report.figures.push(f);
        }
        out.push(json!({
            "pattern": r.pattern.name(), "load": r.load, "seed": r.seed,
            "rows": r.rows.iter().map(|m| json!({
                "scheduler": m.name,
                "slo_violation": m.all.slo_violation,
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
         (inputs assumed from its tables, see gpu/src/oltunes/README.md); a violation is an \
         execution longer than the deadline (queueing is not counted). The paper's direction \
         (fewer SLO violations than MLaaS and Orion) holds at Table 7's rates and at 4 times \
         them, with every arrival pattern; the violations left at 1x are LC vision tasks \
         started beside co-runners (oltunes::tests::where_violations_come_from breaks them down)."
            .into(),
    );
    json!({"mix": "oltunes", "runs": out})
}
