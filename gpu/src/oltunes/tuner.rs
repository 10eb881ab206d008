//! OLTunes' tuning model (§3.3.3) and auto-tuner (§3.4.3).
//!
//! For a task, every combination `k` of batch size `b`, SM% `c` (and the memory `m` that `b`
//! implies) on every GPU type `g` is scored by Eq. 4,
//! `f = λ/ŷ¹ + (1−λ)ŷ² + α·max(0, T − ŷ'¹) − β·EPC(g)`, with EPC (Eq. 7) as a **penalty**:
//! the paper's Eq. 4 adds it, but its worked example picks the GPU with the lower EPC
//! (1068 vs 991 → B; 108 vs 113.2 → A). The terms are normalized by us (the paper mentions
//! "denormalization" without saying how): `ŷ¹` enters as best/own, `ŷ²` as own/best, the slack
//! over the deadline, EPC over the task's largest. α = 0.5 and β = 0.1 + 0.4·load are
//! **assumptions, ours** (the paper: β grows with the load; no values).
//!
//! The two GPU types with the best score are kept (Eq. 5, "top-2"; the prose's "best three"
//! contradicts it), and for each of them the best record per batch size is `D_t` (Eq. 6).

use super::predictor::{BATCHES, Predictor, sm_values};
use super::task::{GpuType, Model, P_BASE_W, Task};

/// α of Eq. 4 (assumption, ours).
pub const ALPHA: f64 = 0.5;

/// One tuning record `(g, b, c, m, ŷ¹, ŷ²)` of Eq. 6, with the task's predicted execution
/// latency and score.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Record {
    /// GPU type.
    pub gpu: GpuType,
    /// Inference batch size.
    pub batch: u32,
    /// SM%.
    pub sm_pct: f64,
    /// Memory it holds, GB.
    pub mem_gb: f64,
    /// Predicted latency of one batch, ms (ŷ¹).
    pub batch_ms: f64,
    /// Predicted throughput, inputs/s (ŷ²).
    pub throughput: f64,
    /// Predicted execution latency of the whole task, ms.
    pub jct_ms: f64,
    /// Eq. 4's score.
    pub score: f64,
}

/// Estimated power consumption of Eq. 7 for a record: `P_base + (TDP − P_base)·SM util ·
/// Mem used / Total mem · ŷ¹` (ŷ¹ in seconds; an energy-like figure, as the paper's).
pub fn epc(gpu: GpuType, sm_pct: f64, mem_gb: f64, seconds: f64) -> f64 {
    P_BASE_W + (gpu.tdp_w() - P_BASE_W) * (sm_pct / 100.0) * (mem_gb / gpu.memory_gb()) * seconds
}

/// A task's tuning candidates: `D_t` and its top-2 GPU types.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidates {
    /// The two best GPU types (Eq. 5), best first.
    pub top: Vec<GpuType>,
    /// Best record per (type in `top`, batch size) (Eq. 6).
    pub records: Vec<Record>,
}

impl Candidates {
    /// The best record on `gpu`, if it is one of the top types.
    pub fn best_on(&self, gpu: GpuType) -> Option<Record> {
        self.records
            .iter()
            .filter(|r| r.gpu == gpu)
            .max_by(|a, b| a.score.total_cmp(&b.score))
            .copied()
    }

    /// The records on `gpu`.
    pub fn on(&self, gpu: GpuType) -> impl Iterator<Item = &Record> {
        self.records.iter().filter(move |r| r.gpu == gpu)
    }
}

/// Scores every `(g, b, c)` for `task` (Eq. 4) and keeps `D_t` for the top-2 types. `load` in
/// [0, 1] sets β. Batch sizes past the first that covers the task's inputs are not scored
/// (they would only hold memory), nor combinations that do not fit the type's memory.
pub fn candidates(
    predictor: &Predictor,
    model: &Model,
    task: &Task,
    types: &[GpuType],
    load: f64,
) -> Candidates {
    let beta = 0.1 + 0.4 * load.clamp(0.0, 1.0);
    let last = BATCHES
        .iter()
        .position(|b| *b >= task.inputs)
        .unwrap_or(BATCHES.len() - 1);
    let mut all = Vec::new();
    for &g in types {
        for &b in &BATCHES[..=last] {
            let mem = model.memory_gb(b);
            if mem > g.memory_gb() {
                continue;
            }
            for c in sm_values() {
                let (lat, thr) = predictor.predict(task.model, g, b, c);
                let jct = f64::from(task.inputs.div_ceil(b)) * lat;
                all.push(Record {
                    gpu: g,
                    batch: b,
                    sm_pct: c,
                    mem_gb: mem,
                    batch_ms: lat,
                    throughput: thr,
                    jct_ms: jct,
                    score: 0.0,
                });
            }
        }
    }
    let min_jct = all.iter().map(|r| r.jct_ms).fold(f64::INFINITY, f64::min);
    let max_thr = all.iter().map(|r| r.throughput).fold(0.0, f64::max);
    let epcs: Vec<f64> = all
        .iter()
        .map(|r| epc(r.gpu, r.sm_pct, r.mem_gb, r.jct_ms / 1000.0))
        .collect();
    let max_epc = epcs.iter().copied().fold(0.0, f64::max).max(1e-9);
    let l = task.lambda;
    for (r, e) in all.iter_mut().zip(&epcs) {
        r.score = l * (min_jct / r.jct_ms)
            + (1.0 - l) * (r.throughput / max_thr.max(1e-9))
            + ALPHA * (task.deadline_ms - r.jct_ms).max(0.0) / task.deadline_ms
            - beta * e / max_epc;
    }
    let mut best_by_type: Vec<(GpuType, f64)> = types
        .iter()
        .filter_map(|g| {
            all.iter()
                .filter(|r| r.gpu == *g)
                .map(|r| r.score)
                .max_by(f64::total_cmp)
                .map(|s| (*g, s))
        })
        .collect();
    best_by_type.sort_by(|a, b| b.1.total_cmp(&a.1));
    let top: Vec<GpuType> = best_by_type.iter().take(2).map(|(g, _)| *g).collect();
    let mut records = Vec::new();
    for &g in &top {
        for &b in &BATCHES[..=last] {
            if let Some(r) = all
                .iter()
                .filter(|r| r.gpu == g && r.batch == b)
                .max_by(|x, y| x.score.total_cmp(&y.score))
            {
                records.push(*r);
            }
        }
    }
    Candidates { top, records }
}

/// The auto-tuner of §3.4.3 on one group bound for a GPU of type `gpu` with `free_gb` left
/// over: TO tasks first (then LC), the first task with at least two records on `gpu` that has
/// a larger batch size improving its prediction (TO: throughput up; LC: latency down) whose
/// extra memory fits is moved to the best such record; at most one task a group. `group`
/// holds each task's class (true: TO), candidates and current record; returns the index
/// tuned.
pub fn autotune(
    group: &mut [(bool, &Candidates, Record)],
    gpu: GpuType,
    free_gb: f64,
) -> Option<usize> {
    let mut order: Vec<usize> = (0..group.len()).collect();
    order.sort_by_key(|i| !group[*i].0);
    for i in order {
        let (to, cands, cur) = (group[i].0, group[i].1, group[i].2);
        if cands.on(gpu).count() < 2 {
            continue;
        }
        let better = cands
            .on(gpu)
            .filter(|r| r.batch > cur.batch && r.mem_gb - cur.mem_gb <= free_gb)
            .filter(|r| {
                if to {
                    r.throughput > cur.throughput
                } else {
                    r.jct_ms < cur.jct_ms
                }
            })
            .max_by(|a, b| {
                if to {
                    a.throughput.total_cmp(&b.throughput)
                } else {
                    b.jct_ms.total_cmp(&a.jct_ms)
                }
            });
        if let Some(r) = better {
            group[i].2 = *r;
            return Some(i);
        }
    }
    None
}
