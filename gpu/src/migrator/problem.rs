//! What MIGRator plans for: the tenants of one GPU over one retraining window
//! ([`Problem`], [`Tenant`]), the answer ([`Schedule`]: each tenant's inference GPCs at every
//! step and when and on how many GPCs its retraining runs), and the objective both the
//! integer program and the tests evaluate ([`Problem::objective`]).
//!
//! The objective is MIGRator's goodput (P0 eqs. 6 to 10): per step and tenant, the requests
//! served, `min(arrivals, capability)`, times the model's accuracy (before retraining
//! completes, `acc_pre`; after, `acc_post`), less the reconfiguration penalty: a step in
//! which a tenant's inference changes size loses `psi_s` seconds of its service at the new
//! size (eq. 10's `R * Psi * capability`).

use escher_proto::mig::GpuModel;

/// One continual-learning tenant: an inference task that serves all window long and a
/// retraining task that must run once, uninterrupted, within the window.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    /// Its name, for reports.
    pub name: String,
    /// The fewest GPCs its inference can be deployed on (P0's `L_(m,i)`, eq. 5).
    pub min_gpcs: u8,
    /// Requests per second its inference serves on `k` GPCs, `k` = 0 to 7 (`capability[0]` is
    /// 0); the planner uses its concave envelope.
    pub capability: [f64; 8],
    /// Predicted requests arriving in each second of the window (P0's `Recv`).
    pub forecast: Vec<f64>,
    /// Retraining time on one instance of `k` GPCs, seconds, `k` = 0 to 7 (`INFINITY` where
    /// it cannot run, always for `k` = 0).
    pub retrain_s: [f64; 8],
    /// Accuracy before retraining completes.
    pub acc_pre: f64,
    /// Accuracy after.
    pub acc_post: f64,
    /// Service lost when its inference is reconfigured, seconds (P0's `Psi`).
    pub psi_s: f64,
}

/// One window's planning problem.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// The GPU.
    pub model: GpuModel,
    /// The tenants.
    pub tenants: Vec<Tenant>,
    /// Window length, seconds (200 in P0).
    pub window_s: u32,
    /// Decision granularity, seconds (1 in P0; 0.5 to 10 in its Fig. 10).
    pub step_s: f64,
    /// Each tenant's inference GPCs when the window starts.
    pub initial: Vec<u8>,
}

/// When and where one tenant's retraining runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retraining {
    /// The step it starts at.
    pub start: usize,
    /// The GPCs of its one instance.
    pub gpcs: u8,
    /// How many steps it runs.
    pub steps: usize,
}

impl Retraining {
    /// Whether it runs during `step`.
    pub fn runs_at(&self, step: usize) -> bool {
        step >= self.start && step < self.start + self.steps
    }

    /// Whether it has completed before `step` starts.
    pub fn done_by(&self, step: usize) -> bool {
        step >= self.start + self.steps
    }
}

/// A window's plan: per step, the inference GPCs of each tenant, and each tenant's retraining.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// `inference[m][s]`: tenant `m`'s inference GPCs during step `s`.
    pub inference: Vec<Vec<u8>>,
    /// Each tenant's retraining.
    pub retraining: Vec<Retraining>,
}

impl Schedule {
    /// GPCs in use during `step`: inference and running retraining.
    pub fn used(&self, step: usize) -> u8 {
        let inf: u8 = self.inference.iter().map(|v| v[step]).sum();
        let ret: u8 = self
            .retraining
            .iter()
            .filter(|r| r.runs_at(step))
            .map(|r| r.gpcs)
            .sum();
        inf + ret
    }
}

impl Problem {
    /// Steps in the window.
    pub fn steps(&self) -> usize {
        (f64::from(self.window_s) / self.step_s).round().max(1.0) as usize
    }

    /// Requests tenant `m` receives in step `s` (its per-second forecast, integrated).
    pub fn arrivals(&self, m: usize, s: usize) -> f64 {
        let from = s as f64 * self.step_s;
        let to = from + self.step_s;
        let f = &self.tenants[m].forecast;
        let mut total = 0.0;
        let mut t = from;
        while t < to - 1e-9 {
            let sec = t.floor();
            let end = (sec + 1.0).min(to);
            total += f.get(sec as usize).copied().unwrap_or(0.0) * (end - t);
            t = end;
        }
        total
    }

    /// Requests tenant `m` can serve in one step on `k` GPCs (the concave envelope of its
    /// capability table).
    pub fn capacity(&self, m: usize, k: u8) -> f64 {
        concave_envelope(&self.tenants[m].capability)[usize::from(k.min(7))] * self.step_s
    }

    /// Steps tenant `m`'s retraining takes on `k` GPCs, if it can run on them at all.
    pub fn retrain_steps(&self, m: usize, k: u8) -> Option<usize> {
        let s = self.tenants[m].retrain_s[usize::from(k.min(7))];
        (s.is_finite() && s > 0.0).then(|| (s / self.step_s - 1e-9).ceil() as usize)
    }

    /// The goodput the plan earns (see the module doc).
    pub fn objective(&self, schedule: &Schedule) -> f64 {
        let mut total = 0.0;
        for (m, t) in self.tenants.iter().enumerate() {
            let psi_steps = t.psi_s / self.step_s;
            let mut prev = self.initial[m];
            for s in 0..self.steps() {
                let k = schedule.inference[m][s];
                let served = self.arrivals(m, s).min(self.capacity(m, k));
                let acc = if schedule.retraining[m].done_by(s) {
                    t.acc_post
                } else {
                    t.acc_pre
                };
                total += served * acc;
                if k != prev {
                    total -= psi_steps * t.acc_pre * served;
                }
                prev = k;
            }
        }
        total
    }

    /// Checks a schedule against every constraint: GPCs per step, inference minimum, one
    /// uninterrupted retraining per tenant that fits in the window and on its GPCs.
    pub fn check(&self, schedule: &Schedule) -> Result<(), String> {
        let steps = self.steps();
        for (m, t) in self.tenants.iter().enumerate() {
            let inf = &schedule.inference[m];
            if inf.len() != steps {
                return Err(format!(
                    "{}: {} steps of inference, not {steps}",
                    t.name,
                    inf.len()
                ));
            }
            if let Some(s) = inf.iter().position(|k| *k < t.min_gpcs) {
                return Err(format!(
                    "{}: {} GPCs at step {s}, below its minimum",
                    t.name, inf[s]
                ));
            }
            let r = schedule.retraining[m];
            if self.retrain_steps(m, r.gpcs) != Some(r.steps) || r.start + r.steps > steps {
                return Err(format!("{}: retraining {r:?} does not fit", t.name));
            }
        }
        for s in 0..steps {
            let used = schedule.used(s);
            if used > self.model.compute_slices() {
                return Err(format!("step {s}: {used} GPCs in use"));
            }
        }
        Ok(())
    }
}

/// The least concave majorant of a table starting at 0: every point lies on or under it.
pub fn concave_envelope(table: &[f64; 8]) -> [f64; 8] {
    let mut out = [0.0; 8];
    // Upper hull over the points (k, table[k]).
    let mut hull: Vec<usize> = Vec::new();
    for k in 0..8 {
        while hull.len() >= 2 {
            let (a, b) = (hull[hull.len() - 2], hull[hull.len() - 1]);
            let cross =
                (b - a) as f64 * (table[k] - table[a]) - (k - a) as f64 * (table[b] - table[a]);
            if cross >= 0.0 {
                hull.pop();
            } else {
                break;
            }
        }
        hull.push(k);
    }
    for w in hull.windows(2) {
        let (a, b) = (w[0], w[1]);
        for (k, o) in out.iter_mut().enumerate().take(b + 1).skip(a) {
            *o = table[a] + (table[b] - table[a]) * (k - a) as f64 / (b - a) as f64;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_of_a_concave_table_is_itself_and_lifts_dips() {
        let lin = [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0];
        assert_eq!(concave_envelope(&lin), lin);
        let dip = [0.0, 10.0, 12.0, 30.0, 40.0, 45.0, 50.0, 55.0];
        let env = concave_envelope(&dip);
        assert_eq!(env[2], 20.0);
        assert!(env.iter().zip(dip.iter()).all(|(e, d)| e >= d));
    }
}
