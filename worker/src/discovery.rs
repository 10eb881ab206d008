//! Resource discovery: what this machine has, as the physical [`ResourceSet`] and [`Labels`]
//! a worker registers with.
//!
//! - `cpu`: the logical CPUs this process may use ([`std::thread::available_parallelism`],
//!   which honours affinity masks and cgroup quotas);
//! - `memory`: `MemTotal` from `/proc/meminfo`, in whole MiB; absent where that file is not
//!   readable (not Linux, a restricted sandbox);
//! - GPUs and MIG slices: not yet. [`discover`] is the seam where NVML discovery will add
//!   `gpu`, `gpu.*` and `mig.*` resources and model labels, without the rest of the worker
//!   changing.
//!
//! [`hostname`] names the machine (the default worker name and the registered address).
//!
//! Configuration (`--cpus`, `--memory`, `--resources`) overrides what is discovered; that
//! merge happens in the builder, not here.

use escher_proto::{Amount, Labels, ResourceName, ResourceSet};

/// What [`discover`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Discovered {
    /// Physical resources: `cpu`, `memory` (MiB), later GPUs.
    pub resources: ResourceSet,
    /// Labels describing the hardware (none yet; GPU models later).
    pub labels: Labels,
}

/// Discovers this machine's physical resources.
pub fn discover() -> Discovered {
    let mut found = Discovered::default();
    if let Some(cpus) = cpu_count() {
        found.resources.insert(ResourceName::cpu(), cpus);
    }
    if let Some(mib) = memory_mib() {
        found.resources.insert(ResourceName::memory(), mib);
    }
    // GPUs (NVML, MIG slices) and simulated GPUs are added here by a later change.
    found
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
    }
}
