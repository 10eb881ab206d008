//! Fractional GPU shares (MPS-style, the `gpu: 0.25` resource) and how a plan of shares does on
//! a MIGRator [`Problem`]: the evaluation Ekya's and Astraea's allocations are compared with.
//!
//! A share `f` of the GPU serves like `7 * f` GPCs of a MIG instance (the capability table
//! interpolated), times an interference factor: MPS partitions SMs but not memory bandwidth
//! or caches, which is why P0 finds Astraea's SLO attainment 6% below MIGRator's. The factor is
//! **assumed**: 0.9 (10% slower when co-running), P0 gives no number. In [`evaluate_shares`]
//! changing shares costs nothing (Astraea's and Laius's process pools switch quotas in place);
//! [`evaluate_shares_paying`] charges each change MIGRator's resize cost (no paper's Ekya:
//! its MPS shares change without stopping the tenant; kept to show what that charge did to the
//! comparison). A retraining on a
//! share `f` takes the time of a `7 * f`-GPC instance, over the interference factor.

use super::migrator::problem::{Problem, concave_envelope};

/// MPS interference factor (assumed, see the module doc).
pub const MPS_INTERFERENCE: f64 = 0.9;

/// A window's plan in fractional shares.
#[derive(Debug, Clone, PartialEq)]
pub struct SharePlan {
    /// `inference[m][s]`: tenant `m`'s inference share during step `s`, in `[0, 1]`.
    pub inference: Vec<Vec<f64>>,
    /// Each tenant's retraining: start step and share; `None` if it is not retrained.
    pub retraining: Vec<Option<(usize, f64)>>,
}

/// Goodput, requests served on time and requests arrived, of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Outcome {
    /// Requests served on time, weighted by accuracy (P0's goodput).
    pub goodput: f64,
    /// Requests served on time.
    pub on_time: f64,
    /// Requests that arrived.
    pub arrived: f64,
    /// Requests served on time times accuracy, over those served: mean accuracy.
    pub accuracy: f64,
}

impl Outcome {
    /// Adds another outcome (another window).
    pub fn add(&mut self, other: Outcome) {
        let served = self.on_time + other.on_time;
        self.accuracy = if served > 0.0 {
            (self.accuracy * self.on_time + other.accuracy * other.on_time) / served
        } else {
            0.0
        };
        self.goodput += other.goodput;
        self.on_time += other.on_time;
        self.arrived += other.arrived;
    }
}

/// Capability of `gpcs` (possibly fractional) GPCs of tenant `m`, requests per step.
pub fn capacity_at(problem: &Problem, m: usize, gpcs: f64) -> f64 {
    let env = concave_envelope(&problem.tenants[m].capability);
    let g = gpcs.clamp(0.0, 7.0);
    let lo = g.floor() as usize;
    let hi = (lo + 1).min(7);
    let frac = g - lo as f64;
    (env[lo] + (env[hi] - env[lo]) * frac) * problem.step_s
}

/// Steps tenant `m`'s retraining takes on a share `f` (with MPS interference), if finite.
pub fn retrain_steps_at(problem: &Problem, m: usize, share: f64) -> Option<usize> {
    let gpcs = share * 7.0;
    if gpcs <= 0.0 {
        return None;
    }
    // Interpolate 1/time between the table's integer sizes.
    let rt = &problem.tenants[m].retrain_s;
    let lo = gpcs.floor().max(1.0) as usize;
    let hi = (lo + 1).min(7);
    let rate = |k: usize| if rt[k].is_finite() { 1.0 / rt[k] } else { 0.0 };
    let r = if gpcs < 1.0 {
        rate(1) * gpcs
    } else {
        rate(lo) + (rate(hi) - rate(lo)) * (gpcs - lo as f64)
    } * MPS_INTERFERENCE;
    (r > 0.0).then(|| ((1.0 / r) / problem.step_s).ceil() as usize)
}

/// What a fractional plan earns on `problem` (no reconfiguration cost, MPS interference).
pub fn evaluate_shares(problem: &Problem, plan: &SharePlan) -> Outcome {
    evaluate_shares_with(problem, plan, false)
}

/// What a fractional plan earns on `problem` when its share changes pay what MIGRator's
/// resizes pay in [`evaluate_mig`]: a tenant whose inference share changes serves nothing for
/// its `psi_s` (the window starting from the shares of `problem.initial`'s GPCs, as MIGRator's
/// plans do). Not how Ekya's paper changes shares (MPS, without stopping the tenant:
/// [`evaluate_shares`]); `compare` prints it beside Ekya to show what the charge does.
pub fn evaluate_shares_paying(problem: &Problem, plan: &SharePlan) -> Outcome {
    evaluate_shares_with(problem, plan, true)
}

fn evaluate_shares_with(problem: &Problem, plan: &SharePlan, pay: bool) -> Outcome {
    let mut out = Outcome::default();
    let mut weighted = 0.0;
    for (m, t) in problem.tenants.iter().enumerate() {
        let done_at = plan.retraining[m]
            .and_then(|(start, f)| retrain_steps_at(problem, m, f).map(|d| start + d));
        let mut prev = f64::from(problem.initial[m]) / 7.0;
        let mut down_s = 0.0;
        for s in 0..problem.steps() {
            let share = plan.inference[m][s];
            if pay && (share - prev).abs() > 1e-9 {
                down_s = t.psi_s;
            }
            prev = share;
            let up = ((problem.step_s - down_s) / problem.step_s).clamp(0.0, 1.0);
            down_s = (down_s - problem.step_s).max(0.0);
            let arrived = problem.arrivals(m, s);
            let cap = capacity_at(problem, m, share * 7.0) * MPS_INTERFERENCE * up;
            let served = arrived.min(cap);
            let acc = if done_at.is_some_and(|d| d <= s) {
                t.acc_post
            } else {
                t.acc_pre
            };
            out.arrived += arrived;
            out.on_time += served;
            out.goodput += served * acc;
            weighted += served * acc;
        }
    }
    out.accuracy = if out.on_time > 0.0 {
        weighted / out.on_time
    } else {
        0.0
    };
    out
}

/// What an integer-GPC schedule (MIG) earns on `problem`, counted like [`evaluate_shares`]
/// but with MIG's isolation (no interference) and its reconfiguration cost: a tenant whose
/// inference changes size serves nothing for `psi_s`.
pub fn evaluate_mig(problem: &Problem, schedule: &super::migrator::problem::Schedule) -> Outcome {
    let mut out = Outcome::default();
    let mut weighted = 0.0;
    for (m, t) in problem.tenants.iter().enumerate() {
        let mut prev = problem.initial[m];
        let mut down_s = 0.0;
        for s in 0..problem.steps() {
            let k = schedule.inference[m][s];
            if k != prev {
                down_s = t.psi_s;
            }
            prev = k;
            let up = ((problem.step_s - down_s) / problem.step_s).clamp(0.0, 1.0);
            down_s = (down_s - problem.step_s).max(0.0);
            let arrived = problem.arrivals(m, s);
            let served = arrived.min(problem.capacity(m, k) * up);
            let acc = if schedule.retraining[m].done_by(s) {
                t.acc_post
            } else {
                t.acc_pre
            };
            out.arrived += arrived;
            out.on_time += served;
            out.goodput += served * acc;
            weighted += served * acc;
        }
    }
    out.accuracy = if out.on_time > 0.0 {
        weighted / out.on_time
    } else {
        0.0
    };
    out
}
