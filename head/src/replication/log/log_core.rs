//! The in-memory raft log both stores serve reads from: hard state, conf state, the latest
//! snapshot and the entries above it, with raft-rs's semantics.
//!
//! `LogCore` does no I/O. [`MemLog`](super::MemLog) is a `LogCore` behind a lock;
//! [`DiskLog`](super::DiskLog) keeps one as the image of its files, updated after each record is
//! queued for disk, and rebuilds it at open by replaying the records. Reads (`entries`, `term`,
//! ...) answer exactly as raft-rs's `MemStorage` does, with one exception: an `entries` range
//! past the end is `StorageError::Unavailable` rather than a panic. Writes are checked
//! (`check_*`) before the caller queues anything for disk, so a refused write changes nothing.

use std::collections::VecDeque;

use bytes::Bytes;
use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{RaftState, StorageError};

use super::LogError;

/// The log as raft sees it.
#[derive(Debug, Default, Clone)]
pub(super) struct LogCore {
    hard_state: HardState,
    conf_state: ConfState,
    /// The latest snapshot (metadata index 0: none yet).
    snapshot: Snapshot,
    /// `entries[i].index == snapshot index + 1 + i`.
    entries: VecDeque<Entry>,
    /// The encoded size of `entries`: the compaction trigger.
    entry_bytes: u64,
}

impl LogCore {
    /// A log that starts from `snapshot` (empty: from nothing) with these states.
    pub(super) fn from_parts(
        snapshot: Snapshot,
        hard_state: HardState,
        conf_state: ConfState,
    ) -> Self {
        LogCore {
            hard_state,
            conf_state,
            snapshot,
            entries: VecDeque::new(),
            entry_bytes: 0,
        }
    }

    pub(super) fn snapshot_index(&self) -> u64 {
        self.snapshot.get_metadata().index
    }

    pub(super) fn first_index(&self) -> u64 {
        self.snapshot_index() + 1
    }

    pub(super) fn last_index(&self) -> u64 {
        self.snapshot_index() + self.entries.len() as u64
    }

    pub(super) fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    pub(super) fn conf_state(&self) -> &ConfState {
        &self.conf_state
    }

    pub(super) fn entry_bytes(&self) -> u64 {
        self.entry_bytes
    }

    pub(super) fn raft_state(&self) -> RaftState {
        RaftState::new(self.hard_state.clone(), self.conf_state.clone())
    }

    /// Entries `[low, high)`, cut to `max_size` bytes as raft-rs does (never fewer than one).
    pub(super) fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: Option<u64>,
    ) -> raft::Result<Vec<Entry>> {
        if low < self.first_index() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last_index() + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let offset = self.first_index();
        let lo = (low - offset) as usize;
        let hi = (high.max(low) - offset) as usize;
        let mut out: Vec<Entry> = self.entries.range(lo..hi).cloned().collect();
        raft::util::limit_size(&mut out, max_size);
        Ok(out)
    }

    /// The term of entry `idx`, which must lie in `[first_index - 1, last_index]`.
    pub(super) fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx == self.snapshot_index() {
            return Ok(self.snapshot.get_metadata().term);
        }
        if idx < self.first_index() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if idx > self.last_index() {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        Ok(self.entries[(idx - self.first_index()) as usize].term)
    }

    /// The stored snapshot, if there is one at `request_index` or later.
    pub(super) fn snapshot(&self, request_index: u64) -> raft::Result<Snapshot> {
        let index = self.snapshot_index();
        if index == 0 || index < request_index {
            return Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        Ok(self.snapshot.clone())
    }

    /// Whether `ents` may be appended: consecutive, above the snapshot, no gap after the end.
    pub(super) fn check_append(&self, ents: &[Entry]) -> Result<(), LogError> {
        let Some(first) = ents.first() else {
            return Ok(());
        };
        for (expected, e) in (first.index..).zip(ents) {
            if e.index != expected {
                return Err(LogError::NotContiguous {
                    expected,
                    found: e.index,
                });
            }
        }
        if first.index < self.first_index() {
            return Err(LogError::Compacted {
                index: first.index,
                first_index: self.first_index(),
            });
        }
        if first.index > self.last_index() + 1 {
            return Err(LogError::Gap {
                index: first.index,
                last_index: self.last_index(),
            });
        }
        Ok(())
    }

    /// Appends checked entries, first dropping the suffix they replace.
    pub(super) fn append(&mut self, ents: &[Entry]) {
        let Some(first) = ents.first() else {
            return;
        };
        self.truncate_from(first.index);
        for e in ents {
            self.entry_bytes += u64::from(e.compute_size());
            self.entries.push_back(e.clone());
        }
    }

    /// Replays an entries record at open. Entries the snapshot covers are skipped, but the
    /// record still truncates what follows them: "truncate from `f`, append `f..=l`" restricted
    /// to the indexes above the snapshot. What remains must join the log without a gap.
    pub(super) fn replay_append(&mut self, mut ents: Vec<Entry>) -> Result<(), String> {
        let Some(first) = ents.first().map(|e| e.index) else {
            return Ok(());
        };
        ents.retain(|e| e.index > self.snapshot_index());
        if ents.is_empty() {
            self.truncate_from(first.max(self.first_index()));
            return Ok(());
        }
        self.check_append(&ents).map_err(|e| e.to_string())?;
        self.append(&ents);
        Ok(())
    }

    fn truncate_from(&mut self, index: u64) {
        let keep = (index.max(self.first_index()) - self.first_index()) as usize;
        if keep < self.entries.len() {
            let dropped: u64 = self
                .entries
                .range(keep..)
                .map(|e| u64::from(e.compute_size()))
                .sum();
            self.entry_bytes -= dropped;
            self.entries.truncate(keep);
        }
    }

    pub(super) fn set_hard_state(&mut self, hs: HardState) {
        self.hard_state = hs;
    }

    pub(super) fn set_conf_state(&mut self, cs: ConfState) {
        self.conf_state = cs;
    }

    /// Whether a snapshot from the leader may be installed (as `MemStorage`: not below the log).
    pub(super) fn check_apply_snapshot(&self, snap: &Snapshot) -> Result<(), LogError> {
        let index = snap.get_metadata().index;
        if self.first_index() > index {
            return Err(LogError::SnapshotOutOfDate {
                index,
                first_index: self.first_index(),
            });
        }
        Ok(())
    }

    /// The hard state after installing `snap`: its term at least the snapshot's, commit at it.
    pub(super) fn hard_state_after(&self, snap: &Snapshot) -> HardState {
        let meta = snap.get_metadata();
        let mut hs = self.hard_state.clone();
        hs.term = hs.term.max(meta.term);
        hs.commit = meta.index;
        hs
    }

    /// Installs a checked snapshot from the leader: every entry goes, the conf state is its.
    pub(super) fn apply_snapshot(&mut self, snap: Snapshot) {
        self.hard_state = self.hard_state_after(&snap);
        self.conf_state = snap.get_metadata().get_conf_state().clone();
        self.snapshot = snap;
        self.entries.clear();
        self.entry_bytes = 0;
    }

    /// The snapshot a compaction at `index` stores, or `None` when the log already starts past it.
    pub(super) fn compaction(
        &self,
        index: u64,
        conf: ConfState,
        data: Vec<u8>,
    ) -> Result<Option<Snapshot>, LogError> {
        if index <= self.snapshot_index() {
            return Ok(None);
        }
        let term = self.term(index).map_err(|_| LogError::Unavailable {
            index,
            last_index: self.last_index(),
        })?;
        let mut snap = Snapshot::default();
        let meta = snap.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(conf);
        snap.data = Bytes::from(data);
        Ok(Some(snap))
    }

    /// Stores a snapshot made by `compaction` and drops the entries it covers.
    pub(super) fn compact(&mut self, snap: Snapshot) {
        let drop = (snap.get_metadata().index - self.snapshot_index()) as usize;
        let dropped: u64 = self
            .entries
            .drain(..drop)
            .map(|e| u64::from(e.compute_size()))
            .sum();
        self.entry_bytes -= dropped;
        self.snapshot = snap;
    }
}

/// Implements [`raft::Storage`] for a store whose `read()` returns a guard of its `LogCore`:
/// both stores answer every read from memory, the same way.
macro_rules! storage_from_core {
    ($store:ty) => {
        impl raft::Storage for $store {
            fn initial_state(&self) -> raft::Result<raft::RaftState> {
                Ok(self.read().raft_state())
            }

            fn entries(
                &self,
                low: u64,
                high: u64,
                max_size: impl Into<Option<u64>>,
                _context: raft::GetEntriesContext,
            ) -> raft::Result<Vec<raft::eraftpb::Entry>> {
                self.read().entries(low, high, max_size.into())
            }

            fn term(&self, idx: u64) -> raft::Result<u64> {
                self.read().term(idx)
            }

            fn first_index(&self) -> raft::Result<u64> {
                Ok(self.read().first_index())
            }

            fn last_index(&self) -> raft::Result<u64> {
                Ok(self.read().last_index())
            }

            fn snapshot(
                &self,
                request_index: u64,
                _to: u64,
            ) -> raft::Result<raft::eraftpb::Snapshot> {
                self.read().snapshot(request_index)
            }
        }
    };
}

pub(super) use storage_from_core;
