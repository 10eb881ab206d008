//! [`find_simulated_device`]: what a device a task was given on a simulated GPU is (its model,
//! its profile and its memory), read from the head's inventory (`Gpus`). Shared by `escher
//! sim-work` and the worker's built-in trainer actor, the two that run a simulated job.

use super::{GpuModel, Profile};
use crate::types::NodeGpus;

/// A device of a simulated GPU: a MIG slice, or a whole GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct SimDevice {
    /// Its UUID (`MIG-…` or `GPU-…`).
    pub uuid: String,
    /// The GPU's model.
    pub model: GpuModel,
    /// The profile it runs as (a whole GPU: its full-size profile).
    pub profile: &'static Profile,
    /// Its memory, MiB.
    pub memory_mib: u64,
}

/// The simulated device `uuid` among the nodes' GPUs; a device of a real GPU, or one the head
/// does not know, is refused with why.
pub fn find_simulated_device(nodes: &[NodeGpus], uuid: &str) -> Result<SimDevice, String> {
    for gpu in nodes.iter().flat_map(|n| &n.gpus).map(|g| &g.info) {
        let slice = gpu.slices.iter().find(|s| s.uuid == uuid);
        if gpu.uuid != uuid && slice.is_none() {
            continue;
        }
        if !gpu.simulated {
            return Err(format!(
                "device {uuid} is part of a real GPU ({}): a simulated job runs only on \
                 simulated ones (--sim-gpu); run the real program there",
                gpu.product
            ));
        }
        let Some(model) = gpu.model else {
            return Err(format!(
                "device {uuid}'s GPU ({}) has no MIG table",
                gpu.product
            ));
        };
        let (profile, memory_mib) = match slice {
            Some(s) => (
                model
                    .profile(&s.profile)
                    .ok_or_else(|| format!("slice {uuid} has unknown profile {}", s.profile))?,
                s.memory_mib,
            ),
            None => (full_profile(model)?, gpu.memory_mib),
        };
        return Ok(SimDevice {
            uuid: uuid.to_string(),
            model,
            profile,
            memory_mib,
        });
    }
    Err(format!(
        "no GPU or MIG slice {uuid} is known to the head (escher gpus lists them); was this \
         task given a device that has since been reconfigured?"
    ))
}

/// The profile a whole GPU runs as: the one with every GPC and memory slice.
fn full_profile(model: GpuModel) -> Result<&'static Profile, String> {
    model
        .profiles()
        .iter()
        .max_by_key(|p| (p.compute, p.memory_slices, p.base))
        .ok_or_else(|| format!("{model} has no MIG profiles"))
}
