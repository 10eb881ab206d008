//! The store's default capacity: 30% of the node's memory, as Ray's default object store.

/// The share of the node's memory, in percent, a store holds by default
/// (`--object-store-memory` unset).
pub const DEFAULT_MEMORY_PERCENT: u64 = 30;

/// The capacity used when the node's memory cannot be read (`sysinfo(2)` failed): 1 GiB.
pub const FALLBACK_CAPACITY: u64 = 1 << 30;

/// The default capacity of this node's store: [`DEFAULT_MEMORY_PERCENT`] of its memory
/// ([`node_memory`]), else [`FALLBACK_CAPACITY`].
pub fn default_capacity() -> u64 {
    node_memory().map_or(FALLBACK_CAPACITY, share)
}

/// The node's total memory in bytes, as the kernel reports it (`sysinfo(2)`).
pub fn node_memory() -> Option<u64> {
    nix::sys::sysinfo::sysinfo()
        .ok()
        .map(|info| info.ram_total())
        .filter(|&m| m > 0)
}

/// [`DEFAULT_MEMORY_PERCENT`] of `memory` bytes.
fn share(memory: u64) -> u64 {
    (u128::from(memory) * u128::from(DEFAULT_MEMORY_PERCENT) / 100) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_thirty_percent_of_the_node() {
        assert_eq!(share(1000), 300);
        assert_eq!(share(u64::MAX), (u128::from(u64::MAX) * 30 / 100) as u64);
        let total = node_memory().expect("sysinfo(2) works on Linux");
        // MemTotal in /proc/meminfo is the same number, in KiB.
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
        let kib: u64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert_eq!(total / 1024, kib);
        assert_eq!(default_capacity(), share(total));
    }
}
