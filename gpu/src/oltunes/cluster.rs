//! OLTunes on a cluster ([`OlTunesCluster`]): the same scheduler ([`OlTunes`](super::OlTunes),
//! or any [`Scheduler`] of the comparison) deciding, in wall-clock time against a head and a
//! worker with simulated whole GPUs (`--sim-gpu a100-40gb`), where each inference server runs
//! and with what share of which GPU; every server it places is a real actor of the built-in
//! class [`SERVING_REPLICA_CLASS`].
//!
//! **What is real.** Placement and the resources held: a server (one OLTunes task, the
//! paper's per-task inference pod) is an actor created where the scheduler launched it,
//! holding one co-location slot of that GPU's device (`gpu=0.25,gpu.<uuid>=0.25`: a quarter,
//! so the worker's device allocator gives it that device and no more than
//! [`MAX_COLOCATED`] servers share one, the simulation's cap) and the memory its tuned batch
//! needs (the GPU's ephemeral resource `olt-<instance>-<node>-<idx>-mem`, in GB, the name
//! [`GpuResources`](super::resources::GpuResources) gives it). The head admits it or not: a
//! server the cluster has not started within [`OlTunesCluster::refusing_after`] (the GPU had
//! no slot or memory for it, whoever holds them) is a refused assignment: it is killed, and the
//! scheduler hears `refused` (Algorithm 3's feedback), which puts the task back in `Q_LC` and
//! relaunches it later, wherever and at whatever tuning it then chooses: a new actor. That is
//! OLTunes' only move: its scheduler never moves or resizes a server that runs (the paper has
//! no such step), so a refused server has served nothing. When a server's work is done it is
//! told how many requests it served (`serve`), must count as many and say which device it was
//! given (`info`: its GPU's, and only that), and is killed, which frees its share. Servers
//! still running when the run ends are drained: told what they served so far, checked and
//! killed. Every server is kept ([`ClusterRun::servers`]).
//!
//! **What is simulated.** The requests and their speed: how long a server takes is the
//! in-memory simulation's model ([`sim`](super::sim): the model's batch latency on the GPU
//! type at its SM% and batch, slowed by Table 1's interference from the servers that run on
//! the same GPU *on the cluster* now, with the seeded ±5% noise), on the driver's clock; the
//! SM% is recorded, not enforced (MPS' cap; the simulation does not sum it either). The GPU
//! types are the driver's: a simulated A100-40GB device stands for whichever OLTunes type it
//! is given (an A30 or an RTX 4090 stand-in has that type's speeds and memory resource, not the
//! device's), because the worker simulates only NVIDIA's MIG-capable data-centre models.
//!
//! **Time.** The policy's clock is the driver's, in ms since the run began; with
//! [`OlTunesCluster::with_time_scale`] a simulated second lasts `scale` wall seconds. A
//! server's time starts when the driver first sees its actor run (an actor's creation takes
//! wall milliseconds the in-memory run does not have); [`ServerView::start_wall_ms`] is that
//! delay, measured. Its work ends within a round ([`ROUND`] plus the round's calls), when the
//! work it had left at the round's start took at its speed then: that is its end for the
//! scheduler and the outcomes; the driver hears it at the round's end, and only then tells and
//! kills the actor, which holds its share until then.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use escher_proto::codec;
use escher_proto::types::{
    Amount, Capacity, CapacityOp, NodeId, NodeSpec, ReplicaInfo, ResourceName, ResourceSet,
    ResourceUpdate, SERVING_REPLICA_CLASS, TaskId, TaskState, gpu_identity,
};

use super::predictor::Sample;
use super::sim::{GpuState, Launch, MAX_COLOCATED, Outcome, Running, Scheduler};
use super::task::{GpuType, Model, Task, interference};
use crate::support::er_name;
use escher_esl::{ClusterApi, EslError};

/// How long the driver sleeps between rounds (each round: servers progress and end, tasks
/// arrive, pending servers are read, the scheduler steps).
pub const ROUND: Duration = Duration::from_millis(10);

/// How long a server may wait to be started by the cluster before its assignment counts as
/// refused (the default of [`OlTunesCluster::refusing_after`]).
pub const REFUSE_AFTER: Duration = Duration::from_millis(500);

/// One GPU of the run: a whole (not MIG) device of a worker, and the OLTunes type it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OltGpu {
    /// Its node.
    pub node: NodeId,
    /// Its index on the node.
    pub index: u32,
    /// Its device's UUID (`GPU-…`).
    pub uuid: String,
    /// The OLTunes type it stands for (its speeds and its memory resource).
    pub ty: GpuType,
    /// Its memory, GB, as an ephemeral resource of the node (capacity: the type's memory).
    pub mem: ResourceName,
}

/// How a server ended ([`ServerView::end`]).
#[derive(Debug, Clone, PartialEq)]
pub enum ServerEnd {
    /// It runs (only while a run is under way).
    Running,
    /// It served its task's every input, counted them, held its GPU's device, and was killed.
    Finished,
    /// The cluster did not start it in time: killed, and the task handed back to the scheduler.
    Refused,
    /// It ran when the run ended: told what it served so far, checked, and killed.
    Drained,
    /// Not started when the run ended: killed.
    Unplaced,
    /// It ended by itself, or did not answer or disagreed when told what it served: why.
    Failed(String),
}

/// One inference server the scheduler placed: an actor of [`SERVING_REPLICA_CLASS`].
#[derive(Debug, Clone, PartialEq)]
pub struct ServerView {
    /// The OLTunes task it serves (its actor's `service`).
    pub task: usize,
    /// Its actor.
    pub actor: TaskId,
    /// The GPU it was placed on (an index into [`OlTunesCluster::gpus`]).
    pub gpu: usize,
    /// Batch size and SM% the scheduler tuned it to.
    pub batch: u32,
    /// SM% (recorded, not enforced).
    pub sm_pct: f64,
    /// Memory it holds, GB.
    pub mem_gb: f64,
    /// When it was created, ms of the policy's clock.
    pub created_ms: u64,
    /// When the driver first saw it run, ms of the policy's clock.
    pub started_ms: Option<u64>,
    /// Wall time from its creation to the driver seeing it run, ms (measured).
    pub start_wall_ms: Option<f64>,
    /// When it ended, ms of the policy's clock.
    pub ended_ms: Option<u64>,
    /// Requests it served, as the driver counts them.
    pub served: f64,
    /// What its actor answered when told (its own count), if it was told.
    pub counted: Option<f64>,
    /// What its actor said of itself before it was killed.
    pub info: Option<ReplicaInfo>,
    /// How it ended.
    pub end: ServerEnd,
}

/// What [`OlTunesCluster::run`] saw.
#[derive(Debug, Clone, Default)]
pub struct ClusterRun {
    /// Every server, in the order created.
    pub servers: Vec<ServerView>,
    /// Per task, by id: when its (last) server started and ended, and on which GPU.
    pub outcomes: Vec<Outcome>,
    /// Failures: servers that ended by themselves, did not answer, or disagreed.
    pub failed: Vec<String>,
    /// Launches the scheduler heard refused (by the cluster, or of a task already placed).
    pub refused: usize,
    /// The scheduler's predictor retrains.
    pub retrains: usize,
    /// When the run ended, ms of the policy's clock.
    pub ended_ms: u64,
}

impl ClusterRun {
    /// Tasks whose server finished.
    pub fn finished(&self) -> usize {
        self.outcomes.iter().filter(|o| o.end_ms.is_some()).count()
    }
}

/// A server the driver follows.
#[derive(Debug, Clone)]
struct Live {
    entry: usize,
    launch: Launch,
    model: usize,
    created: Instant,
    running: Option<Running>,
    /// When its work ended on the policy's clock (within the last round: the time the
    /// work left at the round's start took at its speed), once it has.
    done_ms: Option<u64>,
}

/// OLTunes' GPUs on a cluster (see the module doc).
#[derive(Debug)]
pub struct OlTunesCluster<C: ClusterApi> {
    api: C,
    gpus: Vec<OltGpu>,
    scale: f64,
    refuse_after: Duration,
}

/// `x` as an amount (rounded to the amount's precision).
fn amount(x: f64) -> Result<Amount, EslError> {
    let raw = (x.max(0.0) * Amount::ONE.raw() as f64).round() as u64;
    Ok(Amount::from_raw(raw)?)
}

impl<C: ClusterApi> OlTunesCluster<C> {
    /// The run's GPUs: each `(node, index, type)` a whole device the cluster reports (not in
    /// MIG mode), standing for that OLTunes type; their memory resources are created (named
    /// for `instance`) in one all-or-none batch.
    pub async fn create(
        api: C,
        instance: &str,
        gpus: &[(NodeId, u32, GpuType)],
    ) -> Result<OlTunesCluster<C>, EslError> {
        let nodes = api.gpus().await?;
        let mut out = Vec::with_capacity(gpus.len());
        let mut updates = Vec::with_capacity(gpus.len());
        for &(node, index, ty) in gpus {
            let info = nodes
                .iter()
                .find(|n| n.node == node)
                .and_then(|n| n.gpus.iter().find(|g| g.info.index == index))
                .map(|g| &g.info)
                .ok_or_else(|| EslError::Refused(format!("node {node} has no GPU {index}")))?;
            if info.mig_enabled {
                return Err(EslError::Refused(format!(
                    "GPU {index} of node {node} is in MIG mode: OLTunes' servers share whole \
                     GPUs (MPS), give it a GPU without MIG"
                )));
            }
            let mem = er_name(&[
                "olt",
                instance,
                &node.0.to_string(),
                &index.to_string(),
                "mem",
            ])?;
            updates.push(ResourceUpdate {
                name: mem.clone(),
                op: CapacityOp::Set(Capacity::Finite(amount(ty.memory_gb())?)),
                target: NodeSpec::Node(node),
            });
            out.push(OltGpu {
                node,
                index,
                uuid: info.uuid.clone(),
                ty,
                mem,
            });
        }
        api.set_resources(updates).await?;
        Ok(OlTunesCluster {
            api,
            gpus: out,
            scale: 1.0,
            refuse_after: REFUSE_AFTER,
        })
    }

    /// The same run on a clock where a simulated second lasts `scale` wall seconds; the
    /// default is 1, wall-clock time.
    pub fn with_time_scale(mut self, scale: f64) -> OlTunesCluster<C> {
        if scale > 0.0 && scale.is_finite() {
            self.scale = scale;
        }
        self
    }

    /// A server the cluster has not started within `after` (wall time) is refused; the
    /// default is [`REFUSE_AFTER`].
    pub fn refusing_after(mut self, after: Duration) -> OlTunesCluster<C> {
        self.refuse_after = after;
        self
    }

    /// The GPUs, in the order given.
    pub fn gpus(&self) -> &[OltGpu] {
        &self.gpus
    }

    /// The types of the GPUs, in order (what the scheduler is built over).
    pub fn types(&self) -> Vec<GpuType> {
        self.gpus.iter().map(|g| g.ty).collect()
    }

    /// What a server on GPU `gpu` holding `mem_gb` asks for: one co-location slot of the
    /// device (`gpu` and `gpu.<uuid>`, 1/[`MAX_COLOCATED`] each) and its memory.
    pub fn request(&self, gpu: usize, mem_gb: f64) -> Result<ResourceSet, EslError> {
        let g = self
            .gpus
            .get(gpu)
            .ok_or_else(|| EslError::Unsatisfiable(format!("no GPU {gpu} in this OLTunes run")))?;
        let identity = gpu_identity(&g.uuid)
            .ok_or_else(|| EslError::Refused(format!("{} cannot be named", g.uuid)))?;
        let slot = Amount::from_raw(Amount::ONE.raw() / MAX_COLOCATED as u64)?;
        let mut set = ResourceSet::new();
        set.insert(ResourceName::gpu(), slot);
        set.insert(identity, slot);
        set.insert(g.mem.clone(), amount(mem_gb)?);
        Ok(set)
    }

    /// Removes the GPUs' memory resources (after a run: nothing holds them then).
    pub async fn dissolve(self) -> Result<(), EslError> {
        let updates = self
            .gpus
            .iter()
            .map(|g| ResourceUpdate {
                name: g.mem.clone(),
                op: CapacityOp::Delete,
                target: NodeSpec::Node(g.node),
            })
            .collect();
        self.api.set_resources(updates).await?;
        Ok(())
    }

    /// Milliseconds of the policy's clock since `started`.
    fn clock(&self, started: Instant) -> u64 {
        (started.elapsed().as_secs_f64() * 1000.0 / self.scale) as u64
    }

    /// Runs `scheduler` over `tasks` (their arrivals on the policy's clock) until every task
    /// is served or `horizon_ms` passes; the servers' speeds carry a seeded ±5% noise, as the
    /// simulation's do. Every server is ended (and its resources freed) when this returns.
    pub async fn run(
        &self,
        scheduler: &mut dyn Scheduler,
        tasks: &[Task],
        models: &[Model],
        horizon_ms: u64,
        seed: u64,
    ) -> Result<ClusterRun, EslError> {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut run = ClusterRun {
            outcomes: vec![
                Outcome {
                    start_ms: None,
                    end_ms: None,
                    gpu: None,
                };
                tasks.len()
            ],
            ..ClusterRun::default()
        };
        let mut live: BTreeMap<TaskId, Live> = BTreeMap::new();
        let mut actors = Vec::new();
        let started = Instant::now();
        let (mut next, mut last, mut out) = (0, 0u64, Vec::new());
        loop {
            let now = self.clock(started);
            let dt = now.saturating_sub(last) as f64;
            last = now;
            self.progress(&mut live, models, now, dt);
            let done: Vec<TaskId> = live
                .iter()
                .filter(|(_, l)| l.done_ms.is_some())
                .map(|(a, _)| *a)
                .collect();
            for actor in done {
                let Some(l) = live.remove(&actor) else {
                    continue;
                };
                let (Some(start_ms), Some(end_ms)) =
                    (l.running.as_ref().map(|r| r.start_ms), l.done_ms)
                else {
                    continue;
                };
                let task = &tasks[l.launch.task];
                let inputs = f64::from(task.inputs);
                self.tell(actor, &l, inputs, ServerEnd::Finished, &mut run)
                    .await?;
                run.servers[l.entry].ended_ms = Some(end_ms);
                run.outcomes[task.id].end_ms = Some(end_ms);
                let batches = f64::from(task.inputs.div_ceil(l.launch.batch));
                scheduler.finished(
                    task.id,
                    Sample {
                        model: task.model,
                        gpu: self.gpus[l.launch.gpu].ty,
                        batch: l.launch.batch,
                        sm_pct: l.launch.sm_pct,
                        latency_ms: (end_ms.saturating_sub(start_ms) as f64 / batches).max(0.1),
                    },
                );
            }
            let mirror = self.mirror(&live, models);
            while next < tasks.len() && tasks[next].arrival_ms <= now {
                scheduler.arrive(&tasks[next], now, &mirror);
                next += 1;
            }
            self.read_pending(&mut live, scheduler, tasks, models, &mut run, now, &mut rng)
                .await?;
            let mirror = self.mirror(&live, models);
            scheduler.step(now, &mirror, &mut out);
            for launch in out.drain(..) {
                let task = &tasks[launch.task];
                let placed = run.outcomes[task.id].start_ms.is_some()
                    || live.values().any(|l| l.launch.task == task.id);
                if placed || launch.gpu >= self.gpus.len() {
                    run.refused += 1;
                    scheduler.refused(launch, now);
                    continue;
                }
                let actor = self
                    .create_server(launch, task, models, now, &mut run)
                    .await?;
                actors.push(actor);
                live.insert(
                    actor,
                    Live {
                        entry: run.servers.len() - 1,
                        launch,
                        model: task.model,
                        created: Instant::now(),
                        running: None,
                        done_ms: None,
                    },
                );
            }
            let all_done = next == tasks.len() && live.is_empty() && run.finished() == tasks.len();
            if all_done || now >= horizon_ms {
                run.ended_ms = now;
                break;
            }
            tokio::time::sleep(ROUND).await;
        }
        // Whatever is left is drained (running) or taken back (never started).
        for (actor, l) in std::mem::take(&mut live) {
            match &l.running {
                Some(r) => {
                    let inputs = f64::from(tasks[l.launch.task].inputs);
                    let served = (inputs * r.progress()).floor().max(0.0);
                    self.tell(actor, &l, served, ServerEnd::Drained, &mut run)
                        .await?;
                }
                None => {
                    self.api.cancel(vec![actor]).await?;
                    run.servers[l.entry].end = ServerEnd::Unplaced;
                }
            }
            run.servers[l.entry].ended_ms = Some(run.ended_ms);
        }
        if !actors.is_empty() {
            // Every server has ended, and what it held is free, when this returns.
            self.api
                .wait(actors.clone(), actors.len(), Duration::from_secs(30))
                .await?;
        }
        run.retrains = scheduler.retrains();
        Ok(run)
    }

    /// Each running server does `dt` ms of solo work over its interference with the servers
    /// running on its GPU now (the round that ends at `now`); one whose work runs out ends
    /// within the round, when the work it had left took at that speed.
    fn progress(&self, live: &mut BTreeMap<TaskId, Live>, models: &[Model], now: u64, dt: f64) {
        for gpu in 0..self.gpus.len() {
            let on: Vec<(TaskId, usize)> = live
                .iter()
                .filter(|(_, l)| l.launch.gpu == gpu && l.running.is_some())
                .map(|(a, l)| (*a, l.model))
                .collect();
            for (i, (actor, model)) in on.iter().enumerate() {
                let others: Vec<&Model> = on
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, (_, m))| &models[*m])
                    .collect();
                let factor = interference(&models[*model], &others);
                let Some(l) = live.get_mut(actor).filter(|l| l.done_ms.is_none()) else {
                    continue;
                };
                if let Some(r) = l.running.as_mut() {
                    let speed = 1.0 / (factor * r.noise);
                    let before = r.left_ms;
                    r.left_ms -= dt * speed;
                    if r.left_ms <= 0.0 {
                        let took = (before.max(0.0) / speed).ceil() as u64;
                        let begun = now.saturating_sub(dt as u64).max(r.start_ms);
                        l.done_ms = Some((begun + took).min(now));
                    }
                }
            }
        }
    }

    /// The GPUs as the scheduler sees them: every server it placed and the cluster has not
    /// refused, started or not (a pending one with all its work left), on its GPU.
    fn mirror(&self, live: &BTreeMap<TaskId, Live>, models: &[Model]) -> Vec<GpuState> {
        let mut gpus: Vec<GpuState> = self
            .gpus
            .iter()
            .map(|g| GpuState {
                ty: g.ty,
                running: Vec::new(),
            })
            .collect();
        for l in live.values() {
            let model = &models[l.model];
            let r = l.running.clone().unwrap_or_else(|| Running {
                task: l.launch.task,
                model: l.model,
                mem_gb: model.memory_gb(l.launch.batch),
                sm_pct: l.launch.sm_pct,
                sm_used: l.launch.sm_pct.min(model.sat_sm),
                batch: l.launch.batch,
                start_ms: 0,
                left_ms: 1.0,
                total_ms: 1.0,
                noise: 1.0,
            });
            if let Some(g) = gpus.get_mut(l.launch.gpu) {
                g.running.push(r);
            }
        }
        gpus
    }

    /// Creates the actor of `launch`'s server where the scheduler placed it.
    async fn create_server(
        &self,
        launch: Launch,
        task: &Task,
        models: &[Model],
        now: u64,
        run: &mut ClusterRun,
    ) -> Result<TaskId, EslError> {
        let mem_gb = models[task.model].memory_gb(launch.batch);
        let resources = self.request(launch.gpu, mem_gb)?;
        let spec = escher_client::Task::actor_typed(SERVING_REPLICA_CLASS, &(task.id as u64))
            .resources(resources)
            .build()
            .map_err(|e| EslError::Refused(e.to_string()))?;
        let actor = self
            .api
            .submit(vec![spec])
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| EslError::Refused("the server's actor was not submitted".into()))?;
        run.servers.push(ServerView {
            task: task.id,
            actor,
            gpu: launch.gpu,
            batch: launch.batch,
            sm_pct: launch.sm_pct,
            mem_gb,
            created_ms: now,
            started_ms: None,
            start_wall_ms: None,
            ended_ms: None,
            served: 0.0,
            counted: None,
            info: None,
            end: ServerEnd::Running,
        });
        Ok(actor)
    }

    /// Reads the servers not seen running yet: one that runs starts its work now; one the
    /// cluster has not started within the refusal time is killed and its launch refused; one
    /// that ended by itself is a failure, and its launch refused (the task is tried again).
    #[allow(clippy::too_many_arguments)]
    async fn read_pending(
        &self,
        live: &mut BTreeMap<TaskId, Live>,
        scheduler: &mut dyn Scheduler,
        tasks: &[Task],
        models: &[Model],
        run: &mut ClusterRun,
        now: u64,
        rng: &mut fastrand::Rng,
    ) -> Result<(), EslError> {
        let pending: Vec<TaskId> = live
            .iter()
            .filter(|(_, l)| l.running.is_none())
            .map(|(a, _)| *a)
            .collect();
        for actor in pending {
            let status = self.api.status(actor).await?;
            let Some(l) = live.get_mut(&actor) else {
                continue;
            };
            match status.state {
                TaskState::Running => {
                    let task = &tasks[l.launch.task];
                    let model = &models[task.model];
                    let ty = self.gpus[l.launch.gpu].ty;
                    let solo = f64::from(task.inputs.div_ceil(l.launch.batch))
                        * model.batch_ms(ty, l.launch.batch, l.launch.sm_pct);
                    l.running = Some(Running {
                        task: task.id,
                        model: task.model,
                        mem_gb: model.memory_gb(l.launch.batch),
                        sm_pct: l.launch.sm_pct,
                        sm_used: l.launch.sm_pct.min(model.sat_sm),
                        batch: l.launch.batch,
                        start_ms: now,
                        left_ms: solo,
                        total_ms: solo,
                        noise: 1.0 + (rng.f64() - 0.5) * 0.1,
                    });
                    let view = &mut run.servers[l.entry];
                    view.started_ms = Some(now);
                    view.start_wall_ms = Some(l.created.elapsed().as_secs_f64() * 1000.0);
                    let outcome = &mut run.outcomes[task.id];
                    outcome.start_ms = Some(now);
                    outcome.gpu = Some(l.launch.gpu);
                }
                TaskState::Pending if l.created.elapsed() < self.refuse_after => {}
                TaskState::Pending => {
                    self.api.cancel(vec![actor]).await?;
                    if let Some(l) = live.remove(&actor) {
                        let view = &mut run.servers[l.entry];
                        view.end = ServerEnd::Refused;
                        view.ended_ms = Some(now);
                        run.refused += 1;
                        scheduler.refused(l.launch, now);
                    }
                }
                state => {
                    if let Some(l) = live.remove(&actor) {
                        let why = format!(
                            "server {actor} of task {} on GPU {} ended by itself: {}",
                            l.launch.task,
                            l.launch.gpu,
                            status.reason.unwrap_or_else(|| format!("{state:?}"))
                        );
                        let view = &mut run.servers[l.entry];
                        view.end = ServerEnd::Failed(why.clone());
                        view.ended_ms = Some(now);
                        run.failed.push(why);
                        run.refused += 1;
                        scheduler.refused(l.launch, now);
                    }
                }
            }
        }
        Ok(())
    }

    /// Tells server `actor` it served `served` requests, asks what it holds, checks both (its
    /// count is the driver's; its devices are its GPU's and only that; it serves its task),
    /// and kills it; it ends as `end`, or failed with why.
    async fn tell(
        &self,
        actor: TaskId,
        l: &Live,
        served: f64,
        end: ServerEnd,
        run: &mut ClusterRun,
    ) -> Result<(), EslError> {
        let counted = match codec::encode(&served) {
            Ok(args) => self.call(actor, "serve", args).await.and_then(|bytes| {
                codec::decode::<f64>(&bytes).map_err(|e| EslError::Refused(e.to_string()))
            }),
            Err(e) => Err(EslError::Refused(e.to_string())),
        };
        let info = match codec::encode(&()) {
            Ok(args) => self.call(actor, "info", args).await.and_then(|bytes| {
                codec::decode::<ReplicaInfo>(&bytes).map_err(|e| EslError::Refused(e.to_string()))
            }),
            Err(e) => Err(EslError::Refused(e.to_string())),
        };
        let uuid = &self.gpus[l.launch.gpu].uuid;
        let view = &mut run.servers[l.entry];
        view.served = served;
        let why = match (&counted, &info) {
            (Err(e), _) | (_, Err(e)) => Some(format!("did not answer: {e}")),
            (Ok(c), _) if (c - served).abs() > 1e-9 => {
                Some(format!("counted {c} requests served, the driver {served}"))
            }
            (_, Ok(i)) if i.devices.as_slice() != std::slice::from_ref(uuid) => Some(format!(
                "holds {:?}, not its GPU's device {uuid}",
                i.devices
            )),
            (_, Ok(i)) if i.service != l.launch.task as u64 || (i.served - served).abs() > 1e-9 => {
                Some(format!(
                    "says it served {} requests of task {}",
                    i.served, i.service
                ))
            }
            _ => None,
        };
        view.counted = counted.ok();
        view.info = info.ok();
        view.end = match why {
            None => end,
            Some(why) => {
                let why = format!(
                    "server {actor} of task {} on GPU {}: {why}",
                    l.launch.task, l.launch.gpu
                );
                run.failed.push(why.clone());
                ServerEnd::Failed(why)
            }
        };
        self.api.cancel(vec![actor]).await?;
        Ok(())
    }

    /// Calls `method` of `actor` with encoded `args`; its encoded answer.
    async fn call(&self, actor: TaskId, method: &str, args: Vec<u8>) -> Result<Vec<u8>, EslError> {
        self.api.call_actor(actor, method.to_string(), args).await
    }
}

#[cfg(test)]
mod tests {
    use escher_proto::types::{GpuInfo, GpuStatus, NodeGpus, TaskSpec};

    use super::*;
    use crate::support::testing::Counting;
    use escher_esl::{InMemoryCluster, Mode};

    fn gpu(index: u32, uuid: &str, mig: bool) -> GpuStatus {
        GpuStatus {
            info: GpuInfo {
                index,
                uuid: uuid.into(),
                product: "NVIDIA A100-SXM4-40GB".into(),
                model: Some(escher_proto::mig::GpuModel::A100_40GB),
                memory_mib: 40_960,
                mig_enabled: mig,
                simulated: true,
                slices: Vec::new(),
            },
            holders: Vec::new(),
            reconfiguring: None,
            last_error: None,
            last_reconfiguration: None,
        }
    }

    /// A node with two whole GPUs (0, 1) and one in MIG mode (2), its resources those the head
    /// would make of the whole ones.
    fn cluster() -> (Counting, NodeId) {
        let inner = InMemoryCluster::new(Mode::Manual);
        let node = inner.add_node("cpu=8,gpu=2,gpu.GPU-a=1,gpu.GPU-b=1");
        let gpus = vec![NodeGpus {
            node,
            name: "sim".into(),
            alive: true,
            gpus: vec![
                gpu(0, "GPU-a", false),
                gpu(1, "GPU-b", false),
                gpu(2, "GPU-c", true),
            ],
        }];
        (Counting::new(inner, gpus), node)
    }

    fn server(olt: &OlTunesCluster<Counting>, gpu: usize, mem_gb: f64) -> TaskSpec {
        escher_client::Task::actor_typed(SERVING_REPLICA_CLASS, &0u64)
            .resources(olt.request(gpu, mem_gb).expect("a request"))
            .build()
            .expect("a valid spec")
    }

    #[tokio::test]
    async fn a_server_holds_a_slot_of_its_gpu_and_its_memory_and_no_more_than_four_share_one() {
        let (api, node) = cluster();
        let refused = OlTunesCluster::create(api.clone(), "t", &[(node, 2, GpuType::A100)])
            .await
            .unwrap_err();
        assert!(refused.to_string().contains("MIG mode"), "{refused}");
        let missing = OlTunesCluster::create(api.clone(), "t", &[(node, 9, GpuType::A100)])
            .await
            .unwrap_err();
        assert!(missing.to_string().contains("no GPU 9"), "{missing}");

        let olt = OlTunesCluster::create(
            api.clone(),
            "t",
            &[(node, 0, GpuType::A100), (node, 1, GpuType::A30)],
        )
        .await
        .unwrap();
        assert_eq!(olt.types(), [GpuType::A100, GpuType::A30]);
        let asked = olt.request(1, 2.5).unwrap();
        let quarter: Amount = "0.25".parse().unwrap();
        assert_eq!(asked.get("gpu"), quarter);
        assert_eq!(asked.get("gpu.GPU-b"), quarter);
        assert_eq!(
            asked.get(olt.gpus()[1].mem.as_str()),
            "2.5".parse().unwrap()
        );
        assert_eq!(asked.len(), 3, "{asked:?}");
        assert!(olt.request(2, 1.0).is_err(), "no third GPU in the run");

        // Five servers of 1 GB on the A100: four run, the fifth waits for a slot.
        let ids = api
            .submit((0..5).map(|_| server(&olt, 0, 1.0)).collect())
            .await
            .unwrap();
        let running = api.inner.running();
        let on = |ids: &[TaskId], running: &[(TaskId, NodeId)]| {
            ids.iter()
                .filter(|t| running.iter().any(|(r, _)| r == *t))
                .count()
        };
        assert_eq!(on(&ids, &running), 4, "{running:?}");
        // Memory binds too: the A30 stand-in has 24 GB, so a 20 GB server and a 5 GB one do
        // not both fit.
        let ids = api
            .submit(vec![server(&olt, 1, 20.0), server(&olt, 1, 5.0)])
            .await
            .unwrap();
        let running = api.inner.running();
        assert_eq!(on(&ids, &running), 1, "{running:?}");
        api.inner
            .cancel(api.inner.running().iter().map(|(t, _)| *t).collect())
            .await
            .unwrap();
        olt.dissolve().await.unwrap();
    }
}
