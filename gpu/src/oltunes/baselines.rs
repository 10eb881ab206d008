//! The paper's scheduling baselines (§4.1.2), as it describes them:
//!
//! - [`Mlaas`]: Alibaba MLaaS' reserving-and-packing. High-end GPUs (the A100s) are reserved
//!   for high-GPU tasks (the large models, L/XL/XXL: ours, from §4.2.2's reading of its
//!   results), the other tasks are packed onto the regular GPUs (the 4090 and the A30s), each
//!   onto the fullest GPU of its pool where it fits, first come first served;
//! - [`Orion`]: LC tasks are high priority and placed first, on the first GPU where they fit
//!   ("best-effort" GPU selection, as the paper adds); a TO (best-effort) task runs only when no
//!   LC task waits, and only beside LC tasks of the complementary kind (CI with MI), Orion's
//!   affinity rule.
//!
//! Neither tunes: every task runs at its default batch size (its inputs, at most 32, on
//! Table 3's grid: ours) with no SM limit (100%), as without OLTunes' auto-tuner.

use std::collections::VecDeque;

use super::predictor::{BATCHES, Sample};
use super::sim::{GpuState, Launch, Running, Scheduler};
use super::task::{Class, Model, Task};

/// The batch size a task runs at without tuning.
pub fn default_batch(task: &Task) -> u32 {
    let want = task.inputs.min(32);
    BATCHES.iter().copied().find(|b| *b >= want).unwrap_or(32)
}

fn launch(task: &Task, gpu: usize) -> Launch {
    Launch {
        task: task.id,
        gpu,
        batch: default_batch(task),
        sm_pct: 100.0,
    }
}

/// MLaaS' reserving-and-packing (see the module doc).
#[derive(Debug, Clone)]
pub struct Mlaas {
    models: Vec<Model>,
    high: VecDeque<Task>,
    low: VecDeque<Task>,
}

impl Mlaas {
    /// Over these models.
    pub fn new(models: Vec<Model>) -> Mlaas {
        Mlaas {
            models,
            high: VecDeque::new(),
            low: VecDeque::new(),
        }
    }
}

impl Scheduler for Mlaas {
    fn name(&self) -> &'static str {
        "MLaaS (R&P)"
    }

    fn arrive(&mut self, task: &Task, _now: u64, _gpus: &[GpuState]) {
        if self.models[task.model].size.small() {
            self.low.push_back(task.clone());
        } else {
            self.high.push_back(task.clone());
        }
    }

    fn step(&mut self, _now: u64, gpus: &[GpuState], out: &mut Vec<Launch>) {
        let mut view = gpus.to_vec();
        for (queue, high) in [(&mut self.high, true), (&mut self.low, false)] {
            while let Some(task) = queue.front() {
                let mem = self.models[task.model].memory_gb(default_batch(task));
                let best = view
                    .iter()
                    .enumerate()
                    .filter(|(_, g)| g.ty.high_end() == high && g.fits(mem))
                    .min_by(|(_, a), (_, b)| a.free_gb().total_cmp(&b.free_gb()))
                    .map(|(i, _)| i);
                let Some(gpu) = best else { break };
                let task = queue.pop_front().expect("front");
                reserve(&mut view[gpu], &task, mem);
                out.push(launch(&task, gpu));
            }
        }
    }

    /// Never happens (it places only where the task fits); the task would wait at the head.
    fn refused(&mut self, launch: Launch, _now: u64) {
        tracing::warn!(task = launch.task, "MLaaS launch refused");
    }

    fn finished(&mut self, _task: usize, _sample: Sample) {}
}

/// Orion with best-effort GPU selection (see the module doc).
#[derive(Debug, Clone)]
pub struct Orion {
    models: Vec<Model>,
    lc: VecDeque<Task>,
    be: VecDeque<Task>,
}

impl Orion {
    /// Over these models.
    pub fn new(models: Vec<Model>) -> Orion {
        Orion {
            models,
            lc: VecDeque::new(),
            be: VecDeque::new(),
        }
    }
}

impl Scheduler for Orion {
    fn name(&self) -> &'static str {
        "Orion"
    }

    fn arrive(&mut self, task: &Task, _now: u64, _gpus: &[GpuState]) {
        match task.class() {
            Class::Lc => self.lc.push_back(task.clone()),
            Class::To => self.be.push_back(task.clone()),
        }
    }

    fn step(&mut self, _now: u64, gpus: &[GpuState], out: &mut Vec<Launch>) {
        let mut view = gpus.to_vec();
        while let Some(task) = self.lc.front() {
            let mem = self.models[task.model].memory_gb(default_batch(task));
            let Some(gpu) = view.iter().position(|g| g.fits(mem)) else {
                break;
            };
            let task = self.lc.pop_front().expect("front");
            reserve(&mut view[gpu], &task, mem);
            out.push(launch(&task, gpu));
        }
        if !self.lc.is_empty() {
            return;
        }
        while let Some(task) = self.be.front() {
            let model = &self.models[task.model];
            let mem = model.memory_gb(default_batch(task));
            let complementary = |g: &GpuState| {
                g.running
                    .iter()
                    .all(|r| self.models[r.model].compute_intensive() != model.compute_intensive())
            };
            let Some(gpu) = view.iter().position(|g| g.fits(mem) && complementary(g)) else {
                break;
            };
            let task = self.be.pop_front().expect("front");
            reserve(&mut view[gpu], &task, mem);
            out.push(launch(&task, gpu));
        }
    }

    /// Never happens (it places only where the task fits).
    fn refused(&mut self, launch: Launch, _now: u64) {
        tracing::warn!(task = launch.task, "Orion launch refused");
    }

    fn finished(&mut self, _task: usize, _sample: Sample) {}
}

/// Marks `mem` of `g` taken by `task` in a scheduler's own view for the rest of a tick.
fn reserve(g: &mut GpuState, task: &Task, mem: f64) {
    g.running.push(Running::placeholder(task.model, mem));
}
