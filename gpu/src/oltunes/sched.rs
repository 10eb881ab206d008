//! OLTunes' scheduler (§3.4, Algorithms 2 and 3): the main queue, `Q_LC` and `Q_TO` by
//! urgency, the lowest-utilization target GPU, co-location groups ("batches") filled LC first
//! under the memory limit, the window `W_time`, `batch_size_max` and the affinity checker,
//! the auto-tuner, feedback on a refused assignment, and the window adjusted by the LC share.

use super::predictor::{FtrlConfig, Predictor, Retrain, Sample};
use super::sim::{GpuState, Launch, MAX_COLOCATED, Scheduler};
use super::task::{Class, GpuType, Model, Task};
use super::tuner::{Candidates, Record, autotune, candidates};

/// `W_min`, ms (Table 4).
pub const W_MIN_MS: u64 = 50;
/// `W_max`, ms (Table 4).
pub const W_MAX_MS: u64 = 1000;
/// `w`, the window step, ms (Table 4).
pub const W_STEP_MS: u64 = 10;
/// ρ_lc, the LC share above which the window shrinks (Table 4).
pub const RHO_LC: f64 = 0.7;
/// The affinity threshold (§3.4.2, default 70).
pub const AFFINITY_THRESHOLD: f64 = 70.0;
/// `min_mem` of Algorithm 2, GB: memory a group leaves free. Assumption, ours (no value).
pub const MIN_MEM_GB: f64 = 0.5;
/// Share of a GPU's memory free, or of its longest task done, that makes a busy GPU available
/// (§3.4.1: "more than 80%").
pub const AVAILABLE_SHARE: f64 = 0.8;

/// Workload affinity of two tasks (Eq. 9): `100·sigmoid(|Δratio|)` of their CI/MI ratios.
pub fn workload_affinity(a: &Model, b: &Model) -> f64 {
    100.0 / (1.0 + (-(a.ratio - b.ratio).abs()).exp())
}

/// Variant affinity of two tasks (Eq. 11): high+low 100, low+low 50, high+high 0.
pub fn variant_affinity(a: &Model, b: &Model) -> f64 {
    match (a.high, b.high) {
        (true, true) => 0.0,
        (false, false) => 50.0,
        _ => 100.0,
    }
}

/// The affinity of a new task with a group (Eqs. 10–11 averaged over the group, then the mean
/// of the two); 100 for an empty group.
pub fn affinity(new: &Model, group: &[&Model]) -> f64 {
    if group.is_empty() {
        return 100.0;
    }
    let n = group.len() as f64;
    let w = group.iter().map(|m| workload_affinity(new, m)).sum::<f64>() / n;
    let v = group.iter().map(|m| variant_affinity(new, m)).sum::<f64>() / n;
    (w + v) / 2.0
}

/// `isAffinityHigh` (Algorithm 3, line 10).
pub fn is_affinity_high(new: &Model, group: &[&Model]) -> bool {
    affinity(new, group) >= AFFINITY_THRESHOLD
}

/// `adjustTimeWindow` (Algorithm 3, lines 11–19): shrink `W_time` by `w` while LC tasks are
/// more than ρ_lc of the waiting tasks, else grow it. With no task waiting, the paper's
/// `len(Q_lc) / (len(Q_lc) + len(Q_to))` is 0/0 and says nothing of the load (§3.4.4: the
/// window follows "the ratio of LC tasks"); `W_time` is then left as it is (ours). Growing it
/// there instead, as this function did before, made the window climb by `w` after every
/// window that drained the queues: from 50 to 780 ms within every 30 s run at Table 7's rates,
/// where groups then filled to `batch_size_max` and co-started (README.md, "At Table 7's
/// rates").
pub fn adjust_window(lc: usize, to: usize, w: u64) -> u64 {
    let total = lc + to;
    if total == 0 {
        return w;
    }
    if lc as f64 / total as f64 > RHO_LC {
        w.saturating_sub(W_STEP_MS).max(W_MIN_MS)
    } else {
        (w + W_STEP_MS).min(W_MAX_MS)
    }
}

#[derive(Debug, Clone)]
struct Queued {
    task: Task,
    cands: Candidates,
    /// deadline / predicted latency; smaller first.
    priority: f64,
    /// Predicted execution latency (shortest job first on ties).
    jct_ms: f64,
}

#[derive(Debug, Clone)]
struct Group {
    gpu: usize,
    limit_gb: f64,
    members: Vec<(Queued, Record)>,
}

/// OLTunes as a [`Scheduler`].
#[derive(Debug, Clone)]
pub struct OlTunes {
    models: Vec<Model>,
    types: Vec<GpuType>,
    gpu_count: usize,
    predictor: Predictor,
    main: Vec<Task>,
    q_lc: Vec<Queued>,
    q_to: Vec<Queued>,
    groups: Vec<Group>,
    /// `W_time`, ms.
    pub w_time: u64,
    /// `batch_size_max`.
    pub batch_size_max: usize,
    t_last_batch: u64,
    tuned: usize,
    in_flight: std::collections::BTreeMap<usize, Queued>,
}

impl OlTunes {
    /// OLTunes over a cluster of `gpus`, its predictor pretrained on `profile` (the Job
    /// Profiler's trial runs).
    pub fn new(models: Vec<Model>, gpus: &[GpuType], profile: &[Sample], seed: u64) -> OlTunes {
        let mut predictor = Predictor::new(
            models.clone(),
            FtrlConfig::default(),
            Retrain::default(),
            seed,
        );
        predictor.pretrain(profile, 20);
        let mut types: Vec<GpuType> = gpus.to_vec();
        types.sort();
        types.dedup();
        OlTunes {
            models,
            types,
            gpu_count: gpus.len(),
            predictor,
            main: Vec::new(),
            q_lc: Vec::new(),
            q_to: Vec::new(),
            groups: Vec::new(),
            w_time: W_MIN_MS,
            batch_size_max: MAX_COLOCATED,
            t_last_batch: 0,
            tuned: 0,
            in_flight: Default::default(),
        }
    }

    /// Groups whose auto-tuning changed a task.
    pub fn tuned(&self) -> usize {
        self.tuned
    }

    /// The predictor.
    pub fn predictor(&self) -> &Predictor {
        &self.predictor
    }

    fn load(&self) -> f64 {
        (self.main.len() + self.q_lc.len() + self.q_to.len()) as f64
            / (MAX_COLOCATED * self.gpu_count).max(1) as f64
    }

    /// Main queue → `Q_LC` / `Q_TO`, with `D_t` predicted now and the urgency priority.
    fn dispatch_main(&mut self) {
        let load = self.load();
        for task in std::mem::take(&mut self.main) {
            let model = &self.models[task.model];
            let cands = candidates(&self.predictor, model, &task, &self.types, load);
            let jct_ms = cands
                .top
                .first()
                .and_then(|g| cands.best_on(*g))
                .map_or(f64::INFINITY, |r| r.jct_ms);
            let q = Queued {
                priority: task.deadline_ms / jct_ms.max(1e-6),
                jct_ms,
                cands,
                task,
            };
            match q.task.class() {
                Class::Lc => self.q_lc.push(q),
                Class::To => self.q_to.push(q),
            }
        }
        let key = |a: &Queued, b: &Queued| {
            a.priority
                .total_cmp(&b.priority)
                .then(a.jct_ms.total_cmp(&b.jct_ms))
                .then(a.task.id.cmp(&b.task.id))
        };
        self.q_lc.sort_by(key);
        self.q_to.sort_by(key);
    }

    /// Tasks and GB of the open groups on GPU `gpu`, other than group `except`.
    fn pending(&self, gpu: usize, except: Option<usize>) -> (usize, f64) {
        self.groups
            .iter()
            .enumerate()
            .filter(|(i, g)| g.gpu == gpu && Some(*i) != except)
            .flat_map(|(_, g)| &g.members)
            .fold((0, 0.0), |(n, m), (_, r)| (n + 1, m + r.mem_gb))
    }

    /// `getResources` (Algorithm 3, lines 1–6) for a task: empty GPUs, else those more than
    /// 80% free or whose longest task is more than 80% done; the lowest utilization. Ours: only
    /// GPUs of a type in the task's top-2 (the paper picks the GPU first and then the tasks
    /// that list it; an idle GPU no queued task lists would then hold the loop for a whole
    /// window), with room for one more task besides the open groups bound there.
    ///
    /// A GPU an open group is bound to is not empty: Algorithm 2 forms one batch for its
    /// `target_gpu` (lines 9–20) and only then picks the next target (line 9 of the next
    /// pass), so while a GPU is fully empty elsewhere, every task that co-starts on a GPU has
    /// passed `isAffinityHigh` against the others (Algorithm 3 line 10, §3.4.2). Only when no
    /// GPU of its top-2 is empty does a task open a second group beside a running or forming
    /// one, under §3.4.1's rule for occupied GPUs ("more than 80% available capacity", the
    /// open groups' memory counted, or "soon-to-be-ready").
    fn target(&self, task: &Queued, gpus: &[GpuState]) -> Option<usize> {
        let pick = |ok: &dyn Fn(usize, &GpuState) -> bool| {
            gpus.iter()
                .enumerate()
                .filter(|(i, g)| {
                    ok(*i, g)
                        && task.cands.top.contains(&g.ty)
                        && g.running.len() + self.pending(*i, None).0 < MAX_COLOCATED
                })
                .min_by(|(_, a), (_, b)| a.utilization().total_cmp(&b.utilization()))
                .map(|(i, _)| i)
        };
        pick(&|i, g| g.running.is_empty() && self.pending(i, None).0 == 0).or_else(|| {
            pick(&|i, g| {
                g.free_gb() - self.pending(i, None).1 > AVAILABLE_SHARE * g.ty.memory_gb()
                    || g.running.iter().map(|r| r.progress()).fold(1.0, f64::min) > AVAILABLE_SHARE
            })
        })
    }

    /// Whether `q` may join `group` (Algorithm 2 line 16 and `fitForBatch`): memory left over
    /// `min_mem`, fewer than `batch_size_max` tasks, the GPU in its top-2, high affinity.
    fn fits(
        &self,
        q: &Queued,
        group: &Group,
        index: Option<usize>,
        gpus: &[GpuState],
    ) -> Option<Record> {
        let g = &gpus[group.gpu];
        let room = MAX_COLOCATED.saturating_sub(g.running.len() + self.pending(group.gpu, index).0);
        if group.members.len() >= self.batch_size_max.min(room) {
            return None;
        }
        let r = q.cands.best_on(g.ty)?;
        let mem_curr: f64 = group.members.iter().map(|(_, r)| r.mem_gb).sum();
        if group.limit_gb - mem_curr - r.mem_gb <= MIN_MEM_GB {
            return None;
        }
        let ms: Vec<&Model> = group
            .members
            .iter()
            .map(|(m, _)| &self.models[m.task.model])
            .collect();
        is_affinity_high(&self.models[q.task.model], &ms).then_some(r)
    }

    fn full(&self, group: &Group, index: usize, gpus: &[GpuState]) -> bool {
        let room = MAX_COLOCATED
            .saturating_sub(gpus[group.gpu].running.len() + self.pending(group.gpu, Some(index)).0);
        let mem_curr: f64 = group.members.iter().map(|(_, r)| r.mem_gb).sum();
        group.members.len() >= self.batch_size_max.min(room)
            || group.limit_gb - mem_curr <= 2.0 * MIN_MEM_GB
    }

    /// Fills the window's groups from `Q_LC`, then `Q_TO` (Algorithm 2, lines 12–20): each
    /// task, by priority, joins the first open group it fits, or opens one on its target GPU.
    fn fill(&mut self, gpus: &[GpuState]) {
        for lc in [true, false] {
            let mut queue = std::mem::take(if lc { &mut self.q_lc } else { &mut self.q_to });
            let mut left = Vec::with_capacity(queue.len());
            for q in queue.drain(..) {
                let joined = (0..self.groups.len()).find_map(|i| {
                    self.fits(&q, &self.groups[i], Some(i), gpus)
                        .map(|r| (i, r))
                });
                if let Some((i, r)) = joined {
                    self.groups[i].members.push((q, r));
                    continue;
                }
                let opened = self.target(&q, gpus).and_then(|gpu| {
                    let group = Group {
                        gpu,
                        limit_gb: gpus[gpu].free_gb() - self.pending(gpu, None).1,
                        members: Vec::new(),
                    };
                    self.fits(&q, &group, None, gpus).map(|r| (group, r))
                });
                match opened {
                    Some((mut group, r)) => {
                        group.members.push((q, r));
                        self.groups.push(group);
                    }
                    None => left.push(q),
                }
            }
            if lc {
                self.q_lc = left;
            } else {
                self.q_to = left;
            }
        }
    }

    /// Auto-tunes a group (if memory is left) and assigns it.
    fn submit(&mut self, group: Group, gpus: &[GpuState], out: &mut Vec<Launch>) {
        let ty = gpus[group.gpu].ty;
        let mem_curr: f64 = group.members.iter().map(|(_, r)| r.mem_gb).sum();
        let mut tuning: Vec<(bool, &Candidates, Record)> = group
            .members
            .iter()
            .map(|(q, r)| (q.task.class() == Class::To, &q.cands, *r))
            .collect();
        if mem_curr < group.limit_gb
            && autotune(&mut tuning, ty, group.limit_gb - mem_curr - MIN_MEM_GB).is_some()
        {
            self.tuned += 1;
        }
        let records: Vec<Record> = tuning.iter().map(|t| t.2).collect();
        for ((q, _), r) in group.members.into_iter().zip(records) {
            out.push(Launch {
                task: q.task.id,
                gpu: group.gpu,
                batch: r.batch,
                sm_pct: r.sm_pct,
            });
            self.in_flight.insert(q.task.id, q);
        }
    }
}

impl Scheduler for OlTunes {
    fn name(&self) -> &'static str {
        "OLTunes"
    }

    fn arrive(&mut self, task: &Task, _now: u64, _gpus: &[GpuState]) {
        self.main.push(task.clone());
    }

    /// One pass of Algorithm 2's loop: queues sorted, groups filled; a full group is
    /// assigned at once (Fig. 9's b4), the others when the window `W_time` since the last
    /// submission ends (Fig. 9's "Submit"), after which the window is adjusted to the load.
    fn step(&mut self, now: u64, gpus: &[GpuState], out: &mut Vec<Launch>) {
        self.dispatch_main();
        self.fill(gpus);
        let expired = now.saturating_sub(self.t_last_batch) >= self.w_time;
        let ready: Vec<bool> = (0..self.groups.len())
            .map(|i| expired || self.full(&self.groups[i], i, gpus))
            .collect();
        let mut go = Vec::new();
        for (group, ready) in std::mem::take(&mut self.groups).into_iter().zip(ready) {
            if ready {
                go.push(group);
            } else {
                self.groups.push(group);
            }
        }
        for group in go {
            self.submit(group, gpus, out);
            self.batch_size_max = (self.batch_size_max + 1).min(MAX_COLOCATED);
        }
        if expired {
            // The load: LC and TO tasks waiting, in the queues and in open groups (ours: the
            // paper counts the queues, which hold every waiting task in its loop).
            let grouped = self.groups.iter().flat_map(|g| &g.members);
            let lc = self.q_lc.len()
                + grouped
                    .clone()
                    .filter(|(q, _)| q.task.class() == Class::Lc)
                    .count();
            let to = self.q_to.len() + grouped.filter(|(q, _)| q.task.class() == Class::To).count();
            self.t_last_batch = now;
            self.w_time = adjust_window(lc, to, self.w_time);
        }
    }

    /// `feedback` (Algorithm 3, lines 20–22): the task goes back to `Q_LC` with a higher
    /// priority, and `W_time` and `batch_size_max` go down.
    fn refused(&mut self, launch: Launch, _now: u64) {
        if let Some(mut q) = self.in_flight.remove(&launch.task) {
            q.priority = q.priority.min(0.0) - 1.0;
            self.q_lc.insert(0, q);
        }
        self.w_time = self.w_time.saturating_sub(W_STEP_MS).max(W_MIN_MS);
        self.batch_size_max = self.batch_size_max.saturating_sub(1).max(1);
    }

    fn finished(&mut self, task: usize, sample: Sample) {
        self.in_flight.remove(&task);
        self.predictor.observe(sample);
    }

    fn retrains(&self) -> usize {
        self.predictor.retrains()
    }
}
