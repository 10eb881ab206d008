//! STAND-IN, to be deleted when branch `raftlog` (the durable log store, issue 9) is merged:
//! the [`LogStore`] contract that branch implements, and an in-memory [`MemLog`] behind it,
//! so that replication is developed and tested against the contract before the real store
//! exists. The real `log` module replaces this file one for one (`LogStore`, `LogError`,
//! `MemLog`, plus `DiskLog` for `--data-dir`).

use std::sync::{Arc, Mutex, MutexGuard};

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, StorageError};
use thiserror::Error;

/// Why the log store failed. Every failure is fatal for the replica that sees it.
#[derive(Debug, Error)]
pub enum LogError {
    /// An entry was appended out of order.
    #[error("entry {index} cannot follow the log's last entry {last}")]
    Gap {
        /// The entry's index.
        index: u64,
        /// The log's last index.
        last: u64,
    },
    /// A snapshot older than what the log holds.
    #[error("snapshot at {index} is older than the log's first entry {first}")]
    StaleSnapshot {
        /// The snapshot's index.
        index: u64,
        /// The log's first index.
        first: u64,
    },
}

/// What replication needs of a raft log beyond raft-rs's read side (`raft::Storage`).
pub trait LogStore: raft::Storage + Clone + Send + Sync + 'static {
    /// Appends entries; an entry at an index at or below the last one truncates the
    /// conflicting suffix first. Buffered until [`sync`](Self::sync).
    fn append(&self, entries: &[Entry]) -> Result<(), LogError>;
    /// Records the hard state (term, vote, commit).
    fn set_hard_state(&self, hs: HardState) -> Result<(), LogError>;
    /// Records the membership.
    fn set_conf_state(&self, cs: ConfState) -> Result<(), LogError>;
    /// Makes everything since the last sync durable (one fsync: group commit).
    fn sync(&self) -> Result<(), LogError>;
    /// Installs a snapshot received from the leader, replacing the log.
    fn apply_snapshot(&self, snap: Snapshot) -> Result<(), LogError>;
    /// Stores a local snapshot of the state at `index` and drops the entries up to it.
    fn compact(&self, index: u64, conf: ConfState, data: Vec<u8>) -> Result<(), LogError>;
    /// Bytes of entries appended since the last snapshot (the compaction trigger).
    fn bytes_since_snapshot(&self) -> u64;
}

#[derive(Debug, Default)]
struct Inner {
    hard_state: HardState,
    conf_state: ConfState,
    snapshot: Snapshot,
    /// Entries after the snapshot, contiguous.
    entries: Vec<Entry>,
    bytes: u64,
}

impl Inner {
    fn first_index(&self) -> u64 {
        self.snapshot.get_metadata().index + 1
    }

    fn last_index(&self) -> u64 {
        self.entries
            .last()
            .map_or(self.snapshot.get_metadata().index, |e| e.index)
    }
}

/// A raft log in memory: a head without `--data-dir`. Cheap to clone; clones share the log.
#[derive(Debug, Clone, Default)]
pub struct MemLog {
    inner: Arc<Mutex<Inner>>,
}

impl MemLog {
    /// An empty log.
    pub fn new() -> MemLog {
        MemLog::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves whole values behind: go on with them.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl raft::Storage for MemLog {
    fn initial_state(&self) -> raft::Result<RaftState> {
        let inner = self.lock();
        Ok(RaftState::new(
            inner.hard_state.clone(),
            inner.conf_state.clone(),
        ))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let inner = self.lock();
        if low < inner.first_index() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > inner.last_index() + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let offset = inner.first_index();
        let mut out: Vec<Entry> =
            inner.entries[(low - offset) as usize..(high - offset) as usize].to_vec();
        raft::util::limit_size(&mut out, max_size.into());
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let inner = self.lock();
        let snap = inner.snapshot.get_metadata();
        if idx == snap.index {
            return Ok(snap.term);
        }
        if idx < inner.first_index() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if idx > inner.last_index() {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        Ok(inner.entries[(idx - inner.first_index()) as usize].term)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.lock().first_index())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.lock().last_index())
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        let inner = self.lock();
        if inner.snapshot.get_metadata().index < request_index {
            return Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        Ok(inner.snapshot.clone())
    }
}

impl LogStore for MemLog {
    fn append(&self, entries: &[Entry]) -> Result<(), LogError> {
        let Some(first) = entries.first() else {
            return Ok(());
        };
        let mut inner = self.lock();
        let last = inner.last_index();
        if first.index > last + 1 {
            return Err(LogError::Gap {
                index: first.index,
                last,
            });
        }
        let keep = first.index.saturating_sub(inner.first_index()) as usize;
        inner.entries.truncate(keep);
        for e in entries {
            inner.bytes += e.data.len() as u64 + e.context.len() as u64 + 24;
        }
        inner.entries.extend_from_slice(entries);
        Ok(())
    }

    fn set_hard_state(&self, hs: HardState) -> Result<(), LogError> {
        self.lock().hard_state = hs;
        Ok(())
    }

    fn set_conf_state(&self, cs: ConfState) -> Result<(), LogError> {
        self.lock().conf_state = cs;
        Ok(())
    }

    fn sync(&self) -> Result<(), LogError> {
        Ok(())
    }

    fn apply_snapshot(&self, snap: Snapshot) -> Result<(), LogError> {
        let mut inner = self.lock();
        let meta = snap.get_metadata();
        if meta.index < inner.snapshot.get_metadata().index {
            return Err(LogError::StaleSnapshot {
                index: meta.index,
                first: inner.first_index(),
            });
        }
        inner.hard_state.term = inner.hard_state.term.max(meta.term);
        inner.hard_state.commit = meta.index;
        inner.conf_state = meta.get_conf_state().clone();
        inner.entries.clear();
        inner.bytes = 0;
        inner.snapshot = snap;
        Ok(())
    }

    fn compact(&self, index: u64, conf: ConfState, data: Vec<u8>) -> Result<(), LogError> {
        let mut inner = self.lock();
        if index <= inner.snapshot.get_metadata().index {
            return Ok(());
        }
        let first = inner.first_index();
        if index > inner.last_index() {
            return Err(LogError::Gap {
                index,
                last: inner.last_index(),
            });
        }
        let term = inner.entries[(index - first) as usize].term;
        inner.entries.drain(..=(index - first) as usize);
        inner.bytes = inner
            .entries
            .iter()
            .map(|e| e.data.len() as u64 + e.context.len() as u64 + 24)
            .sum();
        let mut meta = SnapshotMetadata::default();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(conf);
        let mut snap = Snapshot::default();
        snap.set_metadata(meta);
        snap.data = data.into();
        inner.snapshot = snap;
        Ok(())
    }

    fn bytes_since_snapshot(&self) -> u64 {
        self.lock().bytes
    }
}

#[cfg(test)]
mod tests {
    use raft::Storage;

    use super::*;

    fn entry(index: u64, term: u64) -> Entry {
        let mut e = Entry::default();
        e.index = index;
        e.term = term;
        e.data = vec![0; 10].into();
        e
    }

    #[test]
    fn appends_truncate_conflicts_and_compaction_keeps_the_tail() {
        let log = MemLog::new();
        log.append(&[entry(1, 1), entry(2, 1), entry(3, 1)]).unwrap();
        log.append(&[entry(3, 2), entry(4, 2)]).unwrap();
        assert_eq!(log.term(3).unwrap(), 2);
        assert_eq!(log.last_index().unwrap(), 4);
        assert!(matches!(
            log.append(&[entry(9, 2)]),
            Err(LogError::Gap { index: 9, last: 4 })
        ));
        log.compact(2, ConfState::default(), b"state".to_vec()).unwrap();
        assert_eq!(log.first_index().unwrap(), 3);
        assert_eq!(log.term(2).unwrap(), 1, "the snapshot keeps its term");
        let snap = log.snapshot(2, 2).unwrap();
        assert_eq!(&snap.data[..], b"state");
        assert!(log.entries(1, 3, None, GetEntriesContext::empty(false)).is_err());
        let tail = log.entries(3, 5, None, GetEntriesContext::empty(false)).unwrap();
        assert_eq!(tail.iter().map(|e| e.index).collect::<Vec<_>>(), vec![3, 4]);
    }
}
