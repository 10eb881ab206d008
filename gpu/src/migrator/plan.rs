//! From a [`Schedule`] (sizes per step) to a timed [`Plan`] (a legal layout and its holders
//! per step), with MIGRator's **pre-initialization** (P0 §4.2, Fig. 6).
//!
//! 1. **Pins.** Each tenant's retraining instance is placed once, for its whole run (never
//!    reconfigured: P0's no-interruption rule). The placements are chosen together, trying
//!    every combination of legal starts until every step of the window is realizable with
//!    them ([`super::realize::realizable`] on the maximal layouts, cached per tuple).
//! 2. **Steps.** Each step's layout is the legal layout closest to the previous step's that
//!    holds the pins and realizes the step's sizes ([`realize`]); a step whose sizes did not
//!    change keeps its layout and holders.
//! 3. **Pre-initialization.** An instance a step creates is built earlier, during the
//!    preceding steps, whenever its memory slices are held by no task then (only idle
//!    instances give way, so no running task is disturbed): its creation and model load
//!    overlap with serving, and the step it is needed in finds it ready. It is created up to
//!    `lead` steps ahead (the reconfiguration time over the step length).
//! 4. **Exposed resizes.** The executor keeps a tenant's old replicas serving until its new
//!    ones are bound and warm, unless an old one is in the way (it overlaps an instance the
//!    step creates, or the step's retraining runs on it). A resize whose new instances were not
//!    all built ahead and whose old instances are all in the way leaves the tenant without a
//!    replica for drain, creation and initialization: [`Plan::exposed`] lists those, with
//!    their cost as the worker will take it ([`super::reconfig::ready_s`]: the step's
//!    instances made one after another), so that the plan says what it will cost.

use std::collections::BTreeMap;

use escher_proto::mig::{Layout, Placement};

use super::ilp::PlanError;
use super::problem::{Problem, Schedule};
use super::realize::{Assignment, every_layout, realize, split};

/// One step of a plan: the assignment, and the instances built ahead of time for a later
/// step (with the tenant whose inference will use them, if any).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanStep {
    /// The layout and holders during this step.
    pub assignment: Assignment,
    /// Instances in the layout being prepared for a later step: `(instance, tenant)` for
    /// inference replicas (bound and warmed ahead), `(instance, None)` for retraining
    /// instances.
    pub warming: Vec<(Placement, Option<usize>)>,
}

/// A window's timed plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Step length, milliseconds.
    pub step_ms: u64,
    /// The steps, in order.
    pub steps: Vec<PlanStep>,
    /// Instances built ahead of the step that needs them.
    pub preinitialized: usize,
    /// Instances created in all (each creation of an instance counts once).
    pub created: usize,
    /// The resizes that leave their tenant without a replica (see the module doc), in order.
    pub exposed: Vec<Exposed>,
}

/// A resize that leaves its tenant without a replica: no non-overlapping placement let the
/// old instances serve while the new ones came up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Exposed {
    /// The step it takes effect in.
    pub step: usize,
    /// The tenant.
    pub tenant: usize,
    /// Seconds without a replica: until its new instance is ready, as the worker makes the
    /// step's instances one after another ([`super::reconfig::ready_s`]: their creation and
    /// loads, and the destruction of the old ones in their way; the drain of the requests the
    /// old replica holds comes on top).
    pub seconds: f64,
}

impl Plan {
    /// The longest time the plan leaves tenant `m` without a replica, seconds (0: never).
    pub fn exposed_s(&self, m: usize) -> f64 {
        self.exposed
            .iter()
            .filter(|e| e.tenant == m)
            .map(|e| e.seconds)
            .fold(0.0, f64::max)
    }

    /// The step in force `elapsed_ms` into the window (the last one after it ends).
    pub fn step_at(&self, elapsed_ms: u64) -> &PlanStep {
        let i = (elapsed_ms / self.step_ms.max(1)) as usize;
        &self.steps[i.min(self.steps.len() - 1)]
    }
}

/// Builds the plan of `schedule` from the layout the GPU has now, `current`, building
/// instances up to `lead` steps ahead (0: no pre-initialization).
pub fn build_plan(
    problem: &Problem,
    schedule: &Schedule,
    current: &Layout,
    lead: usize,
) -> Result<Plan, PlanError> {
    let steps = problem.steps();
    let n = problem.tenants.len();
    let mins: Vec<u8> = problem.tenants.iter().map(|t| t.min_gpcs).collect();
    let pins = choose_pins(problem, schedule, &mins)?;
    let candidates = every_layout(problem.model);
    let mut out: Vec<PlanStep> = Vec::with_capacity(steps);
    let start = Assignment {
        layout: current.clone(),
        inference: vec![Vec::new(); n],
        retraining: vec![None; n],
    };
    let mut prev: Option<Assignment> = None;
    for s in 0..steps {
        let inf: Vec<u8> = schedule.inference.iter().map(|v| v[s]).collect();
        let active: Vec<Option<Placement>> = (0..n)
            .map(|m| schedule.retraining[m].runs_at(s).then_some(pins[m]))
            .collect();
        let unchanged = prev.as_ref().is_some_and(|p| {
            p.retraining == active
                && p.inference
                    .iter()
                    .zip(&inf)
                    .all(|(g, k)| g.iter().map(|q| q.profile.compute).sum::<u8>() == *k)
        });
        let a = if unchanged {
            prev.clone().expect("checked")
        } else {
            realize(
                &candidates,
                &inf,
                &active,
                &mins,
                Some(prev.as_ref().unwrap_or(&start)),
            )
            .ok_or_else(|| PlanError::Infeasible(format!("step {s}: no layout realizes {inf:?}")))?
        };
        prev = Some(a.clone());
        out.push(PlanStep {
            assignment: a,
            warming: Vec::new(),
        });
    }
    let created = count_created(current, &out);
    let preinitialized = preinitialize(&mut out, lead);
    let names: Vec<&str> = problem.tenants.iter().map(|t| t.name.as_str()).collect();
    let exposed = exposed(&out, &names);
    Ok(Plan {
        step_ms: (problem.step_s * 1000.0).round() as u64,
        steps: out,
        preinitialized,
        created,
        exposed,
    })
}

/// The resizes along `steps` that leave their tenant without a replica (see the module doc);
/// `names` are the tenants' models, for the phases' costs.
fn exposed(steps: &[PlanStep], names: &[&str]) -> Vec<Exposed> {
    let mut out = Vec::new();
    let n = names.len();
    for s in 1..steps.len() {
        let before = &steps[s - 1].assignment;
        let now = &steps[s].assignment;
        let created: Vec<Placement> = escher_proto::mig::diff(&before.layout, &now.layout).1;
        let ready = super::reconfig::ready_s(before, &steps[s], names);
        let in_way = |p: &Placement| {
            now.retraining_of(p).is_some() || created.iter().any(|q| q.overlap(p).is_some())
        };
        // As the executor finds them at the step's start: `m` waits for `k` when one of its
        // new replicas is `k`'s old one; a tenant on a cycle of waits holds nothing back.
        let waits = |m: usize, k: usize| {
            k != m
                && now.inference[m]
                    .iter()
                    .any(|p| before.inference[k].contains(p))
        };
        let on_cycle = |m: usize| {
            let mut seen = vec![false; n];
            let mut stack: Vec<usize> = (0..n).filter(|&k| waits(m, k)).collect();
            while let Some(k) = stack.pop() {
                if k == m {
                    return true;
                }
                if !std::mem::replace(&mut seen[k], true) {
                    stack.extend((0..n).filter(|&j| waits(k, j)));
                }
            }
            false
        };
        for (m, name) in names.iter().enumerate() {
            let old = &before.inference[m];
            // Not serving at the step's start: every new replica not bound ahead for `m`.
            let late: Vec<Placement> = now.inference[m]
                .iter()
                .filter(|p| {
                    !old.contains(p) && !steps[s - 1].warming.iter().any(|w| w == &(**p, Some(m)))
                })
                .copied()
                .collect();
            let kept = old.iter().any(|p| now.inference[m].contains(p));
            if late.is_empty() || kept || !(on_cycle(m) || old.iter().all(in_way)) {
                continue;
            }
            let seconds = late
                .iter()
                .map(|p| match ready.iter().find(|r| r.0 == *p) {
                    Some(r) => r.1,
                    None => {
                        let phases = super::reconfig::phases(name, p.profile.compute);
                        phases.library_s + phases.model_s
                    }
                })
                .fold(0.0, f64::max);
            out.push(Exposed {
                step: s,
                tenant: m,
                seconds,
            });
        }
    }
    out
}

/// Instance creations along the plan.
fn count_created(current: &Layout, steps: &[PlanStep]) -> usize {
    let mut before = current.clone();
    let mut n = 0;
    for s in steps {
        n += escher_proto::mig::diff(&before, &s.assignment.layout)
            .1
            .len();
        before = s.assignment.layout.clone();
    }
    n
}

/// Each tenant's retraining instance: the first combination of placements of the scheduled
/// sizes with which every step is realizable.
fn choose_pins(
    problem: &Problem,
    schedule: &Schedule,
    mins: &[u8],
) -> Result<Vec<Placement>, PlanError> {
    let model = problem.model;
    let options: Vec<Vec<Placement>> = schedule
        .retraining
        .iter()
        .map(|r| {
            model
                .base_profiles()
                .filter(|p| p.compute == r.gpcs)
                .flat_map(|p| p.starts.iter().rev().map(move |s| Placement::new(p, *s)))
                .collect()
        })
        .collect();
    let maximal = escher_proto::mig::maximal_layouts(model);
    let mut cache: BTreeMap<(Vec<u8>, Vec<Option<Placement>>), bool> = BTreeMap::new();
    let mut ok_with = |inf: Vec<u8>, active: Vec<Option<Placement>>| -> bool {
        *cache
            .entry((inf.clone(), active.clone()))
            .or_insert_with(|| {
                let pinned: Vec<Placement> = active.iter().flatten().copied().collect();
                if pinned
                    .iter()
                    .enumerate()
                    .any(|(i, p)| pinned[..i].iter().any(|q| q.overlap(p).is_some()))
                {
                    return false;
                }
                maximal.iter().any(|l| {
                    pinned.iter().all(|p| l.contains(p)) && {
                        let rest: Vec<Placement> = l
                            .placements()
                            .iter()
                            .filter(|p| !pinned.contains(p))
                            .copied()
                            .collect();
                        split(&rest, &inf, mins, &[]).is_some()
                    }
                })
            })
    };
    let mut choice = vec![0usize; options.len()];
    loop {
        let pins: Vec<Placement> = choice
            .iter()
            .enumerate()
            .map(|(m, &i)| options[m][i])
            .collect();
        let fits = (0..problem.steps()).all(|s| {
            let inf: Vec<u8> = schedule.inference.iter().map(|v| v[s]).collect();
            let active = (0..pins.len())
                .map(|m| schedule.retraining[m].runs_at(s).then_some(pins[m]))
                .collect();
            ok_with(inf, active)
        });
        if fits {
            return Ok(pins);
        }
        // Next combination.
        let mut m = 0;
        loop {
            if m == choice.len() {
                return Err(PlanError::Infeasible(
                    "no placement of the retraining instances keeps every step realizable".into(),
                ));
            }
            choice[m] += 1;
            if choice[m] < options[m].len() {
                break;
            }
            choice[m] = 0;
            m += 1;
        }
    }
}

/// Rewrites the steps so that instances are built up to `lead` steps before the step that
/// first needs them, where only idle instances stand in their way; how many were.
fn preinitialize(steps: &mut [PlanStep], lead: usize) -> usize {
    let mut count = 0;
    for s in (1..steps.len()).rev() {
        let (before, after) = steps.split_at_mut(s);
        let next = &after[0];
        let new: Vec<(Placement, Option<usize>)> = {
            let prev_layout = &before[s - 1].assignment.layout;
            escher_proto::mig::diff(prev_layout, &next.assignment.layout)
                .1
                .into_iter()
                .filter(|p| !next.warming.iter().any(|w| w.0 == *p))
                .map(|p| (p, next.assignment.inference_of(&p)))
                .collect()
        };
        for (p, tenant) in new {
            let mut built = false;
            for back in 1..=lead.min(s) {
                let step = &mut before[s - back];
                let a = &step.assignment;
                if a.layout.contains(&p) {
                    break;
                }
                let blocking: Vec<Placement> = a
                    .layout
                    .placements()
                    .iter()
                    .filter(|q| q.overlap(&p).is_some())
                    .copied()
                    .collect();
                if !blocking
                    .iter()
                    .all(|q| a.is_idle(q) && !step.warming.iter().any(|w| w.0 == *q))
                {
                    break;
                }
                let mut layout = a.layout.clone();
                for q in &blocking {
                    layout.remove(q.start);
                }
                if layout.insert(p).is_err() {
                    break;
                }
                step.assignment.layout = layout;
                step.warming.push((p, tenant));
                built = true;
            }
            if built {
                count += 1;
            }
        }
    }
    count
}

#[cfg(all(test, feature = "milp"))]
mod tests {
    use super::super::ilp::solve;
    use super::super::workload::two_tenants;
    use super::*;

    #[test]
    fn the_papers_example_fuses_two_idle_2g_into_the_next_steps_4g() {
        // P0 Fig. 6: A1 gives task 1 a 2-GPC and task 2 a 1-GPC instance; A2 gives task 1 a
        // 4-GPC and task 2 a 2-GPC and a 1-GPC. A1's two unused 2-GPC instances become A2's
        // 4-GPC instance ahead of time.
        let m = escher_proto::mig::GpuModel::A100_40GB;
        let l = |t: &str| Layout::parse(m, t).unwrap();
        let pl = |name: &str, s: u8| Placement::new(m.profile(name).unwrap(), s);
        let a1 = Assignment {
            layout: l("2g.10gb@0,2g.10gb@2,2g.10gb@4,1g.5gb@6"),
            inference: vec![vec![pl("2g.10gb", 4)], vec![pl("1g.5gb", 6)]],
            retraining: vec![None, None],
        };
        let a2 = Assignment {
            layout: l("4g.20gb@0,2g.10gb@4,1g.5gb@6"),
            inference: vec![
                vec![pl("4g.20gb", 0)],
                vec![pl("2g.10gb", 4), pl("1g.5gb", 6)],
            ],
            retraining: vec![None, None],
        };
        let step = |a: &Assignment| PlanStep {
            assignment: a.clone(),
            warming: Vec::new(),
        };
        let mut steps = vec![step(&a1), step(&a1), step(&a2)];
        assert_eq!(preinitialize(&mut steps, 1), 1);
        assert_eq!(
            steps[1].assignment.layout.to_string(),
            "4g.20gb@0,2g.10gb@4,1g.5gb@6"
        );
        assert_eq!(steps[1].warming, vec![(pl("4g.20gb", 0), Some(0))]);
        // The replicas that serve in step 1 are untouched.
        assert_eq!(steps[1].assignment.inference, a1.inference);
        assert_eq!(steps[0].assignment, a1);
        // A busy instance in the way stops it.
        let mut busy = vec![step(&a1), step(&a2)];
        busy[0].assignment.inference[1].push(pl("2g.10gb", 2));
        assert_eq!(preinitialize(&mut busy, 1), 0);
    }

    #[test]
    fn a_resize_whose_old_instance_is_in_the_way_is_exposed_at_its_phases() {
        // Tenant 1 grows from a 1g at 4 to the 2g at 4, the only room: the 2g overlaps the 1g,
        // so the 1g drains first and the tenant goes without a replica until the worker has
        // destroyed the idle 1g at 5 (0.5 s, at once), then the drained 1g at 4 (0.5 s), and
        // made ResNet50's 2g (1.5 + 1.5 + 2.5 = 5.5 s): 6.5 s. Growing into the idle
        // 1g at 5 instead keeps the 1g at 4 serving: nothing exposed.
        let m = escher_proto::mig::GpuModel::A100_40GB;
        let l = |t: &str| Layout::parse(m, t).unwrap();
        let pl = |name: &str, s: u8| Placement::new(m.profile(name).unwrap(), s);
        let step = |layout: &str, t1: Vec<Placement>| PlanStep {
            assignment: Assignment {
                layout: l(layout),
                inference: vec![vec![pl("4g.20gb", 0)], t1],
                retraining: vec![None, None],
            },
            warming: Vec::new(),
        };
        let before = step("4g.20gb@0,1g.5gb@4,1g.5gb@5", vec![pl("1g.5gb", 4)]);
        let names = ["resnet50", "resnet50"];
        let into = step("4g.20gb@0,2g.10gb@4", vec![pl("2g.10gb", 4)]);
        let e = exposed(&[before.clone(), into], &names);
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!((e[0].step, e[0].tenant), (1, 1));
        assert!((e[0].seconds - 6.5).abs() < 1e-9, "{e:?}");
        let beside = step(
            "4g.20gb@0,1g.5gb@4,1g.5gb@5",
            vec![pl("1g.5gb", 4), pl("1g.5gb", 5)],
        );
        assert!(exposed(&[before, beside], &names).is_empty());
    }

    #[test]
    fn two_resizes_in_one_step_wait_for_each_other_as_the_worker_makes_them() {
        // Both tenants move out of 3g slices onto instances overlapping them: tenant 0 onto
        // the 4g at 0, tenant 1 onto the 2g at 4. Both old replicas are in the way, so the
        // worker gets one reconfiguration that destroys both (2 x 0.5 s) and makes the 4g and
        // the 2g (1.5 + 1.5 + 2.5 s each) one after the other: neither serves before 12.0 s,
        // not the 6.0 s each would take alone (the worker's phases make such a step 12.0 s
        // too: one split for both).
        let m = escher_proto::mig::GpuModel::A100_40GB;
        let l = |t: &str| Layout::parse(m, t).unwrap();
        let pl = |name: &str, s: u8| Placement::new(m.profile(name).unwrap(), s);
        let step = |layout: &str, inference: Vec<Vec<Placement>>| PlanStep {
            assignment: Assignment {
                layout: l(layout),
                inference,
                retraining: vec![None, None],
            },
            warming: Vec::new(),
        };
        let before = step(
            "3g.20gb@0,3g.20gb@4",
            vec![vec![pl("3g.20gb", 0)], vec![pl("3g.20gb", 4)]],
        );
        let after = step(
            "4g.20gb@0,2g.10gb@4",
            vec![vec![pl("4g.20gb", 0)], vec![pl("2g.10gb", 4)]],
        );
        let names = ["resnet50", "resnet50"];
        let e = exposed(&[before.clone(), after.clone()], &names);
        assert_eq!(e.len(), 2, "{e:?}");
        for x in &e {
            assert!((x.seconds - 12.0).abs() < 1e-9, "{e:?}");
        }
        // A step that creates an instance out of everyone's way sends it at once, and one in
        // the way after it: from a 2g at 0 and a 3g at 4, the idle 2g at 2 comes up first
        // (5.5 s), then tenant 1's 2g at 4 after its 3g's destruction (5.5 + 0.5 + 5.5 s).
        let before = step(
            "2g.10gb@0,3g.20gb@4",
            vec![vec![pl("2g.10gb", 0)], vec![pl("3g.20gb", 4)]],
        );
        let after = step(
            "2g.10gb@0,2g.10gb@2,2g.10gb@4",
            vec![vec![pl("2g.10gb", 0)], vec![pl("2g.10gb", 4)]],
        );
        let ready = super::super::reconfig::ready_s(&before.assignment, &after, &names);
        let of = |p: Placement| ready.iter().find(|r| r.0 == p).unwrap().1;
        assert_eq!(ready.len(), 2, "{ready:?}");
        assert!((of(pl("2g.10gb", 2)) - 5.5).abs() < 1e-9, "{ready:?}");
        assert!((of(pl("2g.10gb", 4)) - 11.5).abs() < 1e-9, "{ready:?}");
    }

    #[test]
    fn every_step_is_legal_and_realizes_its_sizes_and_pins_hold() {
        let p = two_tenants(1, 200, 1.0);
        let solved = solve(&p).unwrap();
        let plan = build_plan(&p, &solved.schedule, &Layout::new(p.model), 6).unwrap();
        assert_eq!(plan.steps.len(), 200);
        for (s, step) in plan.steps.iter().enumerate() {
            let a = &step.assignment;
            a.layout.validate().unwrap();
            for (m, g) in a.inference.iter().enumerate() {
                let k: u8 = g.iter().map(|q| q.profile.compute).sum();
                assert_eq!(k, solved.schedule.inference[m][s], "step {s}");
                assert!(g.iter().all(|q| a.layout.contains(q)));
            }
            for (m, r) in solved.schedule.retraining.iter().enumerate() {
                assert_eq!(a.retraining[m].is_some(), r.runs_at(s), "step {s}");
            }
        }
        // One placement per retraining, for its whole run.
        for (m, r) in solved.schedule.retraining.iter().enumerate() {
            let pins: std::collections::BTreeSet<_> = (r.start..r.start + r.steps)
                .map(|s| plan.steps[s].assignment.retraining[m])
                .collect();
            assert_eq!(pins.len(), 1);
        }
    }
}
