//! MIGRator (P0, seed `000_4c1b5083ae2c95f7.txt`): dynamic MIG reconfiguration for
//! continual-learning tenants that each run an inference task all the time and a retraining
//! task once per 200 s window.
//!
//! At the start of each window, [`Migrator::plan_window`] solves an integer program over the
//! window ([`ilp`]: an allocation of GPCs to every inference and retraining task for every
//! step, maximizing goodput, with retraining never interrupted, every inference at its minimum
//! and a penalty for each reconfiguration), turns it into a timed plan of legal layouts with
//! pre-initialization ([`plan`]), and then executes it: at every event, it reconciles the GPU
//! towards the current step's layout and holders. Its rules:
//!
//! - **drain before destroy**: an instance serving inference that the step no longer wants
//!   is drained (no new requests; it finishes those it holds) and destroyed only once idle, so
//!   no request is lost;
//! - **serve until replaced**: that drain waits until the tenant's replicas of the step are
//!   bound and warm (P0 §4.2: the old instances serve while the new ones are initialized),
//!   unless the old instance is in the way: it overlaps an instance the step still has to
//!   create, or the step's retraining runs on it, or the tenant's new replicas wait for another
//!   tenant's instance that waits, in turn, for this one. Only then does the tenant go without a
//!   replica, for drain, creation and initialization; the plan says where
//!   ([`Plan::exposed`](plan::Plan::exposed));
//! - **pinned retraining**: a retraining instance is launched once and never destroyed while
//!   its task runs (the plan keeps its placement; the executor destroys only idle instances);
//! - **create when free**: an instance is created as soon as nothing overlaps it, and bound
//!   (replica warmed) or launched (retraining) as soon as it is ready.
//!
//! Inputs ([`problem`]): per tenant, the minimum inference size, the capability per GPC count,
//! the per-second arrival forecast, the retraining time per instance size, the accuracies
//! before and after retraining and the reconfiguration overhead. The forecasts, capabilities
//! and accuracies are the application's (P0 uses an Informer forecaster and a short
//! pre-training run); [`forecast`] is a small forecaster of ours (Holt-Winters or exponential
//! smoothing over the windows observed so far) that plans can be made from, and [`workload`]
//! builds documented two-tenant examples, as single windows and as continuous traces of
//! several shapes. [`reconfig`] prices a reconfiguration per model and per phase and credits
//! pre-initialization as P0 does, through the next window's `Ψ`; [`solve_priced`] raises a
//! tenant's `Ψ` where the window's own plan makes its resizes cost more than the `Ψ` carried
//! over, and solves again.

pub mod forecast;
pub mod ilp;
pub mod plan;
pub mod problem;
pub mod realize;
pub mod reconfig;
pub mod workload;

use std::collections::BTreeMap;

use escher_proto::mig::{Layout, Placement};
use escher_proto::types::TaskId;

#[cfg(feature = "milp")]
use self::ilp::solve;
use self::ilp::{PlanError, Solved};
use self::plan::{Plan, build_plan};
use self::problem::Problem;
use super::{Command, Event, GpuPolicy, GpuView, InstanceState};

/// The tasks of one tenant on the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantTasks {
    /// Its inference task (replicas are bound to it).
    pub inference: TaskId,
    /// This window's retraining task.
    pub retraining: TaskId,
}

/// MIGRator executing one window's plan on one GPU (see the module doc). The same executor
/// carries out another policy's schedule ([`Migrator::execute`]: Ekya's on MIG slices, PARIS's
/// static split), so that they are compared on the same GPU with the same rules.
#[derive(Debug, Clone)]
pub struct Migrator {
    name: String,
    solved: Solved,
    plan: Plan,
    tasks: Vec<TenantTasks>,
    start_ms: u64,
    end_ms: u64,
    launched: Vec<bool>,
    finished: Vec<bool>,
    /// The replicas this executor bound, and when (ms): each serves [`WARM_MS`] later.
    bound_at: BTreeMap<Placement, u64>,
}

/// How long a newly bound replica takes to serve, ms: the library and model load of
/// [`LatencyModel`](escher_proto::mig::LatencyModel)'s defaults. On a cluster the worker's
/// reconfiguration does that work and a replica serves from its task's start; waiting this
/// long there only keeps the old replica a little longer.
pub const WARM_MS: u64 = 4_000;

/// At most this many times [`solve_priced`] solves one window.
#[cfg(feature = "milp")]
pub const MAX_PRICINGS: usize = 4;

/// A schedule whose resizes its program priced no lower than its own plan makes them cost.
#[cfg(feature = "milp")]
#[derive(Debug, Clone, PartialEq)]
pub struct Priced {
    /// The schedule, with the time and programs of every solve it took.
    pub solved: Solved,
    /// Each tenant's `Ψ` the last solve was made with.
    pub psi_s: Vec<f64>,
    /// Solves of the window (1: the first schedule's plan cost no more than its `Ψ`).
    pub solves: usize,
}

/// Solves `problem`, then checks its schedule against the plan it makes from `layout` (with
/// pre-initialization `lead` steps ahead): where a tenant's resizes cost it more on average
/// ([`reconfig::evaluate_credited`] on `problem` itself, so nothing the planner does not
/// know is read) than the `Ψ` its program charged, that tenant's `Ψ` is raised to that cost
/// and the window solved again, at most [`MAX_PRICINGS`] times.
///
/// `Ψ` carried over from the window before can be far below what this window's resizes
/// cost: a tenant whose every resize was built ahead then plans with `Ψ` = 0, and a resize
/// that leaves it without a replica for seconds (its old instance in the way of the new one,
/// [`Plan::exposed`](plan::Plan::exposed)) looks free to the program. `Ψ` only rises here,
/// and at most [`MAX_PRICINGS`] solves are made. Needs the `milp` feature (on by default).
#[cfg(feature = "milp")]
pub fn solve_priced(problem: &Problem, layout: &Layout, lead: usize) -> Result<Priced, PlanError> {
    let mut priced = problem.clone();
    let (mut solves, mut time, mut programs) = (0, std::time::Duration::ZERO, 0);
    loop {
        let used: Vec<f64> = priced.tenants.iter().map(|t| t.psi_s).collect();
        let mut solved = solve(&priced)?;
        solves += 1;
        time += solved.solve_time;
        programs += solved.programs;
        let plan = build_plan(&priced, &solved.schedule, layout, lead)?;
        let cost = reconfig::evaluate_credited(&priced, &solved.schedule, &plan).psi_next;
        let mut raised = false;
        for (t, cost) in priced.tenants.iter_mut().zip(cost) {
            if cost > t.psi_s + 1e-6 {
                t.psi_s = cost;
                raised = true;
            }
        }
        if !raised || solves == MAX_PRICINGS {
            solved.solve_time = time;
            solved.programs = programs;
            return Ok(Priced {
                solved,
                psi_s: used,
                solves,
            });
        }
    }
}

/// The pre-initialization lead of [`Migrator::execute`], in steps: creating an instance and
/// loading a model take about 5.5 s (`LatencyModel`'s defaults).
fn execution_lead(problem: &Problem, preinitialize: bool) -> usize {
    if preinitialize {
        (5.5 / problem.step_s).ceil() as usize + 1
    } else {
        0
    }
}

impl Migrator {
    /// Plans the window of `problem` starting at `now` (ms) from the GPU's current `layout`,
    /// with pre-initialization on or off, its resizes priced by its own plan
    /// ([`solve_priced`]). Needs the `milp` feature (on by default); without it the
    /// executor still runs schedules other policies plan ([`Migrator::execute`]).
    #[cfg(feature = "milp")]
    pub fn plan_window(
        problem: &Problem,
        tasks: Vec<TenantTasks>,
        layout: &Layout,
        now: u64,
        preinitialize: bool,
    ) -> Result<Migrator, PlanError> {
        let lead = execution_lead(problem, preinitialize);
        let priced = solve_priced(problem, layout, lead)?;
        Migrator::execute(
            "MIGRator",
            problem,
            priced.solved,
            tasks,
            layout,
            now,
            preinitialize,
        )
    }

    /// Executes `solved` (a schedule for `problem`, planned by any policy) as MIGRator does,
    /// under the name `name`.
    pub fn execute(
        name: &str,
        problem: &Problem,
        solved: Solved,
        tasks: Vec<TenantTasks>,
        layout: &Layout,
        now: u64,
        preinitialize: bool,
    ) -> Result<Migrator, PlanError> {
        let plan = build_plan(
            problem,
            &solved.schedule,
            layout,
            execution_lead(problem, preinitialize),
        )?;
        let n = tasks.len();
        Ok(Migrator {
            name: name.to_string(),
            solved,
            plan,
            tasks,
            start_ms: now,
            end_ms: now + u64::from(problem.window_s) * 1000,
            launched: vec![false; n],
            finished: vec![false; n],
            bound_at: BTreeMap::new(),
        })
    }

    /// The integer program's answer and how long it took.
    pub fn solved(&self) -> &Solved {
        &self.solved
    }

    /// The timed plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The tenant whose inference task is `task`.
    fn tenant_of_inference(&self, task: TaskId) -> Option<usize> {
        self.tasks.iter().position(|t| t.inference == task)
    }

    /// Moves the GPU one move closer to the current step: drain, destroy, create, bind,
    /// launch (see the module doc).
    fn reconcile(&mut self, gpu: &GpuView, now: u64, out: &mut Vec<Command>) {
        let step = self.plan.step_at(now.saturating_sub(self.start_ms)).clone();
        let target = &step.assignment;
        let wanted_for = |p: &Placement| -> Option<usize> {
            target
                .inference_of(p)
                .or_else(|| step.warming.iter().find(|w| w.0 == *p).and_then(|w| w.1))
        };
        // In the way: overlapping an instance still to create, or the step's retraining's.
        let to_create: Vec<Placement> = target
            .layout
            .placements()
            .iter()
            .filter(|p| !gpu.layout.contains(p))
            .copied()
            .collect();
        let in_way = |p: &Placement| {
            target.retraining_of(p).is_some() || to_create.iter().any(|q| q.overlap(p).is_some())
        };
        // Whether tenant `m`'s replicas of this step all serve (bound, and warm).
        let serving = |m: usize| {
            target.inference[m].iter().all(|q| {
                gpu.at(q.start).is_some_and(|i| {
                    i.placement == *q && i.state == InstanceState::Busy(self.tasks[m].inference)
                }) && self.bound_at.get(q).is_none_or(|t| now >= t + WARM_MS)
            })
        };
        // Tenant `m` waits for `n` when one of its replicas of this step is `n`'s now; a tenant
        // on a cycle of waits (two swapping instances) holds nothing back.
        let n = self.tasks.len();
        let waits: Vec<Vec<bool>> = (0..n)
            .map(|m| {
                (0..n)
                    .map(|k| {
                        k != m
                            && target.inference[m].iter().any(|q| {
                                gpu.at(q.start).is_some_and(|i| {
                                    i.placement == *q
                                        && matches!(i.state, InstanceState::Busy(t) | InstanceState::Draining(t)
                                            if t == self.tasks[k].inference)
                                })
                            })
                    })
                    .collect()
            })
            .collect();
        let on_cycle = |m: usize| {
            let mut seen = vec![false; n];
            let mut stack: Vec<usize> = (0..n).filter(|&k| waits[m][k]).collect();
            while let Some(k) = stack.pop() {
                if k == m {
                    return true;
                }
                if !std::mem::replace(&mut seen[k], true) {
                    stack.extend((0..n).filter(|&j| waits[k][j]));
                }
            }
            false
        };
        let mut layout = gpu.layout.clone();
        for inst in &gpu.instances {
            let p = inst.placement;
            let keep = target.layout.contains(&p);
            match inst.state {
                InstanceState::Idle if !keep => {
                    out.push(Command::Destroy(p));
                    layout.remove(p.start);
                }
                InstanceState::Busy(task) => {
                    if let Some(m) = self.tenant_of_inference(task)
                        && (!keep || wanted_for(&p) != Some(m))
                        && (in_way(&p) || serving(m) || on_cycle(m))
                    {
                        out.push(Command::Drain { task, on: p });
                    }
                }
                _ => {}
            }
        }
        for p in target.layout.placements() {
            if !layout.contains(p) && layout.insert(*p).is_ok() {
                out.push(Command::Create(*p));
            }
        }
        for inst in &gpu.instances {
            if inst.state != InstanceState::Idle || !target.layout.contains(&inst.placement) {
                continue;
            }
            let p = inst.placement;
            if let Some(m) = target.retraining_of(&p) {
                if !self.launched[m] {
                    self.launched[m] = true;
                    out.push(Command::Launch {
                        task: self.tasks[m].retraining,
                        on: p,
                    });
                }
            } else if let Some(m) = wanted_for(&p) {
                self.bound_at.insert(p, now);
                out.push(Command::Bind {
                    task: self.tasks[m].inference,
                    on: p,
                });
            }
        }
    }
}

impl GpuPolicy for Migrator {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn on_event(&mut self, event: &Event, gpu: &GpuView, now: u64, out: &mut Vec<Command>) {
        if let Event::Finished(task) = event
            && let Some(m) = self.tasks.iter().position(|t| t.retraining == *task)
        {
            self.finished[m] = true;
        }
        if now < self.end_ms {
            self.reconcile(gpu, now, out);
        }
    }

    fn is_done(&self) -> bool {
        false
    }
}

#[cfg(all(test, feature = "milp"))]
mod tests;
