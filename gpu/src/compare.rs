//! MIGRator against its baselines over several windows of one trace shape, in memory: the
//! comparison `examples/gpu_policies.rs` prints and `escher-bench gpu` reports.
//!
//! Every policy is evaluated on the window's real arrivals. What each one plans from:
//!
//! - **MIGRator (forecast)**, as P0 runs it: the arrivals forecast from the windows before
//!   ([`forecast`](super::migrator::forecast)), its program's `Ψ` each tenant's mean
//!   reconfiguration overhead measured in its previous window (P0's definition; for the
//!   first, along its plan for the last window of history, [`psi_for`]), its plan carried out with
//!   pre-initialization and every resize charged per model and per phase, nothing for one built
//!   ahead ([`reconfig`](super::migrator::reconfig));
//! - **MIGRator (oracle)**: the window's exact arrivals, an upper bound no deployment has,
//!   planned and charged the same way;
//! - **Ekya**, as its paper has it (thesis §2.4.2; P0 §5.1: "MPS; reallocates at retraining
//!   start and end"): only what Ekya knows ([`online`]: the rates observed so far, its own
//!   objective), its MPS shares changed at the window's start and at each retraining's start and
//!   end, without stopping the tenant ([`evaluate_shares`]: a change costs nothing, every share
//!   serves at the assumed MPS interference, [`MPS_INTERFERENCE`](super::shares::MPS_INTERFERENCE));
//! - **Ekya (every change stops it)**: the same plan with every share change, shrinks included,
//!   stopping the tenant for a full MIG reconfiguration's phases ([`evaluate_shares_paying`]
//!   after [`charge_in_full`]), the baseline MIGRator was measured against before; not Ekya as
//!   its paper describes it, printed so that the difference shows;
//! - **Ekya (exact future, free changes)**: the baseline as it was before Ekya was given only
//!   what it knows ([`thief`]), printed so that the difference shows;
//! - **Astraea** and **PARIS** as before: Astraea reads each step's arrivals as they come
//!   (its shares follow the load at no cost), PARIS the window's mean arrivals (its static
//!   split); neither is given a forecaster here.

use std::time::Duration;

use super::baselines::{astraea, paris};
use super::ekya::{online, thief};
use super::migrator::forecast::mape;
use escher_proto::mig::Layout;

use super::migrator::ilp::PlanError;
use super::migrator::plan::build_plan;
use super::migrator::problem::Problem;
use super::migrator::reconfig::{evaluate_credited, lead_steps, phases};
use super::migrator::solve_priced;
use super::migrator::workload::{HISTORY_WINDOWS, Shape, Workload};
use super::shares::{Outcome, capacity_at, evaluate_mig, evaluate_shares, evaluate_shares_paying};

/// The policies compared, in the order of [`Comparison::rows`].
pub const POLICIES: [&str; 7] = [
    "MIGRator (forecast)",
    "MIGRator (oracle)",
    "Ekya",
    "Ekya (every change stops it)",
    "Ekya (exact future, free changes)",
    "Astraea",
    "PARIS",
];

/// What [`compare`] found for one shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// The shape.
    pub shape: Shape,
    /// Windows evaluated (after [`HISTORY_WINDOWS`] of history).
    pub windows: usize,
    /// Each policy's outcome summed over the windows, in the order of [`POLICIES`].
    pub rows: Vec<Outcome>,
    /// Mean absolute percentage error of each tenant's forecast over the windows, %.
    pub forecast_mape: Vec<f64>,
    /// MIGRator's solve time per window (forecast plan).
    pub solve_times: Vec<Duration>,
    /// What pre-initialization saved MIGRator's forecast plans over the windows.
    pub preinit: Preinit,
    /// The most any schedule could serve on time over the windows ([`slo_bound`]; its
    /// `goodput` and `accuracy` are 0).
    pub bound: Outcome,
}

/// The most requests any schedule could serve on time in `problem`'s window, as every policy
/// here is evaluated (`min(arrivals, capacity)` per step): at each step, the split of the
/// GPU's seven GPCs between the tenants' inference that serves the most, in hundredths of a
/// GPC, with no retraining, no resize cost and no MIG placement rule. An upper bound on every
/// policy's SLO attainment, so on what a schedule can gain from it.
///
/// Each tenant's on-time count is concave in its share (capacity is the concave envelope of
/// its capability, capped by its arrivals), so the split that hands each hundredth to the
/// tenant it helps most is the best one.
pub fn slo_bound(problem: &Problem) -> Outcome {
    const UNITS: usize = 700;
    let n = problem.tenants.len();
    let capacity: Vec<Vec<f64>> = (0..n)
        .map(|m| {
            (0..=UNITS)
                .map(|u| capacity_at(problem, m, u as f64 / 100.0))
                .collect()
        })
        .collect();
    let mut out = Outcome::default();
    for s in 0..problem.steps() {
        let arrived: Vec<f64> = (0..n).map(|m| problem.arrivals(m, s)).collect();
        let served = |m: usize, u: usize| arrived[m].min(capacity[m][u]);
        let mut units = vec![0usize; n];
        for _ in 0..UNITS {
            let best = (0..n)
                .map(|m| (m, served(m, units[m] + 1) - served(m, units[m])))
                .max_by(|a, b| a.1.total_cmp(&b.1));
            match best {
                Some((m, gain)) if gain > 0.0 => units[m] += 1,
                _ => break,
            }
        }
        out.arrived += arrived.iter().sum::<f64>();
        out.on_time += (0..n).map(|m| served(m, units[m])).sum::<f64>();
    }
    out
}

/// Reconfiguration overhead along MIGRator's plans, with and without pre-initialization
/// ([`reconfig::evaluate_credited`](super::migrator::reconfig::evaluate_credited)).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Preinit {
    /// Inference resizes.
    pub resizes: usize,
    /// Of those, built ahead.
    pub preinitialized: usize,
    /// Service lost to reconfiguration, seconds.
    pub lost_s: f64,
    /// The same resizes' overhead had none been built ahead, seconds.
    pub lost_without_s: f64,
}

impl Preinit {
    /// The share of the reconfiguration overhead pre-initialization took off (P0 §5: 83%).
    pub fn reduction(&self) -> f64 {
        if self.lost_without_s > 0.0 {
            1.0 - self.lost_s / self.lost_without_s
        } else {
            0.0
        }
    }
}

/// MIGRator and its baselines on `windows` windows of `shape` (seeded by `seed`), planned at
/// `step_s`.
pub fn compare(
    shape: Shape,
    windows: usize,
    step_s: f64,
    seed: u64,
) -> Result<Comparison, PlanError> {
    let workload = Workload::new(shape, HISTORY_WINDOWS + windows, 200, seed);
    let mut rows = vec![Outcome::default(); POLICIES.len()];
    let mut errors = vec![0.0; 2];
    let mut solve_times = Vec::new();
    let mut preinit = Preinit::default();
    let mut bound = Outcome::default();
    // Ψ per tenant for the forecast and the oracle plans: measured in their previous window
    // (P0's definition), the last window of history for the first.
    let mut psi = [
        psi_for(&workload, HISTORY_WINDOWS, step_s, false)?,
        psi_for(&workload, HISTORY_WINDOWS, step_s, true)?,
    ];
    for w in HISTORY_WINDOWS..HISTORY_WINDOWS + windows {
        let actual = workload.actual(w, step_s);
        bound.add(slo_bound(&actual));
        let (mut forecast, _) = workload.forecast(w, step_s);
        for (m, e) in errors.iter_mut().enumerate() {
            *e += mape(&forecast.tenants[m].forecast, &actual.tenants[m].forecast) / windows as f64;
        }
        let mut oracle_problem = actual.clone();
        for (problem, psi) in [&mut forecast, &mut oracle_problem].into_iter().zip(&psi) {
            for (t, psi) in problem.tenants.iter_mut().zip(psi) {
                t.psi_s = *psi;
            }
        }
        let start = Layout::new(actual.model);
        let lead = lead_steps(&actual);
        let planned = solve_priced(&forecast, &start, lead)?.solved;
        solve_times.push(planned.solve_time);
        let oracle = solve_priced(&oracle_problem, &start, lead)?.solved;
        let past = workload.past(w);
        // A tenant never resized in this window keeps a resize's full cost as its next `Ψ`.
        let mut charged_on = actual.clone();
        charge_in_full(&mut charged_on);
        let mut migrator = Vec::new();
        for (i, schedule) in [&planned.schedule, &oracle.schedule]
            .into_iter()
            .enumerate()
        {
            let plan = build_plan(&actual, schedule, &start, lead)?;
            let charged = evaluate_credited(&charged_on, schedule, &plan);
            if i == 0 {
                preinit.resizes += charged.resizes;
                preinit.preinitialized += charged.preinitialized;
                preinit.lost_s += charged.lost_s;
                preinit.lost_without_s += charged.lost_without_s;
            }
            psi[i] = charged.psi_next.clone();
            migrator.push(charged.outcome);
        }
        // Ekya on MPS: its shares change at retraining's start and end without stopping the
        // tenant. The earlier baseline, each change stopping the tenant for a full MIG
        // reconfiguration's phases, beside it.
        let ekya = online(&actual, &past, 0.1);
        let mut paying = actual.clone();
        charge_in_full(&mut paying);
        let outcomes = [
            migrator[0],
            migrator[1],
            evaluate_shares(&actual, &ekya),
            evaluate_shares_paying(&paying, &ekya),
            evaluate_shares(&actual, &thief(&actual, 0.1)),
            evaluate_shares(&actual, &astraea(&actual)),
            evaluate_mig(&actual, &paris(&actual)),
        ];
        for (row, o) in rows.iter_mut().zip(outcomes) {
            row.add(o);
        }
    }
    Ok(Comparison {
        shape,
        windows,
        rows,
        forecast_mape: errors,
        solve_times,
        preinit,
        bound,
    })
}

impl Comparison {
    /// Several runs of one shape (other seeds) as one: outcomes and pre-initialization summed,
    /// forecast errors averaged, solve times one after the other.
    pub fn pool(runs: &[Comparison]) -> Option<Comparison> {
        let (first, rest) = runs.split_first()?;
        let mut out = first.clone();
        for c in rest {
            out.windows += c.windows;
            for (row, o) in out.rows.iter_mut().zip(&c.rows) {
                row.add(*o);
            }
            for (e, other) in out.forecast_mape.iter_mut().zip(&c.forecast_mape) {
                *e += other;
            }
            out.solve_times.extend(&c.solve_times);
            out.preinit.resizes += c.preinit.resizes;
            out.preinit.preinitialized += c.preinit.preinitialized;
            out.preinit.lost_s += c.preinit.lost_s;
            out.preinit.lost_without_s += c.preinit.lost_without_s;
            out.bound.add(c.bound);
        }
        for e in &mut out.forecast_mape {
            *e /= runs.len() as f64;
        }
        Some(out)
    }
}

/// Sets every tenant's `Ψ` to what a resize costs it without pre-initialization: its model's
/// four phases on a whole-GPU instance that replaces the one it overlaps.
pub fn charge_in_full(problem: &mut Problem) {
    for t in &mut problem.tenants {
        t.psi_s = phases(&t.name, 7).on_path(true);
    }
}

/// Each tenant's `Ψ` for window `w` of `workload`, as P0 defines it (Table 1: "the average
/// reconfiguration overhead of task (m, i) in seconds during the last retraining window"):
/// MIGRator's plan for window `w - 1`, made from that window's forecast (`oracle`: from its
/// exact arrivals) with every resize charged in full ([`charge_in_full`]), carried out with
/// pre-initialization and charged by [`evaluate_credited`]. A deployment that ran window
/// `w - 1` knows this before window `w` starts; only window 0, with no window before it,
/// plans with the full cost.
pub fn psi_for(
    workload: &Workload,
    w: usize,
    step_s: f64,
    oracle: bool,
) -> Result<Vec<f64>, PlanError> {
    let mut previous = if w == 0 {
        workload.actual(0, step_s)
    } else if oracle {
        workload.actual(w - 1, step_s)
    } else {
        workload.forecast(w - 1, step_s).0
    };
    charge_in_full(&mut previous);
    if w == 0 {
        return Ok(previous.tenants.iter().map(|t| t.psi_s).collect());
    }
    let actual = workload.actual(w - 1, step_s);
    let (start, lead) = (Layout::new(actual.model), lead_steps(&actual));
    let schedule = solve_priced(&previous, &start, lead)?.solved.schedule;
    let plan = build_plan(&actual, &schedule, &start, lead)?;
    let mut charged_on = actual;
    charge_in_full(&mut charged_on);
    Ok(evaluate_credited(&charged_on, &schedule, &plan).psi_next)
}

#[cfg(test)]
mod tests {
    use super::super::ekya::{online, online_on_mig};
    use super::super::migrator::ilp::solve;
    use super::*;

    #[test]
    fn the_slo_bound_splits_the_gpu_where_it_serves_most_and_no_policy_passes_it() {
        use super::super::migrator::problem::Tenant;
        // Two tenants serving 10 requests/s per GPC: 30/s and 50/s arrive for 10 s, then
        // 80/s and 0. The seven GPCs serve 70 of the first 80 per second, then 70 of 80.
        let tenant = |forecast: Vec<f64>| Tenant {
            name: "resnet50".into(),
            min_gpcs: 1,
            capability: [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0],
            forecast,
            retrain_s: [f64::INFINITY, 50.0, 30.0, 20.0, 15.0, 12.0, 10.0, 9.0],
            acc_pre: 0.5,
            acc_post: 0.8,
            psi_s: 6.0,
        };
        let mut first = vec![30.0; 10];
        first.extend([80.0; 10]);
        let mut second = vec![50.0; 10];
        second.extend([0.0; 10]);
        let problem = Problem {
            model: escher_proto::mig::GpuModel::A100_40GB,
            tenants: vec![tenant(first), tenant(second)],
            window_s: 20,
            step_s: 1.0,
            initial: vec![3, 4],
        };
        let bound = slo_bound(&problem);
        assert!((bound.arrived - 1600.0).abs() < 1e-6, "{bound:?}");
        assert!((bound.on_time - 1400.0).abs() < 1e-6, "{bound:?}");
        // Every policy of a comparison stays under it.
        let c = compare(Shape::Bursty, 1, 10.0, 4).unwrap();
        for (name, row) in POLICIES.iter().zip(&c.rows) {
            assert!(
                (row.arrived - c.bound.arrived).abs() < 1e-6 * row.arrived,
                "{name}"
            );
            assert!(
                row.on_time <= c.bound.on_time + 1e-6,
                "{name}: {row:?} {:?}",
                c.bound
            );
        }
    }

    /// `workload` with every arrival from second `t` on changed (doubled plus 50).
    fn changed_after(workload: &Workload, t: usize) -> Workload {
        let mut other = workload.clone();
        for a in &mut other.arrivals {
            for x in &mut a[t..] {
                *x = 2.0 * *x + 50.0;
            }
        }
        other
    }

    #[test]
    fn ekya_decides_nothing_from_arrivals_it_has_not_seen() {
        for shape in Shape::ALL {
            let w = Workload::new(shape, HISTORY_WINDOWS + 1, 200, 3);
            let window = HISTORY_WINDOWS;
            let start = window * 200;
            for cut in [0usize, 60, 130] {
                let other = changed_after(&w, start + cut);
                let (a, b) = (w.actual(window, 1.0), other.actual(window, 1.0));
                assert_ne!(a, b, "the futures differ");
                let (pa, pb) = (
                    online(&a, &w.past(window), 0.1),
                    online(&b, &other.past(window), 0.1),
                );
                // Every share in force up to the cut is the same (the decisions made at the
                // cut read only the seconds before it), and so is every retraining started by
                // then; at cut 0 that is the window's first decision, from the past alone.
                for m in 0..2 {
                    assert_eq!(
                        pa.inference[m][..=cut],
                        pb.inference[m][..=cut],
                        "{shape:?}, tenant {m}, cut {cut}"
                    );
                    let started = |r: Option<(usize, f64)>| r.filter(|r| r.0 <= cut);
                    assert_eq!(started(pa.retraining[m]), started(pb.retraining[m]));
                }
                if cut == 0 {
                    let (ma, mb) = (
                        online_on_mig(&a, &w.past(window), 0.1),
                        online_on_mig(&b, &other.past(window), 0.1),
                    );
                    for m in 0..2 {
                        assert_eq!(ma.inference[m][0], mb.inference[m][0]);
                    }
                }
            }
        }
    }

    #[test]
    fn a_thief_that_reads_the_future_is_caught_by_the_same_check() {
        // The check above is not vacuous: the exact-future thief's first decision (step 0,
        // before any arrival of the window) changes when only the window's arrivals change.
        let mut caught = 0;
        for shape in Shape::ALL {
            let w = Workload::new(shape, HISTORY_WINDOWS + 1, 200, 3);
            let other = changed_after(&w, HISTORY_WINDOWS * 200);
            let (a, b) = (
                w.actual(HISTORY_WINDOWS, 1.0),
                other.actual(HISTORY_WINDOWS, 1.0),
            );
            let (pa, pb) = (thief(&a, 0.1), thief(&b, 0.1));
            let first = |p: &super::super::shares::SharePlan| {
                (
                    p.inference.iter().map(|v| v[0]).collect::<Vec<_>>(),
                    p.retraining
                        .iter()
                        .map(|r| r.filter(|r| r.0 == 0))
                        .collect::<Vec<_>>(),
                )
            };
            caught += usize::from(first(&pa) != first(&pb));
        }
        assert!(caught > 0, "the peeking thief was never caught");
    }

    #[test]
    fn migrator_s_forecast_and_plan_read_only_the_past() {
        for shape in Shape::ALL {
            let w = Workload::new(shape, HISTORY_WINDOWS + 1, 200, 5);
            let window = HISTORY_WINDOWS;
            // Change the window itself and everything after it.
            let other = changed_after(&w, window * 200);
            let ((fa, fits_a), (fb, fits_b)) =
                (w.forecast(window, 10.0), other.forecast(window, 10.0));
            assert_eq!(fa, fb, "{shape:?}");
            assert_eq!(fits_a, fits_b);
            assert_eq!(
                solve(&fa).unwrap().schedule,
                solve(&fb).unwrap().schedule,
                "{shape:?}"
            );
            // And the last second before the window does change the forecast: it is read.
            let mut earlier = w.clone();
            for a in &mut earlier.arrivals {
                for x in &mut a[window * 200 - 50..window * 200] {
                    *x *= 3.0;
                }
            }
            assert_ne!(earlier.forecast(window, 10.0).0, fa, "{shape:?}");
        }
    }

    #[test]
    fn psi_is_measured_on_the_window_before_and_reads_nothing_of_the_window_it_plans() {
        for shape in Shape::ALL {
            let w = Workload::new(shape, HISTORY_WINDOWS + 1, 200, 4);
            let window = HISTORY_WINDOWS;
            let other = changed_after(&w, window * 200);
            for oracle in [false, true] {
                let psi = psi_for(&w, window, 10.0, oracle).unwrap();
                assert_eq!(
                    psi,
                    psi_for(&other, window, 10.0, oracle).unwrap(),
                    "{shape:?}"
                );
                // No tenant's overhead per resize exceeds what a step can cost: the worker
                // makes a step's instances one after another, so a resize that waits for
                // others costs more than its own instance's phases, but no step destroys and
                // creates more than the GPU's seven instances.
                let full = w.actual(window, 10.0);
                for (p, t) in psi.iter().zip(&full.tenants) {
                    let most = 7.0 * phases(&t.name, 1).on_path(true);
                    assert!(*p >= 0.0 && *p <= most + 1e-9, "{shape:?}: {p} > {most}");
                }
            }
        }
        // The first window has no window before it: a resize's full cost.
        let w = Workload::new(Shape::Bursty, 1, 200, 4);
        let mut full = w.actual(0, 10.0);
        charge_in_full(&mut full);
        let expected: Vec<f64> = full.tenants.iter().map(|t| t.psi_s).collect();
        assert_eq!(psi_for(&w, 0, 10.0, false).unwrap(), expected);
    }

    #[test]
    fn ekya_on_mps_changes_shares_only_at_retraining_start_and_end_and_never_stops() {
        let w = Workload::new(Shape::Paper, HISTORY_WINDOWS + 1, 200, 3);
        let p = w.actual(HISTORY_WINDOWS, 10.0);
        let plan = online(&p, &w.past(HISTORY_WINDOWS), 0.1);
        // Decision points: the window's start and each retraining's end; a retraining starts
        // only at one of them.
        let ends: Vec<usize> = plan
            .retraining
            .iter()
            .enumerate()
            .filter_map(|(m, r)| {
                let (start, f) = (*r)?;
                super::super::shares::retrain_steps_at(&p, m, f).map(|d| start + d)
            })
            .collect();
        let points: Vec<usize> = std::iter::once(0).chain(ends).collect();
        for (start, _) in plan.retraining.iter().flatten() {
            assert!(
                points.contains(start),
                "a retraining started at {start}: {points:?}"
            );
        }
        for share in &plan.inference {
            for s in 1..share.len() {
                if (share[s] - share[s - 1]).abs() > 1e-9 {
                    assert!(
                        points.contains(&s),
                        "a share changed at step {s}: {points:?}"
                    );
                }
            }
        }
        // In the comparison, Ekya is that plan with changes free; the stopping variant is the
        // same plan charged a full reconfiguration per change, and never does better.
        let c = compare(Shape::Paper, 1, 10.0, 3).unwrap();
        let at = |name: &str| c.rows[POLICIES.iter().position(|p| *p == name).unwrap()];
        assert!(at("Ekya").on_time >= at("Ekya (every change stops it)").on_time);
        let mut paying = p.clone();
        charge_in_full(&mut paying);
        assert_eq!(at("Ekya"), evaluate_shares(&p, &plan));
        assert_eq!(
            at("Ekya (every change stops it)"),
            evaluate_shares_paying(&paying, &plan)
        );
    }

    #[test]
    fn ekya_s_share_changes_pay_for_themselves() {
        let w = Workload::new(Shape::Paper, HISTORY_WINDOWS + 1, 200, 3);
        let p = w.actual(HISTORY_WINDOWS, 1.0);
        let plan = online(&p, &w.past(HISTORY_WINDOWS), 0.1);
        let (free, paying) = (
            evaluate_shares(&p, &plan),
            evaluate_shares_paying(&p, &plan),
        );
        assert!(paying.on_time < free.on_time, "{paying:?} vs {free:?}");
        // A plan that never leaves the initial split pays nothing.
        let still = super::super::shares::SharePlan {
            inference: vec![vec![3.0 / 7.0; 200]; 2],
            retraining: vec![None, None],
        };
        assert_eq!(
            evaluate_shares(&p, &still),
            evaluate_shares_paying(&p, &still)
        );
    }
}
