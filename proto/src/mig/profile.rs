//! [`Profile`]: one MIG GPU-instance profile (`1g.5gb`, `3g.20gb`, ...) of one GPU model, with
//! its geometry on the GPU's 8 memory slices.
//!
//! The fields follow what `nvidia-smi mig -lgip` (profiles) and `nvidia-smi mig -lgipp`
//! (placements, printed as `{starts}:size`) report; the values themselves live in
//! `tables.rs`, which cites where each one comes from.

use std::fmt;
use std::ops::Range;

/// A MIG GPU-instance profile: how many GPCs and memory slices an instance takes, and at which
/// memory slices it may start.
///
/// A placement of the profile at start `s` occupies memory slices `s..s + memory_slices`
/// (NVML's `{start, size}`). The profile ids are the ones the driver publishes; they are the
/// same on every model here, but names are the stable way to refer to a profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Profile {
    /// The profile name, as NVIDIA prints it: `<GPCs>g.<GB>gb`, with `+me` for the variant that
    /// owns the media engines.
    pub name: &'static str,
    /// The GPU-instance profile id (`-lgip`'s `ID` column; `-cgi` takes it).
    pub id: u32,
    /// GPCs (compute slices, sevenths of the GPU) an instance takes.
    pub compute: u8,
    /// Memory slices (eighths of the GPU memory) an instance takes: `-lgipp`'s `size`.
    pub memory_slices: u8,
    /// Nominal memory in GB, as in the name.
    pub memory_gb: u32,
    /// Usable memory in MiB as the driver reports it, where the sources give it.
    pub memory_mib: Option<u32>,
    /// The memory slices an instance may start at: `-lgipp`'s `{starts}`, ascending.
    pub starts: &'static [u8],
    /// The most instances of this profile one GPU can hold (`-lgip`'s `Instances` total).
    pub max_instances: u8,
    /// Whether this is one of the five base profiles (ids 19, 14, 9, 5, 0) that exist on every
    /// MIG GPU here and that the MIG papers and the maximal-layout counts use; `false` for the
    /// `+me` variant (id 20) and the double-memory 1g profile (id 15).
    pub base: bool,
}

impl Profile {
    /// The escher resource name of an instance of this profile: `mig.` and the profile name,
    /// with `+` turned into `.` (`mig.1g.5gb`, `mig.1g.10gb.me`), following the NVIDIA k8s
    /// device plugin's "mixed" strategy (`nvidia.com/mig-1g.5gb`).
    pub fn resource_name(&self) -> String {
        format!("mig.{}", self.name.replace('+', "."))
    }

    /// The memory slices a placement at `start` occupies.
    pub fn slices_at(&self, start: u8) -> Range<u8> {
        start..start.saturating_add(self.memory_slices)
    }

    /// Whether `start` is one of the profile's legal starts (ignoring occupancy).
    pub fn is_legal_start(&self, start: u8) -> bool {
        self.starts.contains(&start)
    }

    /// The legal starts as text: `0, 4`.
    pub(super) fn starts_text(&self) -> String {
        join(self.starts.iter())
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// `a, b, c`.
pub(super) fn join<T: fmt::Display>(items: impl Iterator<Item = T>) -> String {
    items.map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::super::GpuModel;
    use crate::types::{ResourceKind, ResourceName};

    #[test]
    fn resource_names_follow_the_mixed_strategy_and_are_physical() {
        let m = GpuModel::A100_40GB;
        assert_eq!(m.profile("1g.5gb").unwrap().resource_name(), "mig.1g.5gb");
        assert_eq!(
            m.profile("1g.5gb+me").unwrap().resource_name(),
            "mig.1g.5gb.me"
        );
        for model in GpuModel::ALL {
            for p in model.profiles() {
                let name = ResourceName::new(&p.resource_name()).unwrap();
                assert_eq!(name.kind(), ResourceKind::Physical, "{name}");
            }
        }
    }

    #[test]
    fn slices_and_starts() {
        let p = GpuModel::A100_40GB.profile("3g.20gb").unwrap();
        assert_eq!(p.slices_at(4), 4..8);
        assert!(p.is_legal_start(0) && p.is_legal_start(4) && !p.is_legal_start(2));
        assert_eq!(p.starts_text(), "0, 4");
        assert_eq!(p.to_string(), "3g.20gb");
    }
}
