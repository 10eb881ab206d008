//! Slices made on demand: a partitioning policy that serves tasks pending on MIG profiles no
//! slice offers by reshaping idle GPUs, with no layout planned by hand ("allocate first,
//! partition after", as Kubernetes' partitionable devices and HAMi do it).
//!
//! [`Partitioner`] is a policy over a fleet of GPUs (each seen through its [`GpuView`], each
//! changed through the same [`Command`]s as every policy of this crate: destroy an idle
//! instance, create one, launch a task on an idle one). Each [`Partitioner::round`]:
//!
//! 1. launches every request whose slices, made for it, are ready;
//! 2. in the order requests came (so none starves behind a later one), gives a request **idle
//!    slices that already exist** of its profiles, reused before anything is reconfigured, all
//!    on one parent GPU when the request asks for that (a gang);
//! 3. otherwise reshapes **one** GPU for it: the GPU and the layout that destroy the fewest idle
//!    slices (idle slices are reclaimed only when a request needs their room; busy, draining and
//!    creating ones are never touched), ties broken by MIGM's future-configuration reachability
//!    ([`reachability`]: the layout that keeps the most maximal layouts, so the most future
//!    requests, placeable), each new slice at MIGM's best start ([`best_start`]); the slices it
//!    creates are reserved for that request. A GPU with a reconfiguration in flight (an
//!    instance being created) is not reshaped again until it is done.
//!
//! **Adoption.** The policy keeps no layout of its own: every round reads the GPUs' views, so a
//! policy started after a restart adopts the slices that exist as they are (busy ones left to
//! their tasks, idle ones reused, ones being created waited for).
//!
//! **Failing closed.** [`Partitioner::failed`] reports an error from a GPU's driver (NVML) at
//! any phase of a reconfiguration (destroy, create, the instance coming up): the GPU is marked,
//! its reservations dropped (their requests wait again, first in line, for another GPU), and
//! nothing is placed on any of its slices again, since their state is unknown.
//!
//! **Bad input** is refused at [`Partitioner::submit`] with a clear reason and nothing changed:
//! a profile no GPU model of the fleet has, or a gang that no one GPU can hold.
//!
//! [`fleet`] drives the policy on simulated GPUs ([`SimGpu`](crate::SimGpu)) with injectable
//! driver errors and a history of who held which slice; [`first_fit`] and [`static_layout`]
//! are the baselines it is measured against (HAMi-style first-fit creation, and a layout fixed
//! in advance).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

use escher_proto::mig::{GpuModel, Layout, Placement, Profile, best_start, reachability};
use escher_proto::types::TaskId;
use thiserror::Error;

use crate::{Command, GpuView, InstanceState};

pub mod cluster;
pub mod fleet;
#[cfg(test)]
mod tests;

/// A request for MIG slices: one slice per member task, each of a profile named as NVIDIA
/// prints it (`2g.20gb`), or as escher's resource (`mig.2g.20gb`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Each member task and the profile it asks for.
    pub members: Vec<(TaskId, String)>,
    /// Whether every member's slice must be on one parent GPU (a gang).
    pub one_gpu: bool,
}

impl Request {
    /// One task asking for one slice.
    pub fn single(task: TaskId, profile: &str) -> Request {
        Request {
            members: vec![(task, profile.to_string())],
            one_gpu: false,
        }
    }

    /// A gang: every member's slice on one parent GPU.
    pub fn gang(members: &[(TaskId, &str)]) -> Request {
        Request {
            members: members.iter().map(|(t, p)| (*t, p.to_string())).collect(),
            one_gpu: true,
        }
    }
}

/// Why a request was refused at submit. Nothing was queued.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SubmitError {
    /// No GPU model of the fleet has the profile.
    #[error("profile {profile} exists on none of the fleet's GPU models ({models})")]
    UnknownProfile {
        /// The profile as asked.
        profile: String,
        /// The fleet's models.
        models: String,
    },
    /// No one GPU of the fleet can hold every slice of the gang.
    #[error("no GPU of the fleet can hold {wanted} together ({models})")]
    TooManyForOneGpu {
        /// The profiles asked together.
        wanted: String,
        /// The fleet's models.
        models: String,
    },
    /// The request asks for nothing, or names a task twice, or a task already pending.
    #[error("bad request: {0}")]
    Bad(String),
}

/// A pending request and what the policy last said about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    /// The request.
    pub request: Request,
    /// When it was submitted, ms.
    pub since_ms: u64,
    /// Why it is still waiting (the last round's reason), as a user would read it.
    pub reason: String,
}

/// One GPU index and a command for it.
pub type Order = (usize, Command);

/// The partitioning policy (see the module doc).
#[derive(Debug, Clone, Default)]
pub struct Partitioner {
    pending: VecDeque<Pending>,
    /// Slices being made for a task: `(gpu, start)` to the task and its placement.
    reserved: BTreeMap<(usize, u8), (TaskId, Placement)>,
    /// GPUs failed closed, with the driver's error.
    failed: BTreeMap<usize, String>,
    /// The views of the last round that ordered nothing, and whether a submit or a failure
    /// came since: a round over the same views with nothing new orders nothing again.
    last: Option<Vec<GpuView>>,
}

/// Strips escher's `mig.` prefix and turns its `.me` back into `+me`.
fn profile_name(asked: &str) -> String {
    let name = asked.strip_prefix("mig.").unwrap_or(asked);
    match name.strip_suffix(".me") {
        Some(base) => format!("{base}+me"),
        None => name.to_string(),
    }
}

/// The profile `asked` on `model`, if it has it.
fn profile_on(model: GpuModel, asked: &str) -> Option<&'static Profile> {
    model.profile(&profile_name(asked))
}

/// Places every one of `profiles` into `layout` (largest first, each at MIGM's best start);
/// the placements, or `None` if one does not fit.
fn place_all(layout: &mut Layout, profiles: &[&'static Profile]) -> Option<Vec<Placement>> {
    let mut order: Vec<usize> = (0..profiles.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse((profiles[i].memory_slices, profiles[i].compute)));
    let mut out = vec![None; profiles.len()];
    for i in order {
        let start = best_start(layout, profiles[i])?;
        let p = Placement::new(profiles[i], start);
        layout.insert(p).ok()?;
        out[i] = Some(p);
    }
    out.into_iter().collect()
}

/// A reshaping found for a request on one GPU.
#[derive(Debug, Clone)]
struct Reshape {
    gpu: usize,
    destroy: Vec<Placement>,
    create: Vec<Placement>,
    reachability: usize,
}

impl Partitioner {
    /// A policy with nothing pending: after a restart, it adopts whatever the GPUs hold.
    pub fn new() -> Partitioner {
        Partitioner::default()
    }

    /// Queues `request` at `now_ms`, or refuses it (nothing queued) if no GPU of the fleet
    /// (`gpus`, failed ones included: a model the fleet has) could ever serve it.
    pub fn submit(
        &mut self,
        gpus: &[GpuView],
        request: Request,
        now_ms: u64,
    ) -> Result<(), SubmitError> {
        let mut models: Vec<GpuModel> = gpus.iter().map(GpuView::model).collect();
        models.sort();
        models.dedup();
        let names = models
            .iter()
            .map(|m| m.name())
            .collect::<Vec<_>>()
            .join(", ");
        if request.members.is_empty() {
            return Err(SubmitError::Bad("it asks for no slice".into()));
        }
        let mut tasks = BTreeSet::new();
        for (t, _) in &request.members {
            let pending = self
                .pending
                .iter()
                .any(|p| p.request.members.iter().any(|(o, _)| o == t));
            if !tasks.insert(*t) || pending {
                return Err(SubmitError::Bad(format!(
                    "task {t} is named twice or already pending"
                )));
            }
        }
        for (_, asked) in &request.members {
            if !models.iter().any(|&m| profile_on(m, asked).is_some()) {
                return Err(SubmitError::UnknownProfile {
                    profile: asked.clone(),
                    models: names,
                });
            }
        }
        if request.one_gpu && request.members.len() > 1 {
            let fits = models.iter().any(|&m| {
                let profiles: Option<Vec<_>> = request
                    .members
                    .iter()
                    .map(|(_, a)| profile_on(m, a))
                    .collect();
                profiles.is_some_and(|p| place_all(&mut Layout::new(m), &p).is_some())
            });
            if !fits {
                return Err(SubmitError::TooManyForOneGpu {
                    wanted: request
                        .members
                        .iter()
                        .map(|(_, a)| a.as_str())
                        .collect::<Vec<_>>()
                        .join(" + "),
                    models: names,
                });
            }
        }
        self.pending.push_back(Pending {
            request,
            since_ms: now_ms,
            reason: "submitted".into(),
        });
        self.last = None;
        Ok(())
    }

    /// The requests waiting, first in line first, with why.
    pub fn pending(&self) -> impl Iterator<Item = &Pending> {
        self.pending.iter()
    }

    /// The GPUs failed closed, with the driver's error.
    pub fn failed_gpus(&self) -> &BTreeMap<usize, String> {
        &self.failed
    }

    /// A driver error on `gpu` (at any phase of a reconfiguration, or a command refused in a
    /// way that leaves its state unknown): the GPU fails closed (see the module doc).
    pub fn failed(&mut self, gpu: usize, error: impl fmt::Display) {
        self.failed.insert(gpu, error.to_string());
        self.reserved.retain(|(g, _), _| *g != gpu);
        self.last = None;
    }

    /// One round over the fleet now (`gpus[i]` is GPU `i`): the commands to carry out, in
    /// order, each for its GPU (see the module doc).
    pub fn round(&mut self, gpus: &[GpuView]) -> Vec<Order> {
        if self.last.as_deref() == Some(gpus) {
            return Vec::new();
        }
        let mut out = Vec::new();
        // Slices handed out this round (so no two requests get one), and GPUs reshaped.
        let mut taken: BTreeSet<(usize, u8)> = BTreeSet::new();
        let mut reshaping: BTreeSet<usize> = BTreeSet::new();
        // Reservations whose slice vanished (destroyed by someone else) are void.
        self.reserved.retain(|(g, s), (_, p)| {
            gpus.get(*g)
                .and_then(|v| v.at(*s))
                .is_some_and(|i| i.placement == *p)
        });
        let mut still = VecDeque::new();
        while let Some(mut pending) = self.pending.pop_front() {
            match self.serve(gpus, &pending.request, &mut taken, &mut reshaping) {
                Served::Launch(orders) => {
                    for (_, (t, _)) in &orders {
                        self.reserved.retain(|_, (r, _)| r != t);
                    }
                    out.extend(
                        orders
                            .into_iter()
                            .map(|(g, (task, on))| (g, Command::Launch { task, on })),
                    );
                }
                Served::Reshape(r, orders) => {
                    pending.reason = format!(
                        "GPU {} is being reshaped for it (destroy {}, create {})",
                        r.gpu,
                        list(&r.destroy),
                        list(&r.create)
                    );
                    out.extend(orders);
                    still.push_back(pending);
                }
                Served::Wait(reason) => {
                    pending.reason = reason;
                    still.push_back(pending);
                }
            }
        }
        self.pending = still;
        self.last = out.is_empty().then(|| gpus.to_vec());
        out
    }

    /// What to do for `request` this round.
    fn serve(
        &mut self,
        gpus: &[GpuView],
        request: &Request,
        taken: &mut BTreeSet<(usize, u8)>,
        reshaping: &mut BTreeSet<usize>,
    ) -> Served {
        let tasks: Vec<TaskId> = request.members.iter().map(|(t, _)| *t).collect();
        // 1. Slices made for it.
        let mine: Vec<((usize, u8), (TaskId, Placement))> = self
            .reserved
            .iter()
            .filter(|(_, (t, _))| tasks.contains(t))
            .map(|(k, v)| (*k, *v))
            .collect();
        if !mine.is_empty() && mine.len() < tasks.len() {
            // Part of what was made for it is gone: what is left is free again.
            self.reserved.retain(|_, (t, _)| !tasks.contains(t));
        } else if !mine.is_empty() {
            let state = |(g, s): (usize, u8)| gpus[g].at(s).map(|i| i.state);
            if mine
                .iter()
                .all(|(k, _)| state(*k) == Some(InstanceState::Idle))
                && mine.len() == tasks.len()
            {
                for (k, _) in &mine {
                    taken.insert(*k);
                }
                return Served::Launch(mine.iter().map(|((g, _), v)| (*g, *v)).collect());
            }
            for ((g, _), _) in &mine {
                reshaping.insert(*g);
            }
            return Served::Wait(format!(
                "its slices are being created on GPU {}",
                mine[0].0.0
            ));
        }
        let usable = |g: usize| !self.failed.contains_key(&g);
        // 2. Idle slices that exist, not reserved, not taken this round.
        let free = |g: usize, s: u8| {
            !taken.contains(&(g, s)) && !self.reserved.contains_key(&(g, s)) && usable(g)
        };
        let idle_match = |g: usize, asked: &str, exclude: &BTreeSet<u8>| -> Option<Placement> {
            let view = &gpus[g];
            let profile = profile_on(view.model(), asked)?;
            view.idle()
                .filter(|p| p.profile == profile && free(g, p.start) && !exclude.contains(&p.start))
                .min_by_key(|p| p.start)
        };
        let groups: Vec<Vec<usize>> = if request.one_gpu {
            (0..gpus.len()).map(|g| vec![g]).collect()
        } else {
            vec![(0..gpus.len()).collect()]
        };
        for group in &groups {
            let mut picked: Vec<(usize, (TaskId, Placement))> = Vec::new();
            let mut used: BTreeMap<usize, BTreeSet<u8>> = BTreeMap::new();
            for (t, asked) in &request.members {
                let found = group.iter().find_map(|&g| {
                    idle_match(g, asked, used.get(&g).unwrap_or(&BTreeSet::new())).map(|p| (g, p))
                });
                match found {
                    Some((g, p)) => {
                        used.entry(g).or_default().insert(p.start);
                        picked.push((g, (*t, p)));
                    }
                    None => break,
                }
            }
            if picked.len() == request.members.len() {
                for (g, (_, p)) in &picked {
                    taken.insert((*g, p.start));
                }
                return Served::Launch(picked);
            }
        }
        // 3. Reshape one GPU (for a request of several slices without `one_gpu`, still one
        // GPU: the simplest layout change that serves it).
        let mut best: Option<Reshape> = None;
        for (g, view) in gpus.iter().enumerate() {
            if !usable(g) || reshaping.contains(&g) || in_flight(view) {
                continue;
            }
            let profiles: Option<Vec<&'static Profile>> = request
                .members
                .iter()
                .map(|(_, a)| profile_on(view.model(), a))
                .collect();
            let Some(profiles) = profiles else { continue };
            if let Some(r) = reshape_for(g, view, &profiles, |s| free(g, s))
                && best.as_ref().is_none_or(|b| {
                    (r.destroy.len(), std::cmp::Reverse(r.reachability))
                        < (b.destroy.len(), std::cmp::Reverse(b.reachability))
                })
            {
                best = Some(r);
            }
        }
        let Some(r) = best else {
            let why = if gpus.iter().enumerate().all(|(g, _)| !usable(g)) {
                "every GPU has failed closed".to_string()
            } else {
                format!(
                    "no GPU can make {} now: the others are busy, failed or being reshaped",
                    request
                        .members
                        .iter()
                        .map(|(_, a)| a.as_str())
                        .collect::<Vec<_>>()
                        .join(" + ")
                )
            };
            return Served::Wait(why);
        };
        reshaping.insert(r.gpu);
        // What it destroys is no one's to reuse this round.
        for p in &r.destroy {
            taken.insert((r.gpu, p.start));
        }
        let mut orders: Vec<Order> = r
            .destroy
            .iter()
            .map(|p| (r.gpu, Command::Destroy(*p)))
            .collect();
        let mut creates = r.create.clone();
        // Members take the created slices in the order of their profiles.
        for (t, asked) in &request.members {
            let profile = profile_on(gpus[r.gpu].model(), asked).expect("checked above");
            let i = creates
                .iter()
                .position(|p| p.profile == profile)
                .expect("one created per member");
            let p = creates.remove(i);
            self.reserved.insert((r.gpu, p.start), (*t, p));
            orders.push((r.gpu, Command::Create(p)));
        }
        Served::Reshape(r, orders)
    }
}

/// What a round does for one request.
enum Served {
    /// Launch each member on its GPU's slice.
    Launch(Vec<(usize, (TaskId, Placement))>),
    /// A GPU is being reshaped for it: these commands.
    Reshape(Reshape, Vec<Order>),
    /// It waits, for this reason.
    Wait(String),
}

/// Whether a GPU has a reconfiguration in flight (an instance being created).
fn in_flight(view: &GpuView) -> bool {
    view.instances
        .iter()
        .any(|i| matches!(i.state, InstanceState::Creating { .. }))
}

fn list(ps: &[Placement]) -> String {
    if ps.is_empty() {
        return "nothing".into();
    }
    ps.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The cheapest reshaping of GPU `g` that makes `profiles`: the fewest idle slices destroyed
/// (only those `free` allows, and only those whose room is needed), then the most reachable
/// layout.
fn reshape_for(
    g: usize,
    view: &GpuView,
    profiles: &[&'static Profile],
    free: impl Fn(u8) -> bool,
) -> Option<Reshape> {
    let idle: Vec<Placement> = view.idle().filter(|p| free(p.start)).collect();
    let mut best: Option<Reshape> = None;
    // Every subset of the idle slices, fewest first (at most 7 slices: 128 subsets).
    let mut subsets: Vec<u32> = (0..(1u32 << idle.len())).collect();
    subsets.sort_by_key(|m| m.count_ones());
    for mask in subsets {
        if best
            .as_ref()
            .is_some_and(|b| b.destroy.len() < mask.count_ones() as usize)
        {
            break;
        }
        let destroy: Vec<Placement> = idle
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, p)| *p)
            .collect();
        let mut layout = view.layout.clone();
        for p in &destroy {
            layout.remove(p.start);
        }
        let Some(create) = place_all(&mut layout, profiles) else {
            continue;
        };
        let r = reachability(&layout);
        if best.as_ref().is_none_or(|b| r > b.reachability) {
            best = Some(Reshape {
                gpu: g,
                destroy,
                create,
                reachability: r,
            });
        }
    }
    best
}

/// HAMi-style first-fit, the baseline (ours, after HAMi's description: MIG instances created
/// and reused on demand, without a layout plan): a request takes idle slices of its profiles
/// if any exist (first GPU first); otherwise the first GPU, in index order, where its slices
/// fit at their lowest legal starts beside what is there; otherwise the first GPU whose every
/// instance is idle, emptied and given them. No reachability, no reclaiming of a partly busy
/// GPU's idle slices.
/// GPUs in `skip` (failed, or already being reshaped this round) are left alone.
pub fn first_fit(
    gpus: &[GpuView],
    request: &Request,
    taken: &BTreeSet<(usize, u8)>,
    skip: &BTreeSet<usize>,
) -> FirstFit {
    let groups: Vec<Vec<usize>> = if request.one_gpu {
        (0..gpus.len()).map(|g| vec![g]).collect()
    } else {
        vec![(0..gpus.len()).collect()]
    };
    for group in &groups {
        let mut picked = Vec::new();
        let mut used: BTreeSet<(usize, u8)> = taken.clone();
        for (t, asked) in &request.members {
            let found = group.iter().filter(|g| !skip.contains(g)).find_map(|&g| {
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
        if picked.len() == request.members.len() {
            return FirstFit::Reuse(picked);
        }
    }
    let lowest = |layout: &mut Layout, profiles: &[&'static Profile]| -> Option<Vec<Placement>> {
        profiles
            .iter()
            .map(|p| {
                let start = *layout.legal_starts(p).first()?;
                let pl = Placement::new(p, start);
                layout.insert(pl).ok()?;
                Some(pl)
            })
            .collect()
    };
    for pass in 0..2 {
        for (g, view) in gpus.iter().enumerate() {
            if in_flight(view) || skip.contains(&g) {
                continue;
            }
            let profiles: Option<Vec<_>> = request
                .members
                .iter()
                .map(|(_, a)| profile_on(view.model(), a))
                .collect();
            let Some(profiles) = profiles else { continue };
            let (mut layout, destroy) = if pass == 0 {
                (view.layout.clone(), Vec::new())
            } else if view
                .instances
                .iter()
                .all(|i| i.state == InstanceState::Idle)
                && view.idle().all(|p| !taken.contains(&(g, p.start)))
            {
                (Layout::new(view.model()), view.layout.placements().to_vec())
            } else {
                continue;
            };
            if let Some(create) = lowest(&mut layout, &profiles) {
                return FirstFit::Create {
                    gpu: g,
                    destroy,
                    create,
                };
            }
        }
    }
    FirstFit::Wait
}

/// What [`first_fit`] does for a request.
#[derive(Debug, Clone, PartialEq)]
pub enum FirstFit {
    /// Launch on these idle slices: `(gpu, task, slice)`.
    Reuse(Vec<(usize, TaskId, Placement)>),
    /// Destroy, then create, these on one GPU (members in order).
    Create {
        /// The GPU.
        gpu: usize,
        /// Slices destroyed first.
        destroy: Vec<Placement>,
        /// Slices created, one per member in order.
        create: Vec<Placement>,
    },
    /// Nothing now.
    Wait,
}

/// The static baseline's layout for `model`: a fixed mixed layout planned in advance (one 3g,
/// one 2g and two 1g slices, the usual "mixed" geometry), which requests wait on.
pub fn static_layout(model: GpuModel) -> Layout {
    let mut layout = Layout::new(model);
    for g in [3u8, 2, 1, 1] {
        if let Some(p) = model.profiles().iter().find(|p| p.base && p.compute == g)
            && let Some(start) = best_start(&layout, p)
        {
            let _ = layout.insert(Placement::new(p, start));
        }
    }
    layout
}
