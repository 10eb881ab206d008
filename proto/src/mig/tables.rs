//! The MIG profile tables of the GPU models escher knows, as static data.
//!
//! Every table follows NVIDIA's conventions: profile ids as `nvidia-smi mig -lgip` prints
//! them, placements as `nvidia-smi mig -lgipp` prints them (`{starts}:size` on 8 memory slices,
//! not on the 7 compute slices). The figures come from these sources:
//!
//! - **A100-SXM4-40GB**: placements from the NVIDIA MIG User Guide's `-lgipp` output
//!   (`19 {0..6}:1`, `20 {0..6}:1`, `15 {0,2,4,6}:2`, `14 {0,2,4}:2`, `9 {0,4}:4`, `5 {0}:4`,
//!   `0 {0}:8`); memory in MiB and instance counts from NVIDIA go-nvml's
//!   `pkg/nvml/mock/gpus/a100.go`. The five base sizes match MIGM §4.1 (1/7 and 5 GB, 2/7 and
//!   10 GB, 3/7 and 20 GB, 4/7 and 20 GB, the full GPU).
//! - **A100-SXM4-80GB**: the names from the MIG User Guide ("1g.10gb, 1g.10gb+me, 1g.20gb,
//!   2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"), memory and instance counts from the go-nvml mock,
//!   placements as on the 40GB board.
//! - **H100 80GB HBM3**: a real `nvidia-smi mig -lgip` transcript (ids, instance counts),
//!   placements as on the A100 (NVIDIA k8s-test-infra `docs/mig.md`: "h100's 1g.20gb is four
//!   starts of size 2"). **Checked on a real H100 80GB HBM3** (driver 580.159.04, 2026-11-26,
//!   `scripts/real-gpu-check.sh`): `escher-worker --detect` read the driver's table through NVML
//!   and every id, GPC count, instance count and placement agreed with this one; memory in MiB
//!   is the driver's from that reading.
//! - **H200 141GB** (`NVIDIA H200`): the names from the NVIDIA MIG User Guide ("Supported MIG
//!   Profiles"); **everything else read on a real H200** (driver 580.159.04, 2026-11-26,
//!   `scripts/real-gpu-check.sh`, MIG mode off): ids, GPCs, instance counts and placements are
//!   the H100's, memory in MiB is the driver's, and the driver offers a `1g.18gb+me` (id 20)
//!   that the sources did not list. That reading corrected two of our earlier assumptions: the
//!   `+me` profile exists, and `1g.18gb` has 16384 MiB, less than its name says
//!   (`nvidia-smi mig -lgip` prints 16.00 GiB).
//!
//! Profiles are listed in `-lgip` order (small to large).

use super::Profile;

const EVERY_1G: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
const EVEN: &[u8] = &[0, 2, 4, 6];
const EVEN_2G: &[u8] = &[0, 2, 4];
const HALVES: &[u8] = &[0, 4];
const FIRST: &[u8] = &[0];

/// One row of a table.
#[allow(clippy::too_many_arguments)]
const fn row(
    name: &'static str,
    id: u32,
    compute: u8,
    memory_slices: u8,
    memory_gb: u32,
    memory_mib: Option<u32>,
    starts: &'static [u8],
    max_instances: u8,
) -> Profile {
    Profile {
        name,
        id,
        compute,
        memory_slices,
        memory_gb,
        memory_mib,
        starts,
        max_instances,
        base: !matches!(id, 15 | 20),
    }
}

/// A100-SXM4-40GB (also the A100 PCIe 40GB).
pub(super) static A100_40GB: [Profile; 7] = [
    row("1g.5gb", 19, 1, 1, 5, Some(4864), EVERY_1G, 7),
    row("1g.5gb+me", 20, 1, 1, 5, Some(4864), EVERY_1G, 1),
    row("1g.10gb", 15, 1, 2, 10, Some(9856), EVEN, 4),
    row("2g.10gb", 14, 2, 2, 10, Some(9856), EVEN_2G, 3),
    row("3g.20gb", 9, 3, 4, 20, Some(19968), HALVES, 2),
    row("4g.20gb", 5, 4, 4, 20, Some(19968), FIRST, 1),
    row("7g.40gb", 0, 7, 8, 40, Some(40192), FIRST, 1),
];

/// A100-SXM4-80GB (also the A100 80GB PCIe).
pub(super) static A100_80GB: [Profile; 7] = [
    row("1g.10gb", 19, 1, 1, 10, Some(9856), EVERY_1G, 7),
    row("1g.10gb+me", 20, 1, 1, 10, Some(9856), EVERY_1G, 1),
    row("1g.20gb", 15, 1, 2, 20, Some(19968), EVEN, 4),
    row("2g.20gb", 14, 2, 2, 20, Some(19968), EVEN_2G, 3),
    row("3g.40gb", 9, 3, 4, 40, Some(40192), HALVES, 2),
    row("4g.40gb", 5, 4, 4, 40, Some(40192), FIRST, 1),
    row("7g.80gb", 0, 7, 8, 80, Some(80384), FIRST, 1),
];

/// H100 80GB (SXM5 HBM3 and PCIe).
pub(super) static H100_80GB: [Profile; 7] = [
    row("1g.10gb", 19, 1, 1, 10, Some(9984), EVERY_1G, 7),
    row("1g.10gb+me", 20, 1, 1, 10, Some(9984), EVERY_1G, 1),
    row("1g.20gb", 15, 1, 2, 20, Some(20096), EVEN, 4),
    row("2g.20gb", 14, 2, 2, 20, Some(20096), EVEN_2G, 3),
    row("3g.40gb", 9, 3, 4, 40, Some(40448), HALVES, 2),
    row("4g.40gb", 5, 4, 4, 40, Some(40448), FIRST, 1),
    row("7g.80gb", 0, 7, 8, 80, Some(81152), FIRST, 1),
];

/// H200 141GB, as the driver reports it (see the module doc).
pub(super) static H200_141GB: [Profile; 7] = [
    row("1g.18gb", 19, 1, 1, 18, Some(16384), EVERY_1G, 7),
    row("1g.18gb+me", 20, 1, 1, 18, Some(16384), EVERY_1G, 1),
    row("1g.35gb", 15, 1, 2, 35, Some(33280), EVEN, 4),
    row("2g.35gb", 14, 2, 2, 35, Some(33280), EVEN_2G, 3),
    row("3g.71gb", 9, 3, 4, 71, Some(71424), HALVES, 2),
    row("4g.71gb", 5, 4, 4, 71, Some(71424), FIRST, 1),
    row("7g.141gb", 0, 7, 8, 141, Some(143360), FIRST, 1),
];

#[cfg(test)]
mod tests {
    use super::super::{GpuModel, Profile};

    /// (name, id, GPCs, memory slices, GB, MiB, starts, max instances, base)
    type Row = (
        &'static str,
        u32,
        u8,
        u8,
        u32,
        Option<u32>,
        &'static [u8],
        u8,
        bool,
    );

    fn rows(model: GpuModel) -> Vec<Row> {
        model
            .profiles()
            .iter()
            .map(|p: &Profile| {
                (
                    p.name,
                    p.id,
                    p.compute,
                    p.memory_slices,
                    p.memory_gb,
                    p.memory_mib,
                    p.starts,
                    p.max_instances,
                    p.base,
                )
            })
            .collect()
    }

    const ALL7: &[u8] = &[0, 1, 2, 3, 4, 5, 6];

    #[test]
    fn a100_40gb_matches_lgipp_and_go_nvml() {
        assert_eq!(
            rows(GpuModel::A100_40GB),
            vec![
                ("1g.5gb", 19, 1, 1, 5, Some(4864), ALL7, 7, true),
                ("1g.5gb+me", 20, 1, 1, 5, Some(4864), ALL7, 1, false),
                (
                    "1g.10gb",
                    15,
                    1,
                    2,
                    10,
                    Some(9856),
                    &[0, 2, 4, 6][..],
                    4,
                    false
                ),
                ("2g.10gb", 14, 2, 2, 10, Some(9856), &[0, 2, 4][..], 3, true),
                ("3g.20gb", 9, 3, 4, 20, Some(19968), &[0, 4][..], 2, true),
                ("4g.20gb", 5, 4, 4, 20, Some(19968), &[0][..], 1, true),
                ("7g.40gb", 0, 7, 8, 40, Some(40192), &[0][..], 1, true),
            ]
        );
    }

    #[test]
    fn a100_80gb_matches_the_mig_guide_and_go_nvml() {
        assert_eq!(
            rows(GpuModel::A100_80GB),
            vec![
                ("1g.10gb", 19, 1, 1, 10, Some(9856), ALL7, 7, true),
                ("1g.10gb+me", 20, 1, 1, 10, Some(9856), ALL7, 1, false),
                (
                    "1g.20gb",
                    15,
                    1,
                    2,
                    20,
                    Some(19968),
                    &[0, 2, 4, 6][..],
                    4,
                    false
                ),
                (
                    "2g.20gb",
                    14,
                    2,
                    2,
                    20,
                    Some(19968),
                    &[0, 2, 4][..],
                    3,
                    true
                ),
                ("3g.40gb", 9, 3, 4, 40, Some(40192), &[0, 4][..], 2, true),
                ("4g.40gb", 5, 4, 4, 40, Some(40192), &[0][..], 1, true),
                ("7g.80gb", 0, 7, 8, 80, Some(80384), &[0][..], 1, true),
            ]
        );
    }

    #[test]
    fn h100_80gb_matches_the_lgip_transcript() {
        assert_eq!(
            rows(GpuModel::H100_80GB),
            vec![
                ("1g.10gb", 19, 1, 1, 10, Some(9984), ALL7, 7, true),
                ("1g.10gb+me", 20, 1, 1, 10, Some(9984), ALL7, 1, false),
                (
                    "1g.20gb",
                    15,
                    1,
                    2,
                    20,
                    Some(20096),
                    &[0, 2, 4, 6][..],
                    4,
                    false
                ),
                (
                    "2g.20gb",
                    14,
                    2,
                    2,
                    20,
                    Some(20096),
                    &[0, 2, 4][..],
                    3,
                    true
                ),
                ("3g.40gb", 9, 3, 4, 40, Some(40448), &[0, 4][..], 2, true),
                ("4g.40gb", 5, 4, 4, 40, Some(40448), &[0][..], 1, true),
                ("7g.80gb", 0, 7, 8, 80, Some(81152), &[0][..], 1, true),
            ]
        );
    }

    #[test]
    fn h200_matches_the_driver_on_the_h100_geometry() {
        let names: Vec<_> = GpuModel::H200_141GB
            .profiles()
            .iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(
            names,
            [
                "1g.18gb",
                "1g.18gb+me",
                "1g.35gb",
                "2g.35gb",
                "3g.71gb",
                "4g.71gb",
                "7g.141gb"
            ]
        );
        for p in GpuModel::H200_141GB.profiles() {
            let h100 = GpuModel::H100_80GB.profile_by_id(p.id).unwrap();
            assert_eq!(
                (
                    p.compute,
                    p.memory_slices,
                    p.starts,
                    p.max_instances,
                    p.base
                ),
                (
                    h100.compute,
                    h100.memory_slices,
                    h100.starts,
                    h100.max_instances,
                    h100.base
                ),
                "{p}"
            );
        }
        // `nvidia-smi mig -lgip` on an H200: 16.00, 32.50 and 69.75 GiB, and 140 for the GPU.
        let mib: Vec<_> = GpuModel::H200_141GB
            .profiles()
            .iter()
            .map(|p| p.memory_mib)
            .collect();
        let gib = |g: f64| Some((g * 1024.0) as u32);
        assert_eq!(
            mib,
            [
                gib(16.0),
                gib(16.0),
                gib(32.5),
                gib(32.5),
                gib(69.75),
                gib(69.75),
                gib(140.0)
            ]
        );
    }

    #[test]
    fn every_table_is_consistent() {
        for model in GpuModel::ALL {
            let base: Vec<_> = model.base_profiles().map(|p| p.id).collect();
            assert_eq!(base, [19, 14, 9, 5, 0], "{model}");
            for p in model.profiles() {
                // The name spells the GPCs and the nominal memory.
                let (g, rest) = p.name.split_once("g.").unwrap();
                assert_eq!(g.parse::<u8>().unwrap(), p.compute, "{p}");
                let gb = rest.trim_end_matches("+me").trim_end_matches("gb");
                assert_eq!(gb.parse::<u32>().unwrap(), p.memory_gb, "{p}");
                // Every placement fits in the 8 memory slices, starts ascend.
                assert!(p.starts.windows(2).all(|w| w[0] < w[1]), "{p}");
                for &s in p.starts {
                    assert!(s + p.memory_slices <= model.memory_slices(), "{p}@{s}");
                }
                assert!(p.compute <= model.compute_slices());
                assert!(usize::from(p.max_instances) <= p.starts.len());
            }
        }
    }
}
