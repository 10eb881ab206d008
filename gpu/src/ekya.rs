//! Ekya's thief scheduler (thesis chapter 2, §2.4.2, Algorithm 1), on fractional GPU shares
//! (MPS-style, the `gpu` fraction resource) and rounded to MIG slices. It is both a policy of
//! its own and one of MIGRator's baselines.
//!
//! **Algorithm 1, rebuilt from the text.** Start from a fair allocation (every inference and
//! retraining job an equal share, in quanta of `delta`); each job in turn is the *thief* and
//! steals one quantum from each other job; a theft is kept only if the window's estimated
//! average accuracy improves; repeat until a whole round of thieves improves nothing. Ekya
//! reallocates at the window start and **whenever a retraining job completes**, never during
//! a retraining: a running retraining keeps its share, and a finished one's share goes back
//! to the pool. A retraining that cannot finish in the window does not count (its share is
//! wasted, so the thieves take it). Inference keeps at least one quantum. The
//! micro-profiler's estimates (retraining time, accuracy after retraining, capability) are
//! the [`Problem`]'s.
//!
//! **What it knows.** [`online`] is Ekya given only what Ekya knows, MIGRator's baseline:
//! at each decision it estimates each stream's rate from the arrivals observed so far (the
//! mean of the last [`LOOKBACK_S`] seconds, before the window and in it up to the decision;
//! nothing later) and holds it for the rest of the window, and it scores a split by its own
//! objective ([`ekya_estimate`]: the average over the streams of their accuracy over the rest
//! of the window, each second's accuracy scaled by the fraction of the stream its inference
//! keeps up with, every stream weighted equally), not MIGRator's goodput. Its estimate does
//! not count the cost of changing shares (the thesis' thief does not model one), and neither
//! does its evaluation as MIGRator's baseline: on MPS a share changes at a retraining's start
//! and end without stopping the tenant ([`evaluate_shares`], as P0 §5.1 describes its Ekya).
//! [`compare`](super::compare) also prints the same plan with every change stopping the tenant
//! for a MIG reconfiguration ([`evaluate_shares_paying`](super::shares::evaluate_shares_paying)),
//! the baseline as it was measured before, which is not Ekya's paper.
//!
//! [`thief`] is the baseline as it was before Ekya was given only what it knows: it scores
//! every theft with [`evaluate_shares`] over the window's **exact future arrivals**, which is
//! MIGRator's own objective; it is kept as an upper bound of what the thief could do, not as
//! Ekya.

use super::migrator::problem::{Problem, Retraining, Schedule};
use super::migrator::realize::realizable;
use super::shares::{MPS_INTERFERENCE, SharePlan, capacity_at, evaluate_shares, retrain_steps_at};

/// Seconds of observed arrivals [`online`] averages into a stream's rate.
pub const LOOKBACK_S: usize = 30;

/// The thief over the window's exact future arrivals, scored by MIGRator's goodput: **not
/// what Ekya knows** (see the module doc); [`online`] is Ekya.
pub fn thief(problem: &Problem, delta: f64) -> SharePlan {
    thief_by(problem, delta, |plan, _| {
        evaluate_shares(problem, plan).goodput
    })
}

/// Ekya given only what Ekya knows (see the module doc): `past[m]` is tenant `m`'s per-second
/// arrivals observed before the window; within the window it reads `problem`'s arrivals
/// (each tenant's `forecast`, here the real trace) only for the seconds before each decision.
pub fn online(problem: &Problem, past: &[&[f64]], delta: f64) -> SharePlan {
    thief_by(problem, delta, |plan, from| {
        let seen = (from as f64 * problem.step_s).floor() as usize;
        let rates: Vec<f64> = (0..problem.tenants.len())
            .map(|m| observed_rate(past[m], &problem.tenants[m].forecast[..seen]))
            .collect();
        ekya_estimate(problem, plan, from, &rates)
    })
}

/// The mean rate of the last [`LOOKBACK_S`] seconds of `past` followed by `now` (requests per
/// second; 0 with nothing observed).
pub fn observed_rate(past: &[f64], now: &[f64]) -> f64 {
    let from_now = now.len().min(LOOKBACK_S);
    let from_past = (LOOKBACK_S - from_now).min(past.len());
    let seen = now[now.len() - from_now..]
        .iter()
        .chain(&past[past.len() - from_past..]);
    let count = from_now + from_past;
    if count == 0 {
        0.0
    } else {
        seen.sum::<f64>() / count as f64
    }
}

/// Ekya's objective for a split decided at step `from`, with each stream's rate estimated as
/// `rates[m]` requests per second: the mean over the streams of their mean accuracy over
/// steps `from..`, a step's accuracy being the model's (after retraining once it completes)
/// times the fraction of the stream the inference share keeps up with.
pub fn ekya_estimate(problem: &Problem, plan: &SharePlan, from: usize, rates: &[f64]) -> f64 {
    let steps = problem.steps();
    let n = problem.tenants.len();
    let mut total = 0.0;
    for (m, t) in problem.tenants.iter().enumerate() {
        let done_at = plan.retraining[m]
            .and_then(|(start, f)| retrain_steps_at(problem, m, f).map(|d| start + d));
        let rate = rates[m] * problem.step_s;
        let mut sum = 0.0;
        for s in from..steps {
            let cap = capacity_at(problem, m, plan.inference[m][s] * 7.0) * MPS_INTERFERENCE;
            let kept = if rate > 1e-9 {
                (cap / rate).min(1.0)
            } else {
                1.0
            };
            let acc = if done_at.is_some_and(|d| d <= s) {
                t.acc_post
            } else {
                t.acc_pre
            };
            sum += acc * kept;
        }
        total += sum / steps.saturating_sub(from).max(1) as f64;
    }
    total / n.max(1) as f64
}

/// The thief scheduler with `score(plan, from)` judging a split decided at step `from`.
fn thief_by(
    problem: &Problem,
    delta: f64,
    mut score_of: impl FnMut(&SharePlan, usize) -> f64,
) -> SharePlan {
    thief_configured(
        problem,
        delta,
        |_, _, _| None,
        |_, plan, from| score_of(plan, from),
    )
    .0
}

/// A retraining configuration as the thief sees it: its retraining time on `k` GPCs
/// (`retrain_s`, as [`Tenant`](super::migrator::problem::Tenant)'s) and the accuracy after it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Configured {
    /// Which configuration (an index the picker defines).
    pub index: usize,
    /// Retraining time on one instance of `k` GPCs, seconds.
    pub retrain_s: [f64; 8],
    /// Accuracy after retraining.
    pub acc_post: f64,
}

/// The thief scheduler (see the module doc) with a configuration picker: for every split it
/// tries, `pick(m, share, from)` chooses tenant `m`'s retraining configuration for a retraining
/// share `share` decided at step `from` (PickConfigs, thesis Algorithm 2; `None`: the tenant's
/// own), and `score(problem, plan, from)` judges the split on the problem with the chosen
/// configurations. A retraining keeps the configuration it was launched with. Returns the plan
/// and each tenant's configuration.
pub fn thief_configured(
    problem: &Problem,
    delta: f64,
    mut pick: impl FnMut(usize, f64, usize) -> Option<Configured>,
    mut score_of: impl FnMut(&Problem, &SharePlan, usize) -> f64,
) -> (SharePlan, Vec<Option<Configured>>) {
    let n = problem.tenants.len();
    let steps = problem.steps();
    let quanta = (1.0 / delta).round() as i64;
    let mut plan = SharePlan {
        inference: vec![vec![0.0; steps]; n],
        retraining: vec![None; n],
    };
    // Jobs 0..n are inference, n..2n retraining.
    let mut from = 0;
    let mut running: Vec<Option<(usize, i64, usize)>> = vec![None; n]; // (start, quanta, end)
    let mut done = vec![false; n];
    let mut chosen: Vec<Option<Configured>> = vec![None; n];
    let mut configured = |alloc: &[i64],
                          running: &[Option<(usize, i64, usize)>],
                          chosen: &[Option<Configured>],
                          from: usize| {
        let mut p = problem.clone();
        let mut now = chosen.to_vec();
        for m in 0..n {
            if running[m].is_none() && alloc[n + m] > 0 {
                now[m] = pick(m, alloc[n + m] as f64 / quanta as f64, from).or(chosen[m]);
            }
            if let Some(c) = now[m] {
                p.tenants[m].retrain_s = c.retrain_s;
                p.tenants[m].acc_post = c.acc_post;
            }
        }
        (p, now)
    };
    loop {
        let pinned: i64 = running.iter().flatten().map(|r| r.1).sum();
        let free_jobs: Vec<usize> = (0..2 * n)
            .filter(|&j| j < n || (!done[j - n] && running[j - n].is_none()))
            .collect();
        let pool = quanta - pinned;
        let mut alloc = vec![0i64; 2 * n];
        for (i, &j) in free_jobs.iter().enumerate() {
            alloc[j] = pool / free_jobs.len() as i64
                + i64::from((i as i64) < pool % free_jobs.len() as i64);
        }
        let mut score = |alloc: &[i64]| -> f64 {
            let (p_now, _) = configured(alloc, &running, &chosen, from);
            let mut p = plan.clone();
            apply(&p_now, &mut p, alloc, &running, from, quanta);
            score_of(&p_now, &p, from)
        };
        let mut best = score(&alloc);
        loop {
            let mut improved = false;
            for &thief in &free_jobs {
                for &victim in &free_jobs {
                    let floor = if victim < n { 1 } else { 0 };
                    if victim == thief || alloc[victim] <= floor {
                        continue;
                    }
                    let mut temp = alloc.clone();
                    temp[victim] -= 1;
                    temp[thief] += 1;
                    let s = score(&temp);
                    if s > best + 1e-9 {
                        best = s;
                        alloc = temp;
                        improved = true;
                    }
                }
            }
            if !improved {
                break;
            }
        }
        let (p_now, now) = configured(&alloc, &running, &chosen, from);
        apply(&p_now, &mut plan, &alloc, &running, from, quanta);
        // Retrainings launched now, with the configuration picked for their share.
        for m in 0..n {
            if running[m].is_none() && !done[m] && alloc[n + m] > 0 {
                let share = alloc[n + m] as f64 / quanta as f64;
                match retrain_steps_at(&p_now, m, share) {
                    Some(d) if from + d <= steps => {
                        running[m] = Some((from, alloc[n + m], from + d));
                        chosen[m] = now[m];
                    }
                    _ => {}
                }
            }
        }
        // Next decision point: the first completion.
        let Some((m, end)) = running
            .iter()
            .enumerate()
            .filter_map(|(m, r)| r.map(|r| (m, r.2)))
            .min_by_key(|r| r.1)
        else {
            break;
        };
        if end >= steps {
            break;
        }
        let (start, q, _) = running[m].take().expect("found above");
        plan.retraining[m] = Some((start, q as f64 / quanta as f64));
        done[m] = true;
        from = end;
    }
    for (m, r) in running.iter().enumerate() {
        if let Some((start, q, _)) = r {
            plan.retraining[m] = Some((*start, *q as f64 / quanta as f64));
        }
    }
    // A retraining that never launched keeps no configuration.
    for (c, r) in chosen.iter_mut().zip(&plan.retraining) {
        if r.is_none() {
            *c = None;
        }
    }
    (plan, chosen)
}

/// Writes `alloc` into `plan` from step `from` on: inference shares, and the retraining
/// shares of jobs starting now (finishing in the window) or already running.
fn apply(
    problem: &Problem,
    plan: &mut SharePlan,
    alloc: &[i64],
    running: &[Option<(usize, i64, usize)>],
    from: usize,
    quanta: i64,
) {
    let n = problem.tenants.len();
    for m in 0..n {
        for s in from..problem.steps() {
            plan.inference[m][s] = alloc[m] as f64 / quanta as f64;
        }
        plan.retraining[m] = match running[m] {
            Some((start, q, _)) => Some((start, q as f64 / quanta as f64)),
            None if alloc[n + m] > 0 => Some((from, alloc[n + m] as f64 / quanta as f64)),
            None => plan.retraining[m],
        };
    }
}

/// [`thief`] (the exact-future baseline) rounded to MIG slices ([`on_mig`]).
pub fn thief_on_mig(problem: &Problem, delta: f64) -> Schedule {
    on_mig(problem, &thief(problem, delta))
}

/// Ekya given only what it knows ([`online`]) rounded to MIG slices ([`on_mig`]).
pub fn online_on_mig(problem: &Problem, past: &[&[f64]], delta: f64) -> Schedule {
    on_mig(problem, &online(problem, past, delta))
}

/// A share plan rounded to MIG slices: each share becomes whole GPCs (retraining to one
/// instance of at most 4), shrinking the largest inference while no layout realizes the
/// sizes; the retraining keeps its rounded size and start.
// Steps index both the forecasts and each tenant's row of the plan.
#[allow(clippy::needless_range_loop)]
pub fn on_mig(problem: &Problem, shares: &SharePlan) -> Schedule {
    let n = problem.tenants.len();
    let steps = problem.steps();
    let mut retraining = Vec::with_capacity(n);
    for m in 0..n {
        let (start, share) = shares.retraining[m].unwrap_or((0, 1.0 / 7.0));
        let mut gpcs = ((share * 7.0).round() as u8).clamp(1, 4);
        while problem
            .retrain_steps(m, gpcs)
            .is_none_or(|d| start + d > steps)
            && gpcs < 4
        {
            gpcs += 1;
        }
        let d = problem.retrain_steps(m, gpcs).unwrap_or(steps);
        let start = start.min(steps.saturating_sub(d));
        retraining.push(Retraining {
            start,
            gpcs,
            steps: d,
        });
    }
    let mut inference = vec![vec![0u8; steps]; n];
    for s in 0..steps {
        let ret: Vec<u8> = retraining
            .iter()
            .map(|r| if r.runs_at(s) { r.gpcs } else { 0 })
            .collect();
        let mut k: Vec<u8> = (0..n)
            .map(|m| {
                ((shares.inference[m][s] * 7.0).round() as u8)
                    .max(problem.tenants[m].min_gpcs.max(1))
            })
            .collect();
        let mins: Vec<u8> = problem.tenants.iter().map(|t| t.min_gpcs).collect();
        while !(k.iter().sum::<u8>() + ret.iter().sum::<u8>() <= 7
            && realizable(problem.model, &k, &ret, &mins))
        {
            let (i, _) = k
                .iter()
                .enumerate()
                .max_by_key(|(_, v)| **v)
                .expect("tenants");
            if k[i] <= mins[i].max(1) {
                break;
            }
            k[i] -= 1;
        }
        for m in 0..n {
            inference[m][s] = k[m];
        }
    }
    Schedule {
        inference,
        retraining,
    }
}

#[cfg(test)]
mod tests {
    use super::super::migrator::workload::two_tenants;
    use super::*;

    #[test]
    fn thieves_improve_on_the_fair_split_and_respect_the_gpu() {
        let p = two_tenants(1, 200, 1.0);
        let plan = thief(&p, 0.1);
        let fair = SharePlan {
            inference: vec![vec![0.25; 200]; 2],
            retraining: vec![Some((0, 0.25)), Some((0, 0.25))],
        };
        let (ours, theirs) = (evaluate_shares(&p, &plan), evaluate_shares(&p, &fair));
        assert!(ours.goodput > theirs.goodput, "{ours:?} vs fair {theirs:?}");
        for s in 0..200 {
            let ret: f64 = (0..2)
                .filter_map(|m| {
                    let (start, f) = plan.retraining[m]?;
                    let d = retrain_steps_at(&p, m, f)?;
                    (s >= start && s < start + d).then_some(f)
                })
                .sum();
            let total: f64 = plan.inference.iter().map(|v| v[s]).sum::<f64>() + ret;
            assert!(total <= 1.0 + 1e-9, "step {s}: {total}");
            assert!(plan.inference.iter().all(|v| v[s] >= 0.1 - 1e-9));
        }
    }

    #[test]
    fn on_mig_the_sizes_are_realizable() {
        let p = two_tenants(2, 200, 1.0);
        let s = thief_on_mig(&p, 0.1);
        p.check(&s).unwrap();
    }
}
