//! Our MIG tables against the driver's: what `escher-worker --detect` prints for each GPU that
//! NVML can describe.
//!
//! escher schedules MIG slices with the profile tables in [`escher_proto::mig`] (ids, GPCs,
//! memory slices, starts, instance counts). On a real GPU the driver has its own; [`compare`]
//! lines the two up by profile id and lists every field where they differ, so an operator (or a
//! session with a real H100) sees at once whether escher's model of that GPU is right. It is
//! pure: `nvml.rs` reads the driver's table ([`DriverProfile`]), this file only compares.

use std::fmt;

use escher_proto::mig::{GpuModel, Profile};

/// One GPU-instance profile as the driver offers it (`nvmlDeviceGetGpuInstanceProfileInfo`),
/// with its possible placements (`nvmlDeviceGetGpuInstancePossiblePlacements_v2`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverProfile {
    /// The profile id (`nvidia-smi mig -lgip`'s `ID`).
    pub id: u32,
    /// GPCs (compute slices).
    pub gpcs: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// The most instances one GPU holds.
    pub instances: u32,
    /// `(start, size)` in memory slices, or why the driver would not list them.
    pub placements: Result<Vec<(u32, u32)>, String>,
}

/// One profile id, lined up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileCheck {
    /// The profile id.
    pub id: u32,
    /// Our profile of that id, if our table has one.
    pub ours: Option<&'static Profile>,
    /// The driver's, if it offers that id.
    pub driver: Option<DriverProfile>,
    /// Each field that differs, in words; empty when the two agree.
    pub differences: Vec<String>,
}

impl ProfileCheck {
    /// Whether both have the profile and every compared field agrees.
    pub fn agrees(&self) -> bool {
        self.ours.is_some() && self.driver.is_some() && self.differences.is_empty()
    }
}

/// One GPU's table check: escher's table against the driver's, or why the driver's could not
/// be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuTableCheck {
    /// The GPU's NVML index.
    pub gpu: u32,
    /// One line per profile id, or why there are none.
    pub checks: Result<Vec<ProfileCheck>, String>,
}

/// How far a driver's memory may be from our table's before it counts as a difference: the
/// drivers of one GPU differ by a few MiB between releases.
const MEMORY_TOLERANCE_MIB: u64 = 64;

/// Our table for `model` against the driver's `offered` profiles, by id (ours first, then any
/// the driver offers that we lack).
pub fn compare(model: GpuModel, offered: &[DriverProfile]) -> Vec<ProfileCheck> {
    let mut out: Vec<ProfileCheck> = model
        .profiles()
        .iter()
        .map(|ours| {
            let driver = offered.iter().find(|d| d.id == ours.id).cloned();
            let differences = match &driver {
                Some(d) => differences(ours, d),
                None => vec!["the driver does not offer this profile".to_string()],
            };
            ProfileCheck {
                id: ours.id,
                ours: Some(ours),
                driver,
                differences,
            }
        })
        .collect();
    for d in offered {
        if model.profile_by_id(d.id).is_none() {
            out.push(ProfileCheck {
                id: d.id,
                ours: None,
                driver: Some(d.clone()),
                differences: vec!["escher's table has no profile of this id".to_string()],
            });
        }
    }
    out
}

/// Where `ours` and `driver` (the same id) disagree.
fn differences(ours: &Profile, driver: &DriverProfile) -> Vec<String> {
    let mut out = Vec::new();
    if driver.gpcs != u32::from(ours.compute) {
        out.push(format!(
            "GPCs: ours {}, driver {}",
            ours.compute, driver.gpcs
        ));
    }
    if driver.instances != u32::from(ours.max_instances) {
        out.push(format!(
            "instances: ours {}, driver {}",
            ours.max_instances, driver.instances
        ));
    }
    let our_mib = ours
        .memory_mib
        .map_or(u64::from(ours.memory_gb) * 1024, u64::from);
    // Without a sourced MiB figure our table knows only the nominal GB of the name.
    let tolerance = if ours.memory_mib.is_some() {
        MEMORY_TOLERANCE_MIB
    } else {
        our_mib / 10
    };
    if driver.memory_mib.abs_diff(our_mib) > tolerance {
        out.push(format!(
            "memory: ours {our_mib} MiB, driver {} MiB",
            driver.memory_mib
        ));
    }
    match &driver.placements {
        Ok(placements) => {
            let starts: Vec<u32> = placements.iter().map(|&(start, _)| start).collect();
            let ours_starts: Vec<u32> = ours.starts.iter().copied().map(u32::from).collect();
            if starts != ours_starts {
                out.push(format!("starts: ours {ours_starts:?}, driver {starts:?}"));
            }
            let size = u32::from(ours.memory_slices);
            if let Some(&(start, other)) = placements.iter().find(|&&(_, s)| s != size) {
                out.push(format!(
                    "size at start {start}: ours {size} memory slices, driver {other}"
                ));
            }
        }
        Err(why) => out.push(format!("placements not compared: {why}")),
    }
    out
}

/// The name a driver profile would print: ours where the id is known, else NVIDIA's pattern.
fn name(check: &ProfileCheck) -> String {
    match (check.ours, &check.driver) {
        (Some(p), _) => p.name.to_string(),
        (None, Some(d)) => format!("{}g.{}gb", d.gpcs, d.memory_mib.div_ceil(1024)),
        (None, None) => "?".to_string(),
    }
}

/// A table, one line per profile id: `ok` or what differs.
pub struct Report<'a>(pub &'a [ProfileCheck]);

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for check in self.0 {
            let driver = match &check.driver {
                Some(d) => {
                    let placements = match &d.placements {
                        Ok(p) => format!("{p:?}"),
                        Err(_) => "-".to_string(),
                    };
                    format!(
                        "driver: {} GPCs, {} SMs, {} MiB, {} instances, placements {placements}",
                        d.gpcs, d.multiprocessors, d.memory_mib, d.instances
                    )
                }
                None => "driver: -".to_string(),
            };
            let verdict = if check.agrees() {
                "ok".to_string()
            } else {
                check.differences.join("; ")
            };
            writeln!(
                f,
                "  id {:>2} {:<11} {driver}: {verdict}",
                check.id,
                name(check)
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a driver whose table is exactly ours would report.
    fn driver_like_ours(model: GpuModel) -> Vec<DriverProfile> {
        model
            .profiles()
            .iter()
            .map(|p| DriverProfile {
                id: p.id,
                gpcs: u32::from(p.compute),
                memory_mib: p
                    .memory_mib
                    .map_or(u64::from(p.memory_gb) * 1024, u64::from),
                multiprocessors: 0,
                instances: u32::from(p.max_instances),
                placements: Ok(p
                    .starts
                    .iter()
                    .map(|&s| (u32::from(s), u32::from(p.memory_slices)))
                    .collect()),
            })
            .collect()
    }

    #[test]
    fn a_driver_with_our_table_agrees_everywhere() {
        for model in [GpuModel::A100_40GB, GpuModel::H100_80GB] {
            let checks = compare(model, &driver_like_ours(model));
            assert_eq!(checks.len(), model.profiles().len());
            assert!(checks.iter().all(ProfileCheck::agrees), "{checks:?}");
            let text = Report(&checks).to_string();
            assert_eq!(text.lines().count(), checks.len());
            assert!(text.lines().all(|l| l.ends_with(": ok")), "{text}");
        }
    }

    #[test]
    fn every_difference_is_named() {
        let model = GpuModel::H100_80GB;
        let mut offered = driver_like_ours(model);
        let one_g = model.profile("1g.10gb").unwrap().id;
        let seven_g = model.profile("7g.80gb").unwrap().id;
        for d in &mut offered {
            if d.id == one_g {
                d.placements = Ok(vec![(0, 1), (1, 1), (2, 1)]);
                d.instances = 3;
            }
            if d.id == seven_g {
                d.memory_mib += 4096;
                d.gpcs = 8;
            }
        }
        offered.retain(|d| d.id != model.profile("2g.20gb").unwrap().id);
        offered.push(DriverProfile {
            id: 99,
            gpcs: 1,
            memory_mib: 5000,
            multiprocessors: 16,
            instances: 7,
            placements: Err("Not supported".to_string()),
        });
        let checks = compare(model, &offered);
        let find = |id: u32| checks.iter().find(|c| c.id == id).unwrap();
        let one = find(one_g);
        assert!(
            one.differences.iter().any(|d| d.starts_with("starts:")),
            "{one:?}"
        );
        assert!(one.differences.iter().any(|d| d.starts_with("instances:")));
        let seven = find(seven_g);
        assert!(seven.differences.iter().any(|d| d.starts_with("memory:")));
        assert!(seven.differences.iter().any(|d| d.starts_with("GPCs:")));
        let missing = find(model.profile("2g.20gb").unwrap().id);
        assert!(missing.driver.is_none() && !missing.agrees());
        let extra = find(99);
        assert!(extra.ours.is_none() && !extra.agrees());
        assert!(Report(&checks).to_string().contains("id 99 1g.5gb"));
        let agreeing = checks.iter().filter(|c| c.agrees()).count();
        assert_eq!(agreeing, model.profiles().len() - 3);
    }
}
