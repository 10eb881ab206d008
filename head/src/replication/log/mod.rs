//! The raft log: where a head keeps raft's entries, hard state, conf state and snapshots.
//!
//! [`LogStore`] is what replication needs of a log beyond raft-rs's read side
//! ([`raft::Storage`]). Two stores implement it: [`MemLog`] (no `--data-dir`: LocalCluster and
//! tests) and [`DiskLog`] (a directory of segments and snapshot files). Both are cheap-to-clone
//! handles over shared state, so the raft node reads entries while another thread persists, and
//! both answer reads from memory: a `sync` in progress never holds the lock reads take.
//!
//! # What a caller can rely on
//!
//! - `append`, `set_hard_state` and `set_conf_state` change what reads see at once and are
//!   durable after the next [`sync`](LogStore::sync) returns: one fsync covers everything written
//!   since the last one (group commit), and writes made during a sync go out with the next.
//! - A snapshot is durable when [`apply_snapshot`](LogStore::apply_snapshot) or
//!   [`compact`](LogStore::compact) returns, and so is everything queued before it (a compaction
//!   at or below the current snapshot does nothing, and writes nothing).
//! - So raft-rs's ready loop works as its documentation asks: append the ready's entries, set its
//!   hard state (entries first, then the hard state that commits them), `sync`, and only then send
//!   the messages that depend on them; install a ready's snapshot with `apply_snapshot` before
//!   its entries.
//! - A refused write (`LogError`) changes nothing. After a failed write or fsync, a `DiskLog`
//!   refuses every later write: restart and let recovery read what is on disk.
//!
//! Entries above the last snapshot live in memory (reads never touch the disk);
//! [`bytes_since_snapshot`](LogStore::bytes_since_snapshot) is their encoded size, and compacting
//! when it passes a threshold bounds both memory and disk.
//!
//! # Where the head keeps its data
//!
//! A log directory holds:
//!
//! ```text
//! IDENTITY                            group and replica, written once; checked at every open
//! LOCK                                flock'd while a head has the log open
//! snapshot-00000000000000004096.snap  the newest snapshot (state machine at index 4096), with
//!                                     the hard and conf states and the first segment after it
//! 00000000000000000007.log            segments: checksummed records of entries, hard states
//! 00000000000000000008.log            and conf states, appended; a new one past 32 MiB
//! ```
//!
//! Every record is `[len][crc32c][kind][payload]` (see `format.rs`); every write to a segment is
//! one `sync` and ends with a sync marker. Compaction writes a new snapshot file (tmp, fsync,
//! rename, fsync directory), then deletes the segments it covers whole, oldest first.
//!
//! At open every checksum is verified. A record cut short or failing its checksum at the very end
//! of the newest segment, with no completed write after it, is a write that was never synced
//! (the process or the machine stopped during it): it is cut off, and the head logs a warning
//! with the file, the offset and how many bytes it dropped. Damage anywhere else (an older
//! segment, a snapshot file, a record followed by later completed writes) refuses to start with
//! `LogError::Corrupt`, naming the file and offset: a replica of a group can move the directory
//! aside and catch up from the leader; a single head's log must be restored from a backup.
//! A directory of another group or replica, a path that is a file, a directory another process
//! has open, and a format version this build does not know are refused with a message that says
//! what to do.
//!
//! # Why a log of our own
//!
//! The head needs three operations of a log: append (sometimes truncating a conflicting
//! suffix), drop a prefix after a snapshot, and read back everything at start; reads come from
//! memory. A segmented append-only file does exactly that with one sequential write and one
//! fsync per batch, and gives the crash tests full control over torn records. raft-engine
//! (TiKV's) is built for thousands of raft groups sharing one log and brings a large dependency
//! tree; redb is a B-tree with copy-on-write pages, which pays for random access we never use.
//! Measured with `head/benches/raftlog.rs` (fsync'd appends of ~300-byte entries, one sync per
//! batch, the stores side by side in the same run):
//!
//! | batch | escher DiskLog entries/s (MB/s) | redb entries/s (MB/s) | bare write+fdatasync entries/s (MB/s) | DiskLog / redb | DiskLog / bare |
//! |---:|---:|---:|---:|---:|---:|
//! | 1 | 180 (0.1) | 191 (0.1) | 184 (0.1) | 0.9x | 0.98 |
//! | 10 | 1992 (0.6) | 2281 (0.7) | 2477 (0.7) | 0.9x | 0.80 |
//! | 100 | 16539 (4.9) | 12296 (3.7) | 17032 (5.1) | 1.3x | 0.97 |
//! | 1000 | 127897 (38.0) | 68856 (20.5) | 163796 (48.6) | 1.9x | 0.78 |
//!
//! (Median of 3 runs, `cargo bench -p escher-head --bench raftlog -- --runs 3`, on a 2-core VM
//! with an ext4 virtual disk while other builds ran: load average 10, so single runs vary by up
//! to 2x.) Up to ~10 entries per sync every store runs at the disk's fsync rate (~200 fsyncs/s
//! here), so what matters is that one sync carries many entries: at 100 and 1,000 entries per
//! batch `DiskLog` appends 1.3-1.9x as many entries per second as redb and reaches 78-97% of
//! a bare `write` + `fdatasync` of the same bytes.
//!
//! # Layout
//!
//! - `log_core.rs`: `LogCore`, the in-memory log with raft-rs's semantics, shared by both stores;
//! - `mem.rs`: [`MemLog`]; `disk.rs`: [`DiskLog`] and its write path; `sim_disk.rs`:
//!   [`SimDisk`], the deterministic simulation's disk (torn and lost writes, full disk, fsyncs
//!   that end when the simulation says);
//! - `recover.rs`: opening a directory; `segment.rs`, `snapshot_file.rs`, `identity.rs`: the
//!   three kinds of file; `format.rs`: headers, records, payloads; `files.rs`: atomic replace
//!   and directory fsync;
//! - `tests/`: raft-rs's `MemStorage` tests for both stores, a model test of `DiskLog` against
//!   `MemLog`, damage and bad-input tests, and the crash test with a real killed process.

mod disk;
mod error;
mod files;
mod format;
mod identity;
mod log_core;
mod mem;
mod recover;
mod segment;
mod sim_disk;
mod snapshot_file;
#[cfg(test)]
mod tests;

pub use disk::{DiskLog, DiskLogOptions};
pub use error::LogError;
pub use identity::LogIdentity;
pub use mem::MemLog;
pub use recover::{CUT_TAIL_IDS, LostTail};
pub use sim_disk::SimDisk;

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};

/// What replication needs of a raft log beyond raft-rs's read side (`raft::Storage`).
pub trait LogStore: raft::Storage + Clone + Send + Sync + 'static {
    /// Appends entries with raft's semantics: an entry at an index <= the last index first
    /// truncates the conflicting suffix. Buffered: durable only after `sync`.
    fn append(&self, entries: &[Entry]) -> Result<(), LogError>;
    /// Replaces the hard state (term, vote, commit). Buffered: durable only after `sync`.
    fn set_hard_state(&self, hs: HardState) -> Result<(), LogError>;
    /// Replaces the conf state (voters and learners). Buffered: durable only after `sync`.
    fn set_conf_state(&self, cs: ConfState) -> Result<(), LogError>;
    /// Makes everything written since the last sync durable with one fsync (group commit).
    fn sync(&self) -> Result<(), LogError>;
    /// Installs a snapshot received from the leader: persisted atomically, entries it covers
    /// dropped (as raft-rs's `MemStorage`, every entry: the log restarts after the snapshot), the
    /// conf state taken from it, the hard state's commit set to its index.
    fn apply_snapshot(&self, snap: Snapshot) -> Result<(), LogError>;
    /// Stores a local snapshot of the state machine at `index` (its bytes are `data`) and drops
    /// entries <= index (log compaction). An `index` at or below the current snapshot does
    /// nothing; one past the last entry is `LogError::Unavailable`.
    fn compact(&self, index: u64, conf: ConfState, data: Vec<u8>) -> Result<(), LogError>;
    /// Bytes of log written since the last snapshot: the encoded size of the entries above it,
    /// the compaction trigger.
    fn bytes_since_snapshot(&self) -> u64;
    /// The last write, if it was torn or damaged and cut off when the log was opened (it may
    /// have been acknowledged: see [`LostTail`]); `None` for a log that lost nothing.
    fn lost_tail(&self) -> Option<LostTail> {
        None
    }
}
