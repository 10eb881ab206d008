//! MIGRator's per-window integer program (P0 §4.1), built with `good_lp` and solved by its
//! pure-Rust `microlp` backend.
//!
//! # Formulation
//!
//! P0 assigns every instance of every MIG configuration to a task for every second (binary
//! `X^s_(m),(λ,γ)`). Here the variables are the sizes those assignments add up to, which is
//! what the objective and the constraints read, and the layout is rebuilt from the sizes
//! afterwards (`plan.rs`), so that the program stays small: P0 aims at solving within 1% of
//! the window; this one took 0.09–0.42% of a 200 s window in one run of
//! `examples/gpu_policies.rs` and 1.38–1.66% in others on a loaded 2-core machine, so that
//! aim is not held in every run:
//!
//! - `x[m][s][k]` (binary): tenant `m`'s inference holds `k` GPCs in step `s` (one `k` per
//!   step: eq. 5's `Y ≥ L` is the range of `k`);
//! - `y[m][t][k]` (binary): tenant `m`'s retraining starts at step `t` on one `k`-GPC
//!   instance and runs `RT_k` steps; exactly one per tenant, finishing in the window
//!   (eqs. 3a, 4). Choosing the start and the size together makes the GPC count constant from
//!   start to end, which is eqs. 3b to 3f's "no interruption";
//! - capacity: inference and running retraining use at most 7 GPCs each step, and tuples of
//!   sizes that no MIG layout realizes are cut off explicitly ([`unrealizable_cuts`]): eqs. 1
//!   and 2, "one configuration per second" and "no instance shared";
//! - `inn[m][s][k] ≥ x[m][s][k] - x[m][s-1][k]`: tenant `m` enters size `k` at step `s`, which
//!   is eq. 11's `R` made exact (the paper's form only bounds `R` from above);
//! - `w[m][s] ≤ served`, `w[m][s] ≤ arrivals * Completion`: eq. 9's product of throughput and
//!   completion, linearized;
//! - objective: `Σ acc_pre * served + (acc_post - acc_pre) * w - psi * acc_pre * served(k) *
//!   inn` (eqs. 7 to 10).
//!
//! # Two stages for fine steps
//!
//! A monolithic program over 200 one-second steps is beyond `microlp` in 2 s (its simplex
//! takes about 40 s for the relaxation alone on this machine), so a window of more than
//! [`MONOLITHIC_STEPS`] steps is solved in two stages: the whole program at 10-second steps
//! (the retraining decisions: start and size), then the inference sizes at the fine step in
//! chunks of [`CHUNK_STEPS`] with the retraining fixed, each chunk starting from the size the
//! previous one ended with. Each stage is a real integer program; the split is a rolling
//! horizon, so the result can fall short of the monolithic optimum (`solve_monolithic` is the
//! exact one, and what the optimality test checks against brute force). The first stage's
//! answer held at the fine step is a fine schedule as well, and [`solve`] returns whichever of
//! the two the fine objective prefers: a 1 s plan then never loses, on its own objective, to
//! the 10 s plan it had in hand, so that the two plans compare with the same information and
//! the same programs.

use std::time::Duration;
#[cfg(feature = "milp")]
use std::time::Instant;

#[cfg(feature = "milp")]
use good_lp::{
    Expression, ProblemVariables, Solution, SolverModel, Variable, constraint, microlp, variable,
};

#[cfg(feature = "milp")]
use super::problem::Retraining;
use super::problem::{Problem, Schedule};
use super::realize::realizable;

/// Windows of at most this many steps are solved as one program.
pub const MONOLITHIC_STEPS: usize = 25;
/// Fine steps per chunk in the second stage.
pub const CHUNK_STEPS: usize = 25;
/// The coarse stage's step, seconds.
pub const COARSE_STEP_S: f64 = 10.0;

/// Why no schedule was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// No schedule meets every constraint (a retraining that cannot finish in the window
    /// next to the inference minimums, for example).
    #[error("no schedule meets the constraints: {0}")]
    Infeasible(String),
    /// The solver failed.
    #[error("the MILP solver failed: {0}")]
    Solver(String),
}

/// A schedule and what it took.
#[derive(Debug, Clone, PartialEq)]
pub struct Solved {
    /// The schedule.
    pub schedule: Schedule,
    /// Its objective ([`Problem::objective`]).
    pub objective: f64,
    /// Wall-clock time of building and solving every program.
    pub solve_time: Duration,
    /// Programs solved.
    pub programs: usize,
}

/// Solves a window: one program if it has at most [`MONOLITHIC_STEPS`] steps, else in two
/// stages (see the module doc). Needs the `milp` feature (on by default).
#[cfg(feature = "milp")]
pub fn solve(problem: &Problem) -> Result<Solved, PlanError> {
    let started = Instant::now();
    if problem.steps() <= MONOLITHIC_STEPS {
        return solve_monolithic(problem);
    }
    // Stage 1: the whole window at 10-second steps decides the retraining.
    let coarse = Problem {
        step_s: COARSE_STEP_S.max(problem.step_s),
        ..problem.clone()
    };
    let first = build(&coarse, 0, coarse.steps(), &coarse.initial, None)?;
    let ratio = coarse.step_s / problem.step_s;
    let steps = problem.steps();
    let mut retraining = Vec::new();
    for (m, r) in first.retraining.iter().enumerate() {
        let fine_steps = problem
            .retrain_steps(m, r.gpcs)
            .ok_or_else(|| PlanError::Infeasible(format!("tenant {m} cannot retrain")))?;
        let start = ((r.start as f64 * ratio).round() as usize).min(steps - fine_steps);
        retraining.push(Retraining {
            start,
            gpcs: r.gpcs,
            steps: fine_steps,
        });
    }
    // Stage 2: the inference sizes, chunk by chunk.
    let mut inference = vec![Vec::with_capacity(steps); problem.tenants.len()];
    let mut initial = problem.initial.clone();
    let mut programs = 1;
    let mut from = 0;
    while from < steps {
        let to = (from + CHUNK_STEPS).min(steps);
        let part = build(problem, from, to, &initial, Some(&retraining))?;
        for (m, v) in part.inference.into_iter().enumerate() {
            initial[m] = *v.last().expect("a chunk has steps");
            inference[m].extend(v);
        }
        programs += 1;
        from = to;
    }
    let refined = Schedule {
        inference,
        retraining: retraining.clone(),
    };
    problem.check(&refined).map_err(PlanError::Infeasible)?;
    // The coarse plan itself, held at the fine step, is a fine schedule too: the two-stage
    // answer is kept only where it does better by the fine problem's own objective, so a
    // fine plan never loses to the coarse one it was refined from (the same information and
    // the same programs solved).
    let ratio_steps = (coarse.step_s / problem.step_s).round().max(1.0) as usize;
    let held = Schedule {
        inference: first
            .inference
            .iter()
            .map(|v| {
                (0..steps)
                    .map(|s| v[(s / ratio_steps).min(v.len() - 1)])
                    .collect()
            })
            .collect(),
        retraining,
    };
    let schedule =
        if problem.check(&held).is_ok() && problem.objective(&held) > problem.objective(&refined) {
            held
        } else {
            refined
        };
    Ok(Solved {
        objective: problem.objective(&schedule),
        schedule,
        solve_time: started.elapsed(),
        programs,
    })
}

/// Solves the window as one program (exact, for small windows). Needs the `milp` feature.
#[cfg(feature = "milp")]
pub fn solve_monolithic(problem: &Problem) -> Result<Solved, PlanError> {
    let started = Instant::now();
    let schedule = build(problem, 0, problem.steps(), &problem.initial, None)?;
    problem.check(&schedule).map_err(PlanError::Infeasible)?;
    Ok(Solved {
        objective: problem.objective(&schedule),
        schedule,
        solve_time: started.elapsed(),
        programs: 1,
    })
}

/// Tuples of sizes (each tenant's inference GPCs, then each tenant's retraining GPCs, 0 for
/// none) that fit in 7 GPCs but that no legal layout realizes, for the given minimums.
pub fn unrealizable_cuts(problem: &Problem) -> Vec<Vec<u8>> {
    let n = problem.tenants.len();
    let mins: Vec<u8> = problem.tenants.iter().map(|t| t.min_gpcs).collect();
    let mut out = Vec::new();
    let mut tuple = vec![0u8; 2 * n];
    fn rec(
        i: usize,
        left: u8,
        tuple: &mut Vec<u8>,
        mins: &[u8],
        problem: &Problem,
        out: &mut Vec<Vec<u8>>,
    ) {
        let n = mins.len();
        if i == 2 * n {
            if !realizable(problem.model, &tuple[..n], &tuple[n..], mins) {
                out.push(tuple.clone());
            }
            return;
        }
        let lo = if i < n { mins[i] } else { 0 };
        for k in lo..=left {
            if i >= n && k > 4 {
                break;
            }
            tuple[i] = k;
            rec(i + 1, left - k, tuple, mins, problem, out);
        }
    }
    rec(
        0,
        problem.model.compute_slices(),
        &mut tuple,
        &mins,
        problem,
        &mut out,
    );
    out
}

/// Builds and solves the program for steps `from..to` from `initial` sizes; with `fixed`,
/// the retraining is given and only the inference is decided.
#[cfg(feature = "milp")]
fn build(
    problem: &Problem,
    from: usize,
    to: usize,
    initial: &[u8],
    fixed: Option<&[Retraining]>,
) -> Result<Schedule, PlanError> {
    let n = problem.tenants.len();
    let steps = to - from;
    let gpcs = problem.model.compute_slices();
    let mut vars = ProblemVariables::new();
    let mut constraints = Vec::new();
    let mut objective = Expression::from(0.0);
    // Retraining: GPCs in use per (tenant, step) and completion per (tenant, step), as
    // expressions; y's per tenant for reading the answer back.
    let mut ret_size: Vec<Vec<Vec<Expression>>> =
        vec![vec![vec![Expression::from(0.0); 5]; steps]; n];
    let mut completion: Vec<Vec<Expression>> = vec![vec![Expression::from(0.0); steps]; n];
    let mut starts: Vec<Vec<(Variable, usize, u8, usize)>> = vec![Vec::new(); n];
    for m in 0..n {
        match fixed {
            Some(f) => {
                let r = f[m];
                for s in 0..steps {
                    if r.runs_at(from + s) {
                        ret_size[m][s][usize::from(r.gpcs.min(4))] += 1.0;
                    }
                    if r.done_by(from + s) {
                        completion[m][s] += 1.0;
                    }
                }
            }
            None => {
                let mut one = Expression::from(0.0);
                for k in 1..=4u8 {
                    let Some(d) = problem.retrain_steps(m, k) else {
                        continue;
                    };
                    for t in 0..steps {
                        if t + d > steps {
                            break;
                        }
                        let y = vars.add(variable().binary());
                        one += y;
                        starts[m].push((y, t, k, d));
                        for per_size in &mut ret_size[m][t..t + d] {
                            per_size[usize::from(k)] += y;
                        }
                        for c in completion[m].iter_mut().skip(t + d) {
                            *c += y;
                        }
                    }
                }
                if starts[m].is_empty() {
                    return Err(PlanError::Infeasible(format!(
                        "{}'s retraining fits in no instance within the window",
                        problem.tenants[m].name
                    )));
                }
                constraints.push(constraint!(one == 1));
            }
        }
    }
    // Inference sizes.
    let mut x: Vec<Vec<Vec<(u8, Variable)>>> = vec![Vec::with_capacity(steps); n];
    for m in 0..n {
        let t = &problem.tenants[m];
        let d_acc = t.acc_post - t.acc_pre;
        let psi_steps = t.psi_s / problem.step_s;
        for s in 0..steps {
            let levels: Vec<(u8, Variable)> = (t.min_gpcs.max(1)..=gpcs)
                .map(|k| (k, vars.add(variable().binary())))
                .collect();
            let one: Expression = levels.iter().map(|(_, v)| Expression::from(*v)).sum();
            constraints.push(constraint!(one == 1));
            let arrivals = problem.arrivals(m, from + s);
            let mut served = Expression::from(0.0);
            for (j, (k, v)) in levels.iter().enumerate() {
                let g = arrivals.min(problem.capacity(m, *k));
                served += g * *v;
                // Entering size k at this step costs psi seconds of service at size k: where
                // that is nothing (`Ψ` = 0 carried over from a window whose every resize was
                // built ahead, or no arrivals), there is nothing to count, and an indicator
                // with no cost and no bound makes `microlp` call the program unbounded.
                let cost = psi_steps * t.acc_pre * g;
                if cost <= 0.0 {
                    continue;
                }
                let was: Expression = if s == 0 {
                    Expression::from(if initial[m] == *k { 1.0 } else { 0.0 })
                } else {
                    Expression::from(x[m][s - 1][j].1)
                };
                let inn = vars.add(variable().min(0).max(1));
                constraints.push(constraint!(inn >= *v - was));
                objective -= cost * inn;
            }
            let w = vars.add(variable().min(0));
            constraints.push(constraint!(w <= served.clone()));
            constraints.push(constraint!(w <= arrivals * completion[m][s].clone()));
            objective += t.acc_pre * served + d_acc * w;
            x[m].push(levels);
        }
    }
    // Capacity and realizability, per step.
    let cuts = unrealizable_cuts(problem);
    for s in 0..steps {
        let mut used = Expression::from(0.0);
        for m in 0..n {
            for (k, v) in &x[m][s] {
                used += f64::from(*k) * *v;
            }
            for (k, e) in ret_size[m][s].iter().enumerate().skip(1) {
                used += (k as f64) * e.clone();
            }
        }
        constraints.push(constraint!(used <= f64::from(gpcs)));
        for cut in &cuts {
            // All 2n indicators at once is forbidden.
            let mut all = Expression::from(0.0);
            let mut possible = true;
            for m in 0..n {
                match x[m][s].iter().find(|(k, _)| *k == cut[m]) {
                    Some((_, v)) => all += *v,
                    None => possible = false,
                }
                let r = usize::from(cut[n + m]);
                if r == 0 {
                    let mut none = Expression::from(1.0);
                    for e in ret_size[m][s].iter().skip(1) {
                        none -= e.clone();
                    }
                    all += none;
                } else {
                    all += ret_size[m][s][r].clone();
                }
            }
            if possible {
                constraints.push(constraint!(all <= (2 * n - 1) as f64));
            }
        }
    }
    let solution = vars
        .maximise(objective)
        .using(microlp)
        .with_all(constraints)
        .solve()
        .map_err(|e| match e {
            good_lp::ResolutionError::Infeasible => {
                PlanError::Infeasible("the integer program has no solution".into())
            }
            other => PlanError::Solver(other.to_string()),
        })?;
    let inference = x
        .iter()
        .map(|per_step| {
            per_step
                .iter()
                .map(|levels| {
                    levels
                        .iter()
                        .max_by(|a, b| solution.value(a.1).total_cmp(&solution.value(b.1)))
                        .map(|(k, _)| *k)
                        .expect("a size per step")
                })
                .collect()
        })
        .collect();
    let retraining = match fixed {
        Some(f) => f.to_vec(),
        None => starts
            .iter()
            .map(|opts| {
                let (_, t, k, d) = opts
                    .iter()
                    .max_by(|a, b| solution.value(a.0).total_cmp(&solution.value(b.0)))
                    .expect("checked non-empty");
                Retraining {
                    start: *t,
                    gpcs: *k,
                    steps: *d,
                }
            })
            .collect(),
    };
    Ok(Schedule {
        inference,
        retraining,
    })
}
