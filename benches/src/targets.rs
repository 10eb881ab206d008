//! The targets of docs/DESIGN.md §8, checked against the figures of one run. A target whose figures
//! were not measured in the run (a workload not selected, peers not run) is reported as such.

use crate::report::{Figure, TargetCheck, WorkloadReport, num, ratio};
use crate::workloads::w4_er_create::THESIS_AMORTISED_MS;

/// Checks every target against `reports`.
pub fn evaluate(reports: &[WorkloadReport]) -> Vec<TargetCheck> {
    let figs: Vec<&Figure> = reports.iter().flat_map(|r| r.figures.iter()).collect();
    let find = |id: &str| figs.iter().copied().find(|f| f.id == id);
    let last = |prefix: &str| {
        figs.iter()
            .copied()
            .filter(|f| f.id.starts_with(prefix))
            .max_by_key(|f| f.id.rsplit('.').next().and_then(|n| n.parse::<u64>().ok()))
    };
    let mut checks = vec![
        throughput(last("w1.per_task."), last("w1.batched.")),
        round_trip(
            find("w2.run.p50").or(find("w2.p50")),
            find("w2.run_over_floor"),
        ),
        head_cpu(
            find("w8.drain_cpu_per_decision"),
            find("w8.core_per_decision"),
        ),
        command_tasks(find("cmd.tasks_per_s"), find("cmd.of_spawn_limit")),
        er_creation(last("w4.pipelined."), last("w4.sequential.")),
        makespan_flat(&figs),
        requested(
            find("w6.p50.1"),
            find("w6.p50.100"),
            find("w6.core.1"),
            find("w6.core.100"),
        ),
        gang(find("w7.native.pg_rate")),
        scale(find("w8.memory_per_task"), find("w8.core_per_decision")),
        replicated(
            find("w9.replicas3.batched_ratio"),
            find("w9.replicas3.per_task_ratio"),
        ),
        failover(find("w10.p50"), find("w10.max")),
    ];
    // The Python package's, where `python` ran, the actors', where `actors` ran, and the
    // objects', where `objects` ran.
    checks.extend(crate::workloads::python::targets(&figs));
    checks.extend(crate::workloads::actors::targets(&figs));
    checks.extend(crate::workloads::objects::targets(&figs));
    checks
}

fn replicated(batched: Option<&Figure>, per_task: Option<&Figure>) -> TargetCheck {
    let target = "W9 task throughput with 3 replicas ≥ 50% of the in-memory head";
    let (Some(b), Some(p)) = (batched, per_task) else {
        return unmeasured(target, "W9 not run");
    };
    TargetCheck {
        target: target.into(),
        measured: format!(
            "batches of 1,000: {:.0}% of in-memory; one submit() per task: {:.0}%",
            b.escher * 100.0,
            p.escher * 100.0
        ),
        met: Some(b.escher >= 0.5 && p.escher >= 0.5),
    }
}

fn failover(p50: Option<&Figure>, max: Option<&Figure>) -> TargetCheck {
    let target = "W10 leader failover to the first acknowledged submit ≤ 2 s";
    let (Some(p50), Some(max)) = (p50, max) else {
        return unmeasured(target, "W10 not run");
    };
    TargetCheck {
        target: target.into(),
        measured: format!("p50 {} ms, max {} ms", num(p50.escher), num(max.escher)),
        met: Some(max.escher <= 2_000.0),
    }
}

fn unmeasured(target: &str, why: &str) -> TargetCheck {
    TargetCheck {
        target: target.to_string(),
        measured: why.to_string(),
        met: None,
    }
}

fn throughput(per_task: Option<&Figure>, batched: Option<&Figure>) -> TargetCheck {
    let target = "W1 no-op task throughput from one client ≥ 60× Ray's (one submit per task), ≥ 100× batched";
    let (Some(p), Some(b)) = (per_task, batched) else {
        return unmeasured(target, "W1 not run");
    };
    let (Some(pp), Some(bp)) = (&p.peer, &b.peer) else {
        return unmeasured(target, "Ray not run (use --peers)");
    };
    TargetCheck {
        target: target.into(),
        measured: format!(
            "one submit per task: {} vs Ray {} tasks/s = {}; batches of 1,000: {} = {}",
            num(p.escher),
            num(pp.value),
            ratio(pp.ratio),
            num(b.escher),
            ratio(bp.ratio)
        ),
        met: Some(pp.ratio >= 60.0 && bp.ratio >= 100.0),
    }
}

fn round_trip(p50: Option<&Figure>, over_floor: Option<&Figure>) -> TargetCheck {
    let target =
        "W2 synchronous submit-to-result ≤ 1/10 of Ray's and within 2× of one bare gRPC call";
    let Some(f) = p50 else {
        return unmeasured(target, "W2 not run");
    };
    let floor = over_floor
        .map(|o| format!("; {} one bare call", ratio(o.escher)))
        .unwrap_or_default();
    let within_floor = over_floor.is_none_or(|o| o.escher <= 2.0);
    let Some(peer) = &f.peer else {
        return TargetCheck {
            target: target.into(),
            measured: format!("p50 {} ms{floor}; Ray not run (use --peers)", num(f.escher)),
            met: if within_floor { None } else { Some(false) },
        };
    };
    TargetCheck {
        target: target.into(),
        measured: format!(
            "{} p50 {} ms vs Ray {} ms = {} (1/{:.1}){floor}",
            f.metric.trim_end_matches(", p50"),
            num(f.escher),
            num(peer.value),
            ratio(peer.ratio),
            1.0 / peer.ratio
        ),
        met: Some(peer.ratio <= 0.1 && within_floor),
    }
}

fn head_cpu(head: Option<&Figure>, core: Option<&Figure>) -> TargetCheck {
    let target = "W8 head CPU per task at 1,000 nodes within 4× of the core's time per decision";
    let (Some(h), Some(c)) = (head, core) else {
        return unmeasured(target, "W8 not run");
    };
    let r = h.escher / c.escher;
    TargetCheck {
        target: target.into(),
        measured: format!(
            "{} µs head CPU per task vs {} µs in the core = {}",
            num(h.escher),
            num(c.escher),
            ratio(r)
        ),
        met: Some(r <= 4.0),
    }
}

fn command_tasks(rate: Option<&Figure>, of_limit: Option<&Figure>) -> TargetCheck {
    let target = "cmd command tasks ≥ 60% of the machine's spawn rate and ≥ 3× HyperQueue";
    let (Some(rate), Some(of_limit)) = (rate, of_limit) else {
        return unmeasured(target, "cmd not run");
    };
    let limit = format!(
        "{} tasks/s = {:.0}% of the spawn limit",
        num(rate.escher),
        of_limit.escher * 100.0
    );
    let Some(peer) = &rate.peer else {
        return TargetCheck {
            target: target.into(),
            measured: format!("{limit}; HyperQueue not run (use --peers)"),
            met: if of_limit.escher >= 0.6 {
                None
            } else {
                Some(false)
            },
        };
    };
    TargetCheck {
        target: target.into(),
        measured: format!(
            "{limit}; HyperQueue {} tasks/s = {}",
            num(peer.value),
            ratio(peer.ratio)
        ),
        met: Some(of_limit.escher >= 0.6 && peer.ratio >= 3.0),
    }
}

fn er_creation(pipelined: Option<&Figure>, sequential: Option<&Figure>) -> TargetCheck {
    let target =
        "W4 new resource usable by a task ≥ 10× cheaper than the thesis' 0.72 ms per resource";
    let Some(p) = pipelined else {
        return unmeasured(target, "W4 not run");
    };
    let seq = sequential
        .map(|s| format!("; one request at a time {} ms (thesis 1 ms)", num(s.escher)))
        .unwrap_or_default();
    TargetCheck {
        target: target.into(),
        measured: format!(
            "{} ms amortised per resource = {:.1}× cheaper{seq}",
            num(p.escher),
            THESIS_AMORTISED_MS / p.escher
        ),
        met: Some(p.escher * 10.0 <= THESIS_AMORTISED_MS),
    }
}

fn makespan_flat(figs: &[&Figure]) -> TargetCheck {
    let target = "W5 makespan flat (±10%) from 0 to 10^5 unrelated resources";
    let spans: Vec<&Figure> = figs
        .iter()
        .copied()
        .filter(|f| f.id.starts_with("w5.makespan."))
        .collect();
    let Some(first) = spans.first() else {
        return unmeasured(target, "W5 not run");
    };
    // Each count's median ratio to the run with none paired with it, where measured so.
    let paired: Vec<f64> = figs
        .iter()
        .filter(|f| f.id.starts_with("w5.ratio."))
        .map(|f| f.escher)
        .collect();
    let deviations: Vec<f64> = if paired.is_empty() {
        spans
            .iter()
            .map(|f| f.escher / first.escher - 1.0)
            .collect()
    } else {
        paired.iter().map(|r| r - 1.0).collect()
    };
    let worst = deviations
        .into_iter()
        .fold(0.0_f64, |a, d| if d.abs() > a.abs() { d } else { a });
    let list = spans
        .iter()
        .map(|f| format!("{} s", num(f.escher)))
        .collect::<Vec<_>>()
        .join(" / ");
    TargetCheck {
        target: target.into(),
        measured: format!(
            "{list}; largest deviation {:+.1}%{}",
            worst * 100.0,
            if paired.is_empty() {
                ""
            } else {
                " (median of each count's runs paired with one with none)"
            }
        ),
        met: Some(worst.abs() <= 0.10),
    }
}

fn requested(
    one: Option<&Figure>,
    hundred: Option<&Figure>,
    core_one: Option<&Figure>,
    core_hundred: Option<&Figure>,
) -> TargetCheck {
    let target = "W6 a task requesting 100 resources costs ≤ 1.5× one requesting 1";
    let (Some(a), Some(b)) = (one, hundred) else {
        return unmeasured(target, "W6 not run");
    };
    let r = b.escher / a.escher;
    let core = match (core_one, core_hundred) {
        (Some(c1), Some(c100)) => format!(
            "; the scheduling decision alone (core) {} → {} µs",
            num(c1.escher),
            num(c100.escher)
        ),
        _ => String::new(),
    };
    TargetCheck {
        target: target.into(),
        measured: format!(
            "end-to-end round trip p50 {} ms → {} ms = {} (thesis 1.1 → 1.2 ms){core}",
            num(a.escher),
            num(b.escher),
            ratio(r)
        ),
        met: Some(r <= 1.5),
    }
}

fn gang(native: Option<&Figure>) -> TargetCheck {
    let target = "W7 native gang reservation ≥ 20× Ray's placement-group create/remove rate";
    let Some(f) = native else {
        return unmeasured(target, "no native gang design was measured (see W7 notes)");
    };
    let Some(peer) = &f.peer else {
        return unmeasured(target, "Ray not run (use --peers)");
    };
    TargetCheck {
        target: target.into(),
        measured: format!(
            "{} vs Ray {} create+ready+remove/s = {}",
            num(f.escher),
            num(peer.value),
            ratio(peer.ratio)
        ),
        met: Some(peer.ratio >= 20.0),
    }
}

fn scale(memory: Option<&Figure>, core: Option<&Figure>) -> TargetCheck {
    let target = "W8 1,000 nodes and 1,000,000 queued tasks in one head, ≤ 1 KiB per queued task";
    let Some(m) = memory else {
        return unmeasured(target, "W8 not run");
    };
    let core = core
        .map(|c| format!("; core {} µs per decision", num(c.escher)))
        .unwrap_or_default();
    TargetCheck {
        target: target.into(),
        measured: format!(
            "{}: {} bytes per queued task{core}",
            m.metric,
            num(m.escher)
        ),
        met: Some(m.escher <= 1024.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::PeerFigure;

    fn with_peer(mut f: Figure, value: f64) -> Figure {
        f.peer = Some(PeerFigure {
            peer: "ray".into(),
            value,
            ratio: f.escher / value,
        });
        f
    }

    /// A report of bare figures, `(id, value)`, with no peer.
    fn report(figures: &[(&str, f64)]) -> WorkloadReport {
        let mut r = WorkloadReport::new("w", "t", "tiny");
        for (id, value) in figures {
            r.figures.push(Figure::new(*id, *id, "-", *value));
        }
        r
    }

    #[test]
    fn targets_follow_the_figures() {
        let mut r = report(&[
            ("w2.run_over_floor", 1.9),
            ("w8.drain_cpu_per_decision", 4.0),
            ("w8.core_per_decision", 0.5),
            ("w8.memory_per_task", 1000.0),
            ("cmd.tasks_per_s", 900.0),
            ("cmd.of_spawn_limit", 0.7),
            ("w5.makespan.0", 1.0),
            ("w5.makespan.1000", 1.2),
            ("w6.p50.1", 1.0),
            ("w6.p50.100", 1.4),
            ("w4.pipelined.10", 0.5),
            ("w4.pipelined.100", 0.05),
        ]);
        r.figures
            .push(with_peer(Figure::new("w2.run.p50", "run", "ms", 0.09), 1.0));
        let t = evaluate(&[r]);
        let met = |name: &str| {
            let check = t
                .iter()
                .find(|c| c.target.starts_with(name))
                .unwrap_or_else(|| panic!("no target {name}"));
            check.met
        };
        assert_eq!(met("W1"), None, "W1 not run");
        assert_eq!(met("W2"), Some(true), "1/11 of Ray, 1.9× the floor");
        assert_eq!(met("W8 head CPU"), Some(false), "8× the core is not 4×");
        assert_eq!(met("cmd"), None, "70% of the limit, HyperQueue not run");
        assert_eq!(met("W4"), Some(true), "the largest count decides");
        assert_eq!(met("W5"), Some(false), "+20% is not flat");
        assert_eq!(met("W6"), Some(true));
        assert_eq!(met("W7"), None);
        assert_eq!(met("W8 1,000 nodes"), Some(true), "1,000 bytes ≤ 1 KiB");
        assert_eq!(met("W9"), None);
        assert_eq!(met("W10"), None);
    }

    #[test]
    fn a_target_missed_without_the_peer_is_missed() {
        let r = report(&[
            ("w2.run.p50", 0.3),
            ("w2.run_over_floor", 2.5),
            ("cmd.tasks_per_s", 900.0),
            ("cmd.of_spawn_limit", 0.4),
        ]);
        let t = evaluate(&[r]);
        assert_eq!(t[1].met, Some(false), "{:?}", t[1]);
        assert_eq!(t[3].met, Some(false), "{:?}", t[3]);
    }

    #[test]
    fn w5_is_judged_by_the_paired_ratios() {
        let w5 = |ratio: f64| {
            let r = report(&[
                ("w5.makespan.0", 1.0),
                ("w5.makespan.1000", 1.3),
                ("w5.ratio.1000", ratio),
            ]);
            let t = evaluate(&[r]);
            let check = t.iter().find(|c| c.target.starts_with("W5")).unwrap();
            check.met
        };
        // The run drifted (1.0 s early, 1.3 s later), but each pair says flat.
        assert_eq!(w5(1.04), Some(true));
        assert_eq!(w5(1.12), Some(false));
    }
}
