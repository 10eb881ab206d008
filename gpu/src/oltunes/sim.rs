//! The simulated heterogeneous cluster the schedulers are compared on, deterministic for a
//! seed: GPUs of [`GpuType`]s, tasks co-running under MPS at the SM% they are given, slowed by
//! the Table 1 interference of whoever shares the GPU at each moment, holding their memory
//! until they finish. A launch that does not fit (memory, or [`MAX_COLOCATED`] tasks) is
//! refused and returned to the scheduler, as a failed assignment is in Algorithm 2 (line 25).
//!
//! Power is estimated as the paper estimates it (§4.2.3, Eq. 7 without the time factor): every
//! 2 s, each GPU draws `P_base + (TDP − P_base)·SM util·Mem used/Total mem`. Nothing is
//! measured on a GPU: this is a simulation, and its speeds are assumptions
//! ([`super::task`]).

use fastrand::Rng;

use super::predictor::Sample;
use super::task::{GpuType, Model, P_BASE_W, Task, interference};

/// Tick, ms (= the window step w of Table 4).
pub const TICK_MS: u64 = 10;

/// Tasks one GPU runs at once: `batch_size_max` = 4 of §3.4.2, applied to every scheduler so
/// that the comparison isolates their choices. Assumption (the paper's value, our extension).
pub const MAX_COLOCATED: usize = 4;

/// Power sample interval, ms (§4.2.3: "every 2 s on each GPU").
pub const SAMPLE_MS: u64 = 2000;

/// A task running on a GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct Running {
    /// Task id.
    pub task: usize,
    /// Model index.
    pub model: usize,
    /// GB held.
    pub mem_gb: f64,
    /// SM% it was given.
    pub sm_pct: f64,
    /// SM% it uses: its share, up to its model's saturation.
    pub sm_used: f64,
    /// Batch size.
    pub batch: u32,
    /// Started, ms.
    pub start_ms: u64,
    /// Solo work left, ms.
    pub(crate) left_ms: f64,
    /// Solo work in all, ms.
    pub(crate) total_ms: f64,
    /// Its measurement noise, a factor on its speed.
    pub(crate) noise: f64,
}

impl Running {
    /// A stand-in a scheduler puts in its own copy of a GPU for a task it has just decided to
    /// launch there (so that later decisions of the same tick see its memory).
    pub fn placeholder(model: usize, mem_gb: f64) -> Running {
        Running {
            task: usize::MAX,
            model,
            mem_gb,
            sm_pct: 100.0,
            sm_used: 0.0,
            batch: 1,
            start_ms: 0,
            left_ms: 1.0,
            total_ms: 1.0,
            noise: 1.0,
        }
    }

    /// Share of its solo work done.
    pub fn progress(&self) -> f64 {
        1.0 - self.left_ms / self.total_ms.max(1e-9)
    }
}

/// One GPU as a scheduler sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuState {
    /// Its type.
    pub ty: GpuType,
    /// What runs on it.
    pub running: Vec<Running>,
}

impl GpuState {
    /// GB free.
    pub fn free_gb(&self) -> f64 {
        self.ty.memory_gb() - self.running.iter().map(|r| r.mem_gb).sum::<f64>()
    }

    /// SM utilization in [0, 1].
    pub fn utilization(&self) -> f64 {
        (self.running.iter().map(|r| r.sm_used).sum::<f64>() / 100.0).min(1.0)
    }

    /// Whether it can take `mem_gb` more and one more task.
    pub fn fits(&self, mem_gb: f64) -> bool {
        self.running.len() < MAX_COLOCATED && self.free_gb() >= mem_gb - 1e-9
    }
}

/// A scheduler's decision: run `task` on GPU `gpu` at `(batch, sm_pct)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Launch {
    /// Task id.
    pub task: usize,
    /// GPU index.
    pub gpu: usize,
    /// Inference batch size.
    pub batch: u32,
    /// SM%.
    pub sm_pct: f64,
}

/// A cluster scheduler (OLTunes, MLaaS' reserving-and-packing, Orion).
pub trait Scheduler {
    /// Its name, as tables print it.
    fn name(&self) -> &'static str;
    /// A task arrived (it enters the scheduler's main queue).
    fn arrive(&mut self, task: &Task, now: u64, gpus: &[GpuState]);
    /// One tick: the launches it decides now go to `out`.
    fn step(&mut self, now: u64, gpus: &[GpuState], out: &mut Vec<Launch>);
    /// A launch was refused (it did not fit).
    fn refused(&mut self, launch: Launch, now: u64);
    /// A task finished; `sample` is what it measured (latency of one batch, ms).
    fn finished(&mut self, task: usize, sample: Sample);
    /// Times its predictor retrained (0 for schedulers without one).
    fn retrains(&self) -> usize {
        0
    }
}

/// What happened to one task.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    /// Started, ms.
    pub start_ms: Option<u64>,
    /// Finished, ms.
    pub end_ms: Option<u64>,
    /// GPU it ran on.
    pub gpu: Option<usize>,
}

/// A finished simulation.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// Per task, by id.
    pub outcomes: Vec<Outcome>,
    /// Per 2 s sample, per GPU: (SM utilization, memory used share).
    pub samples: Vec<Vec<(f64, f64)>>,
    /// The GPUs.
    pub gpus: Vec<GpuType>,
    /// Launches refused.
    pub refused: usize,
    /// Predictor retrains.
    pub retrains: usize,
    /// The horizon, ms.
    pub horizon_ms: u64,
}

impl Trace {
    /// Estimated energy of every GPU over the run (Eq. 7 every 2 s), kJ.
    pub fn energy_kj(&self) -> f64 {
        self.samples
            .iter()
            .flat_map(|s| s.iter().zip(&self.gpus))
            .map(|((u, m), g)| (P_BASE_W + (g.tdp_w() - P_BASE_W) * u * m) * SAMPLE_MS as f64)
            .sum::<f64>()
            / 1e6
    }
}

/// Runs `scheduler` on `gpus` over `tasks` until `horizon_ms`; the measured latencies carry
/// a seeded ±5% noise (assumption, ours).
pub fn simulate(
    scheduler: &mut dyn Scheduler,
    gpus: &[GpuType],
    tasks: &[Task],
    models: &[Model],
    horizon_ms: u64,
    seed: u64,
) -> Trace {
    let mut rng = Rng::with_seed(seed);
    let mut state: Vec<GpuState> = gpus
        .iter()
        .map(|g| GpuState {
            ty: *g,
            running: Vec::new(),
        })
        .collect();
    let mut outcomes = vec![
        Outcome {
            start_ms: None,
            end_ms: None,
            gpu: None
        };
        tasks.len()
    ];
    let mut next = 0;
    let mut samples = Vec::new();
    let mut refused = 0;
    let mut out = Vec::new();
    let mut now = 0;
    while now <= horizon_ms {
        // Progress: each running task does TICK_MS of solo work over its interference now.
        for (gi, g) in state.iter_mut().enumerate() {
            let ms: Vec<&Model> = g.running.iter().map(|r| &models[r.model]).collect();
            let factors: Vec<f64> = (0..ms.len())
                .map(|i| {
                    let others: Vec<&Model> =
                        (0..ms.len()).filter(|j| *j != i).map(|j| ms[j]).collect();
                    interference(ms[i], &others)
                })
                .collect();
            for (r, f) in g.running.iter_mut().zip(&factors) {
                r.left_ms -= TICK_MS as f64 / (f * r.noise);
            }
            let (done, left): (Vec<Running>, Vec<Running>) =
                g.running.drain(..).partition(|r| r.left_ms <= 0.0);
            g.running = left;
            for r in done {
                let t = &tasks[r.task];
                outcomes[r.task].end_ms = Some(now);
                let batches = f64::from(t.inputs.div_ceil(r.batch));
                let latency_ms = ((now - r.start_ms) as f64 / batches).max(0.1);
                scheduler.finished(
                    r.task,
                    Sample {
                        model: r.model,
                        gpu: gpus[gi],
                        batch: r.batch,
                        sm_pct: r.sm_pct,
                        latency_ms,
                    },
                );
            }
        }
        while next < tasks.len() && tasks[next].arrival_ms <= now {
            scheduler.arrive(&tasks[next], now, &state);
            next += 1;
        }
        scheduler.step(now, &state, &mut out);
        for l in out.drain(..) {
            let t = &tasks[l.task];
            let m = &models[t.model];
            let mem = m.memory_gb(l.batch);
            let g = &mut state[l.gpu];
            if outcomes[l.task].start_ms.is_some() || !g.fits(mem) {
                refused += 1;
                scheduler.refused(l, now);
                continue;
            }
            let solo = f64::from(t.inputs.div_ceil(l.batch)) * m.batch_ms(g.ty, l.batch, l.sm_pct);
            g.running.push(Running {
                task: l.task,
                model: t.model,
                mem_gb: mem,
                sm_pct: l.sm_pct,
                sm_used: l.sm_pct.min(m.sat_sm),
                batch: l.batch,
                start_ms: now,
                left_ms: solo,
                total_ms: solo,
                noise: 1.0 + (rng.f64() - 0.5) * 0.1,
            });
            outcomes[l.task].start_ms = Some(now);
            outcomes[l.task].gpu = Some(l.gpu);
        }
        if now % SAMPLE_MS == 0 {
            samples.push(
                state
                    .iter()
                    .map(|g| {
                        let used = 1.0 - g.free_gb() / g.ty.memory_gb();
                        (g.utilization(), used)
                    })
                    .collect(),
            );
        }
        now += TICK_MS;
    }
    Trace {
        outcomes,
        samples,
        gpus: gpus.to_vec(),
        refused,
        retrains: scheduler.retrains(),
        horizon_ms,
    }
}
