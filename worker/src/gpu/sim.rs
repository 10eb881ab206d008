//! Simulated GPUs (`escher-worker --sim-gpu SPEC`), for machines without any: reported exactly
//! like real ones, but labelled `gpu.simulated=true`, with stable fake UUIDs.
//!
//! ```text
//! spec   = model [ ":mig=" layout ]     ; a100-40gb | a100-80gb | h100-80gb | h200-141gb
//! layout = see escher_proto::mig::Layout::parse (may be empty: MIG mode, no slices yet)
//! ```
//!
//! `h100-80gb` is a whole GPU not in MIG mode; `a100-40gb:mig=3g.20gb,2g.10gb,1g.5gb,1g.5gb`
//! is an A100 in MIG mode with those four slices, placed as the MIG model places them. A
//! layout that is not legal for the model is refused with the model's reason.
//!
//! UUIDs are derived from the worker's name, the GPU's index and (for a slice) its placement,
//! so the same worker reports the same devices after a restart, and a slice that a
//! reconfiguration keeps keeps its UUID. They look like NVIDIA's: `GPU-` or `MIG-` and 32 hex
//! digits in the 8-4-4-4-12 grouping.
//!
//! **Kept across restarts, as a driver keeps them.** A real GPU's MIG instances outlive the
//! worker that made them; so do a simulated GPU's, where the worker has a state directory
//! (`escher-worker` always has one; `--state-dir`): each reconfiguration's outcome is written to
//! `sim-gpus/INDEX` there ([`SIM_STATE_DIR`], the GPU's spec as text), and a worker that starts
//! again finds the GPU as it was left, not as `--sim-gpu` first described it (the flag's layout
//! is that of a GPU never reconfigured). The kept layout is used only for the same model in MIG
//! mode; anything else in the file (another model, a whole GPU, text that does not parse) is
//! left aside with a warning and the flag's layout is used. A worker with no state directory
//! (an embedded `LocalCluster`'s) keeps its GPUs in memory only: a fresh machine each start.
//!
//! **Injected driver errors, for tests** ([`SIM_MIG_FAIL_VAR`]): with
//! `ESCHER_SIM_MIG_FAIL=GPU:PHASE` in the worker's environment (`0:create`; several
//! comma-separated), every reconfiguration of simulated GPU `GPU` fails at `PHASE` (`destroy`,
//! `create`, `library` or `model`) as NVML would leave it: the phases before it done (a failure
//! at `create` leaves the destroyed instances gone and none created; at `library` or `model`
//! the new instances exist), and the error reported with the reconfiguration. A real GPU is
//! never affected.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use escher_proto::mig::{GpuModel, Layout, MigError};
use escher_proto::types::{GpuInfo, MigDevice};

/// One `--sim-gpu` specification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimGpuSpec {
    /// The GPU model.
    pub model: GpuModel,
    /// The MIG layout; `None` for a whole GPU not in MIG mode.
    pub mig: Option<Layout>,
}

/// Why a `--sim-gpu` specification was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimGpuError {
    /// The text after the model is not `:mig=LAYOUT`.
    #[error(
        "{spec:?}: after the model write nothing or :mig=LAYOUT, e.g. a100-40gb:mig=3g.20gb,4g.20gb"
    )]
    Syntax {
        /// The specification.
        spec: String,
    },
    /// The model or the layout is not valid.
    #[error("{spec:?}: {reason}")]
    Mig {
        /// The specification.
        spec: String,
        /// What the MIG model found wrong.
        reason: MigError,
    },
}

impl FromStr for SimGpuSpec {
    type Err = SimGpuError;

    fn from_str(s: &str) -> Result<SimGpuSpec, SimGpuError> {
        let spec = s.trim();
        let mig_err = |reason| SimGpuError::Mig {
            spec: spec.to_string(),
            reason,
        };
        let (model, rest) = spec.split_once(':').unwrap_or((spec, ""));
        let model: GpuModel = model.parse().map_err(mig_err)?;
        let mig = match rest.trim() {
            "" if !spec.contains(':') => None,
            rest => match rest.strip_prefix("mig=") {
                Some(layout) => Some(Layout::parse(model, layout).map_err(mig_err)?),
                None => {
                    return Err(SimGpuError::Syntax {
                        spec: spec.to_string(),
                    });
                }
            },
        };
        Ok(SimGpuSpec { model, mig })
    }
}

impl fmt::Display for SimGpuSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.mig {
            None => write!(f, "{}", self.model),
            Some(layout) => write!(f, "{}:mig={layout}", self.model),
        }
    }
}

/// The environment variable that injects driver errors into simulated GPUs' reconfigurations
/// (see the module doc).
pub const SIM_MIG_FAIL_VAR: &str = "ESCHER_SIM_MIG_FAIL";

/// A phase of a reconfiguration, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum SimPhase {
    Destroy,
    Create,
    Library,
    Model,
}

/// The phase at which reconfigurations of simulated GPU `index` fail, from `value` (the
/// variable's text): `None` when it names no such GPU or cannot be read (a typo injects
/// nothing, and says so in the worker's log).
pub(crate) fn injected_failure(value: &str, index: u32) -> Option<SimPhase> {
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let parsed = entry.split_once(':').and_then(|(g, phase)| {
            let phase = match phase {
                "destroy" => SimPhase::Destroy,
                "create" => SimPhase::Create,
                "library" => SimPhase::Library,
                "model" => SimPhase::Model,
                _ => return None,
            };
            Some((g.parse::<u32>().ok()?, phase))
        });
        match parsed {
            Some((g, phase)) if g == index => return Some(phase),
            Some(_) => {}
            None => tracing::warn!(
                entry,
                "{SIM_MIG_FAIL_VAR}: write GPU:PHASE (PHASE: destroy, create, library or model); ignored"
            ),
        }
    }
    None
}

/// The layout a simulated GPU is left with when its reconfiguration from `from` to `to` fails
/// at `phase`: before `create`, unchanged; at `create`, only what both keep; later, `to`.
pub(crate) fn left_after(from: &Layout, to: &Layout, phase: SimPhase) -> Layout {
    match phase {
        SimPhase::Destroy => from.clone(),
        SimPhase::Create => {
            let kept: Vec<_> = from
                .placements()
                .iter()
                .filter(|p| to.placements().contains(p))
                .copied()
                .collect();
            Layout::from_placements(from.model(), kept).unwrap_or_else(|_| from.clone())
        }
        SimPhase::Library | SimPhase::Model => to.clone(),
    }
}

/// The directory, in a worker's state directory, where its simulated GPUs keep their MIG
/// layouts across restarts (see the module doc).
pub const SIM_STATE_DIR: &str = "sim-gpus";

/// Simulated GPU `index`, `spec` by the flag, as the worker's state directory `dir` says it
/// was left: its kept layout where the file holds one of the same model in MIG mode, else
/// `spec` (with a warning for a file that could not be used).
pub(crate) fn restored(dir: &Path, index: u32, spec: &SimGpuSpec) -> SimGpuSpec {
    let path = dir.join(SIM_STATE_DIR).join(index.to_string());
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return spec.clone(),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read a simulated GPU's kept MIG layout; it starts as --sim-gpu says");
            return spec.clone();
        }
    };
    match text.trim().parse::<SimGpuSpec>() {
        Ok(kept) if kept.model == spec.model && kept.mig.is_some() && spec.mig.is_some() => {
            if kept != *spec {
                tracing::info!(gpu = index, kept = %kept, flag = %spec, "a simulated GPU keeps the MIG layout it was left with, as a real GPU's driver does");
            }
            kept
        }
        Ok(kept) => {
            tracing::warn!(gpu = index, path = %path.display(), kept = %kept, flag = %spec, "a simulated GPU's kept layout is not of the GPU --sim-gpu describes; it starts as the flag says");
            spec.clone()
        }
        Err(e) => {
            tracing::warn!(gpu = index, path = %path.display(), error = %e, "a simulated GPU's kept layout does not parse; it starts as --sim-gpu says");
            spec.clone()
        }
    }
}

/// Writes simulated GPU `index`'s spec, `spec`, to the state directory `dir` (whole or not at
/// all: a temporary file renamed over the old one), for the worker's next start.
pub(crate) fn remember(dir: &Path, index: u32, spec: &SimGpuSpec) -> std::io::Result<()> {
    let kept = dir.join(SIM_STATE_DIR);
    std::fs::create_dir_all(&kept)?;
    let path = kept.join(index.to_string());
    let tmp = kept.join(format!(".{index}.tmp"));
    std::fs::write(&tmp, format!("{spec}\n"))?;
    std::fs::rename(&tmp, &path)
}

/// The NVML product name a simulated GPU reports.
pub(crate) fn product_name(model: GpuModel) -> &'static str {
    match model {
        GpuModel::A100_40GB => "NVIDIA A100-SXM4-40GB",
        GpuModel::A100_80GB => "NVIDIA A100-SXM4-80GB",
        GpuModel::H100_80GB => "NVIDIA H100 80GB HBM3",
        GpuModel::H200_141GB => "NVIDIA H200",
    }
}

/// The simulated GPU `index` of worker `worker`.
pub(crate) fn gpu_info(worker: &str, index: u32, spec: &SimGpuSpec) -> GpuInfo {
    let base = GpuInfo {
        index,
        uuid: fake_uuid("GPU", &[worker, &index.to_string()]),
        product: product_name(spec.model).to_string(),
        model: Some(spec.model),
        memory_mib: u64::from(spec.model.memory_gb()) * 1024,
        mig_enabled: spec.mig.is_some(),
        simulated: true,
        slices: Vec::new(),
    };
    match &spec.mig {
        Some(layout) => with_layout(worker, &base, layout),
        None => base,
    }
}

/// The simulated GPU `gpu` once its slices are `layout` (a slice's UUID depends only on the
/// worker, the GPU and its placement).
pub(crate) fn with_layout(worker: &str, gpu: &GpuInfo, layout: &Layout) -> GpuInfo {
    let index = gpu.index.to_string();
    let slices = layout
        .placements()
        .iter()
        .map(|p| {
            let start = p.start.to_string();
            MigDevice {
                profile: p.profile.name.to_string(),
                start: p.start,
                size: p.profile.memory_slices,
                memory_mib: p
                    .profile
                    .memory_mib
                    .map_or(u64::from(p.profile.memory_gb) * 1024, u64::from),
                uuid: fake_uuid("MIG", &[worker, &index, p.profile.name, &start]),
            }
        })
        .collect();
    GpuInfo {
        slices,
        ..gpu.clone()
    }
}

/// `PREFIX-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` from a 128-bit FNV-1a hash of `parts`,
/// finished with MurmurHash3's 64-bit mixer so that neighbours (slices 2 and 3) look nothing
/// alike. A fixed function, so UUIDs never change between builds or Rust versions.
pub(crate) fn fake_uuid(prefix: &str, parts: &[&str]) -> String {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;
    let mut h = OFFSET;
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            h = (h ^ 0x1f).wrapping_mul(PRIME); // unit separator between parts
        }
        for b in part.bytes() {
            h = (h ^ u128::from(b)).wrapping_mul(PRIME);
        }
    }
    let (lo, hi) = (h as u64, (h >> 64) as u64);
    let top = fmix64(lo ^ hi.rotate_left(32));
    let bottom = fmix64(hi ^ top);
    let hex = format!("{top:016x}{bottom:016x}");
    format!(
        "{prefix}-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// MurmurHash3's finalizer: every input bit flips about half the output bits.
fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51afd7ed558ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ceb9fe1a85ec53);
    k ^ (k >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(s: &str) -> String {
        s.parse::<SimGpuSpec>().unwrap_err().to_string()
    }

    #[test]
    fn injected_failures_name_a_gpu_and_a_phase() {
        assert_eq!(injected_failure("0:create", 0), Some(SimPhase::Create));
        assert_eq!(injected_failure("0:create", 1), None);
        assert_eq!(
            injected_failure("1:destroy, 0:model", 0),
            Some(SimPhase::Model)
        );
        assert_eq!(injected_failure("0:boot,x:create", 0), None);
        let m = GpuModel::A100_40GB;
        let from = Layout::parse(m, "3g.20gb@4,1g.5gb@0").unwrap();
        let to = Layout::parse(m, "3g.20gb@4,2g.10gb@0").unwrap();
        assert_eq!(left_after(&from, &to, SimPhase::Destroy), from);
        assert_eq!(
            left_after(&from, &to, SimPhase::Create).to_string(),
            "3g.20gb@4"
        );
        assert_eq!(left_after(&from, &to, SimPhase::Library), to);
    }

    #[test]
    fn a_kept_layout_of_the_same_model_outlives_the_worker_and_anything_else_is_left_aside() {
        let dir = tempfile::tempdir().unwrap();
        let flag: SimGpuSpec = "a100-40gb:mig=".parse().unwrap();
        // Nothing kept yet: the flag's layout.
        assert_eq!(restored(dir.path(), 0, &flag), flag);
        let made: SimGpuSpec = "a100-40gb:mig=3g.20gb@4".parse().unwrap();
        remember(dir.path(), 0, &made).unwrap();
        assert_eq!(restored(dir.path(), 0, &flag), made);
        // Another GPU index keeps nothing of GPU 0's.
        assert_eq!(restored(dir.path(), 1, &flag), flag);
        // Another model, a whole GPU, or text that does not parse: the flag wins.
        let h100: SimGpuSpec = "h100-80gb:mig=".parse().unwrap();
        assert_eq!(restored(dir.path(), 0, &h100), h100);
        let whole: SimGpuSpec = "a100-40gb".parse().unwrap();
        assert_eq!(restored(dir.path(), 0, &whole), whole);
        std::fs::write(dir.path().join(SIM_STATE_DIR).join("0"), "a100-40gb:mig=9g").unwrap();
        assert_eq!(restored(dir.path(), 0, &flag), flag);
    }

    #[test]
    fn legal_specs() {
        let s: SimGpuSpec = "a100-40gb:mig=3g.20gb,2g.10gb,1g.5gb,1g.5gb"
            .parse()
            .unwrap();
        assert_eq!(s.model, GpuModel::A100_40GB);
        assert_eq!(
            s.to_string(),
            "a100-40gb:mig=2g.10gb@0,1g.5gb@2,1g.5gb@3,3g.20gb@4"
        );
        let whole: SimGpuSpec = "h100-80gb".parse().unwrap();
        assert_eq!((whole.model, whole.mig), (GpuModel::H100_80GB, None));
        let empty: SimGpuSpec = "A100-80GB:mig=".parse().unwrap();
        assert!(empty.mig.unwrap().is_empty());
        let back: SimGpuSpec = s.to_string().parse().unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn illegal_specs_say_why() {
        assert_eq!(
            err("a30-24gb"),
            "\"a30-24gb\": unknown GPU model \"a30-24gb\": expected one of a100-40gb, \
             a100-80gb, h100-80gb, h200-141gb"
        );
        assert_eq!(
            err("a100-40gb:1g.5gb"),
            "\"a100-40gb:1g.5gb\": after the model write nothing or :mig=LAYOUT, e.g. \
             a100-40gb:mig=3g.20gb,4g.20gb"
        );
        assert_eq!(
            err("a100-40gb:mig=4g.20gb,4g.20gb"),
            "\"a100-40gb:mig=4g.20gb,4g.20gb\": layout entry 2 (\"4g.20gb\"): 4g.20gb: at \
             most 1 instance(s) of this profile fit on one GPU and the layout already has 1"
        );
        assert!(err("h100-80gb:mig=1g.5gb").contains("h100-80gb has no MIG profile \"1g.5gb\""));
        assert!(err("a100-40gb:mig=1g.5gb@1,3g.20gb@0").contains("overlaps 1g.5gb@1"));
    }

    /// `fake_uuid("GPU", &["box", "0"])`, recorded when the function was written.
    const PINNED: &str = "GPU-9c866d9b-4ad3-8da8-0bd3-22f7a1a8e474";

    #[test]
    fn fake_uuids_are_stable_and_look_real() {
        let a = fake_uuid("GPU", &["w1", "0"]);
        assert_eq!(a, fake_uuid("GPU", &["w1", "0"]));
        assert_ne!(a, fake_uuid("GPU", &["w1", "1"]));
        assert_ne!(a, fake_uuid("GPU", &["w2", "0"]));
        assert_ne!(
            fake_uuid("GPU", &["w1", "0"]),
            fake_uuid("GPU", &["w10", ""])
        );
        assert_eq!(a.len(), 4 + 36);
        assert!(a.starts_with("GPU-"));
        assert_eq!(a.matches('-').count(), 5);
        assert!(escher_proto::types::gpu_identity(&a).is_some());
        // Neighbouring slices differ from the first digits on.
        let s2 = fake_uuid("MIG", &["w1", "0", "1g.5gb", "2"]);
        let s3 = fake_uuid("MIG", &["w1", "0", "1g.5gb", "3"]);
        assert_ne!(s2[..12], s3[..12]);
        // Pinned: the function must never change (UUIDs outlive worker restarts).
        assert_eq!(fake_uuid("GPU", &["box", "0"]), PINNED);
    }

    #[test]
    fn simulated_gpus_report_like_real_ones() {
        let spec: SimGpuSpec = "a100-40gb:mig=3g.20gb,1g.5gb,1g.5gb".parse().unwrap();
        let gpu = gpu_info("w", 2, &spec);
        assert_eq!((gpu.index, gpu.simulated, gpu.mig_enabled), (2, true, true));
        assert_eq!(gpu.product, "NVIDIA A100-SXM4-40GB");
        let placements: Vec<String> = gpu.slices.iter().map(|s| s.placement_text()).collect();
        assert_eq!(placements, ["1g.5gb@0", "1g.5gb@1", "3g.20gb@4"]);
        assert_eq!(gpu.slices[2].memory_mib, 19968);
        assert_eq!(gpu.layout().unwrap().unwrap(), spec.mig.clone().unwrap());
        // A slice that a new layout keeps keeps its UUID; a new one gets a new UUID.
        let next = Layout::parse(GpuModel::A100_40GB, "3g.20gb@4,2g.10gb@0").unwrap();
        let after = with_layout("w", &gpu, &next);
        assert_eq!(after.slices[1].uuid, gpu.slices[2].uuid);
        assert!(!gpu.slices.iter().any(|s| s.uuid == after.slices[0].uuid));
        let whole = gpu_info("w", 0, &"h100-80gb".parse().unwrap());
        assert!(!whole.mig_enabled && whole.slices.is_empty());
        assert_eq!(whole.memory_mib, 80 * 1024);
    }
}
