//! OLTunes' task model (Eq. 8, `Task_i = [(model, variant), λ_i, deadline_i, D_i]`), the GPU
//! types and models of its testbed (Tables 5 and 6), the simulated ground truth the tasks run
//! at, and the seeded workloads (Table 7's rates).
//!
//! Every number here is an **assumption**, marked with its source: the paper's tables where it
//! gives one, ours (a plausible stand-in, stated as such) where it gives none. The ground-truth
//! speeds are ours: the paper gives its measured latencies only as plots (Figs. 2–6).

use fastrand::Rng;

/// A GPU type of the paper's cluster (Table 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GpuType {
    /// A100-40G, Ampere, HBM2e: the "high-end" type (5 in the testbed).
    A100,
    /// A30-24G, Ampere, HBM2e, MIG-capable (2 in the testbed).
    A30,
    /// RTX 4090, Ada Lovelace, GDDR6X (1 in the testbed).
    Rtx4090,
}

impl GpuType {
    /// Every type, in the one-hot order of the predictor's features.
    pub const ALL: [GpuType; 3] = [GpuType::A100, GpuType::A30, GpuType::Rtx4090];

    /// Memory, GB. Assumption: Table 5 (40 / 24 / 24).
    pub fn memory_gb(self) -> f64 {
        match self {
            GpuType::A100 => 40.0,
            GpuType::A30 | GpuType::Rtx4090 => 24.0,
        }
    }

    /// Streaming multiprocessors. Assumption: Table 5 (108 / 56 / 128).
    pub fn sms(self) -> u32 {
        match self {
            GpuType::A100 => 108,
            GpuType::A30 => 56,
            GpuType::Rtx4090 => 128,
        }
    }

    /// Thermal design power, W. Assumption: Table 5 (250 / 165 / 450).
    pub fn tdp_w(self) -> f64 {
        match self {
            GpuType::A100 => 250.0,
            GpuType::A30 => 165.0,
            GpuType::Rtx4090 => 450.0,
        }
    }

    /// Whether MLaaS' reserving-and-packing treats it as high-end (§4.1.2: "high-performance
    /// GPUs with NVLinks"; §4.2.3 calls G1 and G2-3, the 4090 and the A30s, regular).
    pub fn high_end(self) -> bool {
        self == GpuType::A100
    }

    /// Relative speed of a model of `domain` on this type (A100 = 1). Assumption, ours,
    /// shaped by §2.3.2 / Fig. 2 (the A100 fastest for every model, the 4090 "reasonable,
    /// especially for computer vision", the A30 slowest): 4090 0.9 vision / 0.6 NLP, A30 0.55.
    pub fn speed(self, domain: Domain) -> f64 {
        match (self, domain) {
            (GpuType::A100, _) => 1.0,
            (GpuType::Rtx4090, Domain::Vision) => 0.9,
            (GpuType::Rtx4090, Domain::Nlp) => 0.6,
            (GpuType::A30, _) => 0.55,
        }
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            GpuType::A100 => "A100-40G",
            GpuType::A30 => "A30-24G",
            GpuType::Rtx4090 => "RTX4090",
        }
    }
}

/// Idle power of every GPU, W. Assumption: §2.4 and §4.2.3 ("P_base of the GPU is 60 W").
pub const P_BASE_W: f64 = 60.0;

/// The testbed: 1 RTX 4090, 5 A100-40G, 2 A30-24G (Table 5), G1 first as in Fig. 15.
pub fn testbed() -> Vec<GpuType> {
    let mut g = vec![GpuType::Rtx4090, GpuType::A30, GpuType::A30];
    g.extend([GpuType::A100; 5]);
    g
}

/// Vision or NLP: decides the class of 90% of the tasks (§4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Domain {
    /// Image classification and detection: LC for 90% of its tasks.
    Vision,
    /// Language models: TO for 90% of its tasks.
    Nlp,
}

/// The size groups of Table 6 (the paper reports S and M against L, XL and XXL).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Size {
    /// ResNet-18.
    S,
    /// YOLOv5 5n / 5X.
    M,
    /// BERT base / medium.
    L,
    /// ResNet-50 / 152.
    Xl,
    /// GPT-2 (1.5 B).
    Xxl,
}

impl Size {
    /// Whether the paper groups it with the small models (S, M) of §4.2.2.
    pub fn small(self) -> bool {
        matches!(self, Size::S | Size::M)
    }
}

/// An inference model variant of Table 6, with its simulated ground truth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Model {
    /// Its name.
    pub name: &'static str,
    /// Its size group (Table 6).
    pub size: Size,
    /// Vision or NLP (Table 6).
    pub domain: Domain,
    /// Whether it is the high-quality variant (§2.2.2, Eq. 11).
    pub high: bool,
    /// Latency SLO, ms. Assumption: Table 6.
    pub slo_ms: f64,
    /// Parameters, millions. Assumption: Table 6 (BERT-medium's 41 M: ours, Table 6 omits it).
    pub params_m: f64,
    /// CI/MI kernel ratio of Eq. 1 (≥ 1.2: compute-intensive). Assumption, ours: the paper
    /// gives no per-model ratio, only that Conv2d is CI and token generation MI (§2.2.1).
    pub ratio: f64,
    /// Ground truth: one input on a whole A100, ms. Assumption, ours.
    pub base_ms: f64,
    /// Ground truth: added latency per extra input in a batch, as a share of `base_ms`.
    /// Assumption, ours.
    pub per_input: f64,
    /// Ground truth: GB per input of a batch (activations). Assumption, ours.
    pub mem_per_input_gb: f64,
    /// Ground truth: SM% past which more SMs do not help (the knee of §2.3.2). Assumption, ours.
    pub sat_sm: f64,
}

/// GB of a container before its model (CUDA context, framework). Assumption, ours.
pub const CONTEXT_GB: f64 = 1.0;

impl Model {
    /// Whether Eq. 1 makes it compute-intensive (ratio ≥ 1.2, §2.2.1).
    pub fn compute_intensive(&self) -> bool {
        self.ratio >= 1.2
    }

    /// GB a container running it at batch size `b` holds: context, FP32 weights (4 bytes a
    /// parameter, Table 6 "full precision"), activations.
    pub fn memory_gb(&self, b: u32) -> f64 {
        CONTEXT_GB + self.params_m * 4.0 / 1000.0 + self.mem_per_input_gb * f64::from(b)
    }

    /// Ground truth: one batch of `b` inputs on `gpu` with `sm_pct` of its SMs, alone, ms.
    pub fn batch_ms(&self, gpu: GpuType, b: u32, sm_pct: f64) -> f64 {
        let full = self.base_ms * (1.0 + self.per_input * f64::from(b.saturating_sub(1)));
        let starve = (self.sat_sm / sm_pct.max(1.0)).max(1.0);
        full / gpu.speed(self.domain) * starve
    }
}

/// The models of Table 6 (with the variants Table 6 lists).
pub fn models() -> Vec<Model> {
    let m =
        |name, size, domain, high, slo_ms, params_m, ratio, base_ms, per_input, mem, sat| Model {
            name,
            size,
            domain,
            high,
            slo_ms,
            params_m,
            ratio,
            base_ms,
            per_input,
            mem_per_input_gb: mem,
            sat_sm: sat,
        };
    use Domain::{Nlp, Vision};
    vec![
        m(
            "ResNet-18",
            Size::S,
            Vision,
            false,
            10.0,
            20.0,
            3.0,
            1.5,
            0.06,
            0.02,
            30.0,
        ),
        m(
            "YOLOv5n",
            Size::M,
            Vision,
            false,
            25.0,
            2.6,
            2.6,
            3.0,
            0.08,
            0.03,
            30.0,
        ),
        m(
            "YOLOv5x",
            Size::M,
            Vision,
            true,
            45.0,
            97.0,
            2.4,
            6.0,
            0.08,
            0.06,
            70.0,
        ),
        m(
            "BERT-base",
            Size::L,
            Nlp,
            true,
            150.0,
            110.0,
            0.6,
            8.0,
            0.10,
            0.05,
            60.0,
        ),
        m(
            "BERT-medium",
            Size::L,
            Nlp,
            false,
            150.0,
            41.0,
            0.7,
            4.0,
            0.10,
            0.03,
            40.0,
        ),
        m(
            "ResNet-50",
            Size::Xl,
            Vision,
            false,
            80.0,
            25.0,
            2.0,
            4.0,
            0.07,
            0.05,
            50.0,
        ),
        m(
            "ResNet-152",
            Size::Xl,
            Vision,
            true,
            170.0,
            60.2,
            2.2,
            10.0,
            0.07,
            0.08,
            70.0,
        ),
        m(
            "GPT-2",
            Size::Xxl,
            Nlp,
            true,
            200.0,
            1500.0,
            0.3,
            20.0,
            0.12,
            0.25,
            60.0,
        ),
    ]
}

/// Latency-critical or throughput-oriented, by λ (§3.4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Latency-critical: 0.5 < λ < 1.
    Lc,
    /// Throughput-oriented: 0 < λ ≤ 0.5.
    To,
}

impl Class {
    /// The class λ puts a task in: LC for 0.5 < λ < 1, TO for 0 < λ ≤ 0.5 (§3.4.1, Table 4).
    pub fn of(lambda: f64) -> Class {
        if lambda > 0.5 { Class::Lc } else { Class::To }
    }
}

/// One inference request (Eq. 8), before tuning: `D_i` is computed by the tuner
/// ([`super::tuner`]) when it reaches the main queue.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// Its id (arrival order).
    pub id: usize,
    /// Index into [`models`].
    pub model: usize,
    /// Latency weight λ ∈ (0, 1).
    pub lambda: f64,
    /// Inputs it carries (images, sequences).
    pub inputs: u32,
    /// Arrival, ms.
    pub arrival_ms: u64,
    /// Deadline on its execution latency, ms: the model's SLO for an LC task; for a TO task
    /// the SLO per input times its inputs (§2.1: TO tasks have throughput deadlines).
    /// Assumption: the SLO values are Table 6's; applying them to execution latency follows
    /// Eq. 8's "must be executed with latency within it"; the TO scaling is ours.
    pub deadline_ms: f64,
}

impl Task {
    /// Its class, from λ.
    pub fn class(&self) -> Class {
        Class::of(self.lambda)
    }
}

/// How requests arrive (§4.1.1's stress test).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Evenly spaced, Table 7's uniform rates.
    Uniform,
    /// Poisson arrivals, Table 7's Poisson rates.
    Poisson,
    /// Poisson at Table 7's Poisson rates modulated on/off (4× for 1 s in every 5 s, ¼
    /// otherwise): a synthetic stand-in for the Apollo trace the paper uses, which we do not
    /// have. Assumption, ours.
    Bursty,
}

impl Pattern {
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Uniform => "uniform",
            Pattern::Poisson => "poisson",
            Pattern::Bursty => "bursty",
        }
    }
}

/// Requests per second of model `m` (an index into [`models`]) under `pattern`. Assumption:
/// Table 7 (ResNet-18 70/60, YOLOv5 50/40, ResNet-50/152 40/25, BERT-base 10/5, GPT-2 3/2);
/// a row shared by two variants is split evenly between them; BERT's row is shared with
/// BERT-medium the same way (ours).
pub fn rate_rps(model: &Model, pattern: Pattern) -> f64 {
    let uniform = !matches!(pattern, Pattern::Poisson | Pattern::Bursty);
    let (u, p) = match model.size {
        Size::S => (70.0, 60.0),
        Size::M => (25.0, 20.0),
        Size::L => (5.0, 2.5),
        Size::Xl => (20.0, 12.5),
        Size::Xxl => (3.0, 2.0),
    };
    if uniform { u } else { p }
}

/// A seeded workload of `secs` seconds: every model's requests under `pattern`, by arrival.
/// 90% of a vision model's tasks are LC and 90% of an NLP model's TO (§4.1); λ is uniform in
/// (0.55, 0.95) for LC and (0.05, 0.5] for TO (ours). Inputs: LC 1–8, TO 16–64 (ours).
pub fn workload(pattern: Pattern, secs: u64, seed: u64) -> Vec<Task> {
    workload_at(pattern, secs, seed, 1.0)
}

/// [`workload`] with every rate times `load` (the stress test's heavier loads: Table 7's rates
/// on our simulated speeds leave the testbed mostly idle; the factor is ours).
pub fn workload_at(pattern: Pattern, secs: u64, seed: u64, load: f64) -> Vec<Task> {
    let mut rng = Rng::with_seed(seed);
    let models = models();
    let horizon = secs * 1000;
    let mut tasks = Vec::new();
    for (mi, model) in models.iter().enumerate() {
        let rate = rate_rps(model, pattern) * load / 1000.0;
        let mut t = 0.0f64;
        loop {
            let burst = (t as u64 % 5000) < 1000;
            let r = match pattern {
                Pattern::Bursty if burst => rate * 4.0,
                Pattern::Bursty => rate / 4.0,
                _ => rate,
            };
            t += match pattern {
                Pattern::Uniform => 1.0 / r,
                _ => -(1.0 - rng.f64()).ln() / r,
            };
            if t >= horizon as f64 {
                break;
            }
            let majority = rng.f64() < 0.9;
            let lc = (model.domain == Domain::Vision) == majority;
            let lambda = if lc {
                0.55 + 0.4 * rng.f64()
            } else {
                0.05 + 0.45 * rng.f64()
            };
            let inputs = if lc { rng.u32(1..=8) } else { rng.u32(16..=64) };
            let deadline_ms = match Class::of(lambda) {
                Class::Lc => model.slo_ms,
                Class::To => model.slo_ms * f64::from(inputs),
            };
            tasks.push(Task {
                id: 0,
                model: mi,
                lambda,
                inputs,
                arrival_ms: t as u64,
                deadline_ms,
            });
        }
    }
    tasks.sort_by_key(|t| (t.arrival_ms, t.model));
    for (i, t) in tasks.iter_mut().enumerate() {
        t.id = i;
    }
    tasks
}

/// Ground-truth slowdown of a task co-running with `others` under MPS: its solo time times
/// `1 + Σ ι(pair)`, with ι derived from Table 1 so that two equal kernels co-run take the
/// table's co-located/sequential ratio: CI+CI 2.35/2.3 → ι = 1.04, MI+MI 1.45/1.6 → ι = 0.81,
/// CI+MI 1.3/1.9 → ι = 0.37. Assumption: Table 1 (derived), applied to whole models.
pub fn interference(model: &Model, others: &[&Model]) -> f64 {
    1.0 + others
        .iter()
        .map(
            |o| match (model.compute_intensive(), o.compute_intensive()) {
                (true, true) => 2.0 * 2.35 / 2.3 - 1.0,
                (false, false) => 2.0 * 1.45 / 1.6 - 1.0,
                _ => 2.0 * 1.3 / 1.9 - 1.0,
            },
        )
        .sum::<f64>()
}
