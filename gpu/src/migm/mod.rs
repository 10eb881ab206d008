//! MIGM (P2, seed `002_c52a029a28b5dffb.txt`): batch jobs on one MIG GPU, one job per
//! instance, each on the tightest instance that holds its memory, with the GPU repartitioned
//! as the queue needs.
//!
//! - **Right-sizing** ([`partition`]): a job's memory estimate picks its class (5, 10, 20 or
//!   40 GB); the instance is placed by the reachability rule (Algorithm 3).
//! - **Scheme A** ([`Scheme::BySize`]): the queue sorted by memory, ascending; the GPU is
//!   filled with as many instances of the smallest class as fit and that class's jobs are
//!   divided equally among them (the paper's one thread per instance, which is what loses on
//!   Ml3 where a 4g and a 3g instance get the same number of jobs); when the class is done the
//!   GPU is reconfigured for the next. Fewest reconfigurations; unfair within a batch.
//! - **Scheme B** ([`Scheme::Fifo`]): jobs in arrival order; for the head job, in order: an
//!   idle instance of its class, a new instance, fusion or fission of idle instances
//!   ([`partition::reshape`]), else wait for a job to finish. Fair; leaves holes.
//! - **OOM restart**: a job that runs out of memory is queued again (at the head) for the next
//!   larger class, and launched again with the same task id (a new attempt).
//! - **Early restart** ([`predictor`]): with per-iteration telemetry, once the predicted peak
//!   has converged and exceeds the instance, the job is stopped and queued again for the class
//!   that holds the prediction, before it reaches the OOM.
//!
//! Jobs with an unknown estimate start in the smallest class (the paper's grow-on-demand).

pub mod partition;
pub mod predictor;

use std::collections::{BTreeMap, VecDeque};

use escher_proto::mig::{GpuModel, Placement};
use escher_proto::types::TaskId;

use self::partition::{allocate, class_for, classes, next_class, reshape};
use self::predictor::MemoryPredictor;
use super::{Command, Event, GpuPolicy, GpuView, InstanceState};

/// MIGM's two schedulers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// Scheme A: by size, smallest first, fewest reconfigurations.
    BySize,
    /// Scheme B: first in, first out, with fusion and fission.
    Fifo,
}

/// A job handed to MIGM.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MigmJob {
    /// Its task (kept across restarts).
    pub task: TaskId,
    /// Its estimated peak memory, GB (compiler analysis, DNNMem); `None` if unknown.
    pub memory_gb: Option<f64>,
    /// Its iterations, for the predictor (1 if it reports none).
    pub iterations: u32,
}

/// Why a job was restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartReason {
    /// It ran out of memory.
    OutOfMemory,
    /// The predictor saw it would.
    Predicted,
}

/// One restart, for reports and tests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Restart {
    /// The task.
    pub task: TaskId,
    /// When, ms.
    pub at: u64,
    /// The instance it left.
    pub from: Placement,
    /// The class it goes to, GB.
    pub to_class: u32,
    /// Why.
    pub reason: RestartReason,
    /// The iteration it had reached.
    pub iteration: u32,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Queued {
    job: MigmJob,
    class: u32,
}

#[derive(Debug, Clone)]
struct Running {
    job: MigmJob,
    class: u32,
    on: Placement,
    predictor: MemoryPredictor,
    iteration: u32,
}

/// The MIGM policy on one GPU (see the module doc).
#[derive(Debug, Clone)]
pub struct Migm {
    model: GpuModel,
    scheme: Scheme,
    early_restart: bool,
    queue: VecDeque<Queued>,
    /// Instances being created, and the job each is for.
    reserved: BTreeMap<u8, Queued>,
    running: BTreeMap<TaskId, Running>,
    /// Scheme A: each instance's share of the current class, in order.
    lanes: BTreeMap<u8, VecDeque<Queued>>,
    /// Scheme A: the class of the current phase.
    phase: Option<u32>,
    restarts: Vec<Restart>,
    failed: Vec<TaskId>,
}

impl Migm {
    /// MIGM with `scheme` on a GPU of `model`, with early restart on or off.
    pub fn new(model: GpuModel, scheme: Scheme, early_restart: bool) -> Migm {
        Migm {
            model,
            scheme,
            early_restart,
            queue: VecDeque::new(),
            reserved: BTreeMap::new(),
            running: BTreeMap::new(),
            lanes: BTreeMap::new(),
            phase: None,
            restarts: Vec::new(),
            failed: Vec::new(),
        }
    }

    /// Queues a job. A job larger than the whole GPU is refused at once ([`Migm::failed`]).
    pub fn submit(&mut self, job: MigmJob) {
        let smallest = classes(self.model)[0];
        match job
            .memory_gb
            .map_or(Some(smallest), |gb| class_for(self.model, gb))
        {
            Some(class) => self.enqueue(Queued { job, class }, false),
            None => self.failed.push(job.task),
        }
    }

    /// The restarts so far.
    pub fn restarts(&self) -> &[Restart] {
        &self.restarts
    }

    /// Jobs that can never run here (bigger than the GPU, or out of memory on the whole GPU).
    pub fn failed(&self) -> &[TaskId] {
        &self.failed
    }

    fn enqueue(&mut self, q: Queued, front: bool) {
        match self.scheme {
            Scheme::Fifo if front => self.queue.push_front(q),
            Scheme::Fifo => self.queue.push_back(q),
            Scheme::BySize => {
                // Stable sort by class: after every queued job of the same or a smaller class.
                let at = self.queue.partition_point(|x| x.class <= q.class);
                self.queue.insert(at, q);
            }
        }
    }

    /// A job stopped (OOM or early restart): queue it again for a larger class, or give up.
    fn requeue(&mut self, r: Running, to_class: Option<u32>, reason: RestartReason, now: u64) {
        match to_class {
            Some(class) => {
                self.restarts.push(Restart {
                    task: r.job.task,
                    at: now,
                    from: r.on,
                    to_class: class,
                    reason,
                    iteration: r.iteration,
                });
                tracing::debug!(task = %r.job.task, from = %r.on, class, ?reason, "MIGM restarts a job");
                self.enqueue(Queued { job: r.job, class }, true);
            }
            None => self.failed.push(r.job.task),
        }
    }

    fn launch(&mut self, q: Queued, on: Placement, out: &mut Vec<Command>) {
        out.push(Command::Launch {
            task: q.job.task,
            on,
        });
        self.running.insert(
            q.job.task,
            Running {
                job: q.job,
                class: q.class,
                on,
                predictor: MemoryPredictor::new(q.job.iterations),
                iteration: 0,
            },
        );
    }

    /// Scheme B: serve the head of the queue while it can be placed.
    fn schedule_fifo(&mut self, gpu: &GpuView, out: &mut Vec<Command>) {
        let mut gpu = gpu.clone();
        // An instance created for a job is that job's, even once ready.
        for i in &mut gpu.instances {
            if self.reserved.contains_key(&i.placement.start) {
                i.state = InstanceState::Creating { ready_at: u64::MAX };
            }
        }
        while let Some(&head) = self.queue.front() {
            // 1. An idle instance of its class (fewest GPCs first).
            let idle = gpu
                .idle()
                .filter(|p| p.profile.memory_gb == head.class)
                .min_by_key(|p| (p.profile.compute, p.start));
            if let Some(p) = idle {
                self.queue.pop_front();
                self.launch(head, p, out);
                mark(&mut gpu, p, InstanceState::Busy(head.job.task));
                continue;
            }
            // 2. A new instance; 3. fusion or fission of idle ones.
            let created = match allocate(&gpu.layout, head.class) {
                Some(p) => Some(p),
                None => reshape(&gpu, head.class).map(|r| {
                    for d in r.destroy {
                        out.push(Command::Destroy(d));
                        gpu.layout.remove(d.start);
                        gpu.instances.retain(|i| i.placement != d);
                    }
                    r.create
                }),
            };
            let Some(p) = created else {
                // 4. Wait for a job to finish.
                return;
            };
            out.push(Command::Create(p));
            self.queue.pop_front();
            self.reserved.insert(p.start, head);
            if gpu.layout.insert(p).is_ok() {
                gpu.instances.push(super::Instance {
                    placement: p,
                    state: InstanceState::Creating { ready_at: u64::MAX },
                });
            }
        }
    }

    /// Scheme A: run the current class's lanes; when the class is done, reconfigure for the
    /// next.
    fn schedule_by_size(&mut self, gpu: &GpuView, out: &mut Vec<Command>) {
        if self.phase.is_none() || self.phase_done() {
            let settling = gpu.instances.iter().any(|i| i.state != InstanceState::Idle);
            if !self.running.is_empty() || !self.reserved.is_empty() || settling {
                return;
            }
            let Some(class) = self.queue.front().map(|q| q.class) else {
                self.phase = None;
                return;
            };
            self.start_phase(class, gpu, out);
            return;
        }
        // Late arrivals of this class (restarts) join the shortest lane.
        let class = self.phase.expect("checked");
        while self.queue.front().is_some_and(|q| q.class == class) {
            let q = self.queue.pop_front().expect("checked");
            if let Some(lane) = self.lanes.values_mut().min_by_key(|l| l.len()) {
                lane.push_back(q);
            }
        }
        for inst in &gpu.instances {
            if inst.state != InstanceState::Idle
                || self.reserved.contains_key(&inst.placement.start)
            {
                continue;
            }
            if let Some(q) = self
                .lanes
                .get_mut(&inst.placement.start)
                .and_then(|l| l.pop_front())
            {
                self.launch(q, inst.placement, out);
            }
        }
    }

    fn phase_done(&self) -> bool {
        self.lanes.values().all(|l| l.is_empty())
    }

    /// Destroys every idle instance not of `class`, fills the GPU with `class` instances by
    /// the reachability rule, and deals the class's jobs out to them in turn.
    fn start_phase(&mut self, class: u32, gpu: &GpuView, out: &mut Vec<Command>) {
        let mut layout = gpu.layout.clone();
        let mut slots: Vec<Placement> = Vec::new();
        for inst in &gpu.instances {
            if inst.placement.profile.memory_gb == class {
                slots.push(inst.placement);
            } else {
                out.push(Command::Destroy(inst.placement));
                layout.remove(inst.placement.start);
            }
        }
        while let Some(p) = allocate(&layout, class) {
            if layout.insert(p).is_err() {
                break;
            }
            out.push(Command::Create(p));
            slots.push(p);
        }
        slots.sort_by_key(|p| p.start);
        let jobs: Vec<Queued> = {
            let n = self.queue.iter().take_while(|q| q.class == class).count();
            self.queue.drain(..n).collect()
        };
        self.lanes = slots.iter().map(|p| (p.start, VecDeque::new())).collect();
        // Round robin over the instances, largest first (the paper's equal division).
        let mut order = slots.clone();
        order.sort_by_key(|p| (std::cmp::Reverse(p.profile.compute), p.start));
        for (i, q) in jobs.into_iter().enumerate() {
            let lane = order[i % order.len()].start;
            self.lanes.get_mut(&lane).expect("made above").push_back(q);
        }
        self.phase = Some(class);
        let existing: Vec<Placement> = gpu
            .idle()
            .filter(|p| p.profile.memory_gb == class)
            .collect();
        for p in existing {
            if let Some(q) = self.lanes.get_mut(&p.start).and_then(|l| l.pop_front()) {
                self.launch(q, p, out);
            }
        }
    }

    fn on_telemetry(
        &mut self,
        task: TaskId,
        values: &std::collections::BTreeMap<String, f64>,
        now: u64,
        out: &mut Vec<Command>,
    ) {
        let Some(r) = self.running.get_mut(&task) else {
            return;
        };
        let (Some(i), Some(mem)) = (values.get("iteration"), values.get("mem_requested_gb")) else {
            return;
        };
        r.iteration = *i as u32;
        r.predictor
            .observe(*i as u32, *mem, values.get("reuse_ratio").copied());
        if !self.early_restart {
            return;
        }
        let Some(peak) = r.predictor.converged() else {
            return;
        };
        if peak <= f64::from(r.on.profile.memory_gb) {
            return;
        }
        let Some(r) = self.running.remove(&task) else {
            return;
        };
        out.push(Command::Stop(task));
        let to = class_for(self.model, peak).or_else(|| next_class(self.model, r.class));
        let to = to
            .filter(|c| *c > r.class)
            .or_else(|| next_class(self.model, r.class));
        self.requeue(r, to, RestartReason::Predicted, now);
    }
}

/// Marks an instance of a working copy of the view.
fn mark(gpu: &mut GpuView, p: Placement, state: InstanceState) {
    if let Some(i) = gpu.instances.iter_mut().find(|i| i.placement == p) {
        i.state = state;
    }
}

impl GpuPolicy for Migm {
    fn name(&self) -> String {
        let scheme = match self.scheme {
            Scheme::BySize => "A",
            Scheme::Fifo => "B",
        };
        let predict = if self.early_restart {
            "+prediction"
        } else {
            ""
        };
        format!("MIGM scheme {scheme}{predict}")
    }

    fn on_event(&mut self, event: &Event, gpu: &GpuView, now: u64, out: &mut Vec<Command>) {
        match event {
            Event::Ready(p) => {
                if let Some(q) = self.reserved.remove(&p.start) {
                    self.launch(q, *p, out);
                }
            }
            Event::Finished(task) => {
                self.running.remove(task);
            }
            Event::OutOfMemory { task, .. } => {
                if let Some(r) = self.running.remove(task) {
                    let to = next_class(self.model, r.class);
                    self.requeue(r, to, RestartReason::OutOfMemory, now);
                }
            }
            Event::Telemetry { task, values } => self.on_telemetry(*task, values, now, out),
            Event::Tick | Event::Drained(_) => {}
        }
        // Schedule against the GPU as the commands above leave it.
        let mut view = gpu.clone();
        for c in out.iter() {
            match c {
                Command::Launch { task, on } => mark(&mut view, *on, InstanceState::Busy(*task)),
                Command::Stop(task) => {
                    for p in gpu.held_by(*task) {
                        mark(&mut view, p, InstanceState::Idle);
                    }
                }
                _ => {}
            }
        }
        match self.scheme {
            Scheme::Fifo => self.schedule_fifo(&view, out),
            Scheme::BySize => self.schedule_by_size(&view, out),
        }
    }

    fn is_done(&self) -> bool {
        self.queue.is_empty()
            && self.running.is_empty()
            && self.reserved.is_empty()
            && self.lanes.values().all(|l| l.is_empty())
    }
}

#[cfg(test)]
mod tests;
