//! Resource discovery: what this machine has, as the physical [`ResourceSet`] and [`Labels`]
//! a worker registers with.
//!
//! - `cpu`: the logical CPUs this process may use ([`std::thread::available_parallelism`],
//!   which honours affinity masks and cgroup quotas);
//! - `memory`: `MemTotal` from `/proc/meminfo`, in whole MiB; absent where that file is not
//!   readable (not Linux, a restricted sandbox);
//! - GPUs and MIG slices ([`discover_with`]): real ones through NVML (no NVIDIA driver: one
//!   log line and none), then simulated ones (`--sim-gpu`); they add the `gpu`, `gpu.*` and
//!   `mig.*` resources and the `gpu.*` labels of the naming scheme in
//!   [`escher_proto::types`] (`gpu.rs`), and [`Discovered::gpus`] lists them.
//!
//! [`hostname`] names the machine (the default worker name and the registered address).
//! [`detect`] is `escher-worker --detect`: what a worker here would report, and for each real
//! MIG-capable GPU escher's profile table beside the driver's, without starting a worker.
//!
//! Configuration (`--cpus`, `--memory`, `--resources`) overrides what is discovered; that
//! merge happens in the builder, not here.

use std::collections::BTreeSet;
use std::fmt;

use escher_proto::types::{GpuInfo, gpu_labels, gpu_resources};
use escher_proto::{Amount, Labels, ResourceName, ResourceSet};

use crate::gpu::{self, GpuSources, SimGpuSpec, TableReport};
pub use crate::gpu::{DriverProfile, GpuTableCheck, ProfileCheck};

/// What [`discover`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Discovered {
    /// Physical resources: `cpu`, `memory` (MiB), and the GPU resources.
    pub resources: ResourceSet,
    /// Labels describing the hardware (`gpu.model`, `gpu.count`, ...).
    pub labels: Labels,
    /// The GPUs, real then simulated, by index.
    pub gpus: Vec<GpuInfo>,
}

/// Discovers this machine's CPUs, memory and real GPUs.
pub fn discover() -> Discovered {
    discover_with(true, &[], &hostname())
}

/// Discovers this machine's CPUs and memory, its real GPUs if `nvml` is set, and adds the
/// simulated GPUs of `simulated` after them, their UUIDs derived from `worker` (its name).
pub fn discover_with(nvml: bool, simulated: &[SimGpuSpec], worker: &str) -> Discovered {
    discover_kept(nvml, simulated, worker, None)
}

/// [`discover_with`], the simulated GPUs as a worker with the state directory `state` left
/// them (their MIG layouts outlive the worker, as a real GPU's do: `gpu/sim.rs`).
pub fn discover_kept(
    nvml: bool,
    simulated: &[SimGpuSpec],
    worker: &str,
    state: Option<&std::path::Path>,
) -> Discovered {
    let mut found = Discovered::default();
    if let Some(cpus) = cpu_count() {
        found.resources.insert(ResourceName::cpu(), cpus);
    }
    if let Some(mib) = memory_mib() {
        found.resources.insert(ResourceName::memory(), mib);
    }
    found.gpus = gpu::discover(GpuSources {
        nvml,
        simulated,
        worker,
        sim_state: state,
    });
    for (name, amount) in gpu_resources(&found.gpus, &BTreeSet::new()).iter() {
        found.resources.insert(name.clone(), amount);
    }
    found.labels = gpu_labels(&found.gpus);
    found
}

/// What [`detect`] found: the discovery, live GPU figures, and the table checks.
#[derive(Debug, Clone)]
pub struct Detection {
    /// What a worker started here with the same flags would register with.
    pub discovered: Discovered,
    /// Live figures of the real GPUs (utilisation, memory used).
    pub metrics: Vec<escher_proto::types::Metric>,
    /// Per real GPU with a MIG table (by index): escher's table against the driver's, or why
    /// the driver's could not be read; `Err` when NVML itself is unavailable.
    pub tables: Result<Vec<GpuTableCheck>, String>,
}

/// Discovers as a worker would ([`discover_with`]) and, for each real GPU escher has a MIG
/// table for, compares that table with the driver's. Reads only: nothing on the GPUs changes.
pub fn detect(nvml: bool, simulated: &[SimGpuSpec], worker: &str) -> Detection {
    let discovered = discover_with(nvml, simulated, worker);
    let (metrics, tables) = if nvml {
        (
            gpu::real_metrics(&discovered.gpus),
            gpu::check_tables(&discovered.gpus),
        )
    } else {
        (Vec::new(), Err("not asked for (--no-nvml)".to_string()))
    };
    Detection {
        discovered,
        metrics,
        tables,
    }
}

impl fmt::Display for Detection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = &self.discovered;
        writeln!(f, "resources: {}", d.resources)?;
        writeln!(f, "labels: {}", d.labels)?;
        if let Err(why) = &self.tables {
            writeln!(f, "NVML: {why}")?;
        }
        if d.gpus.is_empty() {
            writeln!(f, "gpus: none")?;
        }
        for g in &d.gpus {
            let model = g.model.map_or("none".to_string(), |m| m.to_string());
            writeln!(
                f,
                "gpu {}: {} ({}), {} MiB, MIG {}{}, escher's table: {model}",
                g.index,
                g.product,
                g.uuid,
                g.memory_mib,
                if g.mig_enabled { "on" } else { "off" },
                if g.simulated { ", simulated" } else { "" },
            )?;
            for s in &g.slices {
                writeln!(
                    f,
                    "  slice {} at start {} (size {}), {} MiB, {}",
                    s.profile, s.start, s.size, s.memory_mib, s.uuid
                )?;
            }
            let prefix = format!("gpu.{}.", g.index);
            for m in self.metrics.iter().filter(|m| m.name.starts_with(&prefix)) {
                writeln!(f, "  {} = {}", m.name, m.value)?;
            }
            let table = self
                .tables
                .as_ref()
                .ok()
                .and_then(|t| t.iter().find(|t| t.gpu == g.index))
                .map(|t| &t.checks);
            match table {
                Some(Ok(checks)) => {
                    let agree = checks.iter().filter(|c| c.agrees()).count();
                    writeln!(
                        f,
                        "  MIG profiles, escher's table against the driver's ({agree} of {} agree):",
                        checks.len()
                    )?;
                    write!(f, "{}", TableReport(checks))?;
                }
                Some(Err(why)) => writeln!(f, "  MIG profiles not compared: {why}")?,
                None => {}
            }
        }
        Ok(())
    }
}

/// This machine's host name: the kernel's, else `$HOSTNAME`, else `localhost`.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "localhost".to_string())
}

/// The logical CPUs available to this process.
fn cpu_count() -> Option<Amount> {
    let n = std::thread::available_parallelism().ok()?.get();
    Amount::units(n as u64).ok()
}

/// `MemTotal` in MiB, if `/proc/meminfo` can be read.
fn memory_mib() -> Option<Amount> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    Amount::units(parse_meminfo_mib(&text)?).ok()
}

/// Reads `MemTotal:  16318412 kB` from the text of `/proc/meminfo`, in whole MiB.
fn parse_meminfo_mib(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line["MemTotal:".len()..].split_whitespace();
    let value: u64 = words.next()?.parse().ok()?;
    let unit_bytes = match words.next() {
        Some("kB") | Some("KB") | Some("kb") => 1024,
        Some("mB") | Some("MB") => 1024 * 1024,
        None => 1,
        Some(_) => return None,
    };
    Some(value.checked_mul(unit_bytes)? / (1024 * 1024))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_meminfo() {
        let text = "MemFree:  100 kB\nMemTotal:       16318464 kB\nSwapTotal: 0 kB\n";
        assert_eq!(parse_meminfo_mib(text), Some(15936));
        assert_eq!(parse_meminfo_mib("MemFree: 1 kB\n"), None);
        assert_eq!(parse_meminfo_mib("MemTotal: lots kB\n"), None);
        assert_eq!(parse_meminfo_mib("MemTotal: 1 parsecs\n"), None);
    }

    #[test]
    fn discovers_cpus() {
        let found = discover();
        assert!(found.resources.get("cpu") >= Amount::ONE);
        if std::path::Path::new("/proc/meminfo").exists() {
            assert!(!found.resources.get("memory").is_zero());
        }
        // Without an NVIDIA driver (CI), no GPU and no GPU label; with one, real GPUs only.
        assert!(found.gpus.iter().all(|g| !g.simulated));
        if found.gpus.is_empty() {
            assert!(found.resources.get("gpu").is_zero());
            assert!(found.labels.is_empty());
        }
    }

    #[test]
    fn simulated_gpus_add_resources_and_labels() {
        let specs: Vec<SimGpuSpec> = ["a100-40gb:mig=3g.20gb,2g.10gb,1g.5gb,1g.5gb", "h100-80gb"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let found = discover_with(false, &specs, "box");
        assert_eq!(found.gpus.len(), 2);
        assert_eq!(found.gpus[1].index, 1);
        let r = &found.resources;
        assert_eq!(r.get("gpu").to_string(), "1");
        assert_eq!(r.get("mig.1g.5gb").to_string(), "2");
        assert_eq!(r.get("mig.3g.20gb").to_string(), "1");
        let gpu_id = escher_proto::types::gpu_identity(&found.gpus[1].uuid).unwrap();
        assert_eq!(r.get(gpu_id.as_str()), Amount::ONE);
        for s in &found.gpus[0].slices {
            assert_eq!(r.get(s.identity().unwrap().as_str()), Amount::ONE);
        }
        assert_eq!(
            found.labels.to_string(),
            "gpu.count=2,gpu.mig=1,gpu.model=mixed,gpu.simulated=true"
        );
        // The same worker gets the same UUIDs every time.
        assert_eq!(discover_with(false, &specs, "box").gpus, found.gpus);
        assert_ne!(discover_with(false, &specs, "other").gpus, found.gpus);
    }
}
