//! MIGRator (the `preinit`, `migrator` and `migrator-cluster` parts of `escher-bench gpu`):
//! pre-initialization through the framework, and MIGRator's windows against Ekya (MPS and on
//! MIG), PARIS and the oracle, in memory over several windows and on a cluster's simulated
//! A100 (the module doc of `gpu/mod.rs`).

use escher::types::TRAINER_CLASS;
use escher_proto::mig::TrainerArgs;

use super::*;

/// MIGRator's pre-initialization through the framework (`escher mig prepare`): a GPU serving
/// on its 3g.20gb@4 goes from 2g@0, 2g@2, 3g@4 to 4g@0, 2g@4, 1g@6 when the serving task ends.
/// Applied at that switch, the whole reconfiguration is on the switch's path; prepared while
/// the 3g serves (the idle 2g's fused into the 4g ahead of time), only the 3g's replacement
/// is. The switch's time is the framework's own report of it (`last_reconfiguration`: from
/// the request to the worker's done), in simulated seconds.
pub(super) async fn preinitialization(
    scale: f64,
    report: &mut WorkloadReport,
) -> anyhow::Result<serde_json::Value> {
    let (from, to) = (
        "2g.10gb@0,2g.10gb@2,3g.20gb@4",
        "4g.20gb@0,2g.10gb@4,1g.5gb@6",
    );
    let mut switch_s = Vec::new();
    let mut out = Vec::new();
    for prepare in [false, true] {
        let gpu = format!("a100-40gb:mig={from}");
        let (cluster, client, node) = gpu_cluster(&gpu, scale).await?;
        let serving = client
            .submit(Task::command(["sleep", "600"]).resources_str("mig.3g.20gb=1"))
            .await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while client.task_info(&serving).await?.status.state != TaskState::Running {
            anyhow::ensure!(Instant::now() < deadline, "the serving task did not start");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let ahead = if prepare {
            client.prepare_mig_layout(node, 0, to).await?;
            let done = client
                .wait_mig_layout(node, 0, Some(Duration::from_secs(60)))
                .await?;
            done.last_reconfiguration
        } else {
            None
        };
        // The switch: the serving task ends, then the layout.
        client.cancel([&serving]).await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match client.apply_mig_layout(node, 0, to, false).await {
                // Busy until the worker confirms the stop.
                Err(e) if e.is_retryable() && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                other => {
                    other?;
                    break;
                }
            }
        }
        let done = client
            .wait_mig_layout(node, 0, Some(Duration::from_secs(60)))
            .await?;
        let switch = done
            .last_reconfiguration
            .ok_or_else(|| anyhow::anyhow!("the switch left no report"))?;
        anyhow::ensure!(switch.target == to, "the switch ended at {}", switch.target);
        let seconds = (switch.done_ms - switch.asked_ms) as f64 / 1000.0 / scale;
        switch_s.push(seconds);
        let which = if prepare { "prepared" } else { "applied" };
        let mut f = Figure::new(
            format!("gpu.preinit.switch.{which}"),
            format!(
                "switch 2g,2g,3g -> 4g,2g,1g when the 3g's task ends, {}: request to done \
                 (destroy {}, create {})",
                if prepare {
                    "after `mig prepare` while it served"
                } else {
                    "applied at the switch"
                },
                switch.phases.destroyed,
                switch.phases.created
            ),
            "s (simulated)",
            seconds,
        );
        f.better = Better::Lower;
        report.figures.push(f);
        out.push(json!({ "prepared": prepare, "ahead": ahead, "switch": switch }));
        cluster.shutdown().await;
    }
    let mut hidden = Figure::new(
        "gpu.preinit.hidden",
        "share of the switch's reconfiguration time that pre-initialization took off its path",
        "%",
        100.0 * (1.0 - switch_s[1] / switch_s[0]),
    )
    .thesis(83.0);
    hidden.better = Better::Higher;
    report.figures.push(hidden);
    report.notes.push(
        "pre-initialization: MIGRator's 83% is its average over its traces' switches; ours is \
         one switch, where what can be built ahead is the 4g from the two idle 2g's (the model's \
         phases: 0.5 s per destroy, 1.5 s create, 1.5 s library and 2.5 s model load per new \
         instance)"
            .into(),
    );
    Ok(json!({ "mix": "preinit", "runs": out }))
}

/// A policy, with when each task it heard of finished (ms of the driver's clock).
struct Timed<'a> {
    inner: &'a mut dyn GpuPolicy,
    finished: BTreeMap<TaskId, u64>,
}

impl GpuPolicy for Timed<'_> {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn on_event(&mut self, event: &Event, gpu: &GpuView, now: u64, out: &mut Vec<GpuCommand>) {
        if let Event::Finished(task) = event {
            self.finished.entry(*task).or_insert(now);
        }
        self.inner.on_event(event, gpu, now, out);
    }
    fn is_done(&self) -> bool {
        self.inner.is_done()
    }
}

/// What one window of a schedule delivered on the cluster.
#[derive(Debug, Clone, Default, serde::Serialize)]
struct Served {
    arrived: f64,
    on_time: f64,
    goodput: f64,
    reconfigurations: usize,
    /// Goodput per 10 simulated seconds: (end of the bucket, s; requests/s).
    #[serde(skip)]
    goodput_series: Vec<(f64, f64)>,
    /// GPCs serving each tenant's inference, then running each retraining, per round:
    /// (simulated s since the window began, GPCs).
    #[serde(skip)]
    allocation: Vec<(f64, Vec<f64>)>,
    /// The longest time the plan leaves each tenant without a replica, simulated s: its
    /// resizes whose old instances are in the way of the new ones (`Plan::exposed`).
    planned_unserved: Vec<f64>,
    /// Each tenant's requests shed past their SLO.
    expired: Vec<f64>,
    /// Per tenant, per 10 simulated seconds: what was measured against what the plan's
    /// evaluation counts (`min(arrivals, capacity)` per step, no resize charged), to locate
    /// where the cluster falls short of its plan.
    buckets: Vec<Vec<Bucket>>,
}

/// One tenant's 10 simulated seconds of a window on the cluster (see [`Served::buckets`]).
#[derive(Debug, Clone, Default, serde::Serialize)]
struct Bucket {
    /// Requests that arrived (the trace's).
    arrived: f64,
    /// Requests served within the SLO, measured.
    on_time: f64,
    /// `min(arrivals, capacity)` summed over the plan's steps.
    planned: f64,
    /// The most inference replicas the plan gives the tenant in a step of the bucket.
    replicas: usize,
    /// Whether the tenant's inference changes size in a step of the bucket.
    resized: bool,
}

/// The schedules a window is run with on the cluster: MIGRator planning from its forecast and
/// from the exact arrivals (the oracle), Ekya given only what it knows (rounded to slices) and
/// PARIS's static split. `(key, printed name)`.
const WINDOW_POLICIES: [(&str, &str); 4] = [
    ("migrator_forecast", "MIGRator (forecast)"),
    ("migrator_oracle", "MIGRator (oracle)"),
    ("ekya", "Ekya (MIG)"),
    ("paris", "PARIS"),
];

/// The trace shapes a window is run with on the cluster: bursty and diurnal, the two kinds of
/// load the paper's workloads put on a tenant.
const WINDOW_SHAPES: [Shape; 2] = [Shape::Bursty, Shape::Diurnal];

/// P0's gains over each baseline (§5.2, averages over W1-W16): goodput (Fig. 7), SLO
/// attainment (Fig. 8a) and accuracy (Fig. 8b; "similar" to Ekya's, read as 1.0).
const PAPER_GAINS: [(&str, f64, f64, f64); 3] = [
    ("ekya", 1.17, 1.17, 1.0),
    ("astraea", 1.21, 1.06, 1.19),
    ("paris", 1.20, 1.13, 1.12),
];

/// `mine`'s goodput, SLO attainment and accuracy over `base`'s: `((key, label), ratio)`, in the
/// order of the paper's Fig. 7, 8a and 8b.
fn ratios(mine: &PolicyOutcome, base: &PolicyOutcome) -> [((&'static str, &'static str), f64); 3] {
    let slo = |o: &PolicyOutcome| o.on_time / o.arrived.max(1e-9);
    [
        (("gain", "goodput"), mine.goodput / base.goodput.max(1e-9)),
        (
            ("slo_gain", "SLO attainment"),
            slo(mine) / slo(base).max(1e-9),
        ),
        (
            ("accuracy_gain", "accuracy of what was served on time"),
            mine.accuracy / base.accuracy.max(1e-9),
        ),
    ]
}

/// MIGRator and its baselines in memory over several windows of each trace shape, for each of
/// [`window_seeds`] seeds ([`escher_gpu::compare`]): goodput, SLO attainment and
/// accuracy of each over the seeds pooled, and MIGRator's (forecast and oracle) over each
/// baseline beside the paper's, pooled and per seed.
pub(super) fn migrator_in_memory(
    ctx: &Ctx,
    report: &mut WorkloadReport,
) -> anyhow::Result<serde_json::Value> {
    let (windows, step_s) = ctx.size.pick((1, 10.0), (2, 5.0), (4, 1.0));
    let seeds = window_seeds(ctx);
    let mut out = Vec::new();
    for shape in Shape::ALL {
        let runs = seeds
            .iter()
            .map(|seed| compare(shape, windows, step_s, *seed))
            .collect::<Result<Vec<_>, _>>()?;
        let c = Comparison::pool(&runs).expect("at least one seed");
        let key = shape.key();
        let pooled = format!(
            "{windows} windows of 200 s at {step_s} s steps after {HISTORY_WINDOWS} of history, \
             seeds {seeds:?} pooled"
        );
        let pct = |x: f64, of: f64| 100.0 * x / of.max(1e-9);
        let policy_key = |name: &str| {
            name.to_lowercase()
                .replace(" (exact future, free changes)", "_exact_future")
                .replace(" (every change stops it)", "_stopping")
                .replace(" (forecast)", "_forecast")
                .replace(" (oracle)", "_oracle")
        };
        for (name, o) in POLICIES.iter().zip(&c.rows) {
            let pk = policy_key(name);
            for (what, value, label) in [
                (
                    "goodput",
                    pct(o.goodput, o.arrived),
                    "goodput (on time x accuracy), % of arrivals",
                ),
                ("slo", pct(o.on_time, o.arrived), "SLO attainment, %"),
                (
                    "accuracy",
                    100.0 * o.accuracy,
                    "accuracy of what was served on time, %",
                ),
            ] {
                let mut f = Figure::new(
                    format!("gpu.memory.{key}.{what}.{pk}"),
                    format!("in memory, {} ({pooled}), {name}: {label}", shape.name()),
                    "%",
                    value,
                );
                f.better = Better::Higher;
                report.figures.push(f);
            }
        }
        // What no schedule can pass, and so the most any can gain over Ekya from SLO
        // attainment: the paper's gain over Ekya is all SLO attainment (1.17x).
        let bound = pct(c.bound.on_time, c.bound.arrived);
        let mut f = Figure::new(
            format!("gpu.memory.{key}.slo.bound"),
            format!(
                "in memory, {} ({pooled}): SLO attainment no schedule can pass (each step's best split of the 7 GPCs, no retraining, no resize cost: compare::slo_bound)",
                shape.name()
            ),
            "%",
            bound,
        );
        f.better = Better::Higher;
        report.figures.push(f);
        let ekya = &c.rows[POLICIES.iter().position(|p| *p == "Ekya").expect("Ekya")];
        let mut f = Figure::new(
            format!("gpu.memory.{key}.slo_gain.bound_over_ekya"),
            format!(
                "in memory, {} ({pooled}): the most any schedule's SLO attainment can be over Ekya's (the bound over Ekya's; the paper's MIGRator: 1.17x, §5.2 Fig. 8a)",
                shape.name()
            ),
            "x",
            bound / pct(ekya.on_time, ekya.arrived).max(1e-9),
        )
        .thesis(PAPER_GAINS.iter().find(|g| g.0 == "ekya").expect("Ekya's").2);
        f.better = Better::Higher;
        report.figures.push(f);
        for (m, e) in c.forecast_mape.iter().enumerate() {
            let mut f = Figure::new(
                format!("gpu.memory.{key}.forecast_mape.tenant{}", m + 1),
                format!(
                    "in memory, {} ({pooled}): MIGRator's forecast error for tenant {} (MAPE over the windows, against the real arrivals)",
                    shape.name(),
                    m + 1
                ),
                "%",
                *e,
            );
            f.better = Better::Lower;
            report.figures.push(f);
        }
        let row = |name: &str| &c.rows[POLICIES.iter().position(|p| *p == name).expect("a policy")];
        for (mine, mk) in [
            ("MIGRator (forecast)", "forecast"),
            ("MIGRator (oracle)", "oracle"),
        ] {
            let m = row(mine);
            for (base, bname) in [("ekya", "Ekya"), ("astraea", "Astraea"), ("paris", "PARIS")] {
                let b = row(bname);
                let paper = PAPER_GAINS
                    .iter()
                    .find(|g| g.0 == base)
                    .expect("a paper gain");
                for ((what, _), ours, theirs) in ratios(m, b)
                    .into_iter()
                    .zip([paper.1, paper.2, paper.3])
                    .map(|((what, ours), theirs)| (what, ours, theirs))
                {
                    let mut f = Figure::new(
                        format!("gpu.memory.{key}.{what}.{mk}_over_{base}"),
                        format!(
                            "in memory, {} ({pooled}): {mine}'s {what} over {bname}'s (the paper: §5.2, Fig. 7 / 8a / 8b)",
                            shape.name()
                        ),
                        "x",
                        ours,
                    )
                    .thesis(theirs);
                    f.better = Better::Higher;
                    report.figures.push(f);
                }
            }
        }
        // Each seed's gains of MIGRator (forecast) over Ekya and PARIS, so that the spread shows.
        for (seed, run) in seeds.iter().zip(&runs) {
            let row =
                |name: &str| &run.rows[POLICIES.iter().position(|p| *p == name).expect("a policy")];
            let m = row("MIGRator (forecast)");
            for (base, bname) in [("ekya", "Ekya"), ("paris", "PARIS")] {
                let paper = PAPER_GAINS
                    .iter()
                    .find(|g| g.0 == base)
                    .expect("a paper gain");
                for ((what, ours), theirs) in ratios(m, row(bname))
                    .into_iter()
                    .zip([paper.1, paper.2, paper.3])
                {
                    let mut f = Figure::new(
                        format!(
                            "gpu.memory.{key}.seed{seed}.{}.forecast_over_{base}",
                            what.0
                        ),
                        format!(
                            "in memory, {}, seed {seed} ({windows} windows): MIGRator (forecast)'s \
                             {} over {bname}'s (the paper: §5.2)",
                            shape.name(),
                            what.1
                        ),
                        "x",
                        ours,
                    )
                    .thesis(theirs);
                    f.better = Better::Higher;
                    report.figures.push(f);
                }
            }
        }
        let mut f = Figure::new(
            format!("gpu.memory.{key}.preinit_reduction"),
            format!(
                "in memory, {} ({pooled}): reconfiguration overhead pre-initialization took off MIGRator's \
                 forecast plans ({} of {} resizes built ahead; phases assumed per model, \
                 gpu/src/migrator/reconfig.rs; the paper: 83%, §5)",
                shape.name(),
                c.preinit.preinitialized,
                c.preinit.resizes
            ),
            "%",
            100.0 * c.preinit.reduction(),
        )
        .thesis(83.0);
        f.better = Better::Higher;
        report.figures.push(f);
        out.push(json!({
            "preinit": {
                "resizes": c.preinit.resizes,
                "preinitialized": c.preinit.preinitialized,
                "lost_s": c.preinit.lost_s,
                "lost_without_s": c.preinit.lost_without_s,
            },
            "shape": key,
            "seeds": seeds,
            "windows": windows,
            "step_s": step_s,
            "forecast_mape": c.forecast_mape,
            "solve_s": c.solve_times.iter().map(|d| d.as_secs_f64()).collect::<Vec<_>>(),
            "rows": POLICIES.iter().zip(&c.rows).map(|(name, o)| json!({
                "policy": name, "arrived": o.arrived, "on_time": o.on_time, "goodput": o.goodput, "accuracy": o.accuracy,
            })).collect::<Vec<_>>(),
        }));
    }
    report.notes.push(format!(
        "MIGRator in memory (gpu.memory.*): every policy evaluated on the real arrivals of {windows} \
         window(s) per shape after {HISTORY_WINDOWS} windows of history, for each of the seeds \
         {seeds:?} (each seed draws other traces of the shape); figures without a seed pool the \
         seeds. MIGRator (forecast) plans from \
         gpu/src/migrator/forecast.rs (Holt-Winters without trend, or exponential smoothing, fitted \
         on the past windows: ours, in place of the paper's Informer); MIGRator (oracle) from the exact \
         arrivals. Each plans with the Psi (reconfiguration overhead per resize) measured in its \
         previous window (for the first, the last window of history), as the paper defines it, and \
         is carried out with pre-initialization: a resize \
         into instances built ahead costs nothing, any other its model's four phases (assumed, \
         gpu/src/migrator/reconfig.rs: 5.6-6.4 s). Its two-stage solve is not exact (it keeps the 10 s \
         first stage's answer where that is better), so the oracle is not a strict upper bound: a \
         smoother forecast can resize less and do better. Ekya decides from the rates it has observed \
         (the last 30 s) by its own average-accuracy objective and, as its paper has it (MPS; P0 \
         §5.1), changes its SM shares at the window's start and at each retraining's start and end \
         without stopping the tenant, every share serving at the assumed MPS interference (0.9, \
         gpu/src/shares.rs: P0 gives no number); 'Ekya (every change stops it)' is the same plan \
         with every share change, shrinks included, stopping the tenant for a full reconfiguration's \
         phases (the baseline of the earlier rounds, not Ekya's paper); 'Ekya \
         (exact future, free changes)' is the thief that reads the window's arrivals. Astraea reads each step's arrivals \
         as they come and changes shares for free; PARIS splits by the window's mean arrivals."
    ));
    Ok(json!({ "mix": "migrator-memory", "shapes": out }))
}

/// The seeds each MIGRator comparison runs, in memory and on the cluster: three at full size
/// (other bursts and noise of the same shape, so that no one draw decides a gain), fewer at
/// the smaller sizes.
fn window_seeds(ctx: &Ctx) -> Vec<u64> {
    (0..ctx.size.pick(1, 1, 3)).collect()
}

/// One seed's window on the cluster: the trace's real arrivals, then each of
/// [`WINDOW_POLICIES`]' problem as planned (its `Ψ`) and what the cluster delivered.
struct SeedWindow {
    seed: u64,
    runs: Vec<(Problem, Served)>,
}

/// MIGRator and the baselines whose schedules are MIG layouts (Ekya's thief rounded to
/// slices, PARIS's static split) on a cluster's GPU: for each trace shape of
/// [`WINDOW_SHAPES`] and each of [`window_seeds`], the first window after
/// [`HISTORY_WINDOWS`] of history, each schedule carried out by MIGRator's executor
/// (pre-initialization, drain before destroy, pinned retraining) through the cluster API.
/// MIGRator plans with the `Ψ` measured along its plan for the window before (P0's
/// definition, [`psi_for`]). Inference replicas are actors of the built-in serving class
/// holding their slices (serving is the simulated part, `Serving`), retraining is an actor of
/// the built-in trainer class on its pinned slice (created at the launch, killed at its end;
/// until this round it was an `escher sim-work` process of the same run time and iterations,
/// so the figures stay comparable: what changed is an actor's creation in place of a
/// process's start), reconfigurations are the worker's. Goodput counts each request served
/// within its SLO at the accuracy of its tenant's model at that time (after retraining once
/// the trainer finished).
pub(super) async fn migrator_on_cluster(
    ctx: &Ctx,
    report: &mut WorkloadReport,
) -> anyhow::Result<serde_json::Value> {
    // A simulated second in wall seconds, and the plan's step: the driver's 25 ms round must
    // stay well under a step.
    let (scale, step_s) = ctx.size.pick((0.01, 10.0), (0.02, 5.0), (0.05, 1.0));
    let seeds = window_seeds(ctx);
    // The smoke test's tiny size runs the first shape alone (the second is the same code).
    let shapes = &WINDOW_SHAPES[..ctx.size.pick(1, WINDOW_SHAPES.len(), WINDOW_SHAPES.len())];
    let mut all = Vec::new();
    for &shape in shapes {
        let mut windows = Vec::new();
        for &seed in &seeds {
            let workload = Workload::new(shape, HISTORY_WINDOWS + 1, 200, seed);
            let window = HISTORY_WINDOWS;
            let p = workload.actual(window, step_s);
            let with_psi = |mut problem: Problem, oracle: bool| -> anyhow::Result<Problem> {
                let psi = psi_for(&workload, window, step_s, oracle)?;
                for (t, psi) in problem.tenants.iter_mut().zip(psi) {
                    t.psi_s = psi;
                }
                Ok(problem)
            };
            let forecast = with_psi(workload.forecast(window, step_s).0, false)?;
            let oracle = with_psi(p.clone(), true)?;
            let past = workload.past(window);
            let mut out = Vec::new();
            let mut runs = Vec::new();
            for (key, name) in WINDOW_POLICIES {
                let given = |schedule| Solved {
                    schedule,
                    objective: 0.0,
                    solve_time: Duration::ZERO,
                    programs: 0,
                };
                // MIGRator's resizes priced by its own plan (`solve_priced`), from the layout
                // the window's first step is realized from.
                let priced = |problem: &Problem| -> anyhow::Result<(Problem, Solved)> {
                    let priced = solve_priced(problem, &Layout::new(p.model), lead_steps(&p))?;
                    // The real arrivals, with the Ψ the schedule was planned with.
                    let mut on = p.clone();
                    for (t, psi) in on.tenants.iter_mut().zip(priced.psi_s) {
                        t.psi_s = psi;
                    }
                    Ok((on, priced.solved))
                };
                let (planned_on, solved) = match key {
                    "migrator_forecast" => priced(&forecast)?,
                    "migrator_oracle" => priced(&oracle)?,
                    "ekya" => (p.clone(), given(online_on_mig(&p, &past, 0.1))),
                    _ => (p.clone(), given(paris(&p))),
                };
                // What the schedule is worth by the plan's evaluation, on the real arrivals.
                let planned = evaluate_mig(&p, &solved.schedule);
                let served = run_window(&planned_on, name, solved, scale).await?;
                out.push(json!({
                    "policy": name,
                    "psi_s": planned_on.tenants.iter().map(|t| t.psi_s).collect::<Vec<_>>(),
                    "cluster": served,
                    "planned": { "arrived": planned.arrived, "on_time": planned.on_time, "goodput": planned.goodput },
                }));
                runs.push((planned_on, served));
            }
            all.push(json!({ "shape": shape.key(), "seed": seed, "runs": out }));
            windows.push(SeedWindow { seed, runs });
        }
        window_figures(shape, step_s, &windows, report);
    }
    report.notes.push(format!(
        "MIGRator on the cluster (gpu.window.*): for each of the shapes {:?} and each of \
         the seeds {seeds:?} (other traces of the shape), the first window after {HISTORY_WINDOWS} \
         windows of history (the assumptions of gpu/src/migrator/workload.rs: capability per GPC, \
         traces, accuracies), {step_s} s steps, a simulated second lasting {scale} s; MIGRator \
         planning from its forecast and from the exact arrivals, Ekya from the rates it has observed \
         (rounded to MIG slices: its share changes are real resizes), PARIS static. Figures without a \
         seed pool the seeds. The paper's gains (§5.2, averages over its 16 workloads on a real \
         A100): goodput +17% over Ekya, from SLO attainment (+17%, Fig. 8a) at similar accuracy; +20% \
         over PARIS, from SLO attainment (+13%) and accuracy (+12%). Read the slo_gain and \
         accuracy_gain figures for where ours comes from.",
        shapes.iter().map(|s| s.key()).collect::<Vec<_>>()
    ));
    report.notes.push(
        "What still differs from the paper, by construction of the simulation more than of escher: \
         (1) MIGRator's program charges each resize a flat Psi per tenant (the paper's Eq. 10), \
         measured along its plan for the window before (reconfiguration phases assumed per model, \
         gpu/src/migrator/reconfig.rs, pre-initialization credited), though on the cluster a \
         resize into instances that already exist costs almost nothing; (2) the traces are \
         synthetic (seeded bursts, noisy waves; the diurnal day compressed to 800 s), the \
         forecaster ours; (3) the 1 s plan comes from a two-stage solve (10 s steps for the \
         retraining, then the inference sizes in chunks of 25 steps), which keeps the one-stage \
         10 s answer where that is better. On the cluster a tenant's old replica serves until its \
         new one does, unless the old instance is in the way of an instance the step creates: the \
         gpu.window.*.unserved figures are the longest time a tenant held no slice, beside the \
         time the executed plan says it leaves it without one."
            .into(),
    );
    Ok(json!({ "mix": "migrator-window", "shapes": all }))
}

/// What [`migrator_on_cluster`] delivered on one shape, as figures and plots: each policy's
/// goodput, SLO attainment, accuracy and longest time without a slice over the seeds pooled,
/// MIGRator's gains over Ekya and PARIS pooled and per seed, and the first seed's goodput and
/// layout over the window.
fn window_figures(shape: Shape, step_s: f64, windows: &[SeedWindow], report: &mut WorkloadReport) {
    let sk = shape.key();
    let first = &windows[0];
    // Goodput, SLO attainment and accuracy over the window, as the paper plots them (§5.2,
    // Fig. 7, 8a and 8b). Per 10 s: goodput in requests/s on time at the accuracy of the moment;
    // the requests served on time over those that arrived; the accuracy of those served on time
    // (the 5 s of draining after the window counted in its last 10 s, as `Served::buckets`
    // counts them).
    type Series = fn(&Served) -> Vec<(f64, f64)>;
    let kinds: [(&str, &str, &str, Series); 3] = [
        (
            "goodput",
            "goodput (requests/s on time, at the accuracy of the moment)",
            "goodput (requests/s)",
            |s| s.goodput_series.clone(),
        ),
        (
            "slo",
            "SLO attainment per 10 s",
            "requests served on time / arrived, %",
            |s| per_bucket(s, true),
        ),
        (
            "accuracy",
            "accuracy of what was served on time per 10 s",
            "accuracy, %",
            |s| per_bucket(s, false),
        ),
    ];
    for (what, label, unit, points) in kinds {
        report.plots.push(Plot {
            file: format!("gpu-window-{what}-{sk}.png"),
            title: format!(
                "One two-tenant window ({}, seed {}) on a cluster's A100: {label}, per policy",
                shape.name(),
                first.seed
            ),
            x_label: "simulated seconds".into(),
            y_label: unit.into(),
            data: PlotData::Lines {
                lines: WINDOW_POLICIES
                    .iter()
                    .zip(&first.runs)
                    .map(|((_, name), (_, s))| Line {
                        name: (*name).into(),
                        points: points(s),
                    })
                    .collect(),
                x_log: false,
            },
        });
    }
    let series = |i: usize, name: &str| Line {
        name: name.into(),
        points: first.runs[0]
            .1
            .allocation
            .iter()
            .map(|(t, g)| (*t, g[i]))
            .collect(),
    };
    report.plots.push(Plot {
        file: format!("gpu-migrator-window-layout-{sk}.png"),
        title: format!(
            "MIGRator (forecast)'s window ({}, seed {}) on a cluster's A100: GPCs of the GPU's layout held by each task over time",
            shape.name(),
            first.seed
        ),
        x_label: "simulated seconds".into(),
        y_label: "GPCs".into(),
        data: PlotData::Lines {
            lines: vec![
                series(0, "inference, tenant 1"),
                series(1, "inference, tenant 2"),
                series(2, "retraining, tenant 1"),
                series(3, "retraining, tenant 2"),
            ],
            x_log: false,
        },
    });
    let seeds: Vec<u64> = windows.iter().map(|w| w.seed).collect();
    let outcome = |s: &Served| PolicyOutcome {
        goodput: s.goodput,
        on_time: s.on_time,
        arrived: s.arrived,
        accuracy: s.goodput / s.on_time.max(1e-9),
    };
    let pct = |x: f64, of: f64| 100.0 * x / of.max(1e-9);
    let mut pooled = vec![PolicyOutcome::default(); WINDOW_POLICIES.len()];
    for (i, ((key, name), total)) in WINDOW_POLICIES.iter().zip(&mut pooled).enumerate() {
        let mut reconfigurations = 0;
        // The longest time a tenant held no slice, over the seeds: (seed, tenant, s, planned, Ψ).
        let mut worst = (first.seed, 0, -1.0, 0.0, 0.0);
        for w in windows {
            let (p, s) = &w.runs[i];
            total.add(outcome(s));
            reconfigurations += s.reconfigurations;
            let (tenant, gap) = longest_without_inference(&s.allocation);
            if gap > worst.2 {
                let planned = s.planned_unserved.get(tenant).copied().unwrap_or(0.0);
                worst = (w.seed, tenant, gap, planned, p.tenants[tenant].psi_s);
            }
        }
        let what = format!(
            "one 200 s two-tenant window ({}, seeds {seeds:?} pooled) on the cluster's A100 ({step_s} s steps), {name}",
            shape.name()
        );
        let mut g = Figure::new(
            format!("gpu.window.{sk}.goodput.{key}"),
            format!(
                "{what}: goodput (on time and at the accuracy of the moment), % of arrivals ({reconfigurations} reconfigurations)"
            ),
            "%",
            pct(total.goodput, total.arrived),
        );
        g.better = Better::Higher;
        report.figures.push(g);
        let mut slo = Figure::new(
            format!("gpu.window.{sk}.slo.{key}"),
            format!("{what}: SLO attainment (requests served within the SLO), %"),
            "%",
            pct(total.on_time, total.arrived),
        );
        slo.better = Better::Higher;
        report.figures.push(slo);
        let mut acc = Figure::new(
            format!("gpu.window.{sk}.accuracy.{key}"),
            format!(
                "{what}: accuracy of the requests served within the SLO (goodput / on time), %"
            ),
            "%",
            100.0 * total.accuracy,
        );
        acc.better = Better::Higher;
        report.figures.push(acc);
        let (seed, tenant, gap, planned, psi) = worst;
        let mut down = Figure::new(
            format!("gpu.window.{sk}.unserved.{key}"),
            format!(
                "{what}: longest time a tenant (seed {seed}, tenant {}) held no inference slice, against the {planned} s the executed plan leaves it without a replica (its resizes whose old instances are in the way of the new ones; {psi:.2} s per resize in the plan's program)",
                tenant + 1,
            ),
            "s (simulated)",
            gap.max(0.0),
        );
        down.better = Better::Lower;
        report.figures.push(down);
    }
    let at = |key: &str| {
        WINDOW_POLICIES
            .iter()
            .position(|(k, _)| *k == key)
            .expect("a policy")
    };
    for (mine, mk) in [
        ("migrator_forecast", "forecast"),
        ("migrator_oracle", "oracle"),
    ] {
        for base in ["ekya", "paris"] {
            let paper = PAPER_GAINS
                .iter()
                .find(|g| g.0 == base)
                .expect("a paper gain");
            let paper = [paper.1, paper.2, paper.3];
            let mut push = |key: String, label: String, ours: f64, theirs: f64| {
                let mut f = Figure::new(key, label, "x", ours).thesis(theirs);
                f.better = Better::Higher;
                report.figures.push(f);
            };
            for (((what, label), ours), theirs) in ratios(&pooled[at(mine)], &pooled[at(base)])
                .into_iter()
                .zip(paper)
            {
                push(
                    format!("gpu.window.{sk}.{what}.{mk}_over_{base}"),
                    format!(
                        "MIGRator ({mk})'s {label} / {base}'s on the cluster, same windows ({}, seeds {seeds:?} pooled)",
                        shape.name()
                    ),
                    ours,
                    theirs,
                );
            }
            for w in windows {
                let (m, b) = (outcome(&w.runs[at(mine)].1), outcome(&w.runs[at(base)].1));
                for (((what, label), ours), theirs) in ratios(&m, &b).into_iter().zip(paper) {
                    push(
                        format!("gpu.window.{sk}.seed{}.{what}.{mk}_over_{base}", w.seed),
                        format!(
                            "MIGRator ({mk})'s {label} / {base}'s on the cluster, same window ({}, seed {})",
                            shape.name(),
                            w.seed
                        ),
                        ours,
                        theirs,
                    );
                }
            }
        }
    }
}

/// `served`'s SLO attainment (`slo`) or accuracy per 10 simulated seconds, %: (end of the 10 s,
/// value), over both tenants, the draining after the window counted in the last 10 s.
fn per_bucket(served: &Served, slo: bool) -> Vec<(f64, f64)> {
    let n = served.buckets.first().map_or(0, Vec::len);
    (0..n)
        .filter_map(|i| {
            let on_time: f64 = served.buckets.iter().map(|b| b[i].on_time).sum();
            let value = if slo {
                let arrived: f64 = served.buckets.iter().map(|b| b[i].arrived).sum();
                (arrived > 0.0).then(|| 100.0 * on_time / arrived)
            } else {
                // Goodput per 10 s (requests/s): the draining 10 s folded into the last.
                let goodput: f64 = served
                    .goodput_series
                    .iter()
                    .skip(i)
                    .take(if i + 1 == n { usize::MAX } else { 1 })
                    .map(|(_, g)| 10.0 * g)
                    .sum();
                (on_time > 0.0).then(|| 100.0 * goodput / on_time)
            };
            value.map(|v| (10.0 * (i + 1) as f64, v))
        })
        .collect()
}

/// The tenant that went longest without an inference slice in `allocation` (per round: the
/// time, then each tenant's inference GPCs first), and for how long, simulated seconds.
fn longest_without_inference(allocation: &[(f64, Vec<f64>)]) -> (usize, f64) {
    let tenants = allocation.first().map_or(0, |(_, g)| g.len() / 2);
    let mut worst = (0, 0.0f64);
    for m in 0..tenants {
        let mut since: Option<f64> = None;
        for (t, g) in allocation {
            match (g[m] > 0.0, since) {
                (false, None) => since = Some(*t),
                (true, Some(from)) => {
                    if t - from > worst.1 {
                        worst = (m, t - from);
                    }
                    since = None;
                }
                _ => {}
            }
        }
        if let (Some(from), Some((end, _))) = (since, allocation.last())
            && end - from > worst.1
        {
            worst = (m, end - from);
        }
    }
    worst
}

/// Runs `solved` (a schedule of `p`) for one window on a fresh cluster; what it delivered.
///
/// The window starts warm, as one in a sequence does: the GPU already has the layout of the
/// plan's first step and each tenant serves on that step's instances (so no policy pays for
/// leaving an arbitrary starting split).
async fn run_window(p: &Problem, name: &str, solved: Solved, scale: f64) -> anyhow::Result<Served> {
    let first = {
        let tasks = vec![
            TenantTasks {
                inference: TaskId(0),
                retraining: TaskId(0),
            };
            p.tenants.len()
        ];
        let cold = Layout::parse(p.model, "3g.20gb@0,3g.20gb@4")?;
        let plan = Migrator::execute(name, p, solved.clone(), tasks, &cold, 0, true)?;
        plan.plan().steps[0].assignment.clone()
    };
    let gpu_spec = format!("a100-40gb:mig={}", first.layout);
    let (cluster, client, node) = gpu_cluster(&gpu_spec, scale).await?;
    let mut gpu = ClusterGpu::new(client.clone(), node, 0)
        .await?
        .with_time_scale(scale);
    // Each replica is an actor of the built-in serving class on its slice: drained, told what
    // it served and killed before its slice goes, made again on the next one.
    let replica = Task::actor_typed(SERVING_REPLICA_CLASS, &0u64).build()?;
    let mut services = Vec::new();
    for t in &p.tenants {
        let model = InferenceModel {
            per_gpc_rps: t.capability[1],
            slo_ms: 1000,
        };
        services.push(gpu.add_service(model, replica.clone()).await?);
    }
    // Each retraining is a trainer actor on its pinned slice, as long there as the plan
    // expects (the iterations `sim-work` ran it in before).
    let jobs = (0..p.tenants.len())
        .map(|m| {
            let r = solved.schedule.retraining[m];
            let work = p.tenants[m].retrain_s[usize::from(r.gpcs)] * f64::from(r.gpcs) / 7.0;
            let args = TrainerArgs {
                job: 0,
                work_s: work,
                gpcs: 7,
                mem_gb: 2.0,
                iterations: iterations(&JobModel::fixed(work, 7, 2.0)),
                scale,
            };
            Ok(Task::actor_typed(TRAINER_CLASS, &args).build()?)
        })
        .collect::<anyhow::Result<Vec<TaskSpec>>>()?;
    let retraining = gpu.submit(jobs).await?;
    let tasks: Vec<TenantTasks> = services
        .iter()
        .zip(&retraining)
        .map(|(i, r)| TenantTasks {
            inference: *i,
            retraining: *r,
        })
        .collect();
    let start = first.layout.clone();
    for (service, replicas) in services.iter().zip(&first.inference) {
        for on in replicas {
            gpu.bind_serving(*service, *on, Duration::from_secs(10))
                .await?;
        }
    }
    let t0 = gpu.now();
    let schedule = solved.schedule.clone();
    let mut executor = Migrator::execute(name, p, solved, tasks, &start, t0, true)?;
    let plan = executor.plan().clone();
    let planned_unserved: Vec<f64> = (0..p.tenants.len())
        .map(|m| executor.plan().exposed_s(m))
        .collect();
    let mut timed = Timed {
        inner: &mut executor,
        finished: BTreeMap::new(),
    };
    // Per round: the time, each tenant's on-time count so far, and the GPCs each task holds.
    let mut samples: Vec<(u64, Vec<f64>)> = Vec::new();
    let mut allocation: Vec<(f64, Vec<f64>)> = Vec::new();
    let holders: Vec<TaskId> = services.iter().chain(&retraining).copied().collect();
    let mut last = t0;
    let window_ms = u64::from(p.window_s) * 1000;
    let feed = |gpu: &mut ClusterGpu<escher::Client>| {
        let now = gpu.now();
        let sec = (now.saturating_sub(t0) / 1000) as usize;
        let dt = now.saturating_sub(last) as f64 / 1000.0;
        last = now;
        if now < t0 + window_ms {
            for (m, service) in services.iter().enumerate() {
                gpu.arrive(*service, p.tenants[m].forecast[sec] * dt);
            }
        }
        let on_time = services
            .iter()
            .map(|s| gpu.service_stats(*s).map_or(0.0, |st| st.on_time))
            .collect();
        samples.push((now, on_time));
        let view = gpu.view();
        let gpcs = holders
            .iter()
            .map(|task| {
                view.held_by(*task)
                    .iter()
                    .map(|p| f64::from(p.profile.compute))
                    .sum()
            })
            .collect();
        allocation.push((now.saturating_sub(t0) as f64 / 1000.0, gpcs));
    };
    // The window and 5 s for the queues, in wall time since the GPU's clock began.
    let until = Duration::from_secs_f64((t0 as f64 / 1000.0 + f64::from(p.window_s) + 5.0) * scale);
    let drove = drive_with(&mut timed, &mut gpu, until, feed).await?;
    anyhow::ensure!(
        drove.refused.is_empty() && drove.failed.is_empty(),
        "{name} on the cluster: {drove:?}"
    );
    let mut served = Served {
        reconfigurations: drove.reconfigurations,
        allocation,
        planned_unserved,
        ..Served::default()
    };
    let mut buckets = vec![0.0; p.window_s.div_ceil(10) as usize + 1];
    let n_buckets = p.window_s.div_ceil(10) as usize;
    for (m, service) in services.iter().enumerate() {
        let st = gpu
            .service_stats(*service)
            .ok_or_else(|| anyhow::anyhow!("no service {service}"))?;
        served.arrived += st.arrived;
        served.on_time += st.on_time;
        served.expired.push(st.expired);
        let mut mine = vec![Bucket::default(); n_buckets];
        for s in 0..p.steps() {
            let b = &mut mine[((s as f64 * p.step_s / 10.0) as usize).min(n_buckets - 1)];
            let k = schedule.inference[m][s];
            b.arrived += p.arrivals(m, s);
            b.planned += p.arrivals(m, s).min(p.capacity(m, k));
            b.replicas = b.replicas.max(plan.steps[s].assignment.inference[m].len());
            b.resized |= s > 0 && schedule.inference[m][s - 1] != k;
        }
        let mut before = 0.0;
        for (at, on_time) in &samples {
            let i = (at.saturating_sub(t0) / 10_000) as usize;
            mine[i.min(n_buckets - 1)].on_time += on_time[m] - before;
            before = on_time[m];
        }
        served.buckets.push(mine);
        let retrained = timed
            .finished
            .get(&retraining[m])
            .copied()
            .unwrap_or(u64::MAX);
        let t = &p.tenants[m];
        let mut before = 0.0;
        for (at, on_time) in &samples {
            let delta = on_time[m] - before;
            before = on_time[m];
            let accuracy = if *at >= retrained {
                t.acc_post
            } else {
                t.acc_pre
            };
            served.goodput += delta * accuracy;
            let bucket = (at.saturating_sub(t0) / 10_000) as usize;
            if let Some(b) = buckets.get_mut(bucket) {
                *b += delta * accuracy;
            }
        }
    }
    served.goodput_series = buckets
        .iter()
        .enumerate()
        .map(|(i, g)| (10.0 * (i + 1) as f64, g / 10.0))
        .collect();
    gpu.stop_services().await?;
    cluster.shutdown().await;
    Ok(served)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_stretch_without_an_inference_slice() {
        // Two tenants, then two retrainings: tenant 2 holds nothing from 72 s to 90 s.
        let alloc = |t: f64, a: f64, b: f64| (t, vec![a, b, 0.0, 0.0]);
        let allocation = [
            alloc(0.0, 3.0, 2.0),
            alloc(72.0, 3.0, 0.0),
            alloc(80.0, 0.0, 0.0),
            alloc(84.0, 3.0, 0.0),
            alloc(90.0, 3.0, 1.0),
            alloc(200.0, 3.0, 1.0),
        ];
        assert_eq!(longest_without_inference(&allocation), (1, 18.0));
        assert_eq!(longest_without_inference(&[]), (0, 0.0));
    }

    #[test]
    fn slo_attainment_and_accuracy_per_10_s_are_over_both_tenants() {
        let bucket = |arrived, on_time| Bucket {
            arrived,
            on_time,
            ..Bucket::default()
        };
        // Two 10 s buckets and the 5 s of draining after them (goodput, requests/s).
        let served = Served {
            buckets: vec![
                vec![bucket(100.0, 90.0), bucket(50.0, 50.0)],
                vec![bucket(100.0, 70.0), bucket(0.0, 10.0)],
            ],
            goodput_series: vec![(10.0, 12.0), (20.0, 4.0), (30.0, 0.5)],
            ..Served::default()
        };
        // 160 of 200 on time, then 60 of 50 (the last 10 s serves what queued before).
        assert_eq!(per_bucket(&served, true), vec![(10.0, 80.0), (20.0, 120.0)]);
        // 120 of accuracy-weighted goodput over 160 on time; then (40 + 5) over 60.
        assert_eq!(per_bucket(&served, false), vec![(10.0, 75.0), (20.0, 75.0)]);
    }
}
