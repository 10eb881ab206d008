//! A fleet of simulated GPUs ([`SimGpu`]) that a slice policy ([`Placer`]: the
//! [`Partitioner`], [`FirstFitPolicy`] or [`StaticPolicy`]) drives in simulated time, with
//! driver (NVML) errors injected at a chosen phase of a reconfiguration and a record of every
//! slice each task held, so that tests and the harness can check that no slice was ever held
//! by two tasks and measure the time from submit to run.
//!
//! An injected error is a real driver's worst case: the operation may have happened or not (a
//! failed create leaves its instance behind, being created; a failed destroy removes it; an
//! instance whose coming up fails is there, idle), and the policy is told only that the GPU
//! failed. The commands the policy gave the same GPU in the same round after the failing one
//! are not carried out.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use escher_proto::mig::{JobModel, Layout, Placement};
use escher_proto::types::TaskId;

use super::{FirstFit, Order, Partitioner, Request, SubmitError, first_fit, profile_on};
use crate::sim::TaskModel;
use crate::{Command, Event, GpuSeam, GpuView, InstanceState, SimGpu};

/// A policy that hands out MIG slices on a fleet.
pub trait Placer {
    /// Its name, as printed.
    fn name(&self) -> &'static str;
    /// Queues a request, or refuses it with nothing queued.
    fn submit(
        &mut self,
        gpus: &[GpuView],
        request: Request,
        now_ms: u64,
    ) -> Result<(), SubmitError>;
    /// The commands of one round.
    fn round(&mut self, gpus: &[GpuView]) -> Vec<Order>;
    /// A driver error on a GPU.
    fn failed(&mut self, gpu: usize, error: String);
    /// The requests waiting, in order, each with why, as a user would read it.
    fn waiting(&self) -> Vec<(Request, String)>;
}

impl Placer for Partitioner {
    fn name(&self) -> &'static str {
        "partitioner"
    }
    fn submit(
        &mut self,
        gpus: &[GpuView],
        request: Request,
        now_ms: u64,
    ) -> Result<(), SubmitError> {
        Partitioner::submit(self, gpus, request, now_ms)
    }
    fn round(&mut self, gpus: &[GpuView]) -> Vec<Order> {
        Partitioner::round(self, gpus)
    }
    fn failed(&mut self, gpu: usize, error: String) {
        Partitioner::failed(self, gpu, error);
    }
    fn waiting(&self) -> Vec<(Request, String)> {
        self.pending()
            .map(|p| (p.request.clone(), p.reason.clone()))
            .collect()
    }
}

/// [`first_fit`] as a policy: requests in order, slices created for one reserved for it.
#[derive(Debug, Clone, Default)]
pub struct FirstFitPolicy {
    pending: VecDeque<Request>,
    reserved: BTreeMap<(usize, u8), TaskId>,
    failed: BTreeSet<usize>,
}

impl Placer for FirstFitPolicy {
    fn name(&self) -> &'static str {
        "first-fit"
    }
    fn submit(
        &mut self,
        gpus: &[GpuView],
        request: Request,
        now_ms: u64,
    ) -> Result<(), SubmitError> {
        // The same checks as the partitioner's, on a scratch copy.
        Partitioner::new().submit(gpus, request.clone(), now_ms)?;
        self.pending.push_back(request);
        Ok(())
    }
    fn round(&mut self, gpus: &[GpuView]) -> Vec<Order> {
        let mut out = Vec::new();
        let mut taken: BTreeSet<(usize, u8)> = self.reserved.keys().copied().collect();
        for &g in &self.failed {
            for p in gpus[g].layout.placements() {
                taken.insert((g, p.start));
            }
        }
        let mut still = VecDeque::new();
        let mut reshaping = BTreeSet::new();
        while let Some(r) = self.pending.pop_front() {
            let tasks: Vec<TaskId> = r.members.iter().map(|m| m.0).collect();
            let mine: Vec<((usize, u8), TaskId)> = self
                .reserved
                .iter()
                .filter(|(_, t)| tasks.contains(t))
                .map(|(k, t)| (*k, *t))
                .collect();
            if !mine.is_empty() {
                let ready = mine.iter().all(|((g, s), _)| {
                    gpus[*g].at(*s).map(|i| i.state) == Some(InstanceState::Idle)
                });
                if ready {
                    for ((g, s), t) in &mine {
                        self.reserved.remove(&(*g, *s));
                        let on = gpus[*g].at(*s).expect("ready").placement;
                        out.push((*g, Command::Launch { task: *t, on }));
                    }
                } else {
                    still.push_back(r);
                }
                continue;
            }
            let skip: BTreeSet<usize> = self.failed.union(&reshaping).copied().collect();
            match first_fit(gpus, &r, &taken, &skip) {
                FirstFit::Reuse(picked) => {
                    for (g, task, on) in picked {
                        taken.insert((g, on.start));
                        out.push((g, Command::Launch { task, on }));
                    }
                }
                FirstFit::Create {
                    gpu,
                    destroy,
                    create,
                } => {
                    reshaping.insert(gpu);
                    out.extend(destroy.into_iter().map(|p| (gpu, Command::Destroy(p))));
                    for ((t, _), p) in r.members.iter().zip(&create) {
                        self.reserved.insert((gpu, p.start), *t);
                        taken.insert((gpu, p.start));
                        out.push((gpu, Command::Create(*p)));
                    }
                    still.push_back(r);
                }
                FirstFit::Wait => still.push_back(r),
            }
        }
        self.pending = still;
        out
    }
    fn failed(&mut self, gpu: usize, _error: String) {
        self.failed.insert(gpu);
        self.reserved.retain(|(g, _), _| *g != gpu);
    }
    fn waiting(&self) -> Vec<(Request, String)> {
        let why = "waiting in order for a slice first-fit finds or makes";
        self.pending
            .iter()
            .map(|r| (r.clone(), why.into()))
            .collect()
    }
}

/// A layout fixed in advance: requests wait for an idle slice of their profile; nothing is
/// ever created or destroyed.
#[derive(Debug, Clone, Default)]
pub struct StaticPolicy {
    pending: VecDeque<Request>,
    failed: BTreeSet<usize>,
}

impl Placer for StaticPolicy {
    fn name(&self) -> &'static str {
        "static layout"
    }
    fn submit(
        &mut self,
        gpus: &[GpuView],
        request: Request,
        now_ms: u64,
    ) -> Result<(), SubmitError> {
        Partitioner::new().submit(gpus, request.clone(), now_ms)?;
        self.pending.push_back(request);
        Ok(())
    }
    fn round(&mut self, gpus: &[GpuView]) -> Vec<Order> {
        let mut out = Vec::new();
        let mut taken: BTreeSet<(usize, u8)> = BTreeSet::new();
        let mut still = VecDeque::new();
        while let Some(r) = self.pending.pop_front() {
            let groups: Vec<Vec<usize>> = if r.one_gpu {
                (0..gpus.len()).map(|g| vec![g]).collect()
            } else {
                vec![(0..gpus.len()).collect()]
            };
            let mut done = false;
            for group in groups {
                let mut picked = Vec::new();
                let mut used = taken.clone();
                for (t, asked) in &r.members {
                    let found = group
                        .iter()
                        .filter(|g| !self.failed.contains(g))
                        .find_map(|&g| {
                            let profile = profile_on(gpus[g].model(), asked)?;
                            gpus[g]
                                .idle()
                                .find(|p| p.profile == profile && !used.contains(&(g, p.start)))
                                .map(|p| (g, p))
                        });
                    let Some((g, p)) = found else { break };
                    used.insert((g, p.start));
                    picked.push((g, *t, p));
                }
                if picked.len() == r.members.len() {
                    for (g, task, on) in picked {
                        taken.insert((g, on.start));
                        out.push((g, Command::Launch { task, on }));
                    }
                    done = true;
                    break;
                }
            }
            if !done {
                still.push_back(r);
            }
        }
        self.pending = still;
        out
    }
    fn failed(&mut self, gpu: usize, _error: String) {
        self.failed.insert(gpu);
    }
    fn waiting(&self) -> Vec<(Request, String)> {
        let why = "waiting for an idle slice of its profile in the fixed layout";
        self.pending
            .iter()
            .map(|r| (r.clone(), why.into()))
            .collect()
    }
}

/// A phase of a reconfiguration at which a driver error can be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Destroying an idle instance.
    Destroy,
    /// Creating an instance (GPU and compute instance).
    Create,
    /// The created instance coming up.
    Ready,
}

/// A slice a task held: on which GPU, which slice, from when to when (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    /// The GPU.
    pub gpu: usize,
    /// The slice.
    pub slice: Placement,
    /// The task.
    pub task: TaskId,
    /// Launched at.
    pub from_ms: u64,
    /// Finished at; `None` while it runs.
    pub to_ms: Option<u64>,
}

/// A fleet of simulated GPUs (see the module doc).
#[derive(Debug, Clone)]
pub struct Fleet {
    /// The GPUs.
    pub gpus: Vec<SimGpu>,
    /// Injected errors not yet fired: the first operation of that phase on that GPU fails.
    pub faults: Vec<(usize, Phase)>,
    /// Every slice every task held.
    pub holds: Vec<Hold>,
    /// Each task's submit and launch times, ms.
    pub times: BTreeMap<TaskId, (u64, Option<u64>)>,
    /// When each GPU failed, ms.
    pub failed_at: BTreeMap<usize, u64>,
    /// Launches on a failed GPU after its failure (must stay empty).
    pub launched_on_failed: Vec<(usize, TaskId)>,
    /// Commands a GPU refused (a policy's mistake: must stay empty).
    pub refused: Vec<(usize, String)>,
    /// GPC-milliseconds of busy slices, summed over the GPUs.
    pub busy_gpc_ms: u64,
    /// When the last task finished, ms.
    pub last_finish_ms: u64,
    jobs: BTreeMap<TaskId, JobModel>,
}

impl Fleet {
    /// A fleet of GPUs starting with these layouts (all idle), ticking every `tick_ms`.
    pub fn new(layouts: Vec<Layout>, tick_ms: u64) -> Fleet {
        Fleet {
            gpus: layouts
                .into_iter()
                .map(|l| SimGpu::new(l, tick_ms))
                .collect(),
            faults: Vec::new(),
            holds: Vec::new(),
            times: BTreeMap::new(),
            failed_at: BTreeMap::new(),
            launched_on_failed: Vec::new(),
            refused: Vec::new(),
            busy_gpc_ms: 0,
            last_finish_ms: 0,
            jobs: BTreeMap::new(),
        }
    }

    /// Now, ms.
    pub fn now(&self) -> u64 {
        self.gpus.first().map_or(0, SimGpu::now)
    }

    /// Every GPU's view.
    pub fn views(&self) -> Vec<GpuView> {
        self.gpus.iter().map(GpuSeam::view).collect()
    }

    /// Submits `request` to `policy` now, each member running `job` once launched.
    pub fn submit(
        &mut self,
        policy: &mut dyn Placer,
        request: Request,
        job: JobModel,
    ) -> Result<(), SubmitError> {
        let now = self.now();
        let members: Vec<TaskId> = request.members.iter().map(|m| m.0).collect();
        policy.submit(&self.views(), request, now)?;
        for t in members {
            self.times.insert(t, (now, None));
            self.jobs.insert(t, job);
        }
        Ok(())
    }

    fn fault(&mut self, gpu: usize, phase: Phase) -> bool {
        match self.faults.iter().position(|f| *f == (gpu, phase)) {
            Some(i) => {
                self.faults.remove(i);
                true
            }
            None => false,
        }
    }

    fn fail(&mut self, policy: &mut dyn Placer, gpu: usize, phase: Phase) {
        let now = self.now();
        self.failed_at.entry(gpu).or_insert(now);
        policy.failed(
            gpu,
            format!("NVML error (injected) at {phase:?} on GPU {gpu}"),
        );
    }

    /// One round of `policy`, then one tick of every GPU.
    pub fn step(&mut self, policy: &mut dyn Placer) {
        let orders = policy.round(&self.views());
        let mut broken: BTreeSet<usize> = BTreeSet::new();
        for (g, command) in orders {
            if broken.contains(&g) {
                continue;
            }
            if self.failed_at.contains_key(&g)
                && let Command::Launch { task, .. } = &command
            {
                self.launched_on_failed.push((g, *task));
            }
            let phase = match command {
                Command::Destroy(_) => Some(Phase::Destroy),
                Command::Create(_) => Some(Phase::Create),
                _ => None,
            };
            if let Command::Launch { task, on } = command {
                let job = self
                    .jobs
                    .get(&task)
                    .copied()
                    .unwrap_or(JobModel::fixed(1.0, 7, 1.0));
                self.gpus[g].add_task(task, TaskModel::Batch(job));
                if let Err(e) = self.gpus[g].execute(command.clone()) {
                    self.refused
                        .push((g, format!("{command} at {} ms: {e}", self.now())));
                    continue;
                }
                let now = self.now();
                self.holds.push(Hold {
                    gpu: g,
                    slice: on,
                    task,
                    from_ms: now,
                    to_ms: None,
                });
                if let Some(t) = self.times.get_mut(&task) {
                    t.1.get_or_insert(now);
                }
                continue;
            }
            let result = self.gpus[g].execute(command.clone());
            if let Some(phase) = phase
                && self.fault(g, phase)
            {
                // The operation's outcome is unknown to the policy (here: it happened, or
                // was refused); the GPU fails closed.
                broken.insert(g);
                self.fail(policy, g, phase);
                continue;
            }
            if let Err(e) = result {
                self.refused
                    .push((g, format!("{command} at {} ms: {e}", self.now())));
            }
        }
        for g in 0..self.gpus.len() {
            let busy: u64 = self.gpus[g]
                .view()
                .instances
                .iter()
                .filter(|i| matches!(i.state, InstanceState::Busy(_)))
                .map(|i| u64::from(i.placement.profile.compute))
                .sum();
            self.busy_gpc_ms += busy * self.gpus[g].tick_ms();
            self.gpus[g].advance();
            for e in self.gpus[g].take_events() {
                match e {
                    Event::Ready(_) if self.fault(g, Phase::Ready) => {
                        self.fail(policy, g, Phase::Ready);
                    }
                    Event::Finished(task) | Event::OutOfMemory { task, .. } => {
                        let now = self.now();
                        self.last_finish_ms = self.last_finish_ms.max(now);
                        if let Some(h) = self
                            .holds
                            .iter_mut()
                            .rev()
                            .find(|h| h.task == task && h.to_ms.is_none())
                        {
                            h.to_ms = Some(now);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// Pairs of holds of one slice (or of overlapping slices) of one GPU whose times overlap:
    /// two tasks on one slice at once. Empty when the history is clean.
    pub fn double_holds(&self) -> Vec<(Hold, Hold)> {
        let mut out = Vec::new();
        for (i, a) in self.holds.iter().enumerate() {
            for b in &self.holds[i + 1..] {
                let same_room = a.gpu == b.gpu && a.slice.overlap(&b.slice).is_some();
                let a_end = a.to_ms.unwrap_or(u64::MAX);
                let b_end = b.to_ms.unwrap_or(u64::MAX);
                let at_once = a.from_ms < b_end && b.from_ms < a_end;
                if same_room && at_once && a.task != b.task {
                    out.push((*a, *b));
                }
            }
        }
        out
    }

    /// Tasks launched, and the mean and largest time from submit to launch, ms.
    pub fn admission(&self) -> (usize, f64, u64) {
        let waits: Vec<u64> = self
            .times
            .values()
            .filter_map(|(s, l)| l.map(|l| l - s))
            .collect();
        let mean = waits.iter().sum::<u64>() as f64 / waits.len().max(1) as f64;
        (waits.len(), mean, waits.iter().copied().max().unwrap_or(0))
    }

    /// Busy slices' share of the fleet's GPCs from the start to the last task's end.
    pub fn utilization(&self) -> f64 {
        let total = 7 * self.gpus.len() as u64 * self.last_finish_ms.max(1);
        self.busy_gpc_ms as f64 / total as f64
    }
}

/// One arrival of a packing workload: when (ms), the request, each member's job.
pub type Arrival = (u64, Request, JobModel);

/// A seeded workload for `models`: `count` requests over `span_ms`, each a single slice of a
/// base profile the first model has, drawn small to large as 4:3:2:1 (1g, 2g, 3g, 4g), or one
/// gang in eight of two 1g or two 2g slices; each job 5–30 s on the whole GPU, fitting its
/// slice's memory (ours).
pub fn workload(
    models: &[escher_proto::mig::GpuModel],
    count: usize,
    span_ms: u64,
    seed: u64,
) -> Vec<Arrival> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let model = models[0];
    let base = |gpcs: u8| {
        model
            .profiles()
            .iter()
            .find(|p| p.base && p.compute == gpcs)
            .expect("a base profile of each size")
    };
    let mut out = Vec::new();
    let mut id = 1u64;
    for _ in 0..count {
        let at = rng.u64(0..span_ms.max(1));
        let work_s = 5.0 + rng.f64() * 25.0;
        let (request, gb) = if rng.u8(0..8) == 0 {
            let p = base(if rng.bool() { 1 } else { 2 });
            let r = Request::gang(&[(TaskId(id), p.name), (TaskId(id + 1), p.name)]);
            id += 2;
            (r, f64::from(p.memory_gb) * 0.8)
        } else {
            let gpcs = match rng.u8(0..10) {
                0..=3 => 1,
                4..=6 => 2,
                7..=8 => 3,
                _ => 4,
            };
            let p = base(gpcs);
            let r = Request::single(TaskId(id), p.name);
            id += 1;
            (r, f64::from(p.memory_gb) * 0.8)
        };
        out.push((at, request, JobModel::fixed(work_s, 7, gb)));
    }
    out.sort_by_key(|a| a.0);
    out
}

/// What a policy did with a workload on a fleet.
#[derive(Debug, Clone, PartialEq)]
pub struct Packing {
    /// The policy.
    pub policy: &'static str,
    /// Tasks submitted.
    pub submitted: usize,
    /// Tasks launched by the end.
    pub launched: usize,
    /// Mean time from submit to launch of the launched, ms.
    pub mean_wait_ms: f64,
    /// Longest time from submit to launch, ms.
    pub max_wait_ms: u64,
    /// Busy slices' share of the fleet's GPCs from the start to the last task's end.
    pub utilization: f64,
    /// When the last task finished, ms.
    pub makespan_ms: u64,
    /// Slices held by two tasks at once (must be 0).
    pub double_holds: usize,
}

/// Runs `arrivals` with `policy` on a fleet starting from `layouts`, until every task has
/// finished or `horizon_ms`.
pub fn run_packing(
    policy: &mut dyn Placer,
    layouts: Vec<Layout>,
    arrivals: &[Arrival],
    horizon_ms: u64,
    tick_ms: u64,
) -> Packing {
    let mut fleet = Fleet::new(layouts, tick_ms);
    let mut next = 0;
    let mut submitted = 0;
    while fleet.now() < horizon_ms {
        while next < arrivals.len() && arrivals[next].0 <= fleet.now() {
            let (_, r, job) = arrivals[next].clone();
            let n = r.members.len();
            if fleet.submit(policy, r, job).is_ok() {
                submitted += n;
            }
            next += 1;
        }
        fleet.step(policy);
        let done = next == arrivals.len()
            && fleet.times.values().all(|(_, l)| l.is_some())
            && fleet.holds.iter().all(|h| h.to_ms.is_some());
        if done {
            break;
        }
    }
    let (launched, mean_wait_ms, max_wait_ms) = fleet.admission();
    Packing {
        policy: policy.name(),
        submitted,
        launched,
        mean_wait_ms,
        max_wait_ms,
        utilization: fleet.utilization(),
        makespan_ms: fleet.last_finish_ms,
        double_holds: fleet.double_holds().len(),
    }
}

/// The partitioner, HAMi-style first-fit and a static layout ([`super::static_layout`]) on
/// the same workload and fleet (`models`, one GPU each), in that order.
pub fn compare_packing(
    models: &[escher_proto::mig::GpuModel],
    arrivals: &[Arrival],
    horizon_ms: u64,
    tick_ms: u64,
) -> Vec<Packing> {
    let empty: Vec<Layout> = models.iter().map(|m| Layout::new(*m)).collect();
    let fixed: Vec<Layout> = models.iter().map(|m| super::static_layout(*m)).collect();
    vec![
        run_packing(
            &mut Partitioner::new(),
            empty.clone(),
            arrivals,
            horizon_ms,
            tick_ms,
        ),
        run_packing(
            &mut FirstFitPolicy::default(),
            empty,
            arrivals,
            horizon_ms,
            tick_ms,
        ),
        run_packing(
            &mut StaticPolicy::default(),
            fixed,
            arrivals,
            horizon_ms,
            tick_ms,
        ),
    ]
}
