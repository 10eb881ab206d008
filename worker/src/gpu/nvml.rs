//! Real NVIDIA GPUs through NVML (`nvml-wrapper`, which loads `libnvidia-ml.so.1` at run time).
//!
//! - [`nvml`] initializes NVML once per process. Without a driver (no library, or the driver
//!   not loaded) it logs one line and every worker of the process reports no GPUs.
//! - [`discover`] reads every GPU: index, product name, memory, UUID and MIG mode; for a GPU in
//!   MIG mode, each MIG device with its profile, memory, placement and UUID. MIG devices whose
//!   compute instance is smaller than their GPU instance are left out, as NVIDIA's "mixed"
//!   strategy does. A profile is recognised by its geometry (GPCs, memory slices), so the
//!   driver's profile numbering does not matter. NVML shows placements to privileged users
//!   only; otherwise they are inferred with the MIG model (and a warning says so).
//! - [`metrics`] reads live figures for heartbeats: utilisation and memory used.
//! - [`reconfigure`] changes a GPU's MIG layout: destroys the GPU instances (and their compute
//!   instances) that the new layout drops, and creates the new ones at their placements, each
//!   with one compute instance spanning it. It needs root (or the `CAP_SYS_ADMIN` NVML asks
//!   for) and the affected slices idle; MIG mode itself must already be on and is never changed
//!   here (that may reset the GPU).
//!
//! # Raw calls
//!
//! `nvml-wrapper` 0.13 wraps MIG mode and MIG device handles, but not GPU or compute instances
//! (`unwrapped_functions.txt`). Those are called through its raw escape hatch
//! ([`Nvml::lib`] and [`Device::handle`]): `nvmlDeviceGetGpuInstanceId`,
//! `nvmlDeviceGetGpuInstanceById`, `nvmlGpuInstanceGetInfo` (a MIG device's profile and
//! placement), `nvmlDeviceGetGpuInstances`, `nvmlGpuInstanceGetComputeInstanceProfileInfo`,
//! `nvmlGpuInstanceGetComputeInstances`, `nvmlComputeInstanceDestroy`,
//! `nvmlGpuInstanceDestroy`, `nvmlDeviceCreateGpuInstanceWithPlacement` and
//! `nvmlGpuInstanceCreateComputeInstance`. Its `possible_placements` is not used: in 0.13 it
//! returns an empty list (the vector's length is never set); escher's MIG model has the
//! placements anyway. Creating an instance takes the driver's profile id, read with the wrapped
//! `profile_info` (`nvmlDeviceGetGpuInstanceProfileInfo`); destroying finds the instance by
//! its placement. The workspace denies `unsafe` code; this module allows it for these calls,
//! as a few others do for theirs, each saying why in its module doc.
//!
//! None of this runs on a machine without an NVIDIA driver; the tests here cover the no-driver
//! path and the pure helpers. `escher-worker --detect` prints what this module reads, and
//! [`driver_table`] with `check.rs` sets the driver's MIG profile table beside escher's.
//!
//! # Checked on real hardware, and what is left to check
//!
//! `scripts/real-gpu-check.sh` (read-only) ran on one NVIDIA H100 80GB HBM3 and one NVIDIA
//! H200, driver 580.159.04, CUDA 13.0, MIG mode disabled on both (as found; never changed), on
//! 2026-11-26:
//!
//! - [x] NVML loads from `libnvidia-ml.so.1`; [`discover`] reads index, product name
//!   (`NVIDIA H100 80GB HBM3` recognised as `h100-80gb`, 81559 MiB; `NVIDIA H200` as
//!   `h200-141gb`, 143771 MiB), UUID and MIG mode off; the worker registers `gpu=1` and
//!   `gpu.<GPU-uuid>=1` with the `gpu.*` labels.
//! - [x] The profile table through `nvmlDeviceGetGpuInstanceProfileInfo` answers with MIG mode
//!   off, and `nvmlDeviceGetGpuInstancePossiblePlacements_v2` (raw) lists placements, as
//!   `nvidia-smi mig -lgip`/`-lgipp` print them. H100: all 7 profiles (ids 19, 20, 15, 14, 9, 5,
//!   0) agreed with escher's table in GPCs, instance counts and placements. H200: 5 of 7 agreed;
//!   the check found the two places where our table had been assumed wrong (no `1g.18gb+me`,
//!   and 18 GB for a `1g.18gb` that has 16384 MiB); with the table corrected, a second run on
//!   another H200 agreed on all 7. The MiB figures of both tables are the drivers'.
//! - [x] [`metrics`]: `gpu.0.utilization` and `gpu.0.memory_used_mib` read.
//! - [x] On both GPUs, a command task given `gpu=1` saw `CUDA_VISIBLE_DEVICES` and
//!   `NVIDIA_VISIBLE_DEVICES` set to the GPU's UUID, `nvidia-smi -L` listed that GPU and PyTorch
//!   ran a matrix product on it; a task given no GPU saw `CUDA_VISIBLE_DEVICES=` and PyTorch
//!   found 0 devices; two tasks of `gpu=0.5` shared the GPU and both ran.
//! - [ ] MIG devices ([`mig_devices`]: enumeration, `nvmlDeviceGetGpuInstanceById` placements,
//!   the unprivileged inference), [`reconfigure`], and per-slice memory figures: they need MIG
//!   mode on, which the check may not switch (switching can reset the GPU). Run the script
//!   on a GPU whose operator has enabled MIG.
//! - [ ] Another driver release, and the A100s (their tables come from NVIDIA's documents and
//!   go-nvml's mock, never from a driver here).
#![allow(unsafe_code)]

use std::mem::MaybeUninit;
use std::os::raw::c_uint;
use std::sync::OnceLock;
use std::time::Instant;

use escher_proto::mig::{GpuModel, Layout, Placement, ReconfigurationCost, diff};
use escher_proto::types::{GpuInfo, Metric, MigDevice, device_segment};
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::{Device, Nvml};

use super::check::DriverProfile;

/// NVML's `NVML_DEVICE_MIG_ENABLE`.
const MIG_ENABLE: u32 = 1;
/// NVML's `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED`.
const CI_ENGINE_SHARED: c_uint = 0;
/// How many `NVML_COMPUTE_INSTANCE_PROFILE_*` values there are (`_COUNT`).
const CI_PROFILE_COUNT: c_uint = 8;
/// The most GPU or compute instances one list call can return (7 on every MIG GPU).
const MAX_INSTANCES: usize = 16;
const MIB: u64 = 1024 * 1024;

static NVML: OnceLock<Result<Nvml, String>> = OnceLock::new();

/// NVML, initialized once per process; the error says why there is none.
pub(crate) fn nvml() -> Result<&'static Nvml, &'static str> {
    NVML.get_or_init(|| match Nvml::init() {
        Ok(nvml) => Ok(nvml),
        Err(e) => {
            let why = no_nvml_reason(&e);
            tracing::info!(reason = %why, "no NVIDIA GPUs: this node reports none");
            Err(why)
        }
    })
    .as_ref()
    .map_err(String::as_str)
}

/// Why NVML could not start, in words.
fn no_nvml_reason(e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(e) => {
            format!("the NVIDIA driver library is not installed ({e})")
        }
        NvmlError::DriverNotLoaded => "the NVIDIA driver is not loaded".to_string(),
        NvmlError::NoPermission => "no permission to talk to the NVIDIA driver".to_string(),
        other => format!("NVML failed to start: {other}"),
    }
}

/// Every GPU NVML sees, in index order. A GPU that cannot be read is skipped with a warning.
pub(crate) fn discover(nvml: &Nvml) -> Vec<GpuInfo> {
    let count = match nvml.device_count() {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(error = %e, "NVML cannot count the GPUs; reporting none");
            return Vec::new();
        }
    };
    (0..count)
        .filter_map(|index| match read_gpu(nvml, index) {
            Ok(gpu) => Some(gpu),
            Err(e) => {
                tracing::warn!(index, error = %e, "skipping a GPU NVML cannot read");
                None
            }
        })
        .collect()
}

/// One GPU, by index.
pub(crate) fn read_gpu(nvml: &Nvml, index: u32) -> Result<GpuInfo, String> {
    let device = nvml.device_by_index(index).map_err(|e| e.to_string())?;
    let uuid = device.uuid().map_err(|e| format!("uuid: {e}"))?;
    if device_segment(&uuid).is_none() {
        return Err(format!("its UUID {uuid:?} cannot be named as a resource"));
    }
    let product = device.name().map_err(|e| format!("name: {e}"))?;
    let memory_mib = device.memory_info().map_or(0, |m| m.total / MIB);
    // `NotSupported` on GPUs without MIG.
    let mig_enabled = device.mig_mode().is_ok_and(|m| m.current == MIG_ENABLE);
    let model = GpuModel::from_product_name(&product).ok();
    let slices = if mig_enabled {
        mig_devices(nvml, &device, model)
    } else {
        Vec::new()
    };
    Ok(GpuInfo {
        index,
        uuid,
        product,
        model,
        memory_mib,
        mig_enabled,
        simulated: false,
        slices,
    })
}

/// The MIG devices of a GPU in MIG mode, by start. `mig_device_count` is the maximum, not the
/// number that exist: every index is tried and the ones that answer kept (go-nvml#60).
///
/// A MIG device's placement comes from its GPU instance, which NVML shows only to a privileged
/// user. Without that, the profile is recognised from the device's GPC count and memory, and
/// the placement inferred with the MIG model (the legal start that keeps the most layouts
/// reachable): right for scheduling and binding, maybe not the hardware's exact start, which
/// only a reconfiguration (root anyway) needs.
fn mig_devices(nvml: &Nvml, parent: &Device<'_>, model: Option<GpuModel>) -> Vec<MigDevice> {
    let max = parent.mig_device_count().unwrap_or(7);
    let mut known = Vec::new();
    let mut unplaced = Vec::new();
    for mig in (0..max).filter_map(|i| parent.mig_device_by_index(i).ok()) {
        match read_mig(nvml, parent, &mig, model) {
            Ok(Read::Placed(slice)) => known.push(slice),
            Ok(Read::Unplaced(slice)) => unplaced.push(slice),
            Ok(Read::Skipped) => {}
            Err(e) => tracing::warn!(error = %e, "skipping a MIG device NVML cannot read"),
        }
    }
    if !unplaced.is_empty() {
        tracing::warn!(
            count = unplaced.len(),
            "MIG placements need a privileged user (nvmlDeviceGetGpuInstanceById); inferring \
             them with the MIG model (run the worker as root for exact ones)"
        );
        match model {
            Some(model) => known = infer_placements(model, known, unplaced),
            None => tracing::warn!("no MIG table for this GPU: its unplaced slices are left out"),
        }
    }
    known.sort_by_key(|s| s.start);
    known
}

/// What reading one MIG device gave.
enum Read {
    /// With its real placement.
    Placed(MigDevice),
    /// Without a placement (start 0 until inferred).
    Unplaced(MigDevice),
    /// Not reported (its compute instance does not span its GPU instance).
    Skipped,
}

/// One MIG device.
fn read_mig(
    nvml: &Nvml,
    parent: &Device<'_>,
    mig: &Device<'_>,
    model: Option<GpuModel>,
) -> Result<Read, String> {
    let uuid = mig.uuid().map_err(|e| format!("uuid: {e}"))?;
    if device_segment(&uuid).is_none() {
        return Err(format!("its UUID {uuid:?} cannot be named as a resource"));
    }
    let attrs = mig.attributes().map_err(|e| format!("attributes: {e}"))?;
    if attrs.compute_instance_slice_count != attrs.gpu_instance_slice_count {
        tracing::info!(%uuid, "MIG device with a compute instance smaller than its GPU instance; not reported");
        return Ok(Read::Skipped);
    }
    let memory_mib = mig
        .memory_info()
        .map_or(attrs.memory_size_mb, |m| m.total / MIB);
    // A GPU escher has no table for (an A30, say): name the profile as NVIDIA does.
    let fallback_name = || {
        let gb = attrs.memory_size_mb.div_ceil(1024);
        format!("{}g.{gb}gb", attrs.gpu_instance_slice_count)
    };
    match gpu_instance_info(nvml, parent, mig) {
        Ok((profile_id, start, size)) => {
            let start = u8::try_from(start).map_err(|_| format!("placement start {start}"))?;
            let size = u8::try_from(size).map_err(|_| format!("placement size {size}"))?;
            let gpcs = u8::try_from(attrs.gpu_instance_slice_count).unwrap_or(0);
            let profile = model
                .and_then(|m| placed_profile(m, profile_id, gpcs, size))
                .map_or_else(fallback_name, |p| p.name.to_string());
            Ok(Read::Placed(MigDevice {
                profile,
                start,
                size,
                memory_mib,
                uuid,
            }))
        }
        Err(why) => {
            tracing::debug!(%uuid, %why, "no GPU instance placement");
            let gpcs = u8::try_from(attrs.gpu_instance_slice_count).unwrap_or(0);
            let profile = model
                .and_then(|m| recognise_profile(m, gpcs, attrs.memory_size_mb))
                .map_or_else(fallback_name, |p| p.name.to_string());
            Ok(Read::Unplaced(MigDevice {
                profile,
                start: 0,
                size: 0,
                memory_mib,
                uuid,
            }))
        }
    }
}

/// The profile of a GPU instance of `model` with driver profile id `id`, `gpcs` GPCs and
/// `size` memory slices: the table's profile of that id if its geometry agrees, else the one
/// with that geometry (base profiles first). Geometry decides, so a driver whose ids differ
/// from `nvidia-smi mig -lgip`'s still maps right.
pub(crate) fn placed_profile(
    model: GpuModel,
    id: u32,
    gpcs: u8,
    size: u8,
) -> Option<&'static escher_proto::mig::Profile> {
    let fits = |p: &&escher_proto::mig::Profile| p.compute == gpcs && p.memory_slices == size;
    model
        .profile_by_id(id)
        .filter(fits)
        .or_else(|| model.profiles().iter().filter(fits).min_by_key(|p| !p.base))
}

/// The profile of `model` with `gpcs` GPCs whose memory is closest to `memory_mb`, base
/// profiles first (a `+me` slice looks like its base profile; it cannot be told apart here).
pub(crate) fn recognise_profile(
    model: GpuModel,
    gpcs: u8,
    memory_mb: u64,
) -> Option<&'static escher_proto::mig::Profile> {
    model
        .profiles()
        .iter()
        .filter(|p| p.compute == gpcs)
        .min_by_key(|p| {
            let mib = p
                .memory_mib
                .map_or(u64::from(p.memory_gb) * 1024, u64::from);
            (mib.abs_diff(memory_mb), !p.base)
        })
}

/// `known` (with real placements) plus `unplaced`, each placed where the MIG model's rule puts
/// it next to the others, largest first. A slice that fits nowhere is left out with a warning.
pub(crate) fn infer_placements(
    model: GpuModel,
    known: Vec<MigDevice>,
    mut unplaced: Vec<MigDevice>,
) -> Vec<MigDevice> {
    let placements = known.iter().filter_map(|s| {
        let profile = model.profile(&s.profile)?;
        Some(Placement::new(profile, s.start))
    });
    let Ok(mut layout) = Layout::from_placements(model, placements) else {
        tracing::warn!("the placed MIG devices are not a legal layout; unplaced ones left out");
        return known;
    };
    let size = |s: &MigDevice| model.profile(&s.profile).map_or(0, |p| p.memory_slices);
    unplaced.sort_by_key(|s| std::cmp::Reverse(size(s)));
    let mut out = known;
    for mut slice in unplaced {
        let placed = model
            .profile(&slice.profile)
            .ok_or_else(|| format!("unknown profile {}", slice.profile))
            .and_then(|p| layout.place(p).map_err(|e| e.to_string()));
        match placed {
            Ok(p) => {
                slice.start = p.start;
                slice.size = p.profile.memory_slices;
                out.push(slice);
            }
            Err(why) => tracing::warn!(uuid = %slice.uuid, %why, "cannot infer a MIG placement"),
        }
    }
    out
}

/// A MIG device's GPU instance: its profile id and placement (start, size). Raw calls.
fn gpu_instance_info(
    nvml: &Nvml,
    parent: &Device<'_>,
    mig: &Device<'_>,
) -> Result<(u32, u32, u32), String> {
    let lib = nvml.lib();
    let err = |what: &str, e: NvmlError| format!("{what}: {e}");
    let get_id = nvml_sym(lib.nvmlDeviceGetGpuInstanceId.as_ref())
        .map_err(|e| err("nvmlDeviceGetGpuInstanceId", e))?;
    let by_id = nvml_sym(lib.nvmlDeviceGetGpuInstanceById.as_ref())
        .map_err(|e| err("nvmlDeviceGetGpuInstanceById", e))?;
    let get_info = nvml_sym(lib.nvmlGpuInstanceGetInfo.as_ref())
        .map_err(|e| err("nvmlGpuInstanceGetInfo", e))?;
    // SAFETY: the handles come from live `Device`s of this `Nvml`; every out-pointer points at
    // a local of the type the binding declares, and the info struct is plain C data for which
    // all-zero bytes are valid.
    unsafe {
        let mut id: c_uint = 0;
        nvml_try(get_id(mig.handle(), &mut id)).map_err(|e| err("GPU instance id", e))?;
        let mut gi = std::ptr::null_mut();
        nvml_try(by_id(parent.handle(), id, &mut gi)).map_err(|e| err("GPU instance", e))?;
        let mut info = MaybeUninit::zeroed();
        nvml_try(get_info(gi, info.as_mut_ptr())).map_err(|e| err("GPU instance info", e))?;
        let info = info.assume_init();
        Ok((info.profileId, info.placement.start, info.placement.size))
    }
}

/// Live figures of the real GPUs among `gpus`: `gpu.<index>.utilization` (percent of time a
/// kernel ran; not available in MIG mode), `gpu.<index>.memory_used_mib`, and in MIG mode
/// `gpu.<index>.slice.<uuid>.memory_used_mib` for each MIG device.
pub(crate) fn metrics(nvml: &Nvml, gpus: &[GpuInfo]) -> Vec<Metric> {
    let mut out = Vec::new();
    for gpu in gpus.iter().filter(|g| !g.simulated) {
        let Ok(device) = nvml.device_by_index(gpu.index) else {
            continue;
        };
        if let Ok(u) = device.utilization_rates() {
            out.push(metric(gpu.index, "utilization", f64::from(u.gpu)));
        }
        if let Ok(m) = device.memory_info() {
            out.push(metric(gpu.index, "memory_used_mib", (m.used / MIB) as f64));
        }
        if gpu.mig_enabled {
            out.extend(slice_metrics(&device, gpu.index));
        }
    }
    out
}

/// The memory used in each MIG device of a GPU in MIG mode (NVML gives no utilisation per MIG
/// device; that takes DCGM's profiling metrics).
fn slice_metrics(device: &nvml_wrapper::Device<'_>, index: u32) -> Vec<Metric> {
    let mut out = Vec::new();
    let count = device.mig_device_count().unwrap_or(0);
    for i in 0..count {
        let Ok(mig) = device.mig_device_by_index(i) else {
            continue;
        };
        if let (Ok(uuid), Ok(m)) = (mig.uuid(), mig.memory_info()) {
            let name = format!("slice.{uuid}.memory_used_mib");
            out.push(metric(index, &name, (m.used / MIB) as f64));
        }
    }
    out
}

/// `gpu.<index>.<what>`.
pub(crate) fn metric(index: u32, what: &str, value: f64) -> Metric {
    Metric {
        name: format!("gpu.{index}.{what}"),
        value,
    }
}

/// Changes GPU `index` from layout `from` to `to`: destroys what only `from` has, then creates
/// what only `to` has, largest first, adding each driver call's time and count to `cost`
/// (the library and model loads are the tasks' own, not the driver's). Blocking; run it off
/// the async runtime. Needs root and the affected slices idle.
pub(crate) fn reconfigure(
    nvml: &Nvml,
    index: u32,
    from: &Layout,
    to: &Layout,
    cost: &mut ReconfigurationCost,
) -> Result<(), String> {
    let device = nvml
        .device_by_index(index)
        .map_err(|e| format!("GPU {index}: {e}"))?;
    let (removed, mut added) = diff(from, to);
    let profiles = driver_profiles(&device);
    let existing = gpu_instances(nvml, &device, &profiles)?;
    for p in &removed {
        let gi = existing
            .iter()
            .find(|(_, start, size)| {
                *start == u32::from(p.start) && *size == u32::from(p.profile.memory_slices)
            })
            .map(|(gi, _, _)| *gi)
            .ok_or_else(|| format!("no GPU instance {p} to destroy"))?;
        let began = Instant::now();
        destroy_gpu_instance(nvml, gi).map_err(|e| format!("destroying {p}: {}", hint(&e)))?;
        cost.destroy += began.elapsed();
        cost.destroyed += 1;
    }
    added.sort_by_key(|p| std::cmp::Reverse((p.profile.memory_slices, p.profile.compute)));
    for p in &added {
        let id = driver_profile_id(&profiles, p.profile).ok_or_else(|| {
            format!("creating {p}: the driver offers no such GPU-instance profile")
        })?;
        let began = Instant::now();
        create_instance(nvml, &device, p, id).map_err(|e| format!("creating {p}: {}", hint(&e)))?;
        cost.create += began.elapsed();
        cost.created += 1;
    }
    Ok(())
}

/// How many `NVML_GPU_INSTANCE_PROFILE_*` values there are (`_COUNT` in the bindings).
const GI_PROFILE_COUNT: u32 = 17;

/// The GPU-instance profiles the driver offers on a device (`nvmlDeviceGetGpuInstanceProfileInfo`
/// for each `NVML_GPU_INSTANCE_PROFILE_*`), each with the id that creating and listing take.
fn driver_profiles(device: &Device<'_>) -> Vec<nvml_wrapper::struct_wrappers::device::ProfileInfo> {
    (0..GI_PROFILE_COUNT)
        .filter_map(|i| device.profile_info(i).ok())
        .collect()
}

/// The driver's GPU-instance profile table of GPU `index`, each profile with its possible
/// placements (a raw call: `nvml-wrapper` 0.13's wrapper returns none). Read-only.
pub(crate) fn driver_table(nvml: &Nvml, index: u32) -> Result<Vec<DriverProfile>, String> {
    let device = nvml.device_by_index(index).map_err(|e| e.to_string())?;
    let placements = nvml_sym(
        nvml.lib()
            .nvmlDeviceGetGpuInstancePossiblePlacements_v2
            .as_ref(),
    )
    .map_err(|e| format!("nvmlDeviceGetGpuInstancePossiblePlacements_v2: {e}"))?;
    let mut out = Vec::new();
    let mut first_error = None;
    for i in 0..GI_PROFILE_COUNT {
        let info = match device.profile_info(i) {
            Ok(info) => info,
            Err(e) => {
                first_error.get_or_insert_with(|| e.to_string());
                continue;
            }
        };
        let mut slots =
            [nvml_wrapper_sys::bindings::nvmlGpuInstancePlacement_t { start: 0, size: 0 };
                MAX_INSTANCES];
        let mut count = MAX_INSTANCES as c_uint;
        // SAFETY: the handle comes from a live `Device` of this `Nvml`; `slots` has room for
        // `count` placements, which is what the call may write.
        let listed = unsafe {
            nvml_try(placements(
                device.handle(),
                info.id,
                slots.as_mut_ptr(),
                &mut count,
            ))
        };
        out.push(DriverProfile {
            id: info.id,
            gpcs: info.slice_count,
            memory_mib: info.memory_size_mb,
            multiprocessors: info.multiprocessor_count,
            instances: info.instance_count,
            placements: listed.map_err(|e| e.to_string()).map(|()| {
                slots[..(count as usize).min(MAX_INSTANCES)]
                    .iter()
                    .map(|p| (p.start, p.size))
                    .collect()
            }),
        });
    }
    match (out.is_empty(), first_error) {
        (true, Some(e)) => Err(format!("the driver lists no GPU-instance profiles: {e}")),
        _ => Ok(out),
    }
}

/// The driver's id for `profile`: the table's id (`-lgip`'s) when the driver offers it, else
/// the offered profile with the same GPCs and instance count and the closest memory.
fn driver_profile_id(
    offered: &[nvml_wrapper::struct_wrappers::device::ProfileInfo],
    profile: &escher_proto::mig::Profile,
) -> Option<u32> {
    if offered.iter().any(|i| i.id == profile.id) {
        return Some(profile.id);
    }
    let mib = profile
        .memory_mib
        .map_or(u64::from(profile.memory_gb) * 1024, u64::from);
    offered
        .iter()
        .filter(|i| {
            i.slice_count == u32::from(profile.compute)
                && i.instance_count == u32::from(profile.max_instances)
        })
        .min_by_key(|i| i.memory_size_mb.abs_diff(mib))
        .map(|i| i.id)
}

/// What to do about an NVML error during a reconfiguration.
fn hint(e: &NvmlError) -> String {
    match e {
        NvmlError::NoPermission => format!("{e} (MIG reconfiguration needs root)"),
        NvmlError::InUse => format!("{e} (a process still uses the GPU or the slice)"),
        other => other.to_string(),
    }
}

/// A raw GPU-instance handle.
type GpuInstance = nvml_wrapper_sys::bindings::nvmlGpuInstance_t;

/// Every GPU instance of a device: handle, placement start and size.
fn gpu_instances(
    nvml: &Nvml,
    device: &Device<'_>,
    profiles: &[nvml_wrapper::struct_wrappers::device::ProfileInfo],
) -> Result<Vec<(GpuInstance, u32, u32)>, String> {
    let lib = nvml.lib();
    let list = nvml_sym(lib.nvmlDeviceGetGpuInstances.as_ref()).map_err(|e| e.to_string())?;
    let get_info = nvml_sym(lib.nvmlGpuInstanceGetInfo.as_ref()).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for profile in profiles {
        // SAFETY: `device` is a live handle; the buffer holds MAX_INSTANCES handles, more than
        // any profile's instance count (7), as NVML requires; `count` and `info` are locals of
        // the declared types.
        unsafe {
            let mut buf = [std::ptr::null_mut(); MAX_INSTANCES];
            let mut count: c_uint = 0;
            let r = list(device.handle(), profile.id, buf.as_mut_ptr(), &mut count);
            if nvml_try(r).is_err() {
                continue; // a profile this GPU does not offer
            }
            for &gi in buf.iter().take(count as usize) {
                let mut info = MaybeUninit::zeroed();
                nvml_try(get_info(gi, info.as_mut_ptr())).map_err(|e| e.to_string())?;
                let info = info.assume_init();
                out.push((gi, info.placement.start, info.placement.size));
            }
        }
    }
    Ok(out)
}

/// Destroys a GPU instance's compute instances, then the GPU instance.
fn destroy_gpu_instance(nvml: &Nvml, gi: GpuInstance) -> Result<(), NvmlError> {
    let lib = nvml.lib();
    let profile_info = nvml_sym(lib.nvmlGpuInstanceGetComputeInstanceProfileInfo.as_ref())?;
    let list = nvml_sym(lib.nvmlGpuInstanceGetComputeInstances.as_ref())?;
    let destroy_ci = nvml_sym(lib.nvmlComputeInstanceDestroy.as_ref())?;
    let destroy_gi = nvml_sym(lib.nvmlGpuInstanceDestroy.as_ref())?;
    // SAFETY: `gi` was just listed by NVML for this device; buffers and out-parameters are
    // locals of the declared types, the handle buffer larger than any instance count.
    unsafe {
        for ci_profile in 0..CI_PROFILE_COUNT {
            let mut info = MaybeUninit::zeroed();
            if nvml_try(profile_info(
                gi,
                ci_profile,
                CI_ENGINE_SHARED,
                info.as_mut_ptr(),
            ))
            .is_err()
            {
                continue; // a compute profile larger than this instance
            }
            let info = info.assume_init();
            let mut buf = [std::ptr::null_mut(); MAX_INSTANCES];
            let mut count: c_uint = 0;
            nvml_try(list(gi, info.id, buf.as_mut_ptr(), &mut count))?;
            for &ci in buf.iter().take(count as usize) {
                nvml_try(destroy_ci(ci))?;
            }
        }
        nvml_try(destroy_gi(gi))
    }
}

/// Creates the GPU instance of `p` (driver profile id `id`) at its placement, and one compute
/// instance spanning it.
fn create_instance(
    nvml: &Nvml,
    device: &Device<'_>,
    p: &Placement,
    id: u32,
) -> Result<(), NvmlError> {
    let lib = nvml.lib();
    let create_gi = nvml_sym(lib.nvmlDeviceCreateGpuInstanceWithPlacement.as_ref())?;
    let profile_info = nvml_sym(lib.nvmlGpuInstanceGetComputeInstanceProfileInfo.as_ref())?;
    let create_ci = nvml_sym(lib.nvmlGpuInstanceCreateComputeInstance.as_ref())?;
    let destroy_gi = nvml_sym(lib.nvmlGpuInstanceDestroy.as_ref())?;
    let ci_profile = compute_profile(p.profile.compute).ok_or(NvmlError::InvalidArg)?;
    // SAFETY: `device` is a live handle; the placement is a local of the declared C type
    // (two `c_uint`s, zeroed then filled); out-parameters are locals of the declared types.
    unsafe {
        let mut placement = MaybeUninit::zeroed();
        let mut gi = std::ptr::null_mut();
        {
            let pl: *mut nvml_wrapper_sys::bindings::nvmlGpuInstancePlacement_t =
                placement.as_mut_ptr();
            (*pl).start = c_uint::from(p.start);
            (*pl).size = c_uint::from(p.profile.memory_slices);
        }
        nvml_try(create_gi(device.handle(), id, placement.as_ptr(), &mut gi))?;
        let mut info = MaybeUninit::zeroed();
        let made = nvml_try(profile_info(
            gi,
            ci_profile,
            CI_ENGINE_SHARED,
            info.as_mut_ptr(),
        ))
        .and_then(|()| {
            let info = info.assume_init();
            let mut ci = std::ptr::null_mut();
            nvml_try(create_ci(gi, info.id, &mut ci))
        });
        if let Err(e) = made {
            // A GPU instance without a compute instance is no usable device: undo it.
            let _ = nvml_try(destroy_gi(gi));
            return Err(e);
        }
    }
    Ok(())
}

/// The `NVML_COMPUTE_INSTANCE_PROFILE_*` value for a compute instance of `gpcs` GPCs.
fn compute_profile(gpcs: u8) -> Option<c_uint> {
    match gpcs {
        1 => Some(0),
        2 => Some(1),
        3 => Some(2),
        4 => Some(3),
        7 => Some(4),
        8 => Some(5),
        6 => Some(6),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_driver_means_no_gpus() {
        // This runs on machines without an NVIDIA driver (CI, laptops); on a GPU machine NVML
        // starts and discovery must at least not fail.
        match nvml() {
            Err(why) => assert!(!why.is_empty()),
            Ok(nvml) => {
                let gpus = discover(nvml);
                assert!(gpus.iter().all(|g| !g.simulated));
            }
        }
        // Asked again, the same answer without a second attempt (and a second log line).
        assert_eq!(nvml().is_ok(), nvml().is_ok());
    }

    #[test]
    fn placements_are_inferred_without_privileges() {
        let m = GpuModel::A100_40GB;
        assert_eq!(recognise_profile(m, 1, 4864).unwrap().name, "1g.5gb");
        assert_eq!(recognise_profile(m, 1, 9856).unwrap().name, "1g.10gb");
        assert_eq!(recognise_profile(m, 3, 19968).unwrap().name, "3g.20gb");
        assert_eq!(recognise_profile(m, 4, 19968).unwrap().name, "4g.20gb");
        assert!(recognise_profile(m, 5, 1).is_none());
        let slice = |profile: &str, start: u8, uuid: &str| MigDevice {
            profile: profile.into(),
            start,
            size: 0,
            memory_mib: 1,
            uuid: uuid.into(),
        };
        // A 3g known at 0; a 3g and a 1g unknown: the 3g can only go to 4, the 1g is left
        // nowhere (7 GPCs used), a second 1g cannot fit either.
        let known = vec![slice("3g.20gb", 0, "MIG-a")];
        let out = infer_placements(
            m,
            known,
            vec![slice("1g.5gb", 0, "MIG-c"), slice("3g.20gb", 0, "MIG-b")],
        );
        let got: Vec<String> = out
            .iter()
            .map(|s| format!("{}@{}", s.profile, s.start))
            .collect();
        assert_eq!(got, ["3g.20gb@0", "3g.20gb@4"]);
        // Seven unknown 1g slices fill the GPU, each at its own start.
        let unknown = (0..7)
            .map(|i| slice("1g.5gb", 0, &format!("MIG-{i}")))
            .collect();
        let out = infer_placements(m, vec![], unknown);
        let starts: std::collections::BTreeSet<u8> = out.iter().map(|s| s.start).collect();
        assert_eq!(starts.len(), 7);
        assert!(out.iter().all(|s| s.size == 1));
    }

    #[test]
    fn profiles_are_recognised_by_geometry() {
        let m = GpuModel::A100_40GB;
        assert_eq!(placed_profile(m, 19, 1, 1).unwrap().name, "1g.5gb");
        assert_eq!(placed_profile(m, 20, 1, 1).unwrap().name, "1g.5gb+me");
        // A driver numbering profiles 0..: geometry decides.
        assert_eq!(placed_profile(m, 0, 1, 1).unwrap().name, "1g.5gb");
        assert_eq!(placed_profile(m, 2, 3, 4).unwrap().name, "3g.20gb");
        assert_eq!(placed_profile(m, 1, 1, 2).unwrap().name, "1g.10gb");
        assert!(placed_profile(m, 9, 5, 4).is_none());
    }

    #[test]
    fn compute_profiles_follow_nvml() {
        assert_eq!(compute_profile(1), Some(0));
        assert_eq!(compute_profile(7), Some(4));
        assert_eq!(compute_profile(5), None);
        assert_eq!(metric(3, "utilization", 1.0).name, "gpu.3.utilization");
    }
}
