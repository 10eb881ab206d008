//! MIGRator: the integer program against brute force, its constraints, and the executed plan.

use super::ilp::{solve, solve_monolithic};
use super::problem::{Problem, Retraining};
use super::realize::realizable;
use super::workload::two_tenants;

/// The best objective over every schedule, exhaustively: every pair of retraining choices,
/// and for each an exact dynamic program over the steps whose state is both tenants' sizes
/// (the objective couples only consecutive steps of one tenant).
fn brute_force(p: &Problem) -> f64 {
    let steps = p.steps();
    let n = p.tenants.len();
    let mut options: Vec<Vec<Retraining>> = vec![Vec::new(); n];
    for (m, opts) in options.iter_mut().enumerate() {
        for k in 1..=4u8 {
            if let Some(d) = p.retrain_steps(m, k) {
                for start in 0..steps {
                    if start + d <= steps {
                        opts.push(Retraining {
                            start,
                            gpcs: k,
                            steps: d,
                        });
                    }
                }
            }
        }
    }
    let mut best = f64::MIN;
    let mut cache = std::collections::BTreeMap::new();
    for r0 in &options[0] {
        for r1 in &options[1] {
            let retraining = [*r0, *r1];
            // value[(a, b)] = best objective of steps 0..s ending with sizes (a, b).
            let mut value: Vec<((u8, u8), f64)> = vec![((p.initial[0], p.initial[1]), 0.0)];
            for s in 0..steps {
                let ret: Vec<u8> = retraining
                    .iter()
                    .map(|r| if r.runs_at(s) { r.gpcs } else { 0 })
                    .collect();
                let mut next: Vec<((u8, u8), f64)> = Vec::new();
                for a in 1..=7u8 {
                    for b in 1..=7u8 {
                        let fits = a + b + ret.iter().sum::<u8>() <= 7
                            && *cache
                                .entry((a, b, ret.clone()))
                                .or_insert_with(|| realizable(p.model, &[a, b], &ret, &[1, 1]));
                        if !fits {
                            continue;
                        }
                        let gain = |m: usize, k: u8, prev: u8| {
                            let t = &p.tenants[m];
                            let served = p.arrivals(m, s).min(p.capacity(m, k));
                            let acc = if retraining[m].done_by(s) {
                                t.acc_post
                            } else {
                                t.acc_pre
                            };
                            let penalty = if k != prev {
                                t.psi_s / p.step_s * t.acc_pre * served
                            } else {
                                0.0
                            };
                            served * acc - penalty
                        };
                        let v = value
                            .iter()
                            .map(|((pa, pb), v)| v + gain(0, a, *pa) + gain(1, b, *pb))
                            .fold(f64::MIN, f64::max);
                        next.push(((a, b), v));
                    }
                }
                value = next;
            }
            best = value.iter().map(|(_, v)| *v).fold(best, f64::max);
        }
    }
    best
}

/// A 4-second window at 1-second steps, with retraining short enough to fit.
fn tiny(seed: u64) -> Problem {
    let mut p = two_tenants(seed, 4, 1.0);
    for (i, t) in p.tenants.iter_mut().enumerate() {
        t.retrain_s = std::array::from_fn(|k| {
            if k == 0 {
                f64::INFINITY
            } else {
                (3.0 + i as f64) / k as f64
            }
        });
        t.psi_s = 0.5 + seed as f64 * 0.3;
        for f in &mut t.forecast {
            *f *= 0.5 + 0.1 * seed as f64;
        }
    }
    p
}

#[test]
fn the_program_is_optimal_on_tiny_windows() {
    for seed in 0..3 {
        let p = tiny(seed);
        let solved = solve_monolithic(&p).unwrap();
        let exact = brute_force(&p);
        assert!(
            (solved.objective - exact).abs() <= 1e-6 * exact.abs().max(1.0),
            "seed {seed}: program {} vs brute force {exact}",
            solved.objective
        );
    }
}

#[test]
fn a_full_window_meets_every_constraint() {
    for step in [1.0, 10.0] {
        let p = two_tenants(1, 200, step);
        let solved = solve(&p).unwrap();
        let s = &solved.schedule;
        p.check(s).unwrap();
        for step_i in 0..p.steps() {
            let inf: Vec<u8> = s.inference.iter().map(|v| v[step_i]).collect();
            let ret: Vec<u8> = s
                .retraining
                .iter()
                .map(|r| if r.runs_at(step_i) { r.gpcs } else { 0 })
                .collect();
            assert!(
                realizable(p.model, &inf, &ret, &[1, 1]),
                "step {step_i}: {inf:?} {ret:?}"
            );
        }
        // Retraining runs once per tenant, within the window, on one fixed size.
        for r in &s.retraining {
            assert!(r.start + r.steps <= p.steps() && (1..=4).contains(&r.gpcs));
        }
        // It beats leaving the initial split alone with the fastest retraining that fits.
        assert!(solved.objective > 0.0);
    }
}

/// Runs one window of `two_tenants` under MIGRator on the simulated GPU, arrivals from the
/// forecast each tick, then `drain_s` more seconds without arrivals.
fn execute(
    preinitialize: bool,
    drain_s: u64,
) -> (crate::SimGpu, super::Migrator, crate::RunReport) {
    use crate::{InferenceModel, JobModel, SimGpu, TaskModel, run_with};
    use escher_proto::mig::Layout;
    use escher_proto::types::TaskId;

    let p = two_tenants(1, 200, 1.0);
    let tasks: Vec<super::TenantTasks> = (0..2)
        .map(|m| super::TenantTasks {
            inference: TaskId(10 + m),
            retraining: TaskId(20 + m),
        })
        .collect();
    let start = Layout::parse(p.model, "3g.20gb@0,3g.20gb@4").unwrap();
    let mut gpu = SimGpu::new(start.clone(), 100);
    let mut migrator =
        super::Migrator::plan_window(&p, tasks.clone(), &start, 0, preinitialize).unwrap();
    for (m, t) in tasks.iter().enumerate() {
        let per_gpc_rps = p.tenants[m].capability[1];
        gpu.add_task(
            t.inference,
            TaskModel::Inference(InferenceModel {
                per_gpc_rps,
                slo_ms: 1000,
            }),
        );
        // The retraining runs as long as the planner expects on its instance.
        let r = migrator.solved().schedule.retraining[m];
        let work = p.tenants[m].retrain_s[usize::from(r.gpcs)] * f64::from(r.gpcs) / 7.0;
        gpu.add_task(
            t.retraining,
            TaskModel::Batch(JobModel::fixed(work, 7, 2.0)),
        );
    }
    // The replicas of the initial layout serve from the start.
    for (m, s) in [(0, 0u8), (1, 4u8)] {
        let on = *start.at(s).unwrap();
        gpu.bind_loaded(tasks[m].inference, on).unwrap();
    }
    let forecast: Vec<Vec<f64>> = p.tenants.iter().map(|t| t.forecast.clone()).collect();
    let tick_s = gpu.tick_ms() as f64 / 1000.0;
    let report = run_with(&mut migrator, &mut gpu, (200 + drain_s) * 1000, |gpu| {
        let sec = (gpu.now() / 1000) as usize;
        if sec < 200 {
            for (m, t) in tasks.iter().enumerate() {
                gpu.arrive(t.inference, forecast[m][sec] * tick_s);
            }
        }
    });
    (gpu, migrator, report)
}

#[test]
fn the_executed_plan_drains_before_destroying_and_never_moves_retraining() {
    let (gpu, migrator, report) = execute(true, 60);
    assert!(report.refused.is_empty(), "refused: {:?}", report.refused);
    // Every layout the GPU went through was legal.
    for (at, l) in gpu.history() {
        l.validate().unwrap_or_else(|e| panic!("{at} ms: {e}"));
    }
    // The GPU was reconfigured during the window, and no request was lost: every request
    // that arrived was served, shed past its SLO, or is still queued; most were on time.
    assert!(gpu.history().len() > 3);
    for m in 0..2u64 {
        let task = escher_proto::types::TaskId(10 + m);
        let s = gpu.stats(task).unwrap();
        assert!(s.arrived > 1000.0);
        let queued = gpu.queued(task);
        let accounted = s.served + s.expired + queued;
        assert!(
            (accounted - s.arrived).abs() < 1e-6,
            "tenant {m}: {s:?}, {queued} queued"
        );
        // The execution delivers what the plan counted on, less reconfiguration downtime.
        let p = two_tenants(1, 200, 1.0);
        let sched = &migrator.solved().schedule;
        let planned: f64 = (0..p.steps())
            .map(|i| {
                p.arrivals(m as usize, i)
                    .min(p.capacity(m as usize, sched.inference[m as usize][i]))
            })
            .sum();
        assert!(
            s.on_time > 0.8 * planned,
            "tenant {m}: {s:?}, planned {planned}"
        );
    }
    // Each retraining ran once, to the end, on an instance that stayed in every layout from
    // its launch to its end.
    for m in 0..2usize {
        let task = escher_proto::types::TaskId(20 + m as u64);
        let st = gpu.stats(task).unwrap();
        assert_eq!(st.attempts, 1);
        let end = st.finished_at.expect("retraining finished");
        let r = migrator.solved().schedule.retraining[m];
        let pin = migrator.plan().steps[r.start].assignment.retraining[m].unwrap();
        let mut from_launch = false;
        for (at, l) in gpu.history() {
            if *at >= end {
                break;
            }
            if l.contains(&pin) {
                from_launch = true;
            } else {
                assert!(
                    !from_launch,
                    "the retraining instance {pin} left the layout at {at} ms"
                );
            }
        }
    }
}

#[test]
fn the_1s_plan_never_loses_to_the_10s_plan_on_its_own_objective() {
    // The 1 s plan came from a two-stage solve that could land below the 10 s plan.
    // Both now have the same information (the window's arrivals) and the same programs: the
    // 10 s program is the 1 s solve's first stage, and its answer held at 1 s is kept when the
    // 1 s objective prefers it.
    let mut compared = 0;
    for window in 0..3 {
        let fine = two_tenants(window, 200, 1.0);
        let coarse = two_tenants(window, 200, 10.0);
        let one = solve(&fine).unwrap();
        let ten = solve(&coarse).unwrap();
        let held = super::problem::Schedule {
            inference: ten
                .schedule
                .inference
                .iter()
                .map(|v| (0..200).map(|s| v[s / 10]).collect())
                .collect(),
            retraining: one.schedule.retraining.clone(),
        };
        if fine.check(&held).is_ok() {
            compared += 1;
            assert!(
                one.objective >= fine.objective(&held) - 1e-6,
                "window {window}: 1 s {} < 10 s held {}",
                one.objective,
                fine.objective(&held)
            );
        }
    }
    assert!(
        compared > 0,
        "no window's 10 s plan was a legal 1 s schedule"
    );
}

/// Two ResNet50 tenants over 20 one-second steps, the diurnal window's step 50 in small: tenant
/// 0 retrains on a 3-GPC instance until step 5; at step 10 tenant 1's retraining starts on one
/// GPC, tenant 0 grows from 3 to 4 GPCs and tenant 1 from 1 to 2, tenant 0 taking tenant 1's
/// 1-GPC instance and tenant 1 moving to a 2-GPC instance where the first retraining was, which
/// overlaps none of its own.
fn resize_window() -> (Problem, super::problem::Schedule) {
    use super::problem::Tenant;
    let tenant = |retrain_s: [f64; 8]| Tenant {
        name: "resnet50".into(),
        min_gpcs: 1,
        capability: [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0],
        forecast: vec![100.0; 20],
        retrain_s,
        acc_pre: 0.5,
        acc_post: 0.8,
        psi_s: 6.0,
    };
    let inf = f64::INFINITY;
    let p = Problem {
        model: escher_proto::mig::GpuModel::A100_40GB,
        tenants: vec![
            tenant([inf, inf, inf, 5.0, inf, inf, inf, inf]),
            tenant([inf, 3.0, inf, inf, inf, inf, inf, inf]),
        ],
        window_s: 20,
        step_s: 1.0,
        initial: vec![3, 1],
    };
    let mut inference = vec![vec![3u8; 20], vec![1u8; 20]];
    inference[0][10..].fill(4);
    inference[1][10..].fill(2);
    let schedule = super::problem::Schedule {
        inference,
        retraining: vec![
            Retraining {
                start: 0,
                gpcs: 3,
                steps: 5,
            },
            Retraining {
                start: 10,
                gpcs: 1,
                steps: 3,
            },
        ],
    };
    (p, schedule)
}

/// Runs `schedule` under MIGRator's executor on the simulated GPU, every tenant overloaded
/// throughout; the plan and, per tenant, the longest time it served nothing (s).
fn longest_unserved(
    p: &Problem,
    schedule: &super::problem::Schedule,
    preinitialize: bool,
) -> (super::plan::Plan, Vec<f64>) {
    use crate::{InferenceModel, JobModel, SimGpu, TaskModel, run_with};
    use escher_proto::mig::Layout;
    use escher_proto::types::TaskId;

    let tasks: Vec<super::TenantTasks> = (0..p.tenants.len() as u64)
        .map(|m| super::TenantTasks {
            inference: TaskId(10 + m),
            retraining: TaskId(20 + m),
        })
        .collect();
    let solved = || super::ilp::Solved {
        schedule: schedule.clone(),
        objective: 0.0,
        solve_time: std::time::Duration::ZERO,
        programs: 0,
    };
    let cold = Layout::new(p.model);
    let first = super::Migrator::execute("x", p, solved(), tasks.clone(), &cold, 0, preinitialize)
        .unwrap()
        .plan()
        .steps[0]
        .assignment
        .clone();
    let mut gpu = SimGpu::new(first.layout.clone(), 100);
    let mut migrator = super::Migrator::execute(
        "x",
        p,
        solved(),
        tasks.clone(),
        &first.layout,
        0,
        preinitialize,
    )
    .unwrap();
    for (m, t) in tasks.iter().enumerate() {
        gpu.add_task(
            t.inference,
            TaskModel::Inference(InferenceModel {
                per_gpc_rps: p.tenants[m].capability[1],
                slo_ms: 1000,
            }),
        );
        let r = schedule.retraining[m];
        let work = p.tenants[m].retrain_s[usize::from(r.gpcs)] * f64::from(r.gpcs) / 7.0;
        gpu.add_task(
            t.retraining,
            TaskModel::Batch(JobModel::fixed(work, 7, 2.0)),
        );
        for on in &first.inference[m] {
            gpu.bind_loaded(t.inference, *on).unwrap();
        }
    }
    let tick_s = gpu.tick_ms() as f64 / 1000.0;
    let mut served = vec![0.0; tasks.len()];
    let mut since = vec![0u64; tasks.len()];
    let mut longest = vec![0.0f64; tasks.len()];
    let report = run_with(
        &mut migrator,
        &mut gpu,
        u64::from(p.window_s) * 1000,
        |gpu| {
            let now = gpu.now();
            for (m, t) in tasks.iter().enumerate() {
                gpu.arrive(t.inference, p.tenants[m].forecast[0] * tick_s);
                let s = gpu.stats(t.inference).map_or(0.0, |s| s.served);
                if s > served[m] + 1e-9 {
                    served[m] = s;
                    since[m] = now;
                }
                longest[m] = longest[m].max((now - since[m]) as f64 / 1000.0);
            }
        },
    );
    assert!(report.refused.is_empty(), "refused: {:?}", report.refused);
    (migrator.plan().clone(), longest)
}

#[test]
fn a_resize_keeps_the_old_replica_serving_until_the_new_one_does() {
    // At the diurnal window's step 50, tenant 1's 1-GPC replica was drained at the step's
    // start for tenant 0 while its new 2-GPC instance was still being created, and it served
    // nothing for 5.4-5.8 s. Its new instance overlaps none of its old ones, so the old
    // one serves until the new one does, and the plan counts no time without a replica.
    let (p, schedule) = resize_window();
    for preinitialize in [false, true] {
        let (plan, longest) = longest_unserved(&p, &schedule, preinitialize);
        let s10 = &plan.steps[10].assignment;
        let moved = &s10.inference[1];
        assert!(
            plan.steps[9].assignment.inference[1]
                .iter()
                .all(|o| !s10.inference[1].contains(o)
                    && moved.iter().all(|n| n.overlap(o).is_none())),
            "tenant 1 moves to a placement overlapping none of its own: {:?}",
            plan.steps[9..11]
                .iter()
                .map(|s| &s.assignment)
                .collect::<Vec<_>>()
        );
        assert!(plan.exposed.is_empty(), "{:?}", plan.exposed);
        for (m, gap) in longest.iter().enumerate() {
            // A tick and the requests a replica holds (at most its 1 s SLO) aside.
            assert!(
                *gap <= plan.exposed_s(m) + 0.2,
                "preinitialize {preinitialize}: tenant {m} served nothing for {gap} s, the plan \
                 says {} s",
                plan.exposed_s(m)
            );
        }
    }
}

#[test]
fn a_window_planned_with_no_resize_cost_is_priced_by_its_own_plan() {
    use super::reconfig::{evaluate_credited, lead_steps};
    use super::workload::{HISTORY_WINDOWS, Shape, Workload};
    use super::{MAX_PRICINGS, solve_priced};
    use crate::migrator::plan::build_plan;
    use escher_proto::mig::Layout;

    let mut underpriced = 0;
    for shape in Shape::ALL {
        for seed in 0..3 {
            let w = Workload::new(shape, HISTORY_WINDOWS + 1, 200, seed);
            // Ψ = 0 carried over, as from a window whose every resize was built ahead.
            let mut p = w.actual(HISTORY_WINDOWS, 10.0);
            for t in &mut p.tenants {
                t.psi_s = 0.0;
            }
            let (start, lead) = (Layout::new(p.model), lead_steps(&p));
            let cost = |schedule| {
                let plan = build_plan(&p, schedule, &start, lead).unwrap();
                evaluate_credited(&p, schedule, &plan).psi_next
            };
            // Solved as it comes, some window's resizes cost more than the program charged.
            let plain = solve(&p).unwrap().schedule;
            underpriced += usize::from(cost(&plain).iter().any(|c| *c > 1e-6));
            let priced = solve_priced(&p, &start, lead).unwrap();
            assert!(priced.psi_s.iter().all(|psi| *psi >= 0.0));
            if priced.solves < MAX_PRICINGS {
                // What each tenant's resizes cost along the plan is at most what its
                // program charged for them.
                for (c, psi) in cost(&priced.solved.schedule).iter().zip(&priced.psi_s) {
                    assert!(c <= &(psi + 1e-6), "{shape:?} seed {seed}: {c} > {psi}");
                }
            }
            assert_eq!(
                priced.solved.schedule,
                solve(&with_psi(&p, &priced.psi_s)).unwrap().schedule,
                "the schedule is the program's at the Ψ it reports"
            );
        }
    }
    assert!(underpriced > 0, "no window's plan cost more than Ψ = 0");
}

/// `p` with each tenant's `Ψ` set.
fn with_psi(p: &Problem, psi: &[f64]) -> Problem {
    let mut p = p.clone();
    for (t, psi) in p.tenants.iter_mut().zip(psi) {
        t.psi_s = *psi;
    }
    p
}
