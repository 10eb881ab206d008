//! [`SimGpu`]: an in-memory MIG GPU in simulated time, a fake at the [`GpuSeam`] for the GPU
//! policies' tests and for the reproductions of the papers. It is built on the real MIG model
//! (every layout it takes is checked by [`Layout`], and every change is recorded in
//! [`SimGpu::history`]), MIGRator's [`LatencyModel`] for instance creation and model loading,
//! and the [`SpeedModel`] and [`PowerModel`] of `escher_proto::mig` (`work.rs`).
//!
//! Time advances in ticks of [`SimGpu::tick_ms`]; a task's progress, an instance's creation
//! and a replica's service move on by one tick at a time, so event times are multiples of the
//! tick. Batch tasks report one telemetry sample per iteration (`iteration`,
//! `mem_requested_gb`) and fail with [`Event::OutOfMemory`] at the first iteration whose memory
//! exceeds their instance's. Inference tasks serve the requests [`SimGpu::arrive`] gives them
//! on their bound replicas as [`Serving`] counts them (the same model a cluster's GPU uses):
//! first come first served, a request still waiting when its SLO has passed shed (counted in
//! [`TaskStats::expired`]); a draining replica finishes its queue, and a replica is destroyed
//! only when idle, so no request is lost to a reconfiguration.

use std::collections::BTreeMap;

use escher_proto::mig::{LatencyModel, Layout, Placement};
use escher_proto::types::TaskId;

use crate::serving::Serving;
use crate::{Command, Event, GpuSeam, GpuView, Instance, InstanceState, SeamError};
use escher_proto::mig::{InferenceModel, JobModel, PowerModel, SpeedModel};

/// What a simulated task runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TaskModel {
    /// A batch job (MIGM's jobs, a retraining task).
    Batch(JobModel),
    /// An inference service, served by replicas bound to it.
    Inference(InferenceModel),
}

/// A batch task's current attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Attempt {
    on: Placement,
    /// Seconds of run time done, on this instance.
    elapsed_s: f64,
    /// Its total run time on this instance.
    duration_s: f64,
    /// Iterations reported.
    iterations: u32,
}

/// Per-task accounting.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskStats {
    /// Attempts launched.
    pub attempts: u32,
    /// GPU-seconds (instance GPCs x seconds, in sevenths of the GPU) spent on attempts that
    /// did not finish: OOM failures and early restarts.
    pub wasted_gpc_s: f64,
    /// When it finished, ms.
    pub finished_at: Option<u64>,
    /// Requests that arrived (inference).
    pub arrived: f64,
    /// Requests served (inference).
    pub served: f64,
    /// Requests served within the SLO (inference).
    pub on_time: f64,
    /// Requests shed because they waited past the SLO (inference).
    pub expired: f64,
}

#[derive(Debug, Clone)]
struct SimTask {
    model: TaskModel,
    attempt: Option<Attempt>,
    /// A batch task's accounting (an inference task's is in `serving`).
    stats: TaskStats,
}

#[derive(Debug, Clone)]
struct SimInstance {
    placement: Placement,
    state: InstanceState,
}

/// An in-memory MIG GPU in simulated time (see the module doc).
#[derive(Debug, Clone)]
pub struct SimGpu {
    now: u64,
    tick_ms: u64,
    instances: BTreeMap<u8, SimInstance>,
    layout: Layout,
    tasks: BTreeMap<TaskId, SimTask>,
    serving: Serving,
    events: Vec<Event>,
    history: Vec<(u64, Layout)>,
    latency: LatencyModel,
    speed: SpeedModel,
    power: PowerModel,
    energy_j: f64,
}

impl SimGpu {
    /// A GPU with `layout` already in place (its instances idle), advancing `tick_ms` per tick.
    pub fn new(layout: Layout, tick_ms: u64) -> SimGpu {
        let instances = layout
            .placements()
            .iter()
            .map(|p| (p.start, SimInstance::new(*p, InstanceState::Idle)))
            .collect();
        SimGpu {
            now: 0,
            tick_ms: tick_ms.max(1),
            instances,
            history: vec![(0, layout.clone())],
            layout,
            tasks: BTreeMap::new(),
            serving: Serving::default(),
            events: Vec::new(),
            latency: LatencyModel::default(),
            speed: SpeedModel::default(),
            power: PowerModel::default(),
            energy_j: 0.0,
        }
    }

    /// The same GPU with other reconfiguration latencies.
    pub fn with_latency(mut self, latency: LatencyModel) -> SimGpu {
        self.latency = latency;
        self
    }

    /// The same GPU with another speed model.
    pub fn with_speed(mut self, speed: SpeedModel) -> SimGpu {
        self.speed = speed;
        self
    }

    /// Declares a task and what it runs; it starts when a policy launches or binds it.
    pub fn add_task(&mut self, task: TaskId, model: TaskModel) {
        if let TaskModel::Inference(m) = model {
            self.serving.add(task, m);
        }
        self.tasks.insert(
            task,
            SimTask {
                model,
                attempt: None,
                stats: TaskStats::default(),
            },
        );
    }

    /// `count` requests for inference task `task` arrive now; they go to the replica with the
    /// shortest queue for its capacity, or wait until the task has one.
    pub fn arrive(&mut self, task: TaskId, count: f64) {
        self.serving.arrive(task, count, self.now);
    }

    /// Binds an idle instance to inference task `task` with its model already loaded (a
    /// replica that was serving before the simulation starts).
    pub fn bind_loaded(&mut self, task: TaskId, on: Placement) -> Result<(), SeamError> {
        self.execute(Command::Bind { task, on })?;
        self.serving.bind(task, on, self.now);
        Ok(())
    }

    /// Requests of inference task `task` waiting (in its backlog or in a replica's queue).
    pub fn queued(&self, task: TaskId) -> f64 {
        self.serving.queued(task)
    }

    /// The time, ms.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// One tick, ms.
    pub fn tick_ms(&self) -> u64 {
        self.tick_ms
    }

    /// Every layout the GPU had, with the time it took it, oldest first.
    pub fn history(&self) -> &[(u64, Layout)] {
        &self.history
    }

    /// Energy used so far, J.
    pub fn energy_j(&self) -> f64 {
        self.energy_j
    }

    /// A task's accounting.
    pub fn stats(&self, task: TaskId) -> Option<TaskStats> {
        let mut stats = self.tasks.get(&task)?.stats.clone();
        if let Some(s) = self.serving.stats(task) {
            stats.arrived = s.arrived;
            stats.served = s.served;
            stats.on_time = s.on_time;
            stats.expired = s.expired;
        }
        Some(stats)
    }

    /// The events since the last call, in order.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// Advances one tick: instances finish being created, batch tasks progress (reporting
    /// iterations, finishing or running out of memory), replicas serve, energy accrues.
    pub fn advance(&mut self) {
        let dt = self.tick_ms as f64 / 1000.0;
        let busy: u8 = self
            .instances
            .values()
            .filter(|i| matches!(i.state, InstanceState::Busy(_) | InstanceState::Draining(_)))
            .map(|i| i.placement.profile.compute)
            .sum();
        self.energy_j += self.power.power_w(busy) * dt;
        self.now += self.tick_ms;
        let now = self.now;
        for inst in self.instances.values_mut() {
            if let InstanceState::Creating { ready_at } = inst.state
                && ready_at <= now
            {
                inst.state = InstanceState::Idle;
                self.events.push(Event::Ready(inst.placement));
            }
        }
        let ids: Vec<TaskId> = self.tasks.keys().copied().collect();
        for id in ids {
            self.progress_batch(id, dt);
        }
        self.serve(dt);
    }

    /// Moves a running batch task on by `dt` seconds.
    fn progress_batch(&mut self, id: TaskId, dt: f64) {
        let Some(task) = self.tasks.get_mut(&id) else {
            return;
        };
        let (TaskModel::Batch(job), Some(mut a)) = (task.model, task.attempt) else {
            return;
        };
        a.elapsed_s = (a.elapsed_s + dt).min(a.duration_s);
        let per_iteration = a.duration_s / f64::from(job.iterations.max(1));
        let limit_gb = f64::from(a.on.profile.memory_gb);
        while a.iterations < job.iterations
            && a.elapsed_s + 1e-9 >= per_iteration * f64::from(a.iterations)
        {
            let i = a.iterations + 1;
            let used = job.memory.at(i);
            if used > limit_gb {
                task.stats.wasted_gpc_s += a.elapsed_s * f64::from(a.on.profile.compute);
                task.attempt = None;
                self.events.push(Event::OutOfMemory {
                    task: id,
                    used_gb: used,
                    limit_gb,
                });
                self.set_idle(a.on);
                return;
            }
            a.iterations = i;
            let values = BTreeMap::from([
                ("iteration".to_string(), f64::from(i)),
                ("mem_requested_gb".to_string(), used),
                ("iterations".to_string(), f64::from(job.iterations)),
            ]);
            self.events.push(Event::Telemetry { task: id, values });
        }
        if a.elapsed_s >= a.duration_s - 1e-9 && a.iterations >= job.iterations {
            task.attempt = None;
            task.stats.finished_at = Some(self.now);
            self.events.push(Event::Finished(id));
            self.set_idle(a.on);
        } else {
            task.attempt = Some(a);
        }
    }

    /// Replicas serve their queues; draining replicas that run dry become idle.
    fn serve(&mut self, dt: f64) {
        for (p, _) in self.serving.serve(self.now, dt) {
            self.set_idle(p);
            self.events.push(Event::Drained(p));
        }
    }

    fn set_idle(&mut self, on: Placement) {
        if let Some(i) = self.instances.get_mut(&on.start) {
            i.state = InstanceState::Idle;
        }
    }

    /// The idle instance at `on`, or why not.
    fn idle_instance(&mut self, on: Placement) -> Result<&mut SimInstance, SeamError> {
        let inst = self
            .instances
            .get_mut(&on.start)
            .filter(|i| i.placement == on)
            .ok_or(SeamError::NoInstance(on))?;
        if inst.state != InstanceState::Idle {
            return Err(SeamError::Busy {
                placement: on,
                state: inst.state,
            });
        }
        Ok(inst)
    }

    fn task_error(task: TaskId, reason: &str) -> SeamError {
        SeamError::Task {
            task,
            reason: reason.to_string(),
        }
    }

    fn record_layout(&mut self) {
        debug_assert!(self.layout.validate().is_ok());
        self.history.push((self.now, self.layout.clone()));
    }
}

impl SimInstance {
    fn new(placement: Placement, state: InstanceState) -> SimInstance {
        SimInstance { placement, state }
    }
}

impl GpuSeam for SimGpu {
    fn view(&self) -> GpuView {
        GpuView {
            instances: self
                .instances
                .values()
                .map(|i| Instance {
                    placement: i.placement,
                    state: i.state,
                })
                .collect(),
            layout: self.layout.clone(),
        }
    }

    fn execute(&mut self, command: Command) -> Result<(), SeamError> {
        match command {
            Command::Create(p) => {
                self.layout.insert(p).map_err(|e| SeamError::Illegal {
                    placement: p,
                    reason: e.to_string(),
                })?;
                let ready_at = self.now + self.latency.create.as_millis() as u64;
                self.instances.insert(
                    p.start,
                    SimInstance::new(p, InstanceState::Creating { ready_at }),
                );
                self.record_layout();
            }
            Command::Destroy(p) => {
                self.idle_instance(p)?;
                self.instances.remove(&p.start);
                self.layout.remove(p.start);
                self.record_layout();
            }
            Command::Launch { task, on } => {
                let job = match self.tasks.get(&task).map(|t| (t.model, t.attempt)) {
                    Some((TaskModel::Batch(job), None)) => job,
                    Some((TaskModel::Batch(_), Some(_))) => {
                        return Err(Self::task_error(task, "is already running"));
                    }
                    Some(_) => return Err(Self::task_error(task, "is an inference task: bind it")),
                    None => return Err(Self::task_error(task, "is unknown to the GPU")),
                };
                self.idle_instance(on)?.state = InstanceState::Busy(task);
                let duration_s = self.speed.duration_s(&job, on.profile);
                let t = self.tasks.get_mut(&task).expect("checked above");
                t.stats.attempts += 1;
                t.attempt = Some(Attempt {
                    on,
                    elapsed_s: 0.0,
                    duration_s,
                    iterations: 0,
                });
            }
            Command::Stop(task) => {
                let t = self
                    .tasks
                    .get_mut(&task)
                    .ok_or_else(|| Self::task_error(task, "is unknown to the GPU"))?;
                let a = t
                    .attempt
                    .take()
                    .ok_or_else(|| Self::task_error(task, "is not running"))?;
                t.stats.wasted_gpc_s += a.elapsed_s * f64::from(a.on.profile.compute);
                self.set_idle(a.on);
            }
            Command::Bind { task, on } => {
                if !matches!(
                    self.tasks.get(&task).map(|t| t.model),
                    Some(TaskModel::Inference(_))
                ) {
                    return Err(Self::task_error(task, "is not an inference task"));
                }
                let warm_until = self.now + self.latency.initialize().as_millis() as u64;
                self.idle_instance(on)?.state = InstanceState::Busy(task);
                self.serving.bind(task, on, warm_until);
            }
            Command::Drain { task, on } => {
                let inst = self
                    .instances
                    .get_mut(&on.start)
                    .filter(|i| i.placement == on)
                    .ok_or(SeamError::NoInstance(on))?;
                if inst.state != InstanceState::Busy(task) {
                    return Err(Self::task_error(task, "is not bound to that instance"));
                }
                inst.state = InstanceState::Draining(task);
                // Its queue is served on; the next tick turns it idle if it is empty.
                self.serving.drain(on);
            }
        }
        Ok(())
    }
}
