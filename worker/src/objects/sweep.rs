//! The startup sweep: removes the store directories of worker processes that are gone.
//!
//! A store removes its directories when it is dropped, but a worker killed with SIGKILL (or a
//! crashed one) leaves them, and on tmpfs that is memory no one frees. Each store's
//! directories are named after the worker's host pid (`escher-objects-PID-N` in the memory
//! root, `escher-spill-PID-N` in the spill root), so the next store opened on the machine
//! removes those whose process is dead, as the task cgroups of dead workers are
//! (`crate::exec::cgroup`). A live worker's, and this process's, are left alone.
//!
//! Whether a pid is alive is asked of the host's `/proc` (`crate::pidns`), so workers that
//! share a memory root must see one another's processes: two containers that share the host's
//! `/dev/shm` (`--ipc=host`) but not its PID namespace must be given different roots.

use std::fs;
use std::path::Path;

/// The prefix of a store's memory directory.
pub(super) const MEMORY_PREFIX: &str = "escher-objects-";
/// The prefix of a store's spill directory.
pub(super) const SPILL_PREFIX: &str = "escher-spill-";

/// Removes the directories `PREFIXPID-N` in `root` whose process `PID` is gone; how many.
pub(super) fn sweep_dead_stores(root: &Path, prefix: &str) -> usize {
    let Ok(entries) = fs::read_dir(root) else {
        return 0;
    };
    let own = crate::pidns::host_pid();
    let mut swept = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .and_then(|rest| rest.split_once('-'))
            .filter(|(_, n)| n.parse::<u64>().is_ok())
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == own || crate::pidns::host_process_alive(pid) {
            continue;
        }
        let dir = entry.path();
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        match fs::remove_dir_all(&dir) {
            Ok(()) => {
                swept += 1;
                tracing::warn!(dead_worker = pid, dir = %dir.display(), "removed the object store a dead worker left");
            }
            Err(e) => {
                tracing::warn!(dir = %dir.display(), %e, "cannot remove the object store a dead worker left")
            }
        }
    }
    swept
}
