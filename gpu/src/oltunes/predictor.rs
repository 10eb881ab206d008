//! OLTunes' online predictor (§3.3.1–3.3.2): a second-order factorization machine (Eq. 2)
//! trained online with FTRL-Proximal (Algorithm 1) on squared loss (Eq. 3), two of them
//! (latency ŷ¹ and throughput ŷ², the paper's Bi-FM), over the features of Table 3; and the
//! Evaluator that retrains when the error passes θ.
//!
//! **Every coordinate is Algorithm 1**: `z += g − σ·w`, `n += g²`, `w = 0` if `|z| ≤ λ1` else
//! `−(z − sgn(z)λ1) / ((ζ + √n)/η + λ2)` with `σ = (√n_new − √n_old)/η` (McMahan et al.'s
//! FTRL-Proximal, whose per-coordinate form Algorithm 1 abbreviates). The factor matrix `V`
//! cannot start at zero (its gradient would stay zero), so each `v` starts at a small seeded
//! value by its `z`; the L1 term is applied to the linear weights only. The hyperparameters
//! (η, ζ, λ1, λ2, the rank, θ) are **assumptions, ours**: the paper gives no values.
//!
//! Targets are learned on a log scale (latency in ms and throughput in inputs/s span three
//! orders of magnitude); [`Predictor::predict`] returns them in their units.

use fastrand::Rng;

use super::task::{GpuType, Model};

/// Batch sizes of Table 3.
pub const BATCHES: [u32; 8] = [1, 4, 8, 16, 32, 64, 128, 256];

/// SM% values of Table 3: `c = 5k`, 1 < c < 100 (5 … 95), and 100 for the whole GPU.
pub fn sm_values() -> Vec<f64> {
    (1..=20).map(|k| f64::from(k) * 5.0).collect()
}

/// FTRL-Proximal hyperparameters and the FM's rank. Defaults are assumptions (ours).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FtrlConfig {
    /// η, learning-rate scale.
    pub eta: f64,
    /// ζ (β in McMahan et al.), stability.
    pub zeta: f64,
    /// λ1, L1 (linear weights).
    pub l1: f64,
    /// λ2, L2.
    pub l2: f64,
    /// Rank of the factorization (the paper's m in Eq. 2).
    pub rank: usize,
    /// Standard deviation of `V`'s initial values.
    pub init: f64,
}

impl Default for FtrlConfig {
    fn default() -> FtrlConfig {
        FtrlConfig {
            eta: 0.2,
            zeta: 1.0,
            l1: 0.0005,
            l2: 0.001,
            rank: 4,
            init: 0.05,
        }
    }
}

/// One coordinate's FTRL state.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Coord {
    z: f64,
    n: f64,
    w: f64,
}

impl Coord {
    fn update(&mut self, g: f64, c: &FtrlConfig, l1: f64) {
        let sigma = ((self.n + g * g).sqrt() - self.n.sqrt()) / c.eta;
        self.z += g - sigma * self.w;
        self.n += g * g;
        self.w = if self.z.abs() <= l1 {
            0.0
        } else {
            -(self.z - self.z.signum() * l1) / ((c.zeta + self.n.sqrt()) / c.eta + c.l2)
        };
    }
}

/// A sparse feature vector: (index, value).
pub type Features = Vec<(usize, f64)>;

/// A second-order factorization machine (Eq. 2) learned by FTRL-Proximal.
#[derive(Debug, Clone)]
pub struct Fm {
    config: FtrlConfig,
    bias: Coord,
    linear: Vec<Coord>,
    factors: Vec<Vec<Coord>>,
}

impl Fm {
    /// A machine over `n` features, `V` seeded by `seed`.
    pub fn new(n: usize, config: FtrlConfig, seed: u64) -> Fm {
        let mut rng = Rng::with_seed(seed);
        let scale = config.zeta / config.eta + config.l2;
        let factors = (0..n)
            .map(|_| {
                (0..config.rank)
                    .map(|_| {
                        let v = (rng.f64() - 0.5) * 2.0 * config.init;
                        Coord {
                            z: -v * scale,
                            n: 0.0,
                            w: v,
                        }
                    })
                    .collect()
            })
            .collect();
        Fm {
            config,
            bias: Coord::default(),
            linear: vec![Coord::default(); n],
            factors,
        }
    }

    /// ŷ(x) of Eq. 2, with `Σ_f` of the sums it needs for the gradient.
    fn forward(&self, x: &[(usize, f64)]) -> (f64, Vec<f64>) {
        let mut y = self.bias.w;
        for &(j, v) in x {
            y += self.linear[j].w * v;
        }
        let mut sums = vec![0.0; self.config.rank];
        for (f, sum) in sums.iter_mut().enumerate() {
            let mut sq = 0.0;
            for &(j, v) in x {
                let t = self.factors[j][f].w * v;
                *sum += t;
                sq += t * t;
            }
            y += 0.5 * (*sum * *sum - sq);
        }
        (y, sums)
    }

    /// The prediction for `x`.
    pub fn predict(&self, x: &[(usize, f64)]) -> f64 {
        self.forward(x).0
    }

    /// One online step of Algorithm 1 on squared loss (Eq. 3) for the sample `(x, y)`.
    pub fn learn(&mut self, x: &[(usize, f64)], y: f64) {
        let (p, sums) = self.forward(x);
        let e = (p - y).clamp(-5.0, 5.0);
        let c = self.config;
        self.bias.update(e, &c, 0.0);
        for &(j, v) in x {
            self.linear[j].update(e * v, &c, c.l1);
            for (f, sum) in sums.iter().enumerate() {
                let w = self.factors[j][f].w;
                self.factors[j][f].update(e * v * (sum - w * v), &c, 0.0);
            }
        }
    }
}

/// One observed (or profiled) run: what the features describe and what was measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Index into the models.
    pub model: usize,
    /// GPU type.
    pub gpu: GpuType,
    /// Inference batch size.
    pub batch: u32,
    /// SM%.
    pub sm_pct: f64,
    /// Latency of one batch, ms.
    pub latency_ms: f64,
}

impl Sample {
    /// Throughput, inputs per second.
    pub fn throughput(&self) -> f64 {
        f64::from(self.batch) * 1000.0 / self.latency_ms
    }
}

/// The feature encoding of Table 3: model, batch size, GPU memory used (2 GB bins), GPU
/// memory total, GPU type and SM% one-hot; parameter size continuous (log-scaled). The
/// input/sequence length is a property of the model in our workloads, so the model's one-hot
/// carries it.
#[derive(Debug, Clone)]
pub struct Encoder {
    models: Vec<Model>,
    sms: Vec<f64>,
}

const MEM_BINS: usize = 21;

impl Encoder {
    /// For these models.
    pub fn new(models: Vec<Model>) -> Encoder {
        Encoder {
            models,
            sms: sm_values(),
        }
    }

    /// How many features.
    pub fn len(&self) -> usize {
        self.models.len() + BATCHES.len() + 2 * MEM_BINS + GpuType::ALL.len() + self.sms.len() + 1
    }

    /// Never empty (kept for clippy's `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The features of running model `model` on `gpu` at `(batch, sm_pct)`.
    pub fn encode(&self, model: usize, gpu: GpuType, batch: u32, sm_pct: f64) -> Features {
        let m = &self.models[model];
        let mut i = 0;
        let mut x = Vec::with_capacity(8);
        x.push((i + model, 1.0));
        i += self.models.len();
        let b = BATCHES
            .iter()
            .position(|v| *v >= batch)
            .unwrap_or(BATCHES.len() - 1);
        x.push((i + b, 1.0));
        i += BATCHES.len();
        let bin = |gb: f64| ((gb / 2.0).round() as usize).min(MEM_BINS - 1);
        x.push((i + bin(m.memory_gb(batch)), 1.0));
        i += MEM_BINS;
        x.push((i + bin(gpu.memory_gb()), 1.0));
        i += MEM_BINS;
        let g = GpuType::ALL.iter().position(|t| *t == gpu).unwrap_or(0);
        x.push((i + g, 1.0));
        i += GpuType::ALL.len();
        let c = self
            .sms
            .iter()
            .position(|v| *v >= sm_pct - 1e-9)
            .unwrap_or(self.sms.len() - 1);
        x.push((i + c, 1.0));
        i += self.sms.len();
        x.push((i, (m.params_m.ln() / 8.0).max(0.0)));
        x
    }
}

/// The Evaluator's retraining rule: retrain when the mean absolute log error of the last
/// `window` predictions passes `theta`, from the last `keep` samples, `epochs` times over.
/// Assumption, ours: the paper says only "if the error rate exceeds θ, it quickly performs
/// re-training based on the latest data" (§3.3) and gives no θ.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Retrain {
    /// θ, on |ln ŷ − ln y| (0.2 ≈ 22% relative error).
    pub theta: f64,
    /// Predictions averaged.
    pub window: usize,
    /// Latest samples replayed.
    pub keep: usize,
    /// Passes over them.
    pub epochs: usize,
}

impl Default for Retrain {
    fn default() -> Retrain {
        Retrain {
            theta: 0.2,
            window: 20,
            keep: 400,
            epochs: 3,
        }
    }
}

/// Latency and throughput predictor (Bi-FM, FTRL-Proximal) with its Evaluator.
#[derive(Debug, Clone)]
pub struct Predictor {
    encoder: Encoder,
    config: FtrlConfig,
    retrain: Retrain,
    seed: u64,
    latency: Fm,
    throughput: Fm,
    history: Vec<Sample>,
    errors: Vec<f64>,
    retrains: usize,
}

impl Predictor {
    /// A fresh predictor over `models`.
    pub fn new(models: Vec<Model>, config: FtrlConfig, retrain: Retrain, seed: u64) -> Predictor {
        let encoder = Encoder::new(models);
        let n = encoder.len();
        Predictor {
            latency: Fm::new(n, config, seed),
            throughput: Fm::new(n, config, seed ^ 0x9e37_79b9),
            encoder,
            config,
            retrain,
            seed,
            history: Vec::new(),
            errors: Vec::new(),
            retrains: 0,
        }
    }

    /// Predicted (latency of one batch in ms, throughput in inputs/s).
    pub fn predict(&self, model: usize, gpu: GpuType, batch: u32, sm_pct: f64) -> (f64, f64) {
        let x = self.encoder.encode(model, gpu, batch, sm_pct);
        (
            self.latency.predict(&x).clamp(-5.0, 15.0).exp(),
            self.throughput.predict(&x).clamp(-5.0, 15.0).exp(),
        )
    }

    fn step(&mut self, s: &Sample) {
        let x = self.encoder.encode(s.model, s.gpu, s.batch, s.sm_pct);
        self.latency.learn(&x, s.latency_ms.ln());
        self.throughput.learn(&x, s.throughput().ln());
    }

    /// Learns from profiled runs (the Job Profiler's trial runs, §3.2), `epochs` passes.
    pub fn pretrain(&mut self, samples: &[Sample], epochs: usize) {
        for _ in 0..epochs {
            for s in samples {
                self.step(s);
            }
        }
        self.history.extend_from_slice(samples);
    }

    /// Learns one observation online, and retrains if the Evaluator's error passes θ.
    /// Returns whether it retrained.
    pub fn observe(&mut self, s: Sample) -> bool {
        let (lat, _) = self.predict(s.model, s.gpu, s.batch, s.sm_pct);
        self.errors.push((lat.ln() - s.latency_ms.ln()).abs());
        self.step(&s);
        self.history.push(s);
        let w = self.retrain.window;
        if self.errors.len() >= w {
            let recent = &self.errors[self.errors.len() - w..];
            if recent.iter().sum::<f64>() / w as f64 > self.retrain.theta {
                self.refit();
                self.errors.clear();
                return true;
            }
        }
        false
    }

    /// Retrains from scratch on the latest samples.
    fn refit(&mut self) {
        self.retrains += 1;
        let n = self.encoder.len();
        let seed = self.seed.wrapping_add(self.retrains as u64);
        self.latency = Fm::new(n, self.config, seed);
        self.throughput = Fm::new(n, self.config, seed ^ 0x9e37_79b9);
        let from = self.history.len().saturating_sub(self.retrain.keep);
        let latest: Vec<Sample> = self.history[from..].to_vec();
        for _ in 0..self.retrain.epochs {
            for s in &latest {
                self.step(s);
            }
        }
    }

    /// Times the Evaluator retrained.
    pub fn retrains(&self) -> usize {
        self.retrains
    }

    /// Samples learned so far.
    pub fn samples(&self) -> usize {
        self.history.len()
    }
}

/// RMSE and R² of a predictor's log latency on `samples` (the accuracy metrics of §4.2.1,
/// Table 8, here on ln ms).
pub fn accuracy(p: &Predictor, samples: &[Sample]) -> (f64, f64) {
    let ys: Vec<f64> = samples.iter().map(|s| s.latency_ms.ln()).collect();
    let preds: Vec<f64> = samples
        .iter()
        .map(|s| p.predict(s.model, s.gpu, s.batch, s.sm_pct).0.ln())
        .collect();
    let n = ys.len().max(1) as f64;
    let mean = ys.iter().sum::<f64>() / n;
    let sse: f64 = ys.iter().zip(&preds).map(|(y, q)| (y - q).powi(2)).sum();
    let sst: f64 = ys.iter().map(|y| (y - mean).powi(2)).sum();
    ((sse / n).sqrt(), 1.0 - sse / sst.max(1e-12))
}
