//! [`GpuModel`]: the MIG-capable GPUs escher has a profile table for, how to name them on a
//! command line (`a100-40gb`) and how to recognise them from an NVML product name
//! (`NVIDIA A100-SXM4-40GB`).
//!
//! Every model has 7 compute slices (GPCs) and 8 memory slices, as on the A100 and the H100
//! (NVIDIA MIG User Guide, "Supported MIG Profiles"); the H200 shares this geometry, as read
//! from its driver (see `tables.rs`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{MigError, Profile, tables};

/// A MIG-capable GPU model with a known profile table. Serialized as its name (`a100-40gb`).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum GpuModel {
    /// NVIDIA A100 with 40 GB (SXM4 or PCIe): the GPU of both MIG papers.
    A100_40GB,
    /// NVIDIA A100 with 80 GB (SXM4 or PCIe).
    A100_80GB,
    /// NVIDIA H100 with 80 GB (SXM5 or PCIe; not the 94 GB NVL).
    H100_80GB,
    /// NVIDIA H200 with 141 GB; its table is partly assumed (see `tables.rs`).
    H200_141GB,
}

impl GpuModel {
    /// Every model, in declaration order.
    pub const ALL: [GpuModel; 4] = [
        GpuModel::A100_40GB,
        GpuModel::A100_80GB,
        GpuModel::H100_80GB,
        GpuModel::H200_141GB,
    ];

    /// The model's command-line name (`a100-40gb`), which [`GpuModel::from_str`] reads back.
    pub fn name(self) -> &'static str {
        match self {
            GpuModel::A100_40GB => "a100-40gb",
            GpuModel::A100_80GB => "a100-80gb",
            GpuModel::H100_80GB => "h100-80gb",
            GpuModel::H200_141GB => "h200-141gb",
        }
    }

    /// Nominal GPU memory in GB.
    pub fn memory_gb(self) -> u32 {
        match self {
            GpuModel::A100_40GB => 40,
            GpuModel::A100_80GB | GpuModel::H100_80GB => 80,
            GpuModel::H200_141GB => 141,
        }
    }

    /// Compute slices (GPCs) of the whole GPU: 7.
    pub fn compute_slices(self) -> u8 {
        7
    }

    /// Memory slices of the whole GPU: 8. Placements are counted on this axis.
    pub fn memory_slices(self) -> u8 {
        8
    }

    /// Every profile of the model, base and extra, in `nvidia-smi mig -lgip` order.
    pub fn profiles(self) -> &'static [Profile] {
        match self {
            GpuModel::A100_40GB => &tables::A100_40GB,
            GpuModel::A100_80GB => &tables::A100_80GB,
            GpuModel::H100_80GB => &tables::H100_80GB,
            GpuModel::H200_141GB => &tables::H200_141GB,
        }
    }

    /// The five base profiles (1g, 2g, 3g, 4g, 7g): the ones the MIG papers use and that
    /// [`maximal_layouts`](super::maximal_layouts) enumerates.
    pub fn base_profiles(self) -> impl Iterator<Item = &'static Profile> {
        self.profiles().iter().filter(|p| p.base)
    }

    /// The profile with this name (ASCII case-insensitive), if the model has one.
    pub fn profile(self, name: &str) -> Option<&'static Profile> {
        self.profiles()
            .iter()
            .find(|p| p.name.eq_ignore_ascii_case(name))
    }

    /// The profile with this NVIDIA profile id, if the model has one.
    pub fn profile_by_id(self, id: u32) -> Option<&'static Profile> {
        self.profiles().iter().find(|p| p.id == id)
    }

    /// Like [`GpuModel::profile`], but failing with an error that lists the valid names.
    pub fn profile_named(self, name: &str) -> Result<&'static Profile, MigError> {
        self.profile(name).ok_or_else(|| MigError::UnknownProfile {
            model: self,
            profile: name.to_string(),
            valid: self
                .profiles()
                .iter()
                .map(|p| p.name)
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    /// Whether `profile` is one of this model's profiles.
    pub fn has_profile(self, profile: &Profile) -> bool {
        self.profiles()
            .iter()
            .any(|p| std::ptr::eq(p, profile) || p == profile)
    }

    /// The model of an NVML product name (`nvmlDeviceGetName`), such as
    /// `NVIDIA A100-SXM4-40GB`, `NVIDIA A100 80GB PCIe`, `NVIDIA H100 80GB HBM3`,
    /// `NVIDIA H100 PCIe` or `NVIDIA H200`.
    ///
    /// GPUs with other memory sizes and hence other MIG tables (the A30, the 94 GB H100 NVL,
    /// the 96 GB GH200) are refused.
    pub fn from_product_name(product: &str) -> Result<GpuModel, MigError> {
        let p = product.to_ascii_uppercase();
        let has = |s: &str| p.contains(s);
        let model = if has("A100") && has("40GB") {
            Some(GpuModel::A100_40GB)
        } else if has("A100") && has("80GB") {
            Some(GpuModel::A100_80GB)
        } else if has("H100") && !has("NVL") && (has("80GB") || has("PCIE")) {
            Some(GpuModel::H100_80GB)
        } else if has("H200") && !has("GH200") {
            Some(GpuModel::H200_141GB)
        } else {
            None
        };
        model.ok_or_else(|| MigError::UnsupportedProduct {
            product: product.to_string(),
        })
    }
}

impl fmt::Display for GpuModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl From<GpuModel> for String {
    fn from(m: GpuModel) -> String {
        m.name().to_string()
    }
}

impl TryFrom<String> for GpuModel {
    type Error = MigError;
    fn try_from(s: String) -> Result<GpuModel, MigError> {
        s.parse()
    }
}

impl FromStr for GpuModel {
    type Err = MigError;

    /// Reads `a100-40gb`, `a100-80gb`, `h100-80gb` or `h200-141gb`, ignoring ASCII case and
    /// accepting `_` for `-`.
    fn from_str(s: &str) -> Result<GpuModel, MigError> {
        let wanted = s.trim().to_ascii_lowercase().replace('_', "-");
        GpuModel::ALL
            .into_iter()
            .find(|m| m.name() == wanted)
            .ok_or_else(|| MigError::UnknownModel {
                input: s.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_case_insensitively() {
        for m in GpuModel::ALL {
            assert_eq!(m.name().parse::<GpuModel>().unwrap(), m);
            assert_eq!(m.name().to_uppercase().parse::<GpuModel>().unwrap(), m);
            assert_eq!(m.to_string(), m.name());
        }
        assert_eq!(
            "A100_40GB".parse::<GpuModel>().unwrap(),
            GpuModel::A100_40GB
        );
        let err = "a30-24gb".parse::<GpuModel>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown GPU model \"a30-24gb\": expected one of a100-40gb, a100-80gb, h100-80gb, \
             h200-141gb"
        );
    }

    #[test]
    fn product_names() {
        let cases = [
            ("NVIDIA A100-SXM4-40GB", GpuModel::A100_40GB),
            ("NVIDIA A100-PCIE-40GB", GpuModel::A100_40GB),
            ("NVIDIA A100-SXM4-80GB", GpuModel::A100_80GB),
            ("NVIDIA A100 80GB PCIe", GpuModel::A100_80GB),
            ("NVIDIA H100 80GB HBM3", GpuModel::H100_80GB),
            ("NVIDIA H100 PCIe", GpuModel::H100_80GB),
            ("NVIDIA H200", GpuModel::H200_141GB),
        ];
        for (name, model) in cases {
            assert_eq!(GpuModel::from_product_name(name).unwrap(), model, "{name}");
        }
        for name in [
            "NVIDIA A30",
            "NVIDIA H100 NVL",
            "NVIDIA GH200 480GB",
            "Tesla T4",
        ] {
            let err = GpuModel::from_product_name(name).unwrap_err();
            assert!(matches!(err, MigError::UnsupportedProduct { .. }), "{name}");
        }
    }

    #[test]
    fn geometry_and_lookups() {
        for m in GpuModel::ALL {
            assert_eq!((m.compute_slices(), m.memory_slices()), (7, 8));
            let full = m.profiles().last().unwrap();
            assert_eq!(
                (full.compute, full.memory_slices, full.memory_gb),
                (7, 8, m.memory_gb())
            );
        }
        let m = GpuModel::A100_40GB;
        assert_eq!(m.profile("3G.20GB").unwrap().id, 9);
        assert_eq!(m.profile_by_id(15).unwrap().name, "1g.10gb");
        assert!(m.has_profile(m.profile("7g.40gb").unwrap()));
        assert!(!m.has_profile(GpuModel::H100_80GB.profile("7g.80gb").unwrap()));
        assert_eq!(
            m.profile_named("2g.20gb").unwrap_err().to_string(),
            "a100-40gb has no MIG profile \"2g.20gb\"; its profiles are 1g.5gb, 1g.5gb+me, \
             1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb"
        );
    }
}
