//! GPUs on a worker: discovery (NVML, or simulated with `--sim-gpu`), the devices each task is
//! given, and MIG reconfiguration.
//!
//! How GPUs become resources and labels (`gpu`, `gpu.<uuid>`, `mig.<profile>`, `mig.<uuid>`;
//! `gpu.model`, `gpu.count`, `gpu.mig`, `gpu.simulated`) is shared with the head and
//! documented in [`escher_proto::types`] (`gpu.rs`). Here:
//!
//! - `nvml.rs`: real GPUs through `nvml-wrapper` (no driver: one log line, no GPUs);
//! - `sim.rs`: [`SimGpuSpec`], simulated GPUs with stable fake UUIDs;
//! - `allocator.rs`: the device allocator (fractions pack onto one device; never beyond
//!   capacity; a task that fits nowhere yet waits);
//! - this file: [`Gpus`], what the worker's event loop owns: the inventory, the allocator, the
//!   reconfigurations asked for, and the jobs that carry them out.
//!
//! A task gets `CUDA_VISIBLE_DEVICES` and `NVIDIA_VISIBLE_DEVICES` set to the UUIDs of exactly
//! the devices it was given, in (GPU index, start) order; on a node with GPUs a task given none
//! gets `CUDA_VISIBLE_DEVICES=` (empty) and `NVIDIA_VISIBLE_DEVICES=none`. CUDA uses one MIG
//! device per process: a task holding several MIG slices sees them all listed, and CUDA opens
//! the first. Function tasks read the same list from
//! [`TaskContext::visible_devices`](crate::TaskContext::visible_devices).
//!
//! A reconfiguration ([`Gpus::request`]) marks the slices it destroys as retiring (nothing new
//! is bound to them), waits until their holders are gone, then runs as a [`Job`]: simulated,
//! it sleeps for the [`LatencyModel`]'s time (scaled in tests); real, it makes the NVML calls
//! of `nvml.rs` on a blocking thread. Its end ([`Gpus::finish`]) replaces the GPU's devices.

mod allocator;
mod check;
mod nvml;
mod sim;

use std::collections::{BTreeMap, BTreeSet};

use escher_proto::ResourceSet;
use escher_proto::mig::{LatencyModel, Layout, ReconfigurationCost, diff};
use escher_proto::types::{DeviceHold, GpuInfo, Metric, MigDone, gpu_resources};

pub(crate) use allocator::{BindError, DeviceAllocator, Holder};
pub use check::{DriverProfile, GpuTableCheck, ProfileCheck, Report as TableReport, compare};
pub use sim::{SimGpuError, SimGpuSpec};

/// Where GPUs come from when a worker starts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GpuSources<'a> {
    /// Ask NVML for real GPUs.
    pub(crate) nvml: bool,
    /// Simulated GPUs, numbered after the real ones.
    pub(crate) simulated: &'a [SimGpuSpec],
    /// The worker's name, which simulated UUIDs derive from.
    pub(crate) worker: &'a str,
    /// The worker's state directory, where simulated GPUs keep their layouts across restarts
    /// (`sim.rs`); `None`: they start as the flags say.
    pub(crate) sim_state: Option<&'a std::path::Path>,
}

/// Finds the GPUs: real ones by NVML index, then the simulated ones after them.
pub(crate) fn discover(sources: GpuSources<'_>) -> Vec<GpuInfo> {
    let mut gpus = if sources.nvml {
        nvml::nvml().map(nvml::discover).unwrap_or_default()
    } else {
        Vec::new()
    };
    let first = gpus.iter().map(|g| g.index + 1).max().unwrap_or(0);
    for (i, spec) in sources.simulated.iter().enumerate() {
        let index = first + i as u32;
        let spec = match sources.sim_state {
            Some(dir) => sim::restored(dir, index, spec),
            None => spec.clone(),
        };
        gpus.push(sim::gpu_info(sources.worker, index, &spec));
    }
    gpus
}

/// For each real GPU escher has a MIG table for, that table against the driver's (see
/// `check.rs`); why NVML is unavailable when it is. Read-only.
pub(crate) fn check_tables(gpus: &[GpuInfo]) -> Result<Vec<GpuTableCheck>, String> {
    let nvml = nvml::nvml().map_err(str::to_string)?;
    Ok(gpus
        .iter()
        .filter(|g| !g.simulated)
        .filter_map(|g| {
            let model = g.model?;
            Some(GpuTableCheck {
                gpu: g.index,
                checks: nvml::driver_table(nvml, g.index).map(|t| compare(model, &t)),
            })
        })
        .collect())
}

/// Live figures of the real GPUs among `gpus` (empty without NVML).
pub(crate) fn real_metrics(gpus: &[GpuInfo]) -> Vec<Metric> {
    nvml::nvml()
        .map(|n| nvml::metrics(n, gpus))
        .unwrap_or_default()
}

/// A reconfiguration asked for and not finished.
#[derive(Debug, Clone)]
struct Pending {
    from: Layout,
    to: Layout,
    retiring: BTreeSet<String>,
    started: bool,
}

/// The worker's GPUs. See the module documentation.
#[derive(Debug)]
pub(crate) struct Gpus {
    worker: String,
    gpus: Vec<GpuInfo>,
    alloc: DeviceAllocator,
    pending: BTreeMap<u32, Pending>,
    sim_latency: LatencyModel,
    sim_state: Option<std::path::PathBuf>,
}

impl Gpus {
    /// The GPUs of worker `worker`; simulated reconfigurations take `sim_latency`, and their
    /// outcomes are kept in the state directory `sim_state` for the worker's next start.
    pub(crate) fn new(
        worker: &str,
        gpus: Vec<GpuInfo>,
        sim_latency: LatencyModel,
        sim_state: Option<std::path::PathBuf>,
    ) -> Gpus {
        Gpus {
            worker: worker.to_string(),
            alloc: DeviceAllocator::new(&gpus),
            gpus,
            pending: BTreeMap::new(),
            sim_latency,
            sim_state,
        }
    }

    /// Whether the node has no GPU at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.gpus.is_empty()
    }

    /// The GPUs as they are now.
    pub(crate) fn inventory(&self) -> &[GpuInfo] {
        &self.gpus
    }

    /// The GPUs to register with: as they are, less the slices being rebuilt (a head that
    /// restarted meanwhile must not offer them).
    pub(crate) fn registration_inventory(&self) -> Vec<GpuInfo> {
        let retiring: BTreeSet<&String> = self
            .pending
            .values()
            .flat_map(|p| p.retiring.iter())
            .collect();
        self.gpus
            .iter()
            .map(|g| GpuInfo {
                slices: g
                    .slices
                    .iter()
                    .filter(|s| !retiring.contains(&s.uuid))
                    .cloned()
                    .collect(),
                ..g.clone()
            })
            .collect()
    }

    /// The GPU resources to register now: those of every device but the retiring ones.
    pub(crate) fn resources(&self) -> ResourceSet {
        let retiring: BTreeSet<String> = self
            .pending
            .values()
            .flat_map(|p| p.retiring.iter().cloned())
            .collect();
        gpu_resources(&self.gpus, &retiring)
    }

    /// Binds devices for the GPU resources of `allocation`; nothing on a node without GPUs.
    pub(crate) fn bind(
        &mut self,
        holder: Holder,
        allocation: &ResourceSet,
    ) -> Result<Vec<DeviceHold>, BindError> {
        if self.alloc.is_empty() {
            return Ok(Vec::new());
        }
        self.alloc.bind(holder, allocation)
    }

    /// Releases what `holder` holds; `true` if it held something.
    pub(crate) fn release(&mut self, holder: Holder) -> bool {
        self.alloc.release(holder)
    }

    /// The environment a task given `holds` sees: `None` on a node without GPUs (leave the
    /// environment alone), else the UUIDs of its devices, in order.
    pub(crate) fn visible(&self, holds: &[DeviceHold]) -> Option<Vec<String>> {
        (!self.is_empty()).then(|| holds.iter().map(|h| h.uuid.clone()).collect())
    }

    /// Asks for GPU `gpu` to take `layout` (explicit form, from the head): marks the slices it
    /// destroys as retiring. The reconfiguration starts with [`Gpus::take_ready`].
    pub(crate) fn request(&mut self, gpu: u32, layout: &str) -> Result<(), String> {
        if self.pending.contains_key(&gpu) {
            return Err(format!("GPU {gpu} is already being reconfigured"));
        }
        let info = self
            .gpus
            .iter()
            .find(|g| g.index == gpu)
            .ok_or_else(|| format!("this worker has no GPU {gpu}"))?;
        let model = info
            .model
            .filter(|_| info.mig_enabled)
            .ok_or_else(|| format!("GPU {gpu} ({}) is not a MIG GPU in MIG mode", info.product))?;
        let to = Layout::parse(model, layout).map_err(|e| e.to_string())?;
        let from = match info.layout() {
            Some(Ok(from)) => from,
            Some(Err(e)) => return Err(format!("the GPU's slices are not a legal layout: {e}")),
            None => Layout::new(model),
        };
        let (removed, _) = diff(&from, &to);
        let retiring: BTreeSet<String> = info
            .slices
            .iter()
            .filter(|s| {
                removed
                    .iter()
                    .any(|p| p.start == s.start && p.profile.name == s.profile)
            })
            .map(|s| s.uuid.clone())
            .collect();
        self.alloc.set_retiring(&retiring, true);
        let pending = Pending {
            from,
            to,
            retiring,
            started: false,
        };
        self.pending.insert(gpu, pending);
        Ok(())
    }

    /// The reconfigurations whose retiring slices are all free now, marked started.
    pub(crate) fn take_ready(&mut self) -> Vec<Job> {
        let mut jobs = Vec::new();
        for (gpu, p) in &mut self.pending {
            if p.started || !self.alloc.all_free(&p.retiring) {
                continue;
            }
            p.started = true;
            let Some(info) = self.gpus.iter().find(|g| g.index == *gpu) else {
                continue;
            };
            jobs.push(Job {
                worker: self.worker.clone(),
                info: info.clone(),
                from: p.from.clone(),
                to: p.to.clone(),
                sim_latency: self.sim_latency,
            });
        }
        jobs
    }

    /// A job ended: GPU `done.info.index` is now `done.info` (the new layout, or what is left
    /// after a failure). Replaces its devices and returns what to tell the head.
    pub(crate) fn finish(&mut self, done: Reconfigured) -> MigDone {
        let Reconfigured { info, cost, error } = done;
        let gpu = info.index;
        if info.simulated
            && let (Some(dir), Some(model), Some(Ok(layout))) =
                (&self.sim_state, info.model, info.layout())
        {
            // What a driver would keep for the next worker on this machine (`sim.rs`).
            let spec = SimGpuSpec {
                model,
                mig: Some(layout),
            };
            if let Err(e) = sim::remember(dir, gpu, &spec) {
                tracing::warn!(gpu, dir = %dir.display(), error = %e, "cannot keep a simulated GPU's layout for the worker's next start");
            }
        }
        if let Some(p) = self.pending.remove(&gpu) {
            self.alloc.set_retiring(&p.retiring, false);
        }
        self.alloc.replace_gpu(gpu, &info);
        match self.gpus.iter_mut().find(|g| g.index == gpu) {
            Some(slot) => *slot = info,
            None => self.gpus.push(info),
        }
        MigDone {
            gpu,
            error,
            phases: Box::new(cost),
        }
    }

    /// Live figures for heartbeats: NVML's for real GPUs; for simulated ones, the share of the
    /// GPU's compute and memory that tasks hold, and of each MIG slice's
    /// (`gpu.<index>.slice.<uuid>.utilization`, `...memory_used_mib`).
    pub(crate) fn metrics(&self) -> Vec<Metric> {
        let mut out = Vec::new();
        if self.gpus.iter().any(|g| !g.simulated)
            && let Ok(nvml) = nvml::nvml()
        {
            out.extend(nvml::metrics(nvml, &self.gpus));
        }
        for gpu in self.gpus.iter().filter(|g| g.simulated) {
            let (mut busy, mut memory) = (0.0, 0.0);
            if gpu.mig_enabled {
                for s in &gpu.slices {
                    let used = self.alloc.used(&s.uuid).as_f64();
                    let gpcs = gpu
                        .model
                        .and_then(|m| m.profile(&s.profile))
                        .map_or(0.0, |p| f64::from(p.compute));
                    busy += used * gpcs / 7.0;
                    memory += used * s.memory_mib as f64;
                    let slice = |what: &str| format!("slice.{}.{what}", s.uuid);
                    out.push(nvml::metric(
                        gpu.index,
                        &slice("utilization"),
                        (used * 100.0).round(),
                    ));
                    out.push(nvml::metric(
                        gpu.index,
                        &slice("memory_used_mib"),
                        (used * s.memory_mib as f64).round(),
                    ));
                }
            } else {
                let used = self.alloc.used(&gpu.uuid).as_f64();
                busy = used;
                memory = used * gpu.memory_mib as f64;
            }
            out.push(nvml::metric(
                gpu.index,
                "utilization",
                (busy * 100.0).round(),
            ));
            out.push(nvml::metric(gpu.index, "memory_used_mib", memory.round()));
        }
        out
    }
}

/// One reconfiguration to carry out, off the event loop.
#[derive(Debug)]
pub(crate) struct Job {
    worker: String,
    info: GpuInfo,
    from: Layout,
    to: Layout,
    sim_latency: LatencyModel,
}

impl Job {
    /// Carries the job out: the GPU afterwards, what each phase took, and why it failed if it
    /// did.
    pub(crate) async fn run(self) -> Reconfigured {
        let index = self.info.index;
        if self.info.simulated {
            let cost = self.sim_latency.cost(&self.from, &self.to);
            tracing::info!(gpu = index, from = %self.from, to = %self.to, time = ?cost.total(), "simulated MIG reconfiguration");
            let fail_at = std::env::var(sim::SIM_MIG_FAIL_VAR)
                .ok()
                .and_then(|v| sim::injected_failure(&v, index));
            // Phase by phase, as a real one: destroy, create, then library and model load.
            for (phase, time) in [
                (sim::SimPhase::Destroy, cost.destroy),
                (sim::SimPhase::Create, cost.create),
                (sim::SimPhase::Library, cost.library_load),
                (sim::SimPhase::Model, cost.model_load),
            ] {
                if fail_at == Some(phase) {
                    let left = sim::left_after(&self.from, &self.to, phase);
                    tracing::warn!(gpu = index, ?phase, left = %left, "injected NVML error");
                    return Reconfigured {
                        info: sim::with_layout(&self.worker, &self.info, &left),
                        cost,
                        error: Some(format!(
                            "NVML error at the {phase:?} phase (simulated: {}={index}:{})",
                            sim::SIM_MIG_FAIL_VAR,
                            format!("{phase:?}").to_lowercase()
                        )),
                    };
                }
                tokio::time::sleep(time).await;
            }
            return Reconfigured {
                info: sim::with_layout(&self.worker, &self.info, &self.to),
                cost,
                error: None,
            };
        }
        tracing::info!(gpu = index, from = %self.from, to = %self.to, "MIG reconfiguration through NVML");
        let old = self.info.clone();
        let done = tokio::task::spawn_blocking(move || {
            let nvml = nvml::nvml().map_err(str::to_string)?;
            let mut cost = ReconfigurationCost::default();
            let result = nvml::reconfigure(nvml, index, &self.from, &self.to, &mut cost);
            // Whatever happened, report the GPU as NVML sees it now.
            let after = nvml::read_gpu(nvml, index);
            Ok::<_, String>((result, after, cost))
        })
        .await;
        let failed = |error: String| Reconfigured {
            info: old.clone(),
            cost: ReconfigurationCost::default(),
            error: Some(error),
        };
        match done {
            Ok(Ok((result, Ok(after), cost))) => Reconfigured {
                info: after,
                cost,
                error: result.err(),
            },
            Ok(Ok((result, Err(read), cost))) => {
                let why = match result {
                    Ok(()) => format!("reconfigured, but the GPU cannot be read back: {read}"),
                    Err(e) => format!("{e}; and the GPU cannot be read back: {read}"),
                };
                Reconfigured {
                    cost,
                    ..failed(why)
                }
            }
            Ok(Err(why)) => failed(why),
            Err(e) => failed(format!("the reconfiguration thread failed: {e}")),
        }
    }
}

/// What a reconfiguration job did.
#[derive(Debug)]
pub(crate) struct Reconfigured {
    /// The GPU afterwards (the new layout, or what is left after a failure).
    pub(crate) info: GpuInfo,
    /// What each phase took: the latency model's for a simulated GPU, the driver calls' for a
    /// real one.
    pub(crate) cost: ReconfigurationCost,
    /// Why it failed, if it did.
    pub(crate) error: Option<String>,
}

/// The default latency model (MIGRator's 6 s per replaced instance) with every phase multiplied
/// by `scale`, from 0 (instant, for tests) to 1000; anything else counts as 1.
pub fn scaled_latency(scale: f64) -> LatencyModel {
    let scale = if (0.0..=1000.0).contains(&scale) {
        scale
    } else {
        1.0
    };
    LatencyModel::default().scaled(scale)
}

#[cfg(test)]
mod tests;
