//! [`SimDisk`]: the simulation's disk, the seam where the deterministic simulation
//! (`escher-sim`, docs/RELIABILITY.md) breaks a replica's storage.
//!
//! It is a [`LogStore`] that keeps two images of the log: what reads see (the live
//! `LogCore`, as both real stores keep one) and what a crash leaves behind (the media). It
//! answers every call as [`DiskLog`](super::DiskLog) does, errors included, and tells them
//! apart only in what survives a crash and in when an fsync ends:
//!
//! - `append` and `set_*_state` are buffered, as `DiskLog` queues records: a crash loses them
//!   all (lost unsynced writes);
//! - `sync` starts the fsync of everything buffered; it ends when the simulation says so
//!   ([`SimDisk::settle`], after a slow or a quick fsync in simulated time). A crash before
//!   then keeps a prefix of that write, any length from none to all of it: a write torn at any
//!   record (`DiskLog`'s recovery cuts a torn record off, so what the next open sees of a torn
//!   write is always such a prefix; byte-level damage is the `DiskLog` damage and crash tests'
//!   business, not the simulation's);
//! - `compact` and `apply_snapshot` are durable when they return, and so is everything
//!   written before them (`DiskLog` writes its queue, then the snapshot file, both fsynced);
//! - a full disk ([`SimDisk::set_full`]) refuses what `DiskLog` refuses on a full file
//!   system, the way it does: `sync` with `LogError::NoSpace`, the queue kept for the next
//!   try; `compact` with the same, or with the snapshot file's `ENOSPC`; `apply_snapshot`
//!   with `NoSpace`, nothing changed (the snapshot file is written aside and renamed).
//!
//! A simulated crash is [`SimDisk::crash`]: a new handle over what the media kept, as a
//! restarted process would find it. [`SimDisk::crash_cut`] is a crash whose disk also lost the
//! end of what it had synced (a cut tail): the newest synced records are gone, and the new
//! handle reports the lost write as `DiskLog`'s recovery does when its segment ends in an
//! unfinished record ([`LogStore::lost_tail`], not `written_whole`), once: the recovery cuts
//! the damage off, so the handle a later crash leaves reports nothing.

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};

use super::log_core::LogCore;
use super::recover::LostTail;
use super::{LogError, LogStore};

/// One write, as a record on the media.
#[derive(Debug, Clone)]
enum Record {
    Entries(Vec<Entry>),
    HardState(HardState),
    ConfState(ConfState),
}

impl Record {
    /// About how many bytes the record takes in a segment.
    fn bytes(&self) -> u64 {
        match self {
            Record::Entries(entries) => entries.iter().map(|e| 32 + e.data.len() as u64).sum(),
            Record::HardState(_) | Record::ConfState(_) => 32,
        }
    }

    fn replay(&self, core: &mut LogCore) {
        match self {
            Record::Entries(entries) => core.append(entries),
            Record::HardState(hs) => core.set_hard_state(hs.clone()),
            Record::ConfState(cs) => core.set_conf_state(cs.clone()),
        }
    }
}

/// What is on the simulated media, and what is on its way there.
#[derive(Debug, Default)]
struct Media {
    /// What a crash keeps for certain (but a cut tail, [`SimDisk::crash_cut`]).
    durable: LogCore,
    /// What the last snapshot or compaction made durable: `durable` is it with `synced`.
    base: LogCore,
    /// The records synced since `base`, oldest first: a cut tail takes the newest of them.
    synced: Vec<Record>,
    /// The write a cut tail took, as the recovery of the log this handle opened saw it.
    lost_tail: Option<LostTail>,
    /// Records whose fsync has begun and not ended: a crash keeps a prefix of them.
    syncing: Vec<Record>,
    /// Records written since the last `sync`: a crash loses them.
    buffered: Vec<Record>,
    /// The file system is full.
    full: bool,
}

/// The simulation's disk: a [`LogStore`] that answers as `DiskLog` does and keeps, across a
/// simulated crash ([`SimDisk::crash`]), only what a disk would: what an ended fsync or a
/// snapshot made durable, and a prefix of an fsync under way.
#[derive(Clone, Default)]
pub struct SimDisk {
    core: Arc<RwLock<LogCore>>,
    media: Arc<Mutex<Media>>,
}

/// The directory a simulated disk names in its errors.
fn dir() -> PathBuf {
    PathBuf::from("sim-disk")
}

fn no_space(action: &'static str, file: &str) -> LogError {
    LogError::io(action, dir().join(file))(std::io::Error::from_raw_os_error(
        nix::errno::Errno::ENOSPC as i32,
    ))
}

impl SimDisk {
    /// An empty disk.
    pub fn new() -> SimDisk {
        SimDisk::default()
    }

    fn read(&self) -> RwLockReadGuard<'_, LogCore> {
        self.core.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, LogCore> {
        self.core.write().unwrap_or_else(|p| p.into_inner())
    }

    fn media(&self) -> MutexGuard<'_, Media> {
        self.media.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Fills the file system (`true`) or frees space on it (`false`).
    pub fn set_full(&self, full: bool) {
        self.media().full = full;
    }

    /// Whether the file system is full.
    pub fn is_full(&self) -> bool {
        self.media().full
    }

    /// Whether an fsync has begun and not ended.
    pub fn syncing(&self) -> bool {
        !self.media().syncing.is_empty()
    }

    /// The fsync under way ends: what it wrote is durable.
    pub fn settle(&self) {
        let mut media = self.media();
        let records = std::mem::take(&mut media.syncing);
        for record in &records {
            record.replay(&mut media.durable);
        }
        media.synced.extend(records);
    }

    /// The process stops now. Returns the disk a restarted process finds: everything made
    /// durable, and the first `keep` records of the fsync under way (clamped to its length;
    /// a torn write), nothing buffered. The full flag stays: a restart frees no space.
    pub fn crash(&self, keep: usize) -> SimDisk {
        let mut media = self.media();
        let syncing = std::mem::take(&mut media.syncing);
        for record in syncing.iter().take(keep) {
            record.replay(&mut media.durable);
        }
        media.synced.extend(syncing.into_iter().take(keep));
        media.buffered.clear();
        Self::reopened(&media, None)
    }

    /// The process stops now and the disk loses the end of its log: the fsync under way and
    /// what was buffered, and the newest `cut` records it had synced (at most those since the
    /// last snapshot or compaction, which are durable with everything before them), the cut
    /// falling inside the oldest record it takes. Returns the disk a restarted process finds,
    /// which reports the lost write ([`LogStore::lost_tail`]) as `DiskLog`'s recovery reports
    /// a segment that ends in an unfinished record: it cannot tell a write torn by a crash from
    /// a synced one cut off, nor how much the cut took. With nothing synced to cut, it is
    /// [`SimDisk::crash`] keeping none of the fsync under way.
    pub fn crash_cut(&self, cut: usize) -> SimDisk {
        let mut media = self.media();
        media.syncing.clear();
        media.buffered.clear();
        let cut = cut.min(media.synced.len());
        if cut == 0 {
            return Self::reopened(&media, None);
        }
        let kept = media.synced.len() - cut;
        let lost = media.synced.split_off(kept);
        let mut durable = media.base.clone();
        for record in &media.synced {
            record.replay(&mut durable);
        }
        media.durable = durable;
        let offset: u64 = media.synced.iter().map(Record::bytes).sum();
        // What is left of the oldest record the cut took: some of its bytes, not all.
        let left = (lost[0].bytes() / 2).max(1);
        let lost_tail = LostTail {
            path: dir().join("segment"),
            offset,
            bytes: left,
            written_whole: false,
        };
        Self::reopened(&media, Some(lost_tail))
    }

    /// A new handle over what `media` keeps, as a restarted process opens it.
    fn reopened(media: &Media, lost_tail: Option<LostTail>) -> SimDisk {
        let durable = media.durable.clone();
        SimDisk {
            core: Arc::new(RwLock::new(durable.clone())),
            media: Arc::new(Mutex::new(Media {
                base: media.base.clone(),
                synced: media.synced.clone(),
                durable,
                full: media.full,
                lost_tail,
                ..Media::default()
            })),
        }
    }

    /// How many records the fsync under way holds (a crash keeps up to this many).
    pub fn in_flight(&self) -> usize {
        self.media().syncing.len()
    }

    /// Everything written so far is durable: a snapshot file was written and fsynced after it.
    fn all_durable(&self, media: &mut Media) {
        media.syncing.clear();
        media.buffered.clear();
        media.durable = self.read().clone();
        media.base = media.durable.clone();
        media.synced.clear();
    }
}

impl fmt::Debug for SimDisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let core = self.read();
        f.debug_struct("SimDisk")
            .field("first_index", &core.first_index())
            .field("last_index", &core.last_index())
            .field("hard_state", core.hard_state())
            .finish_non_exhaustive()
    }
}

super::log_core::storage_from_core!(SimDisk);

impl LogStore for SimDisk {
    fn append(&self, entries: &[Entry]) -> Result<(), LogError> {
        let mut media = self.media();
        let mut core = self.write();
        core.check_append(entries)?;
        core.append(entries);
        if !entries.is_empty() {
            media.buffered.push(Record::Entries(entries.to_vec()));
        }
        Ok(())
    }

    fn set_hard_state(&self, hs: HardState) -> Result<(), LogError> {
        let mut media = self.media();
        self.write().set_hard_state(hs.clone());
        media.buffered.push(Record::HardState(hs));
        Ok(())
    }

    fn set_conf_state(&self, cs: ConfState) -> Result<(), LogError> {
        let mut media = self.media();
        self.write().set_conf_state(cs.clone());
        media.buffered.push(Record::ConfState(cs));
        Ok(())
    }

    fn sync(&self) -> Result<(), LogError> {
        let mut media = self.media();
        if media.buffered.is_empty() {
            return Ok(());
        }
        if media.full {
            return Err(LogError::NoSpace {
                dir: dir(),
                cause: "No space left on device (os error 28)".to_string(),
            });
        }
        let mut buffered = std::mem::take(&mut media.buffered);
        media.syncing.append(&mut buffered);
        Ok(())
    }

    fn apply_snapshot(&self, snap: Snapshot) -> Result<(), LogError> {
        let mut media = self.media();
        self.read().check_apply_snapshot(&snap)?;
        if media.full {
            return Err(LogError::NoSpace {
                dir: dir(),
                cause: no_space("write", "snapshot.snap.tmp").to_string(),
            });
        }
        self.write().apply_snapshot(snap);
        self.all_durable(&mut media);
        Ok(())
    }

    fn compact(&self, index: u64, conf: ConfState, data: Vec<u8>) -> Result<(), LogError> {
        let mut media = self.media();
        let Some(snap) = self.read().compaction(index, conf, data)? else {
            return Ok(());
        };
        if media.full {
            if !media.buffered.is_empty() {
                return Err(LogError::NoSpace {
                    dir: dir(),
                    cause: "No space left on device (os error 28)".to_string(),
                });
            }
            return Err(no_space("write", "snapshot.snap.tmp"));
        }
        self.write().compact(snap);
        self.all_durable(&mut media);
        Ok(())
    }

    fn bytes_since_snapshot(&self) -> u64 {
        self.read().entry_bytes()
    }

    fn lost_tail(&self) -> Option<LostTail> {
        self.media().lost_tail.clone()
    }
}
