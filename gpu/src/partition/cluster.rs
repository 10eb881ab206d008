//! [`ClusterFleet`]: the [`Partitioner`] driving the MIG GPUs of a real cluster through the
//! cluster API ([`ClusterApi`]): slices made on demand by the workers' reconfigurations (a
//! real GPU through NVML, or `escher-worker --sim-gpu`), tasks placed by the scheduler on the
//! slice the policy made or found for them.
//!
//! ```text
//!  submit(spec asking mig.2g.20gb=1) ──► the task waits on QUEUE_RESOURCE (no node has it)
//!                                          │ and its request is queued in the Partitioner
//!  round():                                ▼
//!    ClusterApi::gpus ──► one GpuView per MIG GPU of a live node (holders: Busy; slices asked
//!                         for and not shown yet: Creating; a failed reconfiguration of ours:
//!                         the GPU fails closed) ──► Partitioner::round ──► orders:
//!      Create / Destroy ──► the GPU's next layout, one apply_mig_layout per GPU and round
//!                           (no drain: the policy destroys idle slices only)
//!      Launch           ──► requeue of the task to its own resources with the slice's class
//!                           and identity (mig.2g.20gb=1, mig.<uuid>=1): the scheduler places it
//!                           on exactly that slice
//! ```
//!
//! **Adoption.** The driver keeps no layout: every round reads the GPUs, and a slice a task
//! holds (the head's `holders`) is busy whoever launched it. A driver started after another
//! one (or after a head or worker restart) therefore leaves the running tasks' slices alone
//! and reuses the idle ones before it reconfigures anything; tasks the old driver had queued
//! and not launched are handed to the new one with [`ClusterFleet::adopt`].
//!
//! **Failing closed.** A reconfiguration this driver asked for that the worker reports failed
//! (`GpuStatus::last_reconfiguration` with an error: the driver's NVML error, or the
//! simulated GPU's injected one), a layout the head refuses for another reason than "try
//! later", or a GPU that is no longer reported: [`Partitioner::failed`], and nothing is placed
//! on that GPU again by this driver.
//!
//! **Several slices in one task** (`mig.1g.10gb=2`, or `mig.1g.10gb=1` with `mig.2g.20gb=1`):
//! the policy sees one member per slice, all on one parent GPU (as a gang), made if needed;
//! the task is requeued once, onto all of them (the class counts and every slice's identity).
//!
//! **Bad input** ([`ClusterFleet::submit`]): a spec that asks for no MIG slice, for a part of
//! one or more than [`MAX_SLICES_PER_TASK`], slices no one GPU can hold together, or a profile
//! no GPU of the fleet has: refused with the reason, nothing submitted.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use escher_esl::{ClusterApi, EslError};
use escher_proto::Amount;
use escher_proto::mig::{GpuModel, Layout, Placement};
use escher_proto::types::{
    GpuStatus, NodeId, ResourceName, ResourceSet, TaskId, TaskSpec, TaskState, mig_class,
    mig_identity,
};
use thiserror::Error;

use super::fleet::Placer;
use super::{Partitioner, Request, SubmitError};
use crate::cluster::QUEUE_RESOURCE;
use crate::{Command, GpuView, Instance, InstanceState};

/// Why [`ClusterFleet::submit`] refused a task. Nothing was submitted.
#[derive(Debug, Error)]
pub enum FleetError {
    /// The spec's resources do not name exactly one slice of one MIG profile.
    #[error("{0}")]
    Spec(String),
    /// The partitioning policy refused the request (a profile no GPU has, a gang too big).
    #[error(transparent)]
    Policy(#[from] SubmitError),
    /// The cluster refused or could not be reached.
    #[error(transparent)]
    Cluster(#[from] EslError),
}

/// One MIG GPU of the fleet.
#[derive(Debug, Clone)]
struct FleetGpu {
    node: NodeId,
    index: u32,
    model: GpuModel,
    inventory: Option<GpuStatus>,
    /// The layout asked for, until the inventory shows it.
    target: Option<Layout>,
    /// Whether `target` still has to be sent (a reconfiguration was under way).
    unsent: bool,
    /// When this driver last asked for a layout, ms since the epoch.
    asked_ms: Option<u64>,
}

/// What a [`ClusterFleet`] did, for tests and the harness.
#[derive(Debug, Clone, Default)]
pub struct FleetReport {
    /// Each task: when it was submitted, launched (requeued onto its slice) and seen running,
    /// ms of the driver's clock.
    pub times: BTreeMap<TaskId, (u64, Option<u64>, Option<u64>)>,
    /// Each launch: the task, the fleet GPU and the slice.
    pub launches: Vec<(TaskId, usize, Placement)>,
    /// Layouts asked for: the fleet GPU and the layout.
    pub reconfigurations: Vec<(usize, String)>,
    /// GPUs failed closed, with why.
    pub failed: BTreeMap<usize, String>,
    /// Orders the cluster refused, and why.
    pub refused: Vec<String>,
}

/// The partitioning policy on a cluster (see the module doc); another slice policy
/// ([`Placer`]: HAMi-style first-fit, a static layout) drives it the same way with
/// [`ClusterFleet::with_policy`], as the harness compares them.
#[derive(Debug)]
pub struct ClusterFleet<C: ClusterApi, P: Placer = Partitioner> {
    api: C,
    gpus: Vec<FleetGpu>,
    policy: P,
    /// Each queued task's resources without its MIG ask, to launch it with.
    base: BTreeMap<TaskId, ResourceSet>,
    /// Slices launched and not yet ended, by policy member: their GPU and slice.
    launched: BTreeMap<TaskId, (usize, Placement)>,
    /// The task of each policy member standing for one slice of a task asking for several.
    owner: BTreeMap<TaskId, TaskId>,
    /// The last member id handed out (above [`MEMBER_IDS`]).
    next_member: u64,
    started: Instant,
    report: FleetReport,
}

impl<C: ClusterApi> ClusterFleet<C> {
    /// The MIG GPUs of the cluster's live nodes now (in MIG mode, of a model escher knows), in
    /// node then index order, driven by the [`Partitioner`]; the driver keeps no other state,
    /// so a new one adopts whatever the GPUs hold.
    pub async fn new(api: C) -> Result<ClusterFleet<C>, EslError> {
        ClusterFleet::with_policy(api, Partitioner::new()).await
    }
}

impl<C: ClusterApi, P: Placer> ClusterFleet<C, P> {
    /// [`ClusterFleet::new`] with another slice policy.
    pub async fn with_policy(api: C, policy: P) -> Result<ClusterFleet<C, P>, EslError> {
        let mut gpus = Vec::new();
        for node in api.gpus().await? {
            if !node.alive {
                continue;
            }
            for g in node.gpus {
                if let (true, Some(model)) = (g.info.mig_enabled, g.info.model) {
                    gpus.push(FleetGpu {
                        node: node.node,
                        index: g.info.index,
                        model,
                        inventory: Some(g),
                        target: None,
                        unsent: false,
                        asked_ms: None,
                    });
                }
            }
        }
        if gpus.is_empty() {
            return Err(EslError::Refused(
                "no live node has a GPU in MIG mode of a known model: nothing to partition".into(),
            ));
        }
        Ok(ClusterFleet {
            api,
            gpus,
            policy,
            base: BTreeMap::new(),
            launched: BTreeMap::new(),
            owner: BTreeMap::new(),
            next_member: 0,
            started: Instant::now(),
            report: FleetReport::default(),
        })
    }

    /// The fleet's GPUs: node and index, in the order the policy numbers them.
    pub fn gpus(&self) -> Vec<(NodeId, u32)> {
        self.gpus.iter().map(|g| (g.node, g.index)).collect()
    }

    /// Milliseconds since the driver began.
    pub fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// What the driver did so far.
    pub fn report(&self) -> &FleetReport {
        &self.report
    }

    /// The requests waiting, with why, as a user reads them.
    pub fn pending(&self) -> Vec<(Vec<TaskId>, String)> {
        self.policy
            .waiting()
            .into_iter()
            .map(|(request, reason)| {
                let mut tasks: Vec<TaskId> =
                    request.members.iter().map(|m| self.task_of(m.0)).collect();
                tasks.dedup();
                (tasks, reason)
            })
            .collect()
    }

    /// Submits a task asking for MIG slices (`mig.<profile>=1` among its resources): it
    /// waits until the policy has a slice for it, then runs on that slice with the rest of its
    /// resources. A task asking for several slices gets them all on one parent GPU. Refused
    /// with the reason (nothing submitted) if it asks for no slice, a part of one, more than
    /// one GPU can hold together, or a profile no GPU of the fleet has.
    pub async fn submit(&mut self, spec: TaskSpec) -> Result<TaskId, FleetError> {
        let ids = self.submit_all(vec![spec], false).await?;
        Ok(ids[0])
    }

    /// Submits tasks that each ask for one slice, all on one parent GPU (a gang): refused as a
    /// whole, nothing submitted, if no one GPU of the fleet can hold them.
    pub async fn submit_gang(&mut self, specs: Vec<TaskSpec>) -> Result<Vec<TaskId>, FleetError> {
        self.submit_all(specs, true).await
    }

    /// Queues a task submitted by an earlier driver and not launched (it waits on
    /// [`QUEUE_RESOURCE`]), given the resources it asks for, its MIG slice among them.
    pub fn adopt(&mut self, task: TaskId, resources: &ResourceSet) -> Result<(), FleetError> {
        if self.base.contains_key(&task) {
            return Err(FleetError::Spec(format!("task {task} is already pending")));
        }
        let (base, profiles) = self.split(resources)?;
        let members = self.members(task, profiles.len());
        let request = Request {
            one_gpu: members.len() > 1,
            members: members.iter().copied().zip(profiles).collect(),
        };
        let views = self.views();
        let now = self.now();
        if let Err(e) = self.policy.submit(&views, request, now) {
            self.owner.retain(|m, _| !members.contains(m));
            return Err(e.into());
        }
        self.base.insert(task, base);
        self.report.times.insert(task, (now, None, None));
        Ok(())
    }

    /// The policy members standing for `task`'s `slices` slices: the task itself for one, new
    /// member ids (each owned by the task) for several.
    fn members(&mut self, task: TaskId, slices: usize) -> Vec<TaskId> {
        if slices == 1 {
            return vec![task];
        }
        (0..slices)
            .map(|_| {
                self.next_member += 1;
                let m = TaskId(MEMBER_IDS + self.next_member);
                self.owner.insert(m, task);
                m
            })
            .collect()
    }

    /// The task a policy member stands for.
    fn task_of(&self, member: TaskId) -> TaskId {
        self.owner.get(&member).copied().unwrap_or(member)
    }

    async fn submit_all(
        &mut self,
        specs: Vec<TaskSpec>,
        one_gpu: bool,
    ) -> Result<Vec<TaskId>, FleetError> {
        let mut parts = Vec::new();
        for spec in &specs {
            parts.push(self.split(&spec.resources)?);
        }
        if parts.len() > 1 && parts.iter().any(|(_, ps)| ps.len() > 1) {
            return Err(FleetError::Spec(
                "each task of a gang asks for one MIG slice (a task asking for several gets \
                 them on one GPU without a gang)"
                    .to_string(),
            ));
        }
        // A task asking for several slices gets them all on one parent GPU.
        let one_gpu = one_gpu || parts.iter().any(|(_, ps)| ps.len() > 1);
        let profiles: Vec<String> = parts.iter().flat_map(|(_, ps)| ps.clone()).collect();
        let request = |ids: &[TaskId]| Request {
            members: ids.iter().copied().zip(profiles.iter().cloned()).collect(),
            one_gpu,
        };
        // The policy's checks first, on placeholder ids: nothing reaches the cluster if it
        // would refuse.
        let views = self.views();
        let placeholders: Vec<TaskId> = (0..profiles.len() as u64)
            .map(|i| TaskId(u64::MAX - i))
            .collect();
        Partitioner::new().submit(&views, request(&placeholders), 0)?;
        let queued = queue_request()?;
        let specs = specs
            .into_iter()
            .map(|mut s| {
                s.resources = queued.clone();
                s.max_retries = 0;
                s
            })
            .collect();
        let ids = self.api.submit(specs).await?;
        let members = match ids.as_slice() {
            [task] => self.members(*task, profiles.len()),
            _ => ids.clone(),
        };
        let now = self.now();
        self.policy.submit(&views, request(&members), now)?;
        for (id, (base, _)) in ids.iter().zip(parts) {
            self.base.insert(*id, base);
            self.report.times.insert(*id, (now, None, None));
        }
        Ok(ids)
    }

    /// A spec's resources without its MIG ask, and the profiles asked, one entry per slice
    /// (`mig.1g.10gb=2` is two entries; `mig.1g.10gb=1` with `mig.2g.20gb=1` is two).
    fn split(&self, resources: &ResourceSet) -> Result<(ResourceSet, Vec<String>), FleetError> {
        let mut base = ResourceSet::new();
        let mut profiles = Vec::new();
        for (name, amount) in resources.iter() {
            let Some(profile) = name.as_str().strip_prefix("mig.") else {
                base.insert(name.clone(), amount);
                continue;
            };
            let whole = amount.raw() % Amount::ONE.raw() == 0;
            let count = amount.raw() / Amount::ONE.raw();
            if !whole || count == 0 || count > MAX_SLICES_PER_TASK {
                return Err(FleetError::Spec(format!(
                    "mig.{profile}={amount}: a task asks for whole slices, 1 to \
                     {MAX_SLICES_PER_TASK}"
                )));
            }
            for _ in 0..count {
                profiles.push(profile.to_string());
            }
        }
        if profiles.is_empty() {
            return Err(FleetError::Spec(
                "a task for the partitioner asks for at least one MIG slice \
                 (mig.<profile>=1, e.g. mig.2g.20gb=1, or =N for N slices on one GPU); these \
                 resources ask for none"
                    .to_string(),
            ));
        }
        Ok((base, profiles))
    }

    /// The GPUs as the policy sees them now.
    fn views(&self) -> Vec<GpuView> {
        self.gpus
            .iter()
            .enumerate()
            .map(|(g, fg)| self.view(g, fg))
            .collect()
    }

    fn view(&self, g: usize, fg: &FleetGpu) -> GpuView {
        let Some(inv) = &fg.inventory else {
            return GpuView {
                instances: Vec::new(),
                layout: Layout::new(fg.model),
            };
        };
        let shown: Vec<(Placement, &str)> = inv
            .info
            .slices
            .iter()
            .filter_map(|s| {
                Some((
                    Placement::new(fg.model.profile(&s.profile)?, s.start),
                    s.uuid.as_str(),
                ))
            })
            .collect();
        let placements: Vec<Placement> = match &fg.target {
            Some(t) => t.placements().to_vec(),
            None => shown.iter().map(|(p, _)| *p).collect(),
        };
        let instances = placements
            .iter()
            .map(|p| {
                let uuid = shown.iter().find(|(q, _)| q == p).map(|(_, u)| *u);
                let holder = uuid.and_then(|u| inv.holders.iter().find(|h| h.uuid == u));
                let ours = self
                    .launched
                    .iter()
                    .find(|(_, (lg, on))| *lg == g && on == p);
                let state = match (uuid, holder, ours) {
                    (None, _, _) => InstanceState::Creating {
                        ready_at: fg.asked_ms.unwrap_or(0) + 6_000,
                    },
                    (Some(_), Some(h), _) => InstanceState::Busy(h.task),
                    (Some(_), None, Some((task, _))) => InstanceState::Busy(*task),
                    (Some(_), None, None) => InstanceState::Idle,
                };
                Instance {
                    placement: *p,
                    state,
                }
            })
            .collect();
        let layout =
            Layout::from_placements(fg.model, placements).unwrap_or_else(|_| Layout::new(fg.model));
        GpuView { instances, layout }
    }

    fn fail(&mut self, g: usize, why: String) {
        tracing::warn!(gpu = g, reason = %why, "a GPU fails closed");
        self.gpus[g].target = None;
        self.gpus[g].unsent = false;
        self.report.failed.insert(g, why.clone());
        self.policy.failed(g, why);
    }

    /// One round: reads the GPUs and the launched tasks, runs the policy, carries out its
    /// orders (see the module doc).
    pub async fn round(&mut self) -> Result<(), EslError> {
        let nodes = self.api.gpus().await?;
        for g in 0..self.gpus.len() {
            if self.report.failed.contains_key(&g) {
                continue;
            }
            let fg = &self.gpus[g];
            let status = nodes
                .iter()
                .find(|n| n.node == fg.node && n.alive)
                .and_then(|n| n.gpus.iter().find(|s| s.info.index == fg.index))
                .cloned();
            let Some(status) = status else {
                let why = format!(
                    "GPU {} of node {} is no longer reported (its node is lost)",
                    fg.index, fg.node
                );
                self.gpus[g].inventory = None;
                self.fail(g, why);
                continue;
            };
            let failure = match (fg.asked_ms, &status.last_reconfiguration) {
                (Some(asked), Some(r)) if r.done_ms >= asked => r.error.clone(),
                _ => None,
            };
            self.gpus[g].inventory = Some(status);
            if let Some(error) = failure {
                self.fail(g, format!("its reconfiguration failed: {error}"));
                continue;
            }
            let shown = self.shown_layout(g);
            let fg = &mut self.gpus[g];
            if fg.target.is_some() && fg.target == shown {
                fg.target = None;
            }
            if fg.unsent {
                self.send(g).await;
            }
        }
        self.read_launched().await?;
        let views = self.views();
        let orders = self.policy.round(&views);
        let mut changed = BTreeSet::new();
        let mut launches: BTreeMap<TaskId, Vec<(TaskId, usize, Placement)>> = BTreeMap::new();
        for (g, command) in orders {
            match command {
                Command::Create(p) => {
                    let mut ps = next_placements(&self.gpus[g], &views[g], changed.contains(&g));
                    ps.push(p);
                    match Layout::from_placements(self.gpus[g].model, ps) {
                        Ok(l) => {
                            self.gpus[g].target = Some(l);
                            changed.insert(g);
                        }
                        Err(e) => self.report.refused.push(format!("create {p}: {e}")),
                    }
                }
                Command::Destroy(p) => {
                    let ps: Vec<Placement> =
                        next_placements(&self.gpus[g], &views[g], changed.contains(&g))
                            .into_iter()
                            .filter(|q| *q != p)
                            .collect();
                    match Layout::from_placements(self.gpus[g].model, ps) {
                        Ok(l) => {
                            self.gpus[g].target = Some(l);
                            changed.insert(g);
                        }
                        Err(e) => self.report.refused.push(format!("destroy {p}: {e}")),
                    }
                }
                Command::Launch { task, on } => launches
                    .entry(self.task_of(task))
                    .or_default()
                    .push((task, g, on)),
                other => self
                    .report
                    .refused
                    .push(format!("{other}: not an order of the partitioner")),
            }
        }
        for (task, slices) in launches {
            self.launch(task, slices).await;
        }
        for g in changed {
            self.send(g).await;
        }
        Ok(())
    }

    /// The layout the inventory of fleet GPU `g` shows.
    fn shown_layout(&self, g: usize) -> Option<Layout> {
        let fg = &self.gpus[g];
        let inv = fg.inventory.as_ref()?;
        let ps: Option<Vec<Placement>> = inv
            .info
            .slices
            .iter()
            .map(|s| Some(Placement::new(fg.model.profile(&s.profile)?, s.start)))
            .collect();
        Layout::from_placements(fg.model, ps?).ok()
    }

    /// Sends fleet GPU `g`'s layout asked for, or leaves it for a later round while a
    /// reconfiguration is under way; a refusal that will not pass later fails the GPU closed.
    async fn send(&mut self, g: usize) {
        let fg = &self.gpus[g];
        let Some(target) = &fg.target else {
            self.gpus[g].unsent = false;
            return;
        };
        if fg
            .inventory
            .as_ref()
            .is_some_and(|i| i.reconfiguring.is_some())
        {
            self.gpus[g].unsent = true;
            return;
        }
        let text = target.to_string();
        let asked = epoch_ms();
        match self
            .api
            .apply_mig_layout(fg.node, fg.index, text.clone(), false)
            .await
        {
            Ok(_) => {
                let fg = &mut self.gpus[g];
                fg.unsent = false;
                fg.asked_ms = Some(asked);
                self.report.reconfigurations.push((g, text));
            }
            Err(e) if e.is_retryable() => {
                tracing::debug!(layout = %text, error = %e, "MIG layout not taken yet; asking again");
                self.gpus[g].unsent = true;
            }
            Err(e) => self.fail(g, format!("the head refused layout {text}: {e}")),
        }
    }

    /// Runs `task` on its slices: `(member, fleet GPU, slice)`, all in one requeue.
    async fn launch(&mut self, task: TaskId, slices: Vec<(TaskId, usize, Placement)>) {
        let mut set = self.base.get(&task).cloned().unwrap_or_default();
        let mut outcome = Ok(());
        for (_, g, on) in &slices {
            let uuid = self.gpus[*g].inventory.as_ref().and_then(|i| {
                i.info
                    .slices
                    .iter()
                    .find(|s| s.start == on.start && s.profile == on.profile.name)
                    .map(|s| s.uuid.clone())
            });
            let added = uuid
                .ok_or_else(|| format!("slice {on} is not in the GPU's inventory"))
                .and_then(|u| {
                    let class = mig_class(on.profile.name).ok_or("the profile cannot be named")?;
                    let id = mig_identity(&u).ok_or_else(|| format!("{u} cannot be named"))?;
                    let count = set
                        .get(class.as_str())
                        .checked_add(Amount::ONE)
                        .map_err(|e| e.to_string())?;
                    set.insert(class, count);
                    set.insert(id, Amount::ONE);
                    Ok::<_, String>(())
                });
            if added.is_err() {
                outcome = added;
                break;
            }
        }
        let outcome = match outcome {
            Ok(()) => self.api.requeue(task, set).await.map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        match outcome {
            Ok(_) => {
                let now = self.now();
                for (member, g, on) in slices {
                    self.launched.insert(member, (g, on));
                    self.report.launches.push((task, g, on));
                }
                self.base.remove(&task);
                if let Some(t) = self.report.times.get_mut(&task) {
                    t.1 = Some(now);
                }
            }
            Err(e) => self.report.refused.push(format!(
                "launch of {task} on {} slice(s): {e}",
                slices.len()
            )),
        }
    }

    /// Reads the launched tasks: running ones are noted, ended ones free their slices.
    async fn read_launched(&mut self) -> Result<(), EslError> {
        let mut tasks: Vec<TaskId> = self.launched.keys().map(|m| self.task_of(*m)).collect();
        tasks.sort();
        tasks.dedup();
        for task in tasks {
            let status = self.api.status(task).await?;
            if status.state == TaskState::Pending {
                continue;
            }
            let now = self.now();
            if let Some(t) = self.report.times.get_mut(&task) {
                t.2.get_or_insert(now);
            }
            if status.state != TaskState::Running {
                let members: Vec<TaskId> = self
                    .launched
                    .keys()
                    .copied()
                    .filter(|m| self.task_of(*m) == task)
                    .collect();
                for m in members {
                    self.launched.remove(&m);
                    self.owner.remove(&m);
                }
            }
        }
        Ok(())
    }

    /// Whether requests wait while nothing is launched and not ended and nothing is being
    /// made: nothing in flight will free or make a slice for them (a static layout's policy
    /// with no slice of their profile, for one); the policy may still reshape at its next round.
    pub fn only_waiting(&self) -> bool {
        !self.policy.waiting().is_empty()
            && self.launched.is_empty()
            && self.gpus.iter().all(|g| g.target.is_none())
    }

    /// Whether anything is queued, launched and not ended, or being made.
    pub fn busy(&self) -> bool {
        !self.policy.waiting().is_empty()
            || !self.launched.is_empty()
            || self.gpus.iter().any(|g| g.target.is_some())
    }

    /// Rounds every [`ROUND`] until nothing is queued, launched or being made, or for at most
    /// `limit`; whether it got there.
    pub async fn run(&mut self, limit: Duration) -> Result<bool, EslError> {
        let began = Instant::now();
        loop {
            self.round().await?;
            if !self.busy() {
                return Ok(true);
            }
            if began.elapsed() >= limit {
                return Ok(false);
            }
            tokio::time::sleep(ROUND).await;
        }
    }
}

/// The most slices one task may ask for (a GPU holds at most seven).
pub const MAX_SLICES_PER_TASK: u64 = 7;

/// Policy member ids above this stand for one slice of a task asking for several; task ids
/// the head hands out stay far below it.
const MEMBER_IDS: u64 = 1 << 62;

/// How long [`ClusterFleet::run`] waits between rounds.
pub const ROUND: Duration = Duration::from_millis(25);

/// What a GPU will hold once its changes are done: the layout this round already changed, or
/// the view's.
fn next_placements(fg: &FleetGpu, view: &GpuView, changed: bool) -> Vec<Placement> {
    match (&fg.target, changed) {
        (Some(t), true) => t.placements().to_vec(),
        _ => view.layout.placements().to_vec(),
    }
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What a task waits on while queued.
fn queue_request() -> Result<ResourceSet, EslError> {
    let mut set = ResourceSet::new();
    set.insert(ResourceName::new(QUEUE_RESOURCE)?, Amount::ONE);
    Ok(set)
}
