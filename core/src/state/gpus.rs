//! GPUs at the head: each node's GPU inventory, which devices each task was given, and MIG
//! reconfiguration as a deterministic state change.
//!
//! The resource table's GPU part (`gpu`, `gpu.*`, `mig.*`; see
//! [`escher_proto::types::gpu_resources`]) is always recomputed from the node's recorded GPUs
//! minus the slices being rebuilt, and written as absolute capacities ([`sync`]), so a report
//! that arrives twice or late cannot skew it.
//!
//! ```text
//!  ApplyMigLayout ─ validate (model, layout, busy slices) ─▶ retire slices: their resources go
//!        │                                                   (held ones stay until released)
//!        └─▶ Effect::ReconfigureMig ─▶ worker waits for the slices to empty, rebuilds them
//!                                          │
//!  GpusChanged{done} ◀─────────────────────┘  record the new slices, add their resources
//! ```
//!
//! [`sync`]: ClusterState::sync_gpu_resources

use std::collections::{BTreeMap, BTreeSet};

use escher_proto::mig::{LatencyModel, Layout, Placement, diff};
use escher_proto::types::{
    Capacity, CapacityOp, DeviceHold, DeviceHolder, GpuInfo, GpuStatus, GpusReply, MigChange,
    MigDevice, MigDone, MigPlan, MigProgress, MigReport, NodeGpus, NodeId, NodeSpec, ResourceName,
    TaskId, TaskState, gpu_resources, is_gpu_resource,
};
use serde::{Deserialize, Serialize};

use super::apply::ClusterState;
use super::error::ApplyError;
use crate::scheduler::{Event, Millis};

/// A MIG reconfiguration the head has started and its worker has not reported done.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingMig {
    /// The layout being applied, explicit form.
    pub target: String,
    /// UUIDs of the slices being destroyed: their resources are gone from the table.
    pub retiring: BTreeSet<String>,
    /// When it was asked for.
    pub since: Millis,
}

impl ClusterState {
    /// A worker says which devices a task's attempt was given.
    pub(crate) fn task_devices(&mut self, task: TaskId, attempt: u32, devices: Vec<DeviceHold>) {
        if let Some(rec) = self.tasks.get_mut(&task)
            && rec.state == TaskState::Running
            && rec.attempt == attempt
        {
            rec.devices = Some(devices);
        }
    }

    /// A worker reports its GPUs as they are now, possibly ending a reconfiguration.
    pub(crate) fn gpus_changed(
        &mut self,
        node: NodeId,
        gpus: Vec<GpuInfo>,
        done: Option<MigDone>,
        now: Millis,
    ) -> Result<(), ApplyError> {
        let rec = self
            .nodes
            .get_mut(&node)
            .ok_or(ApplyError::UnknownNode(node))?;
        if !rec.alive || (rec.gpus.is_empty() && gpus.is_empty() && done.is_none()) {
            // A node that never had GPUs keeps its resources as registered.
            return Ok(());
        }
        if let Some(done) = done {
            let pending = rec.mig.remove(&done.gpu);
            match &done.error {
                Some(why) => rec.mig_errors.insert(done.gpu, why.clone()),
                None => rec.mig_errors.remove(&done.gpu),
            };
            let (target, asked_ms) = pending.map_or((String::new(), now), |p| (p.target, p.since));
            let report = MigReport {
                target,
                asked_ms,
                done_ms: now,
                phases: *done.phases,
                error: done.error,
            };
            rec.mig_reports.insert(done.gpu, report);
        }
        rec.gpus = gpus;
        self.sync_gpu_resources(node, now);
        Ok(())
    }

    /// Starts changing the MIG instances of GPU `gpu` of `node` as `change` says: to a whole
    /// layout, by one instance created or destroyed, or toward a layout as far as its idle
    /// instances allow (pre-initialization).
    ///
    /// Refused (nothing changes) when the node is not live or draining, has no such GPU, the
    /// GPU is not a MIG GPU in MIG mode, a reconfiguration of it is under way, the layout or
    /// instance is not legal for its model (or overlaps one, or is not there to destroy), or,
    /// without `drain`, a slice it destroys may be in use. Else the destroyed slices'
    /// resources leave the table at once (tasks holding them keep them until they end;
    /// nothing new is admitted), and the worker is told to reconfigure.
    pub(crate) fn change_mig(
        &mut self,
        node: NodeId,
        gpu: u32,
        change: &MigChange,
        drain: bool,
        now: Millis,
    ) -> Result<MigPlan, ApplyError> {
        let rec = self.nodes.get(&node).ok_or(ApplyError::UnknownNode(node))?;
        let state = match (rec.alive, rec.draining) {
            (false, _) => Some("not live"),
            (true, true) => Some("draining"),
            (true, false) => None,
        };
        if let Some(state) = state {
            return Err(ApplyError::NodeUnavailable { node, state });
        }
        let info = rec.gpus.iter().find(|g| g.index == gpu).ok_or_else(|| {
            let have: Vec<String> = rec.gpus.iter().map(|g| g.index.to_string()).collect();
            ApplyError::NoSuchGpu {
                node,
                gpu,
                have: if have.is_empty() {
                    "none".into()
                } else {
                    have.join(", ")
                },
            }
        })?;
        let not_partitionable = |why: &'static str| ApplyError::NotPartitionable {
            node,
            gpu,
            product: info.product.clone(),
            why,
        };
        let model = info
            .model
            .ok_or_else(|| not_partitionable("has no MIG profile table in escher"))?;
        if !info.mig_enabled && info.simulated {
            return Err(not_partitionable(
                "is a simulated GPU without MIG mode; start its worker with a MIG layout \
                 (escher-worker --sim-gpu MODEL:mig=PROFILE,...) to partition it",
            ));
        }
        if !info.mig_enabled {
            return Err(not_partitionable(
                "is not in MIG mode; enable it on the machine (nvidia-smi -i INDEX -mig 1, as \
                 root, on an idle GPU) and restart the worker",
            ));
        }
        if let Some(pending) = rec.mig.get(&gpu) {
            return Err(ApplyError::MigInProgress {
                node,
                gpu,
                target: pending.target.clone(),
            });
        }
        let invalid = |layout: &str, reason| ApplyError::InvalidLayout {
            node,
            gpu,
            model,
            layout: layout.to_string(),
            reason,
        };
        let current = match info.layout() {
            Some(Ok(current)) => current,
            Some(Err(reason)) => return Err(invalid("(the GPU's reported slices)", reason)),
            None => Layout::new(model),
        };
        let refused = |reason| ApplyError::MigRefused {
            node,
            gpu,
            model,
            change: change.to_string(),
            now: current.to_string(),
            reason,
        };
        let target = match change {
            MigChange::Layout(text) => {
                Layout::parse(model, text).map_err(|reason| invalid(text, reason))?
            }
            MigChange::Create(text) => {
                let mut next = current.clone();
                next.add_entry(text.trim()).map_err(refused)?;
                next
            }
            MigChange::Destroy(text) => {
                let text = text.trim();
                let start = match info.slices.iter().find(|s| s.uuid == text) {
                    Some(slice) => Some(slice.start),
                    None if text.starts_with("MIG-") => None,
                    None => {
                        let wanted = Placement::parse(model, text).map_err(refused)?;
                        current.contains(&wanted).then_some(wanted.start)
                    }
                };
                let mut next = current.clone();
                if start.and_then(|s| next.remove(s)).is_none() {
                    return Err(ApplyError::NoSuchInstance {
                        node,
                        gpu,
                        instance: text.to_string(),
                        now: current.to_string(),
                    });
                }
                next
            }
            MigChange::Prepare(text) => {
                let full = Layout::parse(model, text).map_err(|reason| invalid(text, reason))?;
                self.prepared(node, info, &current, &full)
            }
        };
        let (removed, added) = diff(&current, &target);
        let retiring: Vec<MigDevice> = info
            .slices
            .iter()
            .filter(|s| {
                removed
                    .iter()
                    .any(|p| p.start == s.start && p.profile.name.eq_ignore_ascii_case(&s.profile))
            })
            .cloned()
            .collect();
        let busy = self.busy_slices(node, &retiring);
        let waiting_for: Vec<TaskId> = busy
            .values()
            .flatten()
            .copied()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if !busy.is_empty() && !drain {
            let detail = busy
                .iter()
                .map(|((_, slice), tasks)| {
                    let tasks: Vec<String> = tasks.iter().map(|t| t.to_string()).collect();
                    format!(
                        "slice {slice} may be in use by task(s) {}",
                        tasks.join(", ")
                    )
                })
                .collect::<Vec<_>>()
                .join("; ");
            return Err(ApplyError::MigBusy {
                node,
                gpu,
                busy: detail,
            });
        }
        let text = |v: &[escher_proto::mig::Placement]| -> Vec<String> {
            v.iter().map(|p| p.to_string()).collect()
        };
        let plan = MigPlan {
            node,
            gpu,
            from: current.to_string(),
            to: target.to_string(),
            destroy: text(&removed),
            create: text(&added),
            waiting_for,
            estimated: LatencyModel::default().reconfiguration_time(&current, &target),
        };
        if plan.is_unchanged() {
            return Ok(plan);
        }
        let Some(rec) = self.nodes.get_mut(&node) else {
            return Err(ApplyError::UnknownNode(node)); // checked above: nothing changed yet
        };
        rec.mig.insert(
            gpu,
            PendingMig {
                target: plan.to.clone(),
                retiring: retiring.into_iter().map(|s| s.uuid).collect(),
                since: now,
            },
        );
        rec.mig_errors.remove(&gpu);
        self.sync_gpu_resources(node, now);
        self.effects.push(super::command::Effect::ReconfigureMig {
            node,
            gpu,
            layout: plan.to.clone(),
        });
        Ok(plan)
    }

    /// Pre-initialization: the layout between `current` and `full` that leaves the busy
    /// instances of `current` alone. The idle instances `full` does not keep go; then each
    /// instance `full` adds that fits, in `full`'s order, is created. Once the busy ones are
    /// free, applying `full` does only what is left.
    fn prepared(&self, node: NodeId, info: &GpuInfo, current: &Layout, full: &Layout) -> Layout {
        let (removed, added) = diff(current, full);
        let busy: BTreeSet<u8> = self
            .busy_slices(node, &info.slices)
            .into_keys()
            .map(|(start, _)| start)
            .collect();
        let mut next = current.clone();
        for p in removed.iter().filter(|p| !busy.contains(&p.start)) {
            next.remove(p.start);
        }
        for p in added {
            // What does not fit yet waits for the busy instances.
            let _ = next.insert(p);
        }
        next
    }

    /// For each slice of `slices` that may be in use on `node` (by start, then as the errors
    /// name it), the running tasks that may hold
    /// it: those that reported holding it, and those that have not reported their devices yet
    /// but request its class (`mig.<profile>`) or its identity.
    fn busy_slices(
        &self,
        node: NodeId,
        slices: &[MigDevice],
    ) -> BTreeMap<(u8, String), Vec<TaskId>> {
        let mut busy: BTreeMap<(u8, String), Vec<TaskId>> = BTreeMap::new();
        let running = self.core.node(node).map(|v| v.running).unwrap_or_default();
        for task in running {
            let Some(rec) = self.tasks.get(&task) else {
                continue;
            };
            for slice in slices {
                let holds = match &rec.devices {
                    Some(devices) => devices.iter().any(|d| d.uuid == slice.uuid),
                    None => [slice.class(), slice.identity()]
                        .into_iter()
                        .flatten()
                        .any(|name| !rec.spec.resources.get(name.as_str()).is_zero()),
                };
                if holds {
                    let key = format!("{} ({})", slice.placement_text(), slice.uuid);
                    busy.entry((slice.start, key)).or_default().push(task);
                }
            }
        }
        busy
    }

    /// Makes the node's GPU resources match its recorded GPUs, leaving out the slices being
    /// rebuilt. A draining or lost node is left alone (its resources are gone already).
    pub(crate) fn sync_gpu_resources(&mut self, node: NodeId, now: Millis) {
        let Some(rec) = self.nodes.get(&node).filter(|r| r.alive && !r.draining) else {
            return;
        };
        if self.core.node(node).is_none() {
            return; // it waits for its stream: its GPUs become resources when it is admitted
        }
        let excluded: BTreeSet<String> = rec
            .mig
            .values()
            .flat_map(|p| p.retiring.iter().cloned())
            .collect();
        let desired = gpu_resources(&rec.gpus, &excluded);
        let current: BTreeMap<ResourceName, Capacity> = self
            .core
            .node(node)
            .map(|v| {
                v.resources
                    .into_iter()
                    .filter(|r| is_gpu_resource(r.name.as_str()))
                    .map(|r| (r.name, r.total))
                    .collect()
            })
            .unwrap_or_default();
        let names: BTreeSet<ResourceName> = current
            .keys()
            .cloned()
            .chain(desired.iter().map(|(n, _)| n.clone()))
            .collect();
        for name in names {
            let want = desired.get(name.as_str());
            let have = current.get(&name).copied();
            let op = match have {
                Some(Capacity::Finite(a)) if a == want => continue,
                None if want.is_zero() => continue,
                Some(Capacity::Finite(a)) if a.is_zero() && want.is_zero() => continue,
                _ if want.is_zero() => CapacityOp::Delete,
                _ => CapacityOp::Set(Capacity::Finite(want)),
            };
            let target = NodeSpec::Node(node);
            self.core_event(Event::ResourceChanged { target, name, op }, now);
        }
    }

    /// Every node with GPUs, with who holds each device and what is being reconfigured.
    pub fn gpu_status(&self) -> GpusReply {
        let nodes = self
            .nodes
            .iter()
            .filter(|(_, rec)| !rec.gpus.is_empty())
            .map(|(id, rec)| {
                let holders = self.device_holders(*id);
                let gpus = rec
                    .gpus
                    .iter()
                    .map(|info| {
                        let devices: BTreeSet<&str> = std::iter::once(info.uuid.as_str())
                            .chain(info.slices.iter().map(|s| s.uuid.as_str()))
                            .collect();
                        let reconfiguring = rec.mig.get(&info.index).map(|p| {
                            let retiring: Vec<MigDevice> = info
                                .slices
                                .iter()
                                .filter(|s| p.retiring.contains(&s.uuid))
                                .cloned()
                                .collect();
                            let waiting: BTreeSet<TaskId> = self
                                .busy_slices(*id, &retiring)
                                .into_values()
                                .flatten()
                                .collect();
                            MigProgress {
                                target: p.target.clone(),
                                retiring: p.retiring.iter().cloned().collect(),
                                waiting_for: waiting.into_iter().collect(),
                                since_ms: p.since,
                            }
                        });
                        GpuStatus {
                            info: info.clone(),
                            holders: holders
                                .iter()
                                .filter(|h| devices.contains(h.uuid.as_str()))
                                .cloned()
                                .collect(),
                            reconfiguring,
                            last_error: rec.mig_errors.get(&info.index).cloned(),
                            last_reconfiguration: rec.mig_reports.get(&info.index).cloned(),
                        }
                    })
                    .collect();
                NodeGpus {
                    node: *id,
                    name: rec.name.clone(),
                    alive: rec.alive,
                    gpus,
                }
            })
            .collect();
        GpusReply { nodes }
    }

    /// The devices running tasks on `node` reported holding, by device then task.
    fn device_holders(&self, node: NodeId) -> Vec<DeviceHolder> {
        let mut holders: Vec<DeviceHolder> = self
            .core
            .node(node)
            .map(|v| v.running)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|t| Some((t, self.tasks.get(&t)?.devices.as_ref()?)))
            .flat_map(|(task, devices)| {
                devices.iter().map(move |d| DeviceHolder {
                    uuid: d.uuid.clone(),
                    task,
                    amount: d.amount,
                })
            })
            .collect();
        holders.sort_by(|a, b| (&a.uuid, a.task).cmp(&(&b.uuid, b.task)));
        holders
    }
}
