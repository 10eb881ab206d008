//! GPUs and their MIG slices as workers report them ([`GpuInfo`], [`MigDevice`]), and how they
//! become resources and labels: the naming scheme every crate shares.
//!
//! # Resource names
//!
//! NVIDIA's k8s device plugin "mixed" strategy (NVIDIA/k8s-device-plugin, `--mig-strategy=mixed`:
//! one `nvidia.com/mig-<profile>` resource per profile), written in escher's name grammar
//! (segments of `[A-Za-z0-9._-]`, at most 63 bytes):
//!
//! | resource          | capacity on a node                  | what it is for                        |
//! |-------------------|-------------------------------------|---------------------------------------|
//! | `gpu`             | whole GPUs not in MIG mode          | any GPU; `gpu: 0.5` shares one device  |
//! | `gpu.<GPU-uuid>`  | 1 for each such GPU                 | pin a task to that one GPU            |
//! | `mig.<profile>`   | MIG devices of that profile         | any slice of the profile (`mig.1g.5gb`, `mig.1g.10gb.me`: `+` becomes `.`) |
//! | `mig.<MIG-uuid>`  | 1 for each MIG device               | pin a task to that one slice          |
//!
//! A GPU in MIG mode is reported only as its slices, never as `gpu`. The identities are
//! selectors for policies that must pick the device themselves (MIGM's placement, MIGRator's
//! bindings): request the class and the identity together (`gpu: 1, gpu.GPU-8e2b...: 1`, or
//! `mig.1g.5gb: 1, mig.MIG-41d0...: 1`), so that the class count stays right. The worker binds
//! a pinned task to exactly that device; an unpinned one gets any free device of its class. A
//! UUID character outside the grammar (old drivers' `MIG-GPU-<uuid>/1/0`) becomes `-` in the
//! name; the device itself keeps its real UUID, which is what `CUDA_VISIBLE_DEVICES` gets.
//!
//! # Node labels
//!
//! A node with GPUs is labelled `gpu.count` (physical GPUs, MIG mode or not), `gpu.model` (the
//! MIG model name such as `a100-40gb`, else the product name in lower case with `-` for
//! spaces; `mixed` when the GPUs differ), `gpu.mig` (how many are in MIG mode) and
//! `gpu.simulated` (`true` for `--sim-gpu`, else `false`).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{Amount, Labels, ResourceName, ResourceSet};
use crate::mig::{GpuModel, Layout, MigError, Placement};

/// The longest device UUID (in the name's segment) a resource name can carry: 63 bytes less the
/// `gpu.` or `mig.` prefix.
pub const MAX_DEVICE_SEGMENT: usize = 59;

/// One MIG device: a GPU instance with a compute instance spanning it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigDevice {
    /// The profile name as NVIDIA prints it (`1g.5gb`, `1g.10gb+me`).
    pub profile: String,
    /// The first memory slice it occupies.
    pub start: u8,
    /// How many memory slices it occupies.
    pub size: u8,
    /// Its memory in MiB.
    pub memory_mib: u64,
    /// Its UUID (`MIG-...`).
    pub uuid: String,
}

/// One GPU of a node, real or simulated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// Its NVML index on the node.
    pub index: u32,
    /// Its UUID (`GPU-...`).
    pub uuid: String,
    /// The product name NVML reports (`NVIDIA A100-SXM4-40GB`).
    pub product: String,
    /// The MIG model escher has a profile table for, if any.
    pub model: Option<GpuModel>,
    /// Its memory in MiB.
    pub memory_mib: u64,
    /// Whether it is in MIG mode.
    pub mig_enabled: bool,
    /// Whether it is simulated.
    pub simulated: bool,
    /// Its MIG devices, by start (empty unless in MIG mode).
    pub slices: Vec<MigDevice>,
}

/// A device a task holds, and how much of it (the whole device is [`Amount::ONE`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceHold {
    /// The device's UUID.
    pub uuid: String,
    /// How much of it.
    pub amount: Amount,
}

/// The resource-name segment for a device UUID: characters outside `[A-Za-z0-9._-]` become
/// `-`. `None` when the result cannot be a segment (empty, not starting with a letter or
/// digit, or longer than [`MAX_DEVICE_SEGMENT`]).
pub fn device_segment(uuid: &str) -> Option<String> {
    let seg: String = uuid
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let starts_well = seg
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric());
    (starts_well && seg.len() <= MAX_DEVICE_SEGMENT).then_some(seg)
}

/// `gpu.<uuid>`: the identity of a whole GPU.
pub fn gpu_identity(uuid: &str) -> Option<ResourceName> {
    ResourceName::new(&format!("gpu.{}", device_segment(uuid)?)).ok()
}

/// `mig.<uuid>`: the identity of one MIG device.
pub fn mig_identity(uuid: &str) -> Option<ResourceName> {
    ResourceName::new(&format!("mig.{}", device_segment(uuid)?)).ok()
}

/// `mig.<profile>` with `+` as `.`: the class of a MIG profile (the same text as
/// [`Profile::resource_name`](crate::mig::Profile::resource_name)).
pub fn mig_class(profile: &str) -> Option<ResourceName> {
    ResourceName::new(&format!("mig.{}", profile.replace('+', "."))).ok()
}

/// Whether a name is one of the GPU resources above: `gpu`, `gpu.*` or `mig.*`.
pub fn is_gpu_resource(name: &str) -> bool {
    name == "gpu" || name.starts_with("gpu.") || name.starts_with("mig.")
}

impl MigDevice {
    /// Its class resource, `mig.<profile>`.
    pub fn class(&self) -> Option<ResourceName> {
        mig_class(&self.profile)
    }

    /// Its identity resource, `mig.<uuid>`.
    pub fn identity(&self) -> Option<ResourceName> {
        mig_identity(&self.uuid)
    }

    /// `profile@start`, as a layout entry.
    pub fn placement_text(&self) -> String {
        format!("{}@{}", self.profile, self.start)
    }
}

impl GpuInfo {
    /// The MIG layout of its slices, for a GPU in MIG mode with a known model; `None` when the
    /// GPU is not in MIG mode or escher has no table for it. An error when the slices are not a
    /// legal layout of the model (which a real GPU never reports).
    pub fn layout(&self) -> Option<Result<Layout, MigError>> {
        let model = self.model.filter(|_| self.mig_enabled)?;
        let placements: Result<Vec<Placement>, MigError> = self
            .slices
            .iter()
            .map(|s| Ok(Placement::new(model.profile_named(&s.profile)?, s.start)))
            .collect();
        Some(placements.and_then(|p| Layout::from_placements(model, p)))
    }

    /// The name for the `gpu.model` label: the MIG model's name, else the product name in lower
    /// case with `-` for spaces and other characters a label value cannot hold.
    pub fn model_label(&self) -> String {
        match self.model {
            Some(m) => m.name().to_string(),
            None => {
                let name: String = self
                    .product
                    .trim()
                    .to_ascii_lowercase()
                    .chars()
                    .map(|c| {
                        if c.is_ascii_graphic() && !matches!(c, ',' | '=') {
                            c
                        } else {
                            '-'
                        }
                    })
                    .take(64)
                    .collect();
                if name.is_empty() {
                    "unknown".into()
                } else {
                    name
                }
            }
        }
    }

    /// The slice with this UUID.
    pub fn slice(&self, uuid: &str) -> Option<&MigDevice> {
        self.slices.iter().find(|s| s.uuid == uuid)
    }
}

/// The resources GPUs add to a node (see the module documentation), leaving out the devices
/// whose UUIDs are in `excluded` (slices being reconfigured). Devices whose UUID cannot be
/// named are left out too; discovery warns about them.
pub fn gpu_resources<'a>(
    gpus: impl IntoIterator<Item = &'a GpuInfo>,
    excluded: &BTreeSet<String>,
) -> ResourceSet {
    let mut counts: BTreeMap<ResourceName, u64> = BTreeMap::new();
    let mut add = |name: Option<ResourceName>| {
        if let Some(name) = name {
            *counts.entry(name).or_insert(0) += 1;
        }
    };
    for gpu in gpus {
        if !gpu.mig_enabled {
            if !excluded.contains(&gpu.uuid)
                && let Some(identity) = gpu_identity(&gpu.uuid)
            {
                add(Some(ResourceName::gpu()));
                add(Some(identity));
            }
            continue;
        }
        for slice in gpu.slices.iter().filter(|s| !excluded.contains(&s.uuid)) {
            if let (Some(class), Some(identity)) = (slice.class(), slice.identity()) {
                add(Some(class));
                add(Some(identity));
            }
        }
    }
    let mut set = ResourceSet::new();
    for (name, n) in counts {
        if let Ok(amount) = Amount::units(n) {
            set.insert(name, amount);
        }
    }
    set
}

/// The node labels GPUs add (see the module documentation); none without GPUs.
pub fn gpu_labels(gpus: &[GpuInfo]) -> Labels {
    let mut labels = Labels::new();
    let Some(first) = gpus.first() else {
        return labels;
    };
    let model = first.model_label();
    let model = if gpus.iter().all(|g| g.model_label() == model) {
        model
    } else {
        "mixed".to_string()
    };
    let mig = gpus.iter().filter(|g| g.mig_enabled).count();
    let simulated = gpus.iter().any(|g| g.simulated);
    for (key, value) in [
        ("gpu.count", gpus.len().to_string()),
        ("gpu.model", model),
        ("gpu.mig", mig.to_string()),
        ("gpu.simulated", simulated.to_string()),
    ] {
        // Keys are constant and values are digits, `true`/`false` or cleaned model names.
        let _ = labels.insert(key, &value);
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(profile: &str, start: u8, size: u8, uuid: &str) -> MigDevice {
        MigDevice {
            profile: profile.into(),
            start,
            size,
            memory_mib: 4864,
            uuid: uuid.into(),
        }
    }

    pub(crate) fn a100_mig() -> GpuInfo {
        GpuInfo {
            index: 0,
            uuid: "GPU-8e2b0a53-3d6b-4d2e-9f1f-2c7a1b9e0d11".into(),
            product: "NVIDIA A100-SXM4-40GB".into(),
            model: Some(GpuModel::A100_40GB),
            memory_mib: 40960,
            mig_enabled: true,
            simulated: false,
            slices: vec![
                slice("2g.10gb", 0, 2, "MIG-a"),
                slice("1g.5gb", 2, 1, "MIG-b"),
                slice("1g.5gb", 3, 1, "MIG-c"),
                slice("3g.20gb", 4, 4, "MIG-d"),
            ],
        }
    }

    fn h100_whole(index: u32, uuid: &str) -> GpuInfo {
        GpuInfo {
            index,
            uuid: uuid.into(),
            product: "NVIDIA H100 80GB HBM3".into(),
            model: Some(GpuModel::H100_80GB),
            memory_mib: 81559,
            mig_enabled: false,
            simulated: true,
            slices: vec![],
        }
    }

    #[test]
    fn device_names_fit_the_grammar() {
        let uuid = "GPU-8e2b0a53-3d6b-4d2e-9f1f-2c7a1b9e0d11";
        assert_eq!(
            gpu_identity(uuid).unwrap().as_str(),
            "gpu.GPU-8e2b0a53-3d6b-4d2e-9f1f-2c7a1b9e0d11"
        );
        let mig = "MIG-41d0c7e2-5b1a-5a8e-b0c3-6f4e2d1a9b77";
        assert_eq!(mig_identity(mig).unwrap().as_str(), format!("mig.{mig}"));
        assert!(mig_identity(mig).unwrap().is_physical());
        // Old drivers' MIG UUIDs carry '/': they become '-' in the name only.
        let old = "MIG-GPU-e91edf3b-b297-37c1-a2a7-7601c3238fa2/1/0";
        assert_eq!(
            mig_identity(old).unwrap().as_str(),
            "mig.MIG-GPU-e91edf3b-b297-37c1-a2a7-7601c3238fa2-1-0"
        );
        assert_eq!(device_segment(""), None);
        assert_eq!(device_segment("-x"), None);
        assert_eq!(device_segment(&"a".repeat(60)), None);
        assert_eq!(mig_class("1g.10gb+me").unwrap().as_str(), "mig.1g.10gb.me");
        for name in ["gpu", "gpu.GPU-1", "mig.1g.5gb", "mig.MIG-1"] {
            assert!(is_gpu_resource(name), "{name}");
        }
        for name in ["cpu", "gpux", "migrate", "ns/gpu-pool"] {
            assert!(!is_gpu_resource(name), "{name}");
        }
    }

    #[test]
    fn mixed_strategy_resources() {
        let gpus = [
            a100_mig(),
            h100_whole(1, "GPU-1111"),
            h100_whole(2, "GPU-2222"),
        ];
        let set = gpu_resources(&gpus, &BTreeSet::new());
        assert_eq!(
            set.to_string(),
            "gpu=2,gpu.GPU-1111=1,gpu.GPU-2222=1,mig.1g.5gb=2,mig.2g.10gb=1,mig.3g.20gb=1,\
             mig.MIG-a=1,mig.MIG-b=1,mig.MIG-c=1,mig.MIG-d=1"
        );
        let retiring = BTreeSet::from(["MIG-b".to_string(), "MIG-d".to_string()]);
        let set = gpu_resources(&gpus[..1], &retiring);
        assert_eq!(
            set.to_string(),
            "mig.1g.5gb=1,mig.2g.10gb=1,mig.MIG-a=1,mig.MIG-c=1"
        );
        assert!(gpu_resources(&[], &BTreeSet::new()).is_empty());
    }

    #[test]
    fn labels_describe_the_gpus() {
        assert!(gpu_labels(&[]).is_empty());
        let labels = gpu_labels(&[a100_mig()]);
        assert_eq!(
            labels.to_string(),
            "gpu.count=1,gpu.mig=1,gpu.model=a100-40gb,gpu.simulated=false"
        );
        let labels = gpu_labels(&[a100_mig(), h100_whole(1, "GPU-1")]);
        assert_eq!(labels.get("gpu.model"), Some("mixed"));
        assert_eq!(labels.get("gpu.simulated"), Some("true"));
        let t4 = GpuInfo {
            product: "Tesla T4".into(),
            model: None,
            ..h100_whole(0, "GPU-t4")
        };
        assert_eq!(t4.model_label(), "tesla-t4");
    }

    #[test]
    fn layouts_of_reported_slices() {
        let gpu = a100_mig();
        let layout = gpu.layout().unwrap().unwrap();
        assert_eq!(layout.to_string(), "2g.10gb@0,1g.5gb@2,1g.5gb@3,3g.20gb@4");
        assert!(h100_whole(0, "GPU-1").layout().is_none());
        let mut bad = a100_mig();
        bad.slices[1].start = 1;
        assert!(bad.layout().unwrap().is_err());
        assert_eq!(gpu.slice("MIG-c").unwrap().placement_text(), "1g.5gb@3");
    }
}
