//! [`ClusterGpu`]: one GPU of a real cluster as a GPU policy's seam, and [`drive`], the loop
//! that runs a policy on it in wall-clock time: the same [`GpuPolicy`] that runs on the
//! in-memory [`SimGpu`](super::SimGpu), now through the cluster API ([`ClusterApi`]) against a
//! head and a worker (a real NVIDIA GPU, or `--sim-gpu` with jobs that run `escher sim-work`).
//!
//! How each of the seam's commands is carried out:
//!
//! | policy command      | through the API                                                     |
//! |---------------------|---------------------------------------------------------------------|
//! | `Create` / `Destroy`| the GPU's next layout, one `apply_mig_layout` per policy step (queued while a reconfiguration runs); no drain: the policy destroys idle instances only |
//! | `Launch`            | `requeue` of the job's task to `mig.<profile>=1,mig.<uuid>=1`: the first launch of a task waiting in the queue, or a new attempt of one that was stopped or failed (its id kept); for a trainer job, a new actor of the built-in class [`TRAINER_CLASS`] on the slice |
//! | `Stop`              | `requeue` of the task back to the driver's queue resource: its attempt is stopped, and it waits; a trainer job's actor is killed |
//! | `Bind`              | a replica of the service on the slice (`mig.<profile>=1,mig.<uuid>=1`, the service's replica spec: an actor of the built-in class [`SERVING_REPLICA_CLASS`], or any task); it serves once the worker runs it |
//! | `Drain`             | the replica takes no new requests; once its queue is served, its actor is told what it served and killed (a task is cancelled); the slice is idle when it has ended |
//!
//! And what the policy hears: `Ready` when a slice it created appears in the worker's
//! inventory, `Finished` / `OutOfMemory` when a launched task ends (the typed
//! `TaskResult::OutOfMemory`), `Telemetry` for every batch of samples a launched task reported
//! (`iteration`, `mem_requested_gb`), `Drained` when a drained replica's task has ended, and a
//! `Tick` each round.
//!
//! # Trainers
//!
//! A job submitted as an actor of the built-in class [`TRAINER_CLASS`] (the retraining jobs
//! of Ekya's schedule in the end-to-end workload) runs as an actor, not a task: its record
//! waits on the queue resource and never runs, and each launch creates a trainer actor on
//! the slice (the slice's resources its own, held from its start until it is killed; its
//! argument a [`TrainerArgs`] naming the job). The trainer runs its iterations as `escher
//! sim-work` runs a job, with the same telemetry, which the policy hears as its `Telemetry`;
//! it reports its end as telemetry too, and then the driver asks it how far it got
//! (`progress`: every iteration, on the device its slice names, else a failure in
//! [`DriveReport::failed`]), kills it, and tells the policy the job `Finished` (or
//! `OutOfMemory`, when it reported its memory passing the slice's). A `Stop` kills the
//! trainer; the next `Launch` creates a new one, wherever the policy puts it. Every run is
//! kept ([`ClusterGpu::trainers`]).
//!
//! # Profilers
//!
//! Ekya's micro-profiler runs on the GPU too ([`ClusterGpu::profile`], while no policy runs:
//! at a window's start): on each slice it profiles on, an actor of the built-in class
//! [`PROFILER_CLASS`] (the slice's resources its own) is called once per candidate
//! configuration ([`ProfileRun`]), trains it for its few epochs at the slice's speed and
//! answers what it measured ([`ProfileMeasured`]: the accuracy after each epoch, the time an
//! epoch took, the device and profile it ran on, which must be its slice's); it is then
//! killed, and the slice is free again once it has ended. Every profiler and its answers are
//! kept ([`ClusterGpu::profilers`]); the configuration choice is made from the answers
//! ([`ekya_cluster`](super::ekya_cluster)).
//!
//! # Events, and what is still read each round
//!
//! The driver learns that its tasks (launched jobs, replicas) started or ended from the
//! cluster's events ([`ClusterApi::watch`]), not by polling their status: it subscribes to
//! task starts and ends when it is created, before it submits or launches anything, and reads
//! a task's status only when an event names one of its tasks (for the attempt that runs, and
//! the typed result of a failure), so a round with nothing new reads no status at all. If the
//! feed breaks past resuming, it subscribes again and reads each of its tasks' status once.
//!
//! Two reads stay periodic, once per round, because the cluster has no event for them: the
//! GPU's inventory ([`ClusterApi::gpus`]: slices appearing, the reconfiguration under way and
//! its phases) and the launched tasks' and trainers' telemetry ([`ClusterApi::telemetry`],
//! samples a task reports while it runs). The round is also the policy's clock (its `Tick`)
//! and the serving model's time step, so it stays.
//!
//! # Inference services
//!
//! An inference service ([`ClusterGpu::add_service`]) is a task of its own that never runs
//! (it waits on the queue resource: the service's record, and the id the policy binds
//! replicas to) and one real replica each holding its slice while it serves: an actor of the
//! built-in class [`SERVING_REPLICA_CLASS`] (every worker hosts it; it refuses to start
//! without a GPU device), which the driver tells how many requests it served when it is
//! drained, before it is killed, and when asked ([`ClusterGpu::report_replicas`]; not every
//! round: a call to an actor takes milliseconds, and a round that waits on them stalls the
//! serving model, whose SLO in compressed time is a few tens of ms), and whose own count must agree (a
//! replica whose actor does not answer, or disagrees, is a failure in
//! [`DriveReport::failed`]); or, given another spec, a task that merely holds the slice. The
//! requests are the simulated part ([`Serving`], the model the in-memory GPU counts them with):
//! [`ClusterGpu::arrive`] hands them to the service, and they are served by the replicas whose
//! tasks run, at the model's rate for their slice, against its SLO. Everything else is the
//! cluster's: the slices and their reconfiguration (with its latency), when a replica's task
//! starts and ends, and drain before destroy: a slice is idle again only once its replica's
//! task has ended. On a cluster a new instance is initialized by its reconfiguration (the
//! worker's library and model load phases), so a replica serves from its task's start.
//!
//! # Time
//!
//! The policy's clock is the driver's, in milliseconds since it began; with
//! [`ClusterGpu::with_time_scale`] a simulated second lasts `scale` wall seconds (as for
//! `escher sim-work --scale` and the worker's `--sim-mig-latency-scale`), so a policy that
//! plans in seconds (MIGRator's window) runs in compressed time.
//!
//! Jobs are submitted through [`ClusterGpu::submit`]: with the driver's queue resource
//! ([`QUEUE_RESOURCE`], which no node has) in place of their own, so they wait pending until the
//! policy launches them, and with no retries, so that only the policy decides where a failed
//! job runs again. Every layout the GPU's inventory showed is kept ([`DriveReport::layouts`]),
//! each checked legal by the MIG model as it is read.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use escher_proto::Amount;
use escher_proto::codec;
use escher_proto::mig::{
    DONE_KEY, GpuModel, ITERATION_KEY, LIMIT_KEY, Layout, OUT_OF_MEMORY_KEY, Placement,
    ProfileMeasured, ProfileRun, TrainerArgs, TrainerProgress,
};
use escher_proto::types::{
    GpuStatus, NodeId, PROFILER_CLASS, ResourceName, ResourceSet, SERVING_REPLICA_CLASS,
    TRAINER_CLASS, TaskId, TaskKind, TaskResult, TaskSpec, TaskState, WatchEvent, WatchKind,
    WatchRequest, mig_class, mig_identity,
};

use super::serving::{ServiceStats, Serving};
use super::{Command, Event, GpuPolicy, GpuView, Instance, InstanceState, SeamError};
use crate::InferenceModel;
use escher_esl::api::Events;
use escher_esl::{ClusterApi, EslError};

/// The resource jobs wait on while the policy has not launched them (no node has it).
pub const QUEUE_RESOURCE: &str = "gpu-policy-queue";

/// One GPU of a cluster, driven by a policy (see the module doc).
#[derive(Debug)]
pub struct ClusterGpu<C: ClusterApi> {
    api: C,
    node: NodeId,
    gpu: u32,
    model: GpuModel,
    /// The layout the policy asked for, until the inventory shows it.
    target: Option<Layout>,
    /// Whether `target` still has to be sent (a reconfiguration was under way).
    unsent: bool,
    /// Tasks launched and not yet ended: their instance and the attempt seen running.
    launched: BTreeMap<TaskId, (Placement, Option<u32>)>,
    /// Instances created by the policy and not yet reported ready.
    creating: BTreeSet<Placement>,
    /// The newest telemetry time read, ms since the epoch.
    telemetry_after: Option<u64>,
    /// The inventory as last read.
    inventory: GpuStatus,
    /// Every distinct layout the inventory showed, in order, with when it was first seen (ms
    /// of the policy's clock).
    layouts: Vec<(u64, Layout)>,
    started: Instant,
    /// Wall seconds per simulated second.
    scale: f64,
    /// The inference services' requests.
    serving: Serving,
    /// Each service's replica spec.
    services: BTreeMap<TaskId, TaskSpec>,
    /// Replica tasks, by their slice's start.
    replicas: BTreeMap<u8, ReplicaTask>,
    /// When the replicas last served, ms of the policy's clock.
    served_until: u64,
    /// The cluster's task starts and ends, subscribed to before anything was submitted.
    events: Events,
    /// Launched or replica tasks an event named since their status was last read.
    stale: BTreeSet<TaskId>,
    /// Jobs that run as trainer actors: their spec and their trainer's arguments.
    trainer_jobs: BTreeMap<TaskId, (TaskSpec, TrainerArgs)>,
    /// Trainer actors running a launched job, by the actor's id.
    trainers: BTreeMap<TaskId, TrainerRun>,
    /// Every trainer run, in the order they were created.
    trainer_log: Vec<TrainerView>,
    /// Every profiler actor and what it measured, in the order they were created.
    profiler_log: Vec<ProfilerView>,
}

/// A profiler actor on a slice and what it measured ([`ClusterGpu::profile`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ProfilerView {
    /// The profiler actor's id.
    pub actor: TaskId,
    /// Its slice.
    pub on: Placement,
    /// The slice's device (`MIG-…`) as the GPU's inventory named it.
    pub device: String,
    /// Each run it was asked for, with its answer, in the order asked.
    pub runs: Vec<(ProfileRun, ProfileMeasured)>,
}

/// A trainer actor running a launched job.
#[derive(Debug, Clone, Copy)]
struct TrainerRun {
    job: TaskId,
    /// Its entry in the log of runs.
    entry: usize,
    /// The newest of its telemetry read, ms since the epoch.
    read_until: u64,
}

/// How a trainer's run ended ([`TrainerView`]).
#[derive(Debug, Clone, PartialEq)]
pub enum TrainerEnd {
    /// It runs.
    Running,
    /// It reported every iteration done, said so when asked, and was killed.
    Finished,
    /// It reported its memory passing its slice's, and was killed.
    OutOfMemory,
    /// The policy stopped its job, and it was killed.
    Stopped,
    /// It ended by itself, did not say it finished when asked, or was not asked: why.
    Failed(String),
}

/// One run of a job as a trainer actor on a slice ([`ClusterGpu::trainers`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TrainerView {
    /// The job (the task the policy launched).
    pub job: TaskId,
    /// The trainer actor's id.
    pub actor: TaskId,
    /// Its slice.
    pub on: Placement,
    /// The slice's device (`MIG-…`) as the GPU's inventory named it at the launch.
    pub device: String,
    /// Iteration samples the driver read from it (each handed to the policy as telemetry).
    pub iterations_read: u32,
    /// What it answered when asked how far it got, at its end (a finished run).
    pub progress: Option<TrainerProgress>,
    /// How it ended.
    pub end: TrainerEnd,
}

/// One replica of an inference service: a task holding one slice.
#[derive(Debug, Clone, Copy)]
struct ReplicaTask {
    service: TaskId,
    task: TaskId,
    on: Placement,
    running: bool,
    draining: bool,
    /// Its queue is served and its task asked to stop.
    cancelled: bool,
    /// It is an actor (the service's replica spec is one: [`SERVING_REPLICA_CLASS`]), told
    /// what it served.
    actor: bool,
    /// Requests its actor was told it served, in all.
    reported: f64,
    /// Its actor did not answer, or disagreed, once: a failure of the run, and it is told
    /// nothing more.
    untold: bool,
}

/// What a replica of an inference service is now ([`ClusterGpu::report_replicas`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplicaView {
    /// The service it serves.
    pub service: TaskId,
    /// Its task (its actor's id, when it is one).
    pub task: TaskId,
    /// Its slice.
    pub on: Placement,
    /// Whether its task runs.
    pub running: bool,
    /// Whether it is an actor.
    pub actor: bool,
    /// Requests it served, as the driver counts them.
    pub served: f64,
    /// Requests its actor was told it served (equal to `served` once reported).
    pub reported: f64,
}

/// What [`drive`] saw.
#[derive(Debug, Clone, Default)]
pub struct DriveReport {
    /// Commands the cluster refused, with the time (ms of the policy's clock) and why.
    pub refused: Vec<(u64, Command, String)>,
    /// When the policy reported it was done, ms of the policy's clock; `None` if it ran out
    /// of time first.
    pub finished_at: Option<u64>,
    /// Every layout the GPU showed, in order, each legal (read with the MIG model), with when
    /// it was first seen (ms of the policy's clock).
    pub layouts: Vec<(u64, Layout)>,
    /// Launched tasks that failed for another reason than memory, and why.
    pub failed: Vec<(TaskId, String)>,
    /// Reconfigurations asked for.
    pub reconfigurations: usize,
}

impl<C: ClusterApi> ClusterGpu<C> {
    /// The slice of the last inventory read at placement `on`, if the GPU has it.
    fn slice_at(&self, on: Placement) -> Option<&escher_proto::types::MigDevice> {
        self.inventory
            .info
            .slices
            .iter()
            .find(|s| s.start == on.start && s.profile == on.profile.name)
    }

    /// GPU `gpu` of node `node`, as the cluster reports it now.
    pub async fn new(api: C, node: NodeId, gpu: u32) -> Result<ClusterGpu<C>, EslError> {
        // Subscribed first: every start and end of a task this driver submits or launches
        // comes after it.
        let events = api.watch(task_events()).await?;
        let inventory = read(&api, node, gpu).await?;
        let Some(model) = inventory.info.model else {
            return Err(EslError::Refused(format!(
                "GPU {gpu} of node {node} ({}) has no MIG table",
                inventory.info.product
            )));
        };
        let mut gpu = ClusterGpu {
            api,
            node,
            gpu,
            model,
            target: None,
            unsent: false,
            launched: BTreeMap::new(),
            creating: BTreeSet::new(),
            telemetry_after: None,
            inventory,
            layouts: Vec::new(),
            started: Instant::now(),
            scale: 1.0,
            serving: Serving::default(),
            services: BTreeMap::new(),
            replicas: BTreeMap::new(),
            served_until: 0,
            events,
            stale: BTreeSet::new(),
            trainer_jobs: BTreeMap::new(),
            trainers: BTreeMap::new(),
            trainer_log: Vec::new(),
            profiler_log: Vec::new(),
        };
        gpu.layout_now()?;
        Ok(gpu)
    }

    /// The same GPU on a clock where a simulated second lasts `scale` wall seconds (see the
    /// module doc); the default is 1, wall-clock time.
    pub fn with_time_scale(mut self, scale: f64) -> ClusterGpu<C> {
        if scale > 0.0 && scale.is_finite() {
            self.scale = scale;
        }
        self
    }

    /// Wall seconds per simulated second ([`ClusterGpu::with_time_scale`]).
    pub fn time_scale(&self) -> f64 {
        self.scale
    }

    /// The GPU model.
    pub fn model(&self) -> GpuModel {
        self.model
    }

    /// Declares an inference service whose replicas run `replica` (its command; the slice's
    /// resources are set per replica) and serve requests as `model` says; the service's id
    /// (hand it to the policy). The service's record waits on [`QUEUE_RESOURCE`] and never
    /// runs; [`ClusterGpu::stop_services`] ends it and its replicas.
    pub async fn add_service(
        &mut self,
        model: InferenceModel,
        replica: TaskSpec,
    ) -> Result<TaskId, EslError> {
        let ids = self.submit(vec![replica.clone()]).await?;
        let task = ids
            .into_iter()
            .next()
            .ok_or_else(|| EslError::Refused("the service's record was not submitted".into()))?;
        self.serving.add(task, model);
        self.services.insert(task, replica);
        Ok(task)
    }

    /// Binds instance `on` to service `task` before a policy runs (the GPU already serving
    /// when a window begins) and waits, at most `timeout`, until the replica's task runs.
    pub async fn bind_serving(
        &mut self,
        task: TaskId,
        on: Placement,
        timeout: Duration,
    ) -> Result<(), EslError> {
        self.inventory = read(&self.api, self.node, self.gpu).await?;
        self.execute(&Command::Bind { task, on })
            .await
            .map_err(|e| EslError::Refused(e.to_string()))?;
        let deadline = Instant::now() + timeout;
        loop {
            // Nothing is listening yet: the round's events are the bind's own.
            self.poll().await?;
            if self.replicas.get(&on.start).is_some_and(|r| r.running) {
                return Ok(());
            }
            // Until the cluster says one of this GPU's tasks started or ended (the replica's
            // start, or its end), nothing changes that this waits for.
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(EslError::Timeout {
                        what: format!("the replica of {task} on {on} starting"),
                        after: timeout,
                    });
                }
                if let Ok(next) = tokio::time::timeout(left, self.events.next()).await
                    && self.note(next).await?
                {
                    break;
                }
            }
        }
    }

    /// `count` requests for service `task` arrive now.
    pub fn arrive(&mut self, task: TaskId, count: f64) {
        let now = self.now();
        self.serving.arrive(task, count, now);
    }

    /// Service `task`'s requests so far.
    pub fn service_stats(&self, task: TaskId) -> Option<ServiceStats> {
        self.serving.stats(task)
    }

    /// Requests of service `task` waiting.
    pub fn queued(&self, task: TaskId) -> f64 {
        self.serving.queued(task)
    }

    /// Cancels every service's record and replica tasks, and every trainer job's record and
    /// running trainer (at the end of a run).
    pub async fn stop_services(&mut self) -> Result<(), EslError> {
        let tasks: Vec<TaskId> = self
            .services
            .keys()
            .copied()
            .chain(self.replicas.values().map(|r| r.task))
            .chain(self.trainer_jobs.keys().copied())
            .chain(self.trainers.keys().copied())
            .collect();
        if !tasks.is_empty() {
            self.api.cancel(tasks).await?;
        }
        self.replicas.clear();
        for run in std::mem::take(&mut self.trainers).into_values() {
            self.launched.remove(&run.job);
            self.trainer_log[run.entry].end = TrainerEnd::Stopped;
        }
        Ok(())
    }

    /// Submits jobs for the policy: each waits on [`QUEUE_RESOURCE`] until launched, with no
    /// retries; their ids, in order (hand them to the policy). A job whose spec is an actor of
    /// the built-in class [`TRAINER_CLASS`] (its argument a [`TrainerArgs`]) runs as a trainer
    /// actor: each launch creates one on the slice, a stop or its end kills it (see the
    /// module doc); its record waits until [`ClusterGpu::stop_services`].
    pub async fn submit(&mut self, jobs: Vec<TaskSpec>) -> Result<Vec<TaskId>, EslError> {
        let queued = queue_request()?;
        let mut trainers = Vec::with_capacity(jobs.len());
        for spec in &jobs {
            trainers.push(match &spec.kind {
                TaskKind::Actor(actor) if actor.class == TRAINER_CLASS => {
                    let args = codec::decode::<TrainerArgs>(&actor.args).map_err(|e| {
                        EslError::Refused(format!(
                            "a job of class {TRAINER_CLASS} takes a TrainerArgs argument: {e}"
                        ))
                    })?;
                    args.job_model().map_err(|why| {
                        EslError::Refused(format!("a trainer job's arguments: {why}"))
                    })?;
                    Some((spec.clone(), args))
                }
                _ => None,
            });
        }
        let jobs = jobs
            .into_iter()
            .map(|mut spec| {
                spec.resources = queued.clone();
                spec.max_retries = 0;
                spec
            })
            .collect();
        let ids = self.api.submit(jobs).await?;
        for (id, trainer) in ids.iter().zip(trainers) {
            if let Some(trainer) = trainer {
                self.trainer_jobs.insert(*id, trainer);
            }
        }
        Ok(ids)
    }

    /// Every run of a job as a trainer actor so far, in the order they were created.
    pub fn trainers(&self) -> &[TrainerView] {
        &self.trainer_log
    }

    /// Every profiler actor so far and what it measured ([`ClusterGpu::profile`]).
    pub fn profilers(&self) -> &[ProfilerView] {
        &self.profiler_log
    }

    /// Micro-profiles on the GPU's slices (see the module doc's "Profilers"): for each
    /// `(slice, runs)`, an actor of the built-in class [`PROFILER_CLASS`] on that idle slice
    /// is asked to `profile` each run in turn (the slices at once), checked to have measured
    /// every epoch on the device and profile of its slice, and killed; what they measured, in
    /// the order given. Called while no policy runs (a window's start): the slices must be
    /// free, and are again when this returns.
    pub async fn profile(
        &mut self,
        slices: Vec<(Placement, Vec<ProfileRun>)>,
    ) -> Result<Vec<ProfilerView>, EslError> {
        self.inventory = read(&self.api, self.node, self.gpu).await?;
        let mut specs = Vec::with_capacity(slices.len());
        let mut devices = Vec::with_capacity(slices.len());
        for (on, _) in &slices {
            let device = self.slice_at(*on).map(|s| s.uuid.clone()).ok_or_else(|| {
                EslError::Refused(format!("the GPU has no slice {on} to profile on"))
            })?;
            let resources = slice_request(*on, &device).map_err(EslError::Refused)?;
            let spec = escher_client::Task::actor_typed(PROFILER_CLASS, &())
                .resources(resources)
                .build()
                .map_err(|e| EslError::Refused(e.to_string()))?;
            specs.push(spec);
            devices.push(device);
        }
        let actors = self.api.submit(specs).await?;
        let mut calls = tokio::task::JoinSet::new();
        for (i, ((on, runs), actor)) in slices.into_iter().zip(&actors).enumerate() {
            let (api, actor, device) = (self.api.clone(), *actor, devices[i].clone());
            calls.spawn(async move {
                let mut measured = Vec::with_capacity(runs.len());
                for run in runs {
                    let answer = ask_profile(&api, actor, &run).await;
                    let checked = answer.and_then(|m| {
                        let why = if m.candidate != run.candidate {
                            Some(format!("answered for candidate {}", m.candidate))
                        } else if m.devices.as_slice() != std::slice::from_ref(&device) {
                            Some(format!(
                                "holds {:?}, not its slice's device {device}",
                                m.devices
                            ))
                        } else if m.profile != on.profile.name {
                            Some(format!("ran as a {} slice", m.profile))
                        } else if m.accuracy.len() != run.epochs as usize {
                            Some(format!(
                                "measured {} epochs of {}",
                                m.accuracy.len(),
                                run.epochs
                            ))
                        } else {
                            None
                        };
                        match why {
                            Some(why) => Err(EslError::Refused(why)),
                            None => Ok(m),
                        }
                    });
                    match checked {
                        Ok(m) => measured.push((run, m)),
                        Err(e) => {
                            return (
                                i,
                                Err(format!(
                                    "profiler {actor} on {on}, candidate {}: {e}",
                                    run.candidate
                                )),
                            );
                        }
                    }
                }
                (
                    i,
                    Ok(ProfilerView {
                        actor,
                        on,
                        device,
                        runs: measured,
                    }),
                )
            });
        }
        let mut views: Vec<Option<Result<ProfilerView, String>>> = vec![None; actors.len()];
        while let Some(done) = calls.join_next().await {
            let (i, view) =
                done.map_err(|e| EslError::Refused(format!("a profiler's calls: {e}")))?;
            views[i] = Some(view);
        }
        // Killed whatever they answered, and ended before their slices are handed on.
        self.api.cancel(actors.clone()).await?;
        self.api
            .wait(actors.clone(), actors.len(), Duration::from_secs(30))
            .await?;
        let mut out = Vec::with_capacity(views.len());
        for view in views.into_iter().flatten() {
            let view = view.map_err(EslError::Refused)?;
            self.profiler_log.push(view.clone());
            out.push(view);
        }
        Ok(out)
    }

    /// Milliseconds since the driver began, of the policy's clock (simulated when scaled).
    pub fn now(&self) -> u64 {
        let ms = self.started.elapsed().as_secs_f64() * 1000.0 / self.scale;
        ms as u64
    }

    /// The layout the inventory shows (slices being destroyed included until they go),
    /// recorded if it changed.
    fn layout_now(&mut self) -> Result<Layout, EslError> {
        let placements = self.inventory.info.slices.iter().map(|s| {
            let profile = self.model.profile(&s.profile).ok_or_else(|| {
                EslError::Refused(format!(
                    "slice {} has unknown profile {}",
                    s.uuid, s.profile
                ))
            })?;
            Ok(Placement::new(profile, s.start))
        });
        let placements: Vec<Placement> = placements.collect::<Result<_, EslError>>()?;
        let layout = Layout::from_placements(self.model, placements)
            .map_err(|e| EslError::Refused(format!("the GPU reports an illegal layout: {e}")))?;
        if self.layouts.last().map(|(_, l)| l) != Some(&layout) {
            let now = self.now();
            self.layouts.push((now, layout.clone()));
        }
        Ok(layout)
    }

    /// The GPU as the policy sees it: what the inventory shows, with the layout asked for laid
    /// over it (instances being created; destroyed ones gone), and every launched task busy
    /// on its instance.
    pub fn view(&self) -> GpuView {
        let shown: Vec<Placement> = self
            .inventory
            .info
            .slices
            .iter()
            .filter_map(|s| Some(Placement::new(self.model.profile(&s.profile)?, s.start)))
            .collect();
        let placements: Vec<Placement> = match &self.target {
            Some(t) => t.placements().to_vec(),
            None => shown.clone(),
        };
        let instances = placements
            .iter()
            .map(|p| {
                let busy = self.launched.iter().find(|(_, (on, _))| on == p);
                let replica = self.replicas.get(&p.start).filter(|r| r.on == *p);
                let state = match (busy, replica) {
                    (Some((task, _)), _) => InstanceState::Busy(*task),
                    (None, Some(r)) if r.draining => InstanceState::Draining(r.service),
                    (None, Some(r)) => InstanceState::Busy(r.service),
                    (None, None) if !shown.contains(p) => InstanceState::Creating {
                        ready_at: self.now() + 6_000,
                    },
                    (None, None) => InstanceState::Idle,
                };
                Instance {
                    placement: *p,
                    state,
                }
            })
            .collect();
        let layout = Layout::from_placements(self.model, placements)
            .unwrap_or_else(|_| Layout::new(self.model));
        GpuView { instances, layout }
    }

    /// Reads the GPU and the launched tasks; the events since the last read.
    async fn poll(&mut self) -> Result<(Vec<Event>, Vec<(TaskId, String)>), EslError> {
        self.inventory = read(&self.api, self.node, self.gpu).await?;
        let layout = self.layout_now()?;
        let mut events = Vec::new();
        let ready: Vec<Placement> = self
            .creating
            .iter()
            .filter(|p| layout.placements().contains(p))
            .copied()
            .collect();
        for p in ready {
            self.creating.remove(&p);
            events.push(Event::Ready(p));
        }
        if self.target.as_ref() == Some(&layout) {
            self.target = None;
        }
        if self.unsent && self.inventory.reconfiguring.is_none() {
            self.send_target().await?;
        }
        let mut failed = Vec::new();
        // Launched jobs that run as tasks (a trainer job's record never runs: its actor does).
        let ids: Vec<TaskId> = self
            .launched
            .keys()
            .filter(|t| !self.trainer_jobs.contains_key(t))
            .copied()
            .collect();
        self.take_events().await?;
        let changed: Vec<TaskId> = ids
            .iter()
            .filter(|t| self.stale.remove(t))
            .copied()
            .collect();
        for task in &changed {
            let status = self.api.status(*task).await?;
            match status.state {
                TaskState::Running => {
                    if let Some((_, attempt)) = self.launched.get_mut(task) {
                        *attempt = Some(status.attempt);
                    }
                }
                TaskState::Succeeded => {
                    self.launched.remove(task);
                    events.push(Event::Finished(*task));
                }
                TaskState::Failed => {
                    self.launched.remove(task);
                    match status.result {
                        Some(TaskResult::OutOfMemory {
                            used_mib,
                            limit_mib,
                        }) => events.push(Event::OutOfMemory {
                            task: *task,
                            used_gb: used_mib as f64 / 1024.0,
                            limit_gb: limit_mib as f64 / 1024.0,
                        }),
                        _ => {
                            failed.push((*task, status.reason.unwrap_or_default()));
                            events.push(Event::Finished(*task));
                        }
                    }
                }
                TaskState::Cancelled => {
                    self.launched.remove(task);
                    failed.push((*task, "cancelled".to_string()));
                    events.push(Event::Finished(*task));
                }
                TaskState::Pending => {}
            }
        }
        self.poll_trainers(&mut events, &mut failed).await?;
        self.poll_replicas(&mut events, &mut failed).await?;
        if !ids.is_empty() {
            let reported = self.api.telemetry(ids, self.telemetry_after).await?;
            for t in reported {
                let current = self.launched.get(&t.task).and_then(|(_, a)| *a);
                for s in &t.samples {
                    self.telemetry_after = Some(self.telemetry_after.unwrap_or(0).max(s.at_ms));
                }
                if current != Some(t.attempt) {
                    continue;
                }
                // One event per batch the task reported together (one iteration).
                let mut batches: BTreeMap<u64, BTreeMap<String, f64>> = BTreeMap::new();
                for s in t.samples {
                    batches.entry(s.at_ms).or_default().insert(s.key, s.value);
                }
                for values in batches.into_values() {
                    events.push(Event::Telemetry {
                        task: t.task,
                        values,
                    });
                }
            }
        }
        Ok((events, failed))
    }

    /// Reads the trainer actors an event named (running: the attempt that runs; ended by
    /// themselves: a failure, and the job finished for the policy), then their telemetry:
    /// iterations are the policy's `Telemetry`, an end reported is the job's end (see
    /// [`ClusterGpu::finish_trainer`]). A trainer's telemetry is read from where its own was
    /// read to (its reports come one after another), not from the newest of all tasks'.
    async fn poll_trainers(
        &mut self,
        events: &mut Vec<Event>,
        failed: &mut Vec<(TaskId, String)>,
    ) -> Result<(), EslError> {
        let named: Vec<(TaskId, TrainerRun)> = self
            .trainers
            .iter()
            .filter(|(actor, _)| self.stale.contains(actor))
            .map(|(actor, run)| (*actor, *run))
            .collect();
        for (actor, run) in named {
            self.stale.remove(&actor);
            let status = self.api.status(actor).await?;
            match status.state {
                TaskState::Pending => {}
                TaskState::Running => {
                    if let Some((_, attempt)) = self.launched.get_mut(&run.job) {
                        *attempt = Some(status.attempt);
                    }
                }
                state => {
                    // Ended by itself (its process, its node), or killed by someone else.
                    let why = format!(
                        "trainer {actor} of job {} ended: {}",
                        run.job,
                        status.reason.unwrap_or_else(|| format!("{state:?}"))
                    );
                    self.end_trainer(actor, TrainerEnd::Failed(why.clone()));
                    failed.push((run.job, why));
                    events.push(Event::Finished(run.job));
                }
            }
        }
        let Some(after) = self.trainers.values().map(|r| r.read_until).min() else {
            return Ok(());
        };
        let actors: Vec<TaskId> = self.trainers.keys().copied().collect();
        let reported = self.api.telemetry(actors, Some(after)).await?;
        for t in reported {
            let Some(run) = self.trainers.get(&t.task).copied() else {
                continue;
            };
            let mut batches: BTreeMap<u64, BTreeMap<String, f64>> = BTreeMap::new();
            for s in t.samples.into_iter().filter(|s| s.at_ms > run.read_until) {
                batches.entry(s.at_ms).or_default().insert(s.key, s.value);
            }
            for (at, values) in batches {
                if !self.trainers.contains_key(&t.task) {
                    break;
                }
                if let Some(r) = self.trainers.get_mut(&t.task) {
                    r.read_until = at;
                }
                if let Some(&used) = values.get(OUT_OF_MEMORY_KEY) {
                    let limit = values.get(LIMIT_KEY).copied().unwrap_or(0.0);
                    self.api.cancel(vec![t.task]).await?;
                    self.end_trainer(t.task, TrainerEnd::OutOfMemory);
                    events.push(Event::OutOfMemory {
                        task: run.job,
                        used_gb: used / 1024.0,
                        limit_gb: limit / 1024.0,
                    });
                } else if values.contains_key(DONE_KEY) {
                    self.finish_trainer(t.task, run, failed).await?;
                    events.push(Event::Finished(run.job));
                } else if values.contains_key(ITERATION_KEY) {
                    self.trainer_log[run.entry].iterations_read += 1;
                    events.push(Event::Telemetry {
                        task: run.job,
                        values,
                    });
                }
            }
        }
        Ok(())
    }

    /// Trainer `actor` said it finished: it is asked how far it got (its answer must say it
    /// ran every iteration of its job on the device its slice names, else the run failed),
    /// then killed, which frees its slice.
    async fn finish_trainer(
        &mut self,
        actor: TaskId,
        run: TrainerRun,
        failed: &mut Vec<(TaskId, String)>,
    ) -> Result<(), EslError> {
        let answer = match codec::encode(&()) {
            Ok(args) => self
                .api
                .call_actor(actor, "progress".to_string(), args)
                .await
                .and_then(|bytes| {
                    codec::decode::<TrainerProgress>(&bytes)
                        .map_err(|e| EslError::Refused(e.to_string()))
                }),
            Err(e) => Err(EslError::Refused(e.to_string())),
        };
        let entry = &mut self.trainer_log[run.entry];
        let why = match answer {
            Ok(p) => {
                let why = if !p.done || p.iteration != p.iterations {
                    Some(format!(
                        "said it finished, then that it ran {} of {} iterations",
                        p.iteration, p.iterations
                    ))
                } else if p.job != run.job.0 {
                    Some(format!("runs job {}", p.job))
                } else if p.devices.as_slice() != std::slice::from_ref(&entry.device) {
                    Some(format!(
                        "holds {:?}, not its slice's device {}",
                        p.devices, entry.device
                    ))
                } else if p.profile != entry.on.profile.name {
                    Some(format!("ran as a {} slice, not {}", p.profile, entry.on))
                } else {
                    None
                };
                entry.progress = Some(p);
                why
            }
            Err(e) => Some(format!("did not say how far it got: {e}")),
        };
        let end = match why {
            None => TrainerEnd::Finished,
            Some(why) => {
                let why = format!("trainer {actor} of job {} on {}: {why}", run.job, entry.on);
                failed.push((run.job, why.clone()));
                TrainerEnd::Failed(why)
            }
        };
        self.api.cancel(vec![actor]).await?;
        self.end_trainer(actor, end);
        Ok(())
    }

    /// Forgets trainer `actor` (its job is no longer launched), its run ended as `end`.
    fn end_trainer(&mut self, actor: TaskId, end: TrainerEnd) {
        if let Some(run) = self.trainers.remove(&actor) {
            self.launched.remove(&run.job);
            self.trainer_log[run.entry].end = end;
        }
    }

    /// Creates a trainer actor for `job` on slice `on` (its request `resources`).
    async fn launch_trainer(
        &mut self,
        job: TaskId,
        on: Placement,
        resources: ResourceSet,
    ) -> Result<(), SeamError> {
        let fail = |reason: String| SeamError::Task { task: job, reason };
        let (mut spec, args) = self
            .trainer_jobs
            .get(&job)
            .cloned()
            .ok_or_else(|| fail("is not a trainer job of this GPU".into()))?;
        if self.launched.contains_key(&job) {
            return Err(fail("runs already".into()));
        }
        let device = self
            .slice_at(on)
            .map(|s| s.uuid.clone())
            .ok_or(SeamError::NoInstance(on))?;
        spec.resources = resources;
        spec.max_retries = 0;
        if let TaskKind::Actor(actor) = &mut spec.kind {
            // The trainer knows which job it runs.
            let args = TrainerArgs { job: job.0, ..args };
            actor.args = codec::encode(&args)
                .map_err(|e| fail(e.to_string()))?
                .into();
        }
        let ids = self
            .api
            .submit(vec![spec])
            .await
            .map_err(|e| fail(e.to_string()))?;
        let actor = ids
            .into_iter()
            .next()
            .ok_or_else(|| fail("its trainer was not submitted".into()))?;
        self.launched.insert(job, (on, None));
        self.trainers.insert(
            actor,
            TrainerRun {
                job,
                entry: self.trainer_log.len(),
                read_until: 0,
            },
        );
        self.trainer_log.push(TrainerView {
            job,
            actor,
            on,
            device,
            iterations_read: 0,
            progress: None,
            end: TrainerEnd::Running,
        });
        Ok(())
    }

    /// Serves the requests since the last round, asks drained replicas' tasks to stop, and
    /// reads the replica tasks: running ones serve from now, ended ones free their slice
    /// (`Drained` when it was drained; lost requests and the reason when it ended by itself).
    async fn poll_replicas(
        &mut self,
        events: &mut Vec<Event>,
        failed: &mut Vec<(TaskId, String)>,
    ) -> Result<(), EslError> {
        let now = self.now();
        let dt = now.saturating_sub(self.served_until) as f64 / 1000.0;
        self.served_until = now;
        let drained = self.serving.serve(now, dt);
        let mut stop = Vec::new();
        for (p, served) in drained {
            let Some(r) = self.replicas.get(&p.start).copied() else {
                continue;
            };
            // Its last requests are told before it goes.
            self.report_served(r, served, failed).await;
            if let Some(r) = self.replicas.get_mut(&p.start) {
                r.cancelled = true;
            }
            stop.push(r.task);
        }
        if !stop.is_empty() {
            self.api.cancel(stop).await?;
        }
        let replicas: Vec<ReplicaTask> = self
            .replicas
            .values()
            .filter(|r| self.stale.contains(&r.task))
            .copied()
            .collect();
        // What is left named tasks this GPU no longer tracks.
        self.stale.clear();
        for r in replicas {
            let status = self.api.status(r.task).await?;
            match status.state {
                TaskState::Pending => {}
                TaskState::Running if !r.running => {
                    self.serving.start(r.on, now);
                    if let Some(slot) = self.replicas.get_mut(&r.on.start) {
                        slot.running = true;
                    }
                }
                TaskState::Running => {}
                _ => {
                    self.replicas.remove(&r.on.start);
                    if r.cancelled {
                        events.push(Event::Drained(r.on));
                    } else {
                        // Ended by itself (failed, or cancelled by someone else): what it
                        // held is lost, and the policy hears its slice is free.
                        self.serving.remove(r.on);
                        let why = status
                            .reason
                            .unwrap_or_else(|| format!("{:?}", status.state));
                        failed.push((r.task, format!("replica of {} ended: {why}", r.service)));
                        events.push(Event::Drained(r.on));
                    }
                }
            }
        }
        Ok(())
    }

    /// Tells replica `r`'s actor that it served `served` requests in all (the requests since
    /// it was last told); the actor's own count, its answer, must agree. A replica that is no
    /// actor, or has nothing new, is left alone; one that does not answer or disagrees is a
    /// failure of the run.
    async fn report_served(
        &mut self,
        r: ReplicaTask,
        served: f64,
        failed: &mut Vec<(TaskId, String)>,
    ) {
        let new = served - r.reported;
        if !r.actor || r.untold || new <= 1e-9 {
            return;
        }
        let answer = match codec::encode(&new) {
            Ok(args) => self
                .api
                .call_actor(r.task, "serve".to_string(), args)
                .await
                .and_then(|bytes| {
                    codec::decode::<f64>(&bytes).map_err(|e| EslError::Refused(e.to_string()))
                }),
            Err(e) => Err(EslError::Refused(e.to_string())),
        };
        let why = match answer {
            Ok(counted) if (counted - served).abs() <= 1e-6 * served.max(1.0) => {
                if let Some(slot) = self.replicas.get_mut(&r.on.start) {
                    slot.reported = served;
                }
                return;
            }
            Ok(counted) => {
                format!("its actor counted {counted} requests served, the driver {served}")
            }
            Err(e) => format!("its actor was not told what it served: {e}"),
        };
        if let Some(slot) = self.replicas.get_mut(&r.on.start) {
            slot.untold = true;
        }
        failed.push((
            r.task,
            format!("replica of {} on {}: {why}", r.service, r.on),
        ));
    }

    /// Tells every running replica's actor what it served so far, and returns every replica
    /// (for a caller that reads the actors themselves: `info`, see
    /// [`SERVING_REPLICA_CLASS`]), with the
    /// failures of that telling.
    pub async fn report_replicas(&mut self) -> (Vec<ReplicaView>, Vec<(TaskId, String)>) {
        let mut failed = Vec::new();
        let live: Vec<ReplicaTask> = self.replicas.values().copied().collect();
        for r in live {
            if let (true, Some(served)) = (r.running, self.serving.served_on(r.on)) {
                self.report_served(r, served, &mut failed).await;
            }
        }
        let views = self
            .replicas
            .values()
            .map(|r| ReplicaView {
                service: r.service,
                task: r.task,
                on: r.on,
                running: r.running,
                actor: r.actor,
                served: self.serving.served_on(r.on).unwrap_or(r.reported),
                reported: r.reported,
            })
            .collect();
        (views, failed)
    }

    /// Whether `task` is one this GPU follows: a launched job or a replica.
    fn tracks(&self, task: TaskId) -> bool {
        self.launched.contains_key(&task)
            || self.trainers.contains_key(&task)
            || self.replicas.values().any(|r| r.task == task)
    }

    /// Takes in one item of the event feed: a start or end of a tracked task marks it for a
    /// status read. A broken feed is subscribed to again, and every tracked task marked (its
    /// status read after the new subscription is in place: nothing goes unseen). Whether a
    /// tracked task was marked.
    async fn note(&mut self, next: Option<Result<WatchEvent, EslError>>) -> Result<bool, EslError> {
        match next {
            Some(Ok(event)) => match event.event.task() {
                Some(task) if self.tracks(task) => {
                    self.stale.insert(task);
                    Ok(true)
                }
                _ => Ok(false),
            },
            Some(Err(e)) => {
                tracing::debug!(error = %e, "the event feed broke; subscribing again");
                self.events = self.api.watch(task_events()).await?;
                let tracked: Vec<TaskId> = self
                    .launched
                    .keys()
                    .copied()
                    .chain(self.replicas.values().map(|r| r.task))
                    .chain(self.trainers.keys().copied())
                    .collect();
                let any = !tracked.is_empty();
                self.stale.extend(tracked);
                Ok(any)
            }
            None => Err(EslError::Refused("the cluster's event feed ended".into())),
        }
    }

    /// Takes in every event the feed holds now, without waiting.
    async fn take_events(&mut self) -> Result<(), EslError> {
        loop {
            let next = {
                let waker = std::task::Waker::noop();
                let mut cx = std::task::Context::from_waker(waker);
                let mut next = std::pin::pin!(self.events.next());
                match next.as_mut().poll(&mut cx) {
                    std::task::Poll::Ready(next) => next,
                    std::task::Poll::Pending => return Ok(()),
                }
            };
            let broken = !matches!(next, Some(Ok(_)));
            self.note(next).await?;
            if broken {
                return Ok(());
            }
        }
    }

    /// Sends the layout asked for, or waits for the reconfiguration under way.
    async fn send_target(&mut self) -> Result<(), EslError> {
        let Some(target) = &self.target else {
            self.unsent = false;
            return Ok(());
        };
        if self.inventory.reconfiguring.is_some() {
            self.unsent = true;
            return Ok(());
        }
        let text = target.to_string();
        match self
            .api
            .apply_mig_layout(self.node, self.gpu, text.clone(), false)
            .await
        {
            Ok(_) => self.unsent = false,
            // A slice the policy let go of may still be held until its task's stop is
            // confirmed (`MigRefusal::Busy`), or another change may have begun
            // (`InProgress`): asked again next round.
            Err(e) if e.is_retryable() => {
                tracing::debug!(layout = %text, error = %e, "MIG layout not taken yet; asking again");
                self.unsent = true;
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// The request that runs `task` on instance `on`, which must be in the inventory and idle.
    fn idle_slice(
        &self,
        view: &GpuView,
        task: TaskId,
        on: Placement,
    ) -> Result<ResourceSet, SeamError> {
        let slice = self.slice_at(on).ok_or(SeamError::NoInstance(on))?;
        match view.at(on.start) {
            Some(i) if i.state != InstanceState::Idle => Err(SeamError::Busy {
                placement: on,
                state: i.state,
            }),
            _ => {
                slice_request(on, &slice.uuid).map_err(|why| SeamError::Task { task, reason: why })
            }
        }
    }

    /// Carries out one command (see the module doc); a refused command changes nothing.
    async fn execute(&mut self, command: &Command) -> Result<bool, SeamError> {
        let view = self.view();
        match *command {
            Command::Create(p) => {
                let mut placements = view.layout.placements().to_vec();
                placements.push(p);
                let next = Layout::from_placements(self.model, placements).map_err(|e| {
                    SeamError::Illegal {
                        placement: p,
                        reason: e.to_string(),
                    }
                })?;
                self.target = Some(next);
                self.creating.insert(p);
                Ok(true)
            }
            Command::Destroy(p) => {
                let instance = view.at(p.start).filter(|i| i.placement == p);
                match instance.map(|i| i.state) {
                    None => Err(SeamError::NoInstance(p)),
                    Some(InstanceState::Idle) => {
                        let rest = view.layout.placements().iter().copied().filter(|q| *q != p);
                        let next = Layout::from_placements(self.model, rest.collect::<Vec<_>>())
                            .map_err(|e| SeamError::Illegal {
                                placement: p,
                                reason: e.to_string(),
                            })?;
                        self.target = Some(next);
                        Ok(true)
                    }
                    Some(state) => Err(SeamError::Busy {
                        placement: p,
                        state,
                    }),
                }
            }
            Command::Launch { task, on } => {
                let resources = self.idle_slice(&view, task, on)?;
                if self.trainer_jobs.contains_key(&task) {
                    self.launch_trainer(task, on, resources).await?;
                    return Ok(false);
                }
                self.api
                    .requeue(task, resources)
                    .await
                    .map_err(|e| SeamError::Task {
                        task,
                        reason: e.to_string(),
                    })?;
                self.launched.insert(task, (on, None));
                Ok(false)
            }
            Command::Stop(task) => {
                if self.trainer_jobs.contains_key(&task) {
                    // Its trainer is killed; the next launch creates a new one.
                    let running = self.trainers.iter().find(|(_, r)| r.job == task);
                    if let Some(actor) = running.map(|(a, _)| *a) {
                        self.api
                            .cancel(vec![actor])
                            .await
                            .map_err(|e| SeamError::Task {
                                task,
                                reason: e.to_string(),
                            })?;
                        self.end_trainer(actor, TrainerEnd::Stopped);
                    }
                    self.launched.remove(&task);
                    return Ok(false);
                }
                let queued = queue_request().map_err(|e| SeamError::Task {
                    task,
                    reason: e.to_string(),
                })?;
                self.api
                    .requeue(task, queued)
                    .await
                    .map_err(|e| SeamError::Task {
                        task,
                        reason: e.to_string(),
                    })?;
                self.launched.remove(&task);
                Ok(false)
            }
            Command::Bind { task, on } => {
                let template = self.services.get(&task).ok_or_else(|| SeamError::Task {
                    task,
                    reason: "is not an inference service of this GPU (add_service)".into(),
                })?;
                let mut spec = template.clone();
                spec.resources = self.idle_slice(&view, task, on)?;
                spec.max_retries = 0;
                let actor = match &mut spec.kind {
                    TaskKind::Actor(actor) => {
                        if actor.class == SERVING_REPLICA_CLASS {
                            // The replica knows which service it serves.
                            actor.args = codec::encode(&task.0)
                                .map_err(|e| SeamError::Task {
                                    task,
                                    reason: e.to_string(),
                                })?
                                .into();
                        }
                        true
                    }
                    _ => false,
                };
                let ids = self
                    .api
                    .submit(vec![spec])
                    .await
                    .map_err(|e| SeamError::Task {
                        task,
                        reason: e.to_string(),
                    })?;
                let replica = ids.into_iter().next().ok_or_else(|| SeamError::Task {
                    task,
                    reason: "the replica was not submitted".into(),
                })?;
                self.replicas.insert(
                    on.start,
                    ReplicaTask {
                        service: task,
                        task: replica,
                        on,
                        running: false,
                        draining: false,
                        cancelled: false,
                        actor,
                        reported: 0.0,
                        untold: false,
                    },
                );
                // Requests may queue on it at once; it serves once its task runs.
                self.serving.bind(task, on, u64::MAX);
                Ok(false)
            }
            Command::Drain { task, on } => {
                let replica = self
                    .replicas
                    .get_mut(&on.start)
                    .filter(|r| r.on == on && r.service == task && !r.draining)
                    .ok_or_else(|| SeamError::Task {
                        task,
                        reason: format!("has no serving replica on {on}"),
                    })?;
                replica.draining = true;
                self.serving.drain(on);
                Ok(false)
            }
        }
    }
}

/// How long [`drive`] waits between rounds.
pub const ROUND: Duration = Duration::from_millis(25);

/// Runs `policy` on `gpu` until the policy is done and nothing runs or is being created, or
/// `until` passes: each round reads the GPU and the launched tasks, hands the events (then a
/// `Tick`) to the policy, and carries out its commands in order, the layout changes of a step
/// sent as one reconfiguration.
pub async fn drive<C: ClusterApi>(
    policy: &mut dyn GpuPolicy,
    gpu: &mut ClusterGpu<C>,
    until: Duration,
) -> Result<DriveReport, EslError> {
    drive_with(policy, gpu, until, |_| {}).await
}

/// [`drive`], calling `each_round` with the GPU at the start of every round (to hand requests
/// to its inference services with [`ClusterGpu::arrive`]).
pub async fn drive_with<C: ClusterApi>(
    policy: &mut dyn GpuPolicy,
    gpu: &mut ClusterGpu<C>,
    until: Duration,
    mut each_round: impl FnMut(&mut ClusterGpu<C>) + Send,
) -> Result<DriveReport, EslError> {
    let mut report = DriveReport::default();
    let mut out = Vec::new();
    loop {
        each_round(gpu);
        let (mut events, failed) = gpu.poll().await?;
        report.failed.extend(failed);
        events.push(Event::Tick);
        for event in &events {
            let now = gpu.now();
            policy.on_event(event, &gpu.view(), now, &mut out);
            let mut layout_changed = false;
            for command in out.drain(..) {
                match gpu.execute(&command).await {
                    Ok(changed) => layout_changed |= changed,
                    Err(e) => {
                        tracing::warn!(%command, error = %e, "the cluster refused a policy command");
                        report.refused.push((now, command, e.to_string()));
                    }
                }
            }
            if layout_changed {
                report.reconfigurations += 1;
                gpu.send_target().await?;
            }
        }
        let idle = gpu.launched.is_empty() && gpu.creating.is_empty() && gpu.target.is_none();
        if policy.is_done() && idle {
            report.finished_at = Some(gpu.now());
            break;
        }
        if gpu.started.elapsed() >= until {
            break;
        }
        tokio::time::sleep(ROUND).await;
    }
    report.layouts = gpu.layouts.clone();
    Ok(report)
}

/// GPU `gpu` of node `node`, as the cluster reports it.
async fn read<C: ClusterApi>(api: &C, node: NodeId, gpu: u32) -> Result<GpuStatus, EslError> {
    let nodes = api.gpus().await?;
    nodes
        .into_iter()
        .find(|n| n.node == node)
        .and_then(|n| n.gpus.into_iter().find(|g| g.info.index == gpu))
        .ok_or_else(|| EslError::Refused(format!("node {node} has no GPU {gpu}")))
}

/// What the driver subscribes to: the starts and ends of the caller's tasks (it keeps those of
/// its own).
fn task_events() -> WatchRequest {
    WatchRequest::all().kinds([WatchKind::Started, WatchKind::Finished])
}

/// What a job waits on while queued.
fn queue_request() -> Result<ResourceSet, EslError> {
    let mut set = ResourceSet::new();
    set.insert(ResourceName::new(QUEUE_RESOURCE)?, Amount::ONE);
    Ok(set)
}

/// Profiler `actor`'s answer to `run`.
async fn ask_profile<C: ClusterApi>(
    api: &C,
    actor: TaskId,
    run: &ProfileRun,
) -> Result<ProfileMeasured, EslError> {
    let args = codec::encode(run).map_err(|e| EslError::Refused(e.to_string()))?;
    let bytes = api.call_actor(actor, "profile".to_string(), args).await?;
    codec::decode::<ProfileMeasured>(&bytes).map_err(|e| EslError::Refused(e.to_string()))
}

/// The request that runs a job on exactly one slice: its class and its identity.
fn slice_request(on: Placement, uuid: &str) -> Result<ResourceSet, String> {
    let class = mig_class(on.profile.name).ok_or("the profile cannot be named")?;
    let identity = mig_identity(uuid).ok_or_else(|| format!("{uuid} cannot be named"))?;
    let mut set = ResourceSet::new();
    set.insert(class, Amount::ONE);
    set.insert(identity, Amount::ONE);
    Ok(set)
}

#[cfg(test)]
mod tests {
    use escher_client::Task;
    use escher_proto::types::{GpuInfo, MigDevice, NodeGpus};

    use super::*;
    use crate::support::testing::Counting;
    use escher_esl::{InMemoryCluster, Mode};

    /// Slices of the fake GPU: seven 1g.5gb instances of an A100-40GB.
    const SLICES: u8 = 7;

    /// A cluster with one node whose GPU is an A100-40GB cut in seven 1g.5gb slices, its
    /// resources those the head would make of them; status reads counted.
    fn cluster_with_a_gpu() -> (Counting, NodeId) {
        let cluster = InMemoryCluster::new(Mode::Manual);
        let mut resources = format!("cpu=8,mig.1g.5gb={SLICES}");
        for i in 0..SLICES {
            resources.push_str(&format!(",mig.MIG-t{i}=1"));
        }
        let node = cluster.add_node(&resources);
        let slices = (0..SLICES)
            .map(|i| MigDevice {
                profile: "1g.5gb".into(),
                start: i,
                size: 1,
                memory_mib: 4864,
                uuid: format!("MIG-t{i}"),
            })
            .collect();
        let gpu = GpuStatus {
            info: GpuInfo {
                index: 0,
                uuid: "GPU-t".into(),
                product: "NVIDIA A100-SXM4-40GB".into(),
                model: Some(GpuModel::A100_40GB),
                memory_mib: 40_960,
                mig_enabled: true,
                simulated: true,
                slices,
            },
            holders: Vec::new(),
            reconfiguring: None,
            last_error: None,
            last_reconfiguration: None,
        };
        let gpus = vec![NodeGpus {
            node,
            name: "sim".into(),
            alive: true,
            gpus: vec![gpu],
        }];
        (Counting::new(cluster, gpus), node)
    }

    /// Launches its jobs on idle slices at the first tick; done when each has ended.
    struct LaunchAll {
        jobs: Vec<TaskId>,
        launched: bool,
        ended: BTreeSet<TaskId>,
    }

    impl GpuPolicy for LaunchAll {
        fn name(&self) -> String {
            "launch-all".into()
        }

        fn on_event(&mut self, event: &Event, gpu: &GpuView, _now: u64, out: &mut Vec<Command>) {
            match event {
                Event::Tick if !self.launched => {
                    for (task, on) in self.jobs.iter().zip(gpu.idle()) {
                        out.push(Command::Launch { task: *task, on });
                    }
                    self.launched = true;
                }
                Event::Finished(task) | Event::OutOfMemory { task, .. } => {
                    self.ended.insert(*task);
                }
                _ => {}
            }
        }

        fn is_done(&self) -> bool {
            self.ended.len() == self.jobs.len()
        }
    }

    /// The driver hears its launched jobs start and end from the cluster's events: over many
    /// rounds with every job running it reads no status, and in all about one per start and
    /// one per end, where polling read every launched job's status every round.
    #[tokio::test]
    async fn drive_hears_starts_and_ends_from_events_not_by_polling_status() {
        let (api, node) = cluster_with_a_gpu();
        let mut gpu = ClusterGpu::new(api.clone(), node, 0).await.unwrap();
        let n = SLICES as usize;
        let jobs = gpu
            .submit(vec![Task::function("work", Vec::new()).build().unwrap(); n])
            .await
            .unwrap();
        let mut policy = LaunchAll {
            jobs: jobs.clone(),
            launched: false,
            ended: BTreeSet::new(),
        };
        let cluster = api.inner.clone();
        let outside = async {
            while cluster.running().len() < n {
                tokio::time::sleep(ROUND).await;
            }
            // Everything runs: let the driver go round and round.
            let before = api.statuses();
            tokio::time::sleep(ROUND * 20).await;
            let during = api.statuses() - before;
            for (i, job) in jobs.iter().enumerate() {
                // One fails: the driver says why.
                cluster.finish(*job, i != 0);
            }
            during
        };
        let (report, during) = tokio::join!(
            drive(&mut policy, &mut gpu, Duration::from_secs(30)),
            outside
        );
        let report = report.unwrap();
        assert!(report.finished_at.is_some(), "{report:?}");
        assert!(report.refused.is_empty(), "{report:?}");
        assert_eq!(report.failed.len(), 1, "{report:?}");
        assert_eq!(report.failed[0].0, jobs[0]);
        assert_eq!(report.failed[0].1, "failed by the test");
        assert!(
            during <= 2 * n,
            "{during} status reads in 20 rounds with {n} jobs running: polling"
        );
        assert!(
            api.statuses() <= 2 * n,
            "{} status reads for {n} jobs: more than one per start and end",
            api.statuses()
        );
    }
}
