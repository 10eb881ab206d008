//! `MemLog`: the raft log of a head without `--data-dir` (LocalCluster, tests). Everything is
//! lost when the process ends; `sync` has nothing to do.

use std::fmt;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};

use super::log_core::LogCore;
use super::{LogError, LogStore};

/// The in-memory log: a cheap-to-clone handle over one shared `LogCore`.
#[derive(Clone, Default)]
pub struct MemLog {
    core: Arc<RwLock<LogCore>>,
}

impl MemLog {
    /// An empty log: no entries, no snapshot, default hard and conf states.
    pub fn new() -> Self {
        MemLog::default()
    }

    fn read(&self) -> RwLockReadGuard<'_, LogCore> {
        // A panic while holding the lock cannot leave `LogCore` half-changed: every write checks
        // first and then changes plain fields, so a poisoned lock is still consistent.
        self.core
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, LogCore> {
        self.core
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl fmt::Debug for MemLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let core = self.read();
        f.debug_struct("MemLog")
            .field("first_index", &core.first_index())
            .field("last_index", &core.last_index())
            .field("hard_state", core.hard_state())
            .finish()
    }
}

super::log_core::storage_from_core!(MemLog);

impl LogStore for MemLog {
    fn append(&self, entries: &[Entry]) -> Result<(), LogError> {
        let mut core = self.write();
        core.check_append(entries)?;
        core.append(entries);
        Ok(())
    }

    fn set_hard_state(&self, hs: HardState) -> Result<(), LogError> {
        self.write().set_hard_state(hs);
        Ok(())
    }

    fn set_conf_state(&self, cs: ConfState) -> Result<(), LogError> {
        self.write().set_conf_state(cs);
        Ok(())
    }

    fn sync(&self) -> Result<(), LogError> {
        Ok(())
    }

    fn apply_snapshot(&self, snap: Snapshot) -> Result<(), LogError> {
        let mut core = self.write();
        core.check_apply_snapshot(&snap)?;
        core.apply_snapshot(snap);
        Ok(())
    }

    fn compact(&self, index: u64, conf: ConfState, data: Vec<u8>) -> Result<(), LogError> {
        let mut core = self.write();
        if let Some(snap) = core.compaction(index, conf, data)? {
            core.compact(snap);
        }
        Ok(())
    }

    fn bytes_since_snapshot(&self) -> u64 {
        self.read().entry_bytes()
    }
}
