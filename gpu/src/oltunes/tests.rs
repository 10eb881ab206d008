//! OLTunes' decisions on hand-checkable cases, and its paper's comparison in direction.

use super::baselines::{Mlaas, Orion, default_batch};
use super::compare::{compare, compare_at, predictor_accuracy, profile, table};
use super::predictor::{Fm, FtrlConfig, Predictor, Retrain, Sample};
use super::sched::{
    OlTunes, W_MAX_MS, W_MIN_MS, adjust_window, affinity, is_affinity_high, variant_affinity,
};
use super::sim::{GpuState, Launch, Scheduler, simulate};
use super::task::{Class, GpuType, Pattern, Task, interference, models, testbed, workload};
use super::tuner::{Record, autotune, candidates, epc};

fn model(name: &str) -> super::task::Model {
    *models().iter().find(|m| m.name == name).unwrap()
}

#[test]
fn lambda_decides_the_class() {
    assert_eq!(Class::of(0.51), Class::Lc);
    assert_eq!(Class::of(0.99), Class::Lc);
    assert_eq!(Class::of(0.5), Class::To);
    assert_eq!(Class::of(0.01), Class::To);
    // 90% of vision tasks LC, 90% of NLP tasks TO (§4.1), within sampling error.
    let tasks = workload(Pattern::Poisson, 20, 1);
    let ms = models();
    let vision: Vec<&Task> = tasks
        .iter()
        .filter(|t| ms[t.model].domain == super::task::Domain::Vision)
        .collect();
    let lc = vision.iter().filter(|t| t.class() == Class::Lc).count() as f64;
    let share = lc / vision.len() as f64;
    assert!((0.87..0.93).contains(&share), "{share}");
}

#[test]
fn affinity_follows_eqs_9_to_11() {
    let (r18, r152, yx, gpt) = (
        model("ResNet-18"),
        model("ResNet-152"),
        model("YOLOv5x"),
        model("GPT-2"),
    );
    assert_eq!(variant_affinity(&r152, &gpt), 0.0);
    assert_eq!(variant_affinity(&r18, &gpt), 100.0);
    // High + high never passes (workload affinity < 100, variant 0).
    assert!(!is_affinity_high(&yx, &[&gpt]));
    // High + low always passes (≥ 75).
    assert!(is_affinity_high(&r18, &[&gpt]));
    // ResNet-18 (3.0) with GPT-2 (0.3): sigmoid(2.7)·100 = 93.7, variant 100 → 96.9.
    let a = affinity(&r18, &[&gpt]);
    assert!((a - (100.0 / (1.0 + (-2.7f64).exp()) + 100.0) / 2.0).abs() < 1e-9);
    // Low + low needs |Δratio| ≥ ln 9 ≈ 2.2: ResNet-18 with ResNet-50 (Δ 1.0) fails.
    assert!(!is_affinity_high(&r18, &[&model("ResNet-50")]));
    assert!(is_affinity_high(&r18, &[]));
}

#[test]
fn the_window_moves_by_w_between_its_bounds() {
    assert_eq!(adjust_window(8, 2, 100), 90, "LC share 0.8 > 0.7 shrinks");
    assert_eq!(adjust_window(7, 3, 100), 110, "0.7 is not above ρ");
    assert_eq!(adjust_window(9, 0, W_MIN_MS), W_MIN_MS);
    assert_eq!(adjust_window(0, 9, W_MAX_MS), W_MAX_MS);
    // Nothing waits: the LC ratio is 0/0 and the window stays where it is.
    assert_eq!(adjust_window(0, 0, 100), 100);
    assert_eq!(adjust_window(0, 0, W_MIN_MS), W_MIN_MS);
}

#[test]
fn interference_reproduces_table_1() {
    let (ci, mi) = (model("ResNet-50"), model("BERT-base"));
    // Two equal tasks co-running take (1 + ι) of one: the table's co-located/sequential ratio.
    assert!(((interference(&ci, &[&ci])) / 2.0 - 2.35 / 2.3).abs() < 1e-9);
    assert!(((interference(&mi, &[&mi])) / 2.0 - 1.45 / 1.6).abs() < 1e-9);
    assert!(((interference(&ci, &[&mi])) / 2.0 - 1.3 / 1.9).abs() < 1e-9);
}

#[test]
fn epc_reproduces_the_worked_example() {
    // §3.3.3: GPU_A 300 W 16 GB, GPU_B 200 W 12 GB; our types stand in only for the formula.
    let a = 60.0 + (300.0 - 60.0) * 0.7 * (8.0 / 16.0) * 12.0;
    let b = 60.0 + (200.0 - 60.0) * 0.7 * (6.0 / 12.0) * 19.0;
    assert_eq!((a, b), (1068.0, 991.0));
    // Ours on the A100: 60 + 190 · 0.5 · (20/40) · 2 = 155.
    assert!((epc(GpuType::A100, 50.0, 20.0, 2.0) - 155.0).abs() < 1e-9);
}

#[test]
fn ftrl_fm_learns_an_interaction() {
    // y = x0·x1 (a pure pairwise interaction a linear model cannot fit).
    let mut fm = Fm::new(4, FtrlConfig::default(), 7);
    let data: Vec<(Vec<(usize, f64)>, f64)> = vec![
        (vec![(0, 1.0), (1, 1.0)], 1.0),
        (vec![(0, 1.0), (2, 1.0)], 0.0),
        (vec![(3, 1.0), (1, 1.0)], 0.0),
        (vec![(3, 1.0), (2, 1.0)], 0.0),
    ];
    for _ in 0..2000 {
        for (x, y) in &data {
            fm.learn(x, *y);
        }
    }
    let err: f64 = data.iter().map(|(x, y)| (fm.predict(x) - y).powi(2)).sum();
    assert!(err < 0.05, "{err}");
}

#[test]
fn the_predictor_beats_the_mean_and_prints_table_8s_metrics() {
    let (rmse, r2, mean_rmse) = predictor_accuracy(1400, 300, 3);
    println!(
        "FM-FTRL on ~1,400 samples: RMSE(ln ms) {rmse:.3}, R² {r2:.3}; mean predictor RMSE {mean_rmse:.3}"
    );
    assert!(
        rmse < 0.5 * mean_rmse && r2 > 0.7,
        "{rmse} {r2} {mean_rmse}"
    );
}

#[test]
fn the_evaluator_retrains_when_the_error_passes_theta() {
    let ms = models();
    let quick = Retrain {
        window: 5,
        ..Retrain::default()
    };
    let mut p = Predictor::new(ms.clone(), FtrlConfig::default(), quick, 1);
    p.pretrain(&profile(&ms, 1), 20);
    // The GPU turns out 3× slower than profiled (a new driver, say): errors pass θ.
    let mut retrained = false;
    for i in 0..60 {
        let b = [1, 8, 32][i % 3];
        retrained |= p.observe(Sample {
            model: 0,
            gpu: GpuType::A30,
            batch: b,
            sm_pct: 100.0,
            latency_ms: 3.0 * ms[0].batch_ms(GpuType::A30, b, 100.0),
        });
    }
    assert!(retrained && p.retrains() >= 1);
    let (lat, _) = p.predict(0, GpuType::A30, 8, 100.0);
    let truth = 3.0 * ms[0].batch_ms(GpuType::A30, 8, 100.0);
    assert!((lat / truth).ln().abs() < 0.3, "{lat} vs {truth}");
    // Accurate observations never retrain.
    let mut q = Predictor::new(ms.clone(), FtrlConfig::default(), quick, 1);
    q.pretrain(&profile(&ms, 1), 20);
    for _ in 0..40 {
        q.observe(Sample {
            model: 3,
            gpu: GpuType::A100,
            batch: 8,
            sm_pct: 100.0,
            latency_ms: q.predict(3, GpuType::A100, 8, 100.0).0,
        });
    }
    assert_eq!(q.retrains(), 0);
}

#[test]
fn candidates_keep_two_types_and_the_tuner_raises_one_batch() {
    let ms = models();
    let mut p = Predictor::new(ms.clone(), FtrlConfig::default(), Retrain::default(), 2);
    p.pretrain(&profile(&ms, 2), 20);
    let task = Task {
        id: 0,
        model: 3,
        lambda: 0.2,
        inputs: 64,
        arrival_ms: 0,
        deadline_ms: 150.0 * 64.0,
    };
    let c = candidates(&p, &ms[3], &task, &GpuType::ALL, 0.0);
    assert_eq!(c.top.len(), 2);
    assert!(c.records.iter().all(|r| c.top.contains(&r.gpu)));
    let g = c.top[0];
    // Start the TO task at batch 1; with memory left the tuner raises its batch size.
    let one = *c.on(g).find(|r| r.batch == 1).unwrap();
    let other = Record { ..one };
    let mut group = vec![(false, &c, other), (true, &c, one)];
    let tuned = autotune(&mut group, g, 20.0);
    assert_eq!(tuned, Some(1), "TO first");
    assert!(group[1].2.batch > 1 && group[1].2.throughput > one.throughput);
    assert_eq!(group[0].2, other, "one task a group");
    // No memory left: nothing is tuned.
    let mut group = vec![(true, &c, one)];
    assert_eq!(autotune(&mut group, g, 0.0), None);
}

#[test]
fn a_group_is_filled_lc_first_and_assigned_to_the_emptiest_gpu() {
    let ms = models();
    let gpus = vec![GpuType::A100, GpuType::A100];
    let mut s = OlTunes::new(ms.clone(), &gpus, &profile(&ms, 4), 4);
    let state = |busy: bool| -> Vec<GpuState> {
        let mut v: Vec<GpuState> = gpus
            .iter()
            .map(|g| GpuState {
                ty: *g,
                running: Vec::new(),
            })
            .collect();
        if busy {
            v[0].running.push(super::sim::Running::placeholder(0, 30.0));
        }
        v
    };
    let st = state(true);
    let t = |id, model, lambda: f64| Task {
        id,
        model,
        lambda,
        inputs: 4,
        arrival_ms: 0,
        deadline_ms: 1000.0,
    };
    // A TO GPT-2 (MI, high) and an LC ResNet-18 (CI, low): affine.
    s.arrive(&t(0, 7, 0.2), 0, &st);
    s.arrive(&t(1, 0, 0.9), 0, &st);
    let mut out = Vec::new();
    s.step(0, &st, &mut out);
    assert!(out.is_empty(), "the window is open and the group not full");
    for now in (10..=super::sched::W_MIN_MS).step_by(10) {
        s.step(now, &st, &mut out);
    }
    let ids: Vec<usize> = out.iter().map(|l| l.task).collect();
    assert_eq!(ids, vec![1, 0], "LC first");
    assert!(out.iter().all(|l| l.gpu == 1), "GPU 0 is busy: {out:?}");
    // A refused assignment comes back first, and shrinks the window and the group size.
    let before = s.batch_size_max;
    s.refused(out[1], 60);
    assert_eq!(s.batch_size_max, before - 1);
}

/// Two LC ResNet-18 tasks (both CI with ratio 3.0, both the low variant) fail the affinity
/// check together: Eq. 9 gives 100·sigmoid(0) = 50, Eq. 11 low+low 50, mean 50 < 70. With two
/// empty A100s they must not co-start: the second opens its group on the other GPU, since a
/// GPU a group is being formed for is not empty (Algorithm 2 forms one batch per target GPU).
/// With one A100 only, it is occupied by the first group and more than 80% free, so the
/// second co-starts there by §3.4.1's rule for occupied GPUs rather than wait.
#[test]
fn a_task_that_fails_affinity_does_not_co_start_while_a_gpu_is_empty() {
    let ms = models();
    let r18 = model("ResNet-18");
    assert!(!is_affinity_high(&r18, &[&r18]));
    let t = |id| Task {
        id,
        model: 0,
        lambda: 0.9,
        inputs: 4,
        arrival_ms: 0,
        deadline_ms: 10.0,
    };
    let launches = |gpus: &[GpuType]| {
        let mut s = OlTunes::new(ms.clone(), gpus, &profile(&ms, 4), 4);
        let st: Vec<GpuState> = gpus
            .iter()
            .map(|g| GpuState {
                ty: *g,
                running: Vec::new(),
            })
            .collect();
        s.arrive(&t(0), 0, &st);
        s.arrive(&t(1), 0, &st);
        let mut out = Vec::new();
        for now in (0..=super::sched::W_MIN_MS).step_by(10) {
            s.step(now, &st, &mut out);
        }
        let mut on: Vec<(usize, usize)> = out.iter().map(|l| (l.task, l.gpu)).collect();
        on.sort();
        on
    };
    assert_eq!(
        launches(&[GpuType::A100, GpuType::A100]),
        vec![(0, 0), (1, 1)]
    );
    assert_eq!(launches(&[GpuType::A100]), vec![(0, 0), (1, 0)]);
}

#[test]
fn baselines_place_only_where_tasks_fit_and_mlaas_reserves_a100s() {
    let ms = models();
    let gpus = testbed();
    let tasks = workload(Pattern::Poisson, 5, 9);
    for s in [
        &mut Mlaas::new(ms.clone()) as &mut dyn Scheduler,
        &mut Orion::new(ms.clone()),
    ] {
        let trace = simulate(s, &gpus, &tasks, &ms, 15_000, 9);
        assert_eq!(trace.refused, 0, "{}", s.name());
        if s.name().starts_with("MLaaS") {
            for (t, o) in tasks.iter().zip(&trace.outcomes) {
                if let Some(g) = o.gpu {
                    assert_eq!(gpus[g].high_end(), !ms[t.model].size.small());
                }
            }
        }
    }
    assert_eq!(
        default_batch(&Task {
            id: 0,
            model: 0,
            lambda: 0.9,
            inputs: 5,
            arrival_ms: 0,
            deadline_ms: 1.0
        }),
        8
    );
    let _ = Launch {
        task: 0,
        gpu: 0,
        batch: 1,
        sm_pct: 1.0,
    };
}

#[test]
fn the_same_seed_gives_the_same_numbers() {
    assert_eq!(
        compare(Pattern::Poisson, 4, 5),
        compare(Pattern::Poisson, 4, 5)
    );
}

/// The paper's comparison in direction (§4.2.2–4.2.3) on its stress test: a seeded Poisson
/// workload at 4× Table 7's rates (at 1× our simulated testbed is mostly idle and the
/// directions do not hold: see README.md). OLTunes violates fewer SLOs than both baselines
/// (Fig. 14: "up to 92% fewer"); under MLaaS the small models (S, M) queue far longer
/// (Fig. 11a: 112×) and their p99 is far longer (about 60×). Run with `--nocapture` for the
/// table; what does not hold (p99 against Orion, utilization swings) is printed, not asserted.
#[test]
fn oltunes_beats_its_baselines_in_the_papers_direction() {
    let rows = compare_at(Pattern::Poisson, 20, 42, 4.0);
    println!("{}", table(Pattern::Poisson, &rows));
    let (olt, mlaas, orion) = (&rows[0], &rows[1], &rows[2]);
    assert!(olt.all.slo_violation < mlaas.all.slo_violation, "{rows:#?}");
    assert!(olt.all.slo_violation < orion.all.slo_violation, "{rows:#?}");
    assert!(
        olt.small.queue_ms * 10.0 < mlaas.small.queue_ms,
        "{rows:#?}"
    );
    assert!(olt.small.p99_ms * 5.0 < mlaas.small.p99_ms, "{rows:#?}");
    assert_eq!(mlaas.refused + orion.refused, 0);
    // OLTunes' refused assignments (a group bound to a GPU that filled meanwhile) go back to
    // Q_LC by feedback and finish.
    assert_eq!(olt.all.unfinished, 0);
}

/// Three seeds of every pattern at Table 7's rates and at 4× them (the numbers README.md
/// quotes): at 4× OLTunes violates fewer SLOs than both baselines on every seed and pattern,
/// and no baseline launch is ever refused. Slow in a debug build, hence ignored; run it with
/// `cargo test -p escher-gpu --lib oltunes::tests::every_pattern -- --ignored --nocapture`.
#[test]
#[ignore = "about a minute in a debug build"]
fn every_pattern_three_seeds() {
    for run in super::compare::runs(&[1.0, 4.0], &[42, 7, 1], 20) {
        println!("load {}x, seed {}", run.load, run.seed);
        println!("{}", table(run.pattern, &run.rows));
        let (olt, mlaas, orion) = (&run.rows[0], &run.rows[1], &run.rows[2]);
        assert_eq!(mlaas.refused + orion.refused, 0);
        if run.load >= 4.0 {
            assert!(
                olt.all.slo_violation < mlaas.all.slo_violation.min(orion.all.slo_violation),
                "{run:#?}"
            );
        }
    }
}

/// Records every launch a scheduler makes (the last one of a task is the one that ran) and,
/// for OLTunes, the largest `W_time` it reached.
struct Recorder<S> {
    inner: S,
    launches: std::collections::BTreeMap<usize, Launch>,
    w_max: u64,
    w: fn(&S) -> u64,
}

impl<S: Scheduler> Scheduler for Recorder<S> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn arrive(&mut self, task: &Task, now: u64, gpus: &[GpuState]) {
        self.inner.arrive(task, now, gpus);
    }
    fn step(&mut self, now: u64, gpus: &[GpuState], out: &mut Vec<Launch>) {
        let from = out.len();
        self.inner.step(now, gpus, out);
        for l in &out[from..] {
            self.launches.insert(l.task, *l);
        }
        self.w_max = self.w_max.max((self.w)(&self.inner));
    }
    fn refused(&mut self, launch: Launch, now: u64) {
        self.inner.refused(launch, now);
    }
    fn finished(&mut self, task: usize, sample: Sample) {
        self.inner.finished(task, sample);
    }
}

/// One line of [`where_violations_come_from`] for one scheduler on `tasks`.
fn violation_line<S: Scheduler>(mut r: Recorder<S>, tasks: &[Task], seed: u64) -> String {
    let ms = models();
    let gpus = testbed();
    let horizon = (20 + super::compare::DRAIN_S) * 1000;
    let trace = simulate(&mut r, &gpus, tasks, &ms, horizon, seed);
    let mut viol = 0;
    let mut by_co = [(0, 0); 4];
    let mut unaffine = (0, 0);
    let mut solo_late = 0;
    let mut early = 0;
    for (t, o) in tasks.iter().zip(&trace.outcomes) {
        let (Some(st), Some(en), Some(g)) = (o.start_ms, o.end_ms, o.gpu) else {
            viol += 1;
            continue;
        };
        let co: Vec<&super::task::Model> = tasks
            .iter()
            .zip(&trace.outcomes)
            .filter(|(u, p)| {
                u.id != t.id
                    && p.gpu == Some(g)
                    && p.start_ms.is_some_and(|a| a <= st)
                    && p.end_ms.is_none_or(|b| b > st)
            })
            .map(|(u, _)| &ms[u.model])
            .collect();
        let n = co.len().min(3);
        let bad = !is_affinity_high(&ms[t.model], &co);
        by_co[n].1 += 1;
        unaffine.1 += usize::from(bad);
        if (en - st) as f64 <= t.deadline_ms {
            continue;
        }
        viol += 1;
        by_co[n].0 += 1;
        unaffine.0 += usize::from(bad);
        let l = r.launches[&t.id];
        let solo = f64::from(t.inputs.div_ceil(l.batch))
            * ms[t.model].batch_ms(gpus[g], l.batch, l.sm_pct);
        solo_late += usize::from(solo > t.deadline_ms);
        early += usize::from(st < 1000);
    }
    let co: Vec<String> = by_co.iter().map(|(v, n)| format!("{v} ({n})")).collect();
    format!(
        "{}: {viol}/{} | {} | {}/{} | {solo_late} | {early} | {}",
        r.name(),
        tasks.len(),
        co.join(" / "),
        unaffine.0,
        unaffine.1,
        r.w_max,
    )
}

/// Where the SLO violations at Table 7's rates (1x) come from, for each scheduler, uniform and
/// Poisson arrivals, seeds 42, 7, 1: every violation is counted by the number of tasks already
/// on its GPU when it started (0–3 or more, tasks in brackets), by whether those co-runners
/// pass `isAffinityHigh` with it (§3.4.2), by whether its batch and SM share alone (without
/// interference) already exceed its deadline (the auto-tuner's choice on a prediction), and
/// by whether it began in the first second; and the largest `W_time` OLTunes reached.
/// Printed, not asserted; README.md quotes it. Run with
/// `cargo test -p escher-gpu --lib oltunes::tests::where_violations_come_from -- --ignored --nocapture`.
#[test]
#[ignore = "a breakdown to read"]
fn where_violations_come_from() {
    let ms = models();
    println!(
        "pattern seed scheduler: violations/tasks | violations (tasks) by co-runners at start \
         0 / 1 / 2 / 3+ | beside co-runners failing isAffinityHigh: violations/tasks | solo at \
         its batch and SM past the deadline | started in the first second | max W_time ms"
    );
    for pattern in [Pattern::Uniform, Pattern::Poisson] {
        for seed in [42, 7, 1] {
            let tasks = super::task::workload_at(pattern, 20, seed, 1.0);
            let gpus = testbed();
            let olt = OlTunes::new(ms.clone(), &gpus, &profile(&ms, seed ^ 0x5eed), seed);
            let lines = [
                violation_line(
                    Recorder {
                        inner: olt,
                        launches: Default::default(),
                        w_max: 0,
                        w: |s: &OlTunes| s.w_time,
                    },
                    &tasks,
                    seed,
                ),
                violation_line(
                    Recorder {
                        inner: Mlaas::new(ms.clone()),
                        launches: Default::default(),
                        w_max: 0,
                        w: |_| 0,
                    },
                    &tasks,
                    seed,
                ),
                violation_line(
                    Recorder {
                        inner: Orion::new(ms.clone()),
                        launches: Default::default(),
                        w_max: 0,
                        w: |_| 0,
                    },
                    &tasks,
                    seed,
                ),
            ];
            for l in lines {
                println!("{} {seed} {l}", pattern.name());
            }
        }
    }
}

/// A violation counted with queueing (latency from arrival) is never rarer than one counted on
/// the execution alone, and under MLaaS at 4x, where the small models queue, it is more frequent.
#[test]
fn violations_with_queueing_counted_include_those_without() {
    let rows = compare_at(Pattern::Poisson, 10, 42, 4.0);
    for m in &rows {
        for s in [&m.all, &m.small, &m.large] {
            assert!(
                s.slo_violation_queued >= s.slo_violation,
                "{}: {s:?}",
                m.name
            );
        }
    }
    let mlaas = &rows[1];
    assert!(
        mlaas.all.slo_violation_queued > mlaas.all.slo_violation,
        "{rows:#?}"
    );
}
