//! OLTunes against its paper's baselines (MLaaS' reserving-and-packing, Orion) on the same
//! seeded workload and simulated cluster, with the paper's service and cluster metrics
//! (§4.1.3): queueing time, JCT, p50 (= mean JCT + mean queueing, the paper's definition),
//! p99 latency, throughput, SLO violations (counted two ways: the execution alone against the
//! deadline, and the latency from arrival, queueing included, which is the latency the paper
//! defines; it does not say which its Fig. 14 counts), SM utilization and its spread,
//! estimated energy;
//! the small (S, M) and large (L, XL, XXL) models apart, as §4.2.2 reports them.

use std::fmt::Write as _;

use fastrand::Rng;

use super::baselines::{Mlaas, Orion};
use super::predictor::{Predictor, Retrain, Sample, accuracy};
use super::sched::OlTunes;
use super::sim::{Scheduler, Trace, simulate};
use super::task::{GpuType, Model, Pattern, Task, models, testbed, workload_at};

/// Seconds the schedulers get after the last arrival to finish; a task unfinished by then
/// counts as an SLO violation (Orion's "indefinite waiting").
pub const DRAIN_S: u64 = 10;

/// The Job Profiler's trial runs (§3.2: "short trial runs of new models"): every model on
/// every type at batch sizes 1, 8 and 32 and SM% 30 and 100, alone, measured with ±5% noise
/// (ours). 8 models × 3 types × 6 = 144 samples.
pub fn profile(models: &[Model], seed: u64) -> Vec<Sample> {
    let mut rng = Rng::with_seed(seed);
    let mut out = Vec::new();
    for (mi, m) in models.iter().enumerate() {
        for g in GpuType::ALL {
            for b in [1, 8, 32] {
                if m.memory_gb(b) > g.memory_gb() {
                    continue;
                }
                for c in [30.0, 100.0] {
                    let noise = 1.0 + (rng.f64() - 0.5) * 0.1;
                    out.push(Sample {
                        model: mi,
                        gpu: g,
                        batch: b,
                        sm_pct: c,
                        latency_ms: m.batch_ms(g, b, c) * noise,
                    });
                }
            }
        }
    }
    out
}

/// Service metrics of a group of tasks.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Service {
    /// Tasks.
    pub tasks: usize,
    /// Mean queueing time of the finished tasks, ms.
    pub queue_ms: f64,
    /// Mean execution time (JCT) of the finished tasks, ms.
    pub jct_ms: f64,
    /// The paper's p50: mean JCT + mean queueing, ms.
    pub p50_ms: f64,
    /// 99th percentile of queueing + execution of the finished tasks, ms.
    pub p99_ms: f64,
    /// Inputs finished per second of the run (arrivals and drain).
    pub throughput: f64,
    /// Share of tasks whose execution (JCT, queueing not counted) missed their deadline, or
    /// that did not finish.
    pub slo_violation: f64,
    /// Share of tasks whose latency from arrival (queueing and execution, the latency the
    /// paper's p50 counts, §4.1.3) missed their deadline, or that did not finish.
    pub slo_violation_queued: f64,
    /// Tasks unfinished at the end.
    pub unfinished: usize,
}

fn service(trace: &Trace, tasks: &[Task], keep: impl Fn(&Task) -> bool) -> Service {
    let mut queue = Vec::new();
    let mut jct = Vec::new();
    let mut e2e = Vec::new();
    let mut inputs = 0.0;
    let mut violated = 0;
    let mut violated_queued = 0;
    let mut n = 0;
    let mut unfinished = 0;
    for (t, o) in tasks.iter().zip(&trace.outcomes) {
        if !keep(t) {
            continue;
        }
        n += 1;
        match (o.start_ms, o.end_ms) {
            (Some(s), Some(e)) => {
                queue.push((s - t.arrival_ms) as f64);
                jct.push((e - s) as f64);
                e2e.push((e - t.arrival_ms) as f64);
                inputs += f64::from(t.inputs);
                if (e - s) as f64 > t.deadline_ms {
                    violated += 1;
                }
                if (e - t.arrival_ms) as f64 > t.deadline_ms {
                    violated_queued += 1;
                }
            }
            _ => {
                violated += 1;
                violated_queued += 1;
                unfinished += 1;
            }
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    e2e.sort_by(f64::total_cmp);
    let p99 = e2e
        .get(((e2e.len() as f64 * 0.99).ceil() as usize).saturating_sub(1))
        .copied()
        .unwrap_or(0.0);
    Service {
        tasks: n,
        queue_ms: mean(&queue),
        jct_ms: mean(&jct),
        p50_ms: mean(&queue) + mean(&jct),
        p99_ms: p99,
        throughput: inputs / (trace.horizon_ms as f64 / 1000.0),
        slo_violation: violated as f64 / n.max(1) as f64,
        slo_violation_queued: violated_queued as f64 / n.max(1) as f64,
        unfinished,
    }
}

/// One scheduler's results on one workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Metrics {
    /// The scheduler.
    pub name: String,
    /// Every task.
    pub all: Service,
    /// The small models (S, M).
    pub small: Service,
    /// The large models (L, XL, XXL).
    pub large: Service,
    /// Mean SM utilization over GPUs and 2 s samples.
    pub util_mean: f64,
    /// Mean over GPUs of the standard deviation of their utilization over time (the swings of
    /// Fig. 15).
    pub util_swing: f64,
    /// Estimated energy (Eq. 7 every 2 s), kJ.
    pub energy_kj: f64,
    /// Launches refused by the cluster.
    pub refused: usize,
    /// Predictor retrains.
    pub retrains: usize,
}

fn metrics(name: &str, trace: &Trace, tasks: &[Task], models: &[Model]) -> Metrics {
    let g = trace.gpus.len();
    let per_gpu: Vec<Vec<f64>> = (0..g)
        .map(|i| trace.samples.iter().map(|s| s[i].0).collect())
        .collect();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let util_mean = mean(&per_gpu.iter().map(|v| mean(v)).collect::<Vec<_>>());
    let util_swing = mean(
        &per_gpu
            .iter()
            .map(|v| {
                let m = mean(v);
                (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / v.len().max(1) as f64).sqrt()
            })
            .collect::<Vec<_>>(),
    );
    Metrics {
        name: name.to_string(),
        all: service(trace, tasks, |_| true),
        small: service(trace, tasks, |t| models[t.model].size.small()),
        large: service(trace, tasks, |t| !models[t.model].size.small()),
        util_mean,
        util_swing,
        energy_kj: trace.energy_kj(),
        refused: trace.refused,
        retrains: trace.retrains,
    }
}

/// Runs OLTunes, MLaaS and Orion on the paper's testbed (Table 5) over `secs` seconds of
/// `pattern` (Table 7's rates), seeded; in that order.
pub fn compare(pattern: Pattern, secs: u64, seed: u64) -> Vec<Metrics> {
    compare_at(pattern, secs, seed, 1.0)
}

/// [`compare`] at `load` times Table 7's rates.
pub fn compare_at(pattern: Pattern, secs: u64, seed: u64, load: f64) -> Vec<Metrics> {
    let models = models();
    let gpus = testbed();
    let tasks = workload_at(pattern, secs, seed, load);
    let horizon = (secs + DRAIN_S) * 1000;
    let mut schedulers: Vec<Box<dyn Scheduler>> = vec![
        Box::new(OlTunes::new(
            models.clone(),
            &gpus,
            &profile(&models, seed ^ 0x5eed),
            seed,
        )),
        Box::new(Mlaas::new(models.clone())),
        Box::new(Orion::new(models.clone())),
    ];
    schedulers
        .iter_mut()
        .map(|s| {
            let trace = simulate(s.as_mut(), &gpus, &tasks, &models, horizon, seed);
            metrics(s.name(), &trace, &tasks, &models)
        })
        .collect()
}

/// The comparison as a plain-text table.
pub fn table(pattern: Pattern, rows: &[Metrics]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "pattern {}: scheduler | SLO viol % (execution; with queueing) | p50 ms (queue+JCT) | p99 ms | thr in/s | \
         small: queue ms, JCT ms, p99 ms, thr | large: queue ms, JCT ms, p99 ms, thr | \
         SM util % | swing % | energy kJ | unfinished | retrains",
        pattern.name()
    );
    for m in rows {
        let _ = writeln!(
            s,
            "{} | {:.1}; {:.1} | {:.1} ({:.1}+{:.1}) | {:.1} | {:.0} | {:.1}, {:.1}, {:.1}, {:.0} | \
             {:.1}, {:.1}, {:.1}, {:.0} | {:.1} | {:.1} | {:.0} | {} | {}",
            m.name,
            m.all.slo_violation * 100.0,
            m.all.slo_violation_queued * 100.0,
            m.all.p50_ms,
            m.all.queue_ms,
            m.all.jct_ms,
            m.all.p99_ms,
            m.all.throughput,
            m.small.queue_ms,
            m.small.jct_ms,
            m.small.p99_ms,
            m.small.throughput,
            m.large.queue_ms,
            m.large.jct_ms,
            m.large.p99_ms,
            m.large.throughput,
            m.util_mean * 100.0,
            m.util_swing * 100.0,
            m.energy_kj,
            m.all.unfinished,
            m.retrains,
        );
    }
    s
}

/// The predictor's accuracy (§4.2.1): trained online on `train` seeded runs of random
/// configurations, then RMSE and R² of ln latency on `test` others; and the same for a
/// predictor of the training mean (the floor any model must beat). Returns
/// `(rmse, r2, mean_rmse)`.
pub fn predictor_accuracy(train: usize, test: usize, seed: u64) -> (f64, f64, f64) {
    let models = models();
    let mut rng = Rng::with_seed(seed);
    let mut draw = || {
        let mi = rng.usize(..models.len());
        let g = GpuType::ALL[rng.usize(..3)];
        let b = super::predictor::BATCHES[rng.usize(..6)];
        let c = super::predictor::sm_values()[rng.usize(..20)];
        let noise = 1.0 + (rng.f64() - 0.5) * 0.1;
        Sample {
            model: mi,
            gpu: g,
            batch: b,
            sm_pct: c,
            latency_ms: models[mi].batch_ms(g, b, c) * noise,
        }
    };
    let train_set: Vec<Sample> = (0..train).map(|_| draw()).collect();
    let test_set: Vec<Sample> = (0..test).map(|_| draw()).collect();
    let mut p = Predictor::new(
        models.clone(),
        Default::default(),
        Retrain {
            theta: f64::INFINITY,
            ..Retrain::default()
        },
        seed,
    );
    for s in &train_set {
        p.observe(*s);
    }
    let (rmse, r2) = accuracy(&p, &test_set);
    let mean = train_set.iter().map(|s| s.latency_ms.ln()).sum::<f64>() / train as f64;
    let mean_rmse = (test_set
        .iter()
        .map(|s| (s.latency_ms.ln() - mean).powi(2))
        .sum::<f64>()
        / test as f64)
        .sqrt();
    (rmse, r2, mean_rmse)
}

/// One run of [`compare_at`]: its workload and the three schedulers' metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// Arrival pattern.
    pub pattern: Pattern,
    /// Times Table 7's rates.
    pub load: f64,
    /// Seed.
    pub seed: u64,
    /// OLTunes, MLaaS, Orion.
    pub rows: Vec<Metrics>,
}

/// What the benchmark harness runs: every pattern at each of `loads`, for each of `seeds`,
/// `secs` seconds of arrivals each.
pub fn runs(loads: &[f64], seeds: &[u64], secs: u64) -> Vec<Run> {
    let mut out = Vec::new();
    for pattern in [Pattern::Uniform, Pattern::Poisson, Pattern::Bursty] {
        for &load in loads {
            for &seed in seeds {
                out.push(Run {
                    pattern,
                    load,
                    seed,
                    rows: compare_at(pattern, secs, seed, load),
                });
            }
        }
    }
    out
}
