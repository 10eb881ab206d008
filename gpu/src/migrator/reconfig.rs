//! What a reconfiguration costs a tenant, per model and per phase (P0 Fig. 5: instance
//! destruction, instance initialization, library load, model load), and how
//! pre-initialization is credited: as P0 credits it, through `Ψ`, "the average
//! reconfiguration overhead of task (m, i) in seconds during the last retraining window"
//! (Table 1), which pre-initialization lowers (§4.2: "reduces the reconfiguration overheads
//! (Ψ in Equation 10)"; §5: an 83% reduction).
//!
//! **Costs (assumed).** P0 plots the four phases for ConvNeXt, ResNet50 and MobileNet on a
//! 0–7000 ms axis and says only that the total "can take more than 6,000 milliseconds" (§4.1,
//! Fig. 5); the bars' values are not in its text. So the split is ours, and it is one split,
//! the one the worker's simulated GPUs take: `escher_proto::mig::LatencyModel`'s defaults
//! (destruction 0.5 s, initialization 1.5 s, library load 1.5 s, model load 2.5 s), with only
//! the model load varied by model size (ConvNeXt +0.4 s, MobileNet −0.4 s; ours, so that the
//! totals span Fig. 5's "more than 6,000 ms": 5.6 s MobileNet, 6.0 s ResNet50 and Inception,
//! 6.4 s ConvNeXt). [`phases`] is where the planner reads it.
//!
//! **Crediting.** Along a timed plan ([`Plan`]), a step at which a tenant's inference
//! changes size costs it, at the new size:
//! - nothing, if every instance it moves onto was built ahead by pre-initialization (present
//!   in the previous step's layout): its initialization and loads overlapped with serving, and
//!   the old instance's destruction is off the path;
//! - otherwise until its last new instance is ready: as the worker makes them ([`ready_s`]),
//!   one reconfiguration at a time and every instance of it one after another, so a new
//!   instance waits for the others the step creates with it (its initialization, library and
//!   model load, theirs, and the destruction of the instances they replace); for that long, the
//!   tenant serves on what it keeps and on its old replicas that are not in the way (the
//!   executor keeps a tenant's old replica serving until its new ones serve, unless the old
//!   instance overlaps one the step creates or the step's retraining runs on it, and unless
//!   the plan lists the resize as exposed, [`Plan::exposed`]). So a resize costs its tenant
//!   only the capacity its new size adds over what serves on: a shrink whose old replica
//!   serves on costs nothing, a growth from 2 to 4 GPCs half of its new capacity.
//!
//! [`evaluate_credited`] counts goodput so (as [`evaluate_mig`](crate::shares::evaluate_mig)
//! does with a flat `psi_s`), and reports each tenant's mean overhead per resize, the `Ψ` its
//! next window's program plans with ([`Charged::psi_next`]).

use escher_proto::mig::Placement;

use super::plan::{Plan, PlanStep};
use super::problem::{Problem, Schedule};
use super::realize::Assignment;
use crate::shares::Outcome;

/// One reconfiguration's four phases, seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Phases {
    /// Instance destruction.
    pub destroy_s: f64,
    /// Instance initialization.
    pub init_s: f64,
    /// Library load.
    pub library_s: f64,
    /// Model load.
    pub model_s: f64,
}

impl Phases {
    /// All four.
    pub fn total(&self) -> f64 {
        self.destroy_s + self.init_s + self.library_s + self.model_s
    }

    /// What a new instance costs its tenant on the path: initialization and loads, and the
    /// destruction of what it replaces when it overlaps it.
    pub fn on_path(&self, overlaps: bool) -> f64 {
        self.init_s + self.library_s + self.model_s + if overlaps { self.destroy_s } else { 0.0 }
    }
}

/// The phases of a reconfiguration creating a `gpcs`-GPC instance of `model`: the worker's
/// assumed split (`LatencyModel`'s defaults), the model load varied by model (see the module
/// doc; a model we have no figure for costs ResNet50's). The split is the same for every
/// profile, as on the worker, so `gpcs` does not change it.
pub fn phases(model: &str, gpcs: u8) -> Phases {
    let _ = gpcs;
    let latency = escher_proto::mig::LatencyModel::default();
    let by_model = match model.to_ascii_lowercase().as_str() {
        "convnext" => 0.4,
        "mobilenet" => -0.4,
        _ => 0.0,
    };
    Phases {
        destroy_s: latency.destroy.as_secs_f64(),
        init_s: latency.create.as_secs_f64(),
        library_s: latency.library_load.as_secs_f64(),
        model_s: latency.model_load.as_secs_f64() + by_model,
    }
}

/// When each instance that step `now` creates (over the layout of `before`, the step before
/// it) is ready to serve, seconds after the step starts, with `names` the tenants' models.
///
/// This is how the executor ([`Migrator`](super::Migrator)) and the worker carry a step out,
/// so that the plan tells what the cluster will take. The worker makes one reconfiguration
/// at a time, every phase of every instance one after another (`escher_proto::mig::
/// LatencyModel::cost`), and an instance serves only once its whole reconfiguration is done.
/// The executor sends what it can at once: the new instances that overlap no instance still
/// held (the idle ones it removes are destroyed in the same reconfiguration). The rest wait
/// for the replicas in their way to drain and for that first reconfiguration to end, then go
/// in a second one with the destruction of those replicas' instances. So an instance created
/// beside others is ready only after all of them: a step that replaces two tenants' replicas
/// in each other's way takes two destructions and two creations, twice one replacement.
///
/// Each phase is [`phases`]' for the model the instance is made for (its inference tenant,
/// its retraining, or the tenant it is built ahead for; ResNet50's for an instance made for
/// none). Busy instances not in the way of a new one are destroyed later, after their
/// tenant's new replicas serve, and delay nothing of this step.
pub fn ready_s(before: &Assignment, now: &PlanStep, names: &[&str]) -> Vec<(Placement, f64)> {
    let (removed, created) = escher_proto::mig::diff(&before.layout, &now.assignment.layout);
    let held: Vec<Placement> = removed
        .iter()
        .filter(|p| !before.is_idle(p))
        .copied()
        .collect();
    let model_of = |p: &Placement| {
        let a = &now.assignment;
        a.inference_of(p)
            .or_else(|| a.retraining_of(p))
            .or_else(|| now.warming.iter().find(|w| w.0 == *p).and_then(|w| w.1))
            .map_or("", |m| names[m])
    };
    let make = |p: &Placement| {
        let f = phases(model_of(p), p.profile.compute);
        f.init_s + f.library_s + f.model_s
    };
    // Destruction does not depend on the model.
    let destroy = |_: &Placement| phases("", 1).destroy_s;
    let (second, first): (Vec<Placement>, Vec<Placement>) = created
        .iter()
        .partition(|p| held.iter().any(|q| q.overlap(p).is_some()));
    let first_s: f64 = removed
        .iter()
        .filter(|p| before.is_idle(p))
        .map(destroy)
        .chain(first.iter().map(make))
        .sum();
    let second_s: f64 = first_s
        + held
            .iter()
            .filter(|q| second.iter().any(|p| q.overlap(p).is_some()))
            .map(destroy)
            .chain(second.iter().map(make))
            .sum::<f64>();
    first
        .into_iter()
        .map(|p| (p, first_s))
        .chain(second.into_iter().map(|p| (p, second_s)))
        .collect()
}

/// What [`evaluate_credited`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct Charged {
    /// Goodput, SLO attainment and accuracy, counted as `evaluate_mig` counts them.
    pub outcome: Outcome,
    /// Steps at which a tenant's inference changed size.
    pub resizes: usize,
    /// Of those, the ones whose new instances were all built ahead.
    pub preinitialized: usize,
    /// Service lost to reconfiguration, seconds, summed over the tenants.
    pub lost_s: f64,
    /// The same resizes with no pre-initialization, seconds (both counted as the share of
    /// the new size's capacity missing, times how long).
    pub lost_without_s: f64,
    /// Each tenant's mean overhead per resize in this window (its `Ψ` for the next window;
    /// the window's own `psi_s` if it was never resized).
    pub psi_next: Vec<f64>,
}

fn overlaps_any(p: &Placement, old: &[Placement]) -> bool {
    old.iter().any(|q| q.overlap(p).is_some())
}

/// GPCs of tenant `m` that serve on through the resize at step `s > 0` of `plan` while its
/// new instances come up: the replicas it keeps, and its old ones not in the way (see the
/// module doc); none when the plan lists the resize as exposed.
fn serving_on(plan: &Plan, s: usize, m: usize) -> u8 {
    if plan.exposed.iter().any(|e| e.step == s && e.tenant == m) {
        return 0;
    }
    let before = &plan.steps[s - 1].assignment;
    let now = &plan.steps[s].assignment;
    let created = escher_proto::mig::diff(&before.layout, &now.layout).1;
    before.inference[m]
        .iter()
        .filter(|p| {
            now.inference[m].contains(p)
                || !(now.retraining_of(p).is_some() || overlaps_any(p, &created))
        })
        .map(|p| p.profile.compute)
        .sum()
}

/// `schedule` as carried out by `plan` on `problem`, each resize charged as the module doc
/// says. Step 0 compares with `problem.initial` (the window starts warm in the plan's first
/// layout, so a size change there is charged in full).
pub fn evaluate_credited(problem: &Problem, schedule: &Schedule, plan: &Plan) -> Charged {
    let mut out = Outcome::default();
    let mut weighted = 0.0;
    let mut resizes = 0;
    let mut pre = 0;
    let mut lost = 0.0;
    let mut lost_without = 0.0;
    let mut psi_next = Vec::new();
    let names: Vec<&str> = problem.tenants.iter().map(|t| t.name.as_str()).collect();
    for (m, t) in problem.tenants.iter().enumerate() {
        let mut prev = problem.initial[m];
        let mut down_s: f64 = 0.0;
        // GPCs serving on while the tenant is resized.
        let mut down_gpcs = 0u8;
        let mut charged = Vec::new();
        for s in 0..problem.steps() {
            let k = schedule.inference[m][s];
            if k != prev {
                resizes += 1;
                let now = &plan.steps[s].assignment;
                let new: Vec<Placement> = if s == 0 {
                    now.inference[m].clone()
                } else {
                    let before = &plan.steps[s - 1].assignment;
                    now.inference[m]
                        .iter()
                        .filter(|p| !before.inference[m].contains(p))
                        .copied()
                        .collect()
                };
                let old: Vec<Placement> = if s == 0 {
                    Vec::new()
                } else {
                    plan.steps[s - 1].assignment.inference[m].clone()
                };
                // An instance the step creates is ready when its reconfiguration is
                // ([`ready_s`]); at step 0 (no layout before it in the plan) and for an
                // instance that exists already, its own phases count, as before.
                let ready = if s == 0 {
                    Vec::new()
                } else {
                    ready_s(&plan.steps[s - 1].assignment, &plan.steps[s], &names)
                };
                let full = new
                    .iter()
                    .map(|p| match ready.iter().find(|r| r.0 == *p) {
                        Some(r) => r.1,
                        None => phases(&t.name, p.profile.compute).on_path(overlaps_any(p, &old)),
                    })
                    .fold(0.0, f64::max)
                    .max(if new.is_empty() {
                        // Shrinking by dropping a replica: its neighbours keep serving.
                        0.0
                    } else {
                        f64::MIN
                    });
                let built_ahead = s > 0
                    && !new.is_empty()
                    && new
                        .iter()
                        .all(|p| plan.steps[s - 1].assignment.layout.contains(p));
                let on = if s == 0 { 0 } else { serving_on(plan, s, m) };
                // The share of the new capacity missing while the new instances come up.
                let missing = |on: u8| {
                    let new_cap = problem.capacity(m, k);
                    if new_cap > 0.0 {
                        (1.0 - problem.capacity(m, on) / new_cap).clamp(0.0, 1.0)
                    } else {
                        0.0
                    }
                };
                let cost = if built_ahead {
                    pre += 1;
                    0.0
                } else {
                    full * missing(on)
                };
                lost += cost;
                lost_without += full * missing(on);
                charged.push(cost);
                if !built_ahead && full > 0.0 {
                    down_s = full;
                    down_gpcs = on;
                }
            }
            prev = k;
            let up = ((problem.step_s - down_s) / problem.step_s).clamp(0.0, 1.0);
            down_s = (down_s - problem.step_s).max(0.0);
            let arrived = problem.arrivals(m, s);
            // While it is resized, what serves on, counted up to its new size.
            let capacity =
                problem.capacity(m, k) * up + problem.capacity(m, down_gpcs.min(k)) * (1.0 - up);
            let served = arrived.min(capacity);
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
        psi_next.push(if charged.is_empty() {
            t.psi_s
        } else {
            charged.iter().sum::<f64>() / charged.len() as f64
        });
    }
    out.accuracy = if out.on_time > 0.0 {
        weighted / out.on_time
    } else {
        0.0
    };
    Charged {
        outcome: out,
        resizes,
        preinitialized: pre,
        lost_s: lost,
        lost_without_s: lost_without,
        psi_next,
    }
}

/// The pre-initialization lead in steps: the longest creation (initialization and loads) of
/// any tenant's model on the largest instance, over the step, plus one.
pub fn lead_steps(problem: &Problem) -> usize {
    let longest = problem
        .tenants
        .iter()
        .map(|t| phases(&t.name, 7).on_path(false))
        .fold(0.0, f64::max);
    (longest / problem.step_s).ceil() as usize + 1
}

#[cfg(test)]
mod tests {
    use escher_proto::mig::{GpuModel, Layout};

    use super::super::plan::{PlanStep, build_plan};
    use super::super::problem::{Retraining, Tenant};
    use super::super::realize::Assignment;
    use super::*;

    #[test]
    fn the_phases_total_more_than_six_seconds_as_fig5_says() {
        // The largest model's passes 6 s; every one is on Fig. 5's 0-7000 ms axis.
        assert!(phases("convnext", 4).total() > 6.0);
        for model in ["convnext", "resnet50", "mobilenet"] {
            let p = phases(model, 4);
            assert!(p.total() > 5.0 && p.total() < 7.0, "{model}: {}", p.total());
        }
        // ConvNeXt's model load is the longest, MobileNet's the shortest.
        assert!(phases("convnext", 1).total() > phases("mobilenet", 1).total());
        // ResNet50's are the worker's simulated phases, one split for the planner and the
        // worker.
        let worker = escher_proto::mig::LatencyModel::default();
        let resnet = phases("resnet50", 4);
        assert_eq!(resnet.destroy_s, worker.destroy.as_secs_f64());
        assert_eq!(resnet.init_s, worker.create.as_secs_f64());
        assert_eq!(resnet.library_s, worker.library_load.as_secs_f64());
        assert_eq!(resnet.model_s, worker.model_load.as_secs_f64());
    }

    fn tenant(name: &str) -> Tenant {
        Tenant {
            name: name.into(),
            min_gpcs: 1,
            capability: [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0],
            forecast: vec![100.0; 20],
            retrain_s: [f64::INFINITY, 50.0, 30.0, 20.0, 15.0, 12.0, 10.0, 9.0],
            acc_pre: 0.5,
            acc_post: 0.8,
            psi_s: 6.0,
        }
    }

    #[test]
    fn a_resize_built_ahead_costs_nothing_and_one_that_is_not_costs_its_phases() {
        // Two tenants, 20 one-second steps. Tenant 0 grows from 2 to 4 GPCs at step 10 into
        // slices that are idle before (tenant 1 shrinks at step 5 from 3 to 1), so with a lead
        // its 4g is built ahead; without one it pays ResNet50's creation on the path:
        // 1.5 + 1.5 + 2.5 = 5.5 s, and the 2g it leaves overlaps the 4g at 0, so the
        // destruction too: 6.0 s.
        let problem = Problem {
            model: GpuModel::A100_40GB,
            tenants: vec![tenant("resnet50"), tenant("resnet50")],
            window_s: 20,
            step_s: 1.0,
            initial: vec![2, 3],
        };
        let mut inference = vec![vec![2u8; 20], vec![3u8; 20]];
        inference[0][10..].fill(4);
        inference[1][5..].fill(1);
        // Each retraining runs in the last step only, on one GPC, out of the way.
        let schedule = Schedule {
            inference,
            retraining: vec![
                Retraining {
                    start: 19,
                    gpcs: 1,
                    steps: 1,
                };
                2
            ],
        };
        let start = Layout::new(GpuModel::A100_40GB);
        let without = build_plan(&problem, &schedule, &start, 0).unwrap();
        let with = build_plan(&problem, &schedule, &start, 7).unwrap();
        let a = evaluate_credited(&problem, &schedule, &without);
        let b = evaluate_credited(&problem, &schedule, &with);
        assert_eq!(a.resizes, 2);
        assert_eq!(a.preinitialized, 0);
        assert!(b.preinitialized >= 1, "{b:?}");
        assert!(b.lost_s < a.lost_s, "{} vs {}", b.lost_s, a.lost_s);
        assert!(b.outcome.goodput > a.outcome.goodput);
        // What is lost without pre-initialization is the same either way.
        assert!((a.lost_without_s - b.lost_without_s).abs() < 1e-9);
        assert!((a.lost_s - a.lost_without_s).abs() < 1e-9);
        // Ψ for the next window: the mean per resize, counted as the share of the new size's
        // capacity missing. Tenant 0 moves onto a 3g and a 1g while its old 2g, out of their
        // way, serves on: half of its 4 GPCs' capacity is missing for the 3g's creation,
        // (1.5 + 1.5 + 2.5) / 2 = 2.75 s. Tenant 1's old 3g serves on while its 1g comes up:
        // nothing is missing.
        assert!((a.psi_next[0] - 2.75).abs() < 1e-9, "{:?}", a.psi_next);
        assert_eq!(a.psi_next[1], 0.0);
        assert!(b.psi_next[0] < a.psi_next[0]);
    }

    /// One tenant growing from a 2g to a 4g at step 10 of 20, by a plan made by hand, with
    /// the old 2g at `old_start`.
    fn growth(old_start: u8) -> Charged {
        let model = GpuModel::A100_40GB;
        let problem = Problem {
            model,
            tenants: vec![tenant("resnet50")],
            window_s: 20,
            step_s: 1.0,
            initial: vec![2],
        };
        let mut inference = vec![2u8; 20];
        inference[10..].fill(4);
        let schedule = Schedule {
            inference: vec![inference],
            retraining: vec![Retraining {
                start: 19,
                gpcs: 1,
                steps: 1,
            }],
        };
        let step = |text: &str| {
            let layout = Layout::parse(model, text).unwrap();
            PlanStep {
                assignment: Assignment {
                    inference: vec![layout.placements().to_vec()],
                    retraining: vec![None],
                    layout,
                },
                warming: Vec::new(),
            }
        };
        let old = format!("2g.10gb@{old_start}");
        let mut steps = vec![step(&old); 10];
        steps.extend(vec![step("4g.20gb@0"); 10]);
        let plan = Plan {
            step_ms: 1000,
            steps,
            preinitialized: 0,
            created: 1,
            exposed: Vec::new(),
        };
        evaluate_credited(&problem, &schedule, &plan)
    }

    #[test]
    fn an_old_replica_out_of_the_way_serves_on_through_its_tenant_s_resize() {
        // 100 requests/s arrive, 10/s per GPC served. The 4g's creation and loads take
        // 1.5 + 1.5 + 2.5 = 5.5 s. The old 2g at 4 overlaps nothing created, so it serves
        // its 20/s meanwhile: 5.5 s × 20/s are lost, not 5.5 s × 40/s, and the resize costs
        // 5.5 × (1 - 20/40) = 2.75 s of the new size's service.
        let out_of_way = growth(4);
        assert_eq!(out_of_way.resizes, 1);
        assert!((out_of_way.lost_s - 2.75).abs() < 1e-9, "{out_of_way:?}");
        assert!((out_of_way.outcome.on_time - (200.0 + 400.0 - 110.0)).abs() < 1e-6);
        assert!((out_of_way.psi_next[0] - 2.75).abs() < 1e-9);
        // The 2g at 0 is in the 4g's way: drained, destroyed (0.5 s), then the 4g comes up,
        // 6.0 s with nothing serving.
        let in_way = growth(0);
        assert!((in_way.lost_s - 6.0).abs() < 1e-9, "{in_way:?}");
        assert!((in_way.outcome.on_time - (200.0 + 400.0 - 240.0)).abs() < 1e-6);
    }
}
